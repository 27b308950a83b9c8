//! The shared state of one network lease while guards hold it.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::LockBackend;
use crate::error::LockError;
use crate::lease::Lease;
use crate::observe;
use crate::owner::{BackendId, Registry};

/// The registry key of a backend client.
pub(crate) fn backend_id(backend: &Arc<dyn LockBackend>) -> BackendId {
    Arc::as_ptr(backend) as *const () as usize
}

/// One network lease, shared by the guards of its holds (one guard, or
/// several for a reentrant owner) and by its watchdog.
pub(crate) struct Held {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) backend_name: &'static str,
    /// The current lease; the watchdog publishes each renewal here.
    pub(crate) lease: watch::Sender<Lease>,
    /// Fired once the lease is lost or released: the holder must stop.
    pub(crate) gone: CancellationToken,
    /// Stops the watchdog.
    pub(crate) stop: CancellationToken,
    state: Mutex<HoldState>,
    /// The owner's registry, for reentrant holders.
    registry: Option<Weak<Registry>>,
}

struct HoldState {
    holds: usize,
    lost: bool,
    watchdog: Option<AbortHandle>,
}

impl Held {
    pub(crate) fn new(
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        registry: Option<&Arc<Registry>>,
    ) -> Arc<Self> {
        let backend_name = backend.guarantees().backend;
        Arc::new(Held {
            backend,
            backend_name,
            lease: watch::Sender::new(lease),
            gone: CancellationToken::new(),
            stop: CancellationToken::new(),
            state: Mutex::new(HoldState {
                holds: 1,
                lost: false,
                watchdog: None,
            }),
            registry: registry.map(Arc::downgrade),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        // Every critical section only reads or assigns plain fields.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn current(&self) -> Lease {
        self.lease.borrow().clone()
    }

    pub(crate) fn set_watchdog(&self, handle: AbortHandle) {
        self.state().watchdog = Some(handle);
    }

    /// Adds a reentrant hold; false if the lease is already gone or fully
    /// released.
    pub(crate) fn add_hold(&self) -> bool {
        let mut s = self.state();
        if s.holds == 0 || s.lost || self.gone.is_cancelled() || self.current().is_expired() {
            return false;
        }
        s.holds += 1;
        true
    }

    pub(crate) fn holds(&self) -> usize {
        self.state().holds
    }

    /// Drops one hold. Returns the lease to release on the server when that
    /// was the last hold; the watchdog is stopped before this returns.
    pub(crate) fn drop_hold(&self) -> Option<Lease> {
        let mut s = self.state();
        s.holds = s.holds.saturating_sub(1);
        if s.holds > 0 {
            return None;
        }
        self.stop.cancel();
        if let Some(w) = s.watchdog.take() {
            w.abort();
        }
        drop(s);
        if let Some(reg) = self.registry.as_ref().and_then(Weak::upgrade) {
            reg.remove(backend_id(&self.backend), self.current().name(), self);
        }
        Some(self.current())
    }

    /// Records that the lease is gone while still held; fires `lost()`.
    pub(crate) fn mark_lost(&self, reason: &str) {
        let newly = {
            let mut s = self.state();
            let newly = !s.lost && s.holds > 0;
            s.lost = true;
            newly
        };
        if newly {
            let lease = self.current();
            tracing::warn!(
                backend = self.backend_name,
                name = %lease.name(),
                fence = lease.fence().get(),
                reason,
                "polylock: lock lost"
            );
            observe::lost(self.backend_name);
        }
        self.stop.cancel();
        self.gone.cancel();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.state().lost
    }

    /// True while the lease is ours as far as this process can tell: not
    /// lost, not released, and before the local deadline.
    pub(crate) fn is_held(&self) -> bool {
        !self.gone.is_cancelled() && !self.current().is_expired()
    }

    /// Completes when the lease is lost, released, or past its local
    /// deadline without a renewal. Cancel safe.
    pub(crate) async fn wait_gone(&self) {
        let mut rx = self.lease.subscribe();
        loop {
            let deadline: Instant = rx.borrow_and_update().deadline();
            tokio::select! {
                _ = self.gone.cancelled() => return,
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = sleep_until(deadline) => {
                    if !rx.has_changed().unwrap_or(false) {
                        self.mark_lost("local deadline passed without a renewal");
                        return;
                    }
                }
            }
        }
    }

    /// Releases `lease` on the server and closes the signal. Returns
    /// `Err(Lost)` when the lease had been lost before the release, even if
    /// the server-side cleanup succeeded, so the caller learns that its
    /// critical section may have overlapped another holder's.
    pub(crate) async fn release_on_server(&self, lease: Lease) -> Result<(), LockError> {
        let was_lost = self.is_lost() || lease.is_expired();
        let span = tracing::debug_span!(
            "polylock.release",
            backend = self.backend_name,
            name = %lease.name(),
            fence = lease.fence().get()
        );
        let result = self.backend.release(&lease).instrument(span).await;
        self.gone.cancel();
        observe::released(self.backend_name);
        match result {
            Ok(()) if was_lost => Err(LockError::Lost {
                name: lease.name().to_string(),
            }),
            other => other,
        }
    }
}
