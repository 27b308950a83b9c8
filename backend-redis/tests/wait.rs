//! Waiting: release messages wake waiters at once, cancelled waiters leave
//! no subscription behind, and one pub/sub connection serves all waiters of
//! a client; a cancelled retry is cleaned up before its owner acquires again.

mod common;

use std::time::Duration;

use common::{
    acquire_free, backend, eventually, locker_on, name, numsub, pubsub_clients, raw, server,
    spawn_timed_acquire, wait_req,
};
use lock_core::{AcquireRequest, LockBackend, LockGuard, Locker, OwnerToken};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

/// A task waiting up to 30 s for `lock` through `waiter`.
fn spawn_waiting(waiter: &Locker, lock: &'static str) -> JoinHandle<lock_core::Result<LockGuard>> {
    let waiter = waiter.clone();
    tokio::spawn(async move {
        waiter
            .lock(lock)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    })
}

/// The release channels polylock subscribed to.
async fn polylock_channels(admin: &redis::aio::MultiplexedConnection) -> Vec<String> {
    let mut admin = admin.clone();
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("__polylock__:*")
        .query_async(&mut admin)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_a_waiter_at_once() {
    let srv = server();
    let holder = backend(&srv.url()).await;
    let waiter = backend(&srv.url()).await;
    let n = name("wait/handoff");
    let mut handoffs = Vec::new();
    for _ in 0..7 {
        let lease = acquire_free(&holder, &n, Duration::from_secs(30)).await;
        let task = spawn_timed_acquire(
            &waiter,
            wait_req(&n, Duration::from_secs(30), Duration::from_secs(20)),
        );
        // Long enough for the fallback poll to back off to its maximum:
        // only the message can make the hand-off fast.
        sleep(Duration::from_millis(700)).await;
        let released = Instant::now();
        holder.release(&lease).await.unwrap();
        let (got, lease) = task.await.unwrap();
        handoffs.push(got - released);
        waiter.release(&lease.unwrap()).await.unwrap();
    }
    handoffs.sort();
    let median = handoffs[handoffs.len() / 2];
    assert!(median < Duration::from_millis(30), "hand-offs {handoffs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_subscription() {
    let srv = server();
    let holder = locker_on(&srv.url()).await;
    let waiter = locker_on(&srv.url()).await;
    let admin = raw(&srv.url()).await;
    let channel = "__polylock__:released:{wait/cancel}";
    let guard = holder.lock("wait/cancel").acquire().await.unwrap();

    // Two waiters of one client share one subscription.
    let w1 = spawn_waiting(&waiter, "wait/cancel");
    let w2 = spawn_waiting(&waiter, "wait/cancel");
    assert!(
        eventually(Duration::from_secs(3), || async {
            numsub(&admin, channel).await == 1
        })
        .await
    );
    sleep(Duration::from_millis(100)).await;
    assert_eq!(numsub(&admin, channel).await, 1);
    assert_eq!(pubsub_clients(&admin).await, 1);

    w1.abort();
    assert!(w1.await.unwrap_err().is_cancelled());
    sleep(Duration::from_millis(200)).await;
    assert_eq!(
        numsub(&admin, channel).await,
        1,
        "the other waiter still waits"
    );
    w2.abort();
    assert!(w2.await.unwrap_err().is_cancelled());
    assert!(
        eventually(Duration::from_secs(3), || async {
            numsub(&admin, channel).await == 0
        })
        .await,
        "a cancelled waiter left its subscription behind"
    );

    // Also a wait dropped by a timeout around it.
    let r = timeout(
        Duration::from_millis(400),
        waiter
            .lock("wait/cancel")
            .wait(Duration::from_secs(30))
            .acquire(),
    )
    .await;
    assert!(r.is_err());
    assert!(
        eventually(Duration::from_secs(3), || async {
            numsub(&admin, channel).await == 0
        })
        .await,
        "a timed-out waiter left its subscription behind"
    );
    guard.release().await.unwrap();
    let g = waiter
        .lock("wait/cancel")
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_one_pubsub_connection() {
    let srv = server();
    let holder = locker_on(&srv.url()).await;
    let waiter = locker_on(&srv.url()).await;
    let admin = raw(&srv.url()).await;
    let mut guards = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let n = format!("wait/many/{i}");
        guards.push(holder.lock(&n).acquire().await.unwrap());
        let w = waiter.clone();
        tasks.push(tokio::spawn(async move {
            let g = w
                .lock(&n)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            g.release().await.unwrap();
        }));
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            let mut admin = admin.clone();
            let n: i64 = redis::cmd("PUBSUB")
                .arg("NUMPAT")
                .query_async(&mut admin)
                .await
                .unwrap();
            n == 0 && polylock_channels(&admin).await.len() == 20
        })
        .await
    );
    assert_eq!(
        pubsub_clients(&admin).await,
        1,
        "one pub/sub connection per client"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    for t in tasks {
        timeout(Duration::from_secs(5), t).await.unwrap().unwrap();
    }
    assert!(
        eventually(Duration::from_secs(3), || async {
            polylock_channels(&admin).await.is_empty()
        })
        .await,
        "channels stayed subscribed after their waiters were done"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_does_not_subscribe() {
    let srv = server();
    let locker = locker_on(&srv.url()).await;
    let admin = raw(&srv.url()).await;
    let g = locker
        .lock("wait/uncontended")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert_eq!(pubsub_clients(&admin).await, 0);
    g.release().await.unwrap();
}

/// A wait cancelled while its retry is on the wire (a slow link to the
/// waiter) leaves no lock behind: the retry still reaches the server and
/// takes the freed lock, and its own task, seeing nobody wait for the
/// answer, releases it. Without that, the lock would belong to nobody
/// until its 30 s TTL. In fair mode the release hands the lock to the
/// waiter itself, and the waiter's leave (on the same slow link) frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cancelled_mid_retry_leaves_no_lock() {
    for mode in ["", "?fair=true", "?format=redisson"] {
        cancel_mid_retry(mode).await;
    }
}

/// A waiter through a slow link (`LINK` each way) and a holder with a
/// direct connection, on one server.
struct SlowWaiter {
    _srv: testkit::RedisServer,
    proxy: testkit::Proxy,
    holder: std::sync::Arc<backend_redis::RedisBackend>,
    waiter: std::sync::Arc<backend_redis::RedisBackend>,
}

const LINK: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_secs(30);

impl SlowWaiter {
    async fn start(query: &str) -> SlowWaiter {
        let srv = server();
        let proxy = testkit::Proxy::start(srv.addr()).expect("proxy");
        let holder = backend(&format!("{}{query}", srv.url())).await;
        let waiter = backend(&format!("redis://{}{query}", proxy.addr())).await;
        SlowWaiter {
            _srv: srv,
            proxy,
            holder,
            waiter,
        }
    }

    /// The holder takes `req`'s lock, the waiter waits for it with `req`,
    /// the holder releases, and the wait is cancelled while the waiter's
    /// retry is on the wire. `false` when a timer retry won before the
    /// cancel (released again): not the case under test.
    async fn cancel_a_retry_on_the_wire(&self, req: AcquireRequest) -> bool {
        use testkit::Mode;
        self.proxy.set_mode(Mode::Pass);
        let lease = acquire_free(&self.holder, &req.name, TTL).await;
        let task = tokio::spawn({
            let waiter = self.waiter.clone();
            async move { waiter.acquire(&req).await }
        });
        sleep(Duration::from_millis(300)).await;
        self.proxy.set_mode(Mode::Delay(LINK));
        sleep(LINK * 2).await;
        self.holder.release(&lease).await.unwrap();
        // The release message reaches the waiter after one link delay; its
        // retry is then on the wire for another.
        sleep(LINK + LINK / 2).await;
        if task.is_finished() {
            let won = task.await.unwrap().unwrap().expect("a lease");
            self.waiter.release(&won).await.unwrap();
            return false;
        }
        task.abort();
        assert!(task.await.is_err_and(|e| e.is_cancelled()));
        true
    }
}

async fn cancel_mid_retry(query: &str) {
    let s = SlowWaiter::start(query).await;
    let mut cut_mid_retry = 0;
    // A round whose timer retry won, or whose cancel came after the retry's
    // answer (a loaded machine shifts both), proves nothing; more rounds
    // are run until one did cut a retry on the wire.
    for round in 0..12 {
        if round >= 4 && cut_mid_retry > 0 {
            break;
        }
        let n = name(&format!("cut-{round}"));
        if !s.cancel_a_retry_on_the_wire(wait_req(&n, TTL, TTL)).await {
            continue;
        }
        if eventually(LINK * 4, || async {
            s.holder.inspect(&n).await.unwrap().is_some()
        })
        .await
        {
            cut_mid_retry += 1;
        }
        assert!(
            eventually(Duration::from_secs(5), || async {
                s.holder.inspect(&n).await.unwrap().is_none()
            })
            .await,
            "{query:?} round {round}: the cancelled waiter's retry took the lock and nobody released it"
        );
    }
    assert!(
        cut_mid_retry > 0,
        "{query:?}: no round cancelled a retry on the wire; the test proved nothing"
    );
}

/// An explicit owner that acquires the name again right after cancelling a
/// wait whose retry is on the wire gets a lock of its own that stays held.
/// The retry's cleanup (a release behind it, or the undo of its detached
/// task) must run before that next attempt: sent after it, it frees the
/// lock the next attempt took over as the retry's unanswered grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_next_acquire_waits_for_its_cancelled_retrys_cleanup() {
    for mode in ["", "?fair=true", "?format=redisson"] {
        next_acquire_after_cancelled_retry(mode).await;
    }
}

async fn next_acquire_after_cancelled_retry(query: &str) {
    let s = SlowWaiter::start(query).await;
    let mut cut_mid_retry = 0;
    for round in 0..3 {
        let n = name(&format!("again-{round}"));
        let owner = OwnerToken::random();
        let waiting = AcquireRequest::new(n.clone(), owner, TTL, TTL).unwrap();
        if !s.cancel_a_retry_on_the_wire(waiting).await {
            continue;
        }
        cut_mid_retry += 1;
        let again = AcquireRequest::new(n.clone(), owner, TTL, Duration::ZERO).unwrap();
        let mine = s
            .waiter
            .try_acquire(&again)
            .await
            .unwrap()
            .unwrap_or_else(|| {
                panic!("{query:?} round {round}: the lock was not freed for the owner")
            });
        // Whatever the cancelled retry left to run has run by now.
        sleep(LINK * 4).await;
        let seen = s.holder.inspect(&n).await.unwrap();
        assert_eq!(
            seen.as_ref().and_then(|h| h.fence),
            Some(mine.fence()),
            "{query:?} round {round}: the owner's new lock is gone (holder {seen:?}); the cancelled retry's cleanup freed it"
        );
        s.proxy.set_mode(testkit::Mode::Pass);
        s.waiter.release(&mine).await.unwrap();
    }
    assert!(
        cut_mid_retry > 0,
        "{query:?}: no round cancelled a retry on the wire; the test proved nothing"
    );
}

/// The pacing a caller asks for (`Locker::with_retry`) paces a waiter's
/// fallback polls: over the same wait for a lock that stays held, a fast
/// pacing runs many more attempts on the server than a slow one. (Release
/// messages still wake a waiter at once: see the tests above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_fallback_polls_follow_the_requested_pacing() {
    for query in ["", "?fair=true", "?format=redisson"] {
        let srv = server();
        let url = format!("{}{query}", srv.url());
        let holder = backend(&url).await;
        let counter = raw(&srv.url()).await;
        let n = name("paced");
        let lease = acquire_free(&holder, &n, Duration::from_secs(60)).await;
        let mut attempts = Vec::new();
        for pace in [Duration::from_millis(20), Duration::from_millis(500)] {
            let locker = Locker::from_arc(backend(&url).await)
                .with_retry(lock_core::wait::Backoff::new(pace, pace).unwrap());
            let before = common::script_calls(&counter).await;
            let r = locker
                .lock(n.as_str())
                .wait(Duration::from_millis(1500))
                .acquire()
                .await;
            assert!(r.is_err(), "{query:?}: acquired a held lock");
            attempts.push(common::script_calls(&counter).await - before);
        }
        let (fast, slow) = (attempts[0], attempts[1]);
        assert!(
            fast >= 20 && fast > slow * 4,
            "{query:?}: {fast} attempts at a 20 ms pacing, {slow} at 500 ms"
        );
        holder.release(&lease).await.unwrap();
    }
}

/// When `locker` got `n` (waiting up to 20 s), released at once after.
async fn taken_at(locker: Locker, n: lock_core::LockName) -> lock_core::Result<Instant> {
    let g = locker
        .lock(n.as_str())
        .wait(Duration::from_secs(20))
        .acquire()
        .await?;
    let at = Instant::now();
    g.release().await?;
    Ok(at)
}

/// In fair mode a waiter whose caller asked for a slow pacing still keeps
/// its place in the queue: its entry lives a few seconds past its last
/// attempt, so the pacing is capped at the fair mode's own. A waiter that
/// queued later must not be served first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_pacing_keeps_a_fair_waiters_place() {
    let srv = server();
    let url = format!("{}?fair=true", srv.url());
    let holder = backend(&url).await;
    let n = name("fair-slow-pacing");
    let lease = acquire_free(&holder, &n, Duration::from_secs(60)).await;
    let slow = Locker::from_arc(backend(&url).await).with_retry(
        lock_core::wait::Backoff::new(Duration::from_secs(5), Duration::from_secs(5)).unwrap(),
    );
    let first = tokio::spawn(taken_at(slow, n.clone()));
    sleep(Duration::from_millis(300)).await;
    let later = Locker::from_arc(backend(&url).await);
    let second = tokio::spawn(taken_at(later, n.clone()));
    // Past the slow waiter's queue entry life (2 s) without an attempt of
    // its own at a 5 s pacing.
    sleep(Duration::from_secs(4)).await;
    holder.release(&lease).await.unwrap();
    let first_at = first
        .await
        .unwrap()
        .expect("the first waiter gets the lock");
    let second_at = second
        .await
        .unwrap()
        .expect("the second waiter gets the lock");
    assert!(
        first_at < second_at,
        "the waiter that queued later was served first"
    );
}
