//! A create whose reply is lost (the connection reset after the server
//! applied it) is recovered by finding our node by its uuid: the client
//! ends up with exactly one node, the one it holds. A node with our uuid
//! that another session owns is never taken for ours.

mod common;

use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::{Lease, LockBackend, LockError, LockName};
use testkit::{Mode, Proxy};
use tokio::time::sleep;
use zookeeper_client::{Acls, Client, CreateMode};

/// What the lost-reply scenario leaves behind.
struct Lost {
    /// The client's way to the server: dropping it cuts the client off.
    _proxy: Proxy,
    client: ZkBackend,
    raw: Client,
    dir: String,
    /// The node whose create reply was lost.
    node: String,
    attempt: Result<Option<Lease>, LockError>,
}

/// A client reaching the shared server through a proxy, its session open
/// (so only what follows meets the proxy's faults), and a fresh name with
/// its lock directory.
async fn proxied(prefix: &str, ttl: Duration) -> (Proxy, ZkBackend, LockName, String) {
    let proxy = Proxy::start(common::server().addr()).expect("proxy");
    let client = ZkBackend::connect(&format!("zk://{}", proxy.addr()))
        .await
        .expect("connect");
    let name = common::unique(prefix);
    client.session_id(ttl).await.expect("session");
    let dir = client.lock_path(&name);
    (proxy, client, name, dir)
}

/// Runs a `try_acquire` whose create reaches the server and whose reply is
/// cut off. With `impostor`, while the client is cut off, a direct client
/// deletes the node the lost reply was for and creates one with the same
/// uuid in its own session.
async fn lose_create_reply(name: &str, impostor: bool) -> Lost {
    let server = common::server();
    let ttl = Duration::from_secs(10);
    let (proxy, client, name, dir) = proxied(name, ttl).await;

    proxy.set_mode(Mode::Delay(Duration::from_millis(300)));
    let attempt = tokio::spawn({
        let client = client.clone();
        let name = name.clone();
        async move {
            client
                .try_acquire(&common::req(&name, ttl, Duration::ZERO))
                .await
        }
    });
    // The request reaches the server after 300 ms (the parents' creates and
    // then ours, each delayed); reset while the create's reply is on its
    // way back.
    let raw = Client::connect(&server.connect_string())
        .await
        .expect("raw client");
    let mut waited = Duration::ZERO;
    let node = loop {
        if let Some(first) = raw
            .list_children(&dir)
            .await
            .ok()
            .and_then(|c| c.first().cloned())
        {
            break first;
        }
        assert!(waited < Duration::from_secs(10), "the create never arrived");
        sleep(Duration::from_millis(5)).await;
        waited += Duration::from_millis(5);
    };
    proxy.set_mode(Mode::Reset);
    if impostor {
        raw.delete(&format!("{dir}/{node}"), None)
            .await
            .expect("delete ours");
        let protected = node.trim_end_matches(|c: char| c.is_ascii_digit());
        let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        raw.create(&format!("{dir}/{protected}"), b"other", &opts)
            .await
            .expect("create the impostor");
    }
    sleep(Duration::from_millis(50)).await;
    proxy.set_mode(Mode::Pass);
    let attempt = attempt.await.expect("task");
    Lost {
        _proxy: proxy,
        client,
        raw,
        dir,
        node,
        attempt,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_is_recovered_by_uuid() {
    let Lost {
        _proxy,
        client,
        raw,
        dir,
        node,
        attempt,
    } = lose_create_reply("lost-reply", false).await;
    let lease = attempt
        .expect("try_acquire recovers")
        .expect("the lock is free: our own node is first");
    let children = raw.list_children(&dir).await.expect("list");
    assert_eq!(children.len(), 1, "a second node was created: {children:?}");
    assert_eq!(children[0], node);
    assert_eq!(
        lease.backend_key(),
        Some(format!("{dir}/{node}").as_str()),
        "the lease is not on the node the lost reply was for"
    );
    client.release(&lease).await.expect("release");
    assert!(raw.list_children(&dir).await.expect("list").is_empty());
}

/// Our node is removed while the reply is lost, and another session puts a
/// node with our uuid in its place (what an older session of ours, still
/// listed, looks like): its ephemeral owner is not our session, so it is
/// neither taken for our hold nor deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_our_uuid_owned_by_another_session_is_not_ours() {
    let Lost {
        _proxy,
        client,
        raw,
        dir,
        node,
        attempt,
    } = lose_create_reply("impostor", true).await;
    let impostor = raw.list_children(&dir).await.expect("list");
    assert!(
        matches!(attempt, Ok(None)),
        "the other session's node was taken for our hold: {attempt:?}"
    );
    assert_eq!(impostor.len(), 1, "{impostor:?}");
    assert_ne!(impostor[0], node);
    let (_, stat) = raw
        .get_data(&format!("{dir}/{}", impostor[0]))
        .await
        .expect("the other session's node is still there");
    assert_eq!(stat.ephemeral_owner, raw.session_id().0);
    assert_ne!(
        stat.ephemeral_owner,
        client.session_id(Duration::from_secs(10)).await.unwrap()
    );
}

/// An acquire dropped while its create is on the way (the create reaches
/// the server after the drop) leaves no node behind: the node would be
/// first in line and hold the lock for nobody until the session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_during_its_create_leaves_no_node() {
    let server = common::server();
    let ttl = Duration::from_secs(10);
    let (proxy, client, name, dir) = proxied("dropped-create", ttl).await;
    let raw = Client::connect(&server.connect_string())
        .await
        .expect("raw client");
    // The directory exists, so the one create is the only request delayed.
    raw.mkdir(&dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .expect("mkdir");

    proxy.set_mode(Mode::Delay(Duration::from_millis(400)));
    let attempt = tokio::spawn({
        let client = client.clone();
        let name = name.clone();
        async move {
            client
                .try_acquire(&common::req(&name, ttl, Duration::ZERO))
                .await
        }
    });
    sleep(Duration::from_millis(100)).await;
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    // The create still lands, after the drop.
    let mut landed = false;
    let mut gone = false;
    for _ in 0..500 {
        let n = raw.list_children(&dir).await.expect("list").len();
        landed |= n > 0;
        if landed && n == 0 {
            gone = true;
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    assert!(
        landed,
        "the create never reached the server: the test saw nothing"
    );
    assert!(gone, "the node of the dropped acquire is still there");
    // And the lock is free for the next one.
    let lease = client
        .try_acquire(&common::req(&name, ttl, Duration::ZERO))
        .await
        .expect("acquire")
        .expect("free");
    client.release(&lease).await.expect("release");
}
