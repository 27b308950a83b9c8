//! Lock URL → client options. The only place URLs are parsed.
//!
//! Accepted URLs:
//! - `sqlite://PATH` or `sqlite:PATH` (`sqlite:///abs/path.db`,
//!   `sqlite://relative.db`); the file is created if missing. In-memory
//!   databases (`sqlite::memory:`, `sqlite://:memory:`, `?mode=memory`) are
//!   refused: they cannot lock across processes.
//! - `postgres://USER:PASSWORD@HOST:PORT/DB` (or `postgresql://`).
//! - `mysql://USER:PASSWORD@HOST:PORT/DB` (or `mariadb://`).
//!
//! polylock's options go in the query string and are removed before the rest
//! is handed to the driver (so driver options such as `sslmode=` still work;
//! a SQLite URL takes polylock's options only):
//!
//! | option            | default                      | meaning |
//! |-------------------|------------------------------|---------|
//! | `table`           | `polylock_locks`             | lock table name |
//! | `fence_table`     | `polylock_fences`            | fence table of [`crate::SqlBackend::fenced`] |
//! | `max_poll`        | 100ms (MySQL, SQLite), 500ms (PostgreSQL) | longest pause between attempts of a waiting acquire (PostgreSQL: fallback when a notification is missed) |
//! | `pool_size`       | 8 (SQLite: 4)                | connections per client for acquisitions, inspections and fenced writes, in one pool with `ceil(pool_size / 4)` more (at most 4) that only renewals and releases may use beyond them |
//! | `connect_timeout` | 10s                          | time to open a connection |
//! | `op_timeout`      | 10s                          | time for one lock operation, then a retryable error |
//! | `busy_timeout`    | 5s                           | SQLite only: wait for the file's write lock |
//!
//! Durations follow [`lock_core::duration`]: `250ms`, `1.5s`, `2m`, `1h`,
//! `1m30s`; a bare number is milliseconds. Table names are lowercase SQL identifiers
//! (`[a-z_][a-z0-9_]*`, at most 48 characters), checked here, before any I/O.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::url::LockUrl;
use lock_core::{redact_url, LockError};

use crate::dialect::Dialect;

/// The default lock table.
pub const DEFAULT_TABLE: &str = "polylock_locks";
/// The default fence table.
pub const DEFAULT_FENCE_TABLE: &str = "polylock_fences";
/// The default for `op_timeout=`.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(10);
/// The default for `connect_timeout=`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest accepted table name: `polylock_` + name must fit PostgreSQL's
/// 63-byte identifiers (the LISTEN/NOTIFY channel).
pub const MAX_TABLE_NAME: usize = 48;

/// Options of one SQL client, parsed from a lock URL.
///
/// `Debug` shows the URL with its password replaced by `***`.
///
/// ```
/// use backend_sql::{SqlConfig, Dialect};
/// let c = SqlConfig::parse("postgres://app:hunter2@db:5433/locks?table=my_locks&max_poll=50ms").unwrap();
/// assert_eq!(c.dialect(), Dialect::Postgres);
/// assert_eq!(c.table(), "my_locks");
/// assert_eq!(c.endpoint(), "db:5433");
/// assert!(!format!("{c:?}").contains("hunter2"));
/// assert!(SqlConfig::parse("sqlite::memory:").is_err());
/// ```
#[derive(Clone)]
pub struct SqlConfig {
    pub(crate) dialect: Dialect,
    /// The URL with its password replaced.
    pub(crate) redacted: String,
    /// The URL for the driver: polylock's options removed, scheme normalised.
    pub(crate) driver_url: String,
    /// The password, to scrub it from driver messages.
    pub(crate) password: Option<String>,
    pub(crate) endpoint: String,
    pub(crate) table: String,
    pub(crate) fence_table: String,
    pub(crate) max_poll: Duration,
    pub(crate) pool_size: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
    pub(crate) busy_timeout: Duration,
    pub(crate) sqlite_path: Option<PathBuf>,
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConfig")
            .field("dialect", &self.dialect)
            .field("url", &self.redacted)
            .field("table", &self.table)
            .field("fence_table", &self.fence_table)
            .field("max_poll", &self.max_poll)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

impl SqlConfig {
    /// Parses a lock URL. Every error is a [`LockError::Config`] raised
    /// before any I/O, and never contains the password.
    pub fn parse(url: &str) -> Result<SqlConfig, LockError> {
        let scheme = lock_core::url::scheme_of(url).map(str::to_ascii_lowercase);
        match scheme.as_deref() {
            Some("sqlite") => parse_sqlite(url),
            Some("postgres" | "postgresql") => parse_server(url, Dialect::Postgres),
            Some("mysql" | "mariadb") => parse_server(url, Dialect::MySql),
            Some(other) => Err(LockError::Config(format!(
                "`{}`: unknown SQL scheme `{other}`; expected {}",
                redact_url(url),
                crate::URL_SCHEMES.join(", ")
            ))),
            None => Err(LockError::Config(format!(
                "`{}` is not a SQL lock URL (no scheme)",
                redact_url(url)
            ))),
        }
    }

    /// The URL the driver connects with: polylock's options removed, the
    /// scheme normalised (`mariadb://` becomes `mysql://`), the password
    /// included. For tools that open their own driver connection to the
    /// same database (`polylock bench --url` measures the raw driver next
    /// to the backend); never log it, print [`redacted_url`](Self::redacted_url).
    ///
    /// ```
    /// use backend_sql::SqlConfig;
    /// let c = SqlConfig::parse("mariadb://u:pw@db:3306/app?table=locks&ssl-mode=DISABLED").unwrap();
    /// assert_eq!(c.driver_url(), "mysql://u:pw@db:3306/app?ssl-mode=DISABLED");
    /// ```
    pub fn driver_url(&self) -> &str {
        &self.driver_url
    }

    /// The database kind.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The lock table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The fence table.
    pub fn fence_table(&self) -> &str {
        &self.fence_table
    }

    /// Where the database is, for messages: `host:port`, a socket path, or
    /// the SQLite file. Never contains credentials.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// The longest pause between two attempts of a waiting acquire.
    pub fn max_poll(&self) -> Duration {
        self.max_poll
    }

    /// Connections per client.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// The time allowed for one lock operation.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Sets the lock table (validated as an identifier).
    pub fn with_table(mut self, table: &str) -> Result<Self, LockError> {
        validate_table(table)?;
        self.table = table.to_string();
        Ok(self)
    }

    /// Sets the longest pause between two attempts of a waiting acquire.
    pub fn with_max_poll(mut self, max_poll: Duration) -> Result<Self, LockError> {
        if max_poll.is_zero() {
            return Err(LockError::Config("max_poll must be above zero".into()));
        }
        self.max_poll = max_poll;
        Ok(self)
    }
}

/// polylock's own options (after `-` → `_`; `max_connections` is an alias
/// of `pool_size`), removed before the driver sees the URL.
const OPTIONS: &[&str] = &[
    "table",
    "fence_table",
    "max_poll",
    "pool_size",
    "max_connections",
    "connect_timeout",
    "op_timeout",
    "busy_timeout",
];

fn canonical(key: &str) -> String {
    match key.replace('-', "_").as_str() {
        "max_connections" => "pool_size".into(),
        k => k.into(),
    }
}

fn is_ours(key: &str) -> bool {
    OPTIONS.contains(&key.replace('-', "_").as_str())
}

/// polylock's query options of `u`.
#[derive(Default)]
struct Options {
    table: Option<String>,
    fence_table: Option<String>,
    max_poll: Option<Duration>,
    pool_size: Option<u32>,
    connect_timeout: Option<Duration>,
    op_timeout: Option<Duration>,
    busy_timeout: Option<Duration>,
}

/// polylock's options of `u`, and the driver's pairs.
fn split_options(u: &LockUrl) -> Result<(Options, Vec<(String, String)>), LockError> {
    let mut o = Options::default();
    let mut rest = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for (key, value) in u.options() {
        if !is_ours(key) {
            rest.push((key.to_string(), value.to_string()));
            continue;
        }
        // Two spellings of one option are one option given twice.
        let name = canonical(key);
        if seen.contains(&name) {
            return Err(u.error(format_args!("option `{name}` is given twice")));
        }
        match name.as_str() {
            "table" => {
                validate_table(value)?;
                o.table = Some(value.to_string());
            }
            "fence_table" => {
                validate_table(value)?;
                o.fence_table = Some(value.to_string());
            }
            "max_poll" => o.max_poll = Some(u.positive_duration(key, value)?),
            "pool_size" => {
                let n: u32 = value
                    .parse()
                    .map_err(|_| u.option_error(key, "expected a number of connections"))?;
                if !(1..=1000).contains(&n) {
                    return Err(u.option_error(key, "must be between 1 and 1000"));
                }
                o.pool_size = Some(n);
            }
            "connect_timeout" => o.connect_timeout = Some(u.positive_duration(key, value)?),
            "op_timeout" => o.op_timeout = Some(u.positive_duration(key, value)?),
            "busy_timeout" => o.busy_timeout = Some(u.duration(key, value)?),
            _ => unreachable!("OPTIONS and this match name the same options"),
        }
        seen.push(name);
    }
    let table = o.table.as_deref().unwrap_or(DEFAULT_TABLE);
    let fence_table = o.fence_table.as_deref().unwrap_or(DEFAULT_FENCE_TABLE);
    if table == fence_table {
        return Err(u.error(format_args!(
            "the lock table and the fence table are both `{table}`: they hold different rows, \
             so they need two names"
        )));
    }
    Ok((o, rest))
}

/// A lowercase SQL identifier that needs no quoting in any dialect.
pub(crate) fn validate_table(name: &str) -> Result<(), LockError> {
    let ok_first = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let ok_rest = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok_first || !ok_rest || name.len() > MAX_TABLE_NAME {
        return Err(LockError::Config(format!(
            "table name {name:?} is not accepted: use a lowercase SQL identifier \
             ([a-z_][a-z0-9_]*, at most {MAX_TABLE_NAME} characters)"
        )));
    }
    Ok(())
}

fn parse_sqlite(url: &str) -> Result<SqlConfig, LockError> {
    let u = LockUrl::parse_file(url, "sqlite://PATH")?;
    let path = u.path().to_string();
    let memory_mode = u.options().any(|(k, v)| k == "mode" && v == "memory");
    if path.is_empty() || path == ":memory:" || path.starts_with("file::memory:") || memory_mode {
        return Err(u.error(
            "an in-memory SQLite database cannot lock across processes \
             (each connection sees its own); use a file, e.g. sqlite:///var/lib/app/locks.db",
        ));
    }
    let (o, rest) = split_options(&u)?;
    if let Some((k, _)) = rest.first() {
        return Err(u.unknown_option(
            k,
            "table, fence_table, max_poll, pool_size, connect_timeout, op_timeout, \
             busy_timeout (sqlite)",
        ));
    }
    Ok(SqlConfig {
        dialect: Dialect::Sqlite,
        redacted: u.redacted().to_string(),
        driver_url: url.to_string(),
        password: None,
        endpoint: path.clone(),
        table: o.table.unwrap_or_else(|| DEFAULT_TABLE.into()),
        fence_table: o.fence_table.unwrap_or_else(|| DEFAULT_FENCE_TABLE.into()),
        max_poll: o.max_poll.unwrap_or(Duration::from_millis(100)),
        pool_size: o.pool_size.unwrap_or(4),
        connect_timeout: o.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        op_timeout: o.op_timeout.unwrap_or(DEFAULT_OP_TIMEOUT),
        busy_timeout: o.busy_timeout.unwrap_or(Duration::from_secs(5)),
        sqlite_path: Some(PathBuf::from(path)),
    })
}

fn parse_server(url: &str, dialect: Dialect) -> Result<SqlConfig, LockError> {
    let usage = format!(
        "{}://USER:PASSWORD@HOST:PORT/DATABASE",
        dialect.backend_name()
    );
    let u = LockUrl::parse_optional_host(url, &usage)?;
    let (o, rest) = split_options(&u)?;
    let default_port = match dialect {
        Dialect::Postgres => 5432,
        _ => 3306,
    };
    // Where the server is, for messages: a socket given in the query wins,
    // then host:port.
    let socket = rest
        .iter()
        .find(|(k, v)| (k == "host" && v.starts_with('/')) || k == "socket")
        .map(|(_, v)| v.clone());
    let endpoint = match (socket, u.hosts()) {
        (Some(s), _) => s,
        (None, []) => return Err(u.error(format_args!("no host; expected {usage}"))),
        (None, [host]) => host.endpoint(default_port).map_err(|e| u.error(e))?,
        (None, _) => {
            return Err(u.error(format_args!("a SQL URL names one server; expected {usage}")))
        }
    };
    let password = u
        .password()
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .or_else(|| {
            rest.iter()
                .find(|(k, _)| k == "password")
                .map(|(_, v)| v.clone())
        });
    // The driver gets the URL without polylock's options, and MySQL's
    // scheme for MariaDB.
    let driver = u.driver_url(|k| !is_ours(k));
    let driver_scheme = match u.scheme() {
        "mariadb" => "mysql",
        s => s,
    };
    let driver_url = format!(
        "{driver_scheme}{}",
        &driver[driver.find(':').unwrap_or(0)..]
    );
    Ok(SqlConfig {
        dialect,
        redacted: u.redacted().to_string(),
        driver_url,
        password,
        endpoint,
        table: o.table.unwrap_or_else(|| DEFAULT_TABLE.into()),
        fence_table: o.fence_table.unwrap_or_else(|| DEFAULT_FENCE_TABLE.into()),
        max_poll: o.max_poll.unwrap_or(match dialect {
            Dialect::Postgres => Duration::from_millis(500),
            _ => Duration::from_millis(100),
        }),
        pool_size: o.pool_size.unwrap_or(8),
        connect_timeout: o.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        op_timeout: o.op_timeout.unwrap_or(DEFAULT_OP_TIMEOUT),
        busy_timeout: o.busy_timeout.unwrap_or(Duration::from_secs(5)),
        sqlite_path: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match SqlConfig::parse(url) {
            Err(LockError::Config(m)) => m,
            other => panic!("{url}: expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn sqlite_paths() {
        let c = SqlConfig::parse("sqlite:///tmp/x%20y.db?table=t1").unwrap();
        assert_eq!(
            c.sqlite_path.as_deref(),
            Some(std::path::Path::new("/tmp/x y.db"))
        );
        assert_eq!(c.table(), "t1");
        let c = SqlConfig::parse("sqlite://rel.db").unwrap();
        assert_eq!(c.endpoint(), "rel.db");
        let c = SqlConfig::parse("sqlite:other.db").unwrap();
        assert_eq!(c.endpoint(), "other.db");
        assert_eq!(c.pool_size(), 4);
    }

    #[test]
    fn sqlite_memory_is_refused() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://",
            "sqlite:",
            "sqlite://file::memory:?cache=shared",
            "sqlite://x.db?mode=memory",
        ] {
            let m = err(url);
            assert!(m.contains("in-memory"), "{url}: {m}");
        }
        assert!(err("sqlite://x.db?bogus=1").contains("unknown option `bogus`"));
    }

    #[test]
    fn server_urls() {
        let c = SqlConfig::parse(
            "postgresql://u:p%40ss@db.example:6000/x?sslmode=disable&max_poll=20ms&pool_size=3",
        )
        .unwrap();
        assert_eq!(c.endpoint(), "db.example:6000");
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(c.max_poll(), Duration::from_millis(20));
        assert_eq!(c.pool_size(), 3);
        assert!(c.driver_url.contains("sslmode=disable"));
        assert!(!c.driver_url.contains("max_poll"));
        let c = SqlConfig::parse("mariadb://u:pw@127.0.0.1/x?table=abc").unwrap();
        assert_eq!(c.dialect(), Dialect::MySql);
        assert_eq!(c.endpoint(), "127.0.0.1:3306");
        assert!(c.driver_url.starts_with("mysql://"), "{}", c.driver_url);
        assert!(!c.driver_url.contains("table="));
        let c = SqlConfig::parse("postgres:///db?host=/run/postgresql").unwrap();
        assert_eq!(c.endpoint(), "/run/postgresql");
    }

    #[test]
    fn bad_options_and_tables() {
        for t in [
            "",
            "Locks",
            "1abc",
            "a-b",
            "a;drop table x",
            "a.b",
            &"x".repeat(49),
        ] {
            let m = err(&format!("postgres://u:secretpw@h/db?table={t}"));
            assert!(m.contains("table name"), "{t}: {m}");
            assert!(!m.contains("secretpw"));
        }
        assert!(err("postgres://u:secretpw@h/db?max_poll=fast").contains("max_poll"));
        assert!(err("postgres://u:secretpw@h/db?max_poll=0").contains("above zero"));
        assert!(err("mysql://u:secretpw@h/db?pool_size=0").contains("pool_size"));
        let m = err("oracle://u:secretpw@h/db");
        assert!(
            m.contains("unknown SQL scheme") && !m.contains("secretpw"),
            "{m}"
        );
        let m = err("postgres://u:secretpw@/db");
        assert!(!m.contains("secretpw"), "{m}");
    }

    #[test]
    fn the_documented_defaults() {
        let lite = SqlConfig::parse("sqlite:///tmp/x.db").unwrap();
        let pg = SqlConfig::parse("postgres://u@db/app").unwrap();
        let my = SqlConfig::parse("mysql://u@db/app").unwrap();
        assert_eq!(lite.max_poll(), Duration::from_millis(100));
        assert_eq!(my.max_poll(), Duration::from_millis(100));
        assert_eq!(pg.max_poll(), Duration::from_millis(500));
        assert_eq!(
            (lite.pool_size(), pg.pool_size(), my.pool_size()),
            (4, 8, 8)
        );
        for c in [&lite, &pg, &my] {
            assert_eq!(c.table(), "polylock_locks");
            assert_eq!(c.fence_table, "polylock_fences");
            assert_eq!(c.connect_timeout, Duration::from_secs(10));
            assert_eq!(c.op_timeout, Duration::from_secs(10));
        }
        assert_eq!(lite.busy_timeout, Duration::from_secs(5));
    }

    #[test]
    fn the_lock_and_fence_tables_need_two_names() {
        for url in [
            "sqlite:///tmp/x.db?table=locks&fence_table=locks",
            "postgres://u@db/app?table=polylock_fences",
            "mysql://u@db/app?fence_table=polylock_locks",
        ] {
            assert!(err(url).contains("two names"), "{url}");
        }
        assert!(SqlConfig::parse("postgres://u@db/app?table=a&fence_table=b").is_ok());
    }

    #[test]
    fn an_option_given_twice_is_refused() {
        for url in [
            "postgres://u:secretpw@h/db?table=a&table=b",
            "mysql://u:secretpw@h/db?pool_size=2&max_connections=3",
            "mysql://u:secretpw@h/db?max-poll=1s&max_poll=2s",
            "sqlite:///tmp/x.db?op_timeout=1s&op_timeout=2s",
        ] {
            let m = err(url);
            assert!(m.contains("given twice"), "{url}: {m}");
            assert!(!m.contains("secretpw"), "{m}");
        }
    }

    #[test]
    fn debug_hides_password() {
        let c = SqlConfig::parse("mysql://app:hunter2@h:3307/db?password=hunter2").unwrap();
        let d = format!("{c:?}");
        assert!(!d.contains("hunter2"), "{d}");
        assert!(d.contains("h:3307"), "{d}");
    }
}
