//! Creating the lock and fence tables on first use.
//!
//! Safe when many processes start at once against a fresh database:
//! - the table is looked up first, so a table created by hand (by a team
//!   that does not grant CREATE) is used as is;
//! - `CREATE TABLE IF NOT EXISTS` is the only DDL, and on PostgreSQL it runs
//!   under a transaction-scoped advisory lock, because concurrent
//!   `CREATE TABLE IF NOT EXISTS` there can still fail on the catalog's
//!   unique index; MySQL serialises DDL with metadata locks and SQLite with
//!   its write lock (waited for through the busy timeout);
//! - a creation error after which the table exists anyway (another process
//!   won the race) counts as success.
//!
//! Then the table's shape is checked, so a foreign table of the same name is
//! a clear configuration error rather than odd failures later. On MySQL the
//! `name` column must compare bytes (VARBINARY or a NO PAD binary collation),
//! or "Job" and "job" would be one lock.

use std::sync::Arc;

use lock_core::LockError;
use sqlx::{AssertSqlSafe, Connection, Executor, MySqlConnection, PgConnection, SqliteConnection};

use crate::dialect::Statements;
use crate::errors::ErrorContext;

/// A key for `pg_advisory_xact_lock`, the same in every polylock process:
/// the bytes of "polylock" read as an integer.
const PG_SCHEMA_LOCK: i64 = 0x706f_6c79_6c6f_636b;

fn q(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

/// Whether `table` exists, on any of the three connection types.
macro_rules! exists {
    ($conn:expr, $sql:expr, $table:expr) => {
        sqlx::query(q(&$sql.table_exists))
            .bind($table.to_string())
            .fetch_optional(&mut *$conn)
            .await
            .map(|r| r.is_some())
    };
}

fn shape_error(table: &str, what: &str, e: impl std::fmt::Display) -> LockError {
    LockError::Config(format!(
        "table `{table}` exists but is not a polylock {what} table: {e}"
    ))
}

/// Ensures the lock table exists and has the expected shape.
pub(crate) async fn ensure_sqlite(
    conn: &mut SqliteConnection,
    sql: &Statements,
    table: &str,
    create: &Arc<str>,
    probe: Option<&Arc<str>>,
    errors: &ErrorContext,
) -> Result<(), LockError> {
    if !exists!(conn, sql, table).map_err(|e| errors.map("looking up the table", e))? {
        if let Err(e) = conn.execute(q(create)).await {
            if !exists!(conn, sql, table).unwrap_or(false) {
                return Err(errors.map(&format!("creating table `{table}`"), e));
            }
        }
    }
    if let Some(probe) = probe {
        sqlx::query(q(probe))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| shape_error(table, "lock", e))?;
    }
    Ok(())
}

/// Ensures the table exists (under an advisory lock) and has the expected
/// shape.
pub(crate) async fn ensure_postgres(
    conn: &mut PgConnection,
    sql: &Statements,
    table: &str,
    create: &Arc<str>,
    probe: Option<&Arc<str>>,
    errors: &ErrorContext,
) -> Result<(), LockError> {
    if !exists!(conn, sql, table).map_err(|e| errors.map("looking up the table", e))? {
        let created = async {
            let mut tx = conn.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(PG_SCHEMA_LOCK)
                .execute(&mut *tx)
                .await?;
            // Quiet the "already exists, skipping" NOTICE a racing creator
            // would otherwise log.
            tx.execute("SET LOCAL client_min_messages = warning")
                .await?;
            tx.execute(q(create)).await?;
            tx.commit().await
        }
        .await;
        if let Err(e) = created {
            if !exists!(conn, sql, table).unwrap_or(false) {
                return Err(errors.map(&format!("creating table `{table}`"), e));
            }
        }
    }
    if let Some(probe) = probe {
        sqlx::query(q(probe))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| shape_error(table, "lock", e))?;
    }
    Ok(())
}

/// Ensures the table exists, has the expected shape, and (for the lock
/// table) compares names byte by byte.
pub(crate) async fn ensure_mysql(
    conn: &mut MySqlConnection,
    sql: &Statements,
    table: &str,
    create: &Arc<str>,
    probe: Option<&Arc<str>>,
    errors: &ErrorContext,
) -> Result<(), LockError> {
    if !exists!(conn, sql, table).map_err(|e| errors.map("looking up the table", e))? {
        if let Err(e) = conn.execute(q(create)).await {
            if !exists!(conn, sql, table).unwrap_or(false) {
                return Err(errors.map(&format!("creating table `{table}`"), e));
            }
        }
    }
    let Some(probe) = probe else {
        return Ok(());
    };
    sqlx::query(q(probe))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| shape_error(table, "lock", e))?;
    let column: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT CAST(DATA_TYPE AS CHAR), CAST(COLLATION_NAME AS CHAR) \
         FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'name'",
    )
    .bind(table)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| errors.map("checking the name column", e))?;
    let Some((data_type, collation)) = column else {
        return Err(shape_error(table, "lock", "no `name` column"));
    };
    if !name_column_is_exact(&data_type, collation.as_deref()) {
        return Err(LockError::Config(format!(
            "column `{table}.name` is {data_type} with collation {}: it does not compare \
             bytes, so names differing in case, accents or trailing spaces would be one lock; \
             use `name VARBINARY(512) NOT NULL` (see docs/sql.md)",
            collation.unwrap_or_else(|| "none".into())
        )));
    }
    Ok(())
}

/// VARBINARY/BINARY/BLOB compare bytes; among text collations only the
/// binary NO PAD ones do (`utf8mb4_bin` is PAD SPACE: "a" = "a ").
fn name_column_is_exact(data_type: &str, collation: Option<&str>) -> bool {
    let t = data_type.to_ascii_lowercase();
    if matches!(t.as_str(), "varbinary" | "binary" | "blob" | "tinyblob") {
        return true;
    }
    collation.is_some_and(|c| {
        let c = c.to_ascii_lowercase();
        c.ends_with("_nopad_bin") || c == "utf8mb4_0900_bin" || c == "binary"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_name_columns() {
        assert!(name_column_is_exact("varbinary", None));
        assert!(name_column_is_exact("varchar", Some("utf8mb4_nopad_bin")));
        assert!(!name_column_is_exact("varchar", Some("utf8mb4_bin")));
        assert!(!name_column_is_exact("varchar", Some("utf8mb4_general_ci")));
        assert!(!name_column_is_exact("text", None));
    }
}
