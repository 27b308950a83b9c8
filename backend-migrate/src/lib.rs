//! The migration lock: one polylock lock made of two, a **legacy** lock
//! (the one a fleet uses today, e.g. a Redis key shared with redis-py,
//! redsync, node-redlock, Redisson or a hand-rolled `SET NX PX`) and a
//! **target** lock (etcd, ZooKeeper, SQL, ...), so services can be moved
//! from one to the other one at a time without ever breaking mutual
//! exclusion.
//!
//! The [`Phase`] says which locks a service takes:
//! - [`Phase::Legacy`]: the legacy lock only (where a roll-back ends);
//! - [`Phase::Both`]: the legacy lock first, then the target lock; released
//!   in reverse; if the target lock cannot be taken the legacy lock is
//!   released again. Legacy-only and `both` services exclude each other
//!   through the legacy lock, `both` and `target` services through the
//!   target lock;
//! - [`Phase::Target`]: the target lock only.
//!
//! A fleet therefore moves legacy → both (one service at a time) → target
//! (one service at a time, once no legacy-only service is left), and rolls
//! back the same way in reverse. Never run `legacy` and `target` services
//! side by side: nothing excludes them from each other.
//!
//! In `both`, the fencing token is the target's, and loss of either lock is
//! loss of the lock: a failed renewal of either side, or either side's own
//! revocation signal, revokes the composite lease. The other side stays
//! held until the lease is released: the holder may still be working.
//!
//! URL: `migrate+LEGACY_URL?to=PERCENT_ENCODED_TARGET_URL&phase=both`, for
//! example `migrate+redis://cache:6379?to=etcd%3A%2F%2Fetcd%3A2379&phase=both`
//! (see [`MigrateConfig`]). The two backends are connected by the caller's
//! own URL registry ([`connect_with`]), so this crate depends on no backend.

mod backend;
mod config;
mod key;

pub use backend::{guarantees, MigrateBackend, Sides};
pub use config::{MigrateConfig, Phase};

use std::future::Future;
use std::sync::Arc;

use lock_core::{LockBackend, LockError};

/// The URL scheme prefix of the migration lock: `migrate+` followed by the
/// legacy backend's own scheme.
pub const URL_PREFIX: &str = "migrate+";

/// Whether `url` names a migration lock (`migrate+...`, any case).
pub fn is_migrate_url(url: &str) -> bool {
    url.get(..URL_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(URL_PREFIX))
}

/// Parses `url` (before any I/O), then connects its legacy and target
/// backends with `connect` (the caller's URL registry, e.g.
/// `polylock::connect_backend`).
///
/// # Cancel safety
/// Cancel safe: connecting takes no lock.
pub async fn connect_with<F, Fut>(url: &str, connect: F) -> Result<MigrateBackend, LockError>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Arc<dyn LockBackend>, LockError>>,
{
    let config = MigrateConfig::parse(url)?;
    connect_config(&config, connect).await
}

/// Connects the legacy and target backends of `config` with `connect`.
///
/// # Cancel safety
/// Cancel safe: connecting takes no lock.
pub async fn connect_config<F, Fut>(
    config: &MigrateConfig,
    connect: F,
) -> Result<MigrateBackend, LockError>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Arc<dyn LockBackend>, LockError>>,
{
    let legacy = connect(config.legacy_url().to_string()).await?;
    let target = connect(config.target_url().to_string()).await?;
    Ok(MigrateBackend::new(legacy, target, config.phase()))
}
