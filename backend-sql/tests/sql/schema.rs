//! Table creation: concurrent first use, hand-made tables, foreign tables.

use std::time::Duration;

use backend_sql::{Dialect, SqlBackend};
use lock_core::{LockError, Locker};

use crate::common::{self, exec, unique};

/// Eight clients connecting at once to a database without the table all
/// succeed, and then share one table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_creating_the_table_at_once_all_succeed() {
    for db in common::all().await {
        // SQLite: the file does not even exist yet.
        let clients = futures::future::join_all((0..8).map(|_| SqlBackend::connect(&db.url))).await;
        let clients: Vec<SqlBackend> = clients
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{:?}: concurrent connect: {e}", db.dialect)))
            .collect();
        let name = unique("race");
        let first = common::try_once(&clients[0], &name, Duration::from_secs(30))
            .await
            .expect("free");
        for c in &clients[1..] {
            assert!(
                common::try_once(c, &name, Duration::from_secs(30))
                    .await
                    .is_none(),
                "{:?}: clients do not share the table",
                db.dialect
            );
        }
        lock_core::LockBackend::release(&clients[0], &first)
            .await
            .unwrap();
    }
}

/// A table created by hand with the documented DDL is used as is.
#[tokio::test]
async fn hand_made_table_from_the_documented_ddl_works() {
    for db in common::all().await {
        let table = unique("handmade");
        exec(&db.base, &[&db.dialect.lock_table_ddl(&table)]).await;
        let client = SqlBackend::connect(&db.url_with(&format!("table={table}")))
            .await
            .unwrap();
        let locker = Locker::new(client);
        let g = locker.lock("x").acquire().await.unwrap();
        assert_eq!(g.fence().get(), 1);
        g.release().await.unwrap();
    }
}

/// A table of the same name that is not a lock table is a Config error.
#[tokio::test]
async fn foreign_table_is_a_config_error() {
    for db in common::all().await {
        let table = unique("foreign");
        exec(
            &db.base,
            &[&format!("CREATE TABLE {table} (id INTEGER PRIMARY KEY)")],
        )
        .await;
        let e = SqlBackend::connect(&db.url_with(&format!("table={table}")))
            .await
            .expect_err("a foreign table was accepted");
        assert!(matches!(e, LockError::Config(_)), "{:?}: {e:?}", db.dialect);
        assert!(e.to_string().contains("not a polylock lock table"), "{e}");
    }
}

/// A hand-made MariaDB table whose `name` is BINARY(n) is refused: the
/// column pads names with zero bytes, so a renew or release would never
/// find the row it took.
#[tokio::test]
async fn mariadb_binary_name_column_is_refused() {
    let db = tokio::task::spawn_blocking(common::mariadb).await.unwrap();
    let table = unique("bin");
    exec(
        &db.base,
        &[&format!(
            "CREATE TABLE {table} (name BINARY(64) NOT NULL PRIMARY KEY, \
             owner VARBINARY(64) NULL, version BIGINT UNSIGNED NOT NULL, \
             expires_at DATETIME(6) NOT NULL)"
        )],
    )
    .await;
    let e = SqlBackend::connect(&db.url_with(&format!("table={table}")))
        .await
        .expect_err("a BINARY name column was accepted");
    assert!(matches!(e, LockError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("pads names"), "{e}");
}

/// MariaDB's default collations are case-insensitive and PAD SPACE: a
/// lock table whose `name` column uses one is refused, because "Job" and
/// "job" would be one lock.
#[tokio::test]
async fn mariadb_case_insensitive_name_column_is_refused() {
    let db = tokio::task::spawn_blocking(common::mariadb).await.unwrap();
    assert_eq!(db.dialect, Dialect::MySql);
    for collation in ["utf8mb4_general_ci", "utf8mb4_bin"] {
        let table = unique("ci");
        exec(
            &db.base,
            &[&format!(
                "CREATE TABLE {table} (name VARCHAR(512) CHARACTER SET utf8mb4 \
                 COLLATE {collation} NOT NULL PRIMARY KEY, owner VARBINARY(64) NULL, \
                 version BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL)"
            )],
        )
        .await;
        let e = SqlBackend::connect(&db.url_with(&format!("table={table}")))
            .await
            .expect_err("a case-insensitive name column was accepted");
        assert!(matches!(e, LockError::Config(_)), "{e:?}");
        assert!(e.to_string().contains(collation), "{e}");
    }
}

/// MariaDB: a `BEFORE INSERT` trigger on the lock table that runs a
/// statement of its own hides the insert id that carries an acquisition's
/// outcome (`LAST_INSERT_ID(expr)`), so the first acquisition of a name
/// answers "held" while its row is in fact written, and the name is
/// blocked until that phantom grant's TTL. docs/sql.md warns against
/// triggers on the lock table; this test says when the warning is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_an_insert_trigger_hides_the_outcome_of_an_acquisition() {
    let db = common::mariadb();
    let client = db.client().await;
    let table = common::table_of(&db.url);
    let side = unique("side");
    exec(
        &db.base,
        &[
            &format!("CREATE TABLE {side} (n INT NOT NULL)"),
            &format!(
                "CREATE TRIGGER {table}_ins BEFORE INSERT ON {table} \
                 FOR EACH ROW BEGIN INSERT INTO {side} VALUES (1); END"
            ),
        ],
    )
    .await;
    let name = unique("trigger");
    let got = common::try_once(&client, &name, Duration::from_secs(30)).await;
    assert!(
        got.is_none(),
        "the trigger no longer hides the outcome ({got:?}): docs/sql.md's warning is stale"
    );
    let written = common::fetch_text(
        &db.base,
        &format!("SELECT CAST(COUNT(*) AS CHAR) FROM {table} WHERE name = '{name}' AND owner IS NOT NULL"),
    )
    .await;
    assert_eq!(
        written, "1",
        "the refused acquisition's row was not written"
    );
    assert!(
        common::try_once(&client, &name, Duration::from_secs(30))
            .await
            .is_none(),
        "the name is not blocked by the phantom grant"
    );
}
