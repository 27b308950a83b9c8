//! The fenced-write helper: a token below the highest accepted one is
//! refused and writes nothing; equal or higher tokens write.

use backend_sql::{placeholder, FenceOutcome};
use std::time::Duration;

use lock_core::{FencingToken, LockBackend};

use crate::common::{self, exec, fetch_text, unique};

fn t(v: u64) -> FencingToken {
    FencingToken::new(v).unwrap()
}

#[tokio::test]
async fn older_tokens_are_refused_and_write_nothing() {
    for db in common::all().await {
        let d = db.dialect;
        let table = unique("app");
        exec(
            &db.base,
            &[
                &format!("CREATE TABLE {table} (id INTEGER PRIMARY KEY, value VARCHAR(64))"),
                &format!("INSERT INTO {table} (id, value) VALUES (1, 'initial')"),
            ],
        )
        .await;
        let client = db.client().await;
        let update = format!(
            "UPDATE {table} SET value = {} WHERE id = {}",
            placeholder(d, 1),
            placeholder(d, 2)
        );
        let resource = unique("res");
        let write = |token: u64, value: &str| {
            client
                .fenced_token(resource.clone(), t(token))
                .statement(update.clone(), [value.into(), 1i64.into()])
                .execute()
        };

        let r = write(5, "five").await.unwrap();
        assert_eq!(r, FenceOutcome::Applied { rows_affected: 1 }, "{d:?}");
        // The same holder writes again with its token.
        assert!(write(5, "five again").await.unwrap().is_applied(), "{d:?}");
        // A stale holder.
        let r = write(3, "three").await.unwrap();
        assert_eq!(
            r,
            FenceOutcome::Stale {
                token: t(3),
                newer: t(5)
            },
            "{d:?}"
        );
        let value = fetch_text(&db.base, &format!("SELECT value FROM {table} WHERE id = 1")).await;
        assert_eq!(
            value, "five again",
            "{d:?}: a refused write changed the row"
        );
        // A newer holder; then the old one is refused too.
        assert!(write(9, "nine").await.unwrap().is_applied());
        assert!(!write(5, "five late").await.unwrap().is_applied());
        // Other resources have their own counters.
        let other = client
            .fenced_token(unique("res"), t(1))
            .statement(update.clone(), ["other".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert!(other.is_applied(), "{d:?}");
        // A failing statement rolls the fence back too: the token is not
        // recorded, so the same token can write afterwards.
        let resource2 = unique("res");
        let e = client
            .fenced_token(resource2.clone(), t(7))
            .statement(format!("UPDATE {table}_missing SET value = 'x'"), [])
            .execute()
            .await
            .expect_err("a missing table is an error");
        assert!(!e.is_retryable(), "{d:?}: {e}");
        let r = client
            .fenced_token(resource2, t(6))
            .statement(update.clone(), ["six".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert!(r.is_applied(), "{d:?}: the failed write's token was kept");
    }
}

/// The exact fenced write consults the lock row in its own transaction: a
/// holder past its TTL is refused even when nobody has written since,
/// which the token-only check cannot see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_fenced_write_refuses_a_stale_holder_before_anyone_wrote() {
    for db in common::all().await {
        let d = db.dialect;
        let table = unique("app");
        exec(
            &db.base,
            &[
                &format!("CREATE TABLE {table} (id INTEGER PRIMARY KEY, value VARCHAR(64))"),
                &format!("INSERT INTO {table} (id, value) VALUES (1, 'initial')"),
            ],
        )
        .await;
        let (a, b) = (db.client().await, db.client().await);
        let update = format!(
            "UPDATE {table} SET value = {} WHERE id = {}",
            placeholder(d, 1),
            placeholder(d, 2)
        );
        let select = format!("SELECT value FROM {table} WHERE id = 1");
        let value = || fetch_text(&db.base, &select);
        let name = unique("exact");
        let ttl = Duration::from_millis(400);
        let held_a = common::try_once(&a, &name, ttl).await.expect("A acquires");
        // The owner token is a capability (it releases the lock): a fenced
        // write's Debug shows only its prefix, as OwnerToken's own does.
        let shown = format!("{:?}", a.fenced(&held_a));
        assert!(
            !shown.contains(&held_a.owner().to_string()),
            "{d:?}: the full owner token in {shown}"
        );
        let wrote = a
            .fenced(&held_a)
            .statement(update.clone(), ["by A".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert_eq!(wrote, FenceOutcome::Applied { rows_affected: 1 }, "{d:?}");

        // A stalls past its TTL; nobody has taken the lock yet.
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        let late = a
            .fenced(&held_a)
            .statement(update.clone(), ["late A".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert_eq!(
            late,
            FenceOutcome::NotHeld {
                token: held_a.fence()
            },
            "{d:?}"
        );
        assert_eq!(
            value().await,
            "by A",
            "{d:?}: a refused write changed the row"
        );

        // B takes the expired lock but has not written yet: A's exact write
        // is refused with B's token; the token-only check would let it in.
        let held_b = common::try_once(&b, &name, Duration::from_secs(30))
            .await
            .expect("B takes the expired lock");
        let late = a
            .fenced(&held_a)
            .statement(update.clone(), ["late A".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert_eq!(
            late,
            FenceOutcome::Stale {
                token: held_a.fence(),
                newer: held_b.fence()
            },
            "{d:?}"
        );
        assert_eq!(
            value().await,
            "by A",
            "{d:?}: a refused write changed the row"
        );
        let wrote = b
            .fenced(&held_b)
            .statement(update.clone(), ["by B".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert!(wrote.is_applied(), "{d:?}: {wrote:?}");
        b.release(&held_b).await.unwrap();
        // Released: even the last holder's own writes are refused now.
        let after = b
            .fenced(&held_b)
            .statement(update.clone(), ["after release".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert_eq!(
            after,
            FenceOutcome::NotHeld {
                token: held_b.fence()
            },
            "{d:?}"
        );
        assert_eq!(value().await, "by B", "{d:?}");
    }
}

/// The token-only check, for comparison: it accepts a stale holder's write
/// while no newer token was recorded for the resource (what the exact
/// check above fixes), and refuses it once one was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_only_fenced_write_sees_only_recorded_tokens() {
    let db = common::sqlite();
    let client = db.client().await;
    let name = unique("tok");
    let ttl = Duration::from_millis(200);
    let stale = common::try_once(&client, &name, ttl)
        .await
        .expect("acquire");
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let next = common::try_once(&client, &name, Duration::from_secs(30))
        .await
        .expect("the next holder");
    let by_stale = || client.fenced_token(name.clone(), stale.fence()).execute();
    assert!(by_stale().await.unwrap().is_applied());
    assert!(client.fenced(&next).execute().await.unwrap().is_applied());
    assert_eq!(
        by_stale().await.unwrap(),
        FenceOutcome::Stale {
            token: stale.fence(),
            newer: next.fence()
        }
    );
}

/// A fenced write whose COMMIT was sent but not answered in time may have
/// been applied: the error says so and is not retryable, so that a caller
/// retrying retryable errors does not apply a non-idempotent write twice.
/// PostgreSQL, whose deferred constraint triggers run inside COMMIT: one
/// that sleeps makes the COMMIT outlast what is left of the op_timeout,
/// while the server's statement limit (op_timeout for each statement)
/// lets it finish.
#[tokio::test]
async fn a_commit_sent_without_an_answer_is_reported_as_maybe_applied() {
    let db = tokio::task::spawn_blocking(common::postgres).await.unwrap();
    let table = unique("slow_commit");
    exec(
        &db.base,
        &[
            &format!("CREATE TABLE {table} (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"),
            &format!("INSERT INTO {table} VALUES (1, 0)"),
            &format!(
                "CREATE FUNCTION {table}_sleep() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN PERFORM pg_sleep(0.8); RETURN NULL; END $$"
            ),
            &format!(
                "CREATE CONSTRAINT TRIGGER {table}_slow AFTER UPDATE ON {table} \
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {table}_sleep()"
            ),
        ],
    )
    .await;
    let client = backend_sql::SqlBackend::connect(&db.url_with("op_timeout=1s"))
        .await
        .unwrap();
    let lease = common::try_once(&client, &unique("slow-commit"), Duration::from_secs(30))
        .await
        .expect("free");
    // 0.6 s of statements, then a COMMIT of 0.8 s: the client's second
    // runs out during the COMMIT, no statement reaches the server's limit.
    let r = client
        .fenced(&lease)
        .statement("SELECT pg_sleep(0.6)", [])
        .statement(format!("UPDATE {table} SET n = n + 1 WHERE id = 1"), [])
        .execute()
        .await;
    let e = r.expect_err("the COMMIT outlasted the op_timeout");
    assert!(
        !e.is_retryable(),
        "retryable although it may have been applied: {e}"
    );
    assert!(e.to_string().contains("may have been applied"), "{e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        fetch_text(&db.base, &format!("SELECT CAST(n AS TEXT) FROM {table}")).await,
        "1",
        "the COMMIT landed (what the error must not deny)"
    );
    client.release(&lease).await.unwrap();
}
