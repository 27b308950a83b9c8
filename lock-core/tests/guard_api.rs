//! Guard methods of issue #9: renewal by hand, and a run that keeps the
//! closure's output when the loss is only reported by the release.

use std::time::Duration;

use lock_core::{ClockPolicy, LockBackend, LockError, LockName, Locker, MemoryBackend};
use tokio::time::sleep;

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

#[tokio::test]
async fn a_lease_without_auto_renew_can_be_renewed_by_hand() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let guard = locker
        .lock("manual")
        .ttl(Duration::from_secs(2))
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    for _ in 0..5 {
        sleep(Duration::from_millis(500)).await;
        guard.renew().await.expect("renew by hand");
    }
    // 2.5 s after the acquire, past the first TTL.
    assert!(guard.is_held());
    assert!(locker.lock("manual").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
}

#[tokio::test]
async fn renewing_by_hand_after_the_deadline_is_lost_and_stays_lost() {
    let locker = Locker::new(MemoryBackend::new())
        .with_clock_policy(ClockPolicy {
            // The local deadline at half the TTL, while the server holds the
            // lease for the whole TTL: a renewal would still succeed there.
            drift: 0.5,
            margin: Duration::ZERO,
        })
        .unwrap();
    let guard = locker
        .lock("late")
        .ttl(Duration::from_secs(2))
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(Duration::from_millis(1300)).await;
    assert!(!guard.is_held());
    let r = guard.renew().await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
    assert!(!guard.is_held(), "is_held() turned true again");
}

#[tokio::test]
async fn run_reporting_keeps_the_output_when_the_loss_is_reported_late() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let thief = Locker::new(backend.clone());
    let b = backend.clone();
    let outcome = locker
        .lock("late-loss")
        .run_reporting(|_fence| async move {
            b.force_release(&name("late-loss")).await.unwrap();
            let g = thief
                .lock("late-loss")
                .try_acquire()
                .await
                .unwrap()
                .unwrap();
            std::mem::forget(g);
            "the work's result"
        })
        .await
        .expect("the closure ran to the end");
    assert_eq!(outcome.output, "the work's result");
    assert!(
        matches!(outcome.release, Err(LockError::Lost { .. })),
        "{:?}",
        outcome.release
    );
    let r = outcome.into_result();
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");

    // A clean holding reports the output and Ok.
    backend.force_release(&name("late-loss")).await.unwrap();
    let outcome = locker
        .lock("late-loss")
        .run_reporting(|fence| async move { fence.get() })
        .await
        .unwrap();
    assert!(outcome.release.is_ok());
    assert_eq!(outcome.into_result().unwrap(), 3);
}

#[tokio::test]
async fn a_clock_policy_or_ttl_without_renewal_room_is_refused_before_any_io() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    for policy in [
        ClockPolicy {
            drift: f64::NAN,
            margin: Duration::ZERO,
        },
        ClockPolicy {
            drift: 1.0,
            margin: Duration::ZERO,
        },
        ClockPolicy {
            drift: -0.1,
            margin: Duration::ZERO,
        },
        ClockPolicy {
            drift: 0.01,
            margin: Duration::MAX,
        },
        // Trusted for 0.3 of the TTL: less than a third of it.
        ClockPolicy {
            drift: 0.7,
            margin: Duration::ZERO,
        },
        // Eats all of the default 30 s TTL.
        ClockPolicy {
            drift: 0.0,
            margin: Duration::from_secs(30),
        },
    ] {
        let r = locker.clone().with_clock_policy(policy);
        assert!(r.is_err(), "{policy:?} was accepted");
    }
    // The default policy: a 3 ms lease would be trusted for under a third
    // of it; 4 ms leaves room.
    for ms in [1, 2, 3] {
        let ttl = Duration::from_millis(ms);
        let r = locker.lock("short").ttl(ttl).try_acquire().await;
        assert!(
            matches!(r, Err(LockError::InvalidTtl { .. })),
            "{ms} ms: {r:?}"
        );
        assert!(locker.clone().with_default_ttl(ttl).is_err());
    }
    // Refused before the backend was asked: nothing was taken.
    let short = lock_core::LockName::new("short").unwrap();
    assert_eq!(backend.inspect(&short).await.unwrap(), None);
    let guard = locker
        .lock("short")
        .ttl(Duration::from_millis(4))
        .auto_renew(false)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(guard.is_held());
    drop(guard);
}

/// The request's fields are public, so a caller can set them past what
/// `AcquireRequest::new` checked: time arithmetic must saturate, not panic.
#[tokio::test]
async fn huge_durations_set_on_a_request_do_not_panic() {
    let backend = MemoryBackend::new();
    let held = lock_core::AcquireRequest::new(
        name("huge"),
        lock_core::OwnerToken::random(),
        Duration::from_secs(5),
        Duration::ZERO,
    )
    .unwrap();
    let first = backend.try_acquire(&held).await.unwrap().expect("free");
    let mut req = lock_core::AcquireRequest::new(
        name("huge"),
        lock_core::OwnerToken::random(),
        Duration::from_secs(5),
        Duration::ZERO,
    )
    .unwrap();
    req.ttl = Duration::MAX;
    req.wait = Duration::MAX;
    // No drift: `Duration::MAX * (1 - 0)` must not overflow either.
    req.clock.drift = 0.0;
    req.retry = Some(lock_core::wait::Backoff {
        initial: Duration::MAX,
        max: Duration::MAX,
    });
    // Held by `first`: the waiting acquire sleeps (saturated) until the
    // release wakes it, then takes the lock with the huge TTL.
    let other = backend.clone();
    let waiter = tokio::spawn(async move { other.acquire(&req).await });
    sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    backend.release(&first).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap()
        .expect("taken after the release");
    assert!(lease.deadline() > tokio::time::Instant::now() + Duration::from_secs(86_400));
    backend.release(&lease).await.unwrap();
}
