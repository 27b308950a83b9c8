//! Driver errors → [`LockError`], with the retryable flag set and secrets
//! scrubbed.
//!
//! sqlx's error type never leaves this crate: it is rendered to text (with
//! the password removed) inside a [`SqlError`], which keeps the database's
//! error code for callers who want it.

use std::fmt;
use std::time::Duration;

use lock_core::LockError;

use crate::dialect::Dialect;

/// A database error as polylock reports it: the driver's message (without
/// any password) and the database's error code, if it gave one.
///
/// It is the `source` of [`LockError::Backend`]; reach it with
/// `std::error::Error::source` and `downcast_ref::<SqlError>()`.
#[derive(Debug, Clone)]
pub struct SqlError {
    message: String,
    code: Option<String>,
}

impl SqlError {
    /// The database's error code: the SQLSTATE on PostgreSQL, the error
    /// number on MySQL/MariaDB, the extended result code on SQLite.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn new(message: String) -> Self {
        SqlError {
            message,
            code: None,
        }
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SqlError {}

/// What errors need to be rendered safely: where the database is and what
/// must never be shown.
#[derive(Clone)]
pub(crate) struct ErrorContext {
    pub(crate) dialect: Dialect,
    pub(crate) endpoint: String,
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for ErrorContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorContext")
            .field("dialect", &self.dialect)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl ErrorContext {
    /// A driver error's text for a log line, the password replaced.
    pub(crate) fn shown(&self, e: &sqlx::Error) -> String {
        self.scrub(e.to_string())
    }

    fn scrub(&self, text: String) -> String {
        match &self.password {
            Some(p) if !p.is_empty() => text.replace(p.as_str(), "***"),
            _ => text,
        }
    }

    /// Maps a driver error from operation `op`.
    pub(crate) fn map(&self, op: &str, e: sqlx::Error) -> LockError {
        let backend = self.dialect.backend_name();
        self.build(format!("{op} on {backend} at {}", self.endpoint), e)
    }

    fn build(&self, what: String, e: sqlx::Error) -> LockError {
        let backend = self.dialect.backend_name();
        let retryable = is_retryable(self.dialect, &e);
        let code = db_code(self.dialect, &e);
        let message = self.scrub(format!("{what}: {}", render(&e)));
        let source = SqlError { message, code };
        if retryable {
            LockError::transient(backend, source)
        } else {
            LockError::permanent(backend, source)
        }
    }

    /// The first connection failed: name the endpoint, never the password.
    pub(crate) fn connect_failed(&self, e: sqlx::Error) -> LockError {
        let what = format!(
            "cannot connect to {} at {}",
            self.dialect.backend_name(),
            self.endpoint
        );
        self.build(what, e)
    }

    /// An operation that did not answer within `limit`.
    pub(crate) fn timed_out(&self, op: &str, limit: Duration) -> LockError {
        LockError::transient(
            self.dialect.backend_name(),
            SqlError::new(format!(
                "{op} on {} at {}: no answer within {limit:?}",
                self.dialect.backend_name(),
                self.endpoint
            )),
        )
    }

    /// A COMMIT that was sent and got no answer (`e`): not retryable, as
    /// sending the transaction again may apply it twice.
    pub(crate) fn maybe_applied(&self, e: &LockError) -> LockError {
        // The cause's own words (they name the operation and the server),
        // without its "retryable" label.
        let why = match e {
            LockError::Backend { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        LockError::permanent(
            self.dialect.backend_name(),
            SqlError::new(self.scrub(format!(
                "{why}, after COMMIT was sent: the write may have been applied; check before \
                 writing again"
            ))),
        )
    }

    /// A result the protocol does not allow (a bug or a foreign schema).
    pub(crate) fn protocol(&self, op: &str, what: String) -> LockError {
        LockError::permanent(
            self.dialect.backend_name(),
            SqlError::new(self.scrub(format!(
                "{op} on {} at {}: {what}",
                self.dialect.backend_name(),
                self.endpoint
            ))),
        )
    }
}

/// The same error again, for each lease of a batch that failed as a whole
/// ([`LockError`] is not `Clone`): this crate's backend errors carry a
/// [`SqlError`], which is; anything else keeps its text and retryable flag.
pub(crate) fn duplicate(dialect: Dialect, e: &LockError) -> LockError {
    match e {
        LockError::Backend {
            backend,
            retryable,
            source,
        } => {
            let source = source
                .downcast_ref::<SqlError>()
                .cloned()
                .unwrap_or_else(|| SqlError::new(source.to_string()));
            LockError::Backend {
                backend,
                retryable: *retryable,
                source: Box::new(source),
            }
        }
        LockError::Lost { name } => LockError::Lost { name: name.clone() },
        other => LockError::permanent(dialect.backend_name(), SqlError::new(other.to_string())),
    }
}

/// The error and its causes on one line: sqlx's Display often hides the
/// interesting part (the OS error) in `source()`.
fn render(e: &sqlx::Error) -> String {
    let mut out = e.to_string();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    if matches!(e, sqlx::Error::PoolTimedOut) {
        out.push_str(" (the database is unreachable or every connection is busy)");
    }
    out
}

fn db_code(dialect: Dialect, e: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    match dialect {
        Dialect::MySql => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number().to_string()),
        Dialect::Postgres | Dialect::Sqlite => db.code().map(|c| c.into_owned()),
    }
}

/// Whether a deadlock or serialization failure rolled the statement back, so
/// that running it again at once is safe and likely to succeed.
pub(crate) fn is_conflict(dialect: Dialect, e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    match dialect {
        Dialect::Postgres => matches!(db.code().as_deref(), Some("40001" | "40P01")),
        // 1213: deadlock (the transaction was rolled back).
        Dialect::MySql => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| m.number() == 1213),
        Dialect::Sqlite => false,
    }
}

/// Whether the connection broke under the statement (a peer that went
/// away, a server that restarted or is shutting down), so that the same
/// statement may succeed at once on another connection. Whether it ran
/// before the break is unknown: only statements safe to send twice are
/// sent again (see `SqlBackend::run`).
pub(crate) fn is_broken_connection(dialect: Dialect, e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => match dialect {
            Dialect::Postgres => db
                .code()
                .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02")),
            Dialect::MySql => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|m| matches!(m.number(), 1053 | 1927 | 2006 | 2013 | 4031)),
            Dialect::Sqlite => false,
        },
        _ => false,
    }
}

/// Whether the same request may succeed if tried again: connection trouble,
/// a busy or restarting server, lock conflicts. Syntax, permission and
/// schema errors will not go away.
pub(crate) fn is_retryable(dialect: Dialect, e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => match dialect {
            Dialect::Postgres => db.code().is_some_and(|c| pg_retryable(&c)),
            Dialect::MySql => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|m| mysql_retryable(m.number())),
            Dialect::Sqlite => db
                .code()
                .and_then(|c| c.parse::<i32>().ok())
                .is_some_and(sqlite_retryable),
        },
        _ => false,
    }
}

fn pg_retryable(sqlstate: &str) -> bool {
    // 08: connection exception; 53: insufficient resources (too many
    // connections); 57P0x: shutdown, crash recovery, cannot connect now.
    sqlstate.starts_with("08")
        || sqlstate.starts_with("53")
        || matches!(
            sqlstate,
            "40001" | "40P01" | "55P03" | "57014" | "57P01" | "57P02" | "57P03" | "57P05"
        )
}

fn mysql_retryable(number: u16) -> bool {
    matches!(
        number,
        1040 // too many connections
        | 1053 // server shutdown in progress
        | 1205 // lock wait timeout
        | 1213 // deadlock
        | 1158
            ..=1161 // network read/write errors
        | 1927 // MariaDB: connection was killed
        | 2002 | 2003 | 2006 | 2013 // cannot connect, gone away, lost connection
        | 4031 // disconnected by the server for inactivity
    )
}

fn sqlite_retryable(extended: i32) -> bool {
    // SQLITE_BUSY (5) and SQLITE_LOCKED (6) with all their extended codes;
    // SQLITE_PROTOCOL (15) is a WAL locking race.
    matches!(extended & 0xff, 5 | 6 | 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code docs/sql.md ("Errors") calls retryable is, and its
    /// neighbours the page leaves out are not.
    #[test]
    fn the_documented_codes_are_retryable() {
        for code in [
            "08000", "08003", "08006", "53000", "53300", "40001", "40P01", "55P03", "57014",
            "57P01", "57P02", "57P03", "57P05",
        ] {
            assert!(pg_retryable(code), "PostgreSQL {code}");
        }
        for code in ["57P04", "40002", "55000", "23505"] {
            assert!(!pg_retryable(code), "PostgreSQL {code}");
        }
        for n in [
            1040, 1053, 1205, 1213, 1158, 1159, 1160, 1161, 1927, 2002, 2003, 2006, 2013, 4031,
        ] {
            assert!(mysql_retryable(n), "MySQL {n}");
        }
        for n in [1157, 1162, 1062, 1146] {
            assert!(!mysql_retryable(n), "MySQL {n}");
        }
        // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_PROTOCOL and their extended codes.
        for code in [5, 6, 15, 261, 517, 262] {
            assert!(sqlite_retryable(code), "SQLite {code}");
        }
        for code in [1, 8, 11, 19] {
            assert!(!sqlite_retryable(code), "SQLite {code}");
        }
    }

    #[test]
    fn classification() {
        assert!(pg_retryable("08006"));
        assert!(pg_retryable("40P01"));
        assert!(pg_retryable("57P01"));
        assert!(!pg_retryable("42601"), "syntax error");
        assert!(!pg_retryable("42501"), "permission denied");
        assert!(!pg_retryable("28P01"), "bad password");
        assert!(mysql_retryable(1213));
        assert!(mysql_retryable(2013));
        assert!(!mysql_retryable(1045), "access denied");
        assert!(!mysql_retryable(1064), "syntax");
        assert!(sqlite_retryable(5));
        assert!(sqlite_retryable(517), "SQLITE_BUSY_SNAPSHOT");
        assert!(sqlite_retryable(262), "SQLITE_LOCKED_SHAREDCACHE");
        assert!(!sqlite_retryable(1), "SQLITE_ERROR");
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(is_retryable(Dialect::Postgres, &io));
        assert!(!is_retryable(Dialect::Postgres, &sqlx::Error::PoolClosed));
        assert!(is_broken_connection(Dialect::MySql, &io));
        assert!(!is_broken_connection(
            Dialect::Postgres,
            &sqlx::Error::PoolTimedOut
        ));
        assert!(!is_broken_connection(
            Dialect::Postgres,
            &sqlx::Error::Protocol("bad".into())
        ));
    }

    #[test]
    fn messages_name_the_endpoint_and_hide_the_password() {
        let ctx = ErrorContext {
            dialect: Dialect::Postgres,
            endpoint: "db:5432".into(),
            password: Some("hunter2".into()),
        };
        let e = ctx.map(
            "connecting",
            sqlx::Error::Protocol("server said hunter2".into()),
        );
        let text = e.to_string();
        assert!(text.contains("db:5432"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(e.is_retryable());
    }
}
