//! Lock names ZooKeeper would refuse as paths still work, and stay apart.

mod common;

use std::time::Duration;

use lock_core::LockName;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_zookeeper_refuses_are_escaped_and_distinct() {
    let c = common::client().await;
    let run: u32 = rand::random();
    let names = [
        "plain",
        "a/b",
        "a//b",
        "/lead",
        "trail/",
        ".",
        "..",
        "x/./y",
        "100%",
        "tab\there",
        "del\u{7f}",
        "🔒",
        "ключ🔒",
        "\u{e000}",
        "\u{fff0}",
    ];
    let mut held = Vec::new();
    for n in names {
        let name = LockName::new(format!("names-{run:08x}/{n}")).unwrap();
        let lease = common::try_take(&c, &name, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{n:?} was taken by another name's holder"));
        held.push(lease);
    }
    // A second client sees every one as held, at its own path.
    let other = common::client().await;
    for lease in &held {
        assert!(
            common::try_take(&other, lease.name(), Duration::from_secs(10))
                .await
                .is_none(),
            "{:?} was free for another client",
            lease.name()
        );
        let path = c.lock_path(lease.name());
        assert!(path.starts_with("/polylock/names-"), "{path}");
    }
    for lease in &held {
        lock_core::LockBackend::release(&c, lease)
            .await
            .expect("release");
    }
}

/// Dropping a client closes its sessions, which frees its locks at once
/// (not at the session timeout); the lock's parent nodes stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_frees_its_locks_and_keeps_the_parents() {
    let name = common::unique("dropped");
    let ttl = Duration::from_secs(10);
    let holder = common::client().await;
    let dir = holder.lock_path(&name);
    let lease = common::try_take(&holder, &name, ttl)
        .await
        .expect("acquire");
    drop(lease);
    drop(holder);
    let other = common::client().await;
    let started = tokio::time::Instant::now();
    let taken = loop {
        if let Some(l) = common::try_take(&other, &name, ttl).await {
            break l;
        }
        assert!(
            started.elapsed() < ttl / 2,
            "the dropped client's lock was still held after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    lock_core::LockBackend::release(&other, &taken)
        .await
        .expect("release");
    let raw = zookeeper_client::Client::connect(&common::server().connect_string())
        .await
        .expect("raw client");
    assert!(
        raw.check_stat(&dir).await.expect("stat").is_some(),
        "{dir} was deleted"
    );
}
