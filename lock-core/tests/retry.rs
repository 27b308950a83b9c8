//! `Locker::with_retry` paces a waiting acquire: the request carries the
//! pacing to the backend, and a backend that polls with
//! `req.backoff_or(..)` follows it instead of its own default.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::wait::{poll_acquire, Backoff};
use lock_core::{
    async_trait, AcquireRequest, Guarantees, HolderInfo, Lease, LockBackend, LockError, LockName,
    Locker,
};

/// A lock that is always held by someone else, counting attempts, and
/// polling with the request's pacing (default: every millisecond).
#[derive(Debug, Default)]
struct AlwaysHeld {
    attempts: AtomicUsize,
}

#[async_trait]
impl LockBackend for AlwaysHeld {
    async fn try_acquire(&self, _: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let fast = Backoff::new(Duration::from_millis(1), Duration::from_millis(1)).unwrap();
        poll_acquire(self, req, req.backoff_or(fast)).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        Err(LockError::Lost {
            name: lease.name().to_string(),
        })
    }
    async fn release(&self, _: &Lease) -> Result<(), LockError> {
        Ok(())
    }
    async fn inspect(&self, _: &LockName) -> Result<Option<HolderInfo>, LockError> {
        Ok(None)
    }
    fn guarantees(&self) -> Guarantees {
        Guarantees::new("always-held")
    }
}

async fn attempts_in_a_wait_of_one_second(locker: Locker, backend: &AlwaysHeld) -> usize {
    let r = locker
        .lock("busy")
        .wait(Duration::from_secs(1))
        .acquire()
        .await;
    assert!(matches!(r, Err(LockError::Timeout { .. })), "{r:?}");
    backend.attempts.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_locker_retry_setting_paces_the_backend_s_polls() {
    let own = Arc::new(AlwaysHeld::default());
    let unpaced = attempts_in_a_wait_of_one_second(Locker::from_arc(own.clone()), &own).await;
    let slow = Arc::new(AlwaysHeld::default());
    let pacing = Backoff::new(Duration::from_millis(250), Duration::from_millis(250)).unwrap();
    let locker = Locker::from_arc(slow.clone()).with_retry(pacing);
    let paced = attempts_in_a_wait_of_one_second(locker, &slow).await;
    // Pauses of 125..=250 ms (jittered) in one second: at most 9 attempts,
    // whatever the machine's load (slowness only lowers the count).
    assert!(
        (2..=9).contains(&paced),
        "250 ms pacing made {paced} attempts"
    );
    assert!(
        unpaced > 3 * paced,
        "the backend's own 1 ms pacing made {unpaced} attempts, the 250 ms one {paced}"
    );
}

#[test]
fn a_bad_pacing_is_refused_with_a_typed_error() {
    for (initial, max) in [(0, 10), (20, 10), (10, 61_000)] {
        let r = Backoff::new(Duration::from_millis(initial), Duration::from_millis(max));
        assert!(
            matches!(&r, Err(LockError::Config(m)) if m.starts_with("retry: ")),
            "{initial} ms / {max} ms: {r:?}"
        );
    }
}
