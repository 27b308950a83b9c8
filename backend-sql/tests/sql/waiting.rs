//! Waiting: polling dialects hand off within about `max_poll`; on
//! PostgreSQL an expired (never released, so never notified) lock is still
//! found by the fallback timer; a requested pacing paces the polls.

use std::time::Duration;

use lock_core::{LockBackend, Locker};
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

/// A wait cancelled while its retry's statement is stuck inside the
/// database (behind a row lock; SQLite: behind the file's write lock) leaves
/// no lock behind when the statement goes through after the cancel: the
/// retry's own task sees it win and releases it. Without that, the grant
/// would belong to nobody until its 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cancelled_mid_statement_leaves_no_lock() {
    use backend_sql::Dialect;
    use lock_core::LockBackend;
    for db in common::all().await {
        let d = db.dialect;
        let url = db.url_with("max_poll=20ms");
        let client = backend_sql::SqlBackend::connect(&url).await.unwrap();
        let table = common::table_of(&url);
        let name = unique("cut");
        // Held, so the waiters' first attempts are refused and they retry.
        let _held = common::try_once(&client, &name, Duration::from_secs(30))
            .await
            .expect("a free lock");
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (locker, name) = (Locker::new(client.clone()), name.clone());
                tokio::spawn(async move {
                    locker
                        .lock(&name)
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;

        let mut blocker = common::raw_connection(&db.base).await;
        let block = match d {
            Dialect::Sqlite => vec!["BEGIN IMMEDIATE".to_string()],
            _ => vec![
                "BEGIN".to_string(),
                format!("SELECT version FROM {table} WHERE name = '{name}' FOR UPDATE"),
            ],
        };
        for sql in block {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut blocker)
                .await
                .unwrap();
        }
        // Every waiter retries within max_poll, and its statement sticks.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The holder's row goes (as in a release), the waiters are
        // cancelled, and only then do their statements go through.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE name = '{name}'"
        )))
        .execute(&mut blocker)
        .await
        .unwrap();
        for w in waiters {
            assert!(!w.is_finished(), "{d:?}: a waiter got past the block");
            w.abort();
            assert!(w.await.is_err_and(|e| e.is_cancelled()));
        }
        sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();

        let lock = lock_core::LockName::new(&name).unwrap();
        let since = Instant::now();
        // Let the stuck statements finish: a win shows up before its undo.
        tokio::time::sleep(Duration::from_millis(200)).await;
        while let Some(holder) = client.inspect(&lock).await.unwrap() {
            assert!(
                since.elapsed() < Duration::from_secs(3),
                "{d:?}: a cancelled waiter's statement took the lock and nobody released it: {holder:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The pacing a caller asks for (`Locker::with_retry`) paces a waiter's
/// polls: over the same wait for a lock that stays held, a fast pacing
/// sends many more statements than a slow one. On a MariaDB server of its
/// own, so the server's statement count is this test's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_polls_follow_the_requested_pacing() {
    let server = tokio::task::spawn_blocking(testkit::MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    let url = format!("{}?table={}", server.url(), unique("locks"));
    let questions = "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                     WHERE VARIABLE_NAME = 'QUESTIONS'";
    let holder = Locker::new(backend_sql::SqlBackend::connect(&url).await.unwrap());
    let name = unique("paced");
    let held = holder.lock(&name).acquire().await.unwrap();
    let mut statements = Vec::new();
    for pace in [Duration::from_millis(20), Duration::from_millis(500)] {
        let waiter = Locker::new(backend_sql::SqlBackend::connect(&url).await.unwrap())
            .with_retry(lock_core::wait::Backoff::new(pace, pace).unwrap());
        let before: u64 = common::fetch_text(&server.url(), questions)
            .await
            .parse()
            .unwrap();
        let r = waiter
            .lock(&name)
            .wait(Duration::from_millis(1500))
            .acquire()
            .await;
        assert!(r.is_err(), "acquired a held lock");
        let after: u64 = common::fetch_text(&server.url(), questions)
            .await
            .parse()
            .unwrap();
        statements.push(after - before);
    }
    let (fast, slow) = (statements[0], statements[1]);
    assert!(
        fast >= 20 && fast > slow * 4,
        "{fast} statements at a 20 ms pacing, {slow} at 500 ms"
    );
    held.release().await.unwrap();
}

/// A wait that ends while an attempt of it is unanswered (its op_timeout
/// ran out, the statement still on its way) gives back what that attempt
/// took once it can no longer land: the row is free again well before its
/// TTL, where it stayed held by nobody for the whole TTL. PostgreSQL: the
/// statement is slow on the network; SQLite: it waits for the file's write
/// lock past the op_timeout. (MariaDB: a statement stuck on a row lock is
/// ended by the server's own limit, and one slow on the network never gets
/// past the new connection's handshake, so no such grant can be made.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_gives_back_what_an_unanswered_attempt_took() {
    let ttl = Duration::from_secs(30);
    // PostgreSQL behind a link where every answer comes after the 1.5 s
    // op_timeout, while the statement runs in the database.
    {
        let pg = common::pg();
        let proxy = testkit::Proxy::start(([127, 0, 0, 1], pg.port()).into()).expect("proxy");
        let table = unique("locks");
        let via = common::through(&pg.url(), pg.port(), proxy.port());
        let waiter = backend_sql::SqlBackend::connect(&format!(
            "{via}?table={table}&op_timeout=1500ms&max_poll=200ms"
        ))
        .await
        .unwrap();
        let direct = backend_sql::SqlBackend::connect(&format!("{}?table={table}", pg.url()))
            .await
            .unwrap();
        let name = unique("unanswered");
        let held = common::try_once(&direct, &name, ttl).await.expect("free");
        // The waiter's connections open and its statements prepared while
        // the link is fast.
        let warm = common::try_once(&waiter, &unique("warm"), ttl)
            .await
            .expect("free");
        waiter.release(&warm).await.unwrap();
        proxy.set_mode(testkit::Mode::Delay(Duration::from_secs(1)));
        let (req, wait) = start_waiting(&waiter, &name, ttl);
        tokio::time::sleep(Duration::from_secs(3)).await;
        direct.release(&held).await.unwrap();
        // A statement of the waiter reaches the database by now and takes
        // the free row; its answer never comes in time.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        cancel_while_its_attempt_holds("postgres", wait, &direct, &req).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        proxy.set_mode(testkit::Mode::Pass);
        given_back_before_its_ttl("postgres", &direct, &req).await;
    }
    // SQLite: another connection holds the file's write lock; the
    // waiter's statement waits for it (busy_timeout 3 s) past its 1 s
    // op_timeout, and goes through when the row is freed and the lock let
    // go, after the wait was cancelled.
    {
        let db = common::sqlite();
        let url = db.url_with("op_timeout=1s&busy_timeout=3s&max_poll=50ms");
        let table = common::table_of(&url);
        let waiter = backend_sql::SqlBackend::connect(&url).await.unwrap();
        let direct = backend_sql::SqlBackend::connect(&url).await.unwrap();
        let name = unique("unanswered");
        let _held = common::try_once(&direct, &name, ttl).await.expect("free");
        let (req, wait) = start_waiting(&waiter, &name, ttl);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut blocker = common::raw_connection(&db.base).await;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut blocker)
            .await
            .unwrap();
        // The waiter's next attempt is stuck behind the write lock.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!wait.is_finished(), "sqlite: the wait ended: {wait:?}");
        wait.abort();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {table} SET owner = NULL WHERE name = '{name}'"
        )))
        .execute(&mut blocker)
        .await
        .unwrap();
        sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
        // The stuck statement goes through at the busy handler's next try.
        let owner = Some(req.owner.to_string());
        let taken_by = Instant::now() + Duration::from_secs(2);
        loop {
            let taken = direct.inspect(&req.name).await.unwrap();
            if taken.as_ref().map(|h| h.owner.clone()) == owner {
                break;
            }
            assert!(
                Instant::now() < taken_by,
                "sqlite: the scenario needs the waiter's unanswered attempt to hold the row: \
                 {taken:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        given_back_before_its_ttl("sqlite", &direct, &req).await;
    }
}

/// `waiter` waiting for `name` (up to a minute) in a task.
fn start_waiting(
    waiter: &backend_sql::SqlBackend,
    name: &str,
    ttl: Duration,
) -> (
    lock_core::AcquireRequest,
    tokio::task::JoinHandle<Result<Option<lock_core::Lease>, lock_core::LockError>>,
) {
    let req = common::request(
        name,
        lock_core::OwnerToken::random(),
        ttl,
        Duration::from_secs(60),
    );
    let wait = tokio::spawn({
        let (waiter, req) = (waiter.clone(), req.clone());
        async move { waiter.acquire(&req).await }
    });
    (req, wait)
}

/// Cancels `wait`, whose unanswered attempt must hold the row by now.
async fn cancel_while_its_attempt_holds(
    what: &str,
    wait: tokio::task::JoinHandle<Result<Option<lock_core::Lease>, lock_core::LockError>>,
    direct: &backend_sql::SqlBackend,
    req: &lock_core::AcquireRequest,
) {
    assert!(!wait.is_finished(), "{what}: the wait ended: {wait:?}");
    wait.abort();
    let taken = direct.inspect(&req.name).await.unwrap();
    assert_eq!(
        taken.as_ref().map(|h| h.owner.clone()),
        Some(req.owner.to_string()),
        "{what}: the scenario needs the waiter's unanswered attempt to hold the row"
    );
}

/// The row goes free within 10 s, long before its 30 s TTL.
async fn given_back_before_its_ttl(
    what: &str,
    direct: &backend_sql::SqlBackend,
    req: &lock_core::AcquireRequest,
) {
    let given_back = Instant::now() + Duration::from_secs(10);
    while let Some(holder) = direct.inspect(&req.name).await.unwrap() {
        assert!(
            Instant::now() < given_back,
            "{what}: the row an unanswered attempt took is still held: {holder:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let next = common::try_once(direct, req.name.as_str(), Duration::from_secs(30))
        .await
        .expect("free");
    direct.release(&next).await.unwrap();
}
