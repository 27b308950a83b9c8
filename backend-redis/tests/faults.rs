//! Faults on a real redis-server: killed, paused, and a connection cut by a
//! proxy (blackholed or reset). Each time the holder's `lost()` fires by its
//! lease's deadline, nothing hangs or panics, and the client recovers.

mod common;

use std::time::Duration;

use common::{
    acquire_free, backend, eventually, locker_on, numsub, release_and_time_handoff, server,
    server_and_clients, spawn_waiter_that_releases,
};
use lock_core::{LockGuard, Locker};
use testkit::{Mode, Proxy, RedisServer};
use tokio::time::{timeout, Instant};

const TTL: Duration = Duration::from_millis(1200);
/// How late after the deadline `lost()` may be observed on a loaded machine.
const LATE: Duration = Duration::from_millis(250);

async fn hold(locker: &Locker, name: &str) -> LockGuard {
    locker.lock(name).ttl(TTL).acquire().await.expect("acquire")
}

/// Waits for `lost()` and checks it came by the deadline.
async fn lost_by_deadline(guard: &LockGuard) {
    let deadline = guard.lease().deadline();
    timeout(TTL * 3, guard.lost())
        .await
        .expect("lost() never fired");
    let fired = Instant::now();
    assert!(
        fired <= deadline + LATE,
        "lost() fired {:?} after the deadline",
        fired - deadline
    );
    assert!(!guard.is_held());
}

/// A fresh lock can be taken through `locker` within `limit`.
async fn recovers(locker: &Locker, name: &str, limit: Duration) {
    let ok = eventually(limit, || async {
        match locker.lock(name).ttl(TTL).try_acquire().await {
            Ok(Some(g)) => {
                g.release().await.expect("release after recovery");
                true
            }
            _ => false,
        }
    })
    .await;
    assert!(ok, "no acquire succeeded within {limit:?} after the fault");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_while_held() {
    let srv = server();
    let locker = locker_on(&srv.url()).await;
    let guard = hold(&locker, "faults/killed").await;
    srv.kill().unwrap();
    lost_by_deadline(&guard).await;
    // Releasing a lost lock fails (the server is gone), promptly, without
    // panicking.
    let r = timeout(Duration::from_secs(5), guard.release())
        .await
        .expect("release hung");
    assert!(r.is_err());
    // With the server down, an acquire fails with a retryable error.
    let e = locker
        .lock("faults/killed")
        .try_acquire()
        .await
        .expect_err("acquire with the server down");
    assert!(e.is_retryable(), "{e}");
    srv.restart().unwrap();
    recovers(&locker, "faults/killed", Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_past_the_ttl() {
    let srv = server();
    let locker = locker_on(&srv.url()).await;
    let guard = hold(&locker, "faults/paused").await;
    srv.pause().unwrap();
    lost_by_deadline(&guard).await;
    // Keep it frozen well past the TTL, then let it go.
    tokio::time::sleep(TTL).await;
    srv.resume().unwrap();
    let r = timeout(Duration::from_secs(10), guard.release())
        .await
        .expect("release hung");
    assert!(r.is_err_and(|e| e.is_lost()));
    recovers(&locker, "faults/paused", Duration::from_secs(10)).await;
}

async fn cut_by_proxy(srv: &RedisServer, mode: Mode, name: &str) {
    let proxy = Proxy::start(srv.addr()).unwrap();
    let url = format!("redis://127.0.0.1:{}/0", proxy.port());
    let locker = locker_on(&url).await;
    let guard = hold(&locker, name).await;
    let fence = guard.fence();
    proxy.set_mode(mode);
    lost_by_deadline(&guard).await;
    let r = timeout(Duration::from_secs(10), guard.release())
        .await
        .expect("release hung");
    assert!(r.is_err(), "release through a cut connection: {r:?}");
    // While cut, an attempt fails (retryable) in bounded time.
    let started = Instant::now();
    let r = timeout(
        Duration::from_secs(10),
        locker.lock(name).ttl(TTL).try_acquire(),
    )
    .await
    .expect("try_acquire hung");
    assert!(r.as_ref().is_err_and(|e| e.is_retryable()), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    proxy.set_mode(Mode::Pass);
    // The lock expired on the server meanwhile; a new holder gets a higher
    // token, and replies are matched to the right requests again.
    let ok = eventually(Duration::from_secs(10), || async {
        match locker.lock(name).ttl(TTL).try_acquire().await {
            Ok(Some(g)) => {
                assert!(g.fence() > fence);
                let info = locker.inspect(name).await.unwrap().expect("held");
                assert_eq!(info.fence, Some(g.fence()));
                g.release().await.unwrap();
                assert!(locker.inspect(name).await.unwrap().is_none());
                true
            }
            _ => false,
        }
    })
    .await;
    assert!(ok, "no recovery after the proxy passed traffic again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_blackholed() {
    let srv = server();
    cut_by_proxy(&srv, Mode::Blackhole, "faults/blackhole").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_reset() {
    let srv = server();
    cut_by_proxy(&srv, Mode::Reset, "faults/reset").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_survives_its_pubsub_connection_being_killed() {
    let srv = server();
    let holder = locker_on(&srv.url()).await;
    let waiter = locker_on(&srv.url()).await;
    let mut admin = common::raw(&srv.url()).await;
    let guard = holder
        .lock("faults/pubsub")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let task = spawn_waiter_that_releases(waiter, "faults/pubsub", Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the waiter's pub/sub connection");
    // It reconnects and subscribes again, so the release still wakes it
    // at once rather than at a fallback poll.
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&admin, "__polylock__:released:{faults/pubsub}").await == 1
        })
        .await,
        "the waiter did not subscribe again"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let handoff = release_and_time_handoff(guard, task).await;
    assert!(
        handoff < Duration::from_millis(100),
        "woke {handoff:?} after the release"
    );
}

/// A request abandoned while its bytes were lost (the proxy's blackhole
/// drops them for good) must not shift later replies onto the wrong
/// requests once traffic flows again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_request_never_shifts_replies() {
    use common::{name, req};
    use lock_core::LockBackend;

    let srv = server();
    let proxy = Proxy::start(srv.addr()).unwrap();
    let ours = backend(&format!("redis://127.0.0.1:{}/0", proxy.port())).await;
    let x = name("faults/shift-x");
    let held = acquire_free(&ours, &x, Duration::from_secs(30)).await;
    proxy.set_mode(Mode::Blackhole);
    // Give up on a request whose bytes the network swallowed.
    assert!(timeout(Duration::from_millis(300), ours.inspect(&x))
        .await
        .is_err());
    proxy.set_mode(Mode::Pass);
    for round in 0..5 {
        let y = name(&format!("faults/shift-y{round}"));
        let ry = req(&y, Duration::from_secs(30));
        let (info, lease) = tokio::join!(ours.inspect(&x), ours.try_acquire(&ry));
        let info = info.unwrap().expect("x is held");
        assert_eq!(info.owner, held.owner().to_string(), "round {round}");
        assert_eq!(info.fence, Some(held.fence()));
        let lease = lease.unwrap().expect("y is free");
        assert_eq!(lease.name(), &y);
        ours.release(&lease).await.unwrap();
    }
    ours.release(&held).await.unwrap();
}

async fn script_flush(admin: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(admin)
        .await
        .unwrap();
}

/// Scripts go by SHA-1; after `SCRIPT FLUSH` (or a restart) the driver
/// loads them again on NOSCRIPT and nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    use common::{name, req};
    use lock_core::LockBackend;

    let (_srv, ours, mut admin) = server_and_clients("").await;
    let n = name("faults/noscript");
    let lease = acquire_free(&ours, &n, TTL).await;
    script_flush(&mut admin).await;
    let lease = ours.renew(&lease).await.expect("renew after SCRIPT FLUSH");
    script_flush(&mut admin).await;
    assert!(ours.inspect(&n).await.unwrap().is_some());
    script_flush(&mut admin).await;
    ours.release(&lease)
        .await
        .expect("release after SCRIPT FLUSH");
    script_flush(&mut admin).await;
    let again = ours
        .try_acquire(&req(&n, TTL))
        .await
        .unwrap()
        .expect("free");
    assert!(again.fence() > lease.fence());
    ours.release(&again).await.unwrap();
}
