//! Fenced writes: a holder that was paused past its lease cannot overwrite
//! the work of the holder that came after it.
//!
//! ```text
//! cargo run -p backend-sql --example fenced_write                  # a temp SQLite file
//! cargo run -p backend-sql --example fenced_write -- postgres://app:pw@localhost/app
//! ```
//!
//! The story: worker A takes the lock, then stalls (a GC pause, a swapped
//! out process, a SIGSTOP) for longer than its TTL. The lock expires, worker
//! B takes it (with a higher fencing token) and writes. A wakes up and
//! writes too, unaware. Because both writes go through
//! `SqlBackend::fenced`, the database refuses A's: the lock row, checked in
//! the write's own transaction, shows B's newer holding (and A's token is
//! older than one already accepted for this resource).

use std::time::Duration;

use backend_sql::{placeholder, FenceOutcome, SqlBackend};
use lock_core::Locker;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let url = match std::env::args().nth(1) {
        Some(url) => url,
        None => format!("sqlite://{}", tmp.path().join("locks.db").display()),
    };
    let backend = SqlBackend::connect(&url).await?;
    let d = backend.dialect();
    let (p1, p2) = (placeholder(d, 1), placeholder(d, 2));

    // The application's own table, in the same database as the locks, set
    // up with plain sqlx here (any driver will do).
    sqlx::any::install_default_drivers();
    let app = sqlx::AnyPool::connect(&url.replacen("mariadb://", "mysql://", 1)).await?;
    sqlx::query("DROP TABLE IF EXISTS fenced_example")
        .execute(&app)
        .await?;
    sqlx::query("CREATE TABLE fenced_example (id INTEGER PRIMARY KEY, value VARCHAR(64))")
        .execute(&app)
        .await?;
    sqlx::query("INSERT INTO fenced_example (id, value) VALUES (1, 'initial')")
        .execute(&app)
        .await?;

    let locker = Locker::new(backend.clone());
    let ttl = Duration::from_millis(300);
    let update = format!("UPDATE fenced_example SET value = {p1} WHERE id = {p2}");

    // Worker A takes the lock, without a watchdog, and stalls past its TTL.
    let a = locker
        .lock("report")
        .ttl(ttl)
        .auto_renew(false)
        .acquire()
        .await?;
    println!("A holds the lock with token {}", a.fence());
    tokio::time::sleep(ttl * 2).await;

    // Worker B takes the expired lock and writes.
    let b = locker
        .lock("report")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    println!("B holds the lock with token {}", b.fence());
    let wrote = backend
        .fenced(&b.lease())
        .statement(update.clone(), ["written by B".into(), 1i64.into()])
        .execute()
        .await?;
    println!("B's write: {wrote:?}");

    // A wakes up and writes with its old token: refused.
    let late = backend
        .fenced(&a.lease())
        .statement(update, ["written by A".into(), 1i64.into()])
        .execute()
        .await?;
    match late {
        FenceOutcome::Stale { token, newer } => {
            println!("A's write refused: token {token} is older than {newer}")
        }
        other => println!("A's write: {other:?} (unexpected!)"),
    }
    let _ = a.release().await; // Err(Lost): A's lease expired long ago.
    b.release().await?;

    let (value,): (String,) = sqlx::query_as("SELECT value FROM fenced_example WHERE id = 1")
        .fetch_one(&app)
        .await?;
    println!("final value: {value:?}");
    Ok(())
}
