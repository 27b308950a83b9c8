//! Holder metadata beside the lock row, and lock tables made by the
//! previous version (without its columns).

use std::time::{Duration, UNIX_EPOCH};

use backend_sql::{Dialect, SqlBackend};
use lock_core::{HolderMeta, LockBackend, LockName, OwnerToken};

use crate::common::{self, exec, fetch_text, request, unique, Db};

fn meta(pid: u32) -> HolderMeta {
    HolderMeta::new(
        "web-3.example",
        pid,
        "nightly --full 'a b'",
        UNIX_EPOCH + Duration::from_millis(1_780_000_000_123),
    )
}

/// The schema of the previous version: the lock table as it was created
/// before holder metadata, copied here as it was.
fn previous_ddl(dialect: Dialect, table: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n  \
             name TEXT NOT NULL PRIMARY KEY,\n  \
             owner TEXT NULL,\n  \
             version INTEGER NOT NULL,\n  \
             expires_at INTEGER NOT NULL\n) WITHOUT ROWID"
        ),
        Dialect::Postgres => format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n  \
             name TEXT COLLATE \"C\" NOT NULL PRIMARY KEY,\n  \
             owner TEXT NULL,\n  \
             version BIGINT NOT NULL,\n  \
             expires_at TIMESTAMPTZ NOT NULL\n)"
        ),
        _ => format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n  \
             name VARBINARY(512) NOT NULL,\n  \
             owner VARBINARY(64) NULL,\n  \
             version BIGINT UNSIGNED NOT NULL,\n  \
             expires_at DATETIME(6) NOT NULL,\n  \
             PRIMARY KEY (name)\n) ENGINE=InnoDB"
        ),
    }
}

/// Ten minutes from now by the database's clock, in the table's unit.
fn in_ten_minutes(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => {
            "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + 600000)"
        }
        Dialect::Postgres => "(clock_timestamp() + INTERVAL '10 minutes')",
        _ => "(UTC_TIMESTAMP(6) + INTERVAL 10 MINUTE)",
    }
}

/// What an acquire of the previous version does to an expired or free row:
/// it takes the row and bumps the version, and knows nothing of the
/// metadata columns.
fn previous_version_takeover(dialect: Dialect, table: &str, name: &str) -> String {
    format!(
        "UPDATE {table} SET owner = '{}', version = version + 1, expires_at = {} \
         WHERE name = '{name}'",
        OwnerToken::random(),
        in_ten_minutes(dialect)
    )
}

/// Whether the row of `name` still stores metadata ("set" or "null").
async fn stored_meta(db: &Db, table: &str, name: &str) -> String {
    fetch_text(
        &db.base,
        &format!(
            "SELECT CASE WHEN holder_meta IS NULL THEN 'null' ELSE 'set' END \
             FROM {table} WHERE name = '{name}'"
        ),
    )
    .await
}

/// A table made by the previous version, with a lock an old client holds,
/// gets the new columns when clients of this version connect (eight at
/// once, so the ALTER TABLE races); the old row reads back unchanged, and
/// a lock taken with metadata returns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_the_previous_version_gets_the_metadata_columns() {
    for db in common::all().await {
        let d = db.dialect;
        let table = unique("oldschema");
        let old_owner = OwnerToken::random().to_string();
        exec(
            &db.base,
            &[
                &previous_ddl(d, &table),
                &format!(
                    "INSERT INTO {table} (name, owner, version, expires_at) \
                     VALUES ('old job', '{old_owner}', 7, {})",
                    in_ten_minutes(d)
                ),
            ],
        )
        .await;
        let url = db.url_with(&format!("table={table}"));
        let clients: Vec<SqlBackend> =
            futures::future::join_all((0..8).map(|_| SqlBackend::connect(&url)))
                .await
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("{d:?}: connect to the old table: {e}")))
                .collect();
        let client = &clients[0];

        let old = client
            .inspect(&LockName::new("old job").unwrap())
            .await
            .unwrap_or_else(|e| panic!("{d:?}: inspect the old row: {e}"))
            .expect("the old client's lock is still held");
        assert_eq!(old.owner, old_owner, "{d:?}");
        assert_eq!(old.fence.map(|f| f.get()), Some(7), "{d:?}");
        assert_eq!(old.meta, None, "{d:?}: metadata made up for an old row");

        let req = request(
            "new job",
            OwnerToken::random(),
            Duration::from_secs(30),
            Duration::ZERO,
        )
        .with_meta(meta(4242));
        let lease = client
            .try_acquire(&req)
            .await
            .unwrap_or_else(|e| panic!("{d:?}: acquire with metadata: {e}"))
            .expect("free");
        let seen = clients[7]
            .inspect(lease.name())
            .await
            .unwrap()
            .expect("held");
        assert_eq!(seen.meta, Some(meta(4242)), "{d:?}");
        let listed = clients[3].list("", 10).await.unwrap();
        let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["new job", "old job"], "{d:?}");
        assert_eq!(listed[0].1.meta, Some(meta(4242)), "{d:?}");
        assert_eq!(listed[1].1.meta, None, "{d:?}");
        client.release(&lease).await.unwrap();
        // A second round of connections finds the columns and alters nothing.
        SqlBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{d:?}: connect again: {e}"));
    }
}

/// Metadata is kept by renewals and gone with the release: the row keeps
/// none of it, and the next holder without metadata shows none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_is_kept_by_renew_and_cleared_by_release() {
    for db in common::all().await {
        let d = db.dialect;
        let client = db.client().await;
        let table = client.config().table().to_string();
        let name = unique("meta");
        let req = request(
            &name,
            OwnerToken::random(),
            Duration::from_secs(30),
            Duration::ZERO,
        )
        .with_meta(meta(1));
        let lease = client.try_acquire(&req).await.unwrap().expect("free");
        let lease = client.renew(&lease).await.unwrap();
        let seen = client.inspect(lease.name()).await.unwrap().expect("held");
        assert_eq!(seen.meta, Some(meta(1)), "{d:?}: after a renewal");
        client.release(&lease).await.unwrap();
        assert_eq!(stored_meta(&db, &table, &name).await, "null", "{d:?}");

        let lease = common::try_once(&client, &name, Duration::from_secs(30))
            .await
            .expect("free");
        let seen = client.inspect(lease.name()).await.unwrap().expect("held");
        assert_eq!(seen.meta, None, "{d:?}");
        assert!(client.force_release(lease.name()).await.unwrap());
        assert_eq!(stored_meta(&db, &table, &name).await, "null", "{d:?}");
    }
}

/// A client of the previous version that takes over an expired lock
/// leaves the metadata columns alone; the new holder must not be shown
/// with the old holder's host and pid (an operator could force-release a
/// live holder thinking it dead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_by_a_previous_version_shows_no_stale_metadata() {
    for db in common::all().await {
        let d = db.dialect;
        let client = db.client().await;
        let table = client.config().table().to_string();
        let name = unique("mixed");
        let req = request(
            &name,
            OwnerToken::random(),
            Duration::from_secs(30),
            Duration::ZERO,
        )
        .with_meta(meta(2));
        let lease = client.try_acquire(&req).await.unwrap().expect("free");
        // The holder dies; a client of the previous version takes the row.
        exec(&db.base, &[&previous_version_takeover(d, &table, &name)]).await;
        assert_eq!(stored_meta(&db, &table, &name).await, "set", "{d:?}");
        let seen = client.inspect(lease.name()).await.unwrap().expect("held");
        assert_eq!(seen.fence.map(|f| f.get()), Some(lease.fence().get() + 1));
        assert_eq!(
            seen.meta, None,
            "{d:?}: the dead holder's metadata is shown"
        );
        let listed = client.list(&name, 10).await.unwrap();
        assert_eq!(listed.len(), 1, "{d:?}");
        assert_eq!(listed[0].1.meta, None, "{d:?}: list shows the dead holder");
    }
}

/// A transaction that keeps the old table in use blocks the ALTER TABLE
/// (and, on PostgreSQL, a waiting ALTER would queue every later statement
/// on the table behind it): the connect gives up after a bounded wait with
/// a retryable error, and succeeds once the table is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_the_columns_waits_a_bounded_time_for_the_table() {
    for db in common::all().await {
        let d = db.dialect;
        let table = unique("busyold");
        exec(&db.base, &[&previous_ddl(d, &table)]).await;
        if d == Dialect::Sqlite {
            // As a polylock client leaves the file: else switching it to
            // WAL at connect would wait for the blocker first.
            exec(&db.base, &["PRAGMA journal_mode = WAL"]).await;
        }
        let mut blocker = common::raw_connection(&db.base).await;
        let begin = match d {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            _ => "BEGIN",
        };
        sqlx::query(begin).execute(&mut blocker).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("SELECT name FROM {table}")))
            .fetch_all(&mut blocker)
            .await
            .unwrap();
        let url = db.url_with(&format!(
            "table={table}&op_timeout=1s&busy_timeout=1s&connect_timeout=2s"
        ));
        let started = std::time::Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(30), SqlBackend::connect(&url))
            .await
            .unwrap_or_else(|_| panic!("{d:?}: the ALTER TABLE waits without a bound"))
            .expect_err("altered a table another transaction uses");
        assert!(e.is_retryable(), "{d:?}: {e}");
        assert!(e.to_string().contains("ALTER TABLE"), "{d:?}: {e}");
        let waited = started.elapsed();
        sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
        SqlBackend::connect(&url).await.unwrap_or_else(|e| {
            panic!("{d:?}: connect once the table is free: {e} (gave up after {waited:?})")
        });
    }
}

/// A client that may use the old table but not alter it is told, at
/// connect, which statement to have someone run; once it ran, the same
/// client connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_may_not_alter_the_old_table_is_told_what_to_run() {
    let db = tokio::task::spawn_blocking(common::postgres).await.unwrap();
    let pg = common::pg();
    let table = unique("noalter");
    let role = unique("user");
    exec(&db.base, &[&previous_ddl(Dialect::Postgres, &table)]).await;
    // Only the superuser (over the Unix socket) may create roles.
    let superuser = format!(
        "postgres://postgres@localhost:{}/{}?host={}",
        pg.port(),
        pg.database(),
        pg.socket_dir().display()
    );
    exec(
        &superuser,
        &[
            &format!("CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'"),
            &format!("GRANT SELECT, INSERT, UPDATE ON {table} TO {role}"),
        ],
    )
    .await;
    let url = format!(
        "postgres://{role}:pw-{role}@{}/{}?table={table}",
        pg.addr(),
        pg.database()
    );
    let e = SqlBackend::connect(&url)
        .await
        .expect_err("a client without the right to alter altered the table");
    assert!(
        !e.is_retryable(),
        "a missing privilege does not go away: {e}"
    );
    let text = e.to_string();
    for column in ["holder_meta", "meta_version", "wake_until", "grant_id"] {
        let alter = format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}");
        assert!(text.contains(&alter), "{text}");
    }
    assert!(!text.contains(&format!("pw-{role}")), "{text}");
    // The statements the message quotes, run by the table's owner, are
    // all it takes.
    let quoted = text
        .split_once("run `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(sql, _)| sql.to_string())
        .expect("a quoted statement");
    let statements: Vec<&str> = quoted
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    exec(&db.base, &statements).await;
    let client = SqlBackend::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect once the columns exist: {e}"));
    let req = request(
        "job",
        OwnerToken::random(),
        Duration::from_secs(30),
        Duration::ZERO,
    )
    .with_meta(meta(5));
    let lease = client.try_acquire(&req).await.unwrap().expect("free");
    let seen = client.inspect(lease.name()).await.unwrap().expect("held");
    assert_eq!(seen.meta, Some(meta(5)));
    client.release(&lease).await.unwrap();
}
