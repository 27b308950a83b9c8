//! The high-level API: `Locker` and its builder.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{validate_ttl, validate_wait, AcquireRequest, HolderInfo, LockBackend};
use crate::error::LockError;
use crate::guarantees::Guarantees;
use crate::guard::LockGuard;
use crate::held::{backend_id, Held};
use crate::lease::ClockPolicy;
use crate::name::LockName;
use crate::observe::{self, Outcome};
use crate::owner::Owner;
use crate::token::OwnerToken;
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
    wait: Duration,
    clock: ClockPolicy,
}

impl Locker {
    /// A locker over `backend`, with a 30 s TTL and no wait by default.
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A locker over a shared backend.
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        Locker {
            backend,
            watchdog: Arc::default(),
            ttl: DEFAULT_TTL,
            wait: Duration::ZERO,
            clock: ClockPolicy::default(),
        }
    }

    /// Sets the default TTL of locks taken through this locker.
    pub fn with_default_ttl(mut self, ttl: Duration) -> Result<Self, LockError> {
        validate_ttl(ttl)?;
        self.ttl = ttl;
        Ok(self)
    }

    /// Sets the default wait of locks taken through this locker.
    pub fn with_default_wait(mut self, wait: Duration) -> Result<Self, LockError> {
        validate_wait(wait)?;
        self.wait = wait;
        Ok(self)
    }

    /// Sets how lease deadlines are computed.
    pub fn with_clock_policy(mut self, clock: ClockPolicy) -> Self {
        self.clock = clock;
        self
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

    /// Takes `name` with the locker's defaults, runs `f` with the fencing
    /// token, and releases. If the lock is lost while `f` runs, `f` is
    /// cancelled (dropped at its next `.await`) and the result is
    /// `Err(Lost)`.
    ///
    /// # Cancel safety
    /// Dropping the future drops `f` and releases the lock (through the
    /// guard's drop).
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
    wait: Duration,
    owner: Option<Owner>,
    auto_renew: bool,
}

impl LockBuilder {
    /// The lease length. Checked (non-zero, at most [`crate::MAX_TTL`]) by
    /// the acquire methods, before any I/O.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`acquire`](LockBuilder::acquire) may wait for a holder to
    /// go away. Zero: one attempt.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Takes the lock as `owner`: if `owner` already holds it, this adds a
    /// hold to the same lease instead of waiting (explicit reentrancy).
    pub fn owner(mut self, owner: &Owner) -> Self {
        self.owner = Some(owner.clone());
        self
    }

    /// Whether a watchdog renews the lease while the guard lives (default
    /// true). Without it the lock expires at its TTL unless renewed by hand.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Waits up to the configured wait; `Err(Timeout)` if the lock stayed
    /// taken.
    ///
    /// # Cancel safety
    /// Dropping the future while it waits leaves nothing behind. Dropping it
    /// while an attempt is in flight may leave a lock that nobody holds
    /// until its TTL runs out (see [`LockBackend::try_acquire`]).
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let wait = self.wait;
        let name = self
            .name
            .as_ref()
            .map(|n| n.to_string())
            .unwrap_or_default();
        match self.take(true).await? {
            Some(guard) => Ok(guard),
            None => Err(LockError::Timeout { name, waited: wait }),
        }
    }

    /// One attempt: `Ok(None)` if someone else holds the lock.
    ///
    /// # Cancel safety
    /// As [`LockBackend::try_acquire`].
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        self.take(false).await
    }

    /// Acquires (waiting as configured), runs `f` with the fencing token,
    /// and releases; `Err(Lost)` if the lock was lost while `f` ran, in which
    /// case `f` was cancelled.
    ///
    /// # Cancel safety
    /// Dropping the future drops `f` and releases the lock.
    pub async fn run<F, Fut, T>(self, f: F) -> Result<T, LockError>
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
            Some(out) => guard.release().await.map(|()| out),
            None => {
                let name = guard.name().to_string();
                // The guard is gone already; releasing only cleans up.
                let _ = guard.release().await;
                Err(LockError::Lost { name })
            }
        }
    }

    async fn take(self, wait: bool) -> Result<Option<LockGuard>, LockError> {
        let name = self.name?;
        validate_ttl(self.ttl)?;
        let wait_for = if wait { self.wait } else { Duration::ZERO };
        let owner_token = self
            .owner
            .as_ref()
            .map_or_else(OwnerToken::random, Owner::token);
        let mut req = AcquireRequest::new(name, owner_token, self.ttl, wait_for)?;
        req.clock = self.locker.clock;

        let _serial = match &self.owner {
            Some(owner) => {
                let turn = owner.acquiring.clone().lock_owned().await;
                if let Some(held) = owner
                    .registry
                    .reenter(backend_id(&self.locker.backend), &req.name)
                {
                    return Ok(Some(LockGuard::new(held)));
                }
                Some(turn)
            }
            None => None,
        };

        let backend = &self.locker.backend;
        let backend_name = backend.guarantees().backend;
        let span = tracing::info_span!(
            "polylock.acquire",
            backend = backend_name,
            name = %req.name,
            fence = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = if wait_for.is_zero() {
            backend.try_acquire(&req).instrument(span.clone()).await
        } else {
            backend.acquire(&req).instrument(span.clone()).await
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
        observe::acquire_done(
            backend_name,
            outcome,
            started.elapsed(),
            !wait_for.is_zero(),
        );
        let Some(lease) = result? else {
            return Ok(None);
        };
        let registry = self.owner.as_ref().map(|o| &o.registry);
        let held = Held::new(Arc::clone(backend), lease, registry);
        if let Some(owner) = &self.owner {
            owner
                .registry
                .insert(backend_id(backend), req.name.clone(), &held);
        }
        if self.auto_renew {
            self.locker.watchdog.watch(&held);
        }
        Ok(Some(LockGuard::new(held)))
    }
}
