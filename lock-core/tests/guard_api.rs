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
    let locker = Locker::new(MemoryBackend::new()).with_clock_policy(ClockPolicy {
        // The local deadline at half the TTL, while the server holds the
        // lease for the whole TTL: a renewal would still succeed there.
        drift: 0.5,
        margin: Duration::ZERO,
    });
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
