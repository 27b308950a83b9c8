//! Waiting: polling dialects hand off within about `max_poll`; on
//! PostgreSQL an expired (never released, so never notified) lock is still
//! found by the fallback timer.

use std::time::Duration;

use lock_core::Locker;
use tokio::time::Instant;

use crate::common::{self, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_gets_a_released_lock_promptly() {
    for db in common::all().await {
        let url = db.url_with("max_poll=50ms");
        let a = Locker::new(backend_sql::SqlBackend::connect(&url).await.unwrap());
        let b = Locker::new(backend_sql::SqlBackend::connect(&url).await.unwrap());
        let name = unique("handoff");
        let g = a.lock(&name).acquire().await.unwrap();
        let waiter = tokio::spawn({
            let name = name.clone();
            async move {
                let g = b.lock(&name).wait(Duration::from_secs(10)).acquire().await;
                (Instant::now(), g)
            }
        });
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let released = Instant::now();
        g.release().await.unwrap();
        let (got, g) = waiter.await.unwrap();
        let g = g.expect("the waiter gets the lock");
        let handoff = got - released;
        assert!(
            handoff < Duration::from_millis(500),
            "{:?}: hand-off took {handoff:?} with max_poll=50ms",
            db.dialect
        );
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_gets_an_expired_lock_without_any_notification() {
    for db in common::all().await {
        let url = db.url_with("max_poll=200ms");
        let a = Locker::new(backend_sql::SqlBackend::connect(&url).await.unwrap());
        let b = Locker::new(backend_sql::SqlBackend::connect(&url).await.unwrap());
        let name = unique("expiry");
        let ttl = Duration::from_millis(800);
        let g = a
            .lock(&name)
            .ttl(ttl)
            .auto_renew(false)
            .acquire()
            .await
            .unwrap();
        let acquired = g.lease().sent_at();
        let next = b
            .lock(&name)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .expect("the waiter gets the expired lock");
        let after = acquired.elapsed();
        assert!(
            after >= ttl,
            "{:?}: taken after {after:?}, before the TTL",
            db.dialect
        );
        assert!(
            after < ttl + Duration::from_millis(1500),
            "{:?}: taken {after:?} after the first acquire (TTL {ttl:?}, max_poll 200ms)",
            db.dialect
        );
        assert!(next.fence() > g.fence());
        drop(g);
        next.release().await.unwrap();
    }
}
