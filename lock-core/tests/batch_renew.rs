//! The watchdog renews the leases of one client that are due together in
//! batches, where the backend declares it can, and handles each lease's
//! answer as a single renewal's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    AcquireRequest, Guarantees, HolderInfo, Lease, LockBackend, LockError, LockName, Locker,
    MemoryBackend,
};

/// The in-memory backend, declaring batched renewals (or not) and recording
/// every `renew_many` and `renew` call; names in `failing` answer a
/// retryable error inside a batch.
#[derive(Debug, Default)]
struct Recording {
    inner: MemoryBackend,
    batching: bool,
    batches: Mutex<Vec<usize>>,
    singles: Mutex<usize>,
    failing: Mutex<HashSet<String>>,
}

impl Recording {
    fn new(batching: bool) -> Arc<Self> {
        Arc::new(Recording {
            batching,
            ..Recording::default()
        })
    }
    fn batches(&self) -> Vec<usize> {
        self.batches.lock().unwrap().clone()
    }
    fn singles(&self) -> usize {
        *self.singles.lock().unwrap()
    }
}

#[async_trait]
impl LockBackend for Recording {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.inner.try_acquire(req).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        *self.singles.lock().unwrap() += 1;
        self.inner.renew(lease).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.batches.lock().unwrap().push(leases.len());
        let failing = self.failing.lock().unwrap().clone();
        let mut out = Vec::new();
        for lease in leases {
            out.push(if failing.contains(lease.name().as_str()) {
                Err(LockError::transient("memory", "refused for the test"))
            } else {
                self.inner.renew(lease).await
            });
        }
        out
    }
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        self.inner.inspect(name).await
    }
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        self.inner.force_release(name).await
    }
    fn guarantees(&self) -> Guarantees {
        let mut g = self.inner.guarantees();
        g.batch_renew = self.batching;
        g
    }
}

async fn hold_many(
    locker: &Locker,
    n: usize,
    ttl: Duration,
    gap: Duration,
) -> Vec<lock_core::LockGuard> {
    let mut guards = Vec::new();
    for i in 0..n {
        guards.push(
            locker
                .lock(format!("batch-{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .expect("acquire"),
        );
        tokio::time::sleep(gap).await;
    }
    guards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_due_together_are_renewed_in_few_batches() {
    let backend = Recording::new(true);
    let locker = Locker::from_arc(backend.clone());
    let ttl = Duration::from_millis(1200);
    // 40 leases taken over about 200 ms: each may be renewed from ttl/4 on,
    // so the renewals of a wake-up at one's ttl/3 take those within ttl/12.
    let guards = hold_many(&locker, 40, ttl, Duration::from_millis(5)).await;
    tokio::time::sleep(ttl).await;
    assert!(guards.iter().all(|g| g.is_held()), "a batched lease let go");
    let batches = backend.batches();
    let renewed: usize = batches.iter().sum();
    assert!(
        renewed >= 80,
        "two renewals per lease in a TTL: {batches:?}"
    );
    assert!(
        batches.len() * 5 <= renewed,
        "{} requests for {renewed} renewals: not batched ({batches:?})",
        batches.len()
    );
    assert!(batches.iter().all(|&n| n <= 256), "a batch above the cap");
    assert_eq!(backend.singles(), 0, "no lease went alone");
    for g in guards {
        g.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_batch_renews_each_lease_alone() {
    let backend = Recording::new(false);
    let locker = Locker::from_arc(backend.clone());
    let ttl = Duration::from_millis(900);
    let guards = hold_many(&locker, 10, ttl, Duration::ZERO).await;
    tokio::time::sleep(ttl).await;
    assert!(guards.iter().all(|g| g.is_held()));
    assert!(backend.batches().is_empty(), "batched without declaring it");
    assert!(backend.singles() >= 20, "{} renewals", backend.singles());
    for g in guards {
        g.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lost_or_failing_lease_does_not_fail_its_batch() {
    let backend = Recording::new(true);
    let locker = Locker::from_arc(backend.clone());
    let ttl = Duration::from_millis(1200);
    let guards = hold_many(&locker, 6, ttl, Duration::ZERO).await;
    // batch-0 is taken away on the server; batch-1's answer in a batch is
    // a transient failure, so it must be retried alone and kept.
    assert!(backend
        .force_release(&LockName::new("batch-0").unwrap())
        .await
        .unwrap());
    backend.failing.lock().unwrap().insert("batch-1".into());
    tokio::time::timeout(Duration::from_secs(3), guards[0].lost())
        .await
        .expect("the removed lease is reported lost by its renewal");
    tokio::time::sleep(ttl).await;
    assert!(
        backend.singles() >= 1,
        "the failing lease was not retried alone"
    );
    for (i, g) in guards.iter().enumerate().skip(1) {
        assert!(
            g.is_held(),
            "batch-{i} was failed by another lease's answer"
        );
    }
    let mut guards = guards.into_iter();
    let first = guards.next().unwrap();
    assert!(first.release().await.is_err_and(|e| e.is_lost()));
    for g in guards {
        g.release().await.expect("release");
    }
}
