//! Waiting for a lock: one loop shared by every backend.
//!
//! A backend with its own wake-up (pub/sub, watch, LISTEN/NOTIFY) passes a
//! function that arms a fresh wake-up future before each attempt; the loop
//! then sleeps until that wake-up, a backoff timer or the wait deadline,
//! whichever comes first. The backoff timer is the fallback for a missed
//! notification, so a lost message costs latency, never liveness.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::time::{sleep_until, Instant};

use crate::backend::{AcquireRequest, LockBackend};
use crate::error::LockError;
use crate::lease::Lease;

/// Jittered exponential backoff between attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first pause.
    pub initial: Duration,
    /// The longest pause; also the fallback poll interval of backends with
    /// notifications.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(250),
        }
    }
}

impl Backoff {
    /// A pause drawn uniformly from `[d/2, d]`, so that waiters released at
    /// the same moment do not retry in lockstep.
    fn jittered(d: Duration) -> Duration {
        let lo = d / 2;
        let span = (d - lo).as_micros() as u64;
        lo + Duration::from_micros(rand::rng().random_range(0..=span))
    }
}

/// Polls `try_acquire` with jittered exponential backoff until it succeeds or
/// `req.wait` runs out. The fallback for backends with no wake-up.
///
/// # Cancel safety
/// Cancel safe while sleeping; see [`LockBackend::try_acquire`] for a drop
/// during an attempt.
pub async fn poll_acquire<B: LockBackend + ?Sized>(
    backend: &B,
    req: &AcquireRequest,
    backoff: Backoff,
) -> Result<Option<Lease>, LockError> {
    acquire_loop(backend, req, backoff, std::future::pending::<()>).await
}

/// The wait loop: `arm` returns a wake-up future, created (and registered
/// with its source) BEFORE each attempt so a release that happens between a
/// failed attempt and the sleep still wakes the waiter.
///
/// Retryable backend errors are retried until the wait runs out; the last one
/// is then returned. Other errors are returned at once.
///
/// # Cancel safety
/// Cancel safe while sleeping; see [`LockBackend::try_acquire`] for a drop
/// during an attempt.
pub async fn acquire_loop<B, W, F>(
    backend: &B,
    req: &AcquireRequest,
    backoff: Backoff,
    mut arm: F,
) -> Result<Option<Lease>, LockError>
where
    B: LockBackend + ?Sized,
    W: Future<Output = ()>,
    F: FnMut() -> W,
{
    let deadline = req.wait_deadline();
    let mut delay = backoff.initial.max(Duration::from_millis(1));
    loop {
        let wake = arm();
        let attempt = backend.try_acquire(req).await;
        let now = Instant::now();
        match attempt {
            Ok(Some(lease)) => return Ok(Some(lease)),
            Ok(None) if now >= deadline => return Ok(None),
            Err(e) if !e.is_retryable() || now >= deadline => return Err(e),
            _ => {}
        }
        let until = deadline.min(now + Backoff::jittered(delay));
        tokio::select! {
            _ = wake => {}
            _ = sleep_until(until) => {
                delay = (delay * 2).min(backoff.max.max(backoff.initial));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let d = Backoff::jittered(Duration::from_millis(100));
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(100));
        }
    }
}
