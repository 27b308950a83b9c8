//! Issue #12 on Redis: holder metadata kept beside the lock (never in the
//! value foreign clients compare), `list` of polylock's own locks, the
//! waiter count, and the wake mode a connection reports; on a server, in
//! both wire formats, and on a cluster. (The conformance suite checks the
//! common contract of each; these are the Redis specifics.)

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::{acquire_free, backend, foreign_set_nx, name, raw, server_and_clients};
use lock_core::{AcquireRequest, HolderMeta, LockBackend, LockName, OwnerToken};
use redis::AsyncCommands;
use testkit::{RedisCluster, RedisServer};

fn meta() -> HolderMeta {
    HolderMeta::new(
        "web-3",
        4242,
        "backup --full",
        UNIX_EPOCH + Duration::from_millis(1_780_000_000_000),
    )
}

fn described(n: &LockName, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(n.clone(), OwnerToken::random(), ttl, Duration::ZERO)
        .unwrap()
        .with_meta(meta())
}

/// The description sits in polylock's bookkeeping hash: the lock's value
/// stays the bare owner token a foreign compare-and-delete expects, and
/// once a foreign client holds the key (our lease ran out) the old
/// description is not shown for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_metadata_is_beside_the_lock_and_only_for_its_holder() {
    let (_srv, ours, mut foreign) = server_and_clients("").await;
    let n = name("meta/plain");
    let keys = ours.keys(&n).unwrap();
    let lease = ours
        .try_acquire(&described(&n, Duration::from_millis(400)))
        .await
        .unwrap()
        .expect("free");
    let value: String = foreign.get(&keys.lock).await.unwrap();
    assert_eq!(
        value,
        lease.owner().to_string(),
        "the value is the token alone"
    );
    let stored: String = foreign.hget(&keys.bookkeeping, "meta").await.unwrap();
    assert_eq!(stored, meta().encode());
    let info = ours.inspect(&n).await.unwrap().unwrap();
    assert_eq!(info.meta, Some(meta()));
    // Renewing keeps it.
    let lease = ours.renew(&lease).await.unwrap();
    assert_eq!(ours.inspect(&n).await.unwrap().unwrap().meta, Some(meta()));
    // Our lease runs out; a foreign client takes the key.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        foreign_set_nx(&mut foreign, &keys.lock, "foreign-uuid", 30_000).await,
        Some("OK".into())
    );
    let info = ours.inspect(&n).await.unwrap().unwrap();
    assert!(info.owner.starts_with("a foreign client"), "{}", info.owner);
    assert_eq!(
        info.meta, None,
        "the expired holder's description shown for a foreign one"
    );
    assert!(
        ours.list("meta/", 10).await.unwrap().is_empty(),
        "a foreign holder listed"
    );
    assert!(ours.release(&lease).await.is_err_and(|e| e.is_lost()));
}

/// Redisson format: the description is in polylock's own hash, Redisson's
/// lock hash keeps exactly one field (the holder) and its count, and a
/// Redisson client holding the lock under another field gets no
/// description and is not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_metadata_leaves_redissons_hash_alone() {
    let (_srv, ours, mut foreign) = server_and_clients("?format=redisson").await;
    let n = name("meta/redisson");
    let keys = ours.keys(&n).unwrap();
    assert_eq!(keys.bookkeeping, "__polylock__:redisson:{meta/redisson}");
    let lease = ours
        .try_acquire(&described(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    let hash: std::collections::HashMap<String, i64> = foreign.hgetall(&keys.lock).await.unwrap();
    assert_eq!(hash.len(), 1, "{hash:?}");
    assert_eq!(
        hash.get(&backend_redis::redisson_field(lease.owner())),
        Some(&1)
    );
    assert_eq!(ours.inspect(&n).await.unwrap().unwrap().meta, Some(meta()));
    let listed = ours.list("meta/", 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.meta, Some(meta()));
    // An operator removes it, a Redisson client takes it.
    assert!(ours.force_release(&n).await.unwrap());
    let _: () = foreign
        .hset(&keys.lock, "0b5c2a4e-0000-4000-8000-000000000001:77", 1)
        .await
        .unwrap();
    let _: () = foreign.pexpire(&keys.lock, 30_000).await.unwrap();
    let info = ours.inspect(&n).await.unwrap().unwrap();
    assert_eq!(info.meta, None, "another holder shown with our description");
    assert!(
        ours.list("meta/", 10).await.unwrap().is_empty(),
        "a Redisson holder listed"
    );
}

/// `list` on a cluster: locks on every master, names whose keys need a
/// found hash tag or carry their own, only this URL's `?prefix=`, only
/// live holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_a_cluster_and_with_a_prefix() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let url = format!("redis+cluster://{}", cluster.seed_nodes());
    let ours = backend(&url).await;
    let prefixed = backend(&format!("{url}?prefix=app:")).await;
    let mut names: Vec<String> = (0..12).map(|i| format!("l/{i:02}")).collect();
    names.extend(["l/a}b{", "l/{tag}x", "l/}{", "l/ключ"].map(String::from));
    names.sort();
    let mut leases = Vec::new();
    for n in &names {
        leases.push(acquire_free(&ours, &name(n), Duration::from_secs(30)).await);
    }
    // A lock under another prefix, and a short one that runs out.
    let other = acquire_free(&prefixed, &name("l/other"), Duration::from_secs(30)).await;
    let _short = acquire_free(&ours, &name("l/short"), Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let listed = ours.list("l/", 100).await.unwrap();
    let got: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(got, names.iter().map(String::as_str).collect::<Vec<_>>());
    for ((n, info), lease) in listed.iter().zip(&leases) {
        assert_eq!(info.fence, Some(lease.fence()), "{n}");
    }
    let listed = prefixed.list("", 100).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0.as_str(), "l/other");
    assert_eq!(listed[0].1.fence, Some(other.fence()));
    assert_eq!(ours.list("l/", 3).await.unwrap().len(), 3);
}

/// Waiters are the connections subscribed to the release channel: two
/// waiting clients count two; tasks of one client share its connection and
/// count one; a cancelled waiter stops counting. On a cluster, clients
/// subscribed on different nodes are summed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_connections_that_wait() {
    let srv = RedisServer::start().unwrap();
    let cluster = RedisCluster::start(3).expect("cluster");
    // The second cluster client lists another seed first, so its pub/sub
    // connection is on another node than the first client's.
    let seeds: Vec<String> = cluster.seed_nodes().split(',').map(String::from).collect();
    let rotated = format!("redis+cluster://{},{}", seeds[1..].join(","), seeds[0]);
    for (url, second) in [
        (srv.url(), srv.url()),
        (format!("redis+cluster://{}", cluster.seed_nodes()), rotated),
    ] {
        let holder = backend(&url).await;
        let n = name("waiters/w");
        let lease = acquire_free(&holder, &n, Duration::from_secs(30)).await;
        assert_eq!(holder.waiters(&n).await.unwrap(), Some(0));
        let mut tasks = Vec::new();
        // Two clients; a's two waiting tasks share its one subscription.
        let a = backend(&url).await;
        let b = backend(&second).await;
        for c in [&a, &a, &b] {
            let c = c.clone();
            let n = n.clone();
            tasks.push(tokio::spawn(async move {
                let r = AcquireRequest::new(
                    n,
                    OwnerToken::random(),
                    Duration::from_secs(30),
                    Duration::from_secs(30),
                )
                .unwrap();
                c.acquire(&r).await
            }));
        }
        let counted = common::eventually(Duration::from_secs(10), || async {
            holder.waiters(&n).await.unwrap() == Some(2)
        })
        .await;
        assert!(counted, "{url}: {:?}", holder.waiters(&n).await);
        for t in &tasks {
            t.abort();
        }
        let gone = common::eventually(Duration::from_secs(10), || async {
            holder.waiters(&n).await.unwrap() == Some(0)
        })
        .await;
        assert!(gone, "{url}: cancelled waiters still counted");
        holder.release(&lease).await.unwrap();
    }
}

/// The wake mode names both ways a waiter is woken, truthfully for the
/// connection: pub/sub for polylock's releases, and keyspace notifications
/// or polling for foreign ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_mode_says_how_foreign_releases_are_seen() {
    let plain = RedisServer::start().unwrap();
    let events = RedisServer::start_with_args(&["--notify-keyspace-events", "KA"]).unwrap();
    let cases = [
        (plain.url(), "polling (10-100 ms) for foreign releases"),
        (events.url(), "keyspace notifications for foreign releases"),
        (format!("{}?format=redisson", plain.url()), "Redisson"),
    ];
    for (url, says) in cases {
        let mode = backend(&url).await.wake_mode();
        assert!(
            mode.starts_with("pub/sub for polylock releases; "),
            "{mode}"
        );
        assert!(mode.contains(says), "{url}: {mode}");
    }
    // Keyspace events on one node of a cluster only: its other masters'
    // keys would be polled, so the connection says polling.
    let cluster = RedisCluster::start(3).expect("cluster");
    let mut one = raw(&cluster.servers()[0].url()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Kgx")
        .query_async(&mut one)
        .await
        .unwrap();
    let url = format!("redis+cluster://{}", cluster.seed_nodes());
    let mode = backend(&url).await.wake_mode();
    assert!(
        mode.contains("polling (10-100 ms) for foreign releases"),
        "{mode}"
    );
    common::keyspace_events_on(&cluster).await;
    let mode = backend(&url).await.wake_mode();
    assert!(
        mode.contains("keyspace notifications for foreign releases, on the node that owns"),
        "{mode}"
    );
}
