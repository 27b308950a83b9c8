//! A lock holder in its own process, for the fenced-write test: it takes a
//! lock, "works" for a while (the test freezes it with SIGSTOP meanwhile,
//! past its TTL), then writes with its fencing token WITHOUT checking that
//! it still holds the lock, as a paused process would. The database must
//! refuse the write.
//!
//! Usage: `sql-fenced-holder URL LOCK TTL_MS WORK_MS TABLE VALUE`
//!
//! Prints `ACQUIRED <fence>` once it holds the lock, then `APPLIED` (exit 0)
//! or `REFUSED <newer fence>` (exit 3); errors go to stderr (exit 1).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use backend_sql::{placeholder, FenceOutcome, SqlBackend};
use lock_core::Locker;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, lock, ttl_ms, work_ms, table, value] = args.as_slice() else {
        eprintln!("usage: sql-fenced-holder URL LOCK TTL_MS WORK_MS TABLE VALUE");
        return ExitCode::from(2);
    };
    match run(url, lock, ttl_ms, work_ms, table, value).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sql-fenced-holder: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(
    url: &str,
    lock: &str,
    ttl_ms: &str,
    work_ms: &str,
    table: &str,
    value: &str,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let work = Duration::from_millis(work_ms.parse()?);
    let backend = SqlBackend::connect(url).await?;
    let locker = Locker::new(backend.clone());
    let guard = locker
        .lock(lock)
        .ttl(ttl)
        .wait(Duration::from_secs(30))
        .acquire()
        .await?;
    let fence = guard.fence();
    println!("ACQUIRED {fence}");
    std::io::stdout().flush()?;

    // The critical section: the test stops the process in here.
    tokio::time::sleep(work).await;

    let d = backend.dialect();
    let sql = format!(
        "UPDATE {table} SET value = {}, fence = {} WHERE id = 1",
        placeholder(d, 1),
        placeholder(d, 2)
    );
    let outcome = backend
        .fenced(&guard.lease())
        .statement(sql, [value.into(), fence.into()])
        .execute()
        .await?;
    // The lock is long gone; releasing only cleans up.
    let _ = guard.release().await;
    match outcome {
        FenceOutcome::Applied { .. } => {
            println!("APPLIED");
            Ok(ExitCode::SUCCESS)
        }
        FenceOutcome::Stale { newer, .. } => {
            println!("REFUSED {newer}");
            Ok(ExitCode::from(3))
        }
        FenceOutcome::NotHeld { .. } => {
            println!("REFUSED NOT-HELD");
            Ok(ExitCode::from(3))
        }
        other => Err(format!("unexpected outcome {other:?}").into()),
    }
}
