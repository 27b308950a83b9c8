//! The in-process reference backend.

use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{Guarantees, LockBackend, LockError, MemoryBackend};

use crate::fixture::Fixture;

/// The in-process reference backend: clients are clones sharing one table.
struct MemoryFixture(MemoryBackend);

#[async_trait]
impl Fixture for MemoryFixture {
    fn guarantees(&self) -> Guarantees {
        self.0.guarantees()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(self.0.clone()))
    }
}

pub(super) fn setup() -> Result<Arc<dyn Fixture>, String> {
    Ok(Arc::new(MemoryFixture(MemoryBackend::new())))
}
