//! The database restarts (SIGKILL, then start on the same data) while a
//! lock is held: a restart well inside the lease keeps the lock (the SQL
//! backends declare `survives_restart`) and renewals resume; an outage
//! longer than the TTL makes the holder's lost() fire by its deadline.
//! Never two holders.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend_sql::SqlBackend;
use lock_core::{LockBackend, LockName, Locker};
use tokio::time::{sleep, timeout, Instant};

use crate::common::{try_once, unique};

const TTL: Duration = Duration::from_secs(4);

/// What must happen to the lock.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// The restart fits in the lease (a TTL of [`SURVIVE_TTL`], renewed
    /// every third of it): the lock must survive.
    Survive,
    /// The outage outlasts the TTL: the lock must be lost, by its deadline.
    Lose,
}

/// The TTL of the restarts the lock must survive: a lease renewed every
/// 5 s outlasts any outage under 10 s, however slow the machine starts the
/// database.
const SURVIVE_TTL: Duration = Duration::from_secs(15);

async fn restart_while_held(url: String, expect: Expect, restart: impl FnOnce() + Send + 'static) {
    let ttl = match expect {
        Expect::Survive => SURVIVE_TTL,
        Expect::Lose => TTL,
    };
    let holder = Locker::new(SqlBackend::connect(&url).await.unwrap());
    let name = unique("held");
    let guard = Arc::new(holder.lock(&name).ttl(ttl).acquire().await.unwrap());
    let fence = guard.fence();

    // A contender keeps trying; every time it gets the lock, the holder must
    // already know it has lost it.
    let contender = SqlBackend::connect(&url).await.unwrap();
    let overlaps = Arc::new(Mutex::new(Vec::new()));
    let taken = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let contend = tokio::spawn({
        let (guard, name, overlaps, taken, stop) = (
            guard.clone(),
            name.clone(),
            overlaps.clone(),
            taken.clone(),
            stop.clone(),
        );
        async move {
            while !stop.load(Ordering::SeqCst) {
                let req = lock_core::AcquireRequest::new(
                    LockName::new(&name).unwrap(),
                    lock_core::OwnerToken::random(),
                    Duration::from_secs(1),
                    Duration::ZERO,
                )
                .unwrap();
                if let Ok(Some(lease)) = contender.try_acquire(&req).await {
                    taken.fetch_add(1, Ordering::SeqCst);
                    if guard.is_held() {
                        overlaps.lock().unwrap().push(lease.fence());
                    }
                    let _ = contender.release(&lease).await;
                }
                sleep(Duration::from_millis(50)).await;
            }
        }
    });

    // When lost() fires, measured as it happens (during the outage too).
    let mut lost_signal = tokio::spawn({
        let signal = guard.lost_signal();
        async move {
            signal.await;
            Instant::now()
        }
    });

    sleep(Duration::from_millis(500)).await;
    let restarted = tokio::task::spawn_blocking(move || {
        restart();
        Instant::now()
    })
    .await
    .unwrap();

    let lost_at = match expect {
        // Two TTLs after the restart to lose it.
        Expect::Lose => timeout(ttl * 2, &mut lost_signal)
            .await
            .ok()
            .map(Result::unwrap),
        // Until the first renewal after the restart (a third of the TTL at
        // the latest, once the database is back), or the loss.
        Expect::Survive => {
            let until = Instant::now() + ttl;
            while Instant::now() < until
                && guard.lease().sent_at() <= restarted
                && !lost_signal.is_finished()
            {
                sleep(Duration::from_millis(100)).await;
            }
            if lost_signal.is_finished() {
                Some((&mut lost_signal).await.unwrap())
            } else {
                None
            }
        }
    };
    let lost = lost_at.is_some();
    stop.store(true, Ordering::SeqCst);
    contend.await.unwrap();
    assert!(
        overlaps.lock().unwrap().is_empty(),
        "two holders: the contender got {:?} while the holder still held",
        overlaps.lock().unwrap()
    );
    match expect {
        Expect::Lose => assert!(lost, "the lock outlived an outage longer than its TTL"),
        Expect::Survive => assert!(
            !lost,
            "the lock was lost across a restart inside its {ttl:?} lease, though the backend declares survives_restart"
        ),
    }
    if lost {
        assert!(!guard.is_held());
        let (deadline, lost_at) = (guard.lease().deadline(), lost_at.unwrap());
        assert!(
            lost_at <= deadline + Duration::from_millis(250),
            "lost() fired {:?} after the deadline",
            lost_at - deadline
        );
        eprintln!("restart: the lock was lost (lost() fired by its deadline)");
    } else {
        // Survived: the lease was renewed after the restart, the database
        // still shows this holder, and nobody else got it.
        assert!(guard.is_held());
        let lease = guard.lease();
        assert!(
            lease.sent_at() > restarted,
            "no renewal after the restart, yet not lost"
        );
        let info = SqlBackend::connect(&url)
            .await
            .unwrap()
            .inspect(&LockName::new(&name).unwrap())
            .await
            .unwrap()
            .expect("still held on the database");
        assert_eq!(info.fence, Some(fence));
        assert_eq!(
            taken.load(Ordering::SeqCst),
            0,
            "the contender got a held lock"
        );
        eprintln!("restart: the lock survived and renewals resumed");
    }
    lost_signal.abort();
    let guard = Arc::try_unwrap(guard).unwrap_or_else(|_| panic!("only the test holds the guard"));
    let released = guard.release().await;
    assert!(
        lost == released.is_err(),
        "release after restart: {released:?}"
    );

    // And the lock works normally afterwards.
    let client = SqlBackend::connect(&url).await.unwrap();
    let next = try_once(&client, &name, Duration::from_secs(5))
        .await
        .expect("free after release");
    assert!(next.fence() > fence);
    client.release(&next).await.unwrap();
}

/// A server for this test alone, as it stops it; started off the async
/// runtime.
async fn own_server<S: Send + 'static>(
    start: fn() -> testkit::Result<S>,
    what: &'static str,
) -> Arc<S> {
    Arc::new(
        tokio::task::spawn_blocking(start)
            .await
            .unwrap()
            .expect(what),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_while_held() {
    let server = own_server(testkit::PostgresServer::start, "start PostgreSQL").await;
    let s = server.clone();
    restart_while_held(server.url(), Expect::Survive, move || {
        s.restart().expect("restart")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_longer_than_the_ttl_loses_the_lock() {
    let server = own_server(testkit::PostgresServer::start, "start PostgreSQL").await;
    let s = server.clone();
    restart_while_held(server.url(), Expect::Lose, move || {
        s.kill().expect("kill");
        std::thread::sleep(TTL + Duration::from_secs(1));
        s.restart().expect("restart")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_restart_while_held() {
    let server = own_server(testkit::MariaDbServer::start, "start MariaDB").await;
    let s = server.clone();
    restart_while_held(server.url(), Expect::Survive, move || {
        s.restart().expect("restart")
    })
    .await;
}
