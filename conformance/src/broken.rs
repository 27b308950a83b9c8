//! Deliberately broken backends: a test of the suite itself.
//!
//! Each [`Flaw`] is one way a real backend has gone wrong (or could):
//! wrapped around the in-memory reference backend, it must fail at least one
//! case of the suite, or the suite has a blind spot. `tests/broken.rs` runs
//! every case against every flaw.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::wait::{poll_acquire, Backoff};
use lock_core::{
    AcquireRequest, FencingToken, Guarantees, HolderInfo, Lease, LockBackend, LockError, LockName,
    LockSpace, MemoryBackend,
};
use tokio::time::{sleep, Instant};

use crate::fixture::{Fixture, Link};

/// One defect to build into the reference backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// No defect: the reference backend itself, behind the same wrapper,
    /// as the baseline a flaw is compared with.
    None,
    /// Release and renew do not compare the owner: anyone's release frees
    /// the lock.
    NoOwnerCheck,
    /// The server expires leases at 0.9 of the TTL the client was told.
    ExpiresEarly,
    /// The local deadline is counted from the reply, not from the send.
    DeadlineAtReceipt,
    /// Declares an in-process wake-up but only polls.
    NoWakeUp,
    /// Fencing tokens repeat (1, 2, 1, 2, ...).
    FenceReuse,
    /// Release says `Ok` although the lease was no longer ours.
    ReleaseIgnoresLoss,
}

impl Flaw {
    fn label(self) -> &'static str {
        match self {
            Flaw::None => "memory-reference",
            Flaw::NoOwnerCheck => "broken-no-owner-check",
            Flaw::ExpiresEarly => "broken-expires-early",
            Flaw::DeadlineAtReceipt => "broken-deadline-at-receipt",
            Flaw::NoWakeUp => "broken-no-wake-up",
            Flaw::FenceReuse => "broken-fence-reuse",
            Flaw::ReleaseIgnoresLoss => "broken-release-ignores-loss",
        }
    }
}

/// The reference backend with one flaw. `latency` is simulated network
/// delay each way (only [`Flaw::DeadlineAtReceipt`] clients have one).
#[derive(Debug)]
struct Broken {
    inner: MemoryBackend,
    flaw: Flaw,
    latency: Duration,
}

fn lost(name: &LockName) -> LockError {
    LockError::Lost {
        name: name.to_string(),
    }
}

impl Broken {
    /// A holder as this wrapper's clients see it: with reused fences when
    /// that is the flaw.
    fn shown(&self, i: HolderInfo) -> HolderInfo {
        if self.flaw != Flaw::FenceReuse {
            return i;
        }
        let reused = i
            .fence
            .and_then(|f| FencingToken::new((f.get() - 1) % 2 + 1));
        HolderInfo::new(i.owner, reused, i.expires_in).with_meta(i.meta)
    }

    /// The lease the inner backend knows, from one this wrapper handed out.
    fn inner_lease(&self, lease: &Lease) -> Lease {
        let (fence, ttl) = match self.flaw {
            // The real fence rides along in the backend key.
            Flaw::FenceReuse => (
                lease
                    .backend_key()
                    .and_then(|k| k.parse().ok())
                    .and_then(FencingToken::new)
                    .unwrap_or(lease.fence()),
                lease.ttl(),
            ),
            Flaw::ExpiresEarly => (lease.fence(), lease.ttl().mul_f64(0.9)),
            _ => (lease.fence(), lease.ttl()),
        };
        Lease::new(
            lease.name().clone(),
            lease.owner(),
            fence,
            ttl,
            lease.sent_at(),
            lease.policy(),
        )
    }

    /// The lease to hand out for one the inner backend granted for `asked`.
    fn outer_lease(&self, inner: Lease, asked: Duration) -> Lease {
        match self.flaw {
            Flaw::FenceReuse => {
                let real = inner.fence().get();
                let reused = FencingToken::new((real - 1) % 2 + 1).expect("non-zero");
                Lease::new(
                    inner.name().clone(),
                    inner.owner(),
                    reused,
                    inner.ttl(),
                    inner.sent_at(),
                    inner.policy(),
                )
                .with_backend_key(real.to_string())
            }
            Flaw::ExpiresEarly => Lease::new(
                inner.name().clone(),
                inner.owner(),
                inner.fence(),
                asked,
                inner.sent_at(),
                inner.policy(),
            ),
            Flaw::DeadlineAtReceipt => Lease::new(
                inner.name().clone(),
                inner.owner(),
                inner.fence(),
                inner.ttl(),
                Instant::now(),
                inner.policy(),
            ),
            _ => inner,
        }
    }

    async fn travel(&self) {
        if !self.latency.is_zero() {
            sleep(self.latency).await;
        }
    }
}

#[async_trait]
impl LockBackend for Broken {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let mut inner_req = req.clone();
        if self.flaw == Flaw::ExpiresEarly {
            inner_req.ttl = req.ttl.mul_f64(0.9);
        }
        self.travel().await;
        let granted = self.inner.try_acquire(&inner_req).await?;
        self.travel().await;
        Ok(granted.map(|l| self.outer_lease(l, req.ttl)))
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        if self.flaw == Flaw::NoWakeUp {
            return poll_acquire(self, req, Backoff::default()).await;
        }
        let mut inner_req = req.clone();
        if self.flaw == Flaw::ExpiresEarly {
            inner_req.ttl = req.ttl.mul_f64(0.9);
        }
        let granted = self.inner.acquire(&inner_req).await?;
        Ok(granted.map(|l| self.outer_lease(l, req.ttl)))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        if self.flaw == Flaw::NoOwnerCheck {
            // Extends whatever holds the name.
            if self.inner.inspect(lease.name()).await?.is_none() {
                return Err(lost(lease.name()));
            }
            return Ok(lease.renewed(lease.ttl(), Instant::now()));
        }
        self.travel().await;
        let renewed = self.inner.renew(&self.inner_lease(lease)).await?;
        self.travel().await;
        Ok(self.outer_lease(renewed, lease.ttl()))
    }

    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        match self.flaw {
            Flaw::NoOwnerCheck => self.inner.force_release(lease.name()).await.map(|_| ()),
            Flaw::ReleaseIgnoresLoss => match self.inner.release(&self.inner_lease(lease)).await {
                Err(e) if e.is_lost() => Ok(()),
                other => other,
            },
            _ => self.inner.release(&self.inner_lease(lease)).await,
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        Ok(self.inner.inspect(name).await?.map(|i| self.shown(i)))
    }

    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        let listed = self.inner.list(prefix, limit).await?;
        Ok(listed
            .into_iter()
            .map(|(n, i)| (n, self.shown(i)))
            .collect())
    }

    async fn waiters(&self, name: &LockName) -> Result<Option<usize>, LockError> {
        self.inner.waiters(name).await
    }

    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        self.inner.force_release(name).await
    }

    fn lock_space(&self) -> Option<LockSpace> {
        self.inner.lock_space()
    }

    fn guarantees(&self) -> Guarantees {
        let mut g = self.inner.guarantees();
        g.backend = self.flaw.label();
        g
    }
}

/// A fixture serving clients of one flawed table.
pub struct BrokenFixture {
    table: MemoryBackend,
    flaw: Flaw,
}

impl BrokenFixture {
    /// The unflawed reference backend behind the same wrapper.
    pub fn reference() -> Arc<Self> {
        Self::new(Flaw::None)
    }

    /// A fresh table with `flaw`.
    pub fn new(flaw: Flaw) -> Arc<Self> {
        Arc::new(BrokenFixture {
            table: MemoryBackend::new(),
            flaw,
        })
    }

    fn broken(&self, latency: Duration) -> Arc<dyn LockBackend> {
        Arc::new(Broken {
            inner: self.table.clone(),
            flaw: self.flaw,
            latency,
        })
    }
}

#[async_trait]
impl Fixture for BrokenFixture {
    fn guarantees(&self) -> Guarantees {
        self.broken(Duration::ZERO).guarantees()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(self.broken(Duration::ZERO))
    }

    async fn client_with_reply_delay(
        &self,
        delay: Duration,
    ) -> Result<Option<(Arc<dyn LockBackend>, Link)>, LockError> {
        // Only this flaw's clients talk over a (simulated) network, which
        // no proxy carries; the others are as in-process as the reference
        // backend.
        Ok((self.flaw == Flaw::DeadlineAtReceipt).then(|| (self.broken(delay), Link::default())))
    }
}
