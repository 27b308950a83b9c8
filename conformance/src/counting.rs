//! A pass-through backend that counts calls, so cases can assert that bad
//! input caused no I/O and that a stopped watchdog renews no more.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{
    AcquireRequest, Guarantees, HolderInfo, Lease, LockBackend, LockError, LockName, LockSpace,
};

/// Counts every call, then delegates to the real client.
#[derive(Debug)]
pub struct Counting {
    inner: Arc<dyn LockBackend>,
    calls: AtomicUsize,
    renews: AtomicUsize,
    batches: AtomicUsize,
}

impl Counting {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Counting {
            inner,
            calls: AtomicUsize::new(0),
            renews: AtomicUsize::new(0),
            batches: AtomicUsize::new(0),
        })
    }

    /// Calls of any kind so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Renew calls so far.
    pub fn renews(&self) -> usize {
        self.renews.load(Ordering::SeqCst)
    }

    /// `renew_many` calls so far (their leases count in [`renews`](Self::renews)).
    pub fn batches(&self) -> usize {
        self.batches.load(Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl LockBackend for Counting {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.count();
        self.inner.try_acquire(req).await
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.count();
        self.inner.acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.count();
        self.renews.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(lease).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.count();
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.renews.fetch_add(leases.len(), Ordering::SeqCst);
        self.inner.renew_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.count();
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        self.count();
        self.inner.inspect(name).await
    }
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        self.count();
        self.inner.force_release(name).await
    }
    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        self.count();
        self.inner.list(prefix, limit).await
    }
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>, LockError> {
        self.count();
        self.inner.waiters(name).await
    }
    fn wake_mode(&self) -> String {
        self.inner.wake_mode()
    }
    fn lock_space(&self) -> Option<LockSpace> {
        self.inner.lock_space()
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
}
