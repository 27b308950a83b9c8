//! The contract every lock service implements.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::LockError;
use crate::guarantees::Guarantees;
use crate::lease::{ClockPolicy, Lease};
use crate::meta::HolderMeta;
use crate::name::LockName;
use crate::space::LockSpace;
use crate::token::{FencingToken, OwnerToken};
use crate::wait::Backoff;

/// The longest TTL accepted: long enough for any lease, short enough that
/// every backend can represent it in milliseconds and add it to a clock.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest wait accepted for one acquire.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A validated request to take a lock.
///
/// Built with [`AcquireRequest::new`], which refuses a zero or oversized TTL
/// and an oversized wait before any I/O.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The lock.
    pub name: LockName,
    /// Who asks: the token stored as the owner.
    pub owner: OwnerToken,
    /// The lease length asked for.
    pub ttl: Duration,
    /// How long [`LockBackend::acquire`] may wait for a holder to go away.
    /// Zero means one attempt.
    pub wait: Duration,
    /// How the local deadline is computed.
    pub clock: ClockPolicy,
    /// Who asks, stored beside the lock by backends that declare
    /// [`Guarantees::holder_meta`] (ignored by the others).
    pub meta: Option<HolderMeta>,
    /// How often a waiting acquire tries again when it polls, or after a
    /// retryable error; `None`: the backend's own pacing. Backends whose
    /// waiters are woken by the server (pub/sub, watches) still wake at
    /// once; this paces their fallback polls and their retries.
    pub retry: Option<Backoff>,
}

impl AcquireRequest {
    /// Validates the TTL and wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{AcquireRequest, LockName, OwnerToken, LockError};
    /// let name = LockName::new("job").unwrap();
    /// let ok = AcquireRequest::new(name.clone(), OwnerToken::random(), Duration::from_secs(5), Duration::ZERO);
    /// assert!(ok.is_ok());
    /// let zero = AcquireRequest::new(name, OwnerToken::random(), Duration::ZERO, Duration::ZERO);
    /// assert!(matches!(zero, Err(LockError::InvalidTtl { .. })));
    /// ```
    pub fn new(
        name: LockName,
        owner: OwnerToken,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Self, LockError> {
        validate_ttl(ttl)?;
        validate_wait(wait)?;
        Ok(AcquireRequest {
            name,
            owner,
            ttl,
            wait,
            clock: ClockPolicy::default(),
            meta: None,
            retry: None,
        })
    }

    /// The pacing to wait with: the request's, else the backend's
    /// `default`.
    pub fn backoff_or(&self, default: Backoff) -> Backoff {
        self.retry.unwrap_or(default)
    }

    /// The same request carrying a holder description.
    pub fn with_meta(mut self, meta: HolderMeta) -> Self {
        self.meta = Some(meta);
        self
    }

    /// The instant the wait ends, counted from now.
    pub fn wait_deadline(&self) -> Instant {
        // `wait` is a public field, set perhaps past what new() validated:
        // saturate rather than panic.
        crate::lease::later(Instant::now(), self.wait)
    }

    /// A lease for this request, granted for `granted_ttl` with `fence`, on a
    /// request sent at `sent_at`.
    pub fn lease(&self, fence: FencingToken, granted_ttl: Duration, sent_at: Instant) -> Lease {
        Lease::new(
            self.name.clone(),
            self.owner,
            fence,
            granted_ttl,
            sent_at,
            self.clock,
        )
    }
}

/// Renews each of `leases` by its own [`renew`](LockBackend::renew), all
/// at once, answering in order: the default `renew_many`, and a batching
/// backend's answer to a batch it will not send as one (one with a lease
/// of another lock space, [`LockSpace::any_foreign`](crate::LockSpace::any_foreign)).
///
/// # Cancel safety
/// Cancel safe, as `renew`.
pub async fn renew_each<B: LockBackend + ?Sized>(
    backend: &B,
    leases: &[Lease],
) -> Vec<Result<Lease, LockError>> {
    futures::future::join_all(leases.iter().map(|l| backend.renew(l))).await
}

/// Refuses a TTL of zero or above [`MAX_TTL`].
pub fn validate_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl.is_zero() {
        return Err(LockError::InvalidTtl {
            ttl,
            reason: "a lease must last longer than zero".into(),
        });
    }
    if ttl > MAX_TTL {
        return Err(LockError::InvalidTtl {
            ttl,
            reason: format!("the maximum is {MAX_TTL:?}"),
        });
    }
    Ok(())
}

/// Refuses a wait above [`MAX_WAIT`] (which could overflow a deadline).
pub fn validate_wait(wait: Duration) -> Result<(), LockError> {
    if wait > MAX_WAIT || Instant::now().checked_add(wait).is_none() {
        return Err(LockError::InvalidWait {
            wait,
            reason: format!("the maximum is {MAX_WAIT:?}"),
        });
    }
    Ok(())
}

/// Who holds a lock, as far as the backend can tell.
///
/// `Debug` shows only the start of [`owner`](Self::owner), as
/// [`OwnerToken`]'s does: whoever has the whole token can renew and release
/// the holder's lock, and Debug output ends up in logs.
///
/// ```
/// use lock_core::{HolderInfo, OwnerToken};
/// let token = OwnerToken::random().to_string();
/// let info = HolderInfo::new(token.clone(), None, None);
/// assert!(!format!("{info:?}").contains(&token));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's identity as stored (an owner token, or a foreign
    /// client's value such as a Redisson `uuid:threadId`).
    pub owner: String,
    /// The holder's fencing token, when the backend can tell.
    pub fence: Option<FencingToken>,
    /// Time left before the server expires the lease, when known.
    pub expires_in: Option<Duration>,
    /// Who took the lock, when it was taken with a description and the
    /// backend keeps one ([`Guarantees::holder_meta`]).
    pub meta: Option<HolderMeta>,
}

impl HolderInfo {
    /// A holder description.
    pub fn new(owner: String, fence: Option<FencingToken>, expires_in: Option<Duration>) -> Self {
        HolderInfo {
            owner,
            fence,
            expires_in,
            meta: None,
        }
    }

    /// The same description with the holder's metadata.
    pub fn with_meta(mut self, meta: Option<HolderMeta>) -> Self {
        self.meta = meta;
        self
    }
}

impl std::fmt::Debug for HolderInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let start: String = self.owner.chars().take(8).collect();
        let owner = if start.len() < self.owner.len() {
            format!("{start}…")
        } else {
            start
        };
        f.debug_struct("HolderInfo")
            .field("owner", &owner)
            .field("fence", &self.fence)
            .field("expires_in", &self.expires_in)
            .field("meta", &self.meta)
            .finish()
    }
}

/// The most locks one [`LockBackend::list`] call returns.
pub const MAX_LIST: usize = 10_000;

/// A lock service. One value is one client (connection pool, session); share
/// it behind an `Arc<dyn LockBackend>`.
///
/// Every method's future may be dropped at an `.await`: see each method's
/// "Cancel safety" section for what that leaves on the server.
///
/// # Answering in time
/// A backend's calls answer in bounded time even when the service stops
/// answering: `try_acquire`, `renew` and `release` within the client's
/// `op_timeout` (a retryable error otherwise), `acquire` within `req.wait`
/// plus one `op_timeout` (an attempt in flight when the wait ends may
/// finish; none starts after it). A call that makes several requests in a
/// row shares one deadline among them ([`call`](crate::call)), so a slow
/// service cannot stretch it to several `op_timeout`s. The conformance case
/// `calls_answer_in_time_when_the_service_is_cut_off` holds every backend
/// to it with its network cut.
#[async_trait]
pub trait LockBackend: Send + Sync + Debug + 'static {
    /// One attempt. `Ok(None)` means someone else holds the lock. Never waits
    /// for a holder.
    ///
    /// # Cancel safety
    /// Not cancel safe: if dropped after the request left, the lock may have
    /// been taken on the server with nobody holding the lease; it then stays
    /// taken until its TTL runs out.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError>;

    /// Waits up to `req.wait` for the lock, woken by the backend's own
    /// notifications; `Ok(None)` when the wait ran out.
    ///
    /// The default polls [`try_acquire`](LockBackend::try_acquire) with
    /// jittered exponential backoff (see [`crate::wait::poll_acquire`]).
    ///
    /// # Cancel safety
    /// Dropping the future while it waits leaves nothing behind (no queued
    /// entry, no subscription). Dropping it during an attempt is like
    /// dropping [`try_acquire`](LockBackend::try_acquire), unless the
    /// backend runs its retries through [`crate::wait::detached`], which
    /// undoes a retry that won for nobody.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        crate::wait::poll_acquire(self, req, crate::wait::Backoff::default()).await
    }

    /// Extends the lease by its TTL, measured from now.
    /// `Err(Lost)` if it is no longer ours; never re-creates an expired lock.
    ///
    /// # Cancel safety
    /// Cancel safe: a renew that was dropped either extended the lease or did
    /// not; the old lease's deadline stays valid either way.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError>;

    /// Renews several leases, in as few requests as the backend can; one
    /// result per lease, in the order given, each what
    /// [`renew`](LockBackend::renew) would have answered for it (a lease that
    /// is no longer ours is `Err(Lost)` without failing the others). The
    /// watchdog hands over the leases of one client that are due together.
    ///
    /// The default renews each lease by its own request, all at once.
    /// Backends that declare [`Guarantees::batch_renew`] send one request per
    /// batch (or per server a batch spans) instead.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`renew`](LockBackend::renew): each lease was extended
    /// or not, and its old deadline stays valid either way.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        renew_each(self, leases).await
    }

    /// Compare-owner-and-delete. Releasing a lease that is already released
    /// (or expired) with nobody granted the lock since is `Ok`; `Err(Lost)`
    /// if someone else holds the lock now (their lock is left untouched), or
    /// was granted it after this lease's last acquire or renew (a higher
    /// fence, row version or revision shows it): the caller's critical
    /// section may then have overlapped theirs.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release either happened or did not; the lock
    /// then expires at its TTL.
    async fn release(&self, lease: &Lease) -> Result<(), LockError>;

    /// Who holds `name` now.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError>;

    /// Removes the lock whoever holds it: an operator's escape hatch that
    /// breaks mutual exclusion if the holder is alive. Returns whether there
    /// was a lock to remove. Fencing tokens are not reset.
    ///
    /// # Cancel safety
    /// Cancel safe: the lock is either removed or not.
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            op: "force_release",
            backend: self.guarantees().backend,
        })
    }

    /// The held locks whose names start with `prefix` (empty: all), in name
    /// order, at most `limit` of them (capped at [`MAX_LIST`]). Only locks
    /// this library took are listed where foreign clients share the service
    /// (a foreign Redis key is indistinguishable from any other key).
    /// Backends that cannot enumerate return `Unsupported`
    /// ([`Guarantees::list`] says which).
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        let _ = (prefix, limit);
        Err(LockError::Unsupported {
            op: "list",
            backend: self.guarantees().backend,
        })
    }

    /// How many clients wait for the lock, as the server sees them (queued
    /// nodes or keys, subscribed connections); `None` when the backend
    /// cannot see its waiters ([`Guarantees::counts_waiters`] says which).
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>, LockError> {
        let _ = name;
        Ok(None)
    }

    /// How a waiter on this connection learns the lock is free, in a few
    /// words for `polylock status` and logs: the declared
    /// [`WaitMechanism`](crate::WaitMechanism), refined where the connection
    /// decides it (Redis: whether foreign releases are seen through keyspace
    /// notifications or polled).
    fn wake_mode(&self) -> String {
        self.guarantees().wait.describe().to_string()
    }

    /// What this backend promises.
    fn guarantees(&self) -> Guarantees;

    /// The lock space this client stamps its leases with, refusing any
    /// other space's lease with [`LockError::ForeignLease`] before any I/O
    /// ([`LockSpace`]); `None` for a backend that stamps nothing.
    fn lock_space(&self) -> Option<LockSpace> {
        None
    }
}

/// Refuses a [`LockBackend::list`] prefix no lock name could start with,
/// before any I/O, and caps `limit` at [`MAX_LIST`].
pub fn validate_list(prefix: &str, limit: usize) -> Result<usize, LockError> {
    if prefix.len() > LockName::MAX_LEN || prefix.contains('\0') {
        return Err(LockError::InvalidName {
            reason: format!(
                "a list prefix must be at most {} bytes with no NUL character",
                LockName::MAX_LEN
            ),
        });
    }
    Ok(limit.min(MAX_LIST))
}
