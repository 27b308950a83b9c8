//! Digest credentials in the URL and ACLs on the nodes, against a real
//! server: a foreign client cannot break (or join) a lock created with
//! `acl=creator`, and the credentials' holder can lock and unlock.

mod common;

use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::{LockBackend, LockError};
use zookeeper_client::{Client, CreateMode, Error};

/// A prefix of this run's own: a prefix created with a restrictive ACL
/// stays that way, and other tests of this binary use the default one.
fn url(creds: &str, acl: &str) -> String {
    let run: u32 = rand::random();
    format!(
        "zk://{creds}@{}?prefix=acl-{run:08x}&acl={acl}",
        common::server().connect_string()
    )
}

async fn raw(auth: Option<&str>) -> Client {
    let mut c = Client::connector();
    if let Some(a) = auth {
        c = c.with_auth("digest", a.as_bytes());
    }
    c.connect(&common::server().connect_string())
        .await
        .expect("raw client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_acl_keeps_foreign_clients_off_the_lock() {
    let url = url("alice:s3cr3t", "creator");
    let ours = ZkBackend::connect(&url).await.expect("connect");
    let name = common::unique("creator");
    let ttl = Duration::from_secs(10);
    let lease = common::try_take(&ours, &name, ttl)
        .await
        .expect("free lock");
    let node = lease.backend_key().expect("node path").to_string();
    let dir = ours.lock_path(&name);

    for (who, foreign) in [
        ("unauthenticated", raw(None).await),
        ("wrong password", raw(Some("alice:wrong")).await),
    ] {
        assert!(
            matches!(foreign.delete(&node, None).await, Err(Error::NoAuth)),
            "{who}: the delete of our lock node was not refused"
        );
        assert!(
            matches!(foreign.list_children(&dir).await, Err(Error::NoAuth)),
            "{who}: the queue was readable"
        );
        let queued = foreign
            .create(
                &format!("{dir}/_c_x-lock-"),
                b"",
                &CreateMode::EphemeralSequential.with_acls(zookeeper_client::Acls::anyone_all()),
            )
            .await;
        assert!(
            matches!(queued, Err(Error::NoAuth)),
            "{who}: joined the queue: {queued:?}"
        );
    }
    // Still held: the right credentials see our node first in line.
    let friend = raw(Some("alice:s3cr3t")).await;
    let (_, stat) = friend
        .get_data(&node)
        .await
        .expect("our node is still there");
    assert_eq!(u64::try_from(stat.czxid).ok(), Some(lease.fence().get()));
    let holder = ours.inspect(&name).await.expect("inspect").expect("held");
    assert_eq!(holder.fence, Some(lease.fence()));
    // The lock is refused to a second contender while held, and served
    // after the release.
    assert!(common::try_take(&ours, &name, ttl).await.is_none());
    ours.release(&lease).await.expect("release");
    let again = common::try_take(&ours, &name, ttl)
        .await
        .expect("free again");
    ours.release(&again).await.expect("release");

    // A polylock client with the wrong password gets a clear, permanent
    // error that does not show the password it was given.
    let wrong = ZkBackend::connect(&url.replace("s3cr3t", "hunter2"))
        .await
        .expect("connect");
    match wrong
        .try_acquire(&common::req(&name, ttl, Duration::ZERO))
        .await
    {
        Err(e @ LockError::Backend { .. }) => {
            let m = e.to_string();
            assert!(!e.is_retryable(), "{m}");
            assert!(m.contains("not authorized"), "{m}");
            assert!(!m.contains("hunter2") && !m.contains("s3cr3t"), "{m}");
        }
        other => panic!("the wrong password was let in: {other:?}"),
    }
    assert!(!format!("{ours:?}").contains("s3cr3t"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_acl_lets_anyone_look_but_not_touch() {
    let url = url("bob:pw", "read");
    let ours = ZkBackend::connect(&url).await.expect("connect");
    let name = common::unique("read");
    let lease = common::try_take(&ours, &name, Duration::from_secs(10))
        .await
        .expect("free lock");
    let node = lease.backend_key().expect("node path").to_string();

    // inspect without credentials works on the same prefix.
    let anonymous_url = url.replace("bob:pw@", "").replace("&acl=read", "");
    let anonymous = ZkBackend::connect(&anonymous_url).await.expect("connect");
    let holder = anonymous
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(holder.fence, Some(lease.fence()));
    let foreign = raw(None).await;
    assert!(matches!(
        foreign.delete(&node, None).await,
        Err(Error::NoAuth)
    ));
    match anonymous
        .try_acquire(&common::req(&name, Duration::from_secs(10), Duration::ZERO))
        .await
    {
        Err(e) => assert!(e.to_string().contains("not authorized"), "{e}"),
        Ok(l) => panic!("an anonymous client queued: {l:?}"),
    }
    ours.release(&lease).await.expect("release");
}
