//! `renew_many` on one real redis-server, in both formats: each lease of a
//! batch answered as `renew` would answer it (live, released, expired and
//! foreign-held leases mixed in one batch larger than a chunk), and the
//! batch sent as one script run per chunk, counted by the server itself.

mod common;

use std::time::Duration;

use backend_redis::{RedisBackend, RENEW_CHUNK};
use common::{acquire_free, name, raw, script_calls, server};
use lock_core::{Lease, LockBackend, LockName};
use redis::aio::MultiplexedConnection;
use tokio::time::{sleep, Instant};

/// What happens to lease `i` of the mixed batch before it is renewed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    Live,
    Released,
    Expired,
    Foreign,
}

fn fate(i: usize) -> Fate {
    match i % 4 {
        0 => Fate::Live,
        1 => Fate::Released,
        2 => Fate::Expired,
        _ => Fate::Foreign,
    }
}

fn redisson(b: &RedisBackend) -> bool {
    b.config().format() == backend_redis::Format::Redisson
}

const LIVE_TTL: Duration = Duration::from_secs(30);
const SHORT_TTL: Duration = Duration::from_millis(50);

/// Takes `n` locks and gives each its fate; returns the leases, their
/// names, and the foreign token written over the `Foreign` ones.
async fn mixed_batch(
    ours: &RedisBackend,
    foreign: &mut MultiplexedConnection,
    n: usize,
) -> (Vec<Lease>, Vec<LockName>) {
    let prefix = format!("batch-{:08x}", rand::random::<u32>());
    let names: Vec<LockName> = (0..n).map(|i| name(&format!("{prefix}-{i}"))).collect();
    let mut leases = Vec::with_capacity(n);
    for (i, name) in names.iter().enumerate() {
        let ttl = if fate(i) == Fate::Expired {
            SHORT_TTL
        } else {
            LIVE_TTL
        };
        leases.push(acquire_free(ours, name, ttl).await);
    }
    for (i, lease) in leases.iter().enumerate() {
        if matches!(fate(i), Fate::Released | Fate::Foreign) {
            ours.release(lease).await.expect("release");
        }
        if fate(i) == Fate::Foreign {
            // Another client's lock of the same name: the plain format's
            // key is the name (a Redisson hash in the other format).
            let key = ours.keys(lease.name()).unwrap().lock;
            let _: () = if redisson(ours) {
                redis::cmd("HSET")
                    .arg(&key)
                    .arg("00000000-0000-0000-0000-000000000000:1")
                    .arg(1)
                    .clone()
            } else {
                redis::cmd("SET")
                    .arg(&key)
                    .arg("someone-else")
                    .arg("PX")
                    .arg(60_000)
                    .clone()
            }
            .query_async(foreign)
            .await
            .unwrap();
        }
    }
    // Past every short TTL, with room for a slow machine.
    sleep(SHORT_TTL * 4).await;
    (leases, names)
}

async fn renews_each_lease_as_renew_would(query: &str) {
    let srv = server();
    let ours = RedisBackend::connect(&format!("{}{query}", srv.url()))
        .await
        .expect("connect");
    assert!(ours.guarantees().batch_renew);
    let mut foreign = raw(&srv.url()).await;
    let n = RENEW_CHUNK * 2 + 7;
    let (leases, _names) = mixed_batch(&ours, &mut foreign, n).await;
    let before_calls = script_calls(&foreign).await;
    let asked = Instant::now();
    let answers = ours.renew_many(&leases).await;
    let answered = Instant::now();
    let calls = script_calls(&foreign).await - before_calls;
    assert_eq!(answers.len(), n, "one answer per lease");
    for (i, (lease, answer)) in leases.iter().zip(&answers).enumerate() {
        let key = ours.keys(lease.name()).unwrap().lock;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut foreign)
            .await
            .unwrap();
        match fate(i) {
            Fate::Live => {
                let renewed = answer.as_ref().expect("a live lease is renewed");
                assert_eq!(renewed.name(), lease.name(), "answers out of order");
                assert_eq!(renewed.fence(), lease.fence());
                assert_eq!(renewed.ttl(), LIVE_TTL, "the granted TTL");
                // Counted from the send: no later than one counted from
                // just before the call, and later than the old deadline.
                assert!(renewed.deadline() <= asked + LIVE_TTL);
                assert!(renewed.deadline() > lease.deadline());
                assert!(pttl > 0, "lease {i}: the key expires");
            }
            Fate::Released | Fate::Expired => {
                assert!(
                    answer.as_ref().is_err_and(|e| e.is_lost()),
                    "lease {i} ({:?}): {answer:?}",
                    fate(i)
                );
                assert_eq!(pttl, -2, "lease {i} ({:?}): re-created", fate(i));
            }
            Fate::Foreign => {
                assert!(
                    answer.as_ref().is_err_and(|e| e.is_lost()),
                    "lease {i} (foreign): {answer:?}"
                );
                // Untouched: the plain foreign lock keeps its own expiry,
                // the Redisson one has none.
                let kept = if redisson(&ours) {
                    pttl == -1
                } else {
                    pttl > LIVE_TTL.as_millis() as i64
                };
                assert!(
                    kept,
                    "lease {i}: the foreign lock's expiry was changed ({pttl})"
                );
            }
        }
    }
    // One script per chunk (the INFO reads are not scripts); a renew per
    // lease would be `n`.
    assert_eq!(
        calls,
        n.div_ceil(RENEW_CHUNK) as u64,
        "script runs for {n} leases (answered in {:?})",
        answered - asked
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_batch_renews_each_lease_as_renew_would_in_one_script_per_chunk() {
    renews_each_lease_as_renew_would("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_batch_renews_each_lease_as_renew_would_in_one_script_per_chunk() {
    renews_each_lease_as_renew_would("?format=redisson").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_batch_renews_in_one_script_per_chunk() {
    renews_each_lease_as_renew_would("?fair=true").await;
}
