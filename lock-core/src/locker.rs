//! The high-level API: `Locker` and its builder.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{timeout, Instant};
use tracing::Instrument;

use crate::backend::{validate_ttl, validate_wait, AcquireRequest, HolderInfo, LockBackend};
use crate::error::LockError;
use crate::guarantees::Guarantees;
use crate::guard::LockGuard;
use crate::held::{backend_id, Held};
use crate::lease::ClockPolicy;
use crate::name::LockName;
use crate::observe::{self, Metrics, Outcome};
use crate::owner::Owner;
use crate::token::OwnerToken;
use crate::wait::Backoff;
use crate::watchdog::Watchdog;

/// The default lease length.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Takes locks on one backend.
///
/// Cheap to clone; clones share the backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::{Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let guard = locker
///     .lock("nightly-report")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// // ... write with guard.fence() ...
/// guard.release().await?;
///
/// let sum = locker.with_lock("nightly-report", |fence| async move { fence.get() + 1 }).await?;
/// assert_eq!(sum, 3);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Locker {
    backend: Arc<dyn LockBackend>,
    /// Renews the leases taken through this locker and its clones.
    watchdog: Arc<Watchdog>,
    ttl: Duration,
    /// None: acquire waits until it holds the lock.
    wait: Option<Duration>,
    clock: ClockPolicy,
    retry: Option<Backoff>,
    metrics: Arc<Metrics>,
}

impl Locker {
    /// A locker over `backend`, with a 30 s TTL; by default
    /// [`acquire`](LockBuilder::acquire) waits, without bound, until it
    /// holds the lock (like `Mutex::lock`), and is cancelled by dropping it.
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A locker over a shared backend.
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        Locker {
            metrics: Arc::new(Metrics::new(backend.guarantees().backend)),
            backend,
            watchdog: Arc::default(),
            ttl: DEFAULT_TTL,
            wait: None,
            clock: ClockPolicy::default(),
            retry: None,
        }
    }

    /// Sets the default TTL of locks taken through this locker.
    pub fn with_default_ttl(mut self, ttl: Duration) -> Result<Self, LockError> {
        validate_ttl(ttl)?;
        self.clock.check_ttl(ttl)?;
        self.ttl = ttl;
        Ok(self)
    }

    /// Bounds the default wait of locks taken through this locker: their
    /// [`acquire`](LockBuilder::acquire) gives up with `Err(Timeout)` after
    /// `wait` (zero: after one attempt) instead of waiting without bound.
    pub fn with_default_wait(mut self, wait: Duration) -> Result<Self, LockError> {
        validate_wait(wait)?;
        self.wait = Some(wait);
        Ok(self)
    }

    /// Paces the attempts of waiting acquires through this locker where the
    /// backend polls (a fallback beside its notifications, or its only way)
    /// and after retryable errors: `backoff.initial` doubling up to
    /// `backoff.max`, jittered. Without it each backend paces itself.
    pub fn with_retry(mut self, backoff: Backoff) -> Self {
        self.retry = Some(backoff);
        self
    }

    /// Sets how lease deadlines are computed. Refuses a policy
    /// [`ClockPolicy::validate`] refuses, and one that leaves the default
    /// TTL no room for a renewal ([`ClockPolicy::check_ttl`]).
    pub fn with_clock_policy(mut self, clock: ClockPolicy) -> Result<Self, LockError> {
        clock.validate()?;
        clock.check_ttl(self.ttl)?;
        self.clock = clock;
        Ok(self)
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// What the backend promises.
    pub fn guarantees(&self) -> Guarantees {
        self.backend.guarantees()
    }

    /// A builder for the lock `name`. An invalid name is reported by the
    /// builder's acquire methods, before any I/O.
    pub fn lock(&self, name: impl AsRef<str>) -> LockBuilder {
        LockBuilder {
            locker: self.clone(),
            name: LockName::new(name),
            ttl: self.ttl,
            wait: self.wait,
            owner: None,
            auto_renew: true,
            meta: None,
        }
    }

    /// Who holds `name` now.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    pub async fn inspect(&self, name: impl AsRef<str>) -> Result<Option<HolderInfo>, LockError> {
        let name = LockName::new(name)?;
        self.backend.inspect(&name).await
    }

    /// Takes `name` with the locker's defaults (waiting for it, without
    /// bound unless [`with_default_wait`](Locker::with_default_wait) set
    /// one), runs `f` with the fencing token, and releases. If the lock is
    /// lost while `f` runs, `f` is cancelled (dropped at its next `.await`)
    /// and the result is `Err(Lost)`; so it is when only the release learns
    /// of the loss (use [`LockBuilder::run_reporting`] to keep `f`'s output
    /// then).
    ///
    /// # Cancel safety
    /// Dropping the future while `f` runs drops `f` and releases the lock
    /// (through the guard's drop); dropping it while it waits for the lock
    /// is dropping [`LockBuilder::acquire`].
    pub async fn with_lock<F, Fut, T>(&self, name: impl AsRef<str>, f: F) -> Result<T, LockError>
    where
        F: FnOnce(crate::FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock(name).run(f).await
    }
}

/// Options for one acquisition; made by [`Locker::lock`].
#[derive(Debug)]
#[must_use = "a lock builder does nothing until acquire() or try_acquire() is awaited"]
pub struct LockBuilder {
    locker: Locker,
    name: Result<LockName, LockError>,
    ttl: Duration,
    wait: Option<Duration>,
    owner: Option<Owner>,
    auto_renew: bool,
    meta: Option<crate::HolderMeta>,
}

/// How a [`LockBuilder::run_reporting`] ended: the closure ran to its end,
/// and this is its output together with what the release said.
#[derive(Debug)]
#[must_use = "`release` may report that the lock was lost"]
pub struct RunOutcome<T> {
    /// What the closure returned.
    pub output: T,
    /// The release: `Err(Lost)` when the lock had been lost (or granted to
    /// someone else) before it, so the closure's work may have overlapped
    /// another holder's; another error when the release itself failed (the
    /// lock then expires at its TTL).
    pub release: Result<(), LockError>,
}

impl<T> RunOutcome<T> {
    /// The output if the release was clean, else the release's error: what
    /// [`LockBuilder::run`] returns.
    pub fn into_result(self) -> Result<T, LockError> {
        self.release.map(|()| self.output)
    }
}

/// How long one acquisition may wait.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// One attempt.
    Never,
    /// Until the lock is held, or for at most this long.
    Upto(Option<Duration>),
}

impl LockBuilder {
    /// The lease length. Checked (non-zero, at most [`crate::MAX_TTL`],
    /// and long enough that the clock policy trusts a lease past its first
    /// renewal: [`ClockPolicy::check_ttl`]; with the default policy, above
    /// about 3 ms) by the acquire methods, before any I/O.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Bounds how long [`acquire`](LockBuilder::acquire) waits for a holder
    /// to go away (zero: one attempt). Without it, `acquire` waits until it
    /// holds the lock (unless the locker set a default bound).
    ///
    /// With a wait, `acquire` is back within the wait plus the backend's
    /// `op_timeout` (a URL option) even when the service stops answering:
    /// no attempt starts after the wait ends, and one still in flight gets
    /// one `op_timeout` to answer (see [`LockBackend`](crate::LockBackend),
    /// "Answering in time").
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Takes the lock as `owner`: if `owner` already holds it, this adds a
    /// hold to the same lease instead of waiting (explicit reentrancy).
    pub fn owner(mut self, owner: &Owner) -> Self {
        self.owner = Some(owner.clone());
        self
    }

    /// Whether a watchdog renews the lease while the guard lives (default
    /// true). Without it the lock expires at its TTL unless renewed by hand
    /// with [`LockGuard::renew`]. For a re-entrant hold: once any hold of a
    /// lease asked for renewal, the watchdog renews it until its last hold
    /// is released.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Stores `meta` (host, pid, command, start time) beside the lock, on
    /// backends that declare [`Guarantees::holder_meta`], so `inspect`,
    /// `list` and `polylock status` can say who holds it. Off by default:
    /// the command line is readable by anyone who can read the service.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_core::LockError> {
    /// use lock_core::{HolderMeta, LockBackend, LockName, Locker, MemoryBackend};
    /// let backend = MemoryBackend::new();
    /// let locker = Locker::new(backend.clone());
    /// let guard = locker.lock("job").holder_meta(HolderMeta::of_this_process("nightly")).acquire().await?;
    /// let holder = backend.inspect(&LockName::new("job")?).await?.expect("held");
    /// assert_eq!(holder.meta.expect("kept").pid, std::process::id());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn holder_meta(mut self, meta: crate::HolderMeta) -> Self {
        self.meta = Some(meta);
        self
    }

    /// Takes the lock, waiting for it: until it is held when no wait was
    /// set, else up to the wait, then `Err(Timeout)`. Retryable backend
    /// errors are retried while waiting; others are returned at once.
    ///
    /// # Cancel safety
    /// Dropping the future while it waits leaves nothing behind: this is
    /// how an unbounded wait is cancelled. The backends that wait by
    /// retrying (SQL, Redis, Redlock) undo a retry on the wire that wins
    /// once nobody waits for it (each its own way: a task that finishes the
    /// retry, see [`crate::wait::detached`], or a release sent behind it on
    /// its connection); see each backend's `acquire`. Dropping the future
    /// during its first attempt, or a retry that got no answer at all, may
    /// leave a lock that nobody holds until its TTL runs out (see
    /// [`LockBackend::try_acquire`]); the SQL backend and the Redis
    /// backend's plain format give such a grant back once its request can
    /// no longer land.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let wait = self.wait;
        let name = self
            .name
            .as_ref()
            .map(|n| n.to_string())
            .unwrap_or_default();
        match self.take(Wait::Upto(wait)).await? {
            Some(guard) => Ok(guard),
            None => Err(LockError::Timeout {
                name,
                waited: wait.unwrap_or_default(),
            }),
        }
    }

    /// One attempt, never waiting: `Ok(None)` if someone else holds the
    /// lock, or if the same [`Owner`] is in the middle of acquiring it.
    ///
    /// # Cancel safety
    /// As [`LockBackend::try_acquire`].
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        self.take(Wait::Never).await
    }

    /// Acquires (waiting as [`acquire`](LockBuilder::acquire) does), runs
    /// `f` with the fencing token, and releases; `Err(Lost)` if the lock was
    /// lost while `f` ran, in which case `f` was cancelled, and also when
    /// only the release reported the loss (then `f`'s output is dropped:
    /// [`run_reporting`](LockBuilder::run_reporting) keeps it).
    ///
    /// # Cancel safety
    /// Dropping the future while `f` runs drops `f` and releases the lock
    /// (through the guard's drop); dropping it while it waits for the lock
    /// is dropping [`acquire`](LockBuilder::acquire).
    pub async fn run<F, Fut, T>(self, f: F) -> Result<T, LockError>
    where
        F: FnOnce(crate::FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_reporting(f).await?.into_result()
    }

    /// As [`run`](LockBuilder::run), but once `f` ran to its end its output
    /// is returned together with the release's outcome, so a loss that only
    /// the release learns of (the lock was granted to someone else while
    /// `f` worked) does not discard the work's result. `Err` means that
    /// nothing ran to its end: the acquire failed, or the lock was lost
    /// while `f` ran and `f` was cancelled (`Err(Lost)`).
    ///
    /// # Cancel safety
    /// Dropping the future while `f` runs drops `f` and releases the lock
    /// (through the guard's drop); dropping it while it waits for the lock
    /// is dropping [`acquire`](LockBuilder::acquire).
    pub async fn run_reporting<F, Fut, T>(self, f: F) -> Result<RunOutcome<T>, LockError>
    where
        F: FnOnce(crate::FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire().await?;
        let out = tokio::select! {
            biased;
            _ = guard.lost() => None,
            out = f(guard.fence()) => Some(out),
        };
        match out {
            Some(output) => Ok(RunOutcome {
                output,
                release: guard.release().await,
            }),
            None => {
                let name = guard.name().to_string();
                // The guard is gone already; releasing only cleans up.
                let _ = guard.release().await;
                Err(LockError::Lost { name })
            }
        }
    }

    async fn take(self, wait: Wait) -> Result<Option<LockGuard>, LockError> {
        let name = self.name?;
        let (wait_for, bounded) = match wait {
            Wait::Never => (Duration::ZERO, true),
            Wait::Upto(Some(d)) => (d, true),
            // One backend wait at most MAX_WAIT long, repeated.
            Wait::Upto(None) => (crate::backend::MAX_WAIT, false),
        };
        let owner_token = self
            .owner
            .as_ref()
            .map_or_else(OwnerToken::random, Owner::token);
        let mut req = AcquireRequest::new(name, owner_token, self.ttl, wait_for)?;
        self.locker.clock.check_ttl(self.ttl)?;
        req.clock = self.locker.clock;
        req.meta = self.meta.clone();
        req.retry = self.locker.retry;
        let started = Instant::now();

        let _turn = match &self.owner {
            Some(owner) => {
                let id = backend_id(&self.locker.backend);
                // Re-entry never waits, not even for the owner's turn.
                if let Some(held) = owner.registry.reenter(id, &req.name) {
                    return Ok(Some(reentered(&self.locker, self.auto_renew, held)));
                }
                let gate = owner.registry.gate(id, &req.name);
                let turn = match wait {
                    Wait::Never => match gate.try_lock_owned() {
                        Ok(turn) => turn,
                        // This owner is acquiring the name right now.
                        Err(_) => return Ok(None),
                    },
                    Wait::Upto(None) => gate.lock_owned().await,
                    // The turn counts against the wait.
                    Wait::Upto(Some(d)) => match timeout(d, gate.lock_owned()).await {
                        Ok(turn) => turn,
                        Err(_) => return Ok(None),
                    },
                };
                // The acquisition we waited for may have taken it.
                if let Some(held) = owner.registry.reenter(id, &req.name) {
                    return Ok(Some(reentered(&self.locker, self.auto_renew, held)));
                }
                Some(turn)
            }
            None => None,
        };
        if bounded {
            req.wait = wait_for.saturating_sub(started.elapsed());
        }

        let backend = &self.locker.backend;
        let backend_name = backend.guarantees().backend;
        let span = observe::span!(
            INFO,
            "polylock.acquire",
            backend = backend_name,
            name = %req.name,
            fence = tracing::field::Empty,
        );
        let result = if req.wait.is_zero() {
            backend.try_acquire(&req).instrument(span.clone()).await
        } else {
            loop {
                match backend.acquire(&req).instrument(span.clone()).await {
                    Ok(None) if !bounded => continue,
                    other => break other,
                }
            }
        };
        let outcome = match &result {
            Ok(Some(lease)) => {
                span.record("fence", lease.fence().get());
                Outcome::Acquired
            }
            Ok(None) if wait_for.is_zero() => Outcome::Busy,
            Ok(None) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        };
        self.locker
            .metrics
            .acquire_done(outcome, started.elapsed(), !wait_for.is_zero());
        let Some(lease) = result? else {
            return Ok(None);
        };
        let registry = self.owner.as_ref().map(|o| &o.registry);
        let metrics = Arc::clone(&self.locker.metrics);
        let held = Held::new(Arc::clone(backend), lease, registry, metrics);
        if let Some(owner) = &self.owner {
            owner
                .registry
                .insert(backend_id(backend), req.name.clone(), &held);
        }
        if self.auto_renew && held.start_renewing() {
            self.locker.watchdog.watch(&held);
        }
        Ok(Some(LockGuard::new(held)))
    }
}

/// A guard for a hold added to a lease the owner already holds; this hold's
/// `auto_renew` starts renewals if none ran.
fn reentered(locker: &Locker, auto_renew: bool, held: Arc<Held>) -> LockGuard {
    if auto_renew && held.start_renewing() {
        locker.watchdog.watch(&held);
    }
    LockGuard::new(held)
}
