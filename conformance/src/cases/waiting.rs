use std::time::Duration;

use lock_core::{AcquireRequest, LockError, OwnerToken};
use testkit::Mode;
use tokio::time::Instant;

use super::raw_try;
use crate::fixture::Ctx;

/// A waiter gets the lock when the holder releases, not before, and
/// promptly.
pub(crate) async fn acquire_waits_until_holder_releases(ctx: &Ctx<'_>) {
    let name = ctx.name("handoff");
    let a = ctx.locker().await;
    let b = ctx.locker().await;
    let guard = a.lock(name.as_str()).acquire().await.expect("acquire");
    let first_fence = guard.fence();
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            let g = b
                .lock(name.as_str())
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .expect("waiter acquires after release");
            (Instant::now(), g)
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released_at = Instant::now();
    guard.release().await.expect("release");
    let (got_at, g) = waiter.await.expect("waiter task");
    assert!(
        got_at >= released_at,
        "the waiter got the lock before the release"
    );
    assert!(
        g.fence() > first_fence,
        "fencing token did not increase on hand-off"
    );
    let handoff = got_at - released_at;
    assert!(
        handoff < Duration::from_secs(3),
        "hand-off took {handoff:?}"
    );
    g.release().await.expect("release");
}

/// A waiter whose holder never releases gives up at its deadline with
/// `Timeout`: not much before, not much after.
pub(crate) async fn acquire_times_out_at_the_deadline(ctx: &Ctx<'_>) {
    let name = ctx.name("timeout");
    let a = ctx.locker().await;
    let b = ctx.locker().await;
    let guard = a.lock(name.as_str()).acquire().await.expect("acquire");
    let wait = Duration::from_millis(700);
    let started = Instant::now();
    let r = b.lock(name.as_str()).wait(wait).acquire().await;
    let took = started.elapsed();
    assert!(
        matches!(r, Err(LockError::Timeout { waited, .. }) if waited == wait),
        "expected Timeout, got {r:?}"
    );
    assert!(
        took >= wait,
        "gave up after {took:?}, before the {wait:?} wait"
    );
    assert!(
        took < wait + ctx.slack(wait) * 4,
        "gave up late, after {took:?}"
    );
    assert!(guard.is_held(), "the holder lost the lock to a waiter");
    guard.release().await.expect("release");
}

/// Cancelling a waiting acquire leaves nothing behind, even when it is cut
/// off while an attempt is on its way to the server: once the holder
/// releases, the next acquirer gets the lock within a second, far sooner
/// than a leftover grant or queue entry would go away by itself (the 30 s
/// TTL, a queue entry's or session's life).
pub(crate) async fn cancelled_waiter_leaves_nothing_behind(ctx: &Ctx<'_>) {
    let name = ctx.name("cancel");
    let a = ctx.locker().await;
    let b = ctx.locker().await;
    let c = ctx.locker().await;
    let guard = a.lock(name.as_str()).acquire().await.expect("acquire");
    let cancelled = tokio::time::timeout(
        Duration::from_millis(500),
        b.lock(name.as_str())
            .wait(Duration::from_secs(30))
            .acquire(),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the waiter should still be waiting when cancelled"
    );
    // Also cancel waiters that run in their own tasks, by aborting them,
    // at moments spread over their retries, so that some are cut off
    // between attempts and some during one.
    let waiters: Vec<_> = (0..6)
        .map(|_| {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move {
                b.lock(name.as_str())
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, task) in waiters.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(7 * i as u64)).await;
        task.abort();
        assert!(task.await.is_err_and(|e| e.is_cancelled()));
    }

    guard.release().await.expect("release");
    let next = c
        .lock(name.as_str())
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .expect("a cancelled waiter kept the lock or its place in line");
    next.release().await.expect("release");
}

/// `acquire()` with no `.wait(..)` waits until the holder releases (like
/// `Mutex::lock`, Redisson `lock()`, redis-py `acquire()`), and so does
/// `with_lock`.
pub(crate) async fn acquire_without_a_wait_waits_for_the_holder(ctx: &Ctx<'_>) {
    let name = ctx.name("default-wait");
    let a = ctx.locker().await;
    let b = ctx.locker().await;
    let guard = a.lock(name.as_str()).acquire().await.expect("acquire");
    let waiter = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.lock(name.as_str()).acquire().await.map(|g| g.fence()) }
    });
    let scoped = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move {
            b.with_lock(name.as_str(), |fence| async move { fence })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !waiter.is_finished(),
        "acquire() without a wait returned while the lock was held"
    );
    assert!(!scoped.is_finished(), "with_lock did not wait");
    let first = guard.fence();
    guard.release().await.expect("release");
    let fences = tokio::time::timeout(Duration::from_secs(10), async {
        (waiter.await, scoped.await)
    })
    .await
    .expect("the waiters did not get the lock after the release");
    let (w, s) = fences;
    let w = w.expect("task").expect("acquire() after the release");
    let s = s.expect("task").expect("with_lock after the release");
    assert!(
        w > first && s > first && w != s,
        "tokens {first:?} {w:?} {s:?}"
    );
}

/// A backend that declares a wake-up mechanism (pub/sub, watch, NOTIFY, an
/// in-process notification) hands a released lock to a waiter far below
/// the fallback polling floor: the waiter's polling between attempts is set
/// to a second (every backend's fallback follows the request's backoff),
/// and the median hand-off of several rounds stays under 40 ms, where
/// polling would take hundreds of milliseconds.
pub(crate) async fn wake_up_hands_off_below_the_polling_floor(ctx: &Ctx<'_>) {
    const ROUNDS: usize = 15;
    let name = ctx.name("wake-up");
    let a = ctx.locker().await;
    let b = ctx.locker().await.with_retry(lock_core::wait::Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(1),
    });
    let mut handoffs = Vec::new();
    for _ in 0..ROUNDS {
        let guard = a.lock(name.as_str()).acquire().await.expect("acquire");
        let waiter = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move {
                let g = b
                    .lock(name.as_str())
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .expect("waiter acquires");
                (Instant::now(), g)
            }
        });
        // The waiter's first attempt was refused and it waits.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let released_at = Instant::now();
        guard.release().await.expect("release");
        let (got_at, g) = waiter.await.expect("waiter task");
        handoffs.push(got_at.saturating_duration_since(released_at));
        g.release().await.expect("release");
    }
    handoffs.sort();
    let median = handoffs[ROUNDS / 2];
    assert!(
        median < Duration::from_millis(40),
        "{:?} declares {:?} wake-ups, but the median hand-off was {median:?} \
         (all: {handoffs:?}): that is the polling fallback",
        ctx.guarantees().backend,
        ctx.guarantees().wait
    );
}

/// Every call answers in bounded time when the service stops answering
/// (the network cut without a word, as a partition does): a waiting
/// acquire within its wait plus one `op_timeout` (an attempt in flight when
/// the wait ends gets one `op_timeout` to answer), and `try_acquire`,
/// `renew` and `release` within one `op_timeout`. None of them claims what
/// it could not learn: the acquisitions do not get the lock, and renew and
/// release fail with a retryable error.
///
/// Where the fixture has no network to cut (in-process and embedded
/// backends, cluster clients that would bypass a proxy), the same calls on
/// a healthy client are held to the same bounds.
pub(crate) async fn calls_answer_in_time_when_the_service_is_cut_off(ctx: &Ctx<'_>) {
    let name = ctx.name("cut-off");
    let mine = ctx.name("cut-off-mine");
    let ttl = ctx.ttl(Duration::from_secs(30));
    // Longer than a driver takes to notice the dead connection by itself
    // (the ZooKeeper client: about 4.5 s at a 30 s session), so that what
    // a backend does after that notice is timed too.
    let op_timeout = Duration::from_secs(5);
    let wait = Duration::from_millis(500);
    // Scheduling on a loaded two-core machine.
    let slack = Duration::from_secs(1);
    let holder = ctx.client().await;
    let theirs = raw_try(&holder, &name, ttl)
        .await
        .expect("the name is free");
    let (client, link) = ctx.client_through_proxy_if_any(op_timeout).await;
    // Connections, sessions and scripts ready before the cut, so that what
    // is timed is the calls, not a first connect.
    let held = raw_try(&client, &mine, ttl).await.expect("free");
    assert!(raw_try(&client, &name, ttl).await.is_none(), "held");
    if let Some(link) = &link {
        link.set_mode(Mode::Blackhole);
    }

    let req =
        |wait| AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, wait).expect("request");
    let (waiting, trying) = (req(wait), req(Duration::ZERO));
    // All at once: each is held to its own bound, and the case takes one
    // op_timeout, not four.
    let (waited, tried, renewed, released) = tokio::join!(
        timed(client.acquire(&waiting)),
        timed(client.try_acquire(&trying)),
        timed(async { client.renew(&held).await.map(drop) }),
        timed(client.release(&held)),
    );
    for (what, (r, took), bound) in [
        ("acquire", waited, wait + op_timeout),
        ("try_acquire", tried, op_timeout),
    ] {
        assert!(!matches!(r, Ok(Some(_))), "{what} got a held lock: {r:?}");
        assert!(
            took <= bound + slack,
            "{what} with a {wait:?} wait and a {op_timeout:?} op_timeout answered after {took:?}: {r:?}"
        );
    }
    for (what, (r, took)) in [("renew", renewed), ("release", released)] {
        assert!(
            took <= op_timeout + slack,
            "{what} with a {op_timeout:?} op_timeout answered after {took:?}: {r:?}"
        );
        if link.is_some() {
            assert!(
                r.as_ref().is_err_and(LockError::is_retryable),
                "{what} on a cut link: expected a retryable error, got {r:?}"
            );
        }
    }
    drop(link);
    holder.release(&theirs).await.expect("release");
}

/// A `try_acquire` that chains requests (a session or claim, a queue read,
/// the removal of a refused claim) answers within one `op_timeout` as a
/// whole on a slow link where each request answers well within it: the
/// timeout bounds the call, not each request. So does a waiting `acquire`
/// within its wait plus one `op_timeout`, its attempt started before the
/// wait ended included. The name is held, so the calls get no lock, and
/// whatever they left on the server goes by itself: once the holder
/// releases, another client takes the name.
///
/// Where the fixture has no network to slow down, the same call on a
/// healthy client is held to the same bounds.
pub(crate) async fn acquisitions_on_a_slow_link_answer_within_one_op_timeout(ctx: &Ctx<'_>) {
    // A name each: a refused attempt's cleanup may keep its name busy in
    // the client for a while, which must not be what ends the other call.
    let names = [ctx.name("slow-link-try"), ctx.name("slow-link-wait")];
    let ttl = ctx.ttl(Duration::from_secs(30));
    let op_timeout = Duration::from_secs(3);
    // Each round trip: 1.4 s, so two fit in the op_timeout and three not.
    let delay = Duration::from_millis(700);
    // Timers and scheduling on a loaded machine; a call that chains one
    // request too many is late by a whole round trip.
    let slack = Duration::from_millis(300);
    let holder = ctx.client().await;
    let (client, link) = ctx.client_through_proxy_if_any(op_timeout).await;
    // Connections and sessions of this TTL ready while the link is fast.
    let warm = raw_try(&client, &ctx.name("slow-link-warm"), ttl)
        .await
        .expect("free");
    client.release(&warm).await.expect("release");
    let mut held = Vec::new();
    for name in &names {
        held.push(raw_try(&holder, name, ttl).await.expect("free"));
    }
    if let Some(link) = &link {
        link.set_mode(Mode::Delay(delay));
    }
    let request = |name: &lock_core::LockName, wait| {
        AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, wait).expect("request")
    };
    let wait = Duration::from_millis(500);
    let tried = timed(client.try_acquire(&request(&names[0], Duration::ZERO))).await;
    let waited = timed(client.acquire(&request(&names[1], wait))).await;
    if let Some(link) = &link {
        link.set_mode(Mode::Pass);
    }
    for (what, (r, took), bound) in [
        ("try_acquire", tried, op_timeout),
        ("acquire", waited, wait + op_timeout),
    ] {
        assert!(
            !matches!(r, Ok(Some(_))),
            "{what}: a held lock was granted: {r:?}"
        );
        assert!(
            took <= bound + slack,
            "{what} with a {wait:?} wait (acquire) and a {op_timeout:?} op_timeout answered \
             after {took:?}: {r:?}"
        );
    }
    for lease in held {
        holder.release(&lease).await.expect("release");
    }
    for name in &names {
        let started = Instant::now();
        loop {
            if let Some(next) = raw_try(&holder, name, ttl).await {
                holder.release(&next).await.expect("release");
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "the slow client's refused attempt kept {name} taken"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    drop(link);
}

/// What `f` returned and how long it took.
async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let r = f.await;
    (r, started.elapsed())
}
