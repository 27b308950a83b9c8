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
