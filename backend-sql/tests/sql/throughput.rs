//! One client's concurrent operations share its connections well: on
//! SQLite its writers never meet each other on the file's write lock.

use std::time::Duration;

use backend_sql::SqlBackend;
use lock_core::LockBackend;

use crate::common::{self, try_once, unique};

/// 32 tasks of one SQLite client acquire and release distinct names at
/// once with `busy_timeout=0`, where any write meeting another connection's
/// write lock fails with SQLITE_BUSY at once: none does, because the
/// client's writes take turns instead of racing on the lock (racing ones
/// sleep in SQLite's busy handler, 1 ms and more each time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writers_of_one_client_never_meet_the_write_lock() {
    let db = tokio::task::spawn_blocking(common::sqlite).await.unwrap();
    let client = SqlBackend::connect(&db.url_with("busy_timeout=0ms&pool_size=4"))
        .await
        .unwrap();
    let prefix = unique("turns");
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let (client, name) = (client.clone(), format!("{prefix}/{t}"));
            tokio::spawn(async move {
                for _ in 0..20 {
                    let lease = try_once(&client, &name, Duration::from_secs(30))
                        .await
                        .expect("free");
                    let lease = client.renew(&lease).await.expect("renew");
                    client.release(&lease).await.expect("release");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("no write failed on the busy file");
    }
}
