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
//!
//! Last, the columns added since the first version of the table
//! ([`Dialect::added_columns`](crate::Dialect)) are added to a table that
//! lacks them, each only after a look-up shows it missing (so a client that
//! may not alter the table works once someone added them), under a lock
//! wait limit (a waiting `ALTER TABLE` queues every later statement on the
//! table behind it), and an `ALTER TABLE` that failed because a racing
//! client added the column first counts as success. PostgreSQL runs it
//! under the advisory lock of creation, as `ADD COLUMN IF NOT EXISTS`.

use std::sync::Arc;
use std::time::Duration;

use lock_core::LockError;
use sqlx::{
    AssertSqlSafe, Connection, Database, Encode, Executor, IntoArguments, MySqlConnection,
    PgConnection, SqliteConnection, Type,
};

use crate::dialect::Statements;
use crate::errors::ErrorContext;

/// A key for `pg_advisory_xact_lock`, the same in every polylock process:
/// the bytes of "polylock" read as an integer.
const PG_SCHEMA_LOCK: i64 = 0x706f_6c79_6c6f_636b;

fn q(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

fn shape_error(table: &str, what: &str, e: impl std::fmt::Display) -> LockError {
    LockError::Config(format!(
        "table `{table}` exists but is not a polylock {what} table: {e}"
    ))
}

/// What table creation does differently on each database.
pub(crate) trait Schema: Connection {
    /// Runs the `CREATE TABLE IF NOT EXISTS` statement `create`.
    async fn create(&mut self, create: &Arc<str>) -> Result<(), sqlx::Error>;

    /// Runs the `ALTER TABLE ... ADD COLUMN` statement `alter`, waiting at
    /// most about `lock_wait` for the table's lock.
    async fn add_column(
        &mut self,
        alter: &Arc<str>,
        lock_wait: Duration,
    ) -> Result<(), sqlx::Error>;

    /// Where this connection's unqualified table names live, for the lock
    /// space: the database (SQLite: its file's full path, as SQLite
    /// resolved it) and, on PostgreSQL, the schema they resolve in.
    async fn namespace(&mut self) -> Result<String, sqlx::Error>;

    /// Checks of the lock table beyond the probe statement.
    async fn check_lock_table(
        &mut self,
        _table: &str,
        _errors: &ErrorContext,
    ) -> Result<(), LockError> {
        Ok(())
    }
}

/// The file's write lock is waited for through the busy timeout.
impl Schema for SqliteConnection {
    async fn namespace(&mut self) -> Result<String, sqlx::Error> {
        sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .fetch_one(&mut *self)
            .await
    }

    async fn create(&mut self, create: &Arc<str>) -> Result<(), sqlx::Error> {
        self.execute(q(create)).await.map(drop)
    }

    async fn add_column(&mut self, alter: &Arc<str>, _: Duration) -> Result<(), sqlx::Error> {
        self.execute(q(alter)).await.map(drop)
    }
}

/// Creation runs under an advisory lock.
impl Schema for PgConnection {
    async fn namespace(&mut self) -> Result<String, sqlx::Error> {
        sqlx::query_scalar("SELECT current_database() || '/' || COALESCE(current_schema(), '')")
            .fetch_one(&mut *self)
            .await
    }

    async fn create(&mut self, create: &Arc<str>) -> Result<(), sqlx::Error> {
        let mut tx = self.begin().await?;
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

    async fn add_column(
        &mut self,
        alter: &Arc<str>,
        lock_wait: Duration,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.begin().await?;
        // First, so it also bounds the wait for the advisory lock.
        tx.execute(AssertSqlSafe(format!(
            "SET LOCAL lock_timeout = {}",
            lock_wait.as_millis().max(1)
        )))
        .await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PG_SCHEMA_LOCK)
            .execute(&mut *tx)
            .await?;
        tx.execute("SET LOCAL client_min_messages = warning")
            .await?;
        tx.execute(q(alter)).await?;
        tx.commit().await
    }
}

/// The lock table must compare names byte by byte.
impl Schema for MySqlConnection {
    async fn namespace(&mut self) -> Result<String, sqlx::Error> {
        sqlx::query_scalar("SELECT COALESCE(DATABASE(), '')")
            .fetch_one(&mut *self)
            .await
    }

    async fn create(&mut self, create: &Arc<str>) -> Result<(), sqlx::Error> {
        self.execute(q(create)).await.map(drop)
    }

    /// The session setting is harmless: this connection only sets up the
    /// table and is closed after.
    async fn add_column(
        &mut self,
        alter: &Arc<str>,
        lock_wait: Duration,
    ) -> Result<(), sqlx::Error> {
        self.execute(AssertSqlSafe(format!(
            "SET SESSION lock_wait_timeout = {}",
            lock_wait.as_secs().max(1)
        )))
        .await?;
        self.execute(q(alter)).await.map(drop)
    }

    async fn check_lock_table(
        &mut self,
        table: &str,
        errors: &ErrorContext,
    ) -> Result<(), LockError> {
        let column: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT CAST(DATA_TYPE AS CHAR), CAST(COLLATION_NAME AS CHAR) \
             FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'name'",
        )
        .bind(table)
        .fetch_optional(&mut *self)
        .await
        .map_err(|e| errors.map("checking the name column", e))?;
        let Some((data_type, collation)) = column else {
            return Err(shape_error(table, "lock", "no `name` column"));
        };
        if data_type.eq_ignore_ascii_case("binary") {
            return Err(LockError::Config(format!(
                "column `{table}.name` is BINARY: it pads names with zero bytes, so a stored \
                 name never equals the name asked for and no lock could be renewed or released; \
                 use `name VARBINARY(512) NOT NULL` (see docs/sql.md)"
            )));
        }
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
}

/// Whether `table` has the column `column`.
async fn has_column<C>(
    conn: &mut C,
    sql: &Statements,
    table: &str,
    column: &str,
) -> Result<bool, sqlx::Error>
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'q> String: Encode<'q, C::Database> + Type<C::Database>,
    <C::Database as Database>::Arguments: IntoArguments<C::Database>,
{
    sqlx::query(q(&sql.column_exists))
        .bind(table.to_string())
        .bind(column.to_string())
        .fetch_optional(&mut *conn)
        .await
        .map(|r| r.is_some())
}

/// Adds to the lock table `table` the columns of later versions it lacks
/// (a table created by an earlier polylock, or by hand from its DDL).
pub(crate) async fn add_missing_columns<C>(
    conn: &mut C,
    sql: &Statements,
    table: &str,
    lock_wait: Duration,
    errors: &ErrorContext,
) -> Result<(), LockError>
where
    C: Schema,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'q> String: Encode<'q, C::Database> + Type<C::Database>,
    <C::Database as Database>::Arguments: IntoArguments<C::Database>,
{
    for (i, (column, alter)) in sql.add_columns.iter().enumerate() {
        let present = has_column(conn, sql, table, column)
            .await
            .map_err(|e| errors.map("looking up the table's columns", e))?;
        if present {
            continue;
        }
        tracing::info!(
            table,
            column,
            "polylock sql: adding a column to the lock table"
        );
        if let Err(e) = conn.add_column(alter, lock_wait).await {
            if !has_column(conn, sql, table, column).await.unwrap_or(false) {
                // Every statement still to run, so one hand-run fixes it.
                let todo: Vec<&str> = sql.add_columns[i..].iter().map(|(_, a)| &**a).collect();
                return Err(errors.map(
                    &format!(
                        "adding column `{column}` to table `{table}`, made by an earlier \
                         version (if this client may not alter it, run `{};`)",
                        todo.join("; ")
                    ),
                    e,
                ));
            }
        }
    }
    Ok(())
}

/// Whether `table` exists.
async fn exists<C>(conn: &mut C, sql: &Statements, table: &str) -> Result<bool, sqlx::Error>
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'q> String: Encode<'q, C::Database> + Type<C::Database>,
    <C::Database as Database>::Arguments: IntoArguments<C::Database>,
{
    sqlx::query(q(&sql.table_exists))
        .bind(table.to_string())
        .fetch_optional(&mut *conn)
        .await
        .map(|r| r.is_some())
}

/// Ensures the table exists and, given the lock table's `probe`, has the
/// lock table's shape.
pub(crate) async fn ensure<C>(
    conn: &mut C,
    sql: &Statements,
    table: &str,
    create: &Arc<str>,
    probe: Option<&Arc<str>>,
    errors: &ErrorContext,
) -> Result<(), LockError>
where
    C: Schema,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'q> String: Encode<'q, C::Database> + Type<C::Database>,
    <C::Database as Database>::Arguments: IntoArguments<C::Database>,
{
    if !exists(conn, sql, table)
        .await
        .map_err(|e| errors.map("looking up the table", e))?
    {
        if let Err(e) = conn.create(create).await {
            if !exists(conn, sql, table).await.unwrap_or(false) {
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
    conn.check_lock_table(table, errors).await
}

/// VARBINARY and BLOB compare bytes (BINARY pads them: refused before
/// this); among text collations only the binary NO PAD ones do
/// (`utf8mb4_bin` is PAD SPACE: "a" = "a ").
fn name_column_is_exact(data_type: &str, collation: Option<&str>) -> bool {
    let t = data_type.to_ascii_lowercase();
    if matches!(t.as_str(), "varbinary" | "blob" | "tinyblob") {
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
        assert!(!name_column_is_exact("binary", None));
    }
}
