//! The guard a holder keeps while it holds a lock.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::error::LockError;
use crate::held::Held;
use crate::lease::Lease;
use crate::name::LockName;
use crate::token::FencingToken;

/// Proof of holding a lock, with its watchdog.
///
/// While the guard lives, a watchdog renews the lease at a third of its TTL
/// (or at half the time it is trusted, when that comes first:
/// [`Lease::renewal_due`](crate::Lease::renewal_due); unless disabled on the builder; then [`renew`](LockGuard::renew) it by
/// hand), even after the [`Locker`](crate::Locker) that made it is dropped. Check [`is_held`](LockGuard::is_held)
/// before acting, race critical work against [`lost`](LockGuard::lost), and
/// pass [`fence`](LockGuard::fence) to every system you write to.
///
/// Release it with [`release`](LockGuard::release) to learn whether the
/// holding ended cleanly. Dropping it also releases, without blocking: the
/// release is handed to the running tokio runtime, or, with no runtime, left
/// to the TTL.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    held: Arc<Held>,
    /// Set once this guard's hold was given back, so Drop does nothing.
    done: bool,
}

impl LockGuard {
    pub(crate) fn new(held: Arc<Held>) -> Self {
        LockGuard { held, done: false }
    }

    /// The fencing token of this holding.
    pub fn fence(&self) -> FencingToken {
        self.held.current().fence()
    }

    /// The lock name.
    pub fn name(&self) -> LockName {
        self.held.current().name().clone()
    }

    /// The current lease (as last renewed).
    pub fn lease(&self) -> Lease {
        self.held.current()
    }

    /// How many holds share this lease (more than one for a reentrant owner).
    pub fn holds(&self) -> usize {
        self.held.holds()
    }

    /// Whether the lock is still ours as far as this process can tell: not
    /// lost, not revoked by the backend, not being released, and before the
    /// lease's local deadline. Once false, it stays false: a renewal that
    /// comes back after the deadline does not revive it.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// Completes when the lock is lost: the backend said the lease is no
    /// longer ours (at a renewal, or on its own through the lease's
    /// revocation signal), renewals failed until the deadline, or the
    /// deadline passed. It also completes when the last hold of the lease
    /// starts to release (before the release's I/O). Completes at once if
    /// any of that already happened.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing, and a new call
    /// waits again.
    pub async fn lost(&self) {
        self.held.wait_gone().await
    }

    /// An owned future of [`lost`](LockGuard::lost), for handing to another
    /// task. It also completes as soon as the guard (its lease's last hold)
    /// starts to release or is dropped: before the release's round trip,
    /// and even if the `release()` future is then dropped.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lost`](LockGuard::lost).
    pub fn lost_signal(&self) -> impl Future<Output = ()> + Send + 'static {
        let held = Arc::clone(&self.held);
        async move { held.wait_gone().await }
    }

    /// Extends the lease by its TTL now, for leases taken with
    /// `auto_renew(false)` (harmless with the watchdog on). `Err(Lost)` if
    /// the lease is gone (lost, revoked, released, or past its local
    /// deadline; it then stays gone); another error if the backend failed,
    /// in which case the lease is still good until its deadline and the
    /// renewal may be tried again.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped renewal either extended the lease on the
    /// server or did not; the guard keeps its last known deadline.
    pub async fn renew(&self) -> Result<(), LockError> {
        self.held.renew_now().await
    }

    /// Gives back this hold; the lock is released on the server when it was
    /// the last hold of the lease. `Err(Lost)` when the lock had already been
    /// lost, or the backend reports it was granted to someone else: the
    /// critical section may have overlapped another holder's. A re-entrant
    /// hold that is not the last one also says `Err(Lost)` then.
    ///
    /// # Cancel safety
    /// Cancel safe: the watchdog is stopped and the lost signal fired before
    /// any I/O; if the future is dropped before the server answered, the
    /// lock is released or expires at its TTL.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.done = true;
        let was_held = self.held.is_held();
        match self.held.drop_hold() {
            Some(lease) => self.held.release_on_server(lease).await,
            None if was_held => Ok(()),
            None => Err(self.held.lost_error()),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let Some(lease) = self.held.drop_hold() else {
            return;
        };
        // With no runtime to run the release on, the lease expires at its
        // TTL; drop_hold already closed the signal.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let held = Arc::clone(&self.held);
            rt.spawn(async move {
                if let Err(e) = held.release_on_server(lease).await {
                    tracing::debug!(error = %e, "polylock: release on drop failed");
                }
            });
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lease = self.held.current();
        f.debug_struct("LockGuard")
            .field("backend", &self.held.backend_name)
            .field("name", lease.name())
            .field("fence", &lease.fence())
            .field("held", &self.is_held())
            .finish()
    }
}
