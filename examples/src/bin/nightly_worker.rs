//! The nightly job, run by every worker of a fleet on a schedule: only one
//! of them runs it, and it stores its result with its fencing token.
//!
//! The lock service is whatever `POLYLOCK_URL` (or the config file in
//! `POLYLOCK_CONFIG`) names; nothing here depends on the backend.
//!
//! usage: nightly-worker STORE_DIR \[JOB_MILLISECONDS\]
//! prints `ran fence=N` or `skipped`, exit 0; errors on stderr, exit 1.

use std::process::ExitCode;
use std::time::Duration;

use polylock_examples::{FencedStore, Put};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nightly-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let store = FencedStore::open(
        args.next()
            .ok_or("usage: nightly-worker STORE_DIR [JOB_MS]")?,
    )?;
    let job = Duration::from_millis(args.next().map_or(Ok(200), |a| a.parse())?);

    let locker = polylock::connect_from_env().await?;
    // No wait: if another worker runs tonight's job, this one has nothing to do.
    let Some(guard) = locker
        .lock("nightly-job")
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .await?
    else {
        println!("skipped");
        return Ok(());
    };
    let fence = guard.fence().get();
    println!("running fence={fence}");
    let result = tokio::select! {
        r = nightly_job(job) => r,
        // Stop at once if the lock is lost: another worker may start.
        _ = guard.lost() => return Err("the lock was lost during the job".into()),
    };
    match store.put(fence, &result)? {
        Put::Accepted => println!("ran fence={fence}"),
        Put::Stale { newest } => {
            return Err(format!("the store holds a newer result (fence {newest})").into())
        }
    }
    guard.release().await?;
    Ok(())
}

/// The work itself.
async fn nightly_job(length: Duration) -> String {
    tokio::time::sleep(length).await;
    format!("report by worker {}", std::process::id())
}
