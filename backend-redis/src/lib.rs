//! polylock's Redis backend: one server (`redis://`, `rediss://`) or a Redis
//! Cluster (`redis+cluster://`), in the `plain` or the Redisson wire format.
//!
//! ```no_run
//! # async fn f() -> Result<(), lock_core::LockError> {
//! use lock_core::Locker;
//! use backend_redis::RedisBackend;
//!
//! let locker = Locker::new(RedisBackend::connect("redis://127.0.0.1:6379/0").await?);
//! let guard = locker.lock("invoices").acquire().await?;
//! // ... write with guard.fence() ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How a lock works
//! - **Acquire** is one Lua script: `SET key token NX PX ttl` and, when that
//!   succeeded, `INCR` of the lock's fencing counter, whose new value is the
//!   lease's fencing token. (Redisson format: create the hash with our field
//!   at count 1, `PEXPIRE`, `INCR`.) One round trip, atomic.
//! - **Renew** is compare-owner-and-`PEXPIRE`, **release** is
//!   compare-owner-and-`DEL` plus a `PUBLISH` on the lock's channel; both
//!   scripts. Never a bare `DEL`, never an expiry set on a key that is not
//!   ours, so a late renew cannot resurrect a lock. Both also check that the
//!   fencing counter still equals the lease's token, so an older lease of the
//!   same owner cannot touch a newer holding.
//! - Scripts are in `scripts/*.lua`, sent by SHA-1 (`EVALSHA`), loaded at
//!   connect time and again by the driver on `NOSCRIPT`.
//! - **Waiting**: after one failed attempt the waiter subscribes to the
//!   lock's channel (one pub/sub connection per client, shared by its
//!   waiters; see the `wait` module) and retries on each release message,
//!   when the holder's TTL runs out, and on a jittered fallback poll
//!   (50–500 ms) for a message that was lost. A cancelled waiter gives up its
//!   subscription.
//! - **Cluster**: the lock key, its counter and its channel share a hash
//!   tag, so each script touches one slot.
//!
//! # Fencing tokens, and what can make them go backwards
//! The counter is never reset by release (nor by `force_release`). It is as
//! durable as the Redis data set and no more: a restart of a server that
//! does not persist every write (RDB only, or AOF with the default
//! `appendfsync everysec`) forgets the last increments or all of them, and a
//! failover promotes a replica that may not have received the latest
//! `INCR`. After either, tokens can repeat or go backwards; a fenced
//! resource then rejects the new holder's writes until the counter passes
//! the highest token it saw. Hence [`FencingGuarantee::UnlessDataLoss`](lock_core::FencingGuarantee).
//!
//! # Replica acknowledgement (`wait_replicas=N&wait_timeout=MS`)
//! Off by default. When on, each acquire is followed by `WAIT N MS` on the
//! connection that wrote it; if fewer than N replicas acknowledged in time,
//! the lock is released again and the acquire fails with a retryable error.
//! The trade-off: every acquire costs a replication round trip, a missing
//! replica makes acquires fail after `wait_timeout`, and because `WAIT`
//! blocks the (shared, multiplexed) connection it runs on, other commands
//! of this client wait behind it meanwhile. It narrows, but does not close,
//! the failover window: `WAIT` does not make Redis replication synchronous.
//!
//! # Wire formats
//! See [`Format`]. `plain` interoperates with redis-py's `Lock`, redsync,
//! node-redlock and `SET key token NX PX` scripts on the same key
//! ([`RedisBackend::keys`] says which); `redisson` with Redisson's `RLock`
//! (and its fenced lock's token key). Foreign holders do not publish on our
//! channel in the plain format, so waiting on them falls back to polling and
//! to their TTL.
//!
//! # Errors
//! Driver errors become [`LockError::Backend`](lock_core::LockError) with a
//! `retryable` flag: connection, timeout, `BUSY`, `LOADING`, `TRYAGAIN`,
//! `CLUSTERDOWN`, `MOVED`/`ASK`, `READONLY` are retryable; `WRONGTYPE`,
//! `NOAUTH`, `WRONGPASS`, `NOPERM` and other command errors are not. A bad
//! database index or refused credentials at connect time are
//! [`LockError::Config`](lock_core::LockError). Passwords never appear in
//! errors, logs or `Debug` output.

mod backend;
mod config;
mod conn;
mod errors;
mod format;
mod wait;

pub use backend::{guarantees, RedisBackend, FENCING_CAVEAT};
pub use config::{Format, RedisConfig, DEFAULT_PREFIX, DEFAULT_TIMEOUT, DEFAULT_WAIT_TIMEOUT};
pub use format::{redisson_field, LockKeys};
pub use wait::ForeignWake;
