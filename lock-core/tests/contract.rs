//! The guard and locker contract of issue #9, on the in-process backend and
//! small wrappers around it that stand in for what a network backend does
//! (a release that hangs, a lease the backend revokes, renewals that fail).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{
    async_trait, AcquireRequest, Guarantees, HolderInfo, Lease, LockBackend, LockError, LockGuard,
    LockName, Locker, MemoryBackend, Owner, OwnerToken,
};
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

/// MemoryBackend with knobs: a release that never answers, a revocation
/// token attached to every granted lease, renewals that fail before the
/// lease's local deadline, and a count of renew calls.
#[derive(Clone, Debug, Default)]
struct Probe {
    inner: MemoryBackend,
    hang_release: Arc<AtomicBool>,
    attach_revocation: Arc<AtomicBool>,
    revocations: Arc<Mutex<Vec<CancellationToken>>>,
    fail_renew_before_deadline: Arc<AtomicBool>,
    /// This many attempts fail with a retryable error.
    transient_acquire_failures: Arc<AtomicUsize>,
    /// Attempts fail with a permanent error.
    permanent_acquire_failure: Arc<AtomicBool>,
    /// The next renewal never answers.
    hang_next_renew: Arc<AtomicBool>,
    /// Releases fail with a retryable error (the server is unreachable).
    fail_release: Arc<AtomicBool>,
    renews: Arc<AtomicUsize>,
}

#[async_trait]
impl LockBackend for Probe {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        if self.permanent_acquire_failure.load(Ordering::SeqCst) {
            return Err(LockError::permanent("probe", "permission denied"));
        }
        let failing =
            self.transient_acquire_failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(LockError::transient("probe", "connection reset"));
        }
        let lease = self.inner.try_acquire(req).await?;
        Ok(lease.map(|l| {
            if self.attach_revocation.load(Ordering::SeqCst) {
                let token = CancellationToken::new();
                self.revocations.lock().unwrap().push(token.clone());
                l.with_revocation(token)
            } else {
                l
            }
        }))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        if self.hang_next_renew.swap(false, Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.fail_renew_before_deadline.load(Ordering::SeqCst) && !lease.is_expired() {
            return Err(LockError::transient("probe", "renewal refused by the test"));
        }
        self.inner.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        if self.hang_release.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.fail_release.load(Ordering::SeqCst) {
            return Err(LockError::transient("probe", "no answer within 5s"));
        }
        self.inner.release(lease).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(name).await
    }

    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        self.inner.force_release(name).await
    }

    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
}

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

// ---- item 1: a guard is renewed for as long as it lives ----

#[tokio::test]
async fn a_guard_is_renewed_after_its_locker_is_dropped() {
    let backend = MemoryBackend::new();
    let guard = Locker::new(backend.clone())
        .lock("job")
        .ttl(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    // The Locker (and its scheduler handle) is gone here.
    sleep(Duration::from_secs(3)).await;
    assert!(guard.is_held(), "not renewed once its Locker was dropped");
    let other = Locker::new(backend.clone());
    assert!(
        other.lock("job").try_acquire().await.unwrap().is_none(),
        "another client took a lock whose guard is alive"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_restarts_when_its_runtime_dies() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    // The first acquisition starts the locker's scheduler on runtime A.
    let (rt_a, first) = {
        let locker = locker.clone();
        tokio::task::spawn_blocking(move || {
            let rt_a = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let first = rt_a.block_on(async move { locker.lock("first").acquire().await.unwrap() });
            (rt_a, first)
        })
        .await
        .unwrap()
    };
    // Taken on this runtime while A's scheduler runs: queued there.
    let second = locker
        .lock("second")
        .ttl(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    rt_a.shutdown_background();
    sleep(Duration::from_secs(3)).await;
    assert!(
        second.is_held(),
        "no renewal after the scheduler's runtime died"
    );
    second.release().await.unwrap();
    drop(first);
}

/// The same when runtime A never polled the scheduler task it was given:
/// a current-thread runtime's `block_on` returns as soon as its future is
/// ready, before any task it spawned runs, and dropping the runtime then
/// drops that task unpolled.
#[test]
fn the_scheduler_restarts_when_its_runtime_dies_before_running_it() {
    let locker = Locker::new(MemoryBackend::new());
    let rt_a = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let first = rt_a.block_on(locker.lock("first").acquire()).unwrap();
    let rt_b = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let second = rt_b
        .block_on(locker.lock("second").ttl(Duration::from_secs(1)).acquire())
        .unwrap();
    drop(rt_a);
    rt_b.block_on(async {
        sleep(Duration::from_secs(3)).await;
        assert!(
            second.is_held(),
            "no renewal after the scheduler's runtime died before running it"
        );
        second.release().await.unwrap();
    });
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_cut_short_by_its_runtime_dying_is_retried_elsewhere() {
    let backend = Probe::default();
    let locker = Locker::new(backend.clone());
    let (rt_a, first) = {
        let locker = locker.clone();
        tokio::task::spawn_blocking(move || {
            let rt_a = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let first = rt_a.block_on(async move { locker.lock("first").acquire().await.unwrap() });
            (rt_a, first)
        })
        .await
        .unwrap()
    };
    let second = locker
        .lock("second")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    // Its first renewal (at ~0.67 s) runs on runtime A and hangs there.
    backend.hang_next_renew.store(true, Ordering::SeqCst);
    while backend.hang_next_renew.load(Ordering::SeqCst) {
        sleep(Duration::from_millis(20)).await;
    }
    rt_a.shutdown_background();
    sleep(Duration::from_secs(4)).await;
    assert!(
        second.is_held(),
        "the renewal dropped with its runtime was never retried"
    );
    second.release().await.unwrap();
    drop(first);
}

// ---- item 2: the release signal fires when the release starts ----

#[tokio::test]
async fn the_release_signal_fires_before_the_release_round_trip() {
    let backend = Probe::default();
    let locker = Locker::new(backend.clone());
    backend.hang_release.store(true, Ordering::SeqCst);

    let guard = locker.lock("slow-release").acquire().await.unwrap();
    let signal = guard.lost_signal();
    // A release under a timeout: the future is dropped while its I/O hangs.
    let r = timeout(Duration::from_millis(100), guard.release()).await;
    assert!(r.is_err(), "the release was meant to hang");
    timeout(Duration::from_secs(2), signal)
        .await
        .expect("a dropped release() never fired the signal");

    let guard = locker.lock("slow-drop").acquire().await.unwrap();
    let signal = guard.lost_signal();
    drop(guard); // its background release hangs
    timeout(Duration::from_secs(2), signal)
        .await
        .expect("the drop path did not fire the signal before its I/O");
}

#[tokio::test]
async fn a_release_in_flight_has_already_fired_the_signal() {
    let backend = Probe::default();
    let locker = Locker::new(backend.clone());
    backend.hang_release.store(true, Ordering::SeqCst);
    let guard = locker.lock("watched").acquire().await.unwrap();
    let signal = guard.lost_signal();
    let release = tokio::spawn(guard.release());
    timeout(Duration::from_secs(2), signal)
        .await
        .expect("the signal waited for the release round trip");
    release.abort();
}

// ---- item 3: acquire() waits ----

#[tokio::test]
async fn acquire_without_a_wait_waits_until_it_holds_the_lock() {
    let locker = Locker::new(MemoryBackend::new());
    let holder = locker.lock("busy").acquire().await.unwrap();
    let started = Instant::now();
    let releaser = tokio::spawn(async move {
        sleep(Duration::from_millis(300)).await;
        holder.release().await.unwrap();
    });
    let guard = timeout(Duration::from_secs(10), locker.lock("busy").acquire())
        .await
        .expect("acquire() never returned")
        .expect("acquire() without .wait() must wait for the holder");
    assert!(started.elapsed() >= Duration::from_millis(250));
    releaser.await.unwrap();

    // A bounded wait times out; try_acquire never waits.
    let r = locker
        .lock("busy")
        .wait(Duration::from_millis(150))
        .acquire()
        .await;
    assert!(matches!(r, Err(LockError::Timeout { .. })), "{r:?}");
    let started = Instant::now();
    assert!(locker.lock("busy").try_acquire().await.unwrap().is_none());
    assert!(started.elapsed() < Duration::from_secs(1));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn with_lock_waits_while_someone_else_holds_the_lock_briefly() {
    // The README's scoped form, with another holder in the way.
    let locker = Locker::new(MemoryBackend::new());
    let other = Locker::from_arc(locker.backend().clone());
    let holder = other.lock("nightly-report").acquire().await.unwrap();
    tokio::spawn(async move {
        sleep(Duration::from_millis(200)).await;
        holder.release().await.unwrap();
    });
    let fence = timeout(
        Duration::from_secs(10),
        locker.with_lock("nightly-report", |fence| async move { fence.get() }),
    )
    .await
    .expect("with_lock never returned")
    .expect("with_lock failed while the lock was held briefly");
    assert_eq!(fence, 2);
}

#[tokio::test]
async fn dropping_a_waiting_acquire_cancels_it() {
    let locker = Locker::new(MemoryBackend::new());
    let holder = locker.lock("held").acquire().await.unwrap();
    let r = timeout(Duration::from_millis(200), locker.lock("held").acquire()).await;
    assert!(
        r.is_err(),
        "acquire returned while the lock was held: {r:?}"
    );
    holder.release().await.unwrap();
    let g = locker.lock("held").try_acquire().await.unwrap();
    assert!(g.is_some(), "a dropped waiter left something behind");
}

#[tokio::test]
async fn an_unbounded_acquire_retries_retryable_errors_and_returns_others() {
    let backend = Probe::default();
    let locker = Locker::new(backend.clone());
    backend
        .transient_acquire_failures
        .store(5, Ordering::SeqCst);
    let guard = timeout(Duration::from_secs(10), locker.lock("flaky").acquire())
        .await
        .expect("acquire kept waiting")
        .expect("retryable errors are retried while waiting");
    assert_eq!(backend.transient_acquire_failures.load(Ordering::SeqCst), 0);
    guard.release().await.unwrap();

    backend
        .permanent_acquire_failure
        .store(true, Ordering::SeqCst);
    let r = timeout(Duration::from_secs(10), locker.lock("flaky").acquire())
        .await
        .expect("a permanent error must end the wait");
    assert!(
        matches!(
            r,
            Err(LockError::Backend {
                retryable: false,
                ..
            })
        ),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_failed_renewal_by_hand_leaves_the_lease_held_until_its_deadline() {
    let backend = Probe::default();
    let locker = Locker::new(backend.clone());
    let guard = locker
        .lock("retry-renew")
        .ttl(Duration::from_secs(5))
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    backend
        .fail_renew_before_deadline
        .store(true, Ordering::SeqCst);
    let r = guard.renew().await;
    assert!(matches!(&r, Err(e) if e.is_retryable()), "{r:?}");
    assert!(guard.is_held(), "a retryable failure is not a loss");
    backend
        .fail_renew_before_deadline
        .store(false, Ordering::SeqCst);
    guard.renew().await.expect("tried again");
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

// ---- item 4: Lost from the backend reaches the caller ----

/// Found by the fault suite (a holder whose link was blackholed): once
/// `lost()` has fired, `release()` must say Lost, also when the release
/// itself cannot reach the server — the caller needs to know its critical
/// section may have overlapped another holder's, not that a network call
/// failed.
#[tokio::test]
async fn release_after_a_loss_says_lost_even_when_the_server_is_unreachable() {
    let backend = Probe::default();
    let guard = Locker::new(backend.clone())
        .lock("unreachable")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    backend
        .fail_renew_before_deadline
        .store(true, Ordering::SeqCst);
    backend.fail_release.store(true, Ordering::SeqCst);
    timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("renewals failing until the deadline fire lost()");
    let r = guard.release().await;
    assert!(matches!(&r, Err(e) if e.is_lost()), "{r:?}");
}

#[tokio::test]
async fn release_run_and_with_lock_report_a_takeover_as_lost() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let thief = Locker::new(backend.clone());

    let guard = locker.lock("taken").acquire().await.unwrap();
    backend.force_release(&name("taken")).await.unwrap();
    let theirs = thief.lock("taken").try_acquire().await.unwrap().unwrap();
    let r = guard.release().await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
    theirs.release().await.unwrap();

    let steal = || {
        let (backend, thief) = (backend.clone(), thief.clone());
        move |_fence| async move {
            backend.force_release(&name("taken")).await.unwrap();
            // Held by the thief when our release runs.
            std::mem::forget(thief.lock("taken").try_acquire().await.unwrap().unwrap());
            7
        }
    };
    let r = locker.lock("taken").run(steal()).await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "run: {r:?}");
    backend.force_release(&name("taken")).await.unwrap();
    let r = locker.with_lock("taken", steal()).await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "with_lock: {r:?}");
}

#[tokio::test]
async fn memory_release_after_another_holder_came_and_went_is_lost() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let other = Locker::new(backend.clone());
    let guard = locker.lock("gap").acquire().await.unwrap();
    backend.force_release(&name("gap")).await.unwrap();
    other
        .lock("gap")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let r = guard.release().await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
    // Releasing twice with nobody in between stays Ok (idempotent).
    let lease = locker.lock("gap").acquire().await.unwrap().lease();
    backend.release(&lease).await.unwrap();
    backend.release(&lease).await.unwrap();
}

// ---- item 5: one owner's acquisitions do not queue behind each other ----

#[tokio::test]
async fn an_owner_reenters_and_takes_free_names_while_another_of_its_acquisitions_waits() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let stranger = Locker::new(backend.clone());
    let owner = Owner::new();

    let b = locker.lock("b").owner(&owner).acquire().await.unwrap();
    let a_holder = stranger.lock("a").acquire().await.unwrap();
    let waiter = {
        let (locker, owner) = (locker.clone(), owner.clone());
        tokio::spawn(async move {
            locker
                .lock("a")
                .owner(&owner)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
        })
    };
    sleep(Duration::from_millis(100)).await; // the waiter is waiting for "a"

    let again = timeout(
        Duration::from_secs(2),
        locker.lock("b").owner(&owner).acquire(),
    )
    .await
    .expect("re-entry waited behind the owner's wait for another name")
    .unwrap();
    assert_eq!(again.holds(), 2);
    let c = timeout(
        Duration::from_secs(2),
        locker.lock("c").owner(&owner).acquire(),
    )
    .await
    .expect("a free name waited behind the owner's wait for another name")
    .unwrap();

    a_holder.release().await.unwrap();
    let a = waiter.await.unwrap().unwrap();
    for g in [a, c, again, b] {
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn waiting_for_the_owners_own_turn_counts_against_the_wait() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let stranger = Locker::new(backend.clone());
    let owner = Owner::new();
    let holder = stranger.lock("a").acquire().await.unwrap();
    let waiter = {
        let (locker, owner) = (locker.clone(), owner.clone());
        tokio::spawn(async move { locker.lock("a").owner(&owner).acquire().await })
    };
    sleep(Duration::from_millis(100)).await; // the first waits, unbounded
    let r = timeout(
        Duration::from_secs(5),
        locker
            .lock("a")
            .owner(&owner)
            .wait(Duration::from_millis(200))
            .acquire(),
    )
    .await
    .expect("a bounded wait waited behind the owner's unbounded one");
    assert!(matches!(r, Err(LockError::Timeout { .. })), "{r:?}");
    let r = locker.lock("a").owner(&owner).try_acquire().await.unwrap();
    assert!(r.is_none(), "try_acquire got a lock that is held");
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

#[tokio::test]
async fn two_first_acquisitions_of_one_name_by_one_owner_share_one_lease() {
    let locker = Locker::new(MemoryBackend::new());
    let owner = Owner::new();
    let (x, y) = tokio::join!(
        locker.lock("same").owner(&owner).acquire(),
        locker.lock("same").owner(&owner).acquire()
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.fence(), y.fence());
    assert_eq!(x.holds(), 2);
    x.release().await.unwrap();
    y.release().await.unwrap();
}

// ---- item 7: losses the backend knows are pushed ----

/// A guard whose lease the backend revokes: no renewal is sent after it
/// (for two renewal periods), and the release reports the loss. With
/// `watch`, `lost()` must complete at once; without it nobody looks until
/// the end, and the watchdog must see the revocation by itself.
async fn a_revoked_lease_is_not_renewed(watch: bool) {
    let backend = Probe::default();
    backend.attach_revocation.store(true, Ordering::SeqCst);
    let locker = Locker::new(backend.clone());
    let guard = locker
        .lock(format!("revoked-{watch}"))
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    assert!(guard.is_held());
    let token = backend.revocations.lock().unwrap()[0].clone();
    let renews_before = backend.renews.load(Ordering::SeqCst);
    token.cancel();
    if watch {
        timeout(Duration::from_secs(1), guard.lost())
            .await
            .expect("lost() did not complete on revocation");
        assert!(!guard.is_held());
    }
    // Past the first renewal time (a third of the TTL) and then some.
    sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        backend.renews.load(Ordering::SeqCst),
        renews_before,
        "the watchdog renewed a revoked lease"
    );
    assert!(!guard.is_held());
    let r = guard.release().await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
}

#[tokio::test]
async fn a_revoked_lease_turns_the_guard_lost_at_once() {
    a_revoked_lease_is_not_renewed(true).await;
}

#[tokio::test]
async fn a_revoked_lease_is_not_renewed_when_nobody_looks() {
    a_revoked_lease_is_not_renewed(false).await;
}

#[tokio::test]
async fn a_revoked_lease_is_not_reentered() {
    let backend = Probe::default();
    backend.attach_revocation.store(true, Ordering::SeqCst);
    let locker = Locker::new(backend.clone());
    let owner = Owner::new();
    let guard = locker.lock("r").owner(&owner).acquire().await.unwrap();
    backend.revocations.lock().unwrap()[0].cancel();
    let again = locker
        .lock("r")
        .owner(&owner)
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    // The old lease still sits on the (memory) server, so a new one cannot
    // be granted, and the revoked one must not be shared.
    assert!(matches!(again, Err(LockError::Timeout { .. })), "{again:?}");
    assert!(guard.release().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn the_watchdog_renews_at_a_third_of_the_ttl_not_before() {
    let backend = Probe::default();
    let locker = Locker::new(backend.clone());
    let guard = locker
        .lock("third")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let sent_at = guard.lease().sent_at();
    // The scheduler wakes every second while idle: none of those wake-ups
    // may renew a lease a third of whose TTL has not passed.
    tokio::time::sleep_until(sent_at + Duration::from_millis(9_900)).await;
    assert_eq!(backend.renews.load(Ordering::SeqCst), 0, "renewed early");
    tokio::time::sleep_until(sent_at + Duration::from_millis(10_100)).await;
    assert_eq!(backend.renews.load(Ordering::SeqCst), 1);
    // The next one a third of the TTL after that renewal was sent.
    tokio::time::sleep_until(sent_at + Duration::from_millis(19_900)).await;
    assert_eq!(backend.renews.load(Ordering::SeqCst), 1, "renewed early");
    tokio::time::sleep_until(sent_at + Duration::from_millis(20_100)).await;
    assert_eq!(backend.renews.load(Ordering::SeqCst), 2);
    guard.release().await.unwrap();
}

/// A lease trusted for less than two thirds of its TTL (a clock policy
/// whose margin, like a ZooKeeper ensemble's follower lag, is a large part
/// of it) is renewed at half the time it is trusted, not at a third of its
/// TTL, so that a failed renewal has as long again for its retries.
#[tokio::test(start_paused = true)]
async fn the_watchdog_renews_at_half_the_trusted_time_when_that_comes_first() {
    let backend = Probe::default();
    let policy = lock_core::ClockPolicy {
        drift: 0.01,
        margin: Duration::from_secs(15),
    };
    let locker = Locker::new(backend.clone())
        .with_clock_policy(policy)
        .unwrap();
    let guard = locker
        .lock("half")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let sent_at = guard.lease().sent_at();
    // Trusted for 29.7 - 15 = 14.7 s: the renewal at 7.35 s, before the
    // third of the TTL (10 s).
    let half = (guard.lease().deadline() - sent_at) / 2;
    assert_eq!(half, Duration::from_millis(7_350));
    tokio::time::sleep_until(sent_at + half - Duration::from_millis(100)).await;
    assert_eq!(backend.renews.load(Ordering::SeqCst), 0, "renewed early");
    tokio::time::sleep_until(sent_at + half + Duration::from_millis(100)).await;
    assert_eq!(backend.renews.load(Ordering::SeqCst), 1);
    guard.release().await.unwrap();
}

/// A guard of 3 s over a probe whose next renewal never answers, and the
/// guard's first deadline.
async fn guard_whose_next_renewal_hangs(name: &str) -> (Probe, LockGuard, Instant) {
    let backend = Probe::default();
    let guard = Locker::new(backend.clone())
        .lock(name)
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let first_deadline = guard.lease().deadline();
    backend.hang_next_renew.store(true, Ordering::SeqCst);
    (backend, guard, first_deadline)
}

/// A renewal by hand rescues a lease whose watchdog renewal hangs: the
/// watchdog goes on from the deadline the hand renewal published instead
/// of declaring the lease lost at the old one.
#[tokio::test(start_paused = true)]
async fn a_renewal_by_hand_moves_the_deadline_the_watchdog_retries_to() {
    // The watchdog's renewal at a third of the TTL never answers.
    let (backend, guard, first_deadline) = guard_whose_next_renewal_hangs("rescued").await;
    sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        backend.renews.load(Ordering::SeqCst),
        1,
        "the watchdog tried"
    );
    guard.renew().await.expect("the renewal by hand answers");
    assert!(guard.lease().deadline() > first_deadline);
    tokio::time::sleep_until(first_deadline + Duration::from_millis(200)).await;
    assert!(
        guard.is_held(),
        "lost at the deadline the renewal by hand had moved"
    );
    // And the watchdog keeps it from then on.
    sleep(Duration::from_secs(10)).await;
    assert!(guard.is_held(), "not renewed after the rescue");
    guard.release().await.unwrap();
}

/// A renewal by hand that never answers does not declare lost a lease the
/// watchdog renewed meanwhile: it gives up at the deadline it started
/// with, which is no longer the lease's.
#[tokio::test(start_paused = true)]
async fn a_renewal_by_hand_timing_out_leaves_a_lease_the_watchdog_renewed() {
    // The renewal by hand is the one that never answers.
    let (_backend, guard, first_deadline) = guard_whose_next_renewal_hangs("slow-hand").await;
    let r = guard.renew().await;
    assert!(
        r.as_ref().is_err_and(|e| !e.is_lost() && e.is_retryable()),
        "a renewal by hand that got no answer: {r:?}"
    );
    assert!(
        Instant::now() >= first_deadline,
        "it waited its deadline out"
    );
    assert!(
        guard.lease().deadline() > first_deadline,
        "the watchdog renewed"
    );
    assert!(
        guard.is_held(),
        "declared lost although the watchdog renewed it"
    );
    sleep(Duration::from_secs(10)).await;
    assert!(guard.is_held(), "the watchdog stopped renewing");
    guard.release().await.unwrap();
}

/// A detached attempt whose win was sent to a waiter that is dropped before
/// reading it is undone: the lock is not left held by nobody.
#[tokio::test(start_paused = true)]
async fn a_detached_win_sent_to_a_dropped_waiter_is_undone() {
    let backend = MemoryBackend::new();
    let req = AcquireRequest::new(
        name("detached"),
        OwnerToken::random(),
        Duration::from_secs(30),
        Duration::ZERO,
    )
    .unwrap();
    let attempt = {
        let (backend, req) = (backend.clone(), req.clone());
        async move {
            sleep(Duration::from_millis(100)).await;
            backend.try_acquire(&req).await
        }
    };
    let mut waiter = Box::pin(lock_core::wait::detached(
        attempt,
        lock_core::wait::release_if_won(backend.clone()),
    ));
    assert!(futures::poll!(waiter.as_mut()).is_pending());
    // The attempt wins and sends its lease; the waiter is not polled again.
    sleep(Duration::from_millis(200)).await;
    drop(waiter);
    sleep(Duration::from_millis(10)).await;
    assert!(
        backend.inspect(&req.name).await.unwrap().is_none(),
        "the win nobody read still holds the lock"
    );
}

// ---- item 14 ----

#[tokio::test(start_paused = true)]
async fn a_renewal_that_lands_after_the_deadline_does_not_revive_the_guard() {
    // Renewals fail until the local deadline; the one sent at the deadline
    // would succeed (the server keeps the lease a little longer).
    let backend = Probe::default();
    backend
        .fail_renew_before_deadline
        .store(true, Ordering::SeqCst);
    let locker = Locker::new(backend.clone());
    let guard = locker
        .lock("late-renewal")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let deadline = guard.lease().deadline();
    tokio::time::sleep_until(deadline).await;
    assert!(!guard.is_held());
    tokio::time::sleep_until(deadline + Duration::from_millis(50)).await;
    assert!(!guard.is_held(), "is_held() turned true again after false");
    timeout(Duration::from_millis(10), guard.lost())
        .await
        .expect("lost() must have completed");
}

#[tokio::test]
async fn a_non_last_reentrant_release_after_a_loss_says_lost() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let owner = Owner::new();
    let first = locker
        .lock("re")
        .owner(&owner)
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let second = locker.lock("re").owner(&owner).acquire().await.unwrap();
    backend.force_release(&name("re")).await.unwrap();
    timeout(Duration::from_secs(10), first.lost())
        .await
        .expect("the watchdog saw the loss");
    let r = first.release().await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
    let r = second.release().await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
}

#[tokio::test]
async fn a_reentrant_acquire_with_auto_renew_starts_renewals() {
    let locker = Locker::new(MemoryBackend::new());
    let owner = Owner::new();
    let manual = locker
        .lock("mixed")
        .owner(&owner)
        .ttl(Duration::from_secs(1))
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let auto = locker.lock("mixed").owner(&owner).acquire().await.unwrap();
    sleep(Duration::from_millis(2500)).await;
    assert!(
        auto.is_held(),
        "the re-entrant auto_renew(true) was ignored"
    );
    auto.release().await.unwrap();
    manual.release().await.unwrap();
}
