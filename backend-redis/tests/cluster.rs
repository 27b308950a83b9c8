//! Redis Cluster specifics on a spawned three-master cluster: names with
//! braces, the Redisson format's limits, waiting across nodes. (The
//! conformance suite runs every common case on a cluster too.)

mod support;

use std::time::Duration;

use lock_core::{LockBackend, LockError, LockName, Locker};
use support::{backend, name, req};
use testkit::RedisCluster;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_specifics() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let plain = backend(&format!("redis+cluster://{}", cluster.seed_nodes())).await;

    // Braces in a name never split a lock's keys across slots: every
    // script below would fail with CROSSSLOT otherwise.
    let long = format!("{{x}}{}", "}{".repeat(200));
    for n in ["a{b}c", "{", "}", "{}", "}{", "{tag}job", long.as_str()] {
        let n = LockName::new(n).unwrap();
        let lease = plain
            .try_acquire(&req(&n, Duration::from_secs(5)))
            .await
            .unwrap()
            .expect("free");
        assert!(plain
            .try_acquire(&req(&n, Duration::from_secs(5)))
            .await
            .unwrap()
            .is_none());
        let info = plain.inspect(&n).await.unwrap().unwrap();
        assert_eq!(info.fence, Some(lease.fence()));
        let lease = plain.renew(&lease).await.unwrap();
        plain.release(&lease).await.unwrap();
        assert!(plain.force_release(&n).await.is_ok());
    }
    // Names spread over the three masters.
    let mut slots = std::collections::HashSet::new();
    for i in 0..30 {
        let n = name(&format!("spread/{i}"));
        let key = plain.keys(&n).unwrap().lock;
        let mut c = support::raw(&cluster.servers()[0].url()).await;
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        slots.insert(slot * 3 / 16384);
        let lease = plain
            .try_acquire(&req(&n, Duration::from_secs(5)))
            .await
            .unwrap()
            .unwrap();
        plain.release(&lease).await.unwrap();
    }
    assert_eq!(slots.len(), 3, "the test names should land on every master");

    // Redisson's own layout cannot co-locate a name with braces: refused
    // before any I/O, with the reason.
    let redisson = backend(&format!(
        "redis+cluster://{}?format=redisson",
        cluster.seed_nodes()
    ))
    .await;
    let e = redisson
        .try_acquire(&req(&name("a{b}c"), Duration::from_secs(5)))
        .await
        .expect_err("refused");
    assert!(matches!(e, LockError::InvalidName { .. }), "{e:?}");
    assert!(e.to_string().contains("format=plain"), "{e}");
    let lease = redisson
        .try_acquire(&req(&name("orders"), Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    redisson.release(&lease).await.unwrap();

    // A release published by the lock's master reaches a waiter subscribed
    // on whichever node its pub/sub connection went to.
    let holder =
        Locker::from_arc(backend(&format!("redis+cluster://{}", cluster.seed_nodes())).await);
    let mut handoffs = Vec::new();
    for i in 0..7 {
        let lock = format!("cluster/wait/{i}");
        let waiter =
            Locker::from_arc(backend(&format!("redis+cluster://{}", cluster.seed_nodes())).await);
        let g = holder.lock(&lock).acquire().await.unwrap();
        let task = tokio::spawn({
            let lock = lock.clone();
            async move {
                let g = waiter
                    .lock(&lock)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                let at = Instant::now();
                g.release().await.unwrap();
                at
            }
        });
        // Long enough for the fallback poll to back off to 250-500 ms.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let released = Instant::now();
        g.release().await.unwrap();
        handoffs.push(task.await.unwrap() - released);
    }
    handoffs.sort();
    assert!(
        handoffs[handoffs.len() / 2] < Duration::from_millis(50),
        "hand-offs {handoffs:?}: not woken by the release message"
    );
}
