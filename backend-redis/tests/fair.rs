//! Fair mode (`?fair=true`): waiters queue on the server, a release wakes
//! the head waiter alone, a try never jumps the queue, and waiters that
//! crashed, gave up or were cancelled leave it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_redis::RedisBackend;
use common::{
    backend, eventually, foreign_set_nx, name, raw, req, server, spawn_timed_acquire, wait_req,
};
use futures::StreamExt;
use lock_core::{Lease, LockBackend, LockName};
use redis::aio::MultiplexedConnection;
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(30);

/// How long a release grants the lock to the waiter it hands it to.
const CLAIM: Duration = Duration::from_secs(2);

/// The server's clock in milliseconds.
async fn server_ms(conn: &MultiplexedConnection) -> u64 {
    let mut conn = conn.clone();
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    s * 1000 + us / 1000
}

async fn zcard(conn: &MultiplexedConnection, key: &str) -> i64 {
    let mut conn = conn.clone();
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

async fn queued(b: &RedisBackend, n: &LockName) -> usize {
    b.waiters(n)
        .await
        .unwrap()
        .expect("fair mode counts waiters")
}

/// Every message published on polylock's channels, as (channel, payload).
async fn watch_channels(url: &str) -> impl futures::Stream<Item = String> {
    let mut ps = redis::Client::open(url)
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    ps.psubscribe("__polylock__:*").await.unwrap();
    ps.into_on_message()
        .map(|m| m.get_channel_name().to_string())
}

/// The channels of the messages that arrive within `window`.
async fn messages_within(
    stream: &mut (impl futures::Stream<Item = String> + Unpin),
    window: Duration,
) -> Vec<String> {
    let mut got = Vec::new();
    while let Ok(Some(c)) = timeout(window, stream.next()).await {
        got.push(c);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_head_waiter_alone_and_waiters_are_served_in_order() {
    let srv = server();
    let url = format!("{}/0?fair=true", srv.url());
    let holder = backend(&url).await;
    let n = name("fair/head");
    let keys = holder.keys(&n).unwrap();
    let mut watch = Box::pin(watch_channels(&srv.url()).await);
    let first = common::acquire_free(&holder, &n, TTL).await;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let waiter = backend(&url).await;
        tasks.push(spawn_timed_acquire(
            &waiter,
            wait_req(&n, TTL, Duration::from_secs(60)),
        ));
        assert!(
            eventually(Duration::from_secs(10), || async {
                queued(&holder, &n).await == i + 1
            })
            .await,
            "waiter {i} never queued"
        );
    }
    assert!(messages_within(&mut watch, Duration::from_millis(200))
        .await
        .is_empty());

    let mut lease: Lease = first;
    let mut woken = Vec::new();
    for i in 0..3 {
        holder.release(&lease).await.unwrap();
        let (_, got) = tasks.remove(0).await.unwrap();
        lease = got.expect("the head waiter acquires");
        // One message, on a waiter's own channel; no broadcast.
        let msgs = messages_within(&mut watch, Duration::from_millis(300)).await;
        assert_eq!(msgs.len(), 1, "release {i}: {msgs:?}");
        assert!(msgs[0].starts_with(&keys.wake_prefix), "{msgs:?}");
        assert!(!woken.contains(&msgs[0]), "woke the same waiter twice");
        woken.push(msgs[0].clone());
        // The others still wait, in the queue.
        for t in &tasks {
            assert!(!t.is_finished(), "a waiter behind the head got the lock");
        }
        assert_eq!(queued(&holder, &n).await, 2 - i);
    }
    // Nobody queued: the release goes to the lock's channel.
    holder.release(&lease).await.unwrap();
    let msgs = messages_within(&mut watch, Duration::from_millis(300)).await;
    assert_eq!(msgs, vec![keys.channel.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_never_jumps_the_queue_and_a_crashed_waiter_leaves_it_by_its_deadline() {
    let srv = server();
    let client = backend(&format!("{}/0?fair=true", srv.url())).await;
    let admin = raw(&srv.url()).await;
    let n = name("fair/crashed");
    let keys = client.keys(&n).unwrap();
    // A waiter that queued and crashed while the lock was free: its entry
    // lives 1.5 s more.
    let dies_at = server_ms(&admin).await + 1500;
    let mut a = admin.clone();
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(&keys.queue)
        .arg(0)
        .arg("crashed")
        .ignore()
        .cmd("ZADD")
        .arg(&keys.queue_deadlines)
        .arg(dies_at)
        .arg("crashed")
        .ignore()
        .query_async(&mut a)
        .await
        .unwrap();
    assert!(client.try_acquire(&req(&n, TTL)).await.unwrap().is_none());
    assert!(client.acquire(&req(&n, TTL)).await.unwrap().is_none());
    assert_eq!(client.inspect(&n).await.unwrap(), None, "the lock is free");
    assert_eq!(queued(&client, &n).await, 1, "tries never join the queue");
    // A polylock client without fair mode does not know the queue.
    let unfair = backend(&format!("{}/0", srv.url())).await;
    let lease = unfair
        .try_acquire(&req(&n, TTL))
        .await
        .unwrap()
        .expect("a client without fair=true takes the free lock");
    unfair.release(&lease).await.unwrap();
    let lease = client
        .acquire(&wait_req(&n, TTL, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("granted once the dead entry expired");
    assert!(server_ms(&admin).await >= dies_at);
    assert_eq!(zcard(&admin, &keys.queue).await, 0);
    assert_eq!(zcard(&admin, &keys.queue_deadlines).await, 0);
    client.release(&lease).await.unwrap();
    // With the queue empty a try succeeds again.
    let lease = client
        .try_acquire(&req(&n, TTL))
        .await
        .unwrap()
        .expect("free");
    client.release(&lease).await.unwrap();
}

/// An operation timeout of 30 s gives queue entries a life of a minute, so
/// an entry that disappears within seconds was taken out, not expired.
fn long_lived(srv: &testkit::RedisServer) -> String {
    format!("{}/0?fair=true&op_timeout=30s", srv.url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_queue() {
    let srv = server();
    let url = long_lived(&srv);
    let holder = backend(&url).await;
    let waiter: Arc<RedisBackend> = backend(&url).await;
    let admin = raw(&srv.url()).await;
    let n = name("fair/cancelled");
    let keys = holder.keys(&n).unwrap();
    let lease = common::acquire_free(&holder, &n, TTL).await;
    let task = spawn_timed_acquire(&waiter, wait_req(&n, TTL, Duration::from_secs(60)));
    assert!(
        eventually(Duration::from_secs(10), || async {
            queued(&holder, &n).await == 1
        })
        .await
    );
    task.abort();
    assert!(
        eventually(Duration::from_secs(10), || async {
            zcard(&admin, &keys.queue).await == 0
        })
        .await,
        "the cancelled waiter's entry stayed"
    );
    assert_eq!(zcard(&admin, &keys.queue_deadlines).await, 0);
    holder.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let srv = server();
    let url = long_lived(&srv);
    let holder = backend(&url).await;
    let admin = raw(&srv.url()).await;
    let n = name("fair/gave-up");
    let keys = holder.keys(&n).unwrap();
    let lease = common::acquire_free(&holder, &n, TTL).await;
    let quitter = backend(&url).await;
    let r = quitter
        .acquire(&wait_req(&n, TTL, Duration::from_millis(400)))
        .await
        .unwrap();
    assert!(r.is_none());
    assert_eq!(zcard(&admin, &keys.queue).await, 0, "the entry stayed");

    // The queue is empty again: a release goes to the lock's channel, and
    // a try succeeds.
    holder.release(&lease).await.unwrap();
    let lease = quitter
        .try_acquire(&req(&n, TTL))
        .await
        .unwrap()
        .expect("free, nobody queued");
    quitter.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_holder_is_waited_for_and_the_mode_says_fair() {
    let srv = server();
    let client = backend(&format!("{}/0?fair=true", srv.url())).await;
    assert!(client.guarantees().fair_fifo);
    assert!(
        client.wake_mode().contains("fair"),
        "{}",
        client.wake_mode()
    );
    let mut foreign = raw(&srv.url()).await;
    let n = name("fair/foreign");
    assert!(foreign_set_nx(&mut foreign, n.as_str(), "theirs", 800)
        .await
        .is_some());
    let lease = client
        .acquire(&wait_req(&n, TTL, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("granted after the foreign lock expired");
    client.release(&lease).await.unwrap();
}

/// The fair-mode leave script, as the backend builds it (the test runs it
/// in place of a waiter that gave up).
fn leave_script() -> redis::Script {
    redis::Script::new(concat!(
        include_str!("../scripts/fence_seed.lua"),
        include_str!("../scripts/plain_grant.lua"),
        include_str!("../scripts/fair_queue.lua"),
        include_str!("../scripts/fair_leave.lua")
    ))
}

/// Puts a waiter `id` at the head of the queue as a polylock waiter's
/// attempt would: its entry, deadline, and what a release needs to grant it
/// the lock (TTL, when it last asked, its token).
async fn queue_ghost(
    admin: &MultiplexedConnection,
    keys: &backend_redis::LockKeys,
    id: &str,
    token: &str,
    ttl_ms: u64,
    last_seen_ms: u64,
    dies_at_ms: u64,
) {
    let mut a = admin.clone();
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(&keys.queue)
        .arg(0)
        .arg(id)
        .ignore()
        .cmd("ZADD")
        .arg(&keys.queue_deadlines)
        .arg(dies_at_ms)
        .arg(id)
        .ignore()
        .cmd("HSET")
        .arg(&keys.queue_waiters)
        .arg(id)
        .arg(format!("{ttl_ms}:{last_seen_ms}:{token}:"))
        .ignore()
        .query_async(&mut a)
        .await
        .unwrap();
}

async fn get(admin: &MultiplexedConnection, key: &str) -> Option<String> {
    let mut a = admin.clone();
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut a)
        .await
        .unwrap()
}

/// A release hands the lock straight to the head waiter: the waiter holds
/// it on the release's message alone, with no attempt of its own after the
/// release (its lease is counted from a request sent before the release
/// began, which only a refused attempt made before it can be), and that
/// deadline is within the lock's expiry on the server.
///
/// The waiter also polls (every 300 ms at most), and a poll that happens
/// to go out while the release is on its way takes the lock its own way,
/// which is correct but not what this test looks for; so the hand-off is
/// tried a few times and must go by message at least once. Without the
/// direct grant every round would take a poll after the release, and the
/// test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_head_waiter_without_another_round_trip() {
    let srv = server();
    let url = format!("{}/0?fair=true", srv.url());
    let holder = backend(&url).await;
    let waiter = backend(&url).await;
    let admin = raw(&srv.url()).await;
    let mut by_message = 0;
    for round in 0..3 {
        let n = name(&format!("fair/direct/{round}"));
        let keys = holder.keys(&n).unwrap();
        let lease = common::acquire_free(&holder, &n, TTL).await;
        let request = wait_req(&n, TTL, Duration::from_secs(60));
        let task = spawn_timed_acquire(&waiter, request.clone());
        assert!(
            eventually(Duration::from_secs(10), || async {
                queued(&holder, &n).await == 1
            })
            .await
        );
        // Past the waiter's subscription and its first fallback polls.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let release_began = tokio::time::Instant::now();
        holder.release(&lease).await.unwrap();
        let (_, got) = task.await.unwrap();
        let granted = got.expect("the head waiter acquires");
        let now = tokio::time::Instant::now();
        assert!(granted.fence() > lease.fence());
        assert_eq!(granted.renewal_ttl(), TTL, "renewals ask for the TTL asked");
        let from_release = request
            .lease(granted.fence(), granted.ttl(), release_began)
            .deadline();
        let message = granted.deadline() < from_release;
        if message {
            by_message += 1;
            assert_eq!(granted.ttl(), CLAIM, "a hand-off grants the claim window");
        } else {
            assert_eq!(granted.ttl(), TTL);
        }
        let mut a = admin.clone();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&keys.lock)
            .query_async(&mut a)
            .await
            .unwrap();
        assert!(
            Duration::from_millis(pttl as u64) >= granted.deadline() - now,
            "the lease outlives the lock on the server: pttl {pttl} ms"
        );
        assert_eq!(
            waiter.inspect(&n).await.unwrap().unwrap().fence,
            Some(granted.fence())
        );
        if message {
            // The first renewal extends the claim window to the TTL asked.
            let renewed = waiter.renew(&granted).await.unwrap();
            assert_eq!(renewed.ttl(), TTL);
            let pttl: u64 = redis::cmd("PTTL")
                .arg(&keys.lock)
                .query_async(&mut a)
                .await
                .unwrap();
            assert!(Duration::from_millis(pttl) > CLAIM, "pttl {pttl} ms");
        }
        waiter.release(&granted).await.unwrap();
        assert_eq!(zcard(&admin, &keys.queue).await, 0);
    }
    assert!(
        by_message > 0,
        "in every round the waiter's lease was counted from after the release began: it asked \
         the server again instead of taking the grant"
    );
}

/// A release grants the lock to a waiter that is gone before it learned of
/// it (its leave, from a time-out or a cancellation, comes after the
/// grant): the leave frees the lock and hands it on to the next waiter. A
/// waiter whose last attempt is old (it may have died) is not granted the
/// lock, only woken, and its entry expires by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_to_a_waiter_that_left_is_handed_on_and_a_stale_waiter_is_not_granted() {
    let srv = server();
    let url = long_lived(&srv);
    let holder = backend(&url).await;
    let next = backend(&url).await;
    let admin = raw(&srv.url()).await;
    let n = name("fair/ghost");
    let keys = holder.keys(&n).unwrap();
    let lease = common::acquire_free(&holder, &n, TTL).await;
    let now = server_ms(&admin).await;
    let ghost_token = format!("{:032x}", rand::random::<u128>());
    queue_ghost(
        &admin,
        &keys,
        "ghost",
        &ghost_token,
        30_000,
        now,
        now + 60_000,
    )
    .await;
    let task = spawn_timed_acquire(&next, wait_req(&n, TTL, Duration::from_secs(60)));
    assert!(
        eventually(Duration::from_secs(10), || async {
            queued(&holder, &n).await == 2
        })
        .await
    );
    holder.release(&lease).await.unwrap();
    assert_eq!(
        get(&admin, &keys.lock).await.as_deref(),
        Some(ghost_token.as_str()),
        "the release granted the head waiter"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!task.is_finished(), "the second waiter jumped the queue");
    let mut a = admin.clone();
    let left: i64 = leave_script()
        .key(&keys.lock)
        .key(&keys.fence)
        .key(&keys.queue)
        .key(&keys.queue_deadlines)
        .key(&keys.queue_waiters)
        .arg("ghost")
        .arg(&keys.wake_prefix)
        .arg(&keys.channel)
        .arg(1000)
        .invoke_async(&mut a)
        .await
        .unwrap();
    assert_eq!(left, 2, "the leave freed the grant");
    let (_, got) = timeout(Duration::from_secs(5), task)
        .await
        .expect("handed on at the leave, not at a poll or the TTL")
        .unwrap();
    let second = got.expect("the next waiter acquires");
    assert_eq!(
        next.inspect(&n).await.unwrap().unwrap().fence,
        Some(second.fence())
    );

    // A stale head (last attempt 5 s ago, entry alive 1.5 s more) is only
    // woken: the lock stays free until its entry dies.
    let now = server_ms(&admin).await;
    queue_ghost(
        &admin,
        &keys,
        "stale",
        &ghost_token,
        30_000,
        now - 5000,
        now + 1500,
    )
    .await;
    let third = backend(&url).await;
    let task = spawn_timed_acquire(&third, wait_req(&n, TTL, Duration::from_secs(60)));
    assert!(
        eventually(Duration::from_secs(10), || async {
            queued(&holder, &n).await == 2
        })
        .await
    );
    next.release(&second).await.unwrap();
    assert_eq!(
        get(&admin, &keys.lock).await,
        None,
        "a stale waiter was granted"
    );
    let (_, got) = task.await.unwrap();
    let lease = got.expect("granted once the stale entry expired");
    assert!(server_ms(&admin).await >= now + 1500);
    third.release(&lease).await.unwrap();
}

/// A waiter that dies right after its last attempt (no leave reaches the
/// server) is still fresh enough to be handed the lock by the next release.
/// The hand-off grants it a claim window of 2 s, not its TTL of 30 s: the
/// lock is free again within the window, and the next waiter takes it
/// then, where a grant of the waiter's whole TTL would have left the lock
/// to nobody for 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_died_is_handed_the_lock_only_for_the_claim_window() {
    let srv = server();
    let url = format!("{}/0?fair=true", srv.url());
    let holder = backend(&url).await;
    let admin = raw(&srv.url()).await;
    let proxy = testkit::Proxy::start(srv.addr()).expect("proxy");
    let doomed = backend(&format!("redis://{}/0?fair=true", proxy.addr())).await;
    let n = name("fair/died");
    let keys = holder.keys(&n).unwrap();
    let lease = common::acquire_free(&holder, &n, TTL).await;
    let task = spawn_timed_acquire(&doomed, wait_req(&n, TTL, Duration::from_secs(60)));
    assert!(
        eventually(Duration::from_secs(10), || async {
            queued(&holder, &n).await == 1
        })
        .await
    );
    // Past its subscription and first polls; then it goes silent, as a
    // process killed mid-wait does: its cancelled wait's leave is lost.
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.set_mode(testkit::Mode::Blackhole);
    task.abort();
    holder.release(&lease).await.unwrap();

    let mut a = admin.clone();
    let (value, pttl): (Option<String>, i64) = redis::pipe()
        .cmd("GET")
        .arg(&keys.lock)
        .cmd("PTTL")
        .arg(&keys.lock)
        .query_async(&mut a)
        .await
        .unwrap();
    assert!(value.is_some(), "the release handed the lock to the waiter");
    assert!(
        pttl > 0 && Duration::from_millis(pttl as u64) <= CLAIM,
        "a dead waiter was granted {pttl} ms"
    );
    let next = backend(&url).await;
    let started = tokio::time::Instant::now();
    let got = next
        .acquire(&wait_req(&n, TTL, Duration::from_secs(15)))
        .await
        .unwrap()
        .expect("the lock is free again after the claim window");
    assert!(
        started.elapsed() < CLAIM + Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    next.release(&got).await.unwrap();
}

/// A holder handed the lock by a release (granted the claim window) keeps
/// it past that window: the watchdog's first renewal asks for the TTL the
/// holder asked for, not the window's. A hand-off that went by the waiter's
/// own poll instead (granted the TTL at once) proves nothing here, so it is
/// tried a few times and must go by message at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_handed_the_lock_renews_past_the_claim_window_to_its_ttl() {
    let srv = server();
    let url = format!("{}/0?fair=true", srv.url());
    let holder = common::locker_on(&url).await;
    let waiter = common::locker_on(&url).await;
    let probe = backend(&url).await;
    let admin = raw(&srv.url()).await;
    let mut checked = false;
    for round in 0..3 {
        let lock = format!("fair/claimed/{round}");
        let n = name(&lock);
        let first = holder.lock(&lock).ttl(TTL).acquire().await.unwrap();
        let task = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                waiter
                    .lock(&lock)
                    .ttl(TTL)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                    .expect("the waiter acquires")
            })
        };
        assert!(
            eventually(Duration::from_secs(10), || async {
                queued(&probe, &n).await == 1
            })
            .await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        first.release().await.unwrap();
        let guard = task.await.unwrap();
        if guard.lease().ttl() != CLAIM {
            guard.release().await.unwrap();
            continue;
        }
        tokio::time::sleep(CLAIM + Duration::from_millis(500)).await;
        assert!(guard.is_held(), "lost past the claim window");
        let mut a = admin.clone();
        let pttl: u64 = redis::cmd("PTTL")
            .arg(&probe.keys(&n).unwrap().lock)
            .query_async(&mut a)
            .await
            .unwrap();
        assert!(
            Duration::from_millis(pttl) > TTL - Duration::from_secs(5),
            "renewed to {pttl} ms, not to the TTL asked"
        );
        guard.release().await.unwrap();
        checked = true;
        break;
    }
    assert!(checked, "no round's hand-off went by the release's grant");
}

/// A waiter whose attempts all go unanswered (a slow link) takes the lock
/// from the grant message a release sent it. An attempt of that wait that
/// reached the server after the grant took the grant back under the wait's
/// attempt id; the lease now held, a second acquisition of the same owner
/// on that client must not take over that grant as if it were its own
/// unanswered attempt's: it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_taken_from_its_message_leaves_nothing_for_the_next_acquisition_to_take_over() {
    let srv = server();
    let holder = backend(&format!("{}/0?fair=true", srv.url())).await;
    let proxy = testkit::Proxy::start(srv.addr()).unwrap();
    let waiter = backend(&format!(
        "redis://127.0.0.1:{}/0?fair=true&op_timeout=300ms",
        proxy.port()
    ))
    .await;
    let n = name("fair/granted-mark");
    let owner = lock_core::OwnerToken::random();
    let request = |wait| {
        let mut r = lock_core::AcquireRequest::new(n.clone(), owner, TTL, wait).unwrap();
        r.retry = Some(lock_core::wait::Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(5),
        });
        r
    };
    let held = common::acquire_free(&holder, &n, TTL).await;
    let task = spawn_timed_acquire(&waiter, request(Duration::from_secs(20)));
    assert!(
        eventually(Duration::from_secs(10), || async {
            queued(&holder, &n).await == 1
        })
        .await
    );
    // The waiter's refused attempts follow one another every few ms, each
    // answered. From now on every round trip takes 800 ms: each attempt
    // times out, and the lease can only come from the grant message. The
    // attempts sent just before the release reach the server after it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set_mode(testkit::Mode::Delay(Duration::from_millis(400)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    holder.release(&held).await.unwrap();
    let (_, got) = task.await.unwrap();
    let lease = got.expect("the waiter is granted the lock");
    assert_eq!(lease.ttl(), CLAIM, "not taken from the grant message");
    proxy.set_mode(testkit::Mode::Pass);
    // Held past the claim window, as the guard's first renewal would: the
    // lock must not come free by itself while the test waits.
    let lease = waiter.renew(&lease).await.expect("the first renewal");
    // Attempts still on the slow link land.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let again = waiter.try_acquire(&request(Duration::ZERO)).await;
    assert!(
        matches!(again, Ok(None)),
        "a second acquisition of the owner took over the held grant: {again:?}"
    );
    waiter.release(&lease).await.unwrap();
}

/// A waiter cancelled while a retry is still on its way to the server
/// leaves the queue after that retry ran, not before it: a leave that
/// overtook the retry (on a fresh connection, while the retry sat on a
/// slow one) was undone by it, which queued the departed waiter again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiters_leave_comes_after_its_retry_in_flight() {
    let srv = server();
    let holder = backend(&format!("{}/0?fair=true", srv.url())).await;
    let proxy = testkit::Proxy::start(srv.addr()).unwrap();
    let waiter = backend(&format!(
        "redis://127.0.0.1:{}/0?fair=true&op_timeout=5s",
        proxy.port()
    ))
    .await;
    let admin = raw(&srv.url()).await;
    let n = name("fair/leave-after-retry");
    let keys = holder.keys(&n).unwrap();
    let lease = common::acquire_free(&holder, &n, TTL).await;
    let mut request = wait_req(&n, TTL, Duration::from_secs(60));
    request.retry = Some(lock_core::wait::Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(5),
    });
    let task = spawn_timed_acquire(&waiter, request);
    assert!(
        eventually(Duration::from_secs(10), || async {
            queued(&holder, &n).await == 1
        })
        .await
    );
    // A retry goes out and is held back on the way; then the link is fast
    // again for what is sent next, and the wait is cancelled.
    proxy.set_mode(testkit::Mode::Delay(Duration::from_millis(800)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_mode(testkit::Mode::Pass);
    task.abort();
    // The held-back retry has landed, and what follows it.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        zcard(&admin, &keys.queue).await,
        0,
        "the cancelled waiter is queued again"
    );
    holder.release(&lease).await.unwrap();
}
