//! Batched renewals (`renew_many`): each lease answered as `renew` would
//! answer it, in order, with one statement per chunk of leases, counted by
//! the servers themselves.

use std::str::FromStr;
use std::time::Duration;

use backend_sql::SqlBackend;
use futures::StreamExt;
use lock_core::{Lease, LockBackend, LockError};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::{sleep, Instant};

use crate::common::{self, try_once, unique};

/// More leases than one statement carries (256), so a batch spans chunks.
const OVER_A_CHUNK: usize = 2 * 256 + 5;

fn assert_lost(what: &str, d: backend_sql::Dialect, r: &Result<Lease, LockError>) {
    assert!(
        matches!(r, Err(LockError::Lost { .. })),
        "{d:?}: {what} must say Lost, got {r:?}"
    );
}

/// `n` locks held by `client`, each under its own owner and `ttl`.
pub(crate) async fn hold_many(
    client: &SqlBackend,
    prefix: &str,
    n: usize,
    ttl: Duration,
) -> Vec<Lease> {
    futures::stream::iter(0..n)
        .map(|i| {
            let name = format!("{prefix}/{i:04}");
            async move { try_once(client, &name, ttl).await.expect("free") }
        })
        .buffered(8)
        .collect()
        .await
}

/// The time the database gives `lease`'s row before it expires.
pub(crate) async fn left(client: &SqlBackend, lease: &Lease) -> Duration {
    client
        .inspect(lease.name())
        .await
        .unwrap()
        .and_then(|h| h.expires_in)
        .expect("held, with time left")
}

/// A live lease with a short TTL, a live one with a long TTL, a released
/// one, an expired one, one whose lock another client holds now: the live
/// ones are extended by their own TTL from the send, keeping their fence;
/// each of the others is `Lost` and its row is left as it was (the expired
/// one is not brought back, the other client still holds theirs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_answers_each_lease_as_renew_would() {
    for db in common::all().await {
        let d = db.dialect;
        let (holder, other) = (db.client().await, db.client().await);
        let p = unique("mix");
        let short = try_once(&holder, &format!("{p}/short"), Duration::from_secs(3))
            .await
            .unwrap();
        let long = try_once(&holder, &format!("{p}/long"), Duration::from_secs(60))
            .await
            .unwrap();
        let released = try_once(&holder, &format!("{p}/released"), Duration::from_secs(60))
            .await
            .unwrap();
        holder.release(&released).await.unwrap();
        let expired = try_once(&holder, &format!("{p}/expired"), Duration::from_millis(100))
            .await
            .unwrap();
        let taken = try_once(&holder, &format!("{p}/taken"), Duration::from_millis(100))
            .await
            .unwrap();
        sleep(Duration::from_millis(400)).await;
        let theirs = try_once(&other, taken.name().as_str(), Duration::from_secs(60))
            .await
            .expect("the expired lock is free for another client");

        let batch = [
            short.clone(),
            released.clone(),
            long.clone(),
            expired.clone(),
            taken.clone(),
        ];
        let before = Instant::now();
        let answers = holder.renew_many(&batch).await;
        let after = Instant::now();
        assert_eq!(answers.len(), batch.len(), "{d:?}: one answer per lease");
        for (old, answer) in [(&short, &answers[0]), (&long, &answers[2])] {
            let new = answer
                .as_ref()
                .unwrap_or_else(|e| panic!("{d:?}: {} not renewed: {e}", old.name()));
            assert_eq!(new.name(), old.name(), "{d:?}: answers out of order");
            assert_eq!(new.fence(), old.fence(), "{d:?}: the fence changed");
            assert_eq!(new.ttl(), old.ttl(), "{d:?}: each lease keeps its own TTL");
            assert!(
                new.sent_at() >= before && new.sent_at() <= after,
                "{d:?}: the send time is the batch's"
            );
            assert!(new.deadline() > old.deadline(), "{d:?}: deadline not moved");
        }
        assert_lost("a released lease", d, &answers[1]);
        assert_lost("an expired lease", d, &answers[3]);
        assert_lost("a lease another client took over", d, &answers[4]);

        // The database extended each live row by that lease's own TTL.
        assert!(
            left(&holder, &short).await <= Duration::from_secs(3),
            "{d:?}"
        );
        assert!(
            left(&holder, &long).await > Duration::from_secs(30),
            "{d:?}"
        );
        // Nothing came back to life, and nobody lost theirs.
        assert!(
            holder.inspect(expired.name()).await.unwrap().is_none(),
            "{d:?}: the expired lock was resurrected"
        );
        assert!(
            holder.inspect(released.name()).await.unwrap().is_none(),
            "{d:?}: the released lock was taken back"
        );
        let now = other.inspect(taken.name()).await.unwrap().expect("held");
        assert_eq!(
            now.fence,
            Some(theirs.fence()),
            "{d:?}: not theirs any more"
        );
        other
            .renew(&theirs)
            .await
            .expect("the other client still holds it");
    }
}

/// A batch of more leases than one statement carries, with every
/// seventh released beforehand and one lease given twice: every answer in
/// its place, the released ones lost, the rest renewed (both copies of the
/// one given twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_larger_than_a_chunk_is_answered_in_order() {
    for db in common::all().await {
        let d = db.dialect;
        let holder = db.client().await;
        let mut leases = hold_many(
            &holder,
            &unique("big"),
            OVER_A_CHUNK,
            Duration::from_secs(60),
        )
        .await;
        for lease in leases.iter().step_by(7) {
            holder.release(lease).await.unwrap();
        }
        leases.push(leases[1].clone());
        let answers = holder.renew_many(&leases).await;
        assert_eq!(answers.len(), leases.len(), "{d:?}");
        for (i, (lease, answer)) in leases.iter().zip(&answers).enumerate() {
            if i % 7 == 0 && i < OVER_A_CHUNK {
                assert_lost("a released lease", d, answer);
            } else {
                let new = answer
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{d:?}: lease {i} not renewed: {e}"));
                assert_eq!(new.name(), lease.name(), "{d:?}: answer {i} out of place");
                assert_eq!(new.fence(), lease.fence(), "{d:?}");
            }
        }
    }
}

/// The next transaction id PostgreSQL will hand out: every transaction
/// that writes a row takes one, at once (unlike `pg_stat_database`, whose
/// counts each backend publishes up to seconds later), and reading it
/// takes none.
async fn pg_next_xid(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        .fetch_one(pool)
        .await
        .expect("read the next xid")
}

/// PostgreSQL's own count of write transactions: renewing a batch of
/// leases (over two chunks) takes one per chunk, where renewing them one by
/// one takes one per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_renews_a_batch_in_one_transaction_per_chunk() {
    // A server of its own: the counter is the whole server's.
    let server = tokio::task::spawn_blocking(testkit::PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let holder = SqlBackend::connect(&server.url()).await.unwrap();
    let observer = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(PgConnectOptions::from_str(&server.url()).unwrap())
        .await
        .unwrap();
    let leases = hold_many(&holder, "count", 300, Duration::from_secs(60)).await;

    let x0 = pg_next_xid(&observer).await;
    let answers = holder.renew_many(&leases).await;
    let x1 = pg_next_xid(&observer).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert!(
        x1 - x0 <= 2,
        "300 leases in chunks of 256 took {} write transactions",
        x1 - x0
    );

    // The same leases one renew each: the counter sees every request.
    for lease in &leases {
        holder.renew(lease).await.unwrap();
    }
    let x2 = pg_next_xid(&observer).await;
    assert!(x2 - x1 >= 300, "the counter missed renewals: {}", x2 - x1);
}

/// MariaDB's own count of statements (`Questions`): renewing a batch
/// takes one UPDATE per chunk (plus the prepares of a fresh connection),
/// and one read more only when some lease was not renewed; one by one
/// takes one per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_renews_a_batch_in_one_statement_per_chunk() {
    let server = tokio::task::spawn_blocking(testkit::MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    let holder = SqlBackend::connect(&server.url()).await.unwrap();
    let observer = MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(MySqlConnectOptions::from_str(&server.url()).unwrap())
        .await
        .unwrap();
    let questions = || async {
        let (_, v): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
            .fetch_one(&observer)
            .await
            .expect("read Questions");
        v.parse::<i64>().unwrap()
    };
    let mut leases = hold_many(&holder, "count", 300, Duration::from_secs(60)).await;

    let q0 = questions().await;
    let answers = holder.renew_many(&leases).await;
    let q1 = questions().await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    // Two chunks, each at most a prepare and an execute, and the SHOW.
    assert!(q1 - q0 <= 5, "300 leases took {} statements", q1 - q0);

    // Some lost: one read more per chunk that has them.
    for lease in leases.iter().take(3) {
        holder.release(lease).await.unwrap();
    }
    let q2 = questions().await;
    let answers = holder.renew_many(&leases).await;
    let q3 = questions().await;
    assert!(answers[..3]
        .iter()
        .all(|a| a.as_ref().is_err_and(LockError::is_lost)));
    assert!(answers[3..].iter().all(Result::is_ok), "{answers:?}");
    assert!(
        q3 - q2 <= 7,
        "a batch with lost leases took {} statements",
        q3 - q2
    );

    // The same leases one renew each: the counter sees every request.
    leases.drain(..3);
    for lease in &leases {
        holder.renew(lease).await.unwrap();
    }
    let q4 = questions().await;
    assert!(q4 - q3 >= 297, "the counter missed renewals: {}", q4 - q3);
}
