//! polylock: one distributed-lock API over Redis, etcd, ZooKeeper and SQL,
//! chosen by a URL.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), polylock::LockError> {
//! let locker = polylock::connect("memory://docs").await?;
//! let guard = locker.lock("nightly-report").acquire().await?;
//! println!("fencing token {}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Each backend is behind a cargo feature; [`available_schemes`] lists what
//! this build can connect to, and an unknown or disabled scheme is an error
//! that names them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use lock_core::*;

pub mod config;
mod guarantees;
#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "migrate")]
mod migrate;
mod registry;

pub use config::{connect_from_env, Config};
pub use guarantees::{declared_guarantees, guarantees_table, operations_table};
pub use registry::{available_schemes, declared_guarantees_of};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Connects to the lock service named by `url` and returns a [`Locker`].
///
/// # Cancel safety
/// Cancel safe: a dropped connect leaves no lock behind.
pub async fn connect(url: &str) -> Result<Locker, LockError> {
    Ok(Locker::from_arc(connect_backend(url).await?))
}

/// Connects to the lock service named by `url` and returns the raw backend.
///
/// # Cancel safety
/// Cancel safe: a dropped connect leaves no lock behind.
pub async fn connect_backend(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    #[cfg(feature = "migrate")]
    if backend_migrate::is_migrate_url(url) {
        return Ok(Arc::new(connect_migrate(url).await?));
    }
    registry::connect_backend(url).await
}

/// The migration lock: see [`connect_migrate`].
#[cfg(feature = "migrate")]
pub use backend_migrate::{MigrateBackend, MigrateConfig, Phase, Sides};
#[cfg(feature = "migrate")]
pub use migrate::{connect_migrate, connect_migrate_config};

/// The README's examples, compiled as doc tests so they cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
