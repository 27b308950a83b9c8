//! The [`LockBackend`] over a SQL lock table.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::turns::Turns;
use lock_core::{
    async_trait, validate_list, wait, AcquireRequest, FencingToken, Guarantees, HolderInfo,
    HolderMeta, Lease, LockBackend, LockError, LockName, LockSpace, OwnerToken,
};
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlTypeInfo};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgTypeInfo, Postgres};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, ConnectOptions, SqlSafeStr};
use tokio::sync::{OnceCell, Semaphore};
use tokio::time::Instant;

use crate::config::SqlConfig;
use crate::dialect::{
    bucket, guarantees, like_prefix, Bind, Dialect, RenewBatch, Statements, RENEW_CHUNK,
};
use crate::errors::{duplicate, is_broken_connection, is_conflict, ErrorContext};
use crate::schema;
use crate::wait::{backoff, NotifyHub};

/// How many times a statement rolled back by a deadlock or serialization
/// failure is run again at once before the error is returned (retryable).
const CONFLICT_RETRIES: usize = 3;

/// The longest a waiting acquire waits for the LISTEN connection before its
/// first attempt.
const LISTEN_READY_WAIT: Duration = Duration::from_secs(2);

/// A lock client over a SQL database: SQLite, PostgreSQL or MySQL/MariaDB.
///
/// One value is one client with its own connection pool; clones share it.
/// Build it with [`SqlBackend::connect`], which creates the lock table if
/// needed; use it through [`lock_core::Locker`] or the [`LockBackend`] trait.
/// Like any sqlx pool, its connections belong to the tokio runtime that
/// opened them: make one client per runtime.
#[derive(Clone)]
pub struct SqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: SqlConfig,
    /// The lock space stamped on this client's leases; renew and release
    /// refuse another space's.
    space: LockSpace,
    /// One pool of `pool_size + upkeep_size(pool_size)` connections for
    /// every operation. Sharing it lets releases and renewals use every
    /// idle connection (a pool of their own capped a client's cycle rate at
    /// what its few connections could release).
    pools: Pools,
    /// `pool_size` permits: acquisitions (waiting or not), inspections and
    /// fenced writes hold one for their statement, renewals and releases
    /// none. However many waiters are stuck in the database (on a row
    /// another transaction locks, each holding its connection until the
    /// operation timeout), `upkeep_size` connections stay for renewals and
    /// releases, which so never queue behind waiters.
    main_lane: Semaphore,
    /// SQLite only: this client's writes run one at a time. SQLite lets one
    /// connection of the file write at once; connections of one process
    /// racing for that lock meet it busy and sleep in SQLite's busy handler
    /// (1 ms and more each time), which cut a client's throughput to a
    /// fraction of what one writer at a time achieves. Other processes are
    /// still waited for by `busy_timeout`.
    sqlite_writes: tokio::sync::Mutex<()>,
    sql: Statements,
    errors: ErrorContext,
    guarantees: Guarantees,
    /// PostgreSQL only: the LISTEN connection that wakes waiters.
    hub: Option<NotifyHub>,
    /// Set once the fence table is known to exist.
    fences_ready: OnceCell<()>,
    /// Acquisitions whose statement may have run without us seeing the
    /// answer (a timeout, a broken connection), until the TTL they asked
    /// for has passed; see [`SqlBackend::try_acquire`].
    /// With each, the id its grant carries (`grant_id`), which its retries
    /// reuse: a retry takes back that grant only, never one the same owner
    /// holds through another acquisition (of this client or another).
    unsure: Mutex<HashMap<(LockName, OwnerToken), Unsure>>,
    /// One turn per name and owner at a time for acquire statements; see
    /// [`SqlBackend::try_acquire`]. An entry lives while a turn is taken
    /// or awaited.
    turns: Turns,
}

/// Which operations may take a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    /// Acquisitions, inspections, fenced writes: at most `pool_size` at
    /// once.
    Main,
    /// Renewals and releases: any connection.
    Upkeep,
}

/// The connections kept for renewals and releases beyond `pool_size`.
fn upkeep_size(pool_size: u32) -> u32 {
    pool_size.div_ceil(4).clamp(1, 4)
}

pub(crate) enum Pools {
    Sqlite(SqlitePool),
    Postgres(PgPool),
    MySql(MySqlPool),
}

/// A `match` on [`Pools`] whose arms may list several databases, for
/// statements written the same way on them:
/// `pool_match!(pools, { Postgres(p) | Sqlite(p) => ..., MySql(p) => ... })`.
/// Each arm's body is compiled once per database, with `p` that database's
/// pool.
macro_rules! pool_match {
    ($pools:expr, { $( $( $variant:ident ( $p:ident ) )|+ => $body:expr ),+ $(,)? }) => {
        match $pools {
            $( $( $crate::backend::Pools::$variant($p) => $body, )+ )+
        }
    };
}

/// An `after_connect` hook setting the session's limits (see
/// [`Dialect::session_limits`]) and preparing the hot statements (see
/// [`Statements::hot`]) on each new connection.
macro_rules! prepare_hot {
    ($sql:expr, $limits:expr, $types:expr) => {{
        let hot: Arc<[(Arc<str>, Vec<_>)]> = $sql
            .hot()
            .into_iter()
            .map(|(statement, binds)| (statement, binds.into_iter().map($types).collect()))
            .collect();
        let limits: Option<Arc<str>> = $limits.map(Arc::from);
        move |conn: &mut _, _| {
            let (hot, limits) = (Arc::clone(&hot), limits.clone());
            Box::pin(async move {
                if let Some(limits) = &limits {
                    sqlx::Executor::execute(&mut *conn, q(limits)).await?;
                }
                for (statement, types) in hot.iter() {
                    sqlx::Executor::prepare_with(&mut *conn, q(statement).into_sql_str(), types)
                        .await?;
                }
                Ok(())
            })
        }
    }};
}

fn pg_type(bind: Bind) -> PgTypeInfo {
    match bind {
        Bind::Text => <&str as sqlx::Type<Postgres>>::type_info(),
        Bind::Int8 => <i64 as sqlx::Type<Postgres>>::type_info(),
        Bind::Texts => <Vec<String> as sqlx::Type<Postgres>>::type_info(),
        Bind::Int8s => <Vec<i64> as sqlx::Type<Postgres>>::type_info(),
    }
}

/// MySQL takes the bind types with each execution.
fn mysql_type(_: Bind) -> MySqlTypeInfo {
    <&[u8] as sqlx::Type<MySql>>::type_info()
}

/// Opens one connection of `pools` and leaves it idle: a server
/// connection costs a handshake of several round trips (TCP, TLS, SCRAM;
/// tens of milliseconds, more in debug builds or on a loaded host), which a
/// fresh client's first acquire, and worse its first renewal (on the upkeep
/// pool, inside the TTL), would otherwise pay. One each: more would multiply
/// the server's connections by the number of clients for a gain only
/// back-to-back operations see.
///
/// # Cancel safety
/// Cancel safe: a connection opened stays in the pool.
async fn warm(pools: &Pools, errors: &ErrorContext) -> Result<(), LockError> {
    let opened = pool_match!(pools, {
        Sqlite(p) | Postgres(p) | MySql(p) => p.acquire().await.map(drop),
    });
    opened.map_err(|e| errors.map("connecting", e))
}

impl fmt::Debug for SqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlBackend")
            .field("dialect", &self.inner.config.dialect)
            .field("url", &self.inner.config.redacted_url())
            .field("table", &self.inner.config.table)
            .finish_non_exhaustive()
    }
}

fn q(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

fn config_error(errors: &ErrorContext, e: sqlx::Error) -> LockError {
    // Option parsing errors may quote the URL: render through the scrubber.
    match errors.map("parsing the URL", e) {
        LockError::Backend { source, .. } => LockError::Config(source.to_string()),
        other => other,
    }
}

/// Connects once directly (a pool hides "connection refused" behind its own
/// timeout), creates the lock table if needed (or adds the columns an older
/// one lacks), and closes the connection. Returns where the table lives
/// ([`schema::Schema::namespace`]).
async fn create_lock_table<O, C>(
    options: &O,
    config: &SqlConfig,
    sql: &Statements,
    errors: &ErrorContext,
) -> Result<String, LockError>
where
    O: ConnectOptions<Connection = C>,
    C: schema::Schema,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
    for<'q> String: sqlx::Encode<'q, C::Database> + sqlx::Type<C::Database>,
    <C::Database as sqlx::Database>::Arguments: sqlx::IntoArguments<C::Database>,
{
    let limit = config.connect_timeout;
    let mut conn = tokio::time::timeout(limit, options.connect())
        .await
        .map_err(|_| errors.timed_out("connecting", limit))?
        .map_err(|e| errors.connect_failed(e))?;
    let setup = schema::ensure(
        &mut conn,
        sql,
        &config.table,
        &sql.create_locks,
        Some(&sql.probe_locks),
        errors,
    )
    .await;
    let setup = match setup {
        Ok(()) => {
            schema::add_missing_columns(&mut conn, sql, &config.table, config.op_timeout, errors)
                .await
        }
        failed => failed,
    };
    let namespace = match setup {
        Ok(()) => conn
            .namespace()
            .await
            .map_err(|e| errors.map("reading the database's name", e)),
        Err(e) => Err(e),
    };
    let _ = conn.close().await;
    namespace
}

impl SqlBackend {
    /// Parses `url` (see [`SqlConfig`]), connects, and creates the lock table
    /// if it does not exist.
    ///
    /// Errors: [`LockError::Config`] for a bad URL (before any I/O);
    /// [`LockError::Backend`] naming `host:port` (never the password) when
    /// the database cannot be reached or refuses the login.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes what was opened; a table
    /// creation either committed or did not.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), lock_core::LockError> {
    /// use lock_core::Locker;
    /// let backend = backend_sql::SqlBackend::connect("sqlite:///var/lib/app/locks.db").await?;
    /// let locker = Locker::new(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<SqlBackend, LockError> {
        Self::connect_with(SqlConfig::parse(url)?).await
    }

    /// Connects with a parsed configuration; see [`SqlBackend::connect`].
    ///
    /// # Cancel safety
    /// As [`SqlBackend::connect`].
    pub async fn connect_with(config: SqlConfig) -> Result<SqlBackend, LockError> {
        let dialect = config.dialect;
        let errors = ErrorContext {
            dialect,
            endpoint: config.endpoint.clone(),
            password: config.password.clone(),
        };
        let sql = Statements::new(dialect, &config.table, &config.fence_table);
        let limit = config.connect_timeout;
        let mut hub = None;
        let namespace;
        let size = config.pool_size + upkeep_size(config.pool_size);
        let pools = match dialect {
            Dialect::Sqlite => {
                let path = config.sqlite_path.clone().unwrap_or_default();
                let options = SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true)
                    // WAL: readers never block the writer; FULL: a commit
                    // is on disk, so a version is never handed out twice
                    // after a power loss.
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full)
                    .busy_timeout(config.busy_timeout);
                // Turning a new file into WAL takes an exclusive lock that
                // SQLite's busy timeout does not wait for, so processes that
                // open a fresh file at the same moment can get SQLITE_BUSY:
                // retry those until the connect timeout.
                let until = tokio::time::Instant::now() + config.connect_timeout;
                let mut pause = Duration::from_millis(5);
                namespace = loop {
                    match create_lock_table(&options, &config, &sql, &errors).await {
                        Err(e) if e.is_retryable() && tokio::time::Instant::now() < until => {
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_millis(100));
                        }
                        done => break done?,
                    }
                };
                let pool = |size| {
                    Pools::Sqlite(
                        SqlitePoolOptions::new()
                            .max_connections(size)
                            .acquire_timeout(config.op_timeout)
                            // An in-process file handle cannot go stale.
                            .test_before_acquire(false)
                            .connect_lazy_with(options.clone()),
                    )
                };
                pool(size)
            }
            Dialect::Postgres => {
                let options = PgConnectOptions::from_str(&config.driver_url)
                    .map_err(|e| config_error(&errors, e))?;
                namespace = create_lock_table(&options, &config, &sql, &errors).await?;
                hub = Some(NotifyHub::new(
                    options.clone(),
                    sql.channel.clone(),
                    limit,
                    errors.clone(),
                ));
                let pool = |size| {
                    Pools::Postgres(
                        PgPoolOptions::new()
                            .max_connections(size)
                            .acquire_timeout(limit)
                            .idle_timeout(Some(Duration::from_secs(60)))
                            // No ping per statement (a round trip each): a
                            // dead connection fails its statement, which
                            // `run` then sends again on a fresh one.
                            .test_before_acquire(false)
                            .after_connect(prepare_hot!(
                                sql,
                                dialect.session_limits(config.op_timeout),
                                pg_type
                            ))
                            .connect_lazy_with(options.clone()),
                    )
                };
                pool(size)
            }
            Dialect::MySql => {
                let options = MySqlConnectOptions::from_str(&config.driver_url)
                    .map_err(|e| config_error(&errors, e))?;
                namespace = create_lock_table(&options, &config, &sql, &errors).await?;
                let pool = |size| {
                    Pools::MySql(
                        MySqlPoolOptions::new()
                            .max_connections(size)
                            .acquire_timeout(limit)
                            .idle_timeout(Some(Duration::from_secs(60)))
                            // As for PostgreSQL: no ping per statement.
                            .test_before_acquire(false)
                            .after_connect(prepare_hot!(
                                sql,
                                dialect.session_limits(config.op_timeout),
                                mysql_type
                            ))
                            .connect_lazy_with(options.clone()),
                    )
                };
                pool(size)
            }
        };
        if dialect != Dialect::Sqlite {
            warm(&pools, &errors).await?;
        }
        tracing::debug!(
            backend = dialect.backend_name(),
            endpoint = %config.endpoint,
            table = %config.table,
            "polylock sql: connected"
        );
        Ok(SqlBackend {
            inner: Arc::new(Inner {
                // The database (and schema) as the server names it, not
                // as the URL spelled it: every client of one table shares
                // the space, and no client of another database's table of
                // the same name does.
                space: LockSpace::named(&[
                    "sql",
                    dialect.backend_name(),
                    &namespace,
                    &config.table,
                ]),
                guarantees: guarantees(dialect),
                main_lane: Semaphore::new(config.pool_size as usize),
                sqlite_writes: tokio::sync::Mutex::new(()),
                pools,
                sql,
                errors,
                hub,
                fences_ready: OnceCell::new(),
                unsure: Mutex::new(HashMap::new()),
                turns: Turns::default(),
                config,
            }),
        })
    }

    /// The database kind.
    pub fn dialect(&self) -> Dialect {
        self.inner.config.dialect
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// Closes the pool: in-flight operations finish, new ones fail.
    ///
    /// # Cancel safety
    /// Cancel safe: the pool is closed either way; connections still in use
    /// close when returned.
    pub async fn close(&self) {
        pool_match!(&self.inner.pools, {
            Sqlite(p) | Postgres(p) | MySql(p) => p.close().await,
        })
    }

    pub(crate) fn pools(&self) -> &Pools {
        &self.inner.pools
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.sql
    }

    pub(crate) fn errors(&self) -> &ErrorContext {
        &self.inner.errors
    }

    /// Creates the fence table once per client.
    pub(crate) async fn ensure_fence_table(&self) -> Result<(), LockError> {
        self.inner
            .fences_ready
            .get_or_try_init(|| async {
                let sql = &self.inner.sql;
                let table = &self.inner.config.fence_table;
                let errors = &self.inner.errors;
                let setup = async {
                    let _admitted = self.admit(Lane::Main, false).await;
                    pool_match!(&self.inner.pools, {
                        Sqlite(p) | Postgres(p) | MySql(p) => {
                            let mut c =
                                p.acquire().await.map_err(|e| errors.map("connecting", e))?;
                            schema::ensure(&mut *c, sql, table, &sql.create_fences, None, errors)
                                .await
                        }
                    })
                };
                tokio::time::timeout(self.inner.config.op_timeout, setup)
                    .await
                    .map_err(|_| {
                        errors.timed_out("creating the fence table", self.inner.config.op_timeout)
                    })?
            })
            .await
            .map(|_| ())
    }

    /// Runs one database operation within the operation timeout. Runs it
    /// again at once when a deadlock or serialization failure rolled it back
    /// (a few times), and when it failed on a broken connection (as many
    /// times as the pools have connections, since each may be one that died
    /// with a server restart): the pools do not ping connections before
    /// handing them out. Only for operations that are safe to send twice;
    /// see [`run_once_sent`](Self::run_once_sent).
    ///
    /// `run` is for writes of the main lane (acquisitions, force releases);
    /// [`read`](Self::read) for its reads, [`upkeep`](Self::upkeep) for
    /// renewals and releases.
    pub(crate) async fn run<T, F, Fut>(&self, op: &str, f: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        self.run_with(op, Lane::Main, true, self.broken_retries(), f)
            .await
    }

    /// As [`run`](Self::run), for a read of the main lane (inspections,
    /// lists): it does not wait for this client's SQLite writes.
    async fn read<T, F, Fut>(&self, op: &str, f: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        self.run_with(op, Lane::Main, false, self.broken_retries(), f)
            .await
    }

    /// As [`run`](Self::run), for renewals and releases (`write`) and the
    /// reads they make: any connection of the pool, never behind waiters.
    async fn upkeep<T, F, Fut>(&self, op: &str, write: bool, f: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        self.run_with(op, Lane::Upkeep, write, self.broken_retries(), f)
            .await
    }

    /// Every connection of the pool may be one that died with a server
    /// restart.
    fn broken_retries(&self) -> usize {
        (self.inner.config.pool_size + upkeep_size(self.inner.config.pool_size) + 1) as usize
    }

    /// Waits for what an operation of `lane` needs before it takes a
    /// connection: a main-lane permit, and on SQLite for a `write` this
    /// client's write turn (in that order, so an upkeep write never waits
    /// for a permit). Held until the operation's last attempt is over.
    ///
    /// # Cancel safety
    /// Cancel safe: both queues are fair and forget a dropped waiter.
    async fn admit(
        &self,
        lane: Lane,
        write: bool,
    ) -> (
        Option<tokio::sync::SemaphorePermit<'_>>,
        Option<tokio::sync::MutexGuard<'_, ()>>,
    ) {
        let permit = match lane {
            // Never closed.
            Lane::Main => self.inner.main_lane.acquire().await.ok(),
            Lane::Upkeep => None,
        };
        let turn = if write && self.inner.config.dialect == Dialect::Sqlite {
            Some(self.inner.sqlite_writes.lock().await)
        } else {
            None
        };
        (permit, turn)
    }

    /// As [`run`](Self::run), but a statement that failed on a broken
    /// connection is not sent again (the error is retryable): for writes
    /// that must not be applied twice. Such operations retry the steps that
    /// are safe to repeat themselves.
    pub(crate) async fn run_once_sent<T, F, Fut>(&self, op: &str, f: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        // SQLite: a fenced write's `BEGIN IMMEDIATE` takes the file's
        // write lock for the whole transaction, user statements included;
        // it does not hold this client's write turn for that long.
        self.run_with(op, Lane::Main, false, 0, f).await
    }

    async fn run_with<T, F, Fut>(
        &self,
        op: &str,
        lane: Lane,
        write: bool,
        broken_retries: usize,
        mut f: F,
    ) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let limit = self.inner.config.op_timeout;
        // One op_timeout, or what is left of the call's (see `call`).
        let until = lock_core::call::request_deadline(limit);
        let dialect = self.inner.config.dialect;
        let _admitted = tokio::time::timeout_at(until, self.admit(lane, write))
            .await
            .map_err(|_| self.inner.errors.timed_out(op, limit))?;
        let (mut conflicts, mut broken) = (0, 0);
        loop {
            match tokio::time::timeout_at(until, f()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if conflicts < CONFLICT_RETRIES && is_conflict(dialect, &e) => {
                    conflicts += 1;
                    tracing::debug!(op, error = %self.inner.errors.shown(&e), "polylock sql: conflict, running again");
                    tokio::task::yield_now().await;
                }
                Ok(Err(e)) if broken < broken_retries && is_broken_connection(dialect, &e) => {
                    broken += 1;
                    tracing::debug!(op, error = %self.inner.errors.shown(&e), "polylock sql: broken connection, running again");
                }
                Ok(Err(e)) => return Err(self.inner.errors.map(op, e)),
                Err(_) => return Err(self.inner.errors.timed_out(op, limit)),
            }
        }
    }

    /// One batched renewal statement for `leases` (distinct names, at most
    /// [`RENEW_CHUNK`]): an answer per lease, in order.
    ///
    /// # Cancel safety
    /// Cancel safe: each row was extended or not.
    async fn renew_chunk(&self, leases: &[&Lease]) -> Vec<Result<Lease, LockError>> {
        if let [one] = leases {
            return vec![self.renew(one).await];
        }
        // Measured before the statement leaves, as for `renew`.
        let sent_at = Instant::now();
        let precision = self.inner.config.dialect.timestamp_precision();
        let grants: Vec<(Duration, i64)> = leases
            .iter()
            .map(|l| {
                let (granted, units) = self
                    .inner
                    .guarantees
                    .granted_ttl(l.renewal_ttl(), precision);
                (granted, i64::try_from(units).unwrap_or(i64::MAX))
            })
            .collect();
        let names: Vec<&str> = leases.iter().map(|l| l.name().as_str()).collect();
        let owners: Vec<String> = leases.iter().map(|l| l.owner().to_string()).collect();
        let versions: Vec<u64> = leases.iter().map(|l| l.fence().get()).collect();
        let units: Vec<i64> = grants.iter().map(|g| g.1).collect();
        let renewed = self.renew_rows(&names, &owners, &versions, &units).await;
        match renewed {
            Ok(renewed) => leases
                .iter()
                .zip(renewed)
                .zip(&grants)
                .map(|((lease, ok), (granted, _))| {
                    if ok {
                        Ok(lease.renewed(*granted, sent_at))
                    } else {
                        Err(Self::lost(lease))
                    }
                })
                .collect(),
            Err(e) => leases
                .iter()
                .map(|_| Err(duplicate(self.inner.config.dialect, &e)))
                .collect(),
        }
    }

    /// Runs the batched renewal for rows given column by column (distinct
    /// names); whether each was extended, in order.
    ///
    /// # Cancel safety
    /// Cancel safe: each row was extended or not.
    async fn renew_rows(
        &self,
        names: &[&str],
        owners: &[String],
        versions: &[u64],
        units: &[i64],
    ) -> Result<Vec<bool>, LockError> {
        let n = names.len();
        let by_name = |extended: Vec<String>| {
            let extended: HashSet<String> = extended.into_iter().collect();
            names
                .iter()
                .map(|n| extended.contains(*n))
                .collect::<Vec<bool>>()
        };
        match (&self.inner.pools, &self.inner.sql.renew_batch) {
            (Pools::Postgres(p), RenewBatch::Arrays(sql)) => {
                let versions: Vec<i64> = versions.iter().map(|&v| v as i64).collect();
                let versions = versions.as_slice();
                let extended = self
                    .upkeep("renew", true, || async move {
                        sqlx::query_scalar::<_, String>(q(sql))
                            .bind(names)
                            .bind(owners)
                            .bind(versions)
                            .bind(units)
                            .fetch_all(p)
                            .await
                    })
                    .await?;
                Ok(by_name(extended))
            }
            (Pools::Sqlite(p), RenewBatch::Returning(texts)) => {
                let (size, sql) = bucket(texts, n);
                let extended = self
                    .upkeep("renew", true, || async move {
                        let mut query = sqlx::query_scalar::<_, String>(q(sql));
                        for i in 0..n {
                            query = query
                                .bind(names[i])
                                .bind(owners[i].as_str())
                                .bind(versions[i] as i64)
                                .bind(units[i]);
                        }
                        // Padding rows: a NULL name matches no row.
                        for _ in n..size {
                            query = query
                                .bind(None::<&str>)
                                .bind(None::<&str>)
                                .bind(None::<i64>)
                                .bind(None::<i64>);
                        }
                        query.fetch_all(p).await
                    })
                    .await?;
                Ok(by_name(extended))
            }
            (Pools::MySql(p), RenewBatch::CountThenRead { update, read }) => {
                let (size, sql) = bucket(update, n);
                let matched = self
                    .upkeep("renew", true, || async move {
                        let mut query = sqlx::query(q(sql));
                        for i in 0..n {
                            query = query
                                .bind(names[i].as_bytes())
                                .bind(owners[i].as_bytes())
                                .bind(versions[i])
                                .bind(units[i]);
                        }
                        for _ in n..size {
                            query = query
                                .bind(None::<&[u8]>)
                                .bind(None::<&[u8]>)
                                .bind(None::<u64>)
                                .bind(None::<i64>);
                        }
                        Ok(query.execute(p).await?.rows_affected())
                    })
                    .await?;
                // Names are distinct, and a row is updated at most once, so
                // as many matched rows as leases means every lease matched.
                if matched == n as u64 {
                    return Ok(vec![true; n]);
                }
                // Which ones: a lease's row is extended now exactly when it
                // still has the lease's owner and version and is live. A row
                // the UPDATE skipped cannot have become so since: a grant
                // changes the version, and an expired holding is never
                // extended. (A row extended by the UPDATE that expired again
                // before this read is reported lost, which it is by then.)
                let (size, sql) = bucket(read, n);
                let rows: Vec<StateRow> = self
                    .upkeep("renew", false, || async move {
                        let mut query = sqlx::query_as(q(sql));
                        for name in names {
                            query = query.bind(name.as_bytes());
                        }
                        for _ in n..size {
                            query = query.bind(None::<&[u8]>);
                        }
                        query.fetch_all(p).await
                    })
                    .await?;
                let rows: HashMap<Vec<u8>, RowState> = rows
                    .into_iter()
                    .map(|(name, owner, version, live)| (name, (owner, version, live)))
                    .collect();
                Ok((0..n)
                    .map(|i| {
                        rows.get(names[i].as_bytes())
                            .is_some_and(|(owner, version, live)| {
                                *live != 0
                                    && *version == versions[i]
                                    && owner.as_deref() == Some(owners[i].as_bytes())
                            })
                    })
                    .collect())
            }
            _ => Err(self.inner.errors.protocol(
                "renew",
                "the batched renewal does not match the database".into(),
            )),
        }
    }

    fn fence(&self, op: &str, version: u64) -> Result<FencingToken, LockError> {
        FencingToken::new(version).ok_or_else(|| {
            self.inner.errors.protocol(
                op,
                "the lock row has version 0; was the table edited by hand?".into(),
            )
        })
    }

    /// A waiting acquire's attempt after its first, in a task of its own
    /// ([`wait::detached`]): a wait cancelled mid-statement then leaves no
    /// row taken by nobody.
    async fn retry_detached(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let (this, req) = (self.clone(), req.clone());
        // The task runs under the caller's call deadline, if any.
        let until = lock_core::call::current();
        wait::detached(
            lock_core::call::until(until, async move { this.try_acquire(&req).await }),
            wait::release_if_won(self.clone()),
        )
        .await
    }

    /// PostgreSQL: records on `req`'s row that a waiter wants its release
    /// notified, until the wait's `deadline` (`wake_until`, see
    /// `Dialect::added_columns`). `true` when the row is held (its release
    /// will notify), `false` when it is free now. Backends whose waiters
    /// poll have no such statement and answer `true`.
    ///
    /// Mutual exclusion does not depend on it: a lost or late answer only
    /// leaves the waiter to the backoff timer.
    async fn want_wake(&self, req: &AcquireRequest, deadline: Instant) -> Result<bool, LockError> {
        let (Some(sql), Pools::Postgres(p)) = (&self.inner.sql.want_wake, &self.inner.pools) else {
            return Ok(true);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let micros = i64::try_from(left.as_micros()).unwrap_or(i64::MAX);
        let name = req.name.as_str();
        let rows = self
            .run("acquire", || async move {
                sqlx::query(q(sql))
                    .bind(name)
                    .bind(micros)
                    .execute(p)
                    .await
                    .map(|done| done.rows_affected())
            })
            .await?;
        Ok(rows > 0)
    }

    /// The version of `name`'s row and whether it is free (`None`: no
    /// row), read in the upkeep lane: the release path.
    async fn after_release(&self, name: &LockName) -> Result<Option<(u64, bool)>, LockError> {
        let sql = &self.inner.sql.after_release;
        let name = name.as_str();
        self.upkeep("release", false, || async move {
            Ok(match &self.inner.pools {
                Pools::Postgres(p) => sqlx::query_as::<_, (i64, bool)>(q(sql))
                    .bind(name)
                    .fetch_optional(p)
                    .await?
                    .map(|(v, free)| (v.max(0) as u64, free)),
                Pools::Sqlite(p) => sqlx::query_as::<_, (i64, i64)>(q(sql))
                    .bind(name)
                    .fetch_optional(p)
                    .await?
                    .map(|(v, free)| (v.max(0) as u64, free != 0)),
                Pools::MySql(p) => sqlx::query_as::<_, (u64, i64)>(q(sql))
                    .bind(name.as_bytes())
                    .fetch_optional(p)
                    .await?
                    .map(|(v, free)| (v, free != 0)),
            })
        })
        .await
    }

    fn unsure(&self) -> std::sync::MutexGuard<'_, HashMap<(LockName, OwnerToken), Unsure>> {
        // Critical sections are single map operations.
        self.inner.unsure.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mark of an earlier attempt for this name and owner that may
    /// have taken the row without an answer, while its row may be live.
    fn unsure_mark(&self, attempt: &(LockName, OwnerToken)) -> Option<Unsure> {
        self.unsure()
            .get(attempt)
            .filter(|m| Instant::now() < m.until)
            .cloned()
    }

    /// The grant id of [`unsure_mark`](Self::unsure_mark).
    fn unsure_grant(&self, attempt: &(LockName, OwnerToken)) -> Option<String> {
        self.unsure_mark(attempt).map(|m| m.grant_id)
    }

    /// Records an attempt sent at `sent_at` whose row, if it ran, carries
    /// `grant_id` and lives until `until`.
    fn mark_unsure(
        &self,
        attempt: &(LockName, OwnerToken),
        until: Instant,
        grant_id: &str,
        sent_at: Instant,
    ) {
        let mut unsure = self.unsure();
        let now = Instant::now();
        // Past their TTL, orphans expire by themselves.
        unsure.retain(|_, m| m.until > now);
        // An attempt reuses the id of the unanswered one before it (see
        // `try_acquire`), so an entry here already has this id.
        let m = unsure.entry(attempt.clone()).or_insert_with(|| Unsure {
            until,
            grant_id: grant_id.to_string(),
            last_sent: sent_at,
        });
        m.until = m.until.max(until);
        m.last_sent = m.last_sent.max(sent_at);
    }

    /// The attempt got an answer: nothing of it is unknown.
    fn settle(&self, attempt: &(LockName, OwnerToken)) {
        self.unsure().remove(attempt);
    }

    /// A waiting acquire ended without a lease (its wait ran out, it
    /// failed, or it was dropped): an attempt of it that got no answer may
    /// still have taken the row, for nobody. No later attempt of this wait
    /// will take it back, so a task frees it by its grant id, two
    /// `op_timeout`s after that attempt started (SQLite: one `op_timeout`
    /// and `busy_timeout`): the statement it sent has then ended in the
    /// database (a server's own statement limit is nine tenths of
    /// `op_timeout`, see `Dialect::session_limits`; SQLite's statement
    /// waits for the file's write lock up to `busy_timeout`), unless the
    /// network held it up longer; such a late grant expires at its TTL, as
    /// before.
    ///
    /// The task decides in the name and owner's turn: it waits for an
    /// attempt still in flight (a retry running in its own task), and acts
    /// only on a mark that no attempt sent after the wait ended changed:
    /// an acquisition of the same owner that took the row back in between
    /// settled the mark (its row is never freed), and one whose own attempt
    /// went unanswered keeps the mark for its own next attempt.
    fn give_back_unanswered(&self, name: LockName, owner: OwnerToken) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        // Marks of attempts sent after this are another acquisition's (the
        // same owner taking the name again), which it may still take back.
        let ended_at = Instant::now();
        runtime.spawn(async move {
            let attempt = (name, owner);
            // An attempt sends its statement (again, after a broken
            // connection) within one op_timeout of its start, and the
            // database ends it within its own limit: nine tenths of
            // op_timeout on a server, SQLite's busy_timeout for the write
            // lock.
            let config = &this.inner.config;
            let limit = config.op_timeout
                + match config.dialect {
                    Dialect::Sqlite => config.busy_timeout,
                    _ => config.op_timeout,
                };
            // An attempt still in flight holds the turn until its answer or
            // its unsure mark is in.
            drop(this.inner.turns.take(&attempt.0, owner).await);
            let Some(mark) = this.unsure_mark(&attempt) else {
                return;
            };
            if mark.last_sent > ended_at {
                return;
            }
            // Until its last statement has surely ended in the database.
            tokio::time::sleep_until(mark.last_sent + limit).await;
            let _turn = this.inner.turns.take(&attempt.0, owner).await;
            // Unchanged: nothing was sent under this mark since, and no
            // answer settled it.
            if this.unsure_mark(&attempt).as_ref() != Some(&mark) {
                return;
            }
            let grant_id = mark.grant_id;
            this.settle(&attempt);
            let freed = this
                .call(this.release_grant(&attempt.0, owner, &grant_id))
                .await;
            match freed {
                Ok(true) => tracing::debug!(name = %attempt.0, "polylock sql: freed the row an unanswered attempt of an ended wait had taken"),
                Ok(false) => {}
                Err(e) => tracing::debug!(name = %attempt.0, error = %e, "polylock sql: could not free what an unanswered attempt may have taken; it expires at its TTL"),
            }
        });
    }

    /// Frees `name`'s row if the grant `grant_id` of `owner` holds it;
    /// `true` when it did.
    async fn release_grant(
        &self,
        name: &LockName,
        owner: OwnerToken,
        grant_id: &str,
    ) -> Result<bool, LockError> {
        let owner = owner.to_string();
        let channel = self.inner.sql.channel.as_str();
        let (name, owner, sql) = (name.as_str(), owner.as_str(), &self.inner.sql.release_grant);
        let freed = self
            .upkeep("release", true, || async move {
                Ok(match &self.inner.pools {
                    Pools::Postgres(p) => sqlx::query(q(sql))
                        .bind(name)
                        .bind(owner)
                        .bind(grant_id)
                        .bind(channel)
                        .fetch_all(p)
                        .await?
                        .len() as u64,
                    Pools::Sqlite(p) => sqlx::query(q(sql))
                        .bind(name)
                        .bind(owner)
                        .bind(grant_id)
                        .execute(p)
                        .await?
                        .rows_affected(),
                    Pools::MySql(p) => sqlx::query(q(sql))
                        .bind(name.as_bytes())
                        .bind(owner.as_bytes())
                        .bind(grant_id.as_bytes())
                        .execute(p)
                        .await?
                        .rows_affected(),
                })
            })
            .await?;
        Ok(freed > 0)
    }

    /// What `inspect` and `list` report for a held row.
    fn holder(&self, op: &str, row: Row) -> Result<HolderInfo, LockError> {
        let left = self.inner.config.dialect.units_to_duration(row.left);
        Ok(
            HolderInfo::new(row.owner, Some(self.fence(op, row.version)?), Some(left))
                .with_meta(row.meta),
        )
    }

    fn lost(lease: &Lease) -> LockError {
        LockError::Lost {
            name: lease.name().to_string(),
        }
    }
}

/// What MySQL's batched renewal reads back for a name: owner, version,
/// and whether the row is live (1) by the database clock.
type RowState = (Option<Vec<u8>>, u64, i64);
/// The same with the name in front, as the read returns it.
type StateRow = (Vec<u8>, Option<Vec<u8>>, u64, i64);

/// A held row as PostgreSQL and SQLite return it from `inspect`: owner,
/// version, time left in units, holder metadata.
type TextHolder = (Option<String>, i64, i64, Option<String>);
/// The same from MySQL, whose columns are bytes.
type BytesHolder = (Option<Vec<u8>>, u64, i64, Option<Vec<u8>>);
/// A row of `list`: the name, then the columns of `inspect`.
type TextRow = (String, Option<String>, i64, i64, Option<String>);
/// The same from MySQL.
type BytesRow = (Vec<u8>, Option<Vec<u8>>, u64, i64, Option<Vec<u8>>);

/// A held row, whichever database it came from.
struct Row {
    /// `None` when the stored bytes are not UTF-8 (MySQL).
    name: Option<String>,
    owner: String,
    version: u64,
    left: i64,
    meta: Option<HolderMeta>,
}

impl Row {
    fn text(
        name: String,
        owner: Option<String>,
        version: i64,
        left: i64,
        meta: Option<String>,
    ) -> Row {
        Row {
            name: Some(name),
            owner: owner.unwrap_or_default(),
            version: u64::try_from(version).unwrap_or(0),
            left,
            meta: meta.as_deref().and_then(HolderMeta::decode),
        }
    }

    fn bytes(
        name: Vec<u8>,
        owner: Option<Vec<u8>>,
        version: u64,
        left: i64,
        meta: Option<Vec<u8>>,
    ) -> Row {
        Row {
            name: String::from_utf8(name).ok(),
            owner: String::from_utf8_lossy(&owner.unwrap_or_default()).into_owned(),
            version,
            left,
            meta: meta
                .as_deref()
                .and_then(|m| std::str::from_utf8(m).ok())
                .and_then(HolderMeta::decode),
        }
    }
}

/// An acquire attempt that got no answer: see [`SqlBackend::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct Unsure {
    /// When the row it may have taken expires.
    until: Instant,
    /// The id its grant carries (and that of every attempt that followed
    /// under this mark).
    grant_id: String,
    /// When the last of those attempts was sent.
    last_sent: Instant,
}

/// A fresh grant id: 16 random hex digits.
fn new_grant_id() -> String {
    format!(
        "{:0width$x}",
        rand::random::<u64>(),
        width = crate::dialect::GRANT_ID_LEN
    )
}

/// An acquire attempt in flight; see [`SqlBackend::try_acquire`].
struct Pending<'a> {
    backend: &'a SqlBackend,
    attempt: (LockName, OwnerToken),
    sent_at: Instant,
    until: Instant,
    grant_id: String,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.backend
                .mark_unsure(&self.attempt, self.until, &self.grant_id, self.sent_at);
        }
    }
}

/// A waiting acquire in progress: see [`SqlBackend::give_back_unanswered`].
struct WaitEnded<'a> {
    backend: &'a SqlBackend,
    req: &'a AcquireRequest,
    with_lease: bool,
}

impl Drop for WaitEnded<'_> {
    fn drop(&mut self) {
        if !self.with_lease {
            self.backend
                .give_back_unanswered(self.req.name.clone(), self.req.owner);
        }
    }
}

/// The bodies of the calls that answer within one `op_timeout`: each runs
/// under one call deadline ([`SqlBackend::call`]), so the statements it
/// makes in a row share that time.
impl SqlBackend {
    /// Runs `f` as one call: every statement in it ends by one `op_timeout`
    /// from now (see [`lock_core::call`]).
    async fn call<F: Future>(&self, f: F) -> F::Output {
        lock_core::call::within(self.inner.config.op_timeout, f).await
    }

    async fn try_acquire_once(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let attempt = (req.name.clone(), req.owner);
        // Held until the answer is in, and any unsure mark is recorded
        // (`pending` is dropped first).
        let limit = self.inner.config.op_timeout;
        let _turn = tokio::time::timeout_at(
            lock_core::call::request_deadline(limit),
            self.inner.turns.take(&req.name, req.owner),
        )
        .await
        .map_err(|_| self.inner.errors.timed_out("acquire", limit))?;
        // Measured before the statement leaves, so the local deadline is
        // never later than the database's expiry.
        let sent_at = Instant::now();
        let (granted, units) = self
            .inner
            .guarantees
            .granted_ttl(req.ttl, self.inner.config.dialect.timestamp_precision());
        let units = i64::try_from(units).unwrap_or(i64::MAX);
        // The id this attempt's grant carries: a fresh one, or after an
        // unanswered attempt that one's, so that its grant (and only it)
        // is taken back.
        let earlier = self.unsure_grant(&attempt);
        let mut unsure = earlier.is_some();
        let grant_id = earlier.unwrap_or_else(new_grant_id);
        // Marks the attempt unsure unless it gets an answer: on an error,
        // and when this future is dropped mid-statement.
        let mut pending = Pending {
            backend: self,
            attempt,
            sent_at,
            until: sent_at + granted,
            grant_id: grant_id.clone(),
            answered: false,
        };
        let owner = req.owner.to_string();
        let meta = req.meta.as_ref().map(HolderMeta::encode);
        let (name, owner, sql) = (req.name.as_str(), owner.as_str(), &self.inner.sql);
        let meta = meta.as_deref();
        let grant_id = grant_id.as_str();
        // Each send after the first (a broken connection) may follow one
        // that ran: it takes back that one's row too (the same grant id).
        let mut statement = || {
            let s = if unsure { &sql.reclaim } else { &sql.acquire };
            unsure = true;
            s
        };
        let won: Result<Option<u64>, LockError> = pool_match!(&self.inner.pools, {
            Postgres(p) | Sqlite(p) => self
                .run("acquire", || {
                    let sql = statement();
                    async move {
                        sqlx::query_scalar::<_, i64>(q(sql))
                            .bind(name)
                            .bind(owner)
                            .bind(units)
                            .bind(meta)
                            .bind(grant_id)
                            .fetch_optional(p)
                            .await
                    }
                })
                .await
                .map(|v| v.map(|v| u64::try_from(v).unwrap_or(0))),
            MySql(p) => self
                .run("acquire", || {
                    let sql = statement();
                    async move {
                        sqlx::query(q(sql))
                            .bind(name.as_bytes())
                            .bind(owner.as_bytes())
                            .bind(units)
                            .bind(meta.map(str::as_bytes))
                            .bind(grant_id.as_bytes())
                            .execute(p)
                            .await
                    }
                })
                .await
                .and_then(|done| {
                    // LAST_INSERT_ID(expr) carries the outcome (see
                    // dialect.rs). Cross-check it with the affected-row
                    // count (with CLIENT_FOUND_ROWS: 1 inserted, 2 updated,
                    // 1 unchanged).
                    match (done.last_insert_id(), done.rows_affected()) {
                        (0, 1) => Ok(None),
                        (1, 1) => Ok(Some(1)),
                        (v, 2) if v > 0 => Ok(Some(v)),
                        (v, n) => Err(self.inner.errors.protocol(
                            "acquire",
                            format!("unexpected outcome: version {v}, {n} rows affected"),
                        )),
                    }
                }),
        });
        // An answer (either way) settles it; an error leaves it unsure.
        let won = won?;
        pending.answered = true;
        self.settle(&pending.attempt);
        match won {
            Some(version) => {
                let fence = self.fence("acquire", version)?;
                Ok(Some(
                    req.lease(fence, granted, sent_at)
                        .in_space(self.inner.space),
                ))
            }
            None => Ok(None),
        }
    }

    async fn renew_once(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.inner.space.check(lease)?;
        let sent_at = Instant::now();
        let (granted, units) = self.inner.guarantees.granted_ttl(
            lease.renewal_ttl(),
            self.inner.config.dialect.timestamp_precision(),
        );
        let units = i64::try_from(units).unwrap_or(i64::MAX);
        let owner = lease.owner().to_string();
        let version = lease.fence().get();
        let (name, owner, sql) = (lease.name().as_str(), owner.as_str(), &self.inner.sql.renew);
        let rows = self
            .upkeep("renew", true, || async move {
                Ok(pool_match!(&self.inner.pools, {
                    Postgres(p) | Sqlite(p) => sqlx::query(q(sql))
                        .bind(name)
                        .bind(owner)
                        .bind(version as i64)
                        .bind(units)
                        .execute(p)
                        .await?
                        .rows_affected(),
                    MySql(p) => sqlx::query(q(sql))
                        .bind(units)
                        .bind(name.as_bytes())
                        .bind(owner.as_bytes())
                        .bind(version)
                        .execute(p)
                        .await?
                        .rows_affected(),
                }))
            })
            .await?;
        if rows == 1 {
            Ok(lease.renewed(granted, sent_at))
        } else {
            Err(Self::lost(lease))
        }
    }

    async fn renew_many_once(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if self.inner.space.any_foreign(leases) {
            return lock_core::renew_each(self, leases).await;
        }
        let mut seen = HashSet::with_capacity(leases.len());
        let (mut batch, mut alone) = (Vec::with_capacity(leases.len()), Vec::new());
        for (i, lease) in leases.iter().enumerate() {
            if seen.insert(lease.name()) {
                batch.push(i);
            } else {
                alone.push(i);
            }
        }
        let chunks = futures::future::join_all(batch.chunks(RENEW_CHUNK).map(|chunk| async move {
            let picked: Vec<&Lease> = chunk.iter().map(|&i| &leases[i]).collect();
            chunk.iter().copied().zip(self.renew_chunk(&picked).await)
        }));
        let singles = futures::future::join_all(
            alone
                .iter()
                .map(|&i| async move { (i, self.renew(&leases[i]).await) }),
        );
        let (chunks, singles) = tokio::join!(chunks, singles);
        let mut answers: Vec<Option<Result<Lease, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        for (i, answer) in chunks.into_iter().flatten().chain(singles) {
            answers[i] = Some(answer);
        }
        answers
            .into_iter()
            .map(|a| a.expect("every lease is in a chunk or renewed alone"))
            .collect()
    }

    async fn release_once(&self, lease: &Lease) -> Result<(), LockError> {
        self.inner.space.check(lease)?;
        let owner = lease.owner().to_string();
        let version = lease.fence().get();
        let channel = self.inner.sql.channel.as_str();
        let (name, owner, sql) = (
            lease.name().as_str(),
            owner.as_str(),
            &self.inner.sql.release,
        );
        // How many times the statement went out: a resend (after a broken
        // connection) may follow a first send that freed the row.
        let sends = std::sync::atomic::AtomicU32::new(0);
        let sends = &sends;
        let freed = self
            .upkeep("release", true, || async move {
                sends.fetch_add(1, Ordering::Relaxed);
                Ok(match &self.inner.pools {
                    Pools::Postgres(p) => sqlx::query(q(sql))
                        .bind(name)
                        .bind(owner)
                        .bind(version as i64)
                        .bind(channel)
                        .fetch_all(p)
                        .await?
                        .len() as u64,
                    Pools::Sqlite(p) => sqlx::query(q(sql))
                        .bind(name)
                        .bind(owner)
                        .bind(version as i64)
                        .execute(p)
                        .await?
                        .rows_affected(),
                    Pools::MySql(p) => sqlx::query(q(sql))
                        .bind(name.as_bytes())
                        .bind(owner.as_bytes())
                        .bind(version)
                        .execute(p)
                        .await?
                        .rows_affected(),
                })
            })
            .await?;
        if freed > 0 {
            return Ok(());
        }
        // Not freed: the row is no longer this holding. The version says
        // whether anyone was granted the lock since (it goes up with every
        // grant and never back): then the critical section was not
        // exclusive, and the caller must hear it. The same version on a
        // free row means we released it already, or it was force-released
        // with nobody taking it since; on a row with another owner, the
        // lease was never this one's (forged).
        match self.after_release(lease.name()).await? {
            None => Ok(()),
            Some((v, free)) if v == version && free => Ok(()),
            // The first send may have freed it and a waiter taken it since
            // (on PostgreSQL the release's own NOTIFY wakes one at once):
            // not evidence of a loss. One that happened before is told by
            // the lease's local deadline, which lock-core checks.
            Some((v, _)) if v > version && sends.load(Ordering::Relaxed) > 1 => Ok(()),
            Some(_) => Err(Self::lost(lease)),
        }
    }
}

#[async_trait]
impl LockBackend for SqlBackend {
    /// One conditional upsert; see the crate docs for the statement.
    ///
    /// An attempt that failed after its statement may have reached the
    /// database (an operation timeout, a broken connection) may have taken
    /// the row with nobody told. The next attempt of this client for the
    /// same name and owner (the retry of a waiting acquire, or the caller's
    /// own) therefore also takes a live row held under its own owner and
    /// written by that attempt, so it does not wait a TTL for its own
    /// orphan. The version goes up as for any grant, so the orphan's
    /// holding is superseded. Only that attempt's row is taken back: each
    /// grant carries the id of the attempt that wrote it (`grant_id`), and
    /// a retry reuses the unanswered attempt's id, so a row the same owner
    /// holds through another acquisition (of this client or another) is
    /// refused as anyone's.
    ///
    /// The same owner may also be a second acquisition (an explicit
    /// [`Owner`](lock_core::Owner) taking the name again while the retry
    /// of its cancelled wait still runs in its own task): that one must
    /// never take back the other's live row: its row carries another id.
    /// This client also sends one acquire per name and owner at a time,
    /// and decides whether to take back only in its turn: an answered
    /// grant in between settles the unsure attempt, and the next statement
    /// is the plain acquire with a fresh id.
    ///
    /// # Cancel safety
    /// Not cancel safe: if dropped after the statement was sent, the row may
    /// have been taken with nobody holding the lease; it expires at its TTL
    /// (or is taken back by the next attempt, as above).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.call(self.try_acquire_once(req)).await
    }

    /// PostgreSQL: woken by LISTEN/NOTIFY, with backoff as the fallback.
    /// After its first refused attempt a waiter records on the row that it
    /// wants the release notified (one more statement per wait, none per
    /// retry), since releases nobody waits for send no NOTIFY; if the row
    /// is free by then, it tries again at once.
    /// MySQL and SQLite: jittered exponential backoff up to `max_poll`.
    ///
    /// # Cancel safety
    /// Dropping the future while it waits leaves no lock behind (the
    /// waiter's state is a broadcast receiver, and on PostgreSQL the row's
    /// `wake_until`, which only makes releases notify until the wait's
    /// deadline). The attempts after the
    /// first run in a task of their own ([`wait::detached`]), so a wait
    /// cancelled while its statement is on the way (queued on SQLite's
    /// worker thread, or sent to the server) lets the statement finish and
    /// releases the row if it won it. An attempt that got no answer at all
    /// (its `op_timeout` ran out) may still take the row later: when the
    /// wait ends without the lock, however it ends (dropped too, also
    /// during the first attempt), a task frees what that attempt took, by
    /// its attempt id, once its statement has ended in the database (two
    /// `op_timeout`s after the attempt started; SQLite: one and
    /// `busy_timeout`). Only a statement the network held up longer than
    /// that can still leave a row that nobody holds until its TTL.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        // Ended without a lease (also when dropped): what an unanswered
        // attempt of it may have taken is given back.
        let mut ended = WaitEnded {
            backend: self,
            req,
            with_lease: false,
        };
        // Fixed once: the wait counts from the call, also while LISTEN
        // comes up, and `wake_until` is this deadline, not a fresh one.
        let deadline = req.wait_deadline();
        let backoff = req.backoff_or(backoff(self.inner.config.max_poll));
        let mut tries = 0u32;
        // PostgreSQL: whether the row records that this waiter wants its
        // release notified (a release notifies only then).
        let asked = AtomicBool::new(self.inner.sql.want_wake.is_none() || req.wait.is_zero());
        let asked = &asked;
        // Each attempt, with the statements it chains (a retry, the
        // request to be notified), answers within one op_timeout.
        let attempt = || {
            tries += 1;
            let first = tries == 1;
            self.call(async move {
                let won = if first {
                    self.try_acquire(req).await?
                } else {
                    self.retry_detached(req).await?
                };
                if won.is_some() || asked.load(Ordering::Relaxed) {
                    return Ok(won);
                }
                if self.want_wake(req, deadline).await? {
                    asked.store(true, Ordering::Relaxed);
                    return Ok(None);
                }
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                // Free by now: its release came before our request, and
                // there is no later one to be told of.
                self.retry_detached(req).await
            })
        };
        let acquired = match &self.inner.hub {
            None => wait::acquire_loop(attempt, deadline, backoff, std::future::pending).await,
            Some(hub) => {
                // Listening before the first attempt means no release is
                // missed; if LISTEN is slow to come up, the backoff timer
                // covers the gap, so do not wait long for it.
                hub.ensure_listening(req.wait.min(LISTEN_READY_WAIT)).await;
                let name: Arc<str> = Arc::from(req.name.as_str());
                wait::acquire_loop(attempt, deadline, backoff, || hub.arm(&name)).await
            }
        };
        ended.with_lease = matches!(acquired, Ok(Some(_)));
        self.inner.space.stamp(acquired)
    }

    /// Extends a live row whose owner and version match.
    ///
    /// # Cancel safety
    /// Cancel safe: the row was extended or not; the old deadline holds.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.call(self.renew_once(lease)).await
    }

    /// Renews up to 256 leases per statement (chunks of a
    /// larger batch run at once, each on its own connection), with the
    /// checks of [`renew`](LockBackend::renew) for every row and each
    /// lease's own TTL; see `RenewBatch` in `dialect.rs` for each
    /// database's statement. A name given twice in one batch is renewed by
    /// `renew` for the second and later leases, since one row can answer
    /// only one of them in a join.
    ///
    /// # Cancel safety
    /// Cancel safe: each row was extended or not; the old deadlines hold.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.call(self.renew_many_once(leases)).await
    }

    /// Frees the row if owner and version match (PostgreSQL: and notifies
    /// waiters in the same statement). Otherwise `Err(Lost)` if the lock was
    /// granted to anyone after this holding (the row's version is higher,
    /// whether or not they still hold it) or the row is held under another
    /// owner, and `Ok` if the row is free at this version (released before,
    /// or force-released and not taken since). After the statement was sent
    /// again (a broken connection), a higher version is `Ok`: the first
    /// send may have freed the row.
    ///
    /// # Cancel safety
    /// Cancel safe: the row was freed or not; it expires at its TTL.
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.call(self.release_once(lease)).await
    }

    /// Reads the row; the time left is computed by the database.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        let (name, sql) = (name.as_str(), &self.inner.sql.inspect);
        let row: Option<Row> = self
            .read("inspect", || async move {
                Ok(pool_match!(&self.inner.pools, {
                    Postgres(p) | Sqlite(p) => {
                        sqlx::query_as::<_, TextHolder>(q(sql))
                            .bind(name)
                            .fetch_optional(p)
                            .await?
                            .map(|(o, v, l, m)| Row::text(String::new(), o, v, l, m))
                    },
                    MySql(p) => sqlx::query_as::<_, BytesHolder>(q(sql))
                        .bind(name.as_bytes())
                        .fetch_optional(p)
                        .await?
                        .map(|(o, v, l, m)| Row::bytes(Vec::new(), o, v, l, m)),
                }))
            })
            .await?;
        row.map(|r| self.holder("inspect", r)).transpose()
    }

    /// One statement: the held rows whose name starts with `prefix`,
    /// unexpired by the database clock, in byte order of the names (see
    /// `dialect.rs` for how each database is made to match exactly and
    /// case-sensitively). A row whose name is no valid lock name was not
    /// written by polylock and is left out.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        let limit = validate_list(prefix, limit)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = &self.inner.sql.list;
        let pattern = like_prefix(prefix);
        let pattern = pattern.as_str();
        let rows: Vec<Row> = self
            .read("list", || async move {
                Ok(match &self.inner.pools {
                    Pools::Sqlite(p) => sqlx::query_as::<_, TextRow>(q(sql))
                        .bind(prefix)
                        .bind(limit)
                        .fetch_all(p)
                        .await?
                        .into_iter()
                        .map(|(n, o, v, l, m)| Row::text(n, o, v, l, m))
                        .collect(),
                    Pools::Postgres(p) => sqlx::query_as::<_, TextRow>(q(sql))
                        .bind(pattern)
                        .bind(limit)
                        .fetch_all(p)
                        .await?
                        .into_iter()
                        .map(|(n, o, v, l, m)| Row::text(n, o, v, l, m))
                        .collect(),
                    Pools::MySql(p) => sqlx::query_as::<_, BytesRow>(q(sql))
                        .bind(pattern.as_bytes())
                        .bind(limit)
                        .fetch_all(p)
                        .await?
                        .into_iter()
                        .map(|(n, o, v, l, m)| Row::bytes(n, o, v, l, m))
                        .collect(),
                })
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let Some(name) = row.name.as_deref().and_then(|n| LockName::new(n).ok()) else {
                tracing::debug!("polylock sql: list skips a row whose name is not a lock name");
                continue;
            };
            out.push((name, self.holder("list", row)?));
        }
        Ok(out)
    }

    /// Frees a live row whoever holds it; the version is left alone, so the
    /// next holder still gets a higher fencing token.
    ///
    /// # Cancel safety
    /// Cancel safe: the row was freed or not.
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        let channel = self.inner.sql.channel.as_str();
        let (name, sql) = (name.as_str(), &self.inner.sql.force_release);
        let freed = self
            .run("force_release", || async move {
                Ok(match &self.inner.pools {
                    Pools::Postgres(p) => sqlx::query(q(sql))
                        .bind(name)
                        .bind(channel)
                        .fetch_all(p)
                        .await?
                        .len() as u64,
                    Pools::Sqlite(p) => sqlx::query(q(sql))
                        .bind(name)
                        .execute(p)
                        .await?
                        .rows_affected(),
                    Pools::MySql(p) => sqlx::query(q(sql))
                        .bind(name.as_bytes())
                        .execute(p)
                        .await?
                        .rows_affected(),
                })
            })
            .await?;
        Ok(freed > 0)
    }

    /// See [`LockSpace`]: leases of another space are refused before any
    /// I/O.
    fn lock_space(&self) -> Option<LockSpace> {
        Some(self.inner.space)
    }

    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// docs/sql.md: renewals and releases get `ceil(pool_size / 4)`
    /// connections beyond `pool_size`, at most 4.
    #[test]
    fn upkeep_pool_sizes() {
        assert_eq!(upkeep_size(1), 1);
        assert_eq!(upkeep_size(4), 1);
        assert_eq!(upkeep_size(8), 2);
        assert_eq!(upkeep_size(9), 3);
        assert_eq!(upkeep_size(100), 4);
    }

    /// docs/sql.md: every SQLite connection of a client runs in WAL mode
    /// with `synchronous=FULL`, which the strict fencing of SQLite rests on
    /// (a committed version survives a power loss).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_connections_are_wal_and_synchronous_full() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        let backend = SqlBackend::connect(&url).await.unwrap();
        let Pools::Sqlite(pool) = backend.pools() else {
            panic!("not a SQLite pool");
        };
        // Every connection the pool holds at once, not just the first.
        let mut held = Vec::new();
        for _ in 0..pool.size().max(1) {
            held.push(pool.acquire().await.unwrap());
        }
        for conn in &mut held {
            let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
                .fetch_one(&mut **conn)
                .await
                .unwrap();
            let (sync,): (i64,) = sqlx::query_as("PRAGMA synchronous")
                .fetch_one(&mut **conn)
                .await
                .unwrap();
            assert_eq!(mode, "wal");
            assert_eq!(sync, 2, "synchronous=FULL is 2");
        }
    }

    fn request(name: &str) -> AcquireRequest {
        AcquireRequest::new(
            LockName::new(name).unwrap(),
            OwnerToken::random(),
            Duration::from_secs(30),
            Duration::ZERO,
        )
        .unwrap()
    }

    fn waiting(name: &str, wait: Duration) -> AcquireRequest {
        AcquireRequest::new(
            LockName::new(name).unwrap(),
            OwnerToken::random(),
            Duration::from_secs(30),
            wait,
        )
        .unwrap()
    }

    /// A release NOTIFYs only while a waiter has asked for it (`want_wake`,
    /// until its wait's deadline), and the notification wakes waiters armed
    /// on that name only. Notifications reach the listener in commit order,
    /// so one sent by an earlier release would be delivered before a later
    /// one's: a waiter not yet woken when the later one arrived was not
    /// notified.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_release_notifies_only_waiters_that_asked() {
        let server = tokio::task::spawn_blocking(testkit::PostgresServer::start)
            .await
            .unwrap()
            .expect("start PostgreSQL");
        let waiter = SqlBackend::connect(&server.url()).await.unwrap();
        let holder = SqlBackend::connect(&server.url()).await.unwrap();
        let hub = waiter.inner.hub.as_ref().expect("PostgreSQL has a hub");
        hub.ensure_listening(Duration::from_secs(10)).await;
        assert!(hub.is_listening());

        // Nobody asked.
        let lease = holder
            .try_acquire(&request("quiet"))
            .await
            .unwrap()
            .unwrap();
        let quiet = hub.arm(&Arc::from("quiet"));
        holder.release(&lease).await.unwrap();
        // Asked, but the wait ended before the release.
        let lease = holder.try_acquire(&request("late")).await.unwrap().unwrap();
        let late = hub.arm(&Arc::from("late"));
        let short = waiting("late", Duration::from_millis(100));
        assert!(
            waiter
                .want_wake(&short, short.wait_deadline())
                .await
                .unwrap(),
            "held"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.release(&lease).await.unwrap();

        let lease = holder.try_acquire(&request("job")).await.unwrap().unwrap();
        let other = hub.arm(&Arc::from("other-job"));
        let mine = hub.arm(&Arc::from("job"));
        let job = waiting("job", Duration::from_secs(30));
        assert!(
            waiter.want_wake(&job, job.wait_deadline()).await.unwrap(),
            "held"
        );
        holder.release(&lease).await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), mine)
            .await
            .expect("the release's NOTIFY woke the waiter that asked");
        assert!(
            quiet.now_or_never().is_none(),
            "a release nobody waited for sent a NOTIFY"
        );
        assert!(
            late.now_or_never().is_none(),
            "a release sent a NOTIFY after the waiter's deadline"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(300), other)
                .await
                .is_err(),
            "a waiter on another name was woken"
        );
        // A free row: the waiter is told to try again at once.
        assert!(
            !waiter.want_wake(&job, job.wait_deadline()).await.unwrap(),
            "free"
        );

        // force_release notifies a waiter that asked, too.
        let lease = holder.try_acquire(&request("job")).await.unwrap().unwrap();
        let mine = hub.arm(&Arc::from("job"));
        assert!(
            waiter.want_wake(&job, job.wait_deadline()).await.unwrap(),
            "held"
        );
        assert!(holder.force_release(lease.name()).await.unwrap());
        tokio::time::timeout(Duration::from_secs(2), mine)
            .await
            .expect("force_release's NOTIFY woke the waiter");
    }

    /// After the database restarts, the listener reconnects and LISTENs
    /// again, so releases wake waiters as before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_listener_comes_back_after_a_restart() {
        let server = Arc::new(
            tokio::task::spawn_blocking(testkit::PostgresServer::start)
                .await
                .unwrap()
                .expect("start PostgreSQL"),
        );
        let waiter = SqlBackend::connect(&server.url()).await.unwrap();
        let holder = SqlBackend::connect(&server.url()).await.unwrap();
        let hub = waiter.inner.hub.as_ref().unwrap();
        hub.ensure_listening(Duration::from_secs(10)).await;
        assert!(hub.is_listening());
        // A waiter armed before the outage is woken when the listener is
        // back (it may have missed a release meanwhile).
        let armed_before = hub.arm(&Arc::from("job"));
        let s = Arc::clone(&server);
        tokio::task::spawn_blocking(move || s.restart().expect("restart"))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), armed_before)
            .await
            .expect("woken when the listener reconnected");
        let started = Instant::now();
        while !hub.is_listening() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "not listening again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let lease = loop {
            // The holder's pool reconnects on its own; the first attempts
            // may see the restart.
            match holder.try_acquire(&request("job")).await {
                Ok(Some(l)) => break l,
                Ok(None) => panic!("nobody holds it"),
                Err(e) if e.is_retryable() && started.elapsed() < Duration::from_secs(10) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("{e}"),
            }
        };
        let mine = hub.arm(&Arc::from("job"));
        let job = waiting("job", Duration::from_secs(30));
        assert!(
            waiter.want_wake(&job, job.wait_deadline()).await.unwrap(),
            "held"
        );
        holder.release(&lease).await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), mine)
            .await
            .expect("NOTIFY after the restart woke the waiter");
    }
}
