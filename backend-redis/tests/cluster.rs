//! Redis Cluster specifics on a spawned three-master cluster: names with
//! braces, the Redisson format's limits, waiting across nodes. (The
//! conformance suite runs every common case on a cluster too.)

mod common;

use std::time::Duration;

use backend_redis::ForeignWake;
use common::{
    acquire_free, backend, compare_and_delete, keyspace_events_on, locker_on, median, name,
    raw_cluster, release_and_time_handoff, req, spawn_timed_acquire, spawn_waiter_that_releases,
    wait_req,
};
use lock_core::{LockBackend, LockError, LockName, OwnerToken};
use redis::AsyncCommands;
use testkit::RedisCluster;
use tokio::time::{sleep, Instant};

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

/// A foreign client's `SET key token NX PX 30000` on the cluster; whether
/// it took the key.
async fn foreign_take(
    conn: &mut redis::cluster_async::ClusterConnection,
    key: &str,
    token: &str,
) -> bool {
    let r: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .unwrap();
    r.is_some()
}

/// A hand-rolled foreign client that retries `SET NX PX` every 50 ms until
/// it gets `key`; when it did.
fn spawn_foreign_waiter(
    mut conn: redis::cluster_async::ClusterConnection,
    key: String,
    token: String,
) -> tokio::task::JoinHandle<Instant> {
    tokio::spawn(async move {
        while !foreign_take(&mut conn, &key, &token).await {
            sleep(Duration::from_millis(50)).await;
        }
        Instant::now()
    })
}

/// #11 on a cluster whose nodes send keyspace notifications: a waiter
/// subscribes on the node that owns the key's slot, so a foreign release
/// (hand-rolled `SET NX PX` + compare-and-delete, which publishes nothing)
/// wakes it at once, on every master. In this mode the waiter's fallback
/// poll has backed off to 250-500 ms by the time of the release, and the
/// polling mode's 10-100 ms poll gives a median near 50 ms, so a median
/// well below both is the keyspace event's doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_release_wakes_a_cluster_waiter_through_keyspace_events() {
    let cluster = RedisCluster::start(3).expect("cluster");
    keyspace_events_on(&cluster).await;
    let url = format!("redis+cluster://{}", cluster.seed_nodes());
    let ours = backend(&url).await;
    assert_eq!(ours.foreign_wake(), ForeignWake::KeyspaceEvents);
    let mode = ours.wake_mode();
    assert!(
        mode.contains("keyspace notifications for foreign releases")
            && mode.contains("pub/sub for polylock releases")
            && !mode.contains("polling ("),
        "{mode}"
    );
    let mut foreign = raw_cluster(&cluster).await;
    let ttl = Duration::from_secs(30);
    let (mut to_polylock, mut to_foreign) = (Vec::new(), Vec::new());
    // Names spread over the three masters.
    for i in 0..9 {
        let n = name(&format!("keyspace/{i}"));
        let token = OwnerToken::random().to_string();
        assert!(foreign_take(&mut foreign, n.as_str(), &token).await);
        let waiter = spawn_timed_acquire(&ours, wait_req(&n, ttl, Duration::from_secs(20)));
        sleep(Duration::from_millis(900)).await;
        assert!(
            !waiter.is_finished(),
            "acquired while the foreign client held it"
        );
        let released = Instant::now();
        assert!(compare_and_delete(&mut foreign, n.as_str(), &token).await);
        let (got, lease) = waiter.await.unwrap();
        let lease = lease.expect("acquired after the foreign release");
        to_polylock.push(got - released);

        // The other way: the foreign client finds polylock's release by
        // its own retry interval (50 ms).
        let other = OwnerToken::random().to_string();
        let task = spawn_foreign_waiter(foreign.clone(), n.to_string(), other.clone());
        sleep(Duration::from_millis(300)).await;
        assert!(
            !task.is_finished(),
            "the foreign client got a lock polylock holds"
        );
        let released = Instant::now();
        ours.release(&lease).await.unwrap();
        to_foreign.push(task.await.unwrap() - released);
        assert!(compare_and_delete(&mut foreign, n.as_str(), &other).await);
    }
    // A cancelled waiter gives its keyspace subscription on the owner up.
    let n = name("keyspace/cancelled");
    let token = OwnerToken::random().to_string();
    assert!(foreign_take(&mut foreign, n.as_str(), &token).await);
    let channel = format!("__keyspace@0__:{n}");
    let mut admins = Vec::new();
    for s in cluster.servers() {
        admins.push(common::raw(&s.url()).await);
    }
    let subscribed = |want: i64| {
        let admins = &admins;
        let channel = &channel;
        async move {
            let mut total = 0;
            for a in admins {
                total += common::numsub(a, channel).await;
            }
            total == want
        }
    };
    let waiter = spawn_timed_acquire(&ours, wait_req(&n, ttl, Duration::from_secs(20)));
    assert!(
        common::eventually(Duration::from_secs(10), || subscribed(1)).await,
        "the waiter did not subscribe to {channel}"
    );
    waiter.abort();
    assert!(
        common::eventually(Duration::from_secs(10), || subscribed(0)).await,
        "a cancelled waiter left its keyspace subscription behind"
    );
    assert!(compare_and_delete(&mut foreign, n.as_str(), &token).await);

    let (a, b) = (median(&mut to_polylock), median(&mut to_foreign));
    eprintln!(
        "cluster hand-off with keyspace notifications: foreign release -> polylock median {a:?} \
         {to_polylock:?}; polylock release -> hand-rolled client median {b:?} {to_foreign:?}"
    );
    // Polling (10-100 ms) measured a median of about 48 ms on this test;
    // keyspace events about 2.5 ms.
    assert!(
        a < Duration::from_millis(25),
        "foreign release -> polylock {to_polylock:?}: not woken by the keyspace event"
    );
}

/// The node ids of the members and which member owns `slot`.
async fn owner_of_slot(cluster: &RedisCluster, slot: i64) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut owner = None;
    for (i, s) in cluster.servers().iter().enumerate() {
        let mut c = common::raw(&s.url()).await;
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut c)
            .await
            .unwrap();
        // Ownership as the member itself states it.
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut c)
            .await
            .unwrap();
        let mine = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .unwrap()
            .to_string();
        let owns = mine.split(' ').skip(8).any(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            matches!((lo.parse::<i64>(), hi.parse::<i64>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
        });
        if owns {
            owner = Some(i);
        }
        ids.push(id);
    }
    (ids, owner.expect("an owner"))
}

/// Moves `slot` from member `from` to member `to` the way `redis-cli
/// --cluster reshard` does: IMPORTING/MIGRATING, MIGRATE of its keys, then
/// the new owner announced to every member.
async fn move_slot(cluster: &RedisCluster, ids: &[String], slot: i64, from: usize, to: usize) {
    let servers = cluster.servers();
    let mut src = common::raw(&servers[from].url()).await;
    let mut dst = common::raw(&servers[to].url()).await;
    let set = |state: &str, id: &str| {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(slot).arg(state).arg(id);
        c
    };
    let _: () = set("IMPORTING", &ids[from])
        .query_async(&mut dst)
        .await
        .unwrap();
    let _: () = set("MIGRATING", &ids[to])
        .query_async(&mut src)
        .await
        .unwrap();
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query_async(&mut src)
            .await
            .unwrap();
        if keys.is_empty() {
            break;
        }
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(servers[to].port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut src)
            .await
            .unwrap();
    }
    let order = [to, from]
        .into_iter()
        .chain((0..servers.len()).filter(|i| *i != to && *i != from));
    for i in order {
        let mut c = common::raw(&servers[i].url()).await;
        let _: () = set("NODE", &ids[to]).query_async(&mut c).await.unwrap();
    }
}

/// #11: waiters that began while a slot lived on one master follow it to
/// the next (the slot moved under them: MOVED), subscribe there, and are
/// woken by the foreign releases that now happen on the new owner; the
/// fallback poll (250-500 ms by then) would be far slower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waiters_follow_a_slot_move() {
    let cluster = RedisCluster::start(3).expect("cluster");
    keyspace_events_on(&cluster).await;
    let url = format!("redis+cluster://{}", cluster.seed_nodes());
    let ours = backend(&url).await;
    assert_eq!(ours.foreign_wake(), ForeignWake::KeyspaceEvents);
    let mut foreign = raw_cluster(&cluster).await;
    let mut admin = common::raw(&cluster.servers()[0].url()).await;
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg("{moving}")
        .query_async(&mut admin)
        .await
        .unwrap();
    let (ids, from) = owner_of_slot(&cluster, slot).await;
    let to = (from + 1) % 3;
    let ttl = Duration::from_secs(30);
    let mut held = Vec::new();
    for i in 0..5 {
        // One hash tag: every lock of the test in the slot that moves.
        let n = name(&format!("{{moving}}/{i}"));
        let token = OwnerToken::random().to_string();
        assert!(foreign_take(&mut foreign, n.as_str(), &token).await);
        let waiter = spawn_timed_acquire(&ours, wait_req(&n, ttl, Duration::from_secs(30)));
        held.push((n, token, waiter));
    }
    sleep(Duration::from_millis(1500)).await;
    move_slot(&cluster, &ids, slot, from, to).await;
    assert_eq!(owner_of_slot(&cluster, slot).await.1, to, "the slot moved");
    // The waiters re-check their node every second.
    sleep(Duration::from_millis(3000)).await;
    let mut handoffs = Vec::new();
    for (n, token, waiter) in held {
        assert!(
            !waiter.is_finished(),
            "{n}: acquired while the foreign client held it"
        );
        // The key lives on the new owner now.
        let on_new: bool = {
            let mut c = common::raw(&cluster.servers()[to].url()).await;
            c.exists(n.as_str()).await.unwrap()
        };
        assert!(on_new, "{n} did not move");
        let released = Instant::now();
        assert!(compare_and_delete(&mut foreign, n.as_str(), &token).await);
        let (got, lease) = waiter.await.unwrap();
        handoffs.push(got - released);
        ours.release(&lease.expect("acquired")).await.unwrap();
    }
    let m = median(&mut handoffs);
    eprintln!("hand-off after a slot move: median {m:?} {handoffs:?}");
    assert!(
        m < Duration::from_millis(100),
        "hand-offs after the slot moved {handoffs:?}: the waiters did not follow it"
    );
}

/// A waiter whose keyspace subscription is cut (the owner drops its pub/sub
/// connections) just before the foreign release still gets the lock
/// promptly: it polls while it is unsure, resubscribes, and never waits on
/// a dead subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_subscription_costs_latency_not_the_wait() {
    let cluster = RedisCluster::start(3).expect("cluster");
    keyspace_events_on(&cluster).await;
    let url = format!("redis+cluster://{}", cluster.seed_nodes());
    let ours = backend(&url).await;
    let mut foreign = raw_cluster(&cluster).await;
    let ttl = Duration::from_secs(30);
    let mut handoffs = Vec::new();
    for i in 0..3 {
        let n = name(&format!("cut/{i}"));
        let token = OwnerToken::random().to_string();
        assert!(foreign_take(&mut foreign, n.as_str(), &token).await);
        let waiter = spawn_timed_acquire(&ours, wait_req(&n, ttl, Duration::from_secs(20)));
        sleep(Duration::from_millis(1200)).await;
        for s in cluster.servers() {
            let mut c = common::raw(&s.url()).await;
            let _: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("pubsub")
                .query_async(&mut c)
                .await
                .unwrap();
        }
        let released = Instant::now();
        assert!(compare_and_delete(&mut foreign, n.as_str(), &token).await);
        let (got, lease) = waiter.await.unwrap();
        handoffs.push(got - released);
        ours.release(&lease.expect("acquired")).await.unwrap();
    }
    eprintln!("hand-off with the subscription cut at the release: {handoffs:?}");
    assert!(
        handoffs.iter().all(|h| *h < Duration::from_secs(2)),
        "{handoffs:?}"
    );
}

/// The `EXISTS` probes the cluster's nodes served (`INFO commandstats`).
async fn exists_calls(cluster: &RedisCluster) -> u64 {
    let mut total = 0;
    for s in cluster.servers() {
        let mut c = common::raw(&s.url()).await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .unwrap();
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_exists:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// Tasks of one client waiting for one key share one follower of its
/// slot: the owner is checked about once a second for all of them, not
/// once a second for each, and one release wakes them all in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_key_share_one_follower() {
    let cluster = RedisCluster::start(3).expect("cluster");
    keyspace_events_on(&cluster).await;
    let url = format!("redis+cluster://{}", cluster.seed_nodes());
    let ours = backend(&url).await;
    let mut foreign = raw_cluster(&cluster).await;
    let n = name("shared/one");
    let token = OwnerToken::random().to_string();
    assert!(foreign_take(&mut foreign, n.as_str(), &token).await);
    let before = exists_calls(&cluster).await;
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            spawn_timed_acquire(
                &ours,
                wait_req(&n, Duration::from_millis(200), Duration::from_secs(30)),
            )
        })
        .collect();
    sleep(Duration::from_secs(4)).await;
    let probes = exists_calls(&cluster).await - before;
    // One follower: a probe and a confirming probe, then one a second
    // (with MOVED hops from a seed that is not the owner); four would be
    // four times that.
    assert!(probes <= 12, "{probes} owner probes in 4 s for one key");
    assert!(compare_and_delete(&mut foreign, n.as_str(), &token).await);
    for w in waiters {
        let (_, lease) = w.await.unwrap();
        assert!(lease.is_some(), "every waiter is served in turn");
    }
}

/// `renew_many` on a three-master cluster: a batch of two chunks, with
/// released, expired and foreign-held leases among the live ones, is
/// answered lease by lease as `renew` would, in at most one script run per
/// node for each chunk (counted by the masters themselves; a renew per
/// lease would be one run per lease). Then the slot of one live lease moves
/// to another master behind the client's back: the node the batch is sent
/// to cannot read that key, and the lease is renewed on its new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_batch_renews_once_per_node_and_follows_a_moved_slot() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let url = format!("redis+cluster://{}", cluster.seed_nodes());
    let ours = backend(&url).await;
    let mut foreign = raw_cluster(&cluster).await;
    let admins = futures::future::join_all(cluster.servers().iter().map(common::raw_url)).await;
    let live_ttl = Duration::from_secs(30);
    let n = backend_redis::RENEW_CHUNK + 20;
    let prefix = format!("cluster-batch-{:08x}", rand::random::<u32>());
    let names: Vec<LockName> = (0..n).map(|i| name(&format!("{prefix}-{i}"))).collect();
    let (released, expired, theirs) = (1, 2, 3);
    let mut leases = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let ttl = if i == expired {
            Duration::from_millis(50)
        } else {
            live_ttl
        };
        leases.push(acquire_free(&ours, n, ttl).await);
    }
    ours.release(&leases[released]).await.unwrap();
    ours.release(&leases[theirs]).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(names[theirs].as_str())
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut foreign)
        .await
        .unwrap();
    sleep(Duration::from_millis(200)).await;
    let live = |i: usize| ![released, expired, theirs].contains(&i);

    // The first batch also loads the batch script on each master.
    let warm = ours.renew_many(&leases).await;
    let mut calls_before = 0;
    for a in &admins {
        calls_before += common::script_calls(a).await;
    }
    let answers = ours.renew_many(&leases).await;
    let mut calls = 0;
    for a in &admins {
        calls += common::script_calls(a).await;
    }
    let calls = calls - calls_before;
    for (i, (w, a)) in warm.iter().zip(&answers).enumerate() {
        if live(i) {
            let renewed = a.as_ref().expect("a live lease is renewed");
            assert!(w.is_ok(), "lease {i}: {w:?}");
            assert_eq!(renewed.name(), &names[i], "answers out of order");
            assert_eq!(renewed.fence(), leases[i].fence());
        } else {
            assert!(a.as_ref().is_err_and(|e| e.is_lost()), "lease {i}: {a:?}");
        }
    }
    let pttl: i64 = foreign.pttl(names[theirs].as_str()).await.unwrap();
    assert!(
        pttl > live_ttl.as_millis() as i64,
        "the foreign lock was renewed: {pttl}"
    );
    let exists: bool = foreign.exists(names[expired].as_str()).await.unwrap();
    assert!(!exists, "the expired lock was re-created");
    let chunks = n.div_ceil(backend_redis::RENEW_CHUNK) as u64;
    assert!(
        (chunks..=chunks * 3).contains(&calls),
        "{calls} script runs for {n} leases in {chunks} chunks on 3 masters"
    );

    // A live lease's slot moves; the client's slot map still names the old
    // owner. Its expiry is shortened, so only a renew on the new owner can
    // lengthen it again.
    let moved = 10;
    let mut admin = common::raw(&cluster.servers()[0].url()).await;
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(names[moved].as_str())
        .query_async(&mut admin)
        .await
        .unwrap();
    let (ids, from) = owner_of_slot(&cluster, slot).await;
    move_slot(&cluster, &ids, slot, from, (from + 1) % 3).await;
    let _: () = redis::cmd("PEXPIRE")
        .arg(names[moved].as_str())
        .arg(10_000)
        .query_async(&mut foreign)
        .await
        .unwrap();
    let again = ours.renew_many(&leases).await;
    for (i, a) in again.iter().enumerate() {
        assert_eq!(a.is_ok(), live(i), "lease {i} after the move: {a:?}");
    }
    let pttl: i64 = foreign.pttl(names[moved].as_str()).await.unwrap();
    assert!(
        pttl > 10_000,
        "the lease whose slot moved was not renewed on its new owner: pttl {pttl}"
    );
}
