//! A create whose reply is lost (the connection reset after the server
//! applied it) is recovered by finding our node by its uuid: the client
//! ends up with exactly one node, the one it holds.

mod common;

use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::LockBackend;
use testkit::{Mode, Proxy};
use tokio::time::sleep;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_is_recovered_by_uuid() {
    let server = common::server();
    let proxy = Proxy::start(server.addr()).expect("proxy");
    let url = format!("zk://{}", proxy.addr());
    let client = ZkBackend::connect(&url).await.expect("connect");
    let name = common::unique("lost-reply");
    let ttl = Duration::from_secs(10);
    // Open the session first, so only the create meets the fault.
    client.session_id(ttl).await.expect("session");
    let dir = client.lock_path(&name);

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
    let raw = zookeeper_client::Client::connect(&server.connect_string())
        .await
        .expect("raw client");
    let mut waited = Duration::ZERO;
    loop {
        let n = raw.list_children(&dir).await.map(|c| c.len()).unwrap_or(0);
        if n > 0 {
            break;
        }
        assert!(waited < Duration::from_secs(10), "the create never arrived");
        sleep(Duration::from_millis(5)).await;
        waited += Duration::from_millis(5);
    }
    proxy.set_mode(Mode::Reset);
    sleep(Duration::from_millis(50)).await;
    proxy.set_mode(Mode::Pass);

    let lease = attempt
        .await
        .expect("task")
        .expect("try_acquire recovers")
        .expect("the lock is free: our own node is first");
    let children = raw.list_children(&dir).await.expect("list");
    assert_eq!(children.len(), 1, "a second node was created: {children:?}");
    assert_eq!(
        lease.backend_key(),
        Some(format!("{dir}/{}", children[0]).as_str()),
        "the lease is not on the node the lost reply was for"
    );
    client.release(&lease).await.expect("release");
    assert!(raw.list_children(&dir).await.expect("list").is_empty());
}
