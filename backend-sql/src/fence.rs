//! Fenced writes to the application's own tables.
//!
//! A lock alone cannot stop a holder that was paused (GC, swap, SIGSTOP,
//! a slow network) past its lease from writing after someone else took the
//! lock. The fencing token can: the database remembers, per resource, the
//! highest token it accepted, and refuses a write carrying a lower one.
//!
//! [`SqlBackend::fenced`] (the exact check, the one to use) does this in
//! one transaction, for a [`Lease`]:
//!
//! 1. check that the lock row still shows this holding: our owner, our
//!    version, not expired by the DATABASE clock — and lock the row until
//!    commit (PostgreSQL `FOR SHARE`, MySQL `LOCK IN SHARE MODE`, SQLite's
//!    write transaction), so nobody can take the lock before the write
//!    commits; otherwise roll back and report [`FenceOutcome::Stale`] (the
//!    lock was granted again since) or [`FenceOutcome::NotHeld`] (released
//!    or expired, not taken since);
//! 2. record the token in the fence table (`polylock_fences(resource,
//!    token)`) unless a HIGHER token was recorded before — an upsert
//!    guarded by `WHERE token <= new_token`, which also locks the fence row
//!    until commit, so writers of one resource are serialised; if refused,
//!    roll back and report [`FenceOutcome::Stale`];
//! 3. run the application's statements and commit.
//!
//! This is what etcd's `fenced_put` does with its claim key: a holder that
//! was paused past its lease is refused even if nobody has written since.
//! [`SqlBackend::fenced_token`] does step 2 and 3 only, for tokens that come
//! from elsewhere: it refuses a stale token only once a newer one was
//! recorded for the resource.
//!
//! The fence table lives in the same database as the lock table, so the
//! application's tables must live there too for the check and the write to
//! share a transaction. Applications that write through their own driver
//! can add step 2 (not the lock-row check of step 1, so it refuses a stale
//! token only once a newer one was recorded, as `fenced_token` does) to
//! their own transactions with
//! [`Dialect::fence_check_sql`](crate::Dialect::fence_check_sql); an
//! alternative that needs no extra table is a token column on the
//! application's row (`UPDATE t SET ..., fence = $token WHERE id = $id AND
//! fence <= $token`), documented in `docs/sql.md`.
//!
//! ```no_run
//! # async fn f() -> Result<(), lock_core::LockError> {
//! use std::time::Duration;
//! use backend_sql::{FenceOutcome, SqlBackend};
//! use lock_core::Locker;
//!
//! let backend = SqlBackend::connect("postgres://app:pw@db/app").await?;
//! let locker = Locker::new(backend.clone());
//! let guard = locker.lock("invoice-42").ttl(Duration::from_secs(10)).acquire().await?;
//! // ... long work, during which the process may be paused ...
//! let outcome = backend
//!     .fenced(&guard.lease())
//!     .statement("UPDATE invoices SET state = $1 WHERE id = $2", ["paid".into(), 42i64.into()])
//!     .execute()
//!     .await?;
//! if !outcome.is_applied() {
//!     println!("refused ({outcome:?}): the lock is not ours any more; nothing was written");
//! }
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lock_core::{FencingToken, Lease, LockError};
use sqlx::{AssertSqlSafe, Executor};

use crate::backend::{Pools, SqlBackend};
use crate::dialect::Dialect;
use crate::errors::is_broken_connection;

/// Runs the application's statements in `tx`, returning the rows affected.
/// A macro because each driver has its own query and transaction types.
macro_rules! run_statements {
    ($tx:ident, $statements:expr) => {{
        let mut rows = 0;
        for (sql, params) in $statements {
            let mut q = sqlx::query(AssertSqlSafe(Arc::clone(sql)));
            for v in params {
                q = match v {
                    SqlValue::Null => q.bind(None::<String>),
                    SqlValue::Bool(b) => q.bind(*b),
                    SqlValue::Int(i) => q.bind(*i),
                    SqlValue::Float(f) => q.bind(*f),
                    SqlValue::Text(t) => q.bind(t.as_str()),
                    SqlValue::Bytes(b) => q.bind(b.as_slice()),
                };
            }
            rows += $tx.execute(q).await?.rows_affected();
        }
        rows
    }};
}

/// Opens a transaction with `$begin`, again on a fresh connection when the
/// pooled one turns out broken: nothing was sent on it yet.
macro_rules! begin {
    ($dialect:expr, $begin:expr) => {{
        let mut tries = 0;
        loop {
            match $begin.await {
                Err(e) if tries < BEGIN_RETRIES && is_broken_connection($dialect, &e) => tries += 1,
                other => break other?,
            }
        }
    }};
}

/// PostgreSQL and SQLite: in `tx`, checks the holding (if any), records
/// `token` for `resource` if no higher one was, then runs the statements
/// and commits. The value of the fenced write's closure.
macro_rules! check_then_run {
    ($tx:ident, $sql:expr, $holding:expr, $resource:expr, $token:expr, $statements:expr, $committing:expr) => {{
        if let Some(h) = $holding {
            let live = sqlx::query(AssertSqlSafe(Arc::clone(&$sql.holding)))
                .bind($resource)
                .bind(h.owner.as_str())
                .bind($token)
                .fetch_optional(&mut *$tx)
                .await?
                .is_some();
            if !live {
                let now: Option<i64> =
                    sqlx::query_scalar(AssertSqlSafe(Arc::clone(&$sql.version_of)))
                        .bind($resource)
                        .fetch_optional(&mut *$tx)
                        .await?;
                return Ok(Err(Refused::Row(now.unwrap_or(0).max(0) as u64)));
            }
        }
        // The check returns a row when the token was recorded.
        let ok = sqlx::query(AssertSqlSafe(Arc::clone(&$sql.fence_check)))
            .bind($resource)
            .bind($token)
            .fetch_optional(&mut *$tx)
            .await?
            .is_some();
        if ok {
            let rows = run_statements!($tx, $statements);
            $committing.store(true, Ordering::Relaxed);
            $tx.commit().await?;
            Ok(Ok(rows))
        } else {
            let newer: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&$sql.fence_read)))
                .bind($resource)
                .fetch_one(&mut *$tx)
                .await?;
            Ok(Err(Refused::Fence(newer.max(0) as u64)))
        }
    }};
}

/// How often a fenced write opens its transaction again on a fresh
/// connection: as many as a pool may hold dead ones, at most.
const BEGIN_RETRIES: usize = 16;

/// Why a fenced write was refused (inside the closure).
enum Refused {
    /// A higher token is in the fence table.
    Fence(u64),
    /// The lock row does not show the holding; its version now (0: none).
    Row(u64),
}

/// The holding an exact fenced write checks.
struct Holding {
    owner: String,
}

/// Only the owner token's prefix, as `OwnerToken`'s own Debug: the full
/// token releases the lock.
impl std::fmt::Debug for Holding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let prefix = self.owner.get(..8).unwrap_or_default();
        f.debug_struct("Holding")
            .field("owner", &format_args!("{prefix}…"))
            .finish()
    }
}

/// A value bound to a placeholder of a fenced statement.
///
/// Placeholders follow the database: `$1, $2, ...` on PostgreSQL,
/// `?` on MySQL/MariaDB, `?` or `?1, ?2, ...` on SQLite.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SqlValue {
    /// SQL NULL.
    Null,
    /// A boolean.
    Bool(bool),
    /// A 64-bit integer.
    Int(i64),
    /// A double.
    Float(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl From<i64> for SqlValue {
    fn from(v: i64) -> Self {
        SqlValue::Int(v)
    }
}
impl From<i32> for SqlValue {
    fn from(v: i32) -> Self {
        SqlValue::Int(v.into())
    }
}
impl From<bool> for SqlValue {
    fn from(v: bool) -> Self {
        SqlValue::Bool(v)
    }
}
impl From<f64> for SqlValue {
    fn from(v: f64) -> Self {
        SqlValue::Float(v)
    }
}
impl From<&str> for SqlValue {
    fn from(v: &str) -> Self {
        SqlValue::Text(v.to_string())
    }
}
impl From<String> for SqlValue {
    fn from(v: String) -> Self {
        SqlValue::Text(v)
    }
}
impl From<Vec<u8>> for SqlValue {
    fn from(v: Vec<u8>) -> Self {
        SqlValue::Bytes(v)
    }
}
impl From<FencingToken> for SqlValue {
    fn from(v: FencingToken) -> Self {
        SqlValue::Int(i64::try_from(v.get()).unwrap_or(i64::MAX))
    }
}
impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(SqlValue::Null, Into::into)
    }
}

/// What became of a fenced write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceOutcome {
    /// The token was current: every statement ran and the transaction
    /// committed.
    Applied {
        /// Rows affected, summed over the statements.
        rows_affected: u64,
    },
    /// A higher token was accepted for this resource before: nothing was
    /// written. The writer's lock was lost; it must stop.
    Stale {
        /// The token this write carried.
        token: FencingToken,
        /// The higher token: already accepted for this resource, or (for
        /// [`SqlBackend::fenced`]) granted since by the lock row.
        newer: FencingToken,
    },
    /// [`SqlBackend::fenced`] only: the lock row no longer shows this
    /// holding, and nobody was granted the lock since: it was released,
    /// force-released, or expired by the database clock. Nothing was
    /// written.
    NotHeld {
        /// The token this write carried.
        token: FencingToken,
    },
}

impl FenceOutcome {
    /// Whether the write was applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, FenceOutcome::Applied { .. })
    }
}

/// A write guarded by a fencing token; made by [`SqlBackend::fenced`].
#[derive(Debug)]
#[must_use = "a fenced write does nothing until execute() is awaited"]
pub struct FencedWrite<'a> {
    backend: &'a SqlBackend,
    resource: String,
    token: FencingToken,
    /// Set for the exact check ([`SqlBackend::fenced`]).
    holding: Option<Holding>,
    statements: Vec<(Arc<str>, Vec<SqlValue>)>,
}

impl SqlBackend {
    /// A write that commits only while `lease` still holds its lock: in the
    /// write's own transaction, the lock row must show the lease's owner
    /// and version, unexpired by the database clock (and stays locked until
    /// commit), and the lease's token must be the highest recorded for the
    /// lock's name in the fence table. The exact check, as etcd's
    /// `fenced_put`; the one to use for writes made under a lock of this
    /// client's database.
    ///
    /// The fence table's resource is the lock name.
    pub fn fenced(&self, lease: &Lease) -> FencedWrite<'_> {
        FencedWrite {
            backend: self,
            resource: lease.name().as_str().to_string(),
            token: lease.fence(),
            holding: Some(Holding {
                owner: lease.owner().to_string(),
            }),
            statements: Vec::new(),
        }
    }

    /// A write to `resource` that the database refuses if a token higher
    /// than `token` was accepted for it before; the lock row is not
    /// consulted, so a holder paused past its lease is refused only once a
    /// newer holder has written. For tokens that do not come from this
    /// client's lock table; otherwise use [`fenced`](Self::fenced).
    /// `resource` names what the lock protects (usually the lock name);
    /// tokens of one resource must come from one lock.
    pub fn fenced_token(
        &self,
        resource: impl Into<String>,
        token: FencingToken,
    ) -> FencedWrite<'_> {
        FencedWrite {
            backend: self,
            resource: resource.into(),
            token,
            holding: None,
            statements: Vec::new(),
        }
    }
}

impl FencedWrite<'_> {
    /// Adds a statement (run in order, in the fenced transaction) with its
    /// parameters.
    pub fn statement(
        mut self,
        sql: impl Into<String>,
        params: impl IntoIterator<Item = SqlValue>,
    ) -> Self {
        self.statements
            .push((Arc::from(sql.into()), params.into_iter().collect()));
        self
    }

    /// Runs the fence check and the statements in one transaction.
    ///
    /// `Ok(Stale)` when the token is outdated (nothing written); `Err` for
    /// database errors (nothing written, rolled back), retryable when a
    /// retry may succeed. One exception: when COMMIT was sent and no answer
    /// came (the `op_timeout` ran out, the connection broke), the write may
    /// have been applied; that error is not retryable and says "may have
    /// been applied", so that a caller retrying retryable errors does not
    /// apply a write twice (check what the write did before repeating it).
    ///
    /// # Cancel safety
    /// Cancel safe: the transaction commits entirely or not at all; a
    /// dropped future rolls it back (or leaves it to the database to roll
    /// back when the connection closes), unless its COMMIT was already
    /// sent, which the database may still apply.
    pub async fn execute(self) -> Result<FenceOutcome, LockError> {
        if self.resource.is_empty() || self.resource.len() > 512 {
            return Err(LockError::Config(
                "a fenced resource name is 1 to 512 bytes".into(),
            ));
        }
        let token = i64::try_from(self.token.get()).map_err(|_| {
            LockError::Config("fencing token above i64::MAX cannot be stored".into())
        })?;
        self.backend.ensure_fence_table().await?;
        let sql = self.backend.statements();
        let dialect = self.backend.dialect();
        let resource = self.resource.as_str();
        let holding = self.holding.as_ref();
        let statements = &self.statements;
        // Whether the last try's COMMIT went out: after that, no answer
        // leaves the outcome unknown.
        let committing = &AtomicBool::new(false);
        // Not sent again on a broken connection: the break may have come
        // after the commit. The transaction's BEGIN is retried instead.
        let outcome: Result<u64, Refused> = self
            .backend
            .run_once_sent("fenced write", || async move {
                committing.store(false, Ordering::Relaxed);
                match self.backend.pools() {
                    Pools::Postgres(p) => {
                        let mut tx = begin!(dialect, p.begin());
                        check_then_run!(tx, sql, holding, resource, token, statements, committing)
                    }
                    Pools::Sqlite(p) => {
                        // IMMEDIATE: take the write lock now, so two fenced
                        // writers cannot both read and then fail to upgrade.
                        let mut tx = begin!(dialect, p.begin_with("BEGIN IMMEDIATE"));
                        check_then_run!(tx, sql, holding, resource, token, statements, committing)
                    }
                    Pools::MySql(p) => {
                        let mut tx = begin!(dialect, p.begin());
                        if let Some(h) = holding {
                            let live = sqlx::query(AssertSqlSafe(Arc::clone(&sql.holding)))
                                .bind(resource.as_bytes())
                                .bind(h.owner.as_bytes())
                                .bind(token as u64)
                                .fetch_optional(&mut *tx)
                                .await?
                                .is_some();
                            if !live {
                                let now: Option<u64> =
                                    sqlx::query_scalar(AssertSqlSafe(Arc::clone(&sql.version_of)))
                                        .bind(resource.as_bytes())
                                        .fetch_optional(&mut *tx)
                                        .await?;
                                return Ok(Err(Refused::Row(now.unwrap_or(0))));
                            }
                        }
                        sqlx::query(AssertSqlSafe(Arc::clone(&sql.fence_check)))
                            .bind(resource.as_bytes())
                            .bind(token)
                            .execute(&mut *tx)
                            .await?;
                        // The upsert locked the row: this read is current.
                        let current: u64 =
                            sqlx::query_scalar(AssertSqlSafe(Arc::clone(&sql.fence_read)))
                                .bind(resource.as_bytes())
                                .fetch_one(&mut *tx)
                                .await?;
                        if current != token as u64 {
                            return Ok(Err(Refused::Fence(current)));
                        }
                        let rows = run_statements!(tx, statements);
                        committing.store(true, Ordering::Relaxed);
                        tx.commit().await?;
                        Ok(Ok(rows))
                    }
                }
            })
            .await
            .map_err(|e| {
                // A definite refusal of the COMMIT is not retryable, or it
                // was retried (a conflict rolled it back): what is left
                // retryable here is an unanswered COMMIT.
                if committing.load(Ordering::Relaxed) && e.is_retryable() {
                    self.backend.errors().maybe_applied(&e)
                } else {
                    e
                }
            })?;
        let newer = |v: u64| {
            FencingToken::new(v).ok_or_else(|| {
                self.backend
                    .errors()
                    .protocol("fenced write", "fence table holds token 0".into())
            })
        };
        match outcome {
            Ok(rows_affected) => Ok(FenceOutcome::Applied { rows_affected }),
            Err(Refused::Fence(v)) => Ok(FenceOutcome::Stale {
                token: self.token,
                newer: newer(v)?,
            }),
            Err(Refused::Row(v)) if v > self.token.get() => Ok(FenceOutcome::Stale {
                token: self.token,
                newer: newer(v)?,
            }),
            Err(Refused::Row(_)) => Ok(FenceOutcome::NotHeld { token: self.token }),
        }
    }
}

/// The dialect's placeholder for parameter `i` (1-based), for building
/// statements that run on any of the three databases.
///
/// ```
/// use backend_sql::{placeholder, Dialect};
/// assert_eq!(placeholder(Dialect::Postgres, 2), "$2");
/// assert_eq!(placeholder(Dialect::MySql, 2), "?");
/// assert_eq!(placeholder(Dialect::Sqlite, 2), "?2");
/// ```
pub fn placeholder(dialect: Dialect, i: usize) -> String {
    match dialect {
        Dialect::Postgres => format!("${i}"),
        Dialect::Sqlite => format!("?{i}"),
        Dialect::MySql => "?".to_string(),
    }
}
