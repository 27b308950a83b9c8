//! `migrate+LEGACY_URL?to=TARGET_URL&phase=...`: the migration lock, its
//! two sides connected through this crate's own URL registry.

use std::sync::Arc;

use backend_migrate::{MigrateBackend, MigrateConfig};
use lock_core::{LockBackend, LockError};

async fn side(url: String) -> Result<Arc<dyn LockBackend>, LockError> {
    crate::registry::connect_backend(&url).await
}

/// Connects a migration lock URL (see [`MigrateConfig::parse`]): the URL is
/// checked before any I/O, then its legacy and target backends are
/// connected like any other URL.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), polylock::LockError> {
/// let m = polylock::connect_migrate("migrate+memory://old?to=memory%3A%2F%2Fnew&phase=both").await?;
/// assert_eq!(m.phase(), polylock::Phase::Both);
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Cancel safe: connecting takes no lock.
pub async fn connect_migrate(url: &str) -> Result<MigrateBackend, LockError> {
    backend_migrate::connect_with(url, side).await
}

/// Connects the migration lock described by `config` (a config file's
/// `[migrate]` section).
///
/// # Cancel safety
/// Cancel safe: connecting takes no lock.
pub async fn connect_migrate_config(config: &MigrateConfig) -> Result<MigrateBackend, LockError> {
    backend_migrate::connect_config(config, side).await
}
