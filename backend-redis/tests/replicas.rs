//! `wait_replicas=`: an acquire is acknowledged by replicas (`WAIT`), or
//! undone.

mod common;

use std::time::Duration;

use common::{acquire_free, backend, eventually, name, raw, req};
use lock_core::LockBackend;
use testkit::RedisServer;
use tokio::time::Instant;

async fn info_replication(url: &str) -> String {
    let mut c = raw(url).await;
    redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waits_for_replicas_or_is_undone() {
    // No 5 s diskless-sync delay before the replica's first sync.
    let master = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]).unwrap();
    let replica =
        RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &master.port().to_string()])
            .unwrap();
    assert!(
        eventually(Duration::from_secs(15), || async {
            info_replication(&master.url())
                .await
                .contains("connected_slaves:1")
                && info_replication(&replica.url())
                    .await
                    .contains("master_link_status:up")
        })
        .await,
        "the replica never synced"
    );

    // One replica asked for, one there: granted, and the replica has it.
    let one = backend(&format!(
        "{}/0?wait_replicas=1&wait_timeout=2000",
        master.url()
    ))
    .await;
    let n = name("replicas/one");
    let lease = acquire_free(&one, &n, Duration::from_secs(30)).await;
    let key = one.keys(&n).unwrap().lock;
    let mut on_replica = raw(&replica.url()).await;
    let v: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert_eq!(
        v,
        Some(lease.owner().to_string()),
        "acknowledged, so the replica has it"
    );
    one.release(&lease).await.unwrap();

    // Two asked for, one there: the acquire is undone and reported, after
    // the wait timeout, as a retryable error.
    let two = backend(&format!(
        "{}/0?wait_replicas=2&wait_timeout=300",
        master.url()
    ))
    .await;
    let n = name("replicas/two");
    let started = Instant::now();
    let e = two
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .expect_err("only one replica");
    let took = started.elapsed();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("only 1 of 2 replicas"), "{e}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(
        two.inspect(&n).await.unwrap().is_none(),
        "an unreplicated lock was left held"
    );
}

/// `WAIT` counts the replicas that acknowledged the writes of the
/// connection it runs on. Here the connection that wrote the lock is
/// replaced (another command on it was abandoned) before the acquire's
/// `WAIT` would run; a `WAIT` on the fresh connection, which wrote
/// nothing, would be answered at once by a replica that never received the
/// lock. Sent in one pipeline with the script, it must report the stopped
/// replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_runs_on_the_connection_that_wrote() {
    let master = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]).unwrap();
    let replica =
        RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &master.port().to_string()])
            .unwrap();
    assert!(
        eventually(Duration::from_secs(15), || async {
            info_replication(&master.url())
                .await
                .contains("connected_slaves:1")
                && info_replication(&replica.url())
                    .await
                    .contains("master_link_status:up")
        })
        .await,
        "the replica never synced"
    );
    let ours = backend(&format!(
        "{}/0?wait_replicas=1&wait_timeout=500",
        master.url()
    ))
    .await;
    let n = name("replicas/same-connection");
    let mut admin = raw(&master.url()).await;

    // The replica stops acknowledging anything.
    replica.pause().unwrap();
    // Writes wait on the server for a moment, so that the acquire's script
    // is in flight when another command on its connection is abandoned.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(400)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let acquiring = {
        let ours = ours.clone();
        let n = n.clone();
        tokio::spawn(async move { ours.try_acquire(&req(&n, Duration::from_secs(30))).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let abandoned =
        tokio::time::timeout(Duration::from_millis(20), ours.inspect(&name("other"))).await;
    assert!(abandoned.is_err(), "the inspect should have been abandoned");

    let r = acquiring.await.unwrap();
    replica.resume().unwrap();
    let e = r.expect_err("a stopped replica acknowledged nothing");
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("only 0 of 1 replicas"), "{e}");
    assert!(ours.inspect(&n).await.unwrap().is_none(), "left held");

    // Renewals are confirmed the same way: granted with the replica up,
    // then the replica stops and the renewal is refused, the lease keeping
    // its deadline.
    let lease = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ours.try_acquire(&req(&n, Duration::from_secs(30))).await {
                Ok(Some(lease)) => return lease,
                Ok(None) => panic!("held by nobody"),
                // The replica catching up after its pause.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("acknowledged once the replica runs");
    replica.pause().unwrap();
    let r = ours.renew(&lease).await;
    replica.resume().unwrap();
    let e = r.expect_err("a stopped replica acknowledged no renewal");
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("keeps its previous deadline"), "{e}");
    ours.release(&lease).await.unwrap();
}
