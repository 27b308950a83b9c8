//! Waiting for a lock: one loop for the backends that wait by retrying
//! an attempt (Redis, SQL, memory). Backends whose server queues waiters
//! (etcd, ZooKeeper) wait their own way.
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
    /// The longest pause accepted: a waiter that polls less often than
    /// this would notice a free lock too late to be of use.
    pub const MAX_PAUSE: Duration = Duration::from_secs(60);

    /// A pacing from `initial` doubling up to `max`; refused (a typed
    /// error, before any I/O) unless `0 < initial <= max <= MAX_PAUSE`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::wait::Backoff;
    /// assert!(Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).is_ok());
    /// assert!(Backoff::new(Duration::ZERO, Duration::from_secs(1)).is_err());
    /// assert!(Backoff::new(Duration::from_secs(2), Duration::from_secs(1)).is_err());
    /// ```
    pub fn new(initial: Duration, max: Duration) -> Result<Self, LockError> {
        let why = if initial.is_zero() {
            Some("the first pause must be above zero".to_string())
        } else if max < initial {
            Some(format!(
                "the longest pause ({max:?}) is shorter than the first ({initial:?})"
            ))
        } else if max > Self::MAX_PAUSE {
            Some(format!(
                "the longest pause ({max:?}) is above the maximum of {:?}",
                Self::MAX_PAUSE
            ))
        } else {
            None
        };
        match why {
            Some(why) => Err(LockError::Config(format!("retry: {why}"))),
            None => Ok(Backoff { initial, max }),
        }
    }

    /// The shortest pause a pacing makes, whatever its public fields say
    /// (one built by hand may hold zeros, which `new` refuses), so that the
    /// pacing itself never asks for back-to-back attempts.
    const MIN_PAUSE: Duration = Duration::from_millis(1);

    /// The first pause.
    fn first(&self) -> Duration {
        self.initial.max(Self::MIN_PAUSE)
    }

    /// The pause after `d`: doubled, up to `max`.
    fn after(&self, d: Duration) -> Duration {
        d.saturating_mul(2)
            .min(self.max.max(self.initial))
            .max(Self::MIN_PAUSE)
    }

    /// A pause drawn uniformly from `[d/2, d]`, so that waiters released at
    /// the same moment do not retry in lockstep.
    fn jittered(d: Duration) -> Duration {
        let lo = d / 2;
        let span = (d - lo).as_micros() as u64;
        lo + Duration::from_micros(rand::rng().random_range(0..=span))
    }
}

/// The pauses of a [`Backoff`] one after another, for waits that retry
/// only after errors (backends whose server queues the waiters): each pause
/// jittered, the next one twice as long, up to `max`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use lock_core::wait::{Backoff, Pacer};
/// use tokio::time::Instant;
/// let mut pacer = Pacer::new(Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).unwrap());
/// let start = Instant::now();
/// pacer.pause_until(start + Duration::from_secs(60)).await;
/// assert!(start.elapsed() >= Duration::from_millis(50) && start.elapsed() <= Duration::from_millis(100));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Pacer {
    backoff: Backoff,
    next: Duration,
}

impl Pacer {
    /// Pauses paced by `backoff`, starting at its `initial`.
    pub fn new(backoff: Backoff) -> Self {
        Pacer {
            backoff,
            next: backoff.first(),
        }
    }

    /// Sleeps the next pause, or until `deadline` if that comes first.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped pause leaves the next one as it was.
    pub async fn pause_until(&mut self, deadline: Instant) {
        let pause = Backoff::jittered(self.next);
        sleep_until(deadline.min(crate::lease::later(Instant::now(), pause))).await;
        self.next = self.backoff.after(self.next);
    }
}

/// Polls `backend.try_acquire` with jittered exponential backoff until it
/// succeeds or `req.wait` runs out. The fallback for backends with no
/// wake-up.
///
/// # Cancel safety
/// Cancel safe while sleeping; see [`LockBackend::try_acquire`] for a drop
/// during an attempt.
pub async fn poll_acquire<B: LockBackend + ?Sized>(
    backend: &B,
    req: &AcquireRequest,
    backoff: Backoff,
) -> Result<Option<Lease>, LockError> {
    acquire_loop(
        || backend.try_acquire(req),
        req.wait_deadline(),
        backoff,
        std::future::pending::<()>,
    )
    .await
}

/// The wait loop: calls `attempt` (one try, e.g. `|| backend.try_acquire(req)`,
/// or a backend's own attempt that also records what it learned) until it
/// returns a lease or `deadline` passes. `arm` returns a wake-up future,
/// created (and registered with its source) BEFORE each attempt so a
/// release that happens between a failed attempt and the sleep still wakes
/// the waiter.
///
/// Retryable errors are retried until the deadline; the last one is then
/// returned. Other errors are returned at once.
///
/// # Cancel safety
/// Cancel safe while sleeping; a drop during an attempt is whatever
/// dropping `attempt`'s future is (for `try_acquire`, see
/// [`LockBackend::try_acquire`]).
pub async fn acquire_loop<A, AF, W, F>(
    mut attempt: A,
    deadline: Instant,
    backoff: Backoff,
    mut arm: F,
) -> Result<Option<Lease>, LockError>
where
    A: FnMut() -> AF,
    AF: Future<Output = Result<Option<Lease>, LockError>>,
    W: Future<Output = ()>,
    F: FnMut() -> W,
{
    let mut delay = backoff.first();
    loop {
        let wake = arm();
        let result = attempt().await;
        let now = Instant::now();
        match result {
            Ok(Some(lease)) => return Ok(Some(lease)),
            Ok(None) if now >= deadline => return Ok(None),
            Err(e) if !e.is_retryable() || now >= deadline => return Err(e),
            _ => {}
        }
        let until = deadline.min(crate::lease::later(now, Backoff::jittered(delay)));
        tokio::select! {
            _ = wake => {}
            _ = sleep_until(until) => delay = backoff.after(delay),
        }
    }
}

/// Runs one retry of a waiting acquire in a task of its own, so that
/// cancelling the wait cannot cut off a request that is already on its way
/// to the server. A dropped request may still reach the server (a statement
/// queued on a connection, a command in a driver's buffer) and take the lock
/// after the waiter is gone, leaving it held by nobody until its TTL; a
/// detached one runs to its answer, and if nobody waits for that answer any
/// more, the task hands it to `undo` (which releases a lease it won, see
/// [`release_if_won`] and [`undo_grant`]). The attempt is first
/// polled in the caller's task, so its request is sent without waiting for
/// the new task to be scheduled; an attempt that finishes in that poll
/// needs no task at all.
///
/// A backend uses it for the attempts after a waiting acquire's first: those
/// are the ones a cancelled wait interrupts. The first attempt stays inline,
/// so an uncontended acquire pays no task.
///
/// # Cancel safety
/// Cancel safe: dropping the returned future leaves the attempt to finish
/// and be undone in its task.
pub async fn detached<T, Fut, U, UF>(attempt: Fut, undo: U) -> Result<T, LockError>
where
    T: Send + 'static,
    Fut: Future<Output = Result<T, LockError>> + Send + 'static,
    U: FnOnce(T) -> UF + Send + 'static,
    UF: Future<Output = ()> + Send,
{
    let mut attempt = Box::pin(attempt);
    // The first poll runs here, so the request leaves the moment the waiter
    // is woken; a task of its own would first have to be scheduled, and
    // under contention those microseconds decide who gets a freed lock.
    // Only the rest (waiting for the answer) moves to the task.
    if let std::task::Poll::Ready(answer) = futures::poll!(attempt.as_mut()) {
        return answer;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (back_tx, back_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let answer = attempt.await;
        let unwanted = match tx.send(answer) {
            Err(Ok(unwanted)) => Some(unwanted),
            Err(Err(_)) => None,
            // Delivered, but the waiter may be dropped before it reads it:
            // then the answer comes back (or the channel just closes, once
            // the waiter has it).
            Ok(()) => back_rx.await.ok(),
        };
        if let Some(unwanted) = unwanted {
            undo(unwanted).await;
        }
    });
    let mut answer = Answer {
        rx,
        back: Some(back_tx),
    };
    (&mut answer.rx).await.unwrap_or_else(|_| {
        Err(LockError::transient(
            "polylock",
            "an acquire attempt's task ended without an answer",
        ))
    })
}

/// The waiter's end of a [`detached`] attempt. Dropped unread, it sends an
/// answer that had already arrived back to the attempt's task, to be
/// undone there.
struct Answer<T> {
    rx: tokio::sync::oneshot::Receiver<Result<T, LockError>>,
    back: Option<tokio::sync::oneshot::Sender<T>>,
}

impl<T> Drop for Answer<T> {
    fn drop(&mut self) {
        // Closed first, so that an answer sent from now on fails to send
        // and the task undoes it itself; one sent before is still here.
        self.rx.close();
        if let Ok(Ok(unwanted)) = self.rx.try_recv() {
            if let Some(back) = self.back.take() {
                // The task waits for this until `back` is dropped.
                let _ = back.send(unwanted);
            }
        }
    }
}

/// The `undo` of [`detached`] for an attempt that answers with the lease it
/// won, if any: releases that lease.
pub fn release_if_won<B: LockBackend + 'static>(
    backend: B,
) -> impl FnOnce(Option<Lease>) -> futures::future::BoxFuture<'static, ()> + Send + 'static {
    move |won| {
        Box::pin(async move {
            if let Some(lease) = won {
                undo_grant(&backend, &lease).await;
            }
        })
    }
}

/// Releases `lease`, won by an attempt whose waiter is gone (see
/// [`detached`]). A failure is only logged: the lock then expires at its
/// TTL, as a dropped attempt's would.
///
/// # Cancel safety
/// As [`LockBackend::release`].
pub async fn undo_grant<B: LockBackend + ?Sized>(backend: &B, lease: &Lease) {
    if let Err(e) = backend.release(lease).await {
        tracing::debug!(name = %lease.name(), error = %e, "polylock: could not release a cancelled waiter's grant; it expires at its TTL");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FencingToken, LockName, OwnerToken};

    fn request(wait: Duration) -> AcquireRequest {
        let name = LockName::new("w").unwrap();
        AcquireRequest::new(name, OwnerToken::random(), Duration::from_secs(5), wait).unwrap()
    }

    /// The loop drives any attempt, not a backend: a closure that is
    /// refused, then fails retryably, then wins is called exactly three
    /// times and its lease returned.
    #[tokio::test(start_paused = true)]
    async fn drives_an_attempt_closure_until_it_wins() {
        let req = request(Duration::from_secs(60));
        let mut calls = 0;
        let lease = acquire_loop(
            || {
                calls += 1;
                let n = calls;
                let req = &req;
                async move {
                    match n {
                        1 => Ok(None),
                        2 => Err(LockError::transient("t", "blip")),
                        _ => Ok(Some(req.lease(
                            FencingToken::new(7).unwrap(),
                            req.ttl,
                            Instant::now(),
                        ))),
                    }
                }
            },
            req.wait_deadline(),
            Backoff::default(),
            std::future::pending::<()>,
        )
        .await
        .unwrap()
        .expect("a lease");
        assert_eq!(calls, 3);
        assert_eq!(lease.fence().get(), 7);
    }

    /// A permanent error ends the wait at once; a refusal past the
    /// deadline gives `None`.
    #[tokio::test(start_paused = true)]
    async fn stops_on_permanent_errors_and_at_the_deadline() {
        let req = request(Duration::from_secs(60));
        let mut calls = 0;
        let r = acquire_loop(
            || {
                calls += 1;
                async { Err(LockError::permanent("t", "no")) }
            },
            req.wait_deadline(),
            Backoff::default(),
            std::future::pending::<()>,
        )
        .await;
        assert!(matches!(
            r,
            Err(LockError::Backend {
                retryable: false,
                ..
            })
        ));
        assert_eq!(calls, 1);
        let req = request(Duration::from_millis(100));
        let r = acquire_loop(
            || async { Ok(None) },
            req.wait_deadline(),
            Backoff::default(),
            std::future::pending::<()>,
        )
        .await;
        assert!(matches!(r, Ok(None)));
    }

    /// A request that is already on its way when the waiter is cancelled,
    /// like a statement queued on a driver's connection: it reaches the
    /// server 200 ms later whatever happens to the future that sent it.
    fn in_flight(
        mem: &crate::MemoryBackend,
        req: &AcquireRequest,
    ) -> impl Future<Output = Result<Option<Lease>, LockError>> + Send + 'static {
        let (mem, req) = (mem.clone(), req.clone());
        let sent = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            mem.try_acquire(&req).await
        });
        async move { sent.await.expect("the driver task") }
    }

    /// Cancelled mid-request, an inline attempt leaves the lock held by
    /// nobody; a detached one releases what its request won.
    #[tokio::test(start_paused = true)]
    async fn a_detached_attempt_undoes_a_grant_nobody_waits_for() {
        let mem = crate::MemoryBackend::new();
        let req = request(Duration::from_secs(60));
        let cut = Duration::from_millis(100);

        let inline = tokio::time::timeout(cut, in_flight(&mem, &req)).await;
        assert!(inline.is_err(), "the inline attempt should be cut off");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let orphan = mem.inspect(&req.name).await.unwrap();
        assert!(orphan.is_some(), "the model lost its in-flight request");
        assert!(mem.force_release(&req.name).await.unwrap());

        let req = request(Duration::from_secs(60));
        let attempt = in_flight(&mem, &req);
        let cut_off =
            tokio::time::timeout(cut, detached(attempt, release_if_won(mem.clone()))).await;
        assert!(cut_off.is_err(), "the detached attempt should be cut off");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            mem.inspect(&req.name).await.unwrap().is_none(),
            "a cancelled waiter's grant was left behind"
        );
        // It did win (and release) the lock: the next grant's fence is
        // the third.
        let next = request(Duration::ZERO);
        let lease = mem.try_acquire(&next).await.unwrap().expect("free");
        assert_eq!(lease.fence().get(), 3);

        // Not cancelled, it answers like the attempt itself.
        let won = detached(
            in_flight(&mem, &request(Duration::ZERO)),
            release_if_won(mem.clone()),
        )
        .await
        .unwrap();
        assert!(won.is_none(), "the lock is held: refused");
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let d = Backoff::jittered(Duration::from_millis(100));
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(100));
        }
    }
}
