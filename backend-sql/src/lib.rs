//! polylock over SQL: SQLite, PostgreSQL and MySQL/MariaDB, through sqlx.
//!
//! ```no_run
//! # async fn f() -> Result<(), lock_core::LockError> {
//! use std::time::Duration;
//! use backend_sql::SqlBackend;
//! use lock_core::Locker;
//!
//! // SQLite: no server; every process on this machine that opens the file
//! // shares the locks.
//! let locker = Locker::new(SqlBackend::connect("sqlite:///var/lib/app/locks.db").await?);
//! // Or: "postgres://app:pw@db:5432/app?table=app_locks", "mysql://app:pw@db/app".
//! let guard = locker.lock("nightly-report").ttl(Duration::from_secs(30)).acquire().await?;
//! println!("fencing token {}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The lock table
//!
//! One row per lock name, created on first use (`CREATE TABLE IF NOT
//! EXISTS`, safe when many processes start at once) or by hand with the DDL
//! of [`Dialect::lock_table_ddl`] (also in `docs/sql.md`):
//!
//! | column       | meaning |
//! |--------------|---------|
//! | `name`       | the lock name, stored as is, compared byte by byte (SQLite `TEXT` BINARY, PostgreSQL `TEXT COLLATE "C"`, MySQL `VARBINARY(512)`) |
//! | `owner`      | the holder's owner token (32 hex digits); `NULL` when released |
//! | `version`    | bumped by every acquisition: the fencing token |
//! | `expires_at` | when the lease ends, by the DATABASE clock |
//! | `holder_meta` | who took the lock ([`lock_core::HolderMeta`], its one-line form), or `NULL` |
//! | `meta_version` | the `version` whose grant wrote `holder_meta` |
//! | `wake_until` | PostgreSQL only: until when a waiter wants the release notified |
//!
//! The last two (three on PostgreSQL) came after the first version of the table: a client adds
//! them to a table that lacks them when it connects (each `ALTER TABLE`
//! only after a look-up shows the column missing, with a bounded wait for
//! the table lock, and safe when several clients connect at once). A
//! client that may not alter the table fails to connect with an error that
//! quotes the statement to run.
//!
//! The row is never deleted: release sets `owner` to `NULL`. So `version`
//! never goes back, and fencing tokens strictly increase for as long as the
//! table lives (restoring an older backup, deleting the SQLite file or
//! dropping the table resets them).
//!
//! # The protocol
//!
//! - **acquire** is ONE conditional upsert: insert the row, or take it over
//!   only when `owner IS NULL OR expires_at <= now`, bumping `version`;
//!   `now` is the database's clock (`clock_timestamp()` on PostgreSQL, never
//!   the transaction-frozen `now()`; `UTC_TIMESTAMP(6)` on MySQL; SQLite's
//!   own clock in milliseconds), never the client's. PostgreSQL and SQLite
//!   read the new version with `RETURNING`; MySQL passes it through
//!   `LAST_INSERT_ID(expr)` in the same statement, so two racing acquirers
//!   can never both win: the row lock serialises them and the second sees
//!   the first's owner.
//! - **renew** extends the row only if owner AND version match and it has
//!   not expired: it never resurrects a lock.
//! - **release** frees the row only if owner AND version match; when not,
//!   it says `Lost` if the row's version shows a later grant.
//! - **force_release** frees a live row whoever holds it, leaving `version`.
//! - **inspect** reads owner, version, the time left computed by the
//!   database, and the holder metadata. The grant writes the metadata it
//!   was given (or `NULL`) in the same statement, renew keeps it, release
//!   clears it; it is shown only while `meta_version` equals `version`, so
//!   a grant by a client of an earlier version, which leaves the column
//!   alone, never shows the previous holder's.
//! - **list** is one statement over the held, unexpired rows whose name
//!   starts with the prefix, exactly and case-sensitively (`LIKE` with its
//!   wildcards escaped on PostgreSQL and MySQL; a `substr` comparison on
//!   SQLite, whose `LIKE` ignores ASCII case), in byte order of the names.
//! - **waiters** is not supported (`Ok(None)`, `counts_waiters` is false):
//!   a waiter is a client that polls, or on PostgreSQL listens on one
//!   channel for the whole table, so the database has no record of who
//!   waits for which name.
//!
//! The granted TTL is the requested one, rounded up to the database's
//! timestamp precision (SQLite: 1 ms; PostgreSQL, MySQL: 1 µs).
//!
//! # Waiting
//!
//! PostgreSQL wakes waiters with LISTEN/NOTIFY (the release statement calls
//! `pg_notify`, only while a waiter has asked for it in the row's
//! `wake_until`: a committing NOTIFY takes a database-wide lock, which
//! releases nobody waits for should not queue on); MySQL and SQLite poll with jittered exponential backoff up
//! to `max_poll` (URL option). See [`SqlConfig`] for every option.
//!
//! # Fenced writes
//!
//! [`SqlBackend::fenced`] turns a write to the application's own tables
//! into one the database refuses unless the lease still holds the lock
//! row (owner, version, unexpired by the database clock) in the write's
//! own transaction: see the [`fence`](crate::FencedWrite) docs and
//! `examples/fenced_write.rs`.
//!
//! # Errors
//!
//! Driver errors become [`lock_core::LockError::Backend`] with a
//! [`SqlError`] source (message and database error code, no driver types),
//! retryable for connection trouble, pool timeouts, deadlocks,
//! serialization failures and `SQLITE_BUSY`. Messages name `host:port` and
//! never contain the password.

mod backend;
mod config;
mod dialect;
mod errors;
mod fence;
mod schema;
mod wait;

pub use backend::SqlBackend;
pub use config::{
    SqlConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FENCE_TABLE, DEFAULT_OP_TIMEOUT, DEFAULT_TABLE,
    MAX_TABLE_NAME,
};
pub use dialect::{guarantees, Dialect};
pub use errors::SqlError;
pub use fence::{placeholder, FenceOutcome, FencedWrite, SqlValue};

use std::sync::Arc;

use lock_core::{LockBackend, LockError};

/// The URL schemes this backend serves.
pub const URL_SCHEMES: &[&str] = &["sqlite", "postgres", "postgresql", "mysql", "mariadb"];

/// Connects to the database named by `url` ([`SqlBackend::connect`]).
///
/// # Cancel safety
/// Cancel safe: a dropped connect closes its pool and leaves no lock
/// behind.
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    Ok(Arc::new(SqlBackend::connect(url).await?))
}
