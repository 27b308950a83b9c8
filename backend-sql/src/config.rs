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
//! is handed to the driver (so driver options such as `sslmode=` still work):
//!
//! | option            | default                      | meaning |
//! |-------------------|------------------------------|---------|
//! | `table`           | `polylock_locks`             | lock table name |
//! | `fence_table`     | `polylock_fences`            | fence table of [`crate::SqlBackend::fenced`] |
//! | `max_poll`        | 100ms (MySQL, SQLite), 500ms (PostgreSQL) | longest pause between attempts of a waiting acquire (PostgreSQL: fallback when a notification is missed) |
//! | `pool_size`       | 8 (SQLite: 4)                | connections per client; renewals and releases use their own `ceil(pool_size / 4)` (at most 4) |
//! | `connect_timeout` | 10s                          | time to open a connection |
//! | `op_timeout`      | 10s                          | time for one lock operation, then a retryable error |
//! | `busy_timeout`    | 5s                           | SQLite only: wait for the file's write lock |
//!
//! Durations are `250ms`, `2s`, `1m`, `500us`, or a bare number of
//! milliseconds. Table names are lowercase SQL identifiers
//! (`[a-z_][a-z0-9_]*`, at most 48 characters), checked here, before any I/O.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::options::{parse_duration, positive_duration};
use lock_core::{redact_url, LockError};
use url::Url;

use crate::dialect::Dialect;

/// The default lock table.
pub const DEFAULT_TABLE: &str = "polylock_locks";
/// The default fence table.
pub const DEFAULT_FENCE_TABLE: &str = "polylock_fences";
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
    /// The URL as given, secrets included: only ever handed to the driver.
    pub(crate) secret_url: String,
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
            .field("url", &redact_url(&self.secret_url))
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
        let shown = redact_url(url);
        let scheme = url
            .split_once(':')
            .map(|(s, _)| s.to_ascii_lowercase())
            .ok_or_else(|| config(format!("`{shown}` is not a SQL lock URL (no scheme)")))?;
        match scheme.as_str() {
            "sqlite" => parse_sqlite(url, &shown),
            "postgres" | "postgresql" => parse_server(url, &shown, Dialect::Postgres),
            "mysql" | "mariadb" => parse_server(url, &shown, Dialect::MySql),
            other => Err(config(format!(
                "`{shown}`: unknown SQL scheme `{other}`; expected sqlite, postgres, \
                 postgresql, mysql or mariadb"
            ))),
        }
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
    pub fn redacted_url(&self) -> String {
        redact_url(&self.secret_url)
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
            return Err(config("max_poll must be above zero".into()));
        }
        self.max_poll = max_poll;
        Ok(self)
    }
}

fn config(msg: String) -> LockError {
    LockError::Config(msg)
}

/// polylock's own query options, removed before the driver sees the URL.
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

/// Splits the query into polylock's options and the driver's pairs.
fn split_options(
    pairs: Vec<(String, String)>,
    shown: &str,
) -> Result<(Options, Vec<(String, String)>), LockError> {
    let mut o = Options::default();
    let mut rest = Vec::new();
    for (key, value) in pairs {
        let bad = |what: &str| config(format!("`{shown}`: option `{key}`: {what}"));
        match key.replace('-', "_").as_str() {
            "table" => {
                validate_table(&value)?;
                o.table = Some(value);
            }
            "fence_table" => {
                validate_table(&value)?;
                o.fence_table = Some(value);
            }
            "max_poll" => {
                let d = parse_duration(&value).map_err(|e| bad(&e))?;
                if d.is_zero() {
                    return Err(bad("must be above zero"));
                }
                o.max_poll = Some(d);
            }
            "pool_size" | "max_connections" => {
                let n: u32 = value
                    .parse()
                    .map_err(|_| bad("expected a number of connections"))?;
                if !(1..=1000).contains(&n) {
                    return Err(bad("must be between 1 and 1000"));
                }
                o.pool_size = Some(n);
            }
            "connect_timeout" => {
                o.connect_timeout = Some(positive_duration(&value).map_err(|e| bad(&e))?)
            }
            "op_timeout" => o.op_timeout = Some(positive_duration(&value).map_err(|e| bad(&e))?),
            "busy_timeout" => o.busy_timeout = Some(parse_duration(&value).map_err(|e| bad(&e))?),
            _ => rest.push((key, value)),
        }
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
        return Err(config(format!(
            "table name {name:?} is not accepted: use a lowercase SQL identifier \
             ([a-z_][a-z0-9_]*, at most {MAX_TABLE_NAME} characters)"
        )));
    }
    Ok(())
}

fn parse_sqlite(url: &str, shown: &str) -> Result<SqlConfig, LockError> {
    let rest = &url["sqlite:".len()..];
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, q),
        None => (rest, ""),
    };
    let path = percent_decode(path).ok_or_else(|| {
        config(format!(
            "`{shown}`: the path is not valid percent-encoded UTF-8"
        ))
    })?;
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let memory_mode = pairs.iter().any(|(k, v)| k == "mode" && v == "memory");
    if path.is_empty() || path == ":memory:" || path.starts_with("file::memory:") || memory_mode {
        return Err(config(format!(
            "`{shown}`: an in-memory SQLite database cannot lock across processes \
             (each connection sees its own); use a file, e.g. sqlite:///var/lib/app/locks.db"
        )));
    }
    let (o, rest) = split_options(pairs, shown)?;
    if let Some((k, _)) = rest.first() {
        return Err(config(format!(
            "`{shown}`: unknown option `{k}` for sqlite (known: table, fence_table, max_poll, \
             pool_size, connect_timeout, op_timeout, busy_timeout)"
        )));
    }
    Ok(SqlConfig {
        dialect: Dialect::Sqlite,
        secret_url: url.to_string(),
        driver_url: url.to_string(),
        password: None,
        endpoint: path.clone(),
        table: o.table.unwrap_or_else(|| DEFAULT_TABLE.into()),
        fence_table: o.fence_table.unwrap_or_else(|| DEFAULT_FENCE_TABLE.into()),
        max_poll: o.max_poll.unwrap_or(Duration::from_millis(100)),
        pool_size: o.pool_size.unwrap_or(4),
        connect_timeout: o.connect_timeout.unwrap_or(Duration::from_secs(10)),
        op_timeout: o.op_timeout.unwrap_or(Duration::from_secs(10)),
        busy_timeout: o.busy_timeout.unwrap_or(Duration::from_secs(5)),
        sqlite_path: Some(PathBuf::from(path)),
    })
}

fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

fn parse_server(url: &str, shown: &str, dialect: Dialect) -> Result<SqlConfig, LockError> {
    let mut parsed = Url::parse(url).map_err(|e| config(format!("`{shown}`: {e}")))?;
    let pairs: Vec<(String, String)> = parsed
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let (o, rest) = split_options(pairs, shown)?;
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
    let host = parsed.host_str().unwrap_or("").to_string();
    let endpoint = match socket {
        Some(s) => s,
        None if host.is_empty() => {
            return Err(config(format!(
                "`{shown}`: no host; expected {}://USER:PASSWORD@HOST:PORT/DATABASE",
                dialect.backend_name()
            )))
        }
        None => format!("{host}:{}", parsed.port().unwrap_or(default_port)),
    };
    let password = parsed
        .password()
        .map(|p| percent_decode(p).unwrap_or_else(|| p.to_string()))
        .filter(|p| !p.is_empty())
        .or_else(|| {
            rest.iter()
                .find(|(k, _)| k == "password")
                .map(|(_, v)| v.clone())
        });
    // The driver gets the URL without polylock's options, and MySQL's
    // scheme for MariaDB.
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest.iter());
    }
    let mut driver_url = parsed.to_string();
    if let Some(tail) = driver_url.strip_prefix("mariadb:") {
        driver_url = format!("mysql:{tail}");
    }
    Ok(SqlConfig {
        dialect,
        secret_url: url.to_string(),
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
        connect_timeout: o.connect_timeout.unwrap_or(Duration::from_secs(10)),
        op_timeout: o.op_timeout.unwrap_or(Duration::from_secs(10)),
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
    fn debug_hides_password() {
        let c = SqlConfig::parse("mysql://app:hunter2@h:3307/db?password=hunter2").unwrap();
        let d = format!("{c:?}");
        assert!(!d.contains("hunter2"), "{d}");
        assert!(d.contains("h:3307"), "{d}");
    }
}
