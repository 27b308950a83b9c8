//! A lock node someone else wrote to (Curator's revoker sets
//! `__REVOKE__` on it, an operator's `zkCli set`): the holding counts as
//! lost, and its release still deletes the node, which is ours (our
//! attempt's uuid, our session) whatever its version; left in place it
//! would head the queue, held by nobody, for as long as the client's
//! session lives.

mod common;

use std::time::Duration;

use lock_core::LockBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_written_by_another_client_is_still_deleted_by_its_release() {
    let name = common::unique("written");
    let other_name = common::unique("written-other");
    let ttl = Duration::from_secs(10);
    let holder = common::client().await;
    let lease = common::try_take(&holder, &name, ttl).await.expect("free");
    // Keeps the holder's session in use after the release.
    let other = common::try_take(&holder, &other_name, ttl)
        .await
        .expect("free");
    let raw = zookeeper_client::Client::connect(&common::server().connect_string())
        .await
        .expect("raw client");
    raw.set_data(lease.backend_key().unwrap(), b"__REVOKE__", None)
        .await
        .expect("set_data");
    let released = holder.release(&lease).await;
    assert!(
        released.as_ref().is_err_and(|e| e.is_lost()),
        "a release of a node someone else wrote to: {released:?}"
    );
    let node = raw.check_stat(lease.backend_key().unwrap()).await.unwrap();
    assert!(node.is_none(), "the released node is still there");
    let next = common::client().await;
    let taken = common::try_take(&next, &name, ttl).await;
    assert!(taken.is_some(), "the name stays taken after the release");
    next.release(&taken.unwrap()).await.unwrap();
    holder.release(&other).await.unwrap();
}
