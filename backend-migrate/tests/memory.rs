//! The whole conformance suite over two in-process tables in every phase:
//! what the migration lock adds (taking both, merging `list`, summing
//! waiters) checked without servers, so it runs in a second.

use std::sync::Arc;

use async_trait::async_trait;
use backend_migrate::{MigrateBackend, Phase};
use conformance::fixture::Fixture;
use lock_core::{Guarantees, LockBackend, LockError, MemoryBackend};

/// Clients of one legacy and one target table (clones share a table).
struct Tables {
    legacy: MemoryBackend,
    target: MemoryBackend,
    phase: Phase,
}

impl Tables {
    fn backend(&self) -> MigrateBackend {
        MigrateBackend::new(
            Arc::new(self.legacy.clone()),
            Arc::new(self.target.clone()),
            self.phase,
        )
    }
}

#[async_trait]
impl Fixture for Tables {
    fn guarantees(&self) -> Guarantees {
        self.backend().guarantees()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(self.backend()))
    }
}

#[test]
fn every_case_passes_in_every_phase_over_two_memory_tables() {
    for phase in [Phase::Legacy, Phase::Both, Phase::Target] {
        let fixture = Tables {
            legacy: MemoryBackend::new(),
            target: MemoryBackend::new(),
            phase,
        };
        let g = fixture.guarantees();
        assert!(
            g.list && g.counts_waiters && g.holder_meta,
            "{phase:?}: two memory tables can list, count waiters and keep metadata: {g:?}"
        );
        eprintln!("phase {phase:?}");
        conformance::harness::assert_every_case_passes(Arc::new(fixture), 36);
    }
}

/// A `both` acquire cancelled while it holds the legacy lock and waits for
/// the target lock gives the legacy lock back: legacy-only clients are not
/// shut out for its TTL by a holder that is gone.
#[tokio::test]
async fn a_cancelled_wait_for_the_target_gives_the_legacy_lock_back() {
    let (legacy, target) = (MemoryBackend::new(), MemoryBackend::new());
    let both = MigrateBackend::new(
        Arc::new(legacy.clone()),
        Arc::new(target.clone()),
        Phase::Both,
    );
    let name = lock_core::LockName::new("cancelled-both").unwrap();
    let request = |wait| {
        lock_core::AcquireRequest::new(
            name.clone(),
            lock_core::OwnerToken::random(),
            std::time::Duration::from_secs(30),
            wait,
        )
        .unwrap()
    };
    let on_target = target
        .try_acquire(&request(std::time::Duration::ZERO))
        .await
        .unwrap()
        .expect("the target is free");
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        both.acquire(&request(std::time::Duration::from_secs(10))),
    )
    .await;
    assert!(waited.is_err(), "the target is held: {waited:?}");
    // The release runs in a task of its own.
    let mut freed = false;
    for _ in 0..100 {
        if legacy.inspect(&name).await.unwrap().is_none() {
            freed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(freed, "the cancelled acquire left the legacy lock held");
    target.release(&on_target).await.unwrap();
}
