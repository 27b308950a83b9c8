//! A holder process frozen with SIGSTOP past its TTL comes back and writes
//! with its old fencing token: the database refuses the write, and the
//! next holder's write stands.

use std::process::Stdio;
use std::time::Duration;

use backend_sql::{placeholder, FenceOutcome};
use lock_core::Locker;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::{timeout, Instant};

use crate::common::{self, exec, fetch_text, unique, Db};

const HOLDER_TTL: Duration = Duration::from_millis(1500);
/// How long the holder "works" before writing: longer than its TTL, and
/// far longer than it takes the test to stop it.
const HOLDER_WORK: Duration = Duration::from_millis(2500);

async fn paused_holder_write_is_refused(db: Db) {
    let d = db.dialect;
    let table = unique("app");
    exec(
        &db.base,
        &[
            &format!(
                "CREATE TABLE {table} (id INTEGER PRIMARY KEY, value VARCHAR(64), fence BIGINT)"
            ),
            &format!("INSERT INTO {table} (id, value, fence) VALUES (1, 'initial', 0)"),
        ],
    )
    .await;
    let lock = unique("job");

    let mut holder = Command::new(env!("CARGO_BIN_EXE_sql-fenced-holder"))
        .args([
            db.url.as_str(),
            lock.as_str(),
            &HOLDER_TTL.as_millis().to_string(),
            &HOLDER_WORK.as_millis().to_string(),
            table.as_str(),
            "from the paused holder",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the holder process");
    let pid = Pid::from_raw(holder.id().expect("running") as i32);
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the holder took the lock in time")
        .unwrap()
        .expect("the holder printed a line");
    // Freeze it in the middle of its critical section.
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    let stopped_at = Instant::now();
    let old_fence: u64 = first
        .strip_prefix("ACQUIRED ")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("{d:?}: unexpected holder output {first:?}"));

    // The lock expires on the database's clock; the next holder takes it
    // and writes.
    let client = db.client().await;
    let next = Locker::new(client.clone())
        .lock(&lock)
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the next holder gets the expired lock");
    assert!(next.fence().get() > old_fence, "{d:?}");
    let update = format!(
        "UPDATE {table} SET value = {}, fence = {} WHERE id = 1",
        placeholder(d, 1),
        placeholder(d, 2)
    );
    let wrote = client
        .fenced(&next.lease())
        .statement(update, ["from the next holder".into(), next.fence().into()])
        .execute()
        .await
        .unwrap();
    assert_eq!(wrote, FenceOutcome::Applied { rows_affected: 1 }, "{d:?}");
    // The holder stays stopped until the next holder has written, so its
    // write comes later whatever the timing.
    eprintln!("{d:?}: holder stopped for {:?}", stopped_at.elapsed());

    // Wake the stale holder: it finishes its work and writes with its old
    // token, unaware it lost the lock.
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    let said = timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the holder answered in time")
        .unwrap()
        .unwrap_or_default();
    let status = timeout(Duration::from_secs(30), holder.wait())
        .await
        .expect("the holder exited")
        .unwrap();
    assert_eq!(
        said,
        format!("REFUSED {}", next.fence()),
        "{d:?}: the stale write was not refused"
    );
    assert_eq!(status.code(), Some(3), "{d:?}: holder exit status");
    let value = fetch_text(&db.base, &format!("SELECT value FROM {table} WHERE id = 1")).await;
    assert_eq!(
        value, "from the next holder",
        "{d:?}: the stale write landed"
    );
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_paused_holder_write_is_refused() {
    paused_holder_write_is_refused(common::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_paused_holder_write_is_refused() {
    let db = tokio::task::spawn_blocking(common::postgres).await.unwrap();
    paused_holder_write_is_refused(db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_paused_holder_write_is_refused() {
    let db = tokio::task::spawn_blocking(common::mariadb).await.unwrap();
    paused_holder_write_is_refused(db).await;
}
