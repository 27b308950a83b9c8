//! The polylock contract.
//!
//! - [`LockBackend`]: what every lock service implements (one attempt, a
//!   wait, renew, release, inspect, and its [`Guarantees`] as data).
//! - [`Lease`], [`FencingToken`], [`OwnerToken`], [`LockName`]: the values
//!   that cross that contract, validated once here. A lease is renewed and
//!   released only by a client of the lock space that granted it ([`LockSpace`]).
//! - [`Locker`], [`LockGuard`]: the API applications use. `acquire()` waits
//!   until it holds the lock (`.wait(d)` bounds it, `try_acquire()` never
//!   waits); a watchdog renews at a third of the TTL (or at half the time
//!   the lease is trusted, when that comes first) for as long as the
//!   guard lives, and [`LockGuard::lost`] fires the moment the lock may be
//!   gone.
//! - [`MemoryBackend`]: the in-process reference implementation.
//! - [`LockError`]: the one error type.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_core::LockError> {
//! use std::time::Duration;
//! use lock_core::{Locker, MemoryBackend};
//!
//! let locker = Locker::new(MemoryBackend::new());
//! let guard = locker.lock("invoices").ttl(Duration::from_secs(5)).acquire().await?;
//! assert!(guard.is_held());
//! // A second holder is refused while the first holds.
//! assert!(locker.lock("invoices").try_acquire().await?.is_none());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
pub mod call;
pub mod duration;
mod error;
mod guarantees;
mod guard;
mod held;
mod lease;
mod locker;
mod memory;
mod meta;
mod name;
mod observe;
mod owner;
mod redact;
mod space;
mod token;
pub mod turns;
pub mod url;
pub mod wait;
mod watchdog;

pub use backend::{
    renew_each, validate_list, validate_ttl, validate_wait, AcquireRequest, HolderInfo,
    LockBackend, MAX_LIST, MAX_TTL, MAX_WAIT,
};
pub use error::{BoxError, LockError, Result};
pub use guarantees::{ExpiryClock, FencingGuarantee, Guarantees, WaitMechanism};
pub use guard::LockGuard;
pub use lease::{ClockPolicy, Lease};
pub use locker::{LockBuilder, Locker, RunOutcome, DEFAULT_TTL};
pub use memory::MemoryBackend;
pub use meta::{owner_value, parse_owner_value, HolderMeta};
pub use name::LockName;
pub use owner::Owner;
pub use redact::redact_url;
pub use space::LockSpace;
pub use token::{FencingToken, OwnerToken};
pub use watchdog::MAX_BATCH as MAX_RENEW_BATCH;

/// Re-exported so backends implement [`LockBackend`] with the same macro.
pub use async_trait::async_trait;
