//! The in-process reference backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{validate_list, AcquireRequest, HolderInfo, LockBackend};
use crate::error::LockError;
use crate::guarantees::{ExpiryClock, FencingGuarantee, Guarantees, WaitMechanism};
use crate::lease::Lease;
use crate::meta::HolderMeta;
use crate::name::LockName;
use crate::space::LockSpace;
use crate::token::{FencingToken, OwnerToken};
use crate::wait::{acquire_loop, Backoff};

/// A lock service inside this process: the full contract (TTLs, fencing,
/// owner checks, wake-ups) with no server. Clones share one lock table, so
/// each clone acts as another client of the same service.
///
/// It is the reference the conformance suite always runs, and a fine choice
/// for tests and single-process programs. It does not coordinate processes.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::{Locker, MemoryBackend};
/// let locker = Locker::new(MemoryBackend::new());
/// let guard = locker.lock("report").acquire().await?;
/// assert_eq!(guard.fence().get(), 1);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

/// A table's lock space: its own, shared by the clones of its backend.
#[derive(Debug)]
struct OwnSpace(LockSpace);

impl Default for OwnSpace {
    fn default() -> Self {
        OwnSpace(LockSpace::unique())
    }
}

#[derive(Debug, Default)]
struct Inner {
    space: OwnSpace,
    table: Mutex<Table>,
    released: Notify,
    /// Acquire calls waiting, per name.
    waiting: Mutex<HashMap<LockName, Arc<AtomicUsize>>>,
}

#[derive(Debug, Default)]
struct Table {
    held: HashMap<LockName, Entry>,
    /// Last fencing token per name; never reset, like a persistent counter.
    fences: HashMap<LockName, u64>,
}

#[derive(Debug)]
struct Entry {
    owner: OwnerToken,
    fence: FencingToken,
    expires_at: Instant,
    meta: Option<HolderMeta>,
}

impl Entry {
    fn holder(&self, now: Instant) -> HolderInfo {
        HolderInfo::new(
            self.owner.to_string(),
            Some(self.fence),
            Some(self.expires_at.saturating_duration_since(now)),
        )
        .with_meta(self.meta.clone())
    }
}

/// Counts one waiting acquire for as long as it lives.
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Table {
    /// The live entry for `name`, dropping it first if its TTL ran out.
    fn live(&mut self, name: &LockName, now: Instant) -> Option<&mut Entry> {
        if self.held.get(name).is_some_and(|e| e.expires_at <= now) {
            self.held.remove(name);
        }
        self.held.get_mut(name)
    }
}

impl MemoryBackend {
    /// An empty lock table.
    pub fn new() -> Self {
        Self::default()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding this mutex cannot leave the table half
        // updated (every mutation is a single insert or remove), so a
        // poisoned lock is still consistent.
        self.inner
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let sent_at = Instant::now();
        let mut t = self.table();
        if t.live(&req.name, sent_at).is_some() {
            return Ok(None);
        }
        let counter = t.fences.entry(req.name.clone()).or_insert(0);
        *counter += 1;
        let fence = FencingToken::new(*counter).expect("counter starts above zero");
        t.held.insert(
            req.name.clone(),
            Entry {
                owner: req.owner,
                fence,
                expires_at: crate::lease::later(sent_at, req.ttl),
                meta: req.meta.clone(),
            },
        );
        Ok(Some(
            req.lease(fence, req.ttl, sent_at)
                .in_space(self.inner.space.0),
        ))
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let backoff = req.backoff_or(Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(20),
        });
        let _waiting = (!req.wait.is_zero()).then(|| {
            let mut w = self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
            let n = Arc::clone(w.entry(req.name.clone()).or_default());
            n.fetch_add(1, Ordering::Relaxed);
            Waiting(n)
        });
        acquire_loop(
            || self.try_acquire(req),
            req.wait_deadline(),
            backoff,
            || {
                let mut wake = Box::pin(self.inner.released.notified());
                // Registered now, before the attempt, so a release in between is
                // not missed.
                wake.as_mut().enable();
                wake
            },
        )
        .await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.inner.space.0.check(lease)?;
        let sent_at = Instant::now();
        let mut t = self.table();
        match t.live(lease.name(), sent_at) {
            Some(e) if e.owner == lease.owner() && e.fence == lease.fence() => {
                e.expires_at = crate::lease::later(sent_at, lease.renewal_ttl());
                Ok(lease.renewed(lease.renewal_ttl(), sent_at))
            }
            _ => Err(LockError::Lost {
                name: lease.name().to_string(),
            }),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.inner.space.0.check(lease)?;
        let now = Instant::now();
        let mut t = self.table();
        // Someone else was granted the lock since this lease was (a higher
        // fence was handed out).
        let superseded = t
            .fences
            .get(lease.name())
            .is_some_and(|&f| f > lease.fence().get());
        match t.live(lease.name(), now) {
            // Already released or expired: fine, unless it was superseded,
            // so the holder learns its critical section may have overlapped
            // another holder's.
            None if superseded => Err(LockError::Lost {
                name: lease.name().to_string(),
            }),
            None => Ok(()),
            Some(e) if e.owner == lease.owner() && e.fence == lease.fence() => {
                t.held.remove(lease.name());
                drop(t);
                self.inner.released.notify_waiters();
                Ok(())
            }
            Some(_) => Err(LockError::Lost {
                name: lease.name().to_string(),
            }),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        let now = Instant::now();
        let mut t = self.table();
        Ok(t.live(name, now).map(|e| e.holder(now)))
    }

    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        let limit = validate_list(prefix, limit)?;
        let now = Instant::now();
        let t = self.table();
        let mut out: Vec<_> = t
            .held
            .iter()
            .filter(|(name, e)| name.as_str().starts_with(prefix) && e.expires_at > now)
            .map(|(name, e)| (name.clone(), e.holder(now)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.truncate(limit);
        Ok(out)
    }

    async fn waiters(&self, name: &LockName) -> Result<Option<usize>, LockError> {
        let w = self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        // The holder's own acquire call is still counted until it returns;
        // a granted waiter leaves the count as its call completes.
        Ok(Some(w.get(name).map_or(0, |n| n.load(Ordering::Relaxed))))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        let now = Instant::now();
        let mut t = self.table();
        let existed = t.live(name, now).is_some();
        t.held.remove(name);
        drop(t);
        self.inner.released.notify_waiters();
        Ok(existed)
    }

    /// The table's own space: a lease of another table is refused.
    fn lock_space(&self) -> Option<LockSpace> {
        Some(self.inner.space.0)
    }

    fn guarantees(&self) -> Guarantees {
        let mut g = Guarantees::new("memory");
        g.fencing = FencingGuarantee::Strict;
        g.expiry_clock = ExpiryClock::Local;
        g.survives_restart = false;
        g.survives_failover = false;
        g.wait = WaitMechanism::InProcess;
        g.force_release = true;
        g.holder_meta = true;
        g.list = true;
        g.counts_waiters = true;
        g
    }
}
