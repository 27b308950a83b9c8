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

use crate::batch::{hold_many, left};
use crate::common::{self, exec, request, table_of, unique, Db};

/// How many deadlocks in a row the client absorbs (`CONFLICT_RETRIES`).
const ABSORBED: u32 = 3;

/// Puts a trigger on `db`'s lock table (the table must exist: a client has
/// connected) that runs `pg` (PL/pgSQL, before `RETURN NEW`) or `maria`
/// (MariaDB) before each update of a row, in place of the last such
/// trigger. An update trigger, since on MariaDB any insert trigger hides
/// the insert id that carries an acquisition's outcome.
async fn before_update(db: &Db, pg: &str, maria: &str) {
    let table = table_of(&db.url);
    match db.dialect {
        Dialect::Postgres => {
            let function = unique("injected");
            exec(
                &db.base,
                &[
                    &format!("DROP TRIGGER IF EXISTS injected ON {table}"),
                    &format!(
                        "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ \
                         BEGIN {pg} RETURN NEW; END $$"
                    ),
                    &format!(
                        "CREATE TRIGGER injected BEFORE UPDATE ON {table} \
                         FOR EACH ROW EXECUTE FUNCTION {function}()"
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
                    &format!(
                        "CREATE TRIGGER {table}_injected BEFORE UPDATE ON {table} \
                         FOR EACH ROW BEGIN {maria} END"
                    ),
                ],
            )
            .await;
        }
        other => unreachable!("{other:?}: no server to inject errors on"),
    }
}

/// Makes the next `n` updates of `db`'s lock table fail with the server's
/// deadlock error.
async fn inject_deadlocks(db: &Db, n: u32) {
    let count = unique("deadlocks");
    let setup = match db.dialect {
        Dialect::Postgres => vec![format!("CREATE SEQUENCE {count}")],
        // MyISAM: the count survives the rollback.
        _ => vec![
            format!("CREATE TABLE {count} (n INT NOT NULL) ENGINE=MyISAM"),
            format!("INSERT INTO {count} VALUES (0)"),
        ],
    };
    exec(
        &db.base,
        &setup.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    before_update(
        db,
        &format!(
            "IF nextval('{count}') <= {n} THEN \
             RAISE EXCEPTION 'injected deadlock' USING ERRCODE = '40P01'; END IF;"
        ),
        &format!(
            "UPDATE {count} SET n = n + 1; \
             IF (SELECT n FROM {count}) <= {n} THEN SIGNAL SQLSTATE '40001' \
             SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'injected deadlock'; END IF;"
        ),
    )
    .await;
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

/// A batch of renewals larger than one statement carries, one of whose
/// statements fails (a row the server refuses to update): every lease of
/// that statement is answered with the server's error, not `Lost` (the
/// locks are still held, and the watchdog tries again), and keeps its row
/// as it was; the other statement's leases are renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_statement_fails_its_own_leases_only() {
    let dbs = tokio::task::spawn_blocking(|| vec![common::postgres(), common::mariadb()])
        .await
        .unwrap();
    const CHUNK: usize = 256;
    for db in dbs {
        let d = db.dialect;
        let client = db.client().await;
        let leases = hold_many(
            &client,
            &unique("chunk"),
            CHUNK + 20,
            Duration::from_secs(60),
        )
        .await;
        let poisoned = leases[3].name().as_str().to_owned();
        before_update(
            &db,
            &format!("IF NEW.name = '{poisoned}' THEN RAISE EXCEPTION 'injected failure'; END IF;"),
            &format!(
                "IF NEW.name = '{poisoned}' THEN \
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected failure'; END IF;"
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let before = left(&client, &leases[0]).await;
        let answers = client.renew_many(&leases).await;
        for (i, answer) in answers.iter().enumerate() {
            if i < CHUNK {
                let e = answer
                    .as_ref()
                    .expect_err(&format!("{d:?}: lease {i} of the failed statement"));
                assert!(!e.is_lost(), "{d:?}: lease {i}: {e}");
                assert!(e.to_string().contains("injected failure"), "{d:?}: {e}");
            } else {
                let renewed = answer
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{d:?}: lease {i} of the other statement: {e}"));
                assert!(
                    renewed.deadline() > leases[i].deadline(),
                    "{d:?}: lease {i}"
                );
            }
        }
        assert!(
            left(&client, &leases[0]).await <= before,
            "{d:?}: a row of the failed statement was extended"
        );
        assert!(
            left(&client, &leases[CHUNK]).await > before,
            "{d:?}: a row of the other statement was not extended"
        );
    }
}
