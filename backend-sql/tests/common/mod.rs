//! Shared servers, fresh tables, and plain SQL for set-up.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use backend_sql::{Dialect, SqlBackend};
use lock_core::{AcquireRequest, Lease, LockBackend, LockName, OwnerToken};
use testkit::{MariaDbServer, PostgresServer};

/// One PostgreSQL for the tests that do not stop or restart it.
pub(crate) fn pg() -> &'static PostgresServer {
    static PG: OnceLock<PostgresServer> = OnceLock::new();
    PG.get_or_init(|| PostgresServer::start().expect("start PostgreSQL"))
}

/// One MariaDB for the tests that do not stop or restart it.
pub(crate) fn maria() -> &'static MariaDbServer {
    static MARIA: OnceLock<MariaDbServer> = OnceLock::new();
    MARIA.get_or_init(|| MariaDbServer::start().expect("start MariaDB"))
}

/// A random suffix for table and lock names, so tests sharing a server
/// never see each other's rows.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}_{:08x}", rand::random::<u32>())
}

/// A database for one test: where it is, and a lock URL with a fresh lock
/// table.
pub(crate) struct Db {
    pub(crate) dialect: Dialect,
    /// The URL without polylock options, for plain sqlx set-up.
    pub(crate) base: String,
    /// `base` with `table=<fresh>`.
    pub(crate) url: String,
    /// The SQLite file's directory, removed on drop.
    _dir: Option<tempfile::TempDir>,
}

impl Db {
    /// A lock URL on this database with `options` added; one already in
    /// the URL (the fresh `table=`) is replaced, since an option may be
    /// given only once.
    pub(crate) fn url_with(&self, options: &str) -> String {
        let given: Vec<&str> = options
            .split('&')
            .map(|p| p.split('=').next().unwrap_or(p))
            .collect();
        let (base, query) = self.url.split_once('?').unwrap_or((&self.url, ""));
        let kept = query
            .split('&')
            .filter(|p| !p.is_empty() && !given.contains(&p.split('=').next().unwrap_or(p)));
        let query: Vec<&str> = kept.chain(std::iter::once(options)).collect();
        format!("{base}?{}", query.join("&"))
    }

    /// A new client.
    pub(crate) async fn client(&self) -> SqlBackend {
        SqlBackend::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("{:?}: connect: {e}", self.dialect))
    }
}

fn with_query(base: &str, query: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{query}")
}

/// The lock table a lock URL names with `table=`.
pub(crate) fn table_of(url: &str) -> String {
    url.split("table=")
        .nth(1)
        .and_then(|t| t.split('&').next())
        .expect("a URL with table=")
        .to_string()
}

/// SQLite in a fresh temp file.
pub(crate) fn sqlite() -> Db {
    let dir = tempfile::tempdir().expect("temp dir");
    let path: PathBuf = dir.path().join("locks.db");
    let base = format!("sqlite://{}", path.display());
    Db {
        dialect: Dialect::Sqlite,
        url: with_query(&base, &format!("table={}", unique("locks"))),
        base,
        _dir: Some(dir),
    }
}

/// The shared PostgreSQL, with a fresh lock table.
pub(crate) fn postgres() -> Db {
    let base = pg().url();
    Db {
        dialect: Dialect::Postgres,
        url: with_query(&base, &format!("table={}", unique("locks"))),
        base,
        _dir: None,
    }
}

/// The shared MariaDB, with a fresh lock table.
pub(crate) fn mariadb() -> Db {
    let base = maria().url();
    Db {
        dialect: Dialect::MySql,
        url: with_query(&base, &format!("table={}", unique("locks"))),
        base,
        _dir: None,
    }
}

/// The three databases, started (if needed) off the async runtime.
pub(crate) async fn all() -> Vec<Db> {
    tokio::task::spawn_blocking(|| vec![sqlite(), postgres(), mariadb()])
        .await
        .expect("start databases")
}

/// The URL for sqlx's Any driver (which creates a missing SQLite file only
/// when asked).
fn any_url(base: &str) -> String {
    sqlx::any::install_default_drivers();
    if base.starts_with("sqlite:") {
        format!("{base}?mode=rwc")
    } else {
        base.replacen("mariadb://", "mysql://", 1)
    }
}

/// Runs plain SQL statements (set-up the tests need outside the backend).
pub(crate) async fn exec(base: &str, statements: &[&str]) {
    let pool = sqlx::AnyPool::connect(&any_url(base))
        .await
        .unwrap_or_else(|e| panic!("connect for set-up: {e}"));
    for s in statements {
        sqlx::query(sqlx::AssertSqlSafe(s.to_string()))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    pool.close().await;
}

/// Reads one text column of one row.
pub(crate) async fn fetch_text(base: &str, sql: &str) -> String {
    let pool = sqlx::AnyPool::connect(&any_url(base))
        .await
        .expect("connect");
    let (v,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pool.close().await;
    v
}

/// One raw attempt with a fresh owner.
pub(crate) async fn try_once(client: &SqlBackend, name: &str, ttl: Duration) -> Option<Lease> {
    let req = AcquireRequest::new(
        LockName::new(name).unwrap(),
        OwnerToken::random(),
        ttl,
        Duration::ZERO,
    )
    .unwrap();
    client.try_acquire(&req).await.expect("try_acquire")
}

/// A plain connection outside any polylock client, for tests that hold row
/// locks of their own.
pub(crate) async fn raw_connection(base: &str) -> sqlx::AnyConnection {
    use sqlx::Connection;
    sqlx::AnyConnection::connect(&any_url(base))
        .await
        .unwrap_or_else(|e| panic!("raw connection: {e}"))
}

/// A request for `name` under `owner`.
pub(crate) fn request(
    name: &str,
    owner: OwnerToken,
    ttl: Duration,
    wait: Duration,
) -> AcquireRequest {
    AcquireRequest::new(LockName::new(name).unwrap(), owner, ttl, wait).unwrap()
}

/// `url` (of a server listening on `port`) pointed at `via` instead.
pub(crate) fn through(url: &str, port: u16, via: u16) -> String {
    url.replacen(&format!(":{port}/"), &format!(":{via}/"), 1)
}
