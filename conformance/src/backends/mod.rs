//! The one place backends are registered with the suite.
//!
//! To add a backend: implement [`Fixture`] for it (usually a spawned server
//! from `testkit` plus a `client()` that connects to it) and add one line to
//! [`registered`].

use std::sync::Arc;

use lock_core::{Guarantees, LockBackend, MemoryBackend};

use crate::fixture::Fixture;

mod etcd;
mod memory;
mod redis;
mod sql;
mod zk;

/// A backend the suite runs: a label for test names and a setup that starts
/// what it needs. Setup runs lazily, once, on the first case selected.
pub struct Registration {
    /// Test-name prefix, e.g. `memory` or `redis-plain`.
    pub label: &'static str,
    /// What the backend promises, known without starting anything, so
    /// cases that do not apply are not even listed.
    pub guarantees: fn() -> Guarantees,
    /// Starts the service and returns the fixture.
    pub setup: fn() -> Result<Arc<dyn Fixture>, String>,
}

/// Every backend in the suite.
pub fn registered() -> Vec<Registration> {
    vec![
        Registration {
            label: "memory",
            guarantees: || MemoryBackend::new().guarantees(),
            setup: memory::setup,
        },
        sql::sqlite(),
        sql::postgres(),
        sql::mariadb(),
        redis::plain(),
        redis::redisson(),
        redis::cluster_plain(),
        redis::cluster_redisson(),
        redis::fair(),
        redis::cluster_fair(),
        redis::redlock(),
        etcd::single(),
        etcd::cluster(),
        zk::single(),
        zk::ensemble(),
    ]
}
