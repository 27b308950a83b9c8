//! The SQL of each dialect, in one place.
//!
//! Every statement is built once per client from the (validated) table names,
//! so the hot paths only bind values. The semantics are the same everywhere:
//!
//! - acquire: ONE conditional upsert that takes the row only when it is
//!   absent, released (`owner IS NULL`) or expired by the DATABASE clock, and
//!   bumps `version`, which is read back as the fencing token;
//! - renew: extends only a live row whose owner AND version match;
//! - release: frees only a row whose owner AND version match (expired or not);
//! - the row is never deleted, so `version` never goes back.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ExpiryClock, FencingGuarantee, Guarantees, WaitMechanism};

/// Which database a client talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite: a file shared by the processes of one machine.
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB.
    MySql,
}

impl Dialect {
    /// Every dialect, for tables and tests.
    pub const ALL: [Dialect; 3] = [Dialect::Sqlite, Dialect::Postgres, Dialect::MySql];

    /// The backend name used in errors, guarantees and URLs.
    pub fn backend_name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
        }
    }

    /// The resolution of the database's timestamps, which is also the
    /// granularity of granted TTLs: SQLite's clock counts milliseconds,
    /// PostgreSQL's `timestamptz` and MySQL's `DATETIME(6)` microseconds.
    pub fn timestamp_precision(self) -> Duration {
        match self {
            Dialect::Sqlite => Duration::from_millis(1),
            Dialect::Postgres | Dialect::MySql => Duration::from_micros(1),
        }
    }

    /// Converts a database duration in units of the timestamp precision back
    /// to a [`Duration`] (negative values clamp to zero).
    pub(crate) fn units_to_duration(self, units: i64) -> Duration {
        let units = u64::try_from(units).unwrap_or(0);
        match self {
            Dialect::Sqlite => Duration::from_millis(units),
            Dialect::Postgres | Dialect::MySql => Duration::from_micros(units),
        }
    }

    /// The `CREATE TABLE` for the lock table `table`, exactly as this crate
    /// runs it. Teams that create schema by hand can run this text (see also
    /// `docs/sql.md`).
    ///
    /// ```
    /// use backend_sql::Dialect;
    /// let ddl = Dialect::MySql.lock_table_ddl("polylock_locks");
    /// assert!(ddl.contains("VARBINARY(512)"));
    /// ```
    pub fn lock_table_ddl(self, table: &str) -> String {
        match self {
            // TEXT under SQLite's default BINARY collation compares bytes:
            // case, Unicode normalisation and trailing spaces all matter.
            // expires_at is milliseconds since the Unix epoch.
            Dialect::Sqlite => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  \
                 name TEXT NOT NULL PRIMARY KEY,\n  \
                 owner TEXT NULL,\n  \
                 version INTEGER NOT NULL,\n  \
                 expires_at INTEGER NOT NULL\n) WITHOUT ROWID"
            ),
            // COLLATE "C": byte order, deterministic, whatever the database
            // default is.
            Dialect::Postgres => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  \
                 name TEXT COLLATE \"C\" NOT NULL PRIMARY KEY,\n  \
                 owner TEXT NULL,\n  \
                 version BIGINT NOT NULL,\n  \
                 expires_at TIMESTAMPTZ NOT NULL\n)"
            ),
            // VARBINARY: byte comparison. The default collations of MySQL
            // and MariaDB are case-insensitive (and many are PAD SPACE), which
            // would make "Job" and "job", or "a" and "a ", one lock.
            // expires_at is UTC (written with UTC_TIMESTAMP(6)).
            Dialect::MySql => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  \
                 name VARBINARY(512) NOT NULL,\n  \
                 owner VARBINARY(64) NULL,\n  \
                 version BIGINT UNSIGNED NOT NULL,\n  \
                 expires_at DATETIME(6) NOT NULL,\n  \
                 PRIMARY KEY (name)\n) ENGINE=InnoDB"
            ),
        }
    }

    /// The `CREATE TABLE` for the fence table `table` used by
    /// [`SqlBackend::fenced`](crate::SqlBackend::fenced): the highest fencing
    /// token accepted per resource.
    pub fn fence_table_ddl(self, table: &str) -> String {
        match self {
            Dialect::Sqlite => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  \
                 resource TEXT NOT NULL PRIMARY KEY,\n  \
                 token INTEGER NOT NULL\n) WITHOUT ROWID"
            ),
            Dialect::Postgres => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  \
                 resource TEXT COLLATE \"C\" NOT NULL PRIMARY KEY,\n  \
                 token BIGINT NOT NULL\n)"
            ),
            Dialect::MySql => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  \
                 resource VARBINARY(512) NOT NULL,\n  \
                 token BIGINT UNSIGNED NOT NULL,\n  \
                 PRIMARY KEY (resource)\n) ENGINE=InnoDB"
            ),
        }
    }

    /// The statement that records `token` for `resource` in the fence table
    /// `table` if no higher token was accepted before, for applications that
    /// add the check to their own transactions by hand.
    ///
    /// Parameters: resource (text; bytes on MySQL), token (integer). Run it
    /// FIRST in the transaction of the write it guards (it locks the fence
    /// row until commit), then:
    /// - PostgreSQL and SQLite: the write is current if the statement returns
    ///   a row; roll back otherwise.
    /// - MySQL/MariaDB: then `SELECT token FROM table WHERE resource = ?`;
    ///   the write is current if it returns the same token; roll back
    ///   otherwise.
    ///
    /// ```
    /// use backend_sql::Dialect;
    /// let sql = Dialect::Postgres.fence_check_sql("polylock_fences");
    /// assert!(sql.contains("token <= EXCLUDED.token"));
    /// ```
    pub fn fence_check_sql(self, table: &str) -> String {
        match self {
            Dialect::Sqlite => format!(
                "INSERT INTO {table} (resource, token) VALUES (?1, ?2) \
                 ON CONFLICT (resource) DO UPDATE SET token = excluded.token \
                 WHERE {table}.token <= excluded.token RETURNING token"
            ),
            Dialect::Postgres => format!(
                "INSERT INTO {table} AS f (resource, token) VALUES ($1, $2) \
                 ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token \
                 WHERE f.token <= EXCLUDED.token RETURNING token"
            ),
            Dialect::MySql => format!(
                "INSERT INTO {table} (resource, token) VALUES (?, ?) \
                 ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))"
            ),
        }
    }
}

/// What a client of `dialect` promises. Works without a server, so callers
/// (the conformance suite, docs) can read it before connecting.
///
/// ```
/// use backend_sql::{guarantees, Dialect};
/// use lock_core::WaitMechanism;
/// assert_eq!(guarantees(Dialect::Postgres).wait, WaitMechanism::Notify);
/// assert_eq!(guarantees(Dialect::Sqlite).wait, WaitMechanism::Poll);
/// ```
pub fn guarantees(dialect: Dialect) -> Guarantees {
    let mut g = Guarantees::new(dialect.backend_name());
    // The row is never deleted and the version only ever goes up, in a
    // durable table. What breaks it is outside the protocol: restoring an
    // older backup, deleting the SQLite file, dropping the table, or failing
    // over to an asynchronous replica that missed commits (see docs/sql.md).
    g.fencing = FencingGuarantee::Strict;
    g.fair_fifo = false;
    // Expiry is judged in the same statement that takes the row, by the
    // clock of whatever runs that statement: the server for PostgreSQL and
    // MySQL, but SQLite runs inside the client process, so there it is the
    // client machine's wall clock.
    g.expiry_clock = match dialect {
        Dialect::Sqlite => ExpiryClock::ClientHost,
        Dialect::Postgres | Dialect::MySql => ExpiryClock::Server,
    };
    g.survives_restart = true;
    // No replica awareness: a failover to an async replica can lose the row.
    g.survives_failover = false;
    g.wait = match dialect {
        Dialect::Postgres => WaitMechanism::Notify,
        Dialect::Sqlite | Dialect::MySql => WaitMechanism::Poll,
    };
    g.min_ttl = dialect.timestamp_precision();
    g.ttl_granularity = dialect.timestamp_precision();
    g.force_release = true;
    g
}

/// The statements of one client, built from its table names.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) create_locks: Arc<str>,
    pub(crate) create_fences: Arc<str>,
    /// Returns a row when the table exists (one bind: the table name).
    pub(crate) table_exists: Arc<str>,
    /// Selects every column of the lock table and no row: checks its shape.
    pub(crate) probe_locks: Arc<str>,
    /// Binds: name, owner, ttl units. PG/SQLite: returns `version` when won.
    /// MySQL: the OK packet's last-insert-id is the version when won, 0 when not.
    pub(crate) acquire: Arc<str>,
    /// Binds (PG/SQLite): name, owner, version, ttl units.
    /// Binds (MySQL): ttl units, name, owner, version.
    pub(crate) renew: Arc<str>,
    /// Binds: name, owner, version (PG: + notify channel). PG returns a row
    /// per freed row; others report rows affected.
    pub(crate) release: Arc<str>,
    /// As `acquire`, but also takes a live row held under the same owner:
    /// for a retry after an attempt whose answer was lost (see
    /// `SqlBackend::try_acquire`).
    pub(crate) reclaim: Arc<str>,
    /// Binds: name. Returns the row's version.
    pub(crate) version_of: Arc<str>,
    /// Binds: name. Returns the row's version and whether it is free
    /// (`owner IS NULL`): what a release that matched nothing looks at.
    pub(crate) after_release: Arc<str>,
    /// Binds: name, owner, version. Returns a row when that holding is live
    /// by the database clock, and locks the row until the end of the
    /// transaction (PG, MySQL; SQLite's write transaction locks the file).
    pub(crate) holding: Arc<str>,
    /// Binds: name. Returns owner, version, time left in units.
    pub(crate) inspect: Arc<str>,
    /// Binds: name (PG: + notify channel).
    pub(crate) force_release: Arc<str>,
    /// Binds: resource, token.
    pub(crate) fence_check: Arc<str>,
    /// Binds: resource. Returns the token.
    pub(crate) fence_read: Arc<str>,
    /// The LISTEN/NOTIFY channel (PostgreSQL).
    pub(crate) channel: String,
}

/// SQLite's clock in milliseconds since the Unix epoch. `julianday('now')`
/// is the same for every use inside one statement and has millisecond
/// resolution; ROUND undoes the floating-point division.
const SQLITE_NOW_MS: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

impl Statements {
    pub(crate) fn new(dialect: Dialect, table: &str, fence_table: &str) -> Self {
        let t = table;
        let channel = format!("polylock_{table}");
        let s = |x: String| -> Arc<str> { Arc::from(x) };
        match dialect {
            Dialect::Sqlite => {
                let now = SQLITE_NOW_MS;
                Statements {
                    create_locks: s(dialect.lock_table_ddl(t)),
                    create_fences: s(dialect.fence_table_ddl(fence_table)),
                    table_exists: s(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1".into(),
                    ),
                    probe_locks: s(format!(
                        "SELECT name, owner, version, expires_at FROM {t} WHERE 0 = 1"
                    )),
                    acquire: s(format!(
                        "INSERT INTO {t} (name, owner, version, expires_at) \
                         VALUES (?1, ?2, 1, {now} + ?3) \
                         ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                         version = {t}.version + 1, expires_at = excluded.expires_at \
                         WHERE {t}.owner IS NULL OR {t}.expires_at <= {now} \
                         RETURNING version"
                    )),
                    reclaim: s(format!(
                        "INSERT INTO {t} (name, owner, version, expires_at) \
                         VALUES (?1, ?2, 1, {now} + ?3) \
                         ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                         version = {t}.version + 1, expires_at = excluded.expires_at \
                         WHERE {t}.owner IS NULL OR {t}.expires_at <= {now} \
                         OR {t}.owner = excluded.owner \
                         RETURNING version"
                    )),
                    renew: s(format!(
                        "UPDATE {t} SET expires_at = {now} + ?4 \
                         WHERE name = ?1 AND owner = ?2 AND version = ?3 AND expires_at > {now}"
                    )),
                    release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now} \
                         WHERE name = ?1 AND owner = ?2 AND version = ?3"
                    )),
                    version_of: s(format!("SELECT version FROM {t} WHERE name = ?1")),
                    after_release: s(format!(
                        "SELECT version, owner IS NULL FROM {t} WHERE name = ?1"
                    )),
                    holding: s(format!(
                        "SELECT version FROM {t} WHERE name = ?1 AND owner = ?2 \
                         AND version = ?3 AND expires_at > {now}"
                    )),
                    inspect: s(format!(
                        "SELECT owner, version, expires_at - {now} FROM {t} \
                         WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    force_release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now} \
                         WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    fence_check: s(dialect.fence_check_sql(fence_table)),
                    fence_read: s(format!(
                        "SELECT token FROM {fence_table} WHERE resource = ?1"
                    )),
                    channel,
                }
            }
            Dialect::Postgres => {
                // clock_timestamp(), not now(): now() is frozen at the start
                // of the transaction, so a statement that waited on a row
                // lock would judge expiry by a stale time.
                let now = "clock_timestamp()";
                let ttl = |p: &str| format!("{now} + {p}::bigint * INTERVAL '1 microsecond'");
                Statements {
                    create_locks: s(dialect.lock_table_ddl(t)),
                    create_fences: s(dialect.fence_table_ddl(fence_table)),
                    table_exists: s("SELECT 1 WHERE to_regclass($1) IS NOT NULL".into()),
                    probe_locks: s(format!(
                        "SELECT name, owner, version, expires_at FROM {t} WHERE false"
                    )),
                    acquire: s(format!(
                        "INSERT INTO {t} AS l (name, owner, version, expires_at) \
                         VALUES ($1, $2, 1, {exp}) \
                         ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, \
                         version = l.version + 1, expires_at = {exp} \
                         WHERE l.owner IS NULL OR l.expires_at <= {now} \
                         RETURNING version",
                        exp = ttl("$3")
                    )),
                    reclaim: s(format!(
                        "INSERT INTO {t} AS l (name, owner, version, expires_at) \
                         VALUES ($1, $2, 1, {exp}) \
                         ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, \
                         version = l.version + 1, expires_at = {exp} \
                         WHERE l.owner IS NULL OR l.expires_at <= {now} \
                         OR l.owner = EXCLUDED.owner \
                         RETURNING version",
                        exp = ttl("$3")
                    )),
                    renew: s(format!(
                        "UPDATE {t} SET expires_at = {exp} \
                         WHERE name = $1 AND owner = $2 AND version = $3 AND expires_at > {now}",
                        exp = ttl("$4")
                    )),
                    // The NOTIFY is part of the release statement, so it is
                    // sent exactly when the release commits.
                    release: s(format!(
                        "WITH freed AS (UPDATE {t} SET owner = NULL, expires_at = {now} \
                         WHERE name = $1 AND owner = $2 AND version = $3 RETURNING name) \
                         SELECT pg_notify($4, name)::text FROM freed"
                    )),
                    version_of: s(format!("SELECT version FROM {t} WHERE name = $1")),
                    after_release: s(format!(
                        "SELECT version, owner IS NULL FROM {t} WHERE name = $1"
                    )),
                    // FOR SHARE: an acquirer taking the row (expired by
                    // now or not) waits for the fenced write to commit.
                    holding: s(format!(
                        "SELECT version FROM {t} WHERE name = $1 AND owner = $2 \
                         AND version = $3 AND expires_at > {now} FOR SHARE"
                    )),
                    inspect: s(format!(
                        "SELECT owner, version, \
                         (EXTRACT(EPOCH FROM (expires_at - {now})) * 1000000)::bigint \
                         FROM {t} WHERE name = $1 AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    force_release: s(format!(
                        "WITH freed AS (UPDATE {t} SET owner = NULL, expires_at = {now} \
                         WHERE name = $1 AND owner IS NOT NULL AND expires_at > {now} \
                         RETURNING name) \
                         SELECT pg_notify($2, name)::text FROM freed"
                    )),
                    fence_check: s(dialect.fence_check_sql(fence_table)),
                    fence_read: s(format!(
                        "SELECT token FROM {fence_table} WHERE resource = $1"
                    )),
                    channel,
                }
            }
            Dialect::MySql => {
                // UTC_TIMESTAMP(6): microseconds, independent of the session
                // time zone, and constant within one statement.
                let now = "UTC_TIMESTAMP(6)";
                Statements {
                    create_locks: s(dialect.lock_table_ddl(t)),
                    create_fences: s(dialect.fence_table_ddl(fence_table)),
                    table_exists: s("SELECT 1 FROM information_schema.tables \
                         WHERE table_schema = DATABASE() AND table_name = ?"
                        .into()),
                    probe_locks: s(format!(
                        "SELECT name, owner, version, expires_at FROM {t} WHERE 1 = 0"
                    )),
                    // One statement, atomic under the row lock InnoDB takes
                    // for the duplicate key. MySQL has no RETURNING, so the
                    // outcome travels in LAST_INSERT_ID(expr), which the
                    // server puts in the OK packet of this very statement:
                    // - a new row: version 1, LAST_INSERT_ID(1);
                    // - a free or expired row: LAST_INSERT_ID(version + 1);
                    // - a held row: LAST_INSERT_ID(0), and nothing changes.
                    // ON DUPLICATE KEY UPDATE assignments run left to right
                    // and later ones see earlier ones, so `version` is
                    // decided first (reading the old owner and expires_at)
                    // and the others follow LAST_INSERT_ID(), never 0 for a
                    // winner since versions start at 1. IF() evaluates only
                    // the branch it picks.
                    acquire: s(format!(
                        "INSERT INTO {t} (name, owner, version, expires_at) \
                         VALUES (?, ?, LAST_INSERT_ID(1), {now} + INTERVAL ? MICROSECOND) \
                         ON DUPLICATE KEY UPDATE \
                         version = IF(owner IS NULL OR expires_at <= {now}, \
                           LAST_INSERT_ID(version + 1), version + LAST_INSERT_ID(0)), \
                         expires_at = IF(LAST_INSERT_ID() <> 0, VALUES(expires_at), expires_at), \
                         owner = IF(LAST_INSERT_ID() <> 0, VALUES(owner), owner)"
                    )),
                    // `owner` still holds the old value when `version` is
                    // decided (it is assigned last).
                    reclaim: s(format!(
                        "INSERT INTO {t} (name, owner, version, expires_at) \
                         VALUES (?, ?, LAST_INSERT_ID(1), {now} + INTERVAL ? MICROSECOND) \
                         ON DUPLICATE KEY UPDATE \
                         version = IF(owner IS NULL OR expires_at <= {now} \
                           OR owner = VALUES(owner), \
                           LAST_INSERT_ID(version + 1), version + LAST_INSERT_ID(0)), \
                         expires_at = IF(LAST_INSERT_ID() <> 0, VALUES(expires_at), expires_at), \
                         owner = IF(LAST_INSERT_ID() <> 0, VALUES(owner), owner)"
                    )),
                    renew: s(format!(
                        "UPDATE {t} SET expires_at = {now} + INTERVAL ? MICROSECOND \
                         WHERE name = ? AND owner = ? AND version = ? AND expires_at > {now}"
                    )),
                    release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now} \
                         WHERE name = ? AND owner = ? AND version = ?"
                    )),
                    version_of: s(format!("SELECT version FROM {t} WHERE name = ?")),
                    after_release: s(format!(
                        "SELECT version, owner IS NULL FROM {t} WHERE name = ?"
                    )),
                    holding: s(format!(
                        "SELECT version FROM {t} WHERE name = ? AND owner = ? \
                         AND version = ? AND expires_at > {now} LOCK IN SHARE MODE"
                    )),
                    inspect: s(format!(
                        "SELECT owner, version, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at) \
                         FROM {t} WHERE name = ? AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    force_release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now} \
                         WHERE name = ? AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    fence_check: s(dialect.fence_check_sql(fence_table)),
                    fence_read: s(format!(
                        "SELECT token FROM {fence_table} WHERE resource = ?"
                    )),
                    channel,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_units_round_up_to_precision() {
        // TTLs are bound in units of the timestamp precision, through the
        // declared minimum and step.
        let units = |d: Dialect, ttl| guarantees(d).granted_ttl(ttl, d.timestamp_precision()).1;
        assert_eq!(units(Dialect::Sqlite, Duration::from_micros(1500)), 2);
        assert_eq!(units(Dialect::Postgres, Duration::from_nanos(1500)), 2);
        assert_eq!(units(Dialect::MySql, Duration::from_secs(1)), 1_000_000);
        assert_eq!(
            Dialect::Sqlite.units_to_duration(-5),
            Duration::ZERO,
            "negative time left clamps"
        );
    }

    /// docs/sql.md shows the DDL teams run by hand: it must be exactly what
    /// this crate runs.
    #[test]
    fn docs_show_the_exact_ddl() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/sql.md");
        let docs = std::fs::read_to_string(path).expect("docs/sql.md");
        for d in [Dialect::Sqlite, Dialect::Postgres, Dialect::MySql] {
            for ddl in [
                d.lock_table_ddl(crate::DEFAULT_TABLE),
                d.fence_table_ddl(crate::DEFAULT_FENCE_TABLE),
            ] {
                assert!(
                    docs.contains(&format!("{ddl};")),
                    "docs/sql.md lacks:\n{ddl};"
                );
            }
        }
    }

    #[test]
    fn guarantees_match_ttl_rounding() {
        for d in [Dialect::Sqlite, Dialect::Postgres, Dialect::MySql] {
            let g = guarantees(d);
            let ttl = Duration::from_nanos(1_234_567);
            let granted = g.effective_ttl(ttl);
            let (g_ttl, units) = g.granted_ttl(ttl, d.timestamp_precision());
            assert_eq!(g_ttl, granted, "{d:?}");
            assert_eq!(d.units_to_duration(units as i64), granted, "{d:?}");
        }
    }
}
