//! The lock space is the table in its database: a lease taken in one
//! database is refused (`ForeignLease`, before any I/O) by a client of a
//! table of the same name in another database (another SQLite file,
//! another PostgreSQL schema, another MariaDB database), where the same
//! owner's own holding of the same name would otherwise be released in its
//! place; a client of the same table through another spelling of its
//! address shares the space.

use std::time::Duration;

use backend_sql::SqlBackend;
use lock_core::{LockBackend, LockError, OwnerToken};

use crate::common::{self, exec, request, unique, Db};

/// A lock URL on `db`'s server whose table of the same name lives in
/// another database or schema, made here.
async fn elsewhere(db: &Db) -> String {
    let table = common::table_of(&db.url);
    match db.dialect {
        backend_sql::Dialect::Sqlite => {
            // Another file beside it; the directory goes with `db`.
            db.url.replacen("locks.db", "other.db", 1)
        }
        backend_sql::Dialect::Postgres => {
            let schema = unique("space");
            exec(&db.base, &[&format!("CREATE SCHEMA {schema}")]).await;
            db.url_with(&format!(
                "table={table}&options=-c%20search_path%3D{schema}"
            ))
        }
        _ => {
            let database = unique("space");
            let root = sqlx::mysql::MySqlConnectOptions::new()
                .socket(common::maria().socket())
                .username("root");
            let pool = sqlx::MySqlPool::connect_with(root).await.expect("root");
            for s in [
                format!("CREATE DATABASE {database}"),
                format!("GRANT ALL PRIVILEGES ON {database}.* TO 'polylock'@'127.0.0.1'"),
                format!("GRANT ALL PRIVILEGES ON {database}.* TO 'polylock'@'%'"),
            ] {
                sqlx::query(sqlx::AssertSqlSafe(s.clone()))
                    .execute(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{s}: {e}"));
            }
            pool.close().await;
            db.url.replacen("/polylock?", &format!("/{database}?"), 1)
        }
    }
}

/// The same table through another spelling of the database's address.
fn same_table_spelled_otherwise(db: &Db) -> String {
    match db.dialect {
        backend_sql::Dialect::Sqlite => db.url.replacen("/locks.db", "/./locks.db", 1),
        _ => db.url_with("pool_size=3"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_from_another_database_is_foreign() {
    for db in common::all().await {
        let what = format!("{:?}", db.dialect);
        let here = db.client().await;
        let other_url = elsewhere(&db).await;
        assert_ne!(other_url, db.url);
        let there = SqlBackend::connect(&other_url)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let owner = OwnerToken::random();
        let ttl = Duration::from_secs(30);
        let req = request("space-job", owner, ttl, Duration::ZERO);
        let mine = here.try_acquire(&req).await.unwrap().expect("free here");
        let theirs = there
            .try_acquire(&req)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{what}: the other database's table is another table"));
        let r = there.release(&mine).await;
        assert!(
            matches!(r, Err(LockError::ForeignLease { .. })),
            "{what}: a lease of another database released: {r:?}"
        );
        let r = there.renew(&mine).await;
        assert!(
            matches!(r, Err(LockError::ForeignLease { .. })),
            "{what}: a lease of another database renewed: {r:?}"
        );
        assert!(
            there.inspect(&req.name).await.unwrap().is_some(),
            "{what}: the other database's own holding was released in its place"
        );
        let same = SqlBackend::connect(&same_table_spelled_otherwise(&db))
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        same.renew(&mine)
            .await
            .unwrap_or_else(|e| panic!("{what}: the same table, spelled otherwise: {e}"));
        same.release(&mine).await.unwrap();
        there.release(&theirs).await.unwrap();
    }
}
