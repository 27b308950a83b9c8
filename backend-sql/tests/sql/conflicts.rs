//! A statement the server rolls back for a deadlock or a serialization
//! failure is run again at once, a bounded number of times, before the
//! error (retryable) reaches the caller.
//!
//! The conflicts are injected on the real server: a trigger on the lock
//! table fails the next `n` updates (releases; the acquisitions here are
//! inserts of fresh rows, which it leaves alone) with the server's own
//! deadlock error (PostgreSQL SQLSTATE 40P01, MariaDB error 1213), counted
//! where a rollback does not take the count back (a PostgreSQL sequence, a
//! MariaDB MyISAM table).

use std::time::Duration;

use backend_sql::Dialect;
use lock_core::{LockBackend, OwnerToken};

use crate::common::{self, exec, request, table_of, unique, Db};

/// How many deadlocks in a row the client absorbs (`CONFLICT_RETRIES`).
const ABSORBED: u32 = 3;

/// Makes the next `n` updates of `db`'s lock table fail with a deadlock
/// error (the table must exist: a client has connected). An update
/// trigger, since on MariaDB any insert trigger hides the insert id that
/// carries an acquisition's outcome.
async fn inject_deadlocks(db: &Db, n: u32) {
    let table = table_of(&db.url);
    let seq = unique("deadlocks");
    let trigger = unique("deadlock");
    match db.dialect {
        Dialect::Postgres => {
            let function = format!(
                "CREATE FUNCTION {trigger}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF nextval('{seq}') <= {n} THEN \
                 RAISE EXCEPTION 'injected deadlock' USING ERRCODE = '40P01'; END IF; \
                 RETURN NEW; END $$"
            );
            exec(
                &db.base,
                &[
                    &format!("DROP TRIGGER IF EXISTS injected ON {table}"),
                    &format!("CREATE SEQUENCE {seq}"),
                    &function,
                    &format!(
                        "CREATE TRIGGER injected BEFORE UPDATE ON {table} \
                         FOR EACH ROW EXECUTE FUNCTION {trigger}()"
                    ),
                ],
            )
            .await;
        }
        Dialect::MySql => {
            exec(
                &db.base,
                &[
                    &format!("DROP TRIGGER IF EXISTS {table}_injected"),
                    // MyISAM: the trigger's count survives the rollback.
                    &format!("CREATE TABLE {seq} (n INT NOT NULL) ENGINE=MyISAM"),
                    &format!("INSERT INTO {seq} VALUES (0)"),
                    &format!(
                        "CREATE TRIGGER {table}_injected BEFORE UPDATE ON {table} FOR EACH ROW \
                         BEGIN UPDATE {seq} SET n = n + 1; \
                         IF (SELECT n FROM {seq}) <= {n} THEN SIGNAL SQLSTATE '40001' \
                         SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'injected deadlock'; END IF; END"
                    ),
                ],
            )
            .await;
        }
        other => unreachable!("{other:?}: no deadlock errors to inject"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlocks_are_retried_at_once_a_bounded_number_of_times() {
    let dbs = tokio::task::spawn_blocking(|| vec![common::postgres(), common::mariadb()])
        .await
        .unwrap();
    for db in dbs {
        let d = db.dialect;
        let client = db.client().await;
        let hold = |name: String| {
            let client = &client;
            async move {
                let req = request(
                    &name,
                    OwnerToken::random(),
                    Duration::from_secs(30),
                    Duration::ZERO,
                );
                client
                    .try_acquire(&req)
                    .await
                    .unwrap_or_else(|e| panic!("{d:?}: {e}"))
                    .unwrap_or_else(|| panic!("{d:?}: a fresh lock was refused"))
            }
        };

        // As many deadlocks as the client absorbs: the next run succeeds.
        let lease = hold(unique("deadlocked")).await;
        inject_deadlocks(&db, ABSORBED).await;
        client
            .release(&lease)
            .await
            .unwrap_or_else(|e| panic!("{d:?}: {ABSORBED} deadlocks were not absorbed: {e}"));
        assert!(
            client.inspect(lease.name()).await.unwrap().is_none(),
            "{d:?}"
        );

        // One more than that: the caller gets the deadlock, retryable, and
        // the lock is still held.
        let lease = hold(unique("deadlocked")).await;
        inject_deadlocks(&db, ABSORBED + 1).await;
        let e = client
            .release(&lease)
            .await
            .expect_err(&format!("{d:?}: more deadlocks than absorbed"));
        assert!(e.is_retryable(), "{d:?}: {e}");
        assert!(e.to_string().contains("deadlock"), "{d:?}: {e}");
        let held = client.inspect(lease.name()).await.unwrap().expect("held");
        assert_eq!(held.fence, Some(lease.fence()), "{d:?}");
        // Those were all its runs: the injected failures are used up, so
        // the next release is the first to succeed.
        client
            .release(&lease)
            .await
            .unwrap_or_else(|e| panic!("{d:?}: {e}"));
        assert!(
            client.inspect(lease.name()).await.unwrap().is_none(),
            "{d:?}"
        );
    }
}
