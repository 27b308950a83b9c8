//! Interoperation with other clients, on a real redis-server: a foreign
//! `SET NX PX` lock in the plain format, and Redisson's exact layout.

mod common;

use std::time::Duration;

use backend_redis::redisson_field;
use common::{foreign_set_nx, name, req, server_and_clients, spawn_timed_acquire, wait_req};
use futures::StreamExt;
use lock_core::{AcquireRequest, LockBackend, OwnerToken};
use redis::AsyncCommands;
use tokio::time::{sleep, timeout, Instant};

/// What Redisson's `RLock.unlock()` runs: KEYS lock, channel; ARGV unlock
/// message, lease time, holder field.
const REDISSON_UNLOCK: &str = "
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if counter > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_plain_lock_blocks_ours_until_released() {
    let (_srv, ours, mut foreign) = server_and_clients("").await;
    let n = name("interop/released");
    let key = ours.keys(&n).unwrap().lock;
    assert_eq!(key, "interop/released", "the lock key is the name itself");

    // Another client (redis-py, redsync, a shell script) takes it its way.
    let set = foreign_set_nx(&mut foreign, &key, "their-token", 30_000).await;
    assert_eq!(set.as_deref(), Some("OK"));
    assert!(ours
        .try_acquire(&req(&n, Duration::from_secs(5)))
        .await
        .unwrap()
        .is_none());
    let info = ours.inspect(&n).await.unwrap().expect("held");
    assert!(
        info.owner
            .starts_with("a foreign client (not polylock), value \"their-token\""),
        "{}",
        info.owner
    );
    assert!(info.owner.contains("polling"), "{}", info.owner);
    assert_eq!(
        info.fence, None,
        "a foreign holder has no fencing token of ours"
    );
    assert!(info.expires_in.unwrap() > Duration::from_secs(25));

    let waiter = spawn_timed_acquire(
        &ours,
        wait_req(&n, Duration::from_secs(5), Duration::from_secs(10)),
    );
    sleep(Duration::from_millis(400)).await;
    assert!(
        !waiter.is_finished(),
        "acquired a lock held by another client"
    );
    // They release their way: compare-and-delete, no message to us.
    let released_at = Instant::now();
    let del: i64 = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
    .key(&key)
    .arg("their-token")
    .invoke_async(&mut foreign)
    .await
    .unwrap();
    assert_eq!(del, 1);
    let (got_at, lease) = waiter.await.unwrap();
    let lease = lease.expect("acquired after their release");
    assert!(got_at >= released_at);
    // No publish from them: the fallback poll (at most 500 ms) finds it.
    assert!(
        got_at - released_at < Duration::from_millis(1500),
        "{:?}",
        got_at - released_at
    );
    ours.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_plain_lock_blocks_ours_until_it_expires() {
    let (_srv, ours, mut foreign) = server_and_clients("").await;
    let n = name("interop/expires");
    let key = ours.keys(&n).unwrap().lock;
    let ttl = Duration::from_millis(800);
    let set_at = Instant::now();
    foreign_set_nx(&mut foreign, &key, "their-token", ttl.as_millis() as u64).await;
    let lease = ours
        .acquire(&wait_req(
            &n,
            Duration::from_secs(5),
            Duration::from_secs(10),
        ))
        .await
        .unwrap()
        .expect("acquired once theirs expired");
    let after = set_at.elapsed();
    assert!(
        after >= ttl - Duration::from_millis(50),
        "got it after {after:?}, before their TTL"
    );
    // The waiter sleeps until the holder's PTTL runs out, not for a poll.
    assert!(
        after < ttl + Duration::from_millis(300),
        "got it only after {after:?}"
    );
    ours.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_plain_lock_blocks_a_foreign_set_nx() {
    let (_srv, ours, mut foreign) = server_and_clients("").await;
    let n = name("interop/ours");
    let key = ours.keys(&n).unwrap().lock;
    let r = req(&n, Duration::from_secs(10));
    let lease = ours.try_acquire(&r).await.unwrap().expect("acquire");

    let set = foreign_set_nx(&mut foreign, &key, "their-token", 30_000).await;
    assert_eq!(set, None, "a foreign SET NX took our lock");
    // The value is our owner token as a plain string, as redis-py stores it.
    let value: String = foreign.get(&key).await.unwrap();
    assert_eq!(value, r.owner.to_string());
    let pttl: i64 = foreign.pttl(&key).await.unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "{pttl}");
    let fence: u64 = foreign
        .hget(ours.keys(&n).unwrap().fence, "fence")
        .await
        .unwrap();
    assert_eq!(fence, lease.fence().get());
    assert_eq!(
        ours.inspect(&n).await.unwrap().expect("held").owner,
        r.owner.to_string()
    );

    ours.release(&lease).await.unwrap();
    let set = foreign_set_nx(&mut foreign, &key, "their-token", 30_000).await;
    assert_eq!(
        set.as_deref(),
        Some("OK"),
        "our release left the key behind"
    );
    // Our stale lease cannot touch their lock now.
    let r = ours.release(&lease).await;
    assert!(r.is_err_and(|e| e.is_lost()));
    let value: String = foreign.get(&key).await.unwrap();
    assert_eq!(value, "their-token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_layout_is_exact() {
    let (srv, ours, mut r) = server_and_clients("?format=redisson").await;
    let n = name("orders");
    let keys = ours.keys(&n).unwrap();
    assert_eq!(keys.lock, "orders");
    assert_eq!(keys.fence, "redisson_lock_token:{orders}");
    assert_eq!(keys.channel, "redisson_lock__channel:{orders}");

    let owner = OwnerToken::random();
    let field = redisson_field(owner);
    let (uuid, thread) = field.split_once(':').unwrap();
    assert_eq!(uuid.len(), 36);
    assert_eq!(uuid.matches('-').count(), 4);
    assert!(thread.parse::<u64>().is_ok());

    let ttl = Duration::from_secs(10);
    let request = AcquireRequest::new(n.clone(), owner, ttl, Duration::ZERO).unwrap();
    let first = ours.try_acquire(&request).await.unwrap().expect("acquire");

    let kind: String = redis::cmd("TYPE")
        .arg("orders")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(kind, "hash");
    let hash: Vec<(String, String)> = r.hgetall("orders").await.unwrap();
    assert_eq!(hash, vec![(field.clone(), "1".to_string())]);
    let pttl: i64 = r.pttl("orders").await.unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "PTTL {pttl}");
    let token: u64 = r.get("redisson_lock_token:{orders}").await.unwrap();
    assert_eq!(token, first.fence().get());
    let info = ours.inspect(&n).await.unwrap().expect("held");
    assert_eq!(info.owner, field);
    assert_eq!(info.fence, Some(first.fence()));

    // The same owner again: counted on the server, as Redisson does, with
    // the same fencing token.
    let second = ours.try_acquire(&request).await.unwrap().expect("re-enter");
    assert_eq!(second.fence(), first.fence());
    let count: String = r.hget("orders", &field).await.unwrap();
    assert_eq!(count, "2");
    let other = req(&n, ttl);
    assert!(ours.try_acquire(&other).await.unwrap().is_none());

    // Watch the channel from another connection, like Redisson's waiters.
    let mut pubsub = redis::Client::open(srv.url().as_str())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe(&keys.channel).await.unwrap();
    let mut messages = pubsub.into_on_message();

    // Dropping one of two holds keeps the lock, resets an expiry shorter
    // than the TTL (never a longer one, see contract.rs), and publishes
    // nothing.
    let _: () = r.pexpire("orders", 5_000).await.unwrap();
    ours.release(&second).await.unwrap();
    let count: String = r.hget("orders", &field).await.unwrap();
    assert_eq!(count, "1");
    let pttl: i64 = r.pttl("orders").await.unwrap();
    assert!(
        pttl > 9_000,
        "PTTL {pttl}: release of a hold must reset the expiry"
    );
    assert!(
        timeout(Duration::from_millis(200), messages.next())
            .await
            .is_err(),
        "a message was published while a hold remained"
    );

    // The last hold: the hash goes and Redisson's unlock message is sent.
    ours.release(&first).await.unwrap();
    let exists: bool = r.exists("orders").await.unwrap();
    assert!(!exists);
    let msg = timeout(Duration::from_secs(2), messages.next())
        .await
        .expect("an unlock message")
        .expect("stream open");
    assert_eq!(msg.get_channel_name(), "redisson_lock__channel:{orders}");
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
    // The counter is never reset.
    let token: u64 = r.get("redisson_lock_token:{orders}").await.unwrap();
    assert_eq!(token, first.fence().get());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_foreign_holder_blocks_and_its_unlock_message_wakes_us() {
    let (_srv, ours, mut r) = server_and_clients("?format=redisson").await;
    let n = name("shared-job");
    // A Redisson client holds it: its field, count 1, an expiry.
    let theirs = "1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed:57";
    let _: () = r.hset("shared-job", theirs, 1).await.unwrap();
    let _: () = r.pexpire("shared-job", 30_000).await.unwrap();

    assert!(ours
        .try_acquire(&req(&n, Duration::from_secs(5)))
        .await
        .unwrap()
        .is_none());
    let info = ours.inspect(&n).await.unwrap().expect("held");
    assert_eq!(info.owner, theirs);

    let waiter = spawn_timed_acquire(
        &ours,
        wait_req(&n, Duration::from_secs(5), Duration::from_secs(20)),
    );
    // Long enough for the fallback poll to have backed off to its maximum.
    sleep(Duration::from_millis(1500)).await;
    assert!(!waiter.is_finished());
    // Redisson unlocks with its own script: one hold less, and at zero the
    // hash goes and 0 is published on its channel.
    let unlocked_at = Instant::now();
    let unlocked: i64 = redis::Script::new(REDISSON_UNLOCK)
        .key("shared-job")
        .key("redisson_lock__channel:{shared-job}")
        .arg(0)
        .arg(30_000)
        .arg(theirs)
        .invoke_async(&mut r)
        .await
        .unwrap();
    assert_eq!(unlocked, 1, "the unlock took the last hold");
    let (got_at, lease) = waiter.await.unwrap();
    let lease = lease.expect("acquired after the unlock");
    assert!(
        got_at - unlocked_at < Duration::from_millis(100),
        "woke {:?} after Redisson's unlock message: not by the message",
        got_at - unlocked_at
    );
    ours.release(&lease).await.unwrap();
}

/// With keyspace notifications on, a waiter also listens to the lock key's
/// keyspace channel, and a foreign release (which publishes nothing) wakes
/// it there; without them it polls. Prints both hand-off medians.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_release_wakes_by_keyspace_event_or_poll() {
    let events = testkit::RedisServer::start_with_args(&["--notify-keyspace-events", "Kgx"])
        .expect("redis-server");
    let polling = common::server();
    for (srv, wake) in [
        (&events, backend_redis::ForeignWake::KeyspaceEvents),
        (&polling, backend_redis::ForeignWake::Polling),
    ] {
        let ours = common::backend(&srv.url()).await;
        assert_eq!(ours.foreign_wake(), wake);
        let mut foreign = common::raw(&srv.url()).await;
        let admin = common::raw(&srv.url()).await;
        let mut handoffs = Vec::new();
        for i in 0..7 {
            let n = name(&format!("interop/wake/{i}"));
            foreign_set_nx(&mut foreign, n.as_str(), "theirs", 30_000).await;
            let waiter = spawn_timed_acquire(
                &ours,
                wait_req(&n, Duration::from_secs(5), Duration::from_secs(10)),
            );
            let channel = format!("__keyspace@0__:{n}");
            let listening = common::eventually(Duration::from_secs(3), || async {
                common::numsub(&admin, &channel).await == 1
            })
            .await;
            assert_eq!(
                listening,
                wake == backend_redis::ForeignWake::KeyspaceEvents,
                "{wake}: subscribed to {channel}"
            );
            // Backed off to its longest poll.
            sleep(Duration::from_millis(300)).await;
            let released_at = Instant::now();
            let _: i64 = foreign.del(n.as_str()).await.unwrap();
            let (got_at, lease) = waiter.await.unwrap();
            handoffs.push(got_at.saturating_duration_since(released_at));
            ours.release(&lease.expect("acquired")).await.unwrap();
        }
        handoffs.sort();
        eprintln!(
            "foreign release -> polylock ({wake}): median {:?}, all {handoffs:?}",
            handoffs[handoffs.len() / 2]
        );
        assert!(handoffs[handoffs.len() / 2] < Duration::from_secs(1));
    }
}
