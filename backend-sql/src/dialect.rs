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

use lock_core::{ExpiryClock, FencingGuarantee, Guarantees, HolderMeta, WaitMechanism};

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
        let meta = self
            .added_columns()
            .into_iter()
            .map(|(name, def)| format!("{name} {def}"))
            .collect::<Vec<_>>()
            .join(",\n  ");
        match self {
            // TEXT under SQLite's default BINARY collation compares bytes:
            // case, Unicode normalisation and trailing spaces all matter.
            // expires_at is milliseconds since the Unix epoch.
            Dialect::Sqlite => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  \
                 name TEXT NOT NULL PRIMARY KEY,\n  \
                 owner TEXT NULL,\n  \
                 version INTEGER NOT NULL,\n  \
                 expires_at INTEGER NOT NULL,\n  \
                 {meta}\n) WITHOUT ROWID"
            ),
            // COLLATE "C": byte order, deterministic, whatever the database
            // default is.
            Dialect::Postgres => format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  \
                 name TEXT COLLATE \"C\" NOT NULL PRIMARY KEY,\n  \
                 owner TEXT NULL,\n  \
                 version BIGINT NOT NULL,\n  \
                 expires_at TIMESTAMPTZ NOT NULL,\n  \
                 {meta}\n)"
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
                 {meta},\n  \
                 PRIMARY KEY (name)\n) ENGINE=InnoDB"
            ),
        }
    }

    /// What each pooled connection sets first: the server gives up on a
    /// statement of it a little before `op_timeout` (nine tenths of it), so
    /// that its error, not the client's own timeout, usually ends the
    /// statement, and the connection goes back to the pool at once. A
    /// statement the client gave up on (stuck on a row another transaction
    /// locks) would otherwise keep its connection out of the pool until it
    /// ends (the pool waits for its answer before taking the connection
    /// back), so that every retry stranded one more, and it could still
    /// take a lock long after its caller left. SQLite has no server: the
    /// busy timeout bounds its waits.
    pub(crate) fn session_limits(self, op_timeout: Duration) -> Option<String> {
        let limit = op_timeout.mul_f64(0.9);
        match self {
            Dialect::Sqlite => None,
            // A lock wait counts too.
            Dialect::Postgres => Some(format!(
                "SET statement_timeout = {}",
                limit.as_millis().max(1)
            )),
            // Whole seconds, at least one; MySQL has no limit for every
            // statement, but what a statement waits for is a lock: rows
            // (InnoDB) or a table's metadata (DDL running).
            Dialect::MySql => {
                let secs = limit.as_secs().max(1);
                Some(format!(
                    "SET SESSION innodb_lock_wait_timeout = {secs}, lock_wait_timeout = {secs}"
                ))
            }
        }
    }

    /// The columns that came after the first version of the lock table, with
    /// their definitions: a client adds the ones a table lacks (see
    /// `schema.rs`), so the DDL and the `ALTER TABLE` cannot drift apart.
    ///
    /// - `holder_meta`: the holder's [`HolderMeta`] line, `NULL` when the
    ///   holder gave none; sized for [`HolderMeta::MAX_ENCODED`].
    /// - `meta_version`: the `version` the grant that wrote `holder_meta` gave
    ///   out. The metadata is shown only while it equals `version`, so a grant
    ///   by a client of an earlier version (which does not know the columns)
    ///   never shows the previous holder's metadata as its own.
    /// - `wake_until` (PostgreSQL only): until when a waiter wants to hear of
    ///   the row's release. A release sends its NOTIFY only while it is in
    ///   the future: every committing NOTIFY takes one database-wide lock,
    ///   so notifying releases nobody waits for would serialise the
    ///   commits of unrelated locks.
    /// - `grant_id`: the id of the acquire attempt that wrote the grant,
    ///   random per attempt and reused by the retries after it went
    ///   unanswered. Such a retry takes back a live row of its own owner
    ///   only when it carries that id: one owner used for two acquisitions
    ///   (through one client or two) must never take the other's holding.
    pub(crate) fn added_columns(self) -> Vec<(&'static str, String)> {
        let max = HolderMeta::MAX_ENCODED;
        match self {
            Dialect::Sqlite => vec![
                ("holder_meta", "TEXT NULL".into()),
                ("meta_version", "INTEGER NULL".into()),
                ("grant_id", "TEXT NULL".into()),
            ],
            Dialect::Postgres => vec![
                ("holder_meta", format!("VARCHAR({max}) NULL")),
                ("meta_version", "BIGINT NULL".into()),
                ("wake_until", "TIMESTAMPTZ NULL".into()),
                ("grant_id", format!("VARCHAR({GRANT_ID_LEN}) NULL")),
            ],
            // Printable ASCII only, so bytes are as good as text, and the
            // table keeps one comparison rule.
            Dialect::MySql => vec![
                ("holder_meta", format!("VARBINARY({max}) NULL")),
                ("meta_version", "BIGINT UNSIGNED NULL".into()),
                ("grant_id", format!("VARBINARY({GRANT_ID_LEN}) NULL")),
            ],
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
    /// add the check to their own transactions by hand. It is the token
    /// order only, not the lock row's check that `SqlBackend::fenced` adds:
    /// a holder paused past its TTL is refused once a newer token was
    /// recorded, not before.
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
    // Columns of the lock row, written by the grant statement itself.
    g.holder_meta = true;
    g.list = true;
    // A waiter is a client polling (or listening on one channel per table):
    // the database has no record of who waits for which name.
    g.counts_waiters = false;
    // One statement per batch of up to RENEW_CHUNK leases (MySQL: and one
    // read when some lease was not renewed); see `RenewBatch`.
    g.batch_renew = true;
    g
}

/// The statements of one client, built from its table names.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) create_locks: Arc<str>,
    pub(crate) create_fences: Arc<str>,
    /// Returns a row when the table exists (one bind: the table name).
    pub(crate) table_exists: Arc<str>,
    /// Selects the columns of the first version of the lock table and no
    /// row: checks its shape before any column is added.
    pub(crate) probe_locks: Arc<str>,
    /// Returns a row when the table has the column (binds: table, column).
    pub(crate) column_exists: Arc<str>,
    /// The column names of [`Dialect::added_columns`] and the `ALTER TABLE`
    /// adding each.
    pub(crate) add_columns: Vec<(&'static str, Arc<str>)>,
    /// Binds: name, owner, ttl units, holder metadata (or NULL), the
    /// attempt's grant id (`grant_id`).
    /// PG/SQLite: returns `version` when won.
    /// MySQL: the OK packet's last-insert-id is the version when won, 0 when not.
    pub(crate) acquire: Arc<str>,
    /// Binds (PG/SQLite): name, owner, version, ttl units.
    /// Binds (MySQL): ttl units, name, owner, version.
    pub(crate) renew: Arc<str>,
    /// The batched renewal, see [`RenewBatch`].
    pub(crate) renew_batch: RenewBatch,
    /// Binds: name, owner, version (PG: + notify channel). PG returns a row
    /// per freed row (and notifies when a waiter asked, see `want_wake`);
    /// others report rows affected.
    pub(crate) release: Arc<str>,
    /// Binds: name, owner, grant id (PG: + notify channel). Frees the row
    /// only while the grant of that attempt holds it: what an acquire
    /// attempt that got no answer may have taken for a wait that has
    /// ended (`SqlBackend::give_back_unanswered`). Returns as `release`.
    pub(crate) release_grant: Arc<str>,
    /// PostgreSQL: a waiter's request to be notified of the release of a
    /// held row (binds: name, microseconds it may wait). Updates the row
    /// only while it is held, so 0 rows means it is free now: try again
    /// at once. Others: `None` (their waiters poll).
    pub(crate) want_wake: Option<Arc<str>>,
    /// As `acquire`, but also takes a live row held under the same owner
    /// and carrying the same grant id: for a retry after an attempt whose answer was lost (see
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
    /// Binds: name. Returns owner, version, time left in units, holder
    /// metadata.
    pub(crate) inspect: Arc<str>,
    /// Binds: prefix (SQLite) or LIKE pattern ([`like_prefix`]), limit.
    /// Returns name and then the columns of `inspect`, in name order.
    pub(crate) list: Arc<str>,
    /// Binds: name (PG: + notify channel).
    pub(crate) force_release: Arc<str>,
    /// Binds: resource, token.
    pub(crate) fence_check: Arc<str>,
    /// Binds: resource. Returns the token.
    pub(crate) fence_read: Arc<str>,
    /// The LISTEN/NOTIFY channel (PostgreSQL).
    pub(crate) channel: String,
}

/// PostgreSQL: the column a release returns for each freed row of `freed`
/// (`name`, `wake_until`), which NOTIFYs `channel` only while a waiter
/// wants it. CASE evaluates the call only in its taken branch, so an
/// unwatched release queues no notification and takes no notify lock.
fn pg_notify_if_wanted(channel: &str) -> String {
    format!("CASE WHEN wake_until > clock_timestamp() THEN pg_notify({channel}, name)::text END")
}

/// The length of an attempt's id in `grant_id`: 16 hex digits.
pub(crate) const GRANT_ID_LEN: usize = 16;

/// The holder metadata of a row, shown only when the grant that wrote it
/// is the row's current one (see [`Dialect::added_columns`]).
const META: &str = "CASE WHEN meta_version = version THEN holder_meta END";

/// MySQL's grant writes the metadata only when it wins (after `version`
/// was decided, so `version` is the new one).
const MYSQL_META_UPDATE: &str =
    "holder_meta = IF(LAST_INSERT_ID() <> 0, VALUES(holder_meta), holder_meta), \
     meta_version = IF(LAST_INSERT_ID() <> 0, version, meta_version)";

/// The escape character of [`like_prefix`] patterns: a plain character,
/// since a backslash means different things in the string literals of
/// MySQL's sql_modes.
const LIKE_ESCAPE: char = '!';

/// A LIKE pattern matching the names that start with `prefix`: its `%`,
/// `_` and [`LIKE_ESCAPE`] are escaped, then `%` is appended.
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | LIKE_ESCAPE) {
            pattern.push(LIKE_ESCAPE);
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// The most leases one batched renewal statement carries: 4 binds each
/// on SQLite and MySQL (1,024 in all, far below SQLite's 32,766 and
/// MySQL's 65,535), and the watchdog's own batch size.
pub(crate) const RENEW_CHUNK: usize = 256;

/// The row counts the SQLite and MySQL batch statements are built for: a
/// batch is padded with rows that match nothing (`NULL` names) up to the
/// next one, so each connection prepares (and caches) a handful of texts
/// rather than one per batch length.
pub(crate) const RENEW_BUCKETS: [usize; 4] = [8, 32, 128, RENEW_CHUNK];

/// How one statement renews many leases, each checked as `renew` checks
/// one: same name, owner and version, and not expired by the database
/// clock; each lease with its own TTL.
#[derive(Debug)]
pub(crate) enum RenewBatch {
    /// PostgreSQL: `UPDATE ... FROM unnest(...) ... RETURNING name`.
    /// Binds: names, owners, versions, ttl units (four arrays, any length).
    /// Returns the name of each row extended.
    Arrays(Arc<str>),
    /// SQLite: `WITH b AS (VALUES ...) UPDATE ... FROM b ... RETURNING
    /// name`, one text per bucket. Binds per row: name, owner, version, ttl
    /// units. Returns the name of each row extended.
    Returning(Vec<(usize, Arc<str>)>),
    /// MySQL/MariaDB, which has no `UPDATE ... RETURNING`: one multi-table
    /// UPDATE joined to a derived table of the leases (binds per row: name,
    /// owner, version, ttl units), whose affected-row count (matched rows,
    /// with `CLIENT_FOUND_ROWS`) says whether every lease was renewed; only
    /// when fewer matched, one read (`read`, binds: the names) tells which.
    CountThenRead {
        /// The UPDATE, one text per bucket.
        update: Vec<(usize, Arc<str>)>,
        /// Returns name, owner, version and whether the row is live, one
        /// text per bucket.
        read: Vec<(usize, Arc<str>)>,
    },
}

/// The text built for the smallest bucket that holds `n` rows, and that
/// bucket's size.
pub(crate) fn bucket(texts: &[(usize, Arc<str>)], n: usize) -> (usize, &Arc<str>) {
    let (size, sql) = texts
        .iter()
        .find(|(size, _)| *size >= n)
        .unwrap_or_else(|| texts.last().expect("buckets"));
    (*size, sql)
}

/// SQLite's clock in milliseconds since the Unix epoch. `julianday('now')`
/// is the same for every use inside one statement and has millisecond
/// resolution; ROUND undoes the floating-point division.
const SQLITE_NOW_MS: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

/// The type of a bind, for preparing a statement before its first use:
/// PostgreSQL fixes parameter types at preparation, and a statement is
/// cached by its text alone, so they must be the types the hot path binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bind {
    Text,
    Int8,
    /// An array of that type (the batched renewal's columns).
    Texts,
    Int8s,
}

impl Statements {
    /// The statements of the hot paths with their binds, prepared on each
    /// new pooled connection (PostgreSQL, MySQL): a first statement on a
    /// connection is then one round trip instead of two (prepare, execute),
    /// and an operation timeout shorter than two round trips cannot cut
    /// every attempt off between the two, never executing it.
    pub(crate) fn hot(&self) -> Vec<(Arc<str>, Vec<Bind>)> {
        use Bind::*;
        let mut hot = vec![
            (self.acquire.clone(), vec![Text, Text, Int8, Text, Text]),
            (self.reclaim.clone(), vec![Text, Text, Int8, Text, Text]),
            (self.renew.clone(), vec![Text, Text, Int8, Int8]),
            (self.release.clone(), vec![Text, Text, Int8, Text]),
        ];
        if let RenewBatch::Arrays(batch) = &self.renew_batch {
            hot.push((batch.clone(), vec![Texts, Texts, Int8s, Int8s]));
        }
        hot
    }

    pub(crate) fn new(dialect: Dialect, table: &str, fence_table: &str) -> Self {
        let t = table;
        let channel = format!("polylock_{table}");
        let s = |x: String| -> Arc<str> { Arc::from(x) };
        // PostgreSQL can skip an existing column itself; the others rely on
        // the check before and after (see `schema.rs`).
        let if_missing = if dialect == Dialect::Postgres {
            "IF NOT EXISTS "
        } else {
            ""
        };
        let add_columns = dialect
            .added_columns()
            .into_iter()
            .map(|(col, def)| {
                (
                    col,
                    s(format!(
                        "ALTER TABLE {t} ADD COLUMN {if_missing}{col} {def}"
                    )),
                )
            })
            .collect();
        match dialect {
            Dialect::Sqlite => {
                let now = SQLITE_NOW_MS;
                // The grant; `take_back` widens which live rows it takes.
                let grant = |take_back: &str| {
                    format!(
                        "INSERT INTO {t} (name, owner, version, expires_at, holder_meta, \
                         meta_version, grant_id) VALUES (?1, ?2, 1, {now} + ?3, ?4, 1, ?5) \
                         ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                         version = {t}.version + 1, expires_at = excluded.expires_at, \
                         holder_meta = excluded.holder_meta, meta_version = {t}.version + 1, \
                         grant_id = excluded.grant_id \
                         WHERE {t}.owner IS NULL OR {t}.expires_at <= {now}{take_back} \
                         RETURNING version"
                    )
                };
                Statements {
                    create_locks: s(dialect.lock_table_ddl(t)),
                    create_fences: s(dialect.fence_table_ddl(fence_table)),
                    table_exists: s(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1".into(),
                    ),
                    probe_locks: s(format!(
                        "SELECT name, owner, version, expires_at FROM {t} WHERE 0 = 1"
                    )),
                    column_exists: s("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2".into()),
                    add_columns,
                    // SET expressions read the old row, so both versions
                    // are the new one.
                    acquire: s(grant("")),
                    reclaim: s(grant(&format!(
                        " OR ({t}.owner = excluded.owner \
                         AND {t}.grant_id = excluded.grant_id)"
                    ))),
                    renew: s(format!(
                        "UPDATE {t} SET expires_at = {now} + ?4 \
                         WHERE name = ?1 AND owner = ?2 AND version = ?3 AND expires_at > {now}"
                    )),
                    // julianday('now') is one value for the whole
                    // statement: every row is judged and extended from the
                    // same instant.
                    renew_batch: RenewBatch::Returning(
                        RENEW_BUCKETS
                            .iter()
                            .map(|&n| {
                                let rows = vec!["(?, ?, ?, ?)"; n].join(", ");
                                (
                                    n,
                                    s(format!(
                                        "WITH b(name, owner, version, units) AS (VALUES {rows}) \
                                         UPDATE {t} SET expires_at = {now} + b.units FROM b \
                                         WHERE {t}.name = b.name AND {t}.owner = b.owner \
                                         AND {t}.version = b.version AND {t}.expires_at > {now} \
                                         RETURNING {t}.name"
                                    )),
                                )
                            })
                            .collect(),
                    ),
                    release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = ?1 AND owner = ?2 AND version = ?3"
                    )),
                    release_grant: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = ?1 AND owner = ?2 AND grant_id = ?3"
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
                        "SELECT owner, version, expires_at - {now}, {META} FROM {t} \
                         WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    // Not LIKE: SQLite's LIKE ignores ASCII case. `name >=`
                    // starts the scan at the prefix in the primary key;
                    // substr and length count characters on both sides.
                    list: s(format!(
                        "SELECT name, owner, version, expires_at - {now}, {META} FROM {t} \
                         WHERE name >= ?1 AND substr(name, 1, length(?1)) = ?1 \
                         AND owner IS NOT NULL AND expires_at > {now} \
                         ORDER BY name LIMIT ?2"
                    )),
                    force_release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    fence_check: s(dialect.fence_check_sql(fence_table)),
                    fence_read: s(format!(
                        "SELECT token FROM {fence_table} WHERE resource = ?1"
                    )),
                    want_wake: None,
                    channel,
                }
            }
            Dialect::Postgres => {
                // clock_timestamp(), not now(): now() is frozen at the start
                // of the transaction, so a statement that waited on a row
                // lock would judge expiry by a stale time.
                let now = "clock_timestamp()";
                let ttl = |p: &str| format!("{now} + {p}::bigint * INTERVAL '1 microsecond'");
                // The grant; `take_back` widens which live rows it takes.
                let grant = |take_back: &str| {
                    format!(
                        "INSERT INTO {t} AS l (name, owner, version, expires_at, holder_meta, \
                         meta_version, grant_id) VALUES ($1, $2, 1, {exp}, $4, 1, $5) \
                         ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, \
                         version = l.version + 1, expires_at = {exp}, \
                         holder_meta = EXCLUDED.holder_meta, meta_version = l.version + 1, \
                         grant_id = EXCLUDED.grant_id \
                         WHERE l.owner IS NULL OR l.expires_at <= {now}{take_back} \
                         RETURNING version",
                        exp = ttl("$3")
                    )
                };
                Statements {
                    create_locks: s(dialect.lock_table_ddl(t)),
                    create_fences: s(dialect.fence_table_ddl(fence_table)),
                    table_exists: s("SELECT 1 WHERE to_regclass($1) IS NOT NULL".into()),
                    probe_locks: s(format!(
                        "SELECT name, owner, version, expires_at FROM {t} WHERE false"
                    )),
                    column_exists: s(
                        "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
                         AND attname = $2 AND NOT attisdropped"
                            .into(),
                    ),
                    add_columns,
                    acquire: s(grant("")),
                    reclaim: s(grant(
                        " OR (l.owner = EXCLUDED.owner AND l.grant_id = EXCLUDED.grant_id)",
                    )),
                    renew: s(format!(
                        "UPDATE {t} SET expires_at = {exp} \
                         WHERE name = $1 AND owner = $2 AND version = $3 AND expires_at > {now}",
                        exp = ttl("$4")
                    )),
                    // COLLATE "C" names the column's collation for the
                    // array's text, which has the database default.
                    renew_batch: RenewBatch::Arrays(s(format!(
                        "UPDATE {t} AS l SET expires_at = {exp} \
                         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) \
                         AS b(name, owner, version, units) \
                         WHERE l.name = b.name COLLATE \"C\" AND l.owner = b.owner \
                         AND l.version = b.version AND l.expires_at > {now} \
                         RETURNING l.name",
                        exp = ttl("b.units")
                    ))),
                    // The NOTIFY is part of the release statement, so it is
                    // sent exactly when the release commits; only while a
                    // waiter wants it (`wake_until`, see `added_columns`).
                    // A waiter's `want_wake` and a release update the same
                    // row, so one of them sees the other: the release
                    // notifies, or the waiter finds the row free.
                    // RETURNING rather than a data-modifying CTE: the same
                    // rows, for less of the server's CPU.
                    release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = $1 AND owner = $2 AND version = $3 \
                         RETURNING {notify}",
                        notify = pg_notify_if_wanted("$4")
                    )),
                    release_grant: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = $1 AND owner = $2 AND grant_id = $3 \
                         RETURNING {notify}",
                        notify = pg_notify_if_wanted("$4")
                    )),
                    want_wake: Some(s(format!(
                        "UPDATE {t} SET wake_until = GREATEST(wake_until, {until}) \
                         WHERE name = $1 AND owner IS NOT NULL AND expires_at > {now}",
                        until = ttl("$2")
                    ))),
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
                         (EXTRACT(EPOCH FROM (expires_at - {now})) * 1000000)::bigint, {META} \
                         FROM {t} WHERE name = $1 AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    // LIKE is case-sensitive here, and under COLLATE "C"
                    // (named again in case a hand-made table lacks it) the
                    // order is byte order.
                    list: s(format!(
                        "SELECT name, owner, version, \
                         (EXTRACT(EPOCH FROM (expires_at - {now})) * 1000000)::bigint, {META} \
                         FROM {t} WHERE name LIKE $1 ESCAPE '{LIKE_ESCAPE}' \
                         AND owner IS NOT NULL AND expires_at > {now} \
                         ORDER BY name COLLATE \"C\" LIMIT $2"
                    )),
                    force_release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = $1 AND owner IS NOT NULL AND expires_at > {now} \
                         RETURNING {notify}",
                        notify = pg_notify_if_wanted("$2")
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
                // the branch it picks. `meta_version` reads the new
                // `version`.
                // `take_back` widens which live rows it takes.
                let grant = |take_back: &str| {
                    format!(
                        "INSERT INTO {t} (name, owner, version, expires_at, holder_meta, \
                         meta_version, grant_id) \
                         VALUES (?, ?, LAST_INSERT_ID(1), {now} + INTERVAL ? MICROSECOND, ?, 1, ?) \
                         ON DUPLICATE KEY UPDATE \
                         version = IF(owner IS NULL OR expires_at <= {now}{take_back}, \
                           LAST_INSERT_ID(version + 1), version + LAST_INSERT_ID(0)), \
                         expires_at = IF(LAST_INSERT_ID() <> 0, VALUES(expires_at), expires_at), \
                         {MYSQL_META_UPDATE}, \
                         grant_id = IF(LAST_INSERT_ID() <> 0, VALUES(grant_id), grant_id), \
                         owner = IF(LAST_INSERT_ID() <> 0, VALUES(owner), owner)"
                    )
                };
                Statements {
                    create_locks: s(dialect.lock_table_ddl(t)),
                    create_fences: s(dialect.fence_table_ddl(fence_table)),
                    table_exists: s("SELECT 1 FROM information_schema.tables \
                         WHERE table_schema = DATABASE() AND table_name = ?"
                        .into()),
                    probe_locks: s(format!(
                        "SELECT name, owner, version, expires_at FROM {t} WHERE 1 = 0"
                    )),
                    column_exists: s("SELECT 1 FROM information_schema.columns \
                         WHERE table_schema = DATABASE() AND table_name = ? AND column_name = ?"
                        .into()),
                    add_columns,
                    acquire: s(grant("")),
                    // `owner` and `grant_id` still hold the old values
                    // when `version` is decided (they are assigned after).
                    reclaim: s(grant(
                        " OR (owner = VALUES(owner) AND grant_id = VALUES(grant_id))",
                    )),
                    renew: s(format!(
                        "UPDATE {t} SET expires_at = {now} + INTERVAL ? MICROSECOND \
                         WHERE name = ? AND owner = ? AND version = ? AND expires_at > {now}"
                    )),
                    // The CASTs give the derived table's columns the
                    // types of the lock table's, whatever the binds are.
                    // UTC_TIMESTAMP(6) is one value for the whole statement.
                    renew_batch: RenewBatch::CountThenRead {
                        update: RENEW_BUCKETS
                            .iter()
                            .map(|&n| {
                                let first = "SELECT CAST(? AS BINARY) AS name, \
                                             CAST(? AS BINARY) AS owner, \
                                             CAST(? AS UNSIGNED) AS version, \
                                             CAST(? AS SIGNED) AS units";
                                let rest = " UNION ALL SELECT ?, ?, ?, ?".repeat(n - 1);
                                (
                                    n,
                                    s(format!(
                                        "UPDATE {t} AS l JOIN ({first}{rest}) AS b \
                                         ON l.name = b.name AND l.owner = b.owner \
                                         AND l.version = b.version \
                                         SET l.expires_at = {now} + INTERVAL b.units MICROSECOND \
                                         WHERE l.expires_at > {now}"
                                    )),
                                )
                            })
                            .collect(),
                        read: RENEW_BUCKETS
                            .iter()
                            .map(|&n| {
                                let names = vec!["?"; n].join(", ");
                                (
                                    n,
                                    s(format!(
                                        "SELECT name, owner, version, expires_at > {now} \
                                         FROM {t} WHERE name IN ({names})"
                                    )),
                                )
                            })
                            .collect(),
                    },
                    release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = ? AND owner = ? AND version = ?"
                    )),
                    release_grant: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = ? AND owner = ? AND grant_id = ?"
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
                        "SELECT owner, version, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), \
                         {META} \
                         FROM {t} WHERE name = ? AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    // `name` compares bytes (VARBINARY, or a binary NO PAD
                    // collation: checked at connect), so LIKE is
                    // case-sensitive and ORDER BY is byte order. The escape
                    // character is not a backslash, whose meaning in a
                    // literal depends on the sql_mode.
                    list: s(format!(
                        "SELECT name, owner, version, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), \
                         {META} \
                         FROM {t} WHERE name LIKE ? ESCAPE '{LIKE_ESCAPE}' \
                         AND owner IS NOT NULL AND expires_at > {now} \
                         ORDER BY name LIMIT ?"
                    )),
                    force_release: s(format!(
                        "UPDATE {t} SET owner = NULL, expires_at = {now}, holder_meta = NULL \
                         WHERE name = ? AND owner IS NOT NULL AND expires_at > {now}"
                    )),
                    fence_check: s(dialect.fence_check_sql(fence_table)),
                    fence_read: s(format!(
                        "SELECT token FROM {fence_table} WHERE resource = ?"
                    )),
                    want_wake: None,
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
    fn like_prefix_escapes_wildcards_and_the_escape() {
        assert_eq!(like_prefix(""), "%");
        assert_eq!(like_prefix("jobs/"), "jobs/%");
        assert_eq!(like_prefix("a%b_c!d"), "a!%b!_c!!d%");
        assert_eq!(like_prefix("ü\\x"), "ü\\x%");
    }

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
