//! Redis Cluster specifics on a spawned three-master cluster: names with
//! braces, the Redisson format's limits, waiting across nodes. (The
//! conformance suite runs every common case on a cluster too.)

mod common;

use std::time::Duration;

use common::{
    acquire_free, backend, locker_on, name, release_and_time_handoff, req,
    spawn_waiter_that_releases,
};
use lock_core::{LockBackend, LockError, LockName};
use testkit::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_specifics() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let url = format!("redis+cluster://{}", cluster.seed_nodes());
    let plain = backend(&url).await;

    // Braces in a name never split a lock's keys across slots: every
    // script below would fail with CROSSSLOT otherwise.
    let long = format!("{{x}}{}", "}{".repeat(200));
    for n in ["a{b}c", "{", "}", "{}", "}{", "{tag}job", long.as_str()] {
        let n = LockName::new(n).unwrap();
        let lease = acquire_free(&plain, &n, Duration::from_secs(5)).await;
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
    // The slot math against the server's own: the lock key is the name,
    // and what polylock keeps beside it is in the same slot, whatever
    // braces the name has (its own tag, an empty tag, a `}` before any
    // `{`, ...).
    let mut admin = common::raw(&cluster.servers()[0].url()).await;
    let mut names: Vec<String> = [
        "job",
        "a{b}c",
        "{",
        "}",
        "{}",
        "}{",
        "{}x",
        "a}b{",
        "{tag}job",
        "{user1}.lock",
        "x{}{y}",
        "{{a}}",
        "a}}",
        "ключ{🔒}",
        long.as_str(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Brace-heavy names whose bookkeeping needs a found tag.
    names.extend((0..60).map(|i| format!("{}}}{i}{{", "x".repeat(i % 7))));
    for n in &names {
        let keys = plain.keys(&LockName::new(n.as_str()).unwrap()).unwrap();
        assert_eq!(&keys.lock, n);
        let mut slots = Vec::new();
        for k in [&keys.lock, &keys.fence, &keys.channel] {
            let s: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(k)
                .query_async(&mut admin)
                .await
                .unwrap();
            slots.push(s);
        }
        assert!(
            slots.iter().all(|s| *s == slots[0]),
            "{n:?}: slots {slots:?} of {keys:?}"
        );
    }

    // Names spread over the three masters.
    let mut slots = std::collections::HashSet::new();
    for i in 0..30 {
        let n = name(&format!("spread/{i}"));
        let key = plain.keys(&n).unwrap().lock;
        let mut c = common::raw(&cluster.servers()[0].url()).await;
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        slots.insert(slot * 3 / 16384);
        let lease = acquire_free(&plain, &n, Duration::from_secs(5)).await;
        plain.release(&lease).await.unwrap();
    }
    assert_eq!(slots.len(), 3, "the test names should land on every master");

    // Redisson's own layout cannot co-locate a name with braces: refused
    // before any I/O, with the reason.
    let redisson = backend(&format!("{url}?format=redisson")).await;
    let e = redisson
        .try_acquire(&req(&name("a{b}c"), Duration::from_secs(5)))
        .await
        .expect_err("refused");
    assert!(matches!(e, LockError::InvalidName { .. }), "{e:?}");
    assert!(e.to_string().contains("format=plain"), "{e}");
    let lease = acquire_free(&redisson, &name("orders"), Duration::from_secs(5)).await;
    redisson.release(&lease).await.unwrap();

    // A release published by the lock's master reaches a waiter subscribed
    // on whichever node its pub/sub connection went to.
    let holder = locker_on(&url).await;
    let mut handoffs = Vec::new();
    for i in 0..7 {
        let lock = format!("cluster/wait/{i}");
        let waiter = locker_on(&url).await;
        let g = holder.lock(&lock).acquire().await.unwrap();
        let task = spawn_waiter_that_releases(waiter, &lock, Duration::from_secs(10));
        // Long enough for the fallback poll to back off to 250-500 ms.
        tokio::time::sleep(Duration::from_millis(700)).await;
        handoffs.push(release_and_time_handoff(g, task).await);
    }
    handoffs.sort();
    assert!(
        handoffs[handoffs.len() / 2] < Duration::from_millis(50),
        "hand-offs {handoffs:?}: not woken by the release message"
    );
}
