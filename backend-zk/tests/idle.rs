//! Sessions nobody uses are closed after `idle_timeout`; a session with a
//! lease (or a waiter) is kept. Sessions are counted on the server with the
//! `cons` four-letter word, which lists every connection with its session.

mod common;

use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::LockBackend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep, Instant};

/// The session ids the server has connections for now, as `cons` shows
/// them (`sid=0x...`, Java's `Long.toHexString`).
async fn server_sessions() -> String {
    let mut s = tokio::net::TcpStream::connect(common::server().addr())
        .await
        .expect("connect for cons");
    s.write_all(b"cons").await.expect("send cons");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read cons");
    out
}

fn sid(id: i64) -> String {
    format!("sid={id:#x},")
}

async fn listed(id: i64) -> bool {
    server_sessions().await.contains(&sid(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_closed_and_busy_ones_kept() {
    let url = format!("{}?idle_timeout=1s", common::url());
    let client = ZkBackend::connect(&url).await.expect("connect");
    let name = common::unique("idle");
    let (idle_ttl, held_ttl) = (Duration::from_secs(2), Duration::from_secs(3));
    let mut lease = common::try_take(&client, &name, held_ttl)
        .await
        .expect("free lock");
    let held = client.session_id(held_ttl).await.expect("session");
    // A session used once (a TTL asked for, then never again).
    let idle = client.session_id(idle_ttl).await.expect("session");
    assert_ne!(idle, held);
    assert!(
        listed(idle).await && listed(held).await,
        "{}",
        server_sessions().await
    );

    // Closed within a few idle timeouts; the session with the lease stays,
    // its lease renewed all along (its TTL is shorter than the wait).
    let give_up = Instant::now() + Duration::from_secs(20);
    while listed(idle).await {
        assert!(
            Instant::now() < give_up,
            "the idle session was never closed"
        );
        lease = client.renew(&lease).await.expect("renew while held");
        sleep(Duration::from_millis(200)).await;
    }
    assert!(listed(held).await, "the session holding a lease was closed");
    // ... and still the one that serves its TTL (not set aside for a new one).
    assert_eq!(client.session_id(held_ttl).await.expect("session"), held);
    lease = client.renew(&lease).await.expect("renew while held");
    client.release(&lease).await.expect("release");

    // Once released, that one goes too; a later lock opens a new session.
    let give_up = Instant::now() + Duration::from_secs(20);
    while listed(held).await {
        assert!(
            Instant::now() < give_up,
            "the released session was never closed"
        );
        sleep(Duration::from_millis(200)).await;
    }
    let again = common::try_take(&client, &name, held_ttl)
        .await
        .expect("free lock");
    let new = client.session_id(held_ttl).await.expect("session");
    assert_ne!(new, held);
    assert!(listed(new).await);
    client.release(&again).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_session_is_not_idle() {
    let url = format!("{}?idle_timeout=1s", common::url());
    let holder = ZkBackend::connect(&url).await.expect("connect");
    let waiter = ZkBackend::connect(&url).await.expect("connect");
    let name = common::unique("idle-wait");
    let ttl = Duration::from_secs(10);
    let lease = common::try_take(&holder, &name, ttl).await.expect("free");
    let wait = tokio::spawn({
        let waiter = waiter.clone();
        let name = name.clone();
        async move {
            waiter
                .acquire(&common::req(&name, ttl, Duration::from_secs(30)))
                .await
        }
    });
    // Queued: the waiter's node is in the directory.
    let dir = holder.lock_path(&name);
    let raw = zookeeper_client::Client::connect(&common::server().connect_string())
        .await
        .expect("raw");
    let give_up = Instant::now() + Duration::from_secs(10);
    while raw.list_children(&dir).await.map_or(0, |c| c.len()) < 2 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        sleep(Duration::from_millis(20)).await;
    }
    let queued = raw.list_children(&dir).await.expect("list");
    let session = waiter.session_id(ttl).await.expect("session");
    // Several idle timeouts (and reaper rounds) while waiting: the same
    // session still waits with the same node.
    sleep(Duration::from_secs(4)).await;
    assert!(!wait.is_finished());
    assert!(listed(session).await, "the waiting session was closed");
    assert_eq!(waiter.session_id(ttl).await.expect("session"), session);
    assert_eq!(raw.list_children(&dir).await.expect("list"), queued);
    holder.release(&lease).await.expect("release");
    let got = wait
        .await
        .expect("task")
        .expect("acquire")
        .expect("served once the holder released");
    waiter.release(&got).await.expect("release");
}
