//! The fenced-write helper: a token below the highest accepted one is
//! refused and writes nothing; equal or higher tokens write.

use backend_sql::{placeholder, FenceOutcome};
use lock_core::FencingToken;

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
                .fenced(resource.clone(), t(token))
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
            .fenced(unique("res"), t(1))
            .statement(update.clone(), ["other".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert!(other.is_applied(), "{d:?}");
        // A failing statement rolls the fence back too: the token is not
        // recorded, so the same token can write afterwards.
        let resource2 = unique("res");
        let e = client
            .fenced(resource2.clone(), t(7))
            .statement(format!("UPDATE {table}_missing SET value = 'x'"), [])
            .execute()
            .await
            .expect_err("a missing table is an error");
        assert!(!e.is_retryable(), "{d:?}: {e}");
        let r = client
            .fenced(resource2, t(6))
            .statement(update.clone(), ["six".into(), 1i64.into()])
            .execute()
            .await
            .unwrap();
        assert!(r.is_applied(), "{d:?}: the failed write's token was kept");
    }
}
