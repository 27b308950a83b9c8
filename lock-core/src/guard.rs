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
/// (unless disabled on the builder). Check [`is_held`](LockGuard::is_held)
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
    /// lost, and before the lease's local deadline. Once false, it stays
    /// false.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// Completes when the lock is lost: the backend said the lease is no
    /// longer ours, renewals failed until the deadline, or the deadline
    /// passed. Completes at once if that already happened.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing, and a new call
    /// waits again.
    pub async fn lost(&self) {
        self.held.wait_gone().await
    }

    /// An owned future of [`lost`](LockGuard::lost), for handing to another
    /// task. It also completes when the guard is released or dropped.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lost`](LockGuard::lost).
    pub fn lost_signal(&self) -> impl Future<Output = ()> + Send + 'static {
        let held = Arc::clone(&self.held);
        async move { held.wait_gone().await }
    }

    /// Gives back this hold; the lock is released on the server when it was
    /// the last hold of the lease. `Err(Lost)` when the lock had already been
    /// lost: the critical section may have overlapped another holder's.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before the server answered, the
    /// lock is released or expires at its TTL; the watchdog is already
    /// stopped.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.done = true;
        match self.held.drop_hold() {
            Some(lease) => self.held.release_on_server(lease).await,
            None => Ok(()),
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
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let held = Arc::clone(&self.held);
                rt.spawn(async move {
                    if let Err(e) = held.release_on_server(lease).await {
                        tracing::debug!(error = %e, "polylock: release on drop failed");
                    }
                });
            }
            Err(_) => {
                // No runtime to run the release on: the lease expires at its
                // TTL. Close the signal so nobody acts on it meanwhile.
                self.held.gone.cancel();
            }
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
