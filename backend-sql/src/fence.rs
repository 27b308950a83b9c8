//! Fenced writes to the application's own tables.
//!
//! A lock alone cannot stop a holder that was paused (GC, swap, SIGSTOP,
//! a slow network) past its lease from writing after someone else took the
//! lock. The fencing token can: the database remembers, per resource, the
//! highest token it accepted, and refuses a write carrying a lower one.
//!
//! [`SqlBackend::fenced`] does this in one transaction:
//!
//! 1. record the token in the fence table (`polylock_fences(resource, token)`)
//!    unless a HIGHER token was recorded before — an upsert guarded by
//!    `WHERE token <= new_token`, which also locks the fence row until
//!    commit, so writers of one resource are serialised;
//! 2. if the token was refused: roll back and report
//!    [`FenceOutcome::Stale`];
//! 3. otherwise run the application's statements and commit.
//!
//! The fence table lives in the same database as the lock table, so the
//! application's tables must live there too for the check and the write to
//! share a transaction. Applications that write through their own driver
//! can add the same check to their own transactions with
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
//!     .fenced("invoice-42", guard.fence())
//!     .statement("UPDATE invoices SET state = $1 WHERE id = $2", ["paid".into(), 42i64.into()])
//!     .execute()
//!     .await?;
//! if let FenceOutcome::Stale { newer, .. } = outcome {
//!     println!("refused: holder {newer} came after us; nothing was written");
//! }
//! # Ok(()) }
//! ```

use std::sync::Arc;

use lock_core::{FencingToken, LockError};
use sqlx::{AssertSqlSafe, Executor};

use crate::backend::{Pools, SqlBackend};
use crate::dialect::Dialect;

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

/// PostgreSQL and SQLite: in `tx`, records `token` for `resource` if no
/// higher one was, then runs the statements and commits. The value of the
/// fenced write's closure: `Ok(Ok(rows))`, or `Ok(Err(newer))` when refused.
macro_rules! check_then_run {
    ($tx:ident, $check:expr, $read:expr, $resource:expr, $token:expr, $statements:expr) => {{
        // The check returns a row when the token was recorded.
        let ok = sqlx::query(AssertSqlSafe(Arc::clone($check)))
            .bind($resource)
            .bind($token)
            .fetch_optional(&mut *$tx)
            .await?
            .is_some();
        if ok {
            let rows = run_statements!($tx, $statements);
            $tx.commit().await?;
            Ok(Ok(rows))
        } else {
            let newer: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone($read)))
                .bind($resource)
                .fetch_one(&mut *$tx)
                .await?;
            Ok(Err(newer))
        }
    }};
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
        /// The higher token already accepted.
        newer: FencingToken,
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
    statements: Vec<(Arc<str>, Vec<SqlValue>)>,
}

impl SqlBackend {
    /// A write to `resource` that the database refuses if a token higher
    /// than `token` was accepted for it before. `resource` names what the
    /// lock protects (usually the lock name); tokens of one resource must
    /// come from one lock.
    pub fn fenced(&self, resource: impl Into<String>, token: FencingToken) -> FencedWrite<'_> {
        FencedWrite {
            backend: self,
            resource: resource.into(),
            token,
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
    /// retry may succeed.
    ///
    /// # Cancel safety
    /// Cancel safe: the transaction commits entirely or not at all; a
    /// dropped future rolls it back (or leaves it to the database to roll
    /// back when the connection closes).
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
        let (check, read) = (&sql.fence_check, &sql.fence_read);
        let resource = self.resource.as_str();
        let statements = &self.statements;
        let outcome: Result<u64, i64> = self
            .backend
            .run("fenced write", || async move {
                match self.backend.pools() {
                    Pools::Postgres(p) => {
                        let mut tx = p.begin().await?;
                        check_then_run!(tx, check, read, resource, token, statements)
                    }
                    Pools::Sqlite(p) => {
                        // IMMEDIATE: take the write lock now, so two fenced
                        // writers cannot both read and then fail to upgrade.
                        let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                        check_then_run!(tx, check, read, resource, token, statements)
                    }
                    Pools::MySql(p) => {
                        let mut tx = p.begin().await?;
                        sqlx::query(AssertSqlSafe(Arc::clone(check)))
                            .bind(resource.as_bytes())
                            .bind(token)
                            .execute(&mut *tx)
                            .await?;
                        // The upsert locked the row: this read is current.
                        let current: u64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(read)))
                            .bind(resource.as_bytes())
                            .fetch_one(&mut *tx)
                            .await?;
                        if current != token as u64 {
                            return Ok(Err(i64::try_from(current).unwrap_or(i64::MAX)));
                        }
                        let rows = run_statements!(tx, statements);
                        tx.commit().await?;
                        Ok(Ok(rows))
                    }
                }
            })
            .await?;
        match outcome {
            Ok(rows_affected) => Ok(FenceOutcome::Applied { rows_affected }),
            Err(newer) => Ok(FenceOutcome::Stale {
                token: self.token,
                newer: FencingToken::new(u64::try_from(newer).unwrap_or(0)).ok_or_else(|| {
                    self.backend
                        .errors()
                        .protocol("fenced write", "fence table holds token 0".into())
                })?,
            }),
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
