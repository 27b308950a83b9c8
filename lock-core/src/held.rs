//! The shared state of one network lease while guards hold it.

use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, Weak};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::LockBackend;
use crate::error::LockError;
use crate::lease::Lease;
use crate::observe::{self, Metrics};
use crate::owner::{BackendId, Registry};
use crate::watchdog::Scheduler;

/// The registry key of a backend client.
pub(crate) fn backend_id(backend: &Arc<dyn LockBackend>) -> BackendId {
    Arc::as_ptr(backend) as *const () as usize
}

/// One network lease, shared by the guards of its holds (one guard, or
/// several for a reentrant owner) and by its watchdog.
pub(crate) struct Held {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) backend_name: &'static str,
    pub(crate) metrics: Arc<Metrics>,
    /// The current lease; the watchdog publishes each renewal here and
    /// wakes `renewed`. A lock and a Notify rather than a watch channel:
    /// a watch allocates eight wake-up lists and walks them all when it is
    /// dropped, on every holding, for a value that changes once a renewal.
    lease: RwLock<Lease>,
    renewed: Notify,
    /// Fired once the lease is lost or its last hold starts to release: the
    /// holder must stop, and so must the watchdog's renewals of it. One
    /// token for both because they always end together, and a token costs
    /// an allocation to make and a wake-up pass to fire on every holding.
    pub(crate) gone: CancellationToken,
    state: Mutex<HoldState>,
    /// The owner's registry, for reentrant holders.
    registry: Option<Weak<Registry>>,
    /// The runtime the lease was taken on: where a renewal scheduler that
    /// died with another runtime is restarted.
    pub(crate) runtime: Option<Handle>,
    /// The scheduler renewing this lease. Held here, not only by the
    /// Locker, so that a guard is renewed for as long as it lives.
    scheduler: OnceLock<Arc<Scheduler>>,
}

struct HoldState {
    holds: usize,
    lost: bool,
    /// Whether a watchdog renews this lease (some hold asked for it).
    renewing: bool,
    watchdog: Option<AbortHandle>,
}

impl Held {
    /// A lease's revocation signal (a closed session, a keepalive answering
    /// TTL 0) needs no task of its own: `is_held`, `lost()` (`wait_gone`)
    /// and the watchdog each look at it, and the first to see it records
    /// the loss. A task per holding would cost a spawn and two wake-ups on
    /// every acquisition of the backends that revoke.
    pub(crate) fn new(
        backend: Arc<dyn LockBackend>,
        lease: Lease,
        registry: Option<&Arc<Registry>>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let backend_name = backend.guarantees().backend;
        Arc::new(Held {
            backend,
            backend_name,
            metrics,
            lease: RwLock::new(lease),
            renewed: Notify::new(),
            gone: CancellationToken::new(),
            state: Mutex::new(HoldState {
                holds: 1,
                lost: false,
                renewing: false,
                watchdog: None,
            }),
            registry: registry.map(Arc::downgrade),
            runtime: Handle::try_current().ok(),
            scheduler: OnceLock::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        // Every critical section only reads or assigns plain fields.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn current(&self) -> Lease {
        self.lease().clone()
    }

    /// The current lease, borrowed: for reading a field or two without
    /// cloning. Never keep it across another call on this `Held`: a second
    /// read can deadlock behind a renewal waiting to write.
    pub(crate) fn lease(&self) -> RwLockReadGuard<'_, Lease> {
        // Writers only assign a whole lease; a poisoned lock still holds one.
        self.lease.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_watchdog(&self, handle: AbortHandle) {
        self.state().watchdog = Some(handle);
    }

    /// Records that a watchdog renews this lease from now on; false if one
    /// already does (or the lease is over), so it is watched at most once.
    pub(crate) fn start_renewing(&self) -> bool {
        let mut s = self.state();
        if s.renewing || s.holds == 0 || s.lost {
            return false;
        }
        s.renewing = true;
        true
    }

    /// Keeps `scheduler` alive while this lease is.
    pub(crate) fn keep_scheduler(&self, scheduler: Arc<Scheduler>) {
        let _ = self.scheduler.set(scheduler);
    }

    /// Adds a reentrant hold; false if the lease is already gone or fully
    /// released.
    pub(crate) fn add_hold(&self) -> bool {
        if !self.is_held() {
            return false;
        }
        let mut s = self.state();
        if s.holds == 0 || s.lost {
            return false;
        }
        s.holds += 1;
        true
    }

    pub(crate) fn holds(&self) -> usize {
        self.state().holds
    }

    /// Drops one hold. Returns the lease to release on the server when that
    /// was the last hold. Then, before this returns and so before any I/O,
    /// the watchdog is stopped and `gone` fires: whoever watches the signal
    /// stops as soon as the release starts, even if the release future is
    /// dropped or its round trip hangs.
    pub(crate) fn drop_hold(&self) -> Option<Lease> {
        // Latch a loss that nobody observed yet, so the release reports it.
        let _ = self.is_held();
        let mut s = self.state();
        s.holds = s.holds.saturating_sub(1);
        if s.holds > 0 {
            return None;
        }
        if let Some(w) = s.watchdog.take() {
            w.abort();
        }
        drop(s);
        self.gone.cancel();
        let lease = self.current();
        if let Some(reg) = self.registry.as_ref().and_then(Weak::upgrade) {
            reg.remove(backend_id(&self.backend), lease.name(), self);
        }
        Some(lease)
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
            self.metrics.lost();
        }
        self.gone.cancel();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.state().lost
    }

    /// True while the lease is ours as far as this process can tell: not
    /// lost, not released, not revoked, and before the local deadline.
    /// Once false it stays false: a deadline or revocation seen here is
    /// recorded as a loss, and a later renewal does not undo it.
    pub(crate) fn is_held(&self) -> bool {
        if self.gone.is_cancelled() {
            return false;
        }
        // Checked on a borrow, not a clone: this runs several times per
        // holding. The borrow ends before mark_lost reads the lease again.
        let (expired, revoked) = {
            let lease = self.lease();
            (lease.is_expired(), lease.is_revoked())
        };
        if expired {
            self.mark_lost("local deadline passed without a renewal");
            return false;
        }
        if revoked {
            self.mark_lost("the backend revoked the lease");
            return false;
        }
        true
    }

    /// Publishes a renewal, unless the lease was lost or released meanwhile
    /// or its deadline passed before the renewal came back: then the
    /// renewal does not revive it and the answer is `Err(Lost)`.
    pub(crate) fn publish_renewal(&self, renewed: Lease) -> Result<(), LockError> {
        let s = self.state();
        if s.lost || self.gone.is_cancelled() {
            return Err(self.lost_error());
        }
        if self.current().is_expired() {
            drop(s);
            self.mark_lost("the renewal answered after the local deadline");
            return Err(self.lost_error());
        }
        // A renewal by hand may have published a later one meanwhile.
        let newer = {
            let mut cur = self.lease.write().unwrap_or_else(|p| p.into_inner());
            let newer = renewed.sent_at() >= cur.sent_at();
            if newer {
                *cur = renewed;
            }
            newer
        };
        if newer {
            self.renewed.notify_waiters();
        }
        Ok(())
    }

    pub(crate) fn lost_error(&self) -> LockError {
        LockError::Lost {
            name: self.current().name().to_string(),
        }
    }

    /// One renewal now, for leases renewed by hand: `Err(Lost)` if the
    /// lease is gone (and it then stays gone), a retryable error if the
    /// backend failed (the lease is still good until its deadline).
    pub(crate) async fn renew_now(&self) -> Result<(), LockError> {
        if !self.is_held() {
            return Err(self.lost_error());
        }
        let lease = self.current();
        let span = observe::span!(
            DEBUG,
            "polylock.renew",
            backend = self.backend_name,
            name = %lease.name(),
            fence = lease.fence().get(),
        );
        let attempt = tokio::select! {
            _ = self.gone.cancelled() => return Err(self.lost_error()),
            r = timeout_at(lease.deadline(), self.backend.renew(&lease)).instrument(span) => r,
        };
        match attempt {
            Ok(Ok(renewed)) => self.publish_renewal(renewed),
            Ok(Err(e)) if e.is_lost() => {
                self.mark_lost("the backend reports the lease is no longer ours");
                Err(e)
            }
            Ok(Err(e)) => {
                self.metrics.renew_failed();
                Err(e)
            }
            Err(_elapsed) => {
                self.metrics.renew_failed();
                // The deadline this call started with; the watchdog may
                // have moved it meanwhile, and is_held records the loss
                // only if not.
                if self.is_held() {
                    Err(LockError::transient(
                        self.backend_name,
                        "the renewal got no answer before the lease's earlier deadline; \
                         the lease was renewed meanwhile",
                    ))
                } else {
                    Err(self.lost_error())
                }
            }
        }
    }

    /// Completes when the lease is lost, revoked, its last hold starts to
    /// release, or it is past its local deadline without a renewal. Cancel
    /// safe.
    pub(crate) async fn wait_gone(&self) {
        loop {
            // Registered before the lease is read, so that a renewal
            // published in between still ends this round.
            let renewed = self.renewed.notified();
            tokio::pin!(renewed);
            renewed.as_mut().enable();
            // Also records a loss once the deadline has passed.
            if !self.is_held() {
                return;
            }
            let (deadline, revoked) = {
                let lease = self.lease();
                (lease.deadline(), lease.revocation().cloned())
            };
            let revoked = async move {
                match revoked {
                    Some(t) => t.cancelled_owned().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.gone.cancelled() => return,
                _ = revoked => {
                    self.mark_lost("the backend revoked the lease");
                    return;
                }
                // A renewal moved the deadline: wait for the new one.
                _ = &mut renewed => {}
                // The next round's is_held decides: lost, unless a renewal
                // was published just now.
                _ = sleep_until(deadline) => {}
            }
        }
    }

    /// Releases `lease` on the server. Returns `Err(Lost)` when the lease
    /// had been lost before the release, even if the server-side cleanup
    /// succeeded, so the caller learns that its critical section may have
    /// overlapped another holder's; and whatever the backend answered
    /// otherwise (its own `Err(Lost)` included).
    pub(crate) async fn release_on_server(&self, lease: Lease) -> Result<(), LockError> {
        let was_lost = self.is_lost() || lease.is_expired() || lease.is_revoked();
        // Normally fired by drop_hold already; a no-op then.
        self.gone.cancel();
        let span = observe::span!(
            DEBUG,
            "polylock.release",
            backend = self.backend_name,
            name = %lease.name(),
            fence = lease.fence().get()
        );
        let result = self.backend.release(&lease).instrument(span).await;
        self.metrics.released();
        match result {
            // The loss is what the caller must hear about (its critical
            // section may have overlapped another holder's), also when the
            // release could not reach the server to clean up.
            Err(e) if was_lost => {
                tracing::debug!(error = %e, "polylock: release after a loss failed");
                Err(LockError::Lost {
                    name: lease.name().to_string(),
                })
            }
            Ok(()) if was_lost => Err(LockError::Lost {
                name: lease.name().to_string(),
            }),
            other => other,
        }
    }
}
