//! What a holder is told about its own holding: a release or renew after
//! someone else was granted the lock says `Lost`; a retried acquire takes
//! back the row its own timed-out attempt took; waiters cannot starve the
//! holder's renewals; statements go out without a ping first, stale
//! pooled connections are replaced without surfacing an error, and SQLite's
//! deadlines count from before its busy wait.

use std::sync::Arc;
use std::time::Duration;

use backend_sql::SqlBackend;
use lock_core::{LockBackend, LockError, LockName, Locker, OwnerToken};
use testkit::{Mode, Proxy};
use tokio::time::{sleep, timeout, Instant};

use crate::common::{self, raw_connection, request, through, try_once, unique};

fn assert_lost<T: std::fmt::Debug>(what: &str, d: backend_sql::Dialect, r: Result<T, LockError>) {
    assert!(
        matches!(r, Err(LockError::Lost { .. })),
        "{d:?}: {what} must say Lost, got {r:?}"
    );
}

/// A is force-released, B takes the lock, works and releases; then A's
/// release and renew must both say Lost: A's critical section was not
/// exclusive. A second release by the one who released stays `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_someone_else_held_says_lost() {
    for db in common::all().await {
        let d = db.dialect;
        let (a, b) = (db.client().await, db.client().await);
        let name = unique("overlap");
        let ttl = Duration::from_secs(30);

        let held_a = try_once(&a, &name, ttl).await.expect("A acquires");
        assert!(b.force_release(held_a.name()).await.unwrap());
        let held_b = try_once(&b, &name, ttl).await.expect("B acquires");
        b.release(&held_b).await.unwrap();
        assert_lost("renew after B held", d, a.renew(&held_a).await);
        assert_lost("release after B held", d, a.release(&held_a).await);
        // B released its own holding: releasing again is idempotent.
        b.release(&held_b).await.expect("B's second release");

        // A paused past its TTL: B takes the expired row and releases it.
        let short = Duration::from_millis(300);
        let held_a = try_once(&a, &name, short).await.expect("A acquires again");
        sleep(short + Duration::from_millis(200)).await;
        let held_b = try_once(&b, &name, ttl)
            .await
            .expect("B takes the expired lock");
        b.release(&held_b).await.unwrap();
        assert_lost("release after expiry and B", d, a.release(&held_a).await);

        // Force-released and nobody took it since: nothing overlapped.
        let held_a = try_once(&a, &name, ttl)
            .await
            .expect("A acquires a third time");
        assert!(b.force_release(held_a.name()).await.unwrap());
        a.release(&held_a)
            .await
            .unwrap_or_else(|e| panic!("{d:?}: nobody held it after A: {e}"));

        // A lease with the holder's version but another owner was never
        // the holder's: its release is refused and changes nothing.
        let real = try_once(&b, &name, ttl).await.expect("B holds");
        let forged = lock_core::Lease::new(
            real.name().clone(),
            OwnerToken::random(),
            real.fence(),
            real.ttl(),
            Instant::now(),
            real.policy(),
        );
        assert_lost("forged release", d, a.release(&forged).await);
        assert_eq!(
            a.inspect(real.name()).await.unwrap().and_then(|h| h.fence),
            Some(real.fence()),
            "{d:?}: the real holder's lock was touched"
        );
        b.release(&real).await.unwrap();
    }
}

/// The acquire statement reaches the database and takes the row, but its
/// answer comes after the operation timeout; the waiting acquire retries
/// and must recognise the row as its own instead of waiting out the TTL.
async fn retried_acquire_takes_back_its_orphan(dialect: &str, url: String, port: u16) {
    let proxy = Proxy::start(([127, 0, 0, 1], port).into()).expect("proxy");
    let table = unique("locks");
    let via = through(&url, port, proxy.port());
    let lock_url = format!("{via}?table={table}&op_timeout=400ms&pool_size=1&max_poll=50ms");
    let client = SqlBackend::connect(&lock_url).await.unwrap();
    let direct = SqlBackend::connect(&format!("{url}?table={table}"))
        .await
        .unwrap();
    // Open every pooled connection (and PostgreSQL's listener) while the
    // network is fast: through the delay no new connection can open within
    // the operation timeout. One at a time is not enough: a connection
    // goes back to the pool in a task of its own, and an acquire that finds
    // none idle while the pool is below its size opens another (the attempt
    // then never ran, on a loaded machine). Two statements at once (an
    // acquire on the main lane, a renew on the upkeep lane) bring the pool
    // to its size of two, after which an acquire waits for an idle one.
    let warm = client
        .acquire(&request(
            &unique("warm"),
            OwnerToken::random(),
            Duration::from_secs(5),
            Duration::from_secs(5),
        ))
        .await
        .unwrap()
        .expect("warm-up lock");
    let other = request(
        &unique("warm"),
        OwnerToken::random(),
        Duration::from_secs(5),
        Duration::ZERO,
    );
    let (renewed, second) = futures::join!(client.renew(&warm), client.try_acquire(&other));
    client.release(&renewed.unwrap()).await.unwrap();
    client
        .release(&second.unwrap().expect("second warm-up lock"))
        .await
        .unwrap();

    let name = unique("orphan");
    let owner = OwnerToken::random();
    let ttl = Duration::from_secs(60);
    proxy.set_mode(Mode::Delay(Duration::from_millis(700)));
    let waiting = tokio::spawn({
        let (client, name) = (client.clone(), name.clone());
        async move {
            client
                .acquire(&request(&name, owner, ttl, Duration::from_secs(40)))
                .await
        }
    });
    // The first attempt ran on the server: the row is ours, but the client
    // never saw the answer.
    let started = Instant::now();
    loop {
        let holder = direct
            .inspect(&LockName::new(&name).unwrap())
            .await
            .unwrap();
        if let Some(h) = holder {
            assert_eq!(h.owner, owner.to_string(), "{dialect}");
            break;
        }
        // Generous: on a loaded machine the delayed statement and the
        // server that runs it both wait for a core (10 s ran out once in CI).
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{dialect}: the attempt never ran"
        );
        sleep(Duration::from_millis(50)).await;
    }
    sleep(Duration::from_millis(800)).await;
    assert!(
        !waiting.is_finished(),
        "{dialect}: every attempt should time out while delayed"
    );
    proxy.set_mode(Mode::Pass);
    let lease = timeout(Duration::from_secs(15), waiting)
        .await
        .unwrap_or_else(|_| panic!("{dialect}: the retry waited for its own orphan"))
        .unwrap()
        .unwrap_or_else(|e| panic!("{dialect}: {e}"))
        .expect("granted");
    assert_eq!(lease.owner(), owner);
    let holder = direct.inspect(lease.name()).await.unwrap().expect("held");
    assert_eq!(
        holder.fence,
        Some(lease.fence()),
        "{dialect}: the lease is the row's holding"
    );
    // Through `direct`: the delayed client's connections were cut by its
    // timeouts, and a new one may take longer than its 400 ms on a loaded
    // machine. A release names owner and version, so any client can make it.
    direct.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retried_acquire_takes_back_its_orphan() {
    // A server of its own: the delayed client opens no new connection in
    // time, so it must not share connection slots and locks with the rest.
    let pg = tokio::task::spawn_blocking(testkit::PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    retried_acquire_takes_back_its_orphan("postgres", pg.url(), pg.port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_retried_acquire_takes_back_its_orphan() {
    let m = tokio::task::spawn_blocking(testkit::MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    retried_acquire_takes_back_its_orphan("mariadb", m.url(), m.port()).await;
}

/// Holds `name`'s row (or, on SQLite, the file's write lock) in a
/// transaction of its own, so that an acquire statement for it waits.
async fn block_row(db: &common::Db, name: &str) -> sqlx::AnyConnection {
    let mut blocker = raw_connection(&db.base).await;
    let statements = match db.dialect {
        backend_sql::Dialect::Sqlite => vec!["BEGIN IMMEDIATE".to_string()],
        _ => vec![
            "BEGIN".to_string(),
            format!(
                "SELECT version FROM {} WHERE name = '{name}' FOR UPDATE",
                common::table_of(&db.url)
            ),
        ],
    };
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut blocker)
            .await
            .unwrap();
    }
    blocker
}

/// One owner used for two acquisitions of one name: a retry after an
/// attempt that got no answer (its caller gave up while the statement
/// waited) takes back only what that attempt took. The live row of the
/// other acquisition stays, whether it went through another client of the
/// database or through the same one; the attempt's own orphan is taken
/// back by its retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_takes_back_only_its_own_attempts_row() {
    for db in common::all().await {
        let d = db.dialect;
        let (first, second) = (db.client().await, db.client().await);
        let name = unique("shared_owner");
        let req = request(
            &name,
            OwnerToken::random(),
            Duration::from_secs(30),
            Duration::ZERO,
        );
        let held = first
            .try_acquire(&req)
            .await
            .unwrap()
            .expect("the first client takes it");
        for (who, client) in [("another client", &second), ("the same client", &first)] {
            let mut blocker = block_row(&db, &name).await;
            let gave_up = timeout(Duration::from_millis(300), client.try_acquire(&req)).await;
            assert!(
                gave_up.is_err(),
                "{d:?}: a blocked attempt answered: {gave_up:?}"
            );
            sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
            let again = client.try_acquire(&req).await.unwrap();
            assert!(
                again.is_none(),
                "{d:?}: a retry through {who} took the live holding: {again:?}"
            );
        }
        first
            .renew(&held)
            .await
            .unwrap_or_else(|e| panic!("{d:?}: the first holding: {e}"));
        first.release(&held).await.unwrap();

        // A free name (another one: a statement given up on above may
        // still run on this one, SQLite's busy wait between its tries):
        // the unanswered attempt takes the row once the blocker goes, with
        // nobody told; its retry takes it back.
        let name = unique("own_orphan");
        let lock = LockName::new(&name).unwrap();
        let req = request(&name, req.owner, Duration::from_secs(30), Duration::ZERO);
        // The row exists (a row lock needs one) and is free.
        let before = try_once(&second, &name, Duration::from_secs(30))
            .await
            .expect("free");
        second.release(&before).await.unwrap();
        let mut blocker = block_row(&db, &name).await;
        let gave_up = timeout(Duration::from_millis(300), first.try_acquire(&req)).await;
        assert!(
            gave_up.is_err(),
            "{d:?}: a blocked attempt answered: {gave_up:?}"
        );
        sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
        let started = Instant::now();
        while second.inspect(&lock).await.unwrap().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{d:?}: the unanswered attempt never ran"
            );
            sleep(Duration::from_millis(20)).await;
        }
        let orphan = second.inspect(&lock).await.unwrap().and_then(|h| h.fence);
        let retaken = first
            .try_acquire(&req)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{d:?}: the retry did not take back its own row"));
        assert!(Some(retaken.fence()) > orphan, "{d:?}");
        first.release(&retaken).await.unwrap();
    }
}

/// A call that chains statements answers within one `op_timeout` in all:
/// on a link so slow that each statement takes most of it, the release of
/// a lease someone else took since (the release, then the read that tells
/// why nothing was freed) ends at the operation timeout with a retryable
/// error, not after two statements' time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_reads_after_its_statement_answers_within_one_op_timeout() {
    let pg = common::pg();
    let proxy = Proxy::start(([127, 0, 0, 1], pg.port()).into()).expect("proxy");
    let table = unique("locks");
    let url = pg.url();
    let via = through(&url, pg.port(), proxy.port());
    let op_timeout = Duration::from_secs(3);
    let client = SqlBackend::connect(&format!("{via}?table={table}&pool_size=1&op_timeout=3s"))
        .await
        .unwrap();
    let direct = SqlBackend::connect(&format!("{url}?table={table}"))
        .await
        .unwrap();
    let name = unique("slow_release");
    let lease = try_once(&client, &name, Duration::from_secs(30))
        .await
        .expect("free");
    // Opens the connections releases use, and prepares the read a release
    // makes after freeing nothing, while the network is fast.
    let lease = client.renew(&lease).await.unwrap();
    let other = try_once(&client, &unique("warm"), Duration::from_secs(30))
        .await
        .expect("free");
    client.release(&other).await.unwrap();
    client.release(&other).await.unwrap();
    // Someone else holds the name now: the release frees nothing.
    assert!(direct.force_release(lease.name()).await.unwrap());
    let next = try_once(&direct, &name, Duration::from_secs(30))
        .await
        .expect("taken over");
    // Each statement's round trip: 2.2 s of the 3 s.
    proxy.set_mode(Mode::Delay(Duration::from_millis(1100)));
    let started = Instant::now();
    let r = client.release(&lease).await;
    let took = started.elapsed();
    proxy.set_mode(Mode::Pass);
    assert!(
        took <= op_timeout + Duration::from_millis(700),
        "the release answered after {took:?} with a {op_timeout:?} op_timeout: {r:?}"
    );
    assert!(
        r.as_ref().is_err_and(LockError::is_retryable),
        "the read cannot have answered in time: {r:?}"
    );
    let holder = direct.inspect(lease.name()).await.unwrap().expect("held");
    assert_eq!(holder.fence, Some(next.fence()), "the holder was touched");
    direct.release(&next).await.unwrap();
}

/// A release whose statement freed the row but whose answer was lost to a
/// broken connection is sent again; a waiter took the row in between. The
/// resend finds a higher version, which is no evidence of a loss: the
/// release says `Ok`, not `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_after_it_freed_the_row_is_not_lost() {
    let pg = common::pg();
    let proxy = Proxy::start(([127, 0, 0, 1], pg.port()).into()).expect("proxy");
    let table = unique("locks");
    let url = pg.url();
    let via = through(&url, pg.port(), proxy.port());
    let client = SqlBackend::connect(&format!("{via}?table={table}&pool_size=1&op_timeout=10s"))
        .await
        .unwrap();
    let direct = SqlBackend::connect(&format!("{url}?table={table}"))
        .await
        .unwrap();
    let name = unique("resent");
    let lease = try_once(&client, &name, Duration::from_secs(30))
        .await
        .expect("free");
    // Opens the connection releases use (renewals share it) while the
    // network is fast: through the delay a new one takes many round trips.
    let lease = client.renew(&lease).await.unwrap();
    proxy.set_mode(Mode::Delay(Duration::from_millis(600)));
    let release = tokio::spawn({
        let (client, lease) = (client.clone(), lease.clone());
        async move { client.release(&lease).await }
    });
    // The statement ran: the row is free, its answer still on the way.
    let lock = LockName::new(&name).unwrap();
    let started = Instant::now();
    while direct.inspect(&lock).await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the release never ran"
        );
        sleep(Duration::from_millis(5)).await;
    }
    let next = try_once(&direct, &name, Duration::from_secs(30))
        .await
        .expect("a waiter takes the freed row");
    // Cuts the connection (its answer with it); the resend finds a fast
    // network again.
    proxy.set_mode(Mode::Reset);
    proxy.set_mode(Mode::Pass);
    let r = timeout(Duration::from_secs(20), release)
        .await
        .expect("the release answers")
        .unwrap();
    assert!(r.is_ok(), "the resent release said {r:?}");
    let holder = direct.inspect(&lock).await.unwrap().expect("held");
    assert_eq!(
        holder.fence,
        Some(next.fence()),
        "the waiter's holding is untouched"
    );
    direct.release(&next).await.unwrap();
}

/// Two acquisitions of one name under one owner (an explicit `Owner`
/// taking the name again while its cancelled wait's retry still runs) are
/// never in the database at once: one that may take back its own orphan
/// could otherwise take the other's live row. Seen from PostgreSQL: with
/// the row locked by a transaction of the test, only one of the two
/// statements waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_sends_one_acquire_per_name_at_a_time() {
    let db = common::postgres();
    let url = db.url_with("pool_size=4");
    let client = SqlBackend::connect(&url).await.unwrap();
    let name = unique("turns");
    let setup = try_once(&client, &name, Duration::from_secs(1))
        .await
        .unwrap();
    client.release(&setup).await.unwrap();
    let table = common::table_of(&url);
    let mut blocker = raw_connection(&db.base).await;
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM {table} WHERE name = '{name}' FOR UPDATE"
    )))
    .execute(&mut blocker)
    .await
    .unwrap();

    let owner = OwnerToken::random();
    let ttl = Duration::from_secs(30);
    let attempts: Vec<_> = (0..2)
        .map(|_| {
            let (client, name) = (client.clone(), name.clone());
            tokio::spawn(async move {
                client
                    .try_acquire(&request(&name, owner, ttl, Duration::ZERO))
                    .await
            })
        })
        .collect();
    let waiting = format!(
        "SELECT count(*)::text FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE '%{table}%' AND query NOT LIKE '%pg_stat_activity%'"
    );
    // The first statement reaches the row lock; give a second one every
    // chance to get there too.
    let started = Instant::now();
    while common::fetch_text(&db.base, &waiting).await == "0" {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no statement reached the row"
        );
        sleep(Duration::from_millis(50)).await;
    }
    sleep(Duration::from_millis(500)).await;
    assert_eq!(
        common::fetch_text(&db.base, &waiting).await,
        "1",
        "two acquire statements of one owner for one name are in the database at once"
    );
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let mut granted = Vec::new();
    for a in attempts {
        if let Some(lease) = timeout(Duration::from_secs(10), a)
            .await
            .expect("both attempts answer")
            .unwrap()
            .unwrap()
        {
            granted.push(lease);
        }
    }
    assert_eq!(granted.len(), 1, "{granted:?}");
    client.release(&granted[0]).await.unwrap();
}

/// More waiters than pool connections, stuck in the database (on a row
/// another transaction locks): the holder of another lock of the same
/// client keeps renewing and keeps its lock. Also once the waiters' stuck
/// statements time out and they try again on other connections: a
/// statement the client gave up on ends in the database too (a server-side
/// statement or lock-wait limit), which gives its connection back to the
/// pool; otherwise each retry stranded one more connection, until the
/// renewals found none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_do_not_starve_renewals() {
    let dbs = common::all().await;
    // SQLite serialises every writer on the file lock, whichever pool it
    // came from, so the waiters cannot be stuck while the renewals run.
    for db in dbs
        .into_iter()
        .filter(|d| d.dialect != backend_sql::Dialect::Sqlite)
    {
        let d = db.dialect;
        // Timeouts of 1 s strand one connection a second: all three (two
        // and one for upkeep) by the second TTL.
        let url = db.url_with("pool_size=2&op_timeout=1s");
        let client = SqlBackend::connect(&url).await.unwrap();
        let locker = Locker::new(client.clone());
        let (held, busy) = (unique("held"), unique("busy"));
        // The busy lock's row exists; a transaction of the test locks it,
        // so every waiter's attempt blocks inside the database.
        let setup = try_once(&client, &busy, Duration::from_secs(1))
            .await
            .unwrap();
        client.release(&setup).await.unwrap();
        let table = common::table_of(&url);
        let mut blocker = raw_connection(&db.base).await;
        sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT version FROM {table} WHERE name = '{busy}' FOR UPDATE"
        )))
        .execute(&mut blocker)
        .await
        .unwrap();

        let ttl = Duration::from_secs(2);
        let guard = locker.lock(&held).ttl(ttl).acquire().await.unwrap();
        let waiters: Vec<_> = (0..6)
            .map(|_| {
                let (client, busy) = (client.clone(), busy.clone());
                tokio::spawn(async move {
                    client
                        .acquire(&request(
                            &busy,
                            OwnerToken::random(),
                            ttl,
                            Duration::from_secs(60),
                        ))
                        .await
                })
            })
            .collect();
        let watched = Instant::now();
        while watched.elapsed() < ttl * 3 {
            assert!(
                guard.is_held(),
                "{d:?}: the holder lost its lock behind waiters"
            );
            sleep(Duration::from_millis(100)).await;
        }
        assert!(
            guard.lease().sent_at() > watched + ttl,
            "{d:?}: no renewal went through while the waiters waited"
        );
        for w in &waiters {
            assert!(!w.is_finished(), "{d:?}: a waiter got a locked row");
            w.abort();
        }
        sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
        guard.release().await.unwrap();
    }
}

/// One statement is one round trip: the pool does not ping a connection
/// before handing it out. Measured by round-trip count under a large
/// injected delay (each direction 300 ms, so one round trip is 600 ms and a
/// ping doubles it), not by speed.
async fn one_round_trip_per_statement(dialect: &str, url: String, port: u16) {
    let proxy = Proxy::start(([127, 0, 0, 1], port).into()).expect("proxy");
    let via = through(&url, port, proxy.port());
    let client = SqlBackend::connect(&format!("{via}?table={}&pool_size=1", unique("locks")))
        .await
        .unwrap();
    let name = unique("rt");
    let lease = try_once(&client, &name, Duration::from_secs(60))
        .await
        .unwrap();
    let lease = client.renew(&lease).await.unwrap();
    // Let the pool finish with the connections it was handed back.
    sleep(Duration::from_millis(300)).await;
    proxy.set_mode(Mode::Delay(Duration::from_millis(300)));
    let one_trip = Duration::from_millis(600);
    // The pool's connections take turns, and a statement's first run on a
    // connection prepares it (one round trip more): of three runs in a row
    // on a pool of two connections, one finds it prepared. A ping would
    // cost every run a round trip.
    let mut lease = lease;
    let mut renew = Duration::MAX;
    let mut acquire = Duration::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        lease = client.renew(&lease).await.unwrap();
        renew = renew.min(started.elapsed());
        let started = Instant::now();
        assert!(try_once(&client, &unique("rt"), Duration::from_secs(60))
            .await
            .is_some());
        acquire = acquire.min(started.elapsed());
    }
    for (what, took) in [("renew", renew), ("acquire", acquire)] {
        assert!(
            took >= one_trip && took < one_trip * 7 / 4,
            "{dialect}: {what} took {took:?}, one round trip is {one_trip:?}: a ping went first"
        );
    }
    proxy.set_mode(Mode::Pass);
    client.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_one_round_trip_per_statement() {
    let pg = tokio::task::spawn_blocking(common::pg).await.unwrap();
    one_round_trip_per_statement("postgres", pg.url(), pg.port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_one_round_trip_per_statement() {
    let m = tokio::task::spawn_blocking(common::maria).await.unwrap();
    one_round_trip_per_statement("mariadb", m.url(), m.port()).await;
}

/// Without a ping before each statement, connections that died with a
/// server restart sit in the pool; the first operations after the restart
/// must still succeed (on fresh connections), not surface the broken one.
async fn stale_connections_are_replaced(url: String, restart: impl FnOnce() + Send + 'static) {
    let client = SqlBackend::connect(&format!("{url}?table={}&pool_size=3", unique("locks")))
        .await
        .unwrap();
    let names: Vec<String> = (0..3).map(|_| unique("stale")).collect();
    // Several connections open at once, so several go stale.
    let leases: Vec<_> = futures::future::join_all(
        names
            .iter()
            .map(|n| try_once(&client, n, Duration::from_secs(60))),
    )
    .await
    .into_iter()
    .map(|l| l.expect("free"))
    .collect();
    for l in &leases {
        client.renew(l).await.unwrap();
    }
    assert!(client
        .fenced(&leases[0])
        .execute()
        .await
        .unwrap()
        .is_applied());
    sleep(Duration::from_millis(300)).await;
    tokio::task::spawn_blocking(restart).await.unwrap();
    // A fenced write opens its transaction again on a fresh connection.
    let fenced = client
        .fenced(&leases[0])
        .execute()
        .await
        .unwrap_or_else(|e| panic!("fenced write after the restart: {e}"));
    assert!(fenced.is_applied(), "{fenced:?}");
    for l in &leases {
        client
            .renew(l)
            .await
            .unwrap_or_else(|e| panic!("renew after the restart: {e}"));
    }
    let after = unique("stale");
    let fresh = client
        .try_acquire(&request(
            &after,
            OwnerToken::random(),
            Duration::from_secs(5),
            Duration::ZERO,
        ))
        .await
        .unwrap_or_else(|e| panic!("acquire after the restart: {e}"))
        .expect("free");
    client.release(&fresh).await.unwrap();
    for l in &leases {
        client.release(l).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stale_pooled_connections_are_replaced() {
    let server = Arc::new(
        tokio::task::spawn_blocking(testkit::PostgresServer::start)
            .await
            .unwrap()
            .expect("start PostgreSQL"),
    );
    let s = server.clone();
    stale_connections_are_replaced(server.url(), move || s.restart().expect("restart")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_stale_pooled_connections_are_replaced() {
    let server = Arc::new(
        tokio::task::spawn_blocking(testkit::MariaDbServer::start)
            .await
            .unwrap()
            .expect("start MariaDB"),
    );
    let s = server.clone();
    stale_connections_are_replaced(server.url(), move || s.restart().expect("restart")).await;
}

/// Taking back a row under one's own owner is only for an attempt that
/// got no answer: a plain second attempt of the same owner while the row
/// is held is refused, as for anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_attempt_of_the_same_owner_is_refused() {
    for db in common::all().await {
        let client = db.client().await;
        let name = unique("same");
        let owner = OwnerToken::random();
        let ttl = Duration::from_secs(30);
        let first = client
            .try_acquire(&request(&name, owner, ttl, Duration::ZERO))
            .await
            .unwrap()
            .expect("free");
        let second = client
            .try_acquire(&request(&name, owner, ttl, Duration::ZERO))
            .await
            .unwrap();
        assert!(second.is_none(), "{:?}: {second:?}", db.dialect);
        client.release(&first).await.unwrap();
    }
}

/// The brief's shape on every database: more waiters than pool
/// connections, polling the held name itself as fast as they may, while
/// the holder renews a short TTL through the same client: it keeps the
/// lock, and no waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_the_held_name_do_not_starve_its_renewals() {
    for db in common::all().await {
        let d = db.dialect;
        let client = SqlBackend::connect(&db.url_with("pool_size=2&max_poll=1ms"))
            .await
            .unwrap();
        let locker = Locker::new(client.clone());
        let name = unique("hot");
        let ttl = Duration::from_millis(900);
        let guard = locker.lock(&name).ttl(ttl).acquire().await.unwrap();
        let waiters: Vec<_> = (0..12)
            .map(|_| {
                let (client, name) = (client.clone(), name.clone());
                tokio::spawn(async move {
                    client
                        .acquire(&request(
                            &name,
                            OwnerToken::random(),
                            ttl,
                            Duration::from_secs(60),
                        ))
                        .await
                })
            })
            .collect();
        let watched = Instant::now();
        while watched.elapsed() < ttl * 4 {
            assert!(
                guard.is_held(),
                "{d:?}: the holder lost its lock to busy waiters"
            );
            sleep(Duration::from_millis(50)).await;
        }
        for w in &waiters {
            assert!(!w.is_finished(), "{d:?}: a waiter got a held lock");
            w.abort();
        }
        guard.release().await.unwrap();
    }
}

/// The database ends every connection of the client (an operator's
/// `pg_terminate_backend` or `KILL`, a proxy's idle cut) while the server
/// stays up. With no ping before each statement, the next operations meet
/// the dead connections: they must still succeed, on fresh ones.
async fn killed_connections_are_replaced(dialect: &str, url: String, kill_all: &[&str]) {
    let client = SqlBackend::connect(&format!("{url}?table={}&pool_size=3", unique("locks")))
        .await
        .unwrap();
    let names: Vec<String> = (0..3).map(|_| unique("killed")).collect();
    let leases: Vec<_> = futures::future::join_all(
        names
            .iter()
            .map(|n| try_once(&client, n, Duration::from_secs(60))),
    )
    .await
    .into_iter()
    .map(|l| l.expect("free"))
    .collect();
    for l in &leases {
        client.renew(l).await.unwrap();
    }
    sleep(Duration::from_millis(300)).await;
    let killed = {
        use sqlx::Connection;
        let mut admin = raw_connection(&url).await;
        let mut killed = 0;
        for sql in kill_all {
            let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
                .fetch_all(&mut admin)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            for (kill,) in rows {
                // MariaDB: each row is a KILL statement to run.
                if kill.starts_with("KILL") {
                    sqlx::query(sqlx::AssertSqlSafe(kill))
                        .execute(&mut admin)
                        .await
                        .unwrap();
                }
                killed += 1;
            }
        }
        admin.close().await.unwrap();
        killed
    };
    // The pool opens connections as the load asks: on a loaded machine the
    // three acquires may have shared one or two. Every one it has is ended.
    assert!(killed >= 1, "{dialect}: no connection was ended");
    for l in &leases {
        client
            .renew(l)
            .await
            .unwrap_or_else(|e| panic!("{dialect}: renew after the kill: {e}"));
    }
    let seen = client
        .inspect(leases[0].name())
        .await
        .unwrap_or_else(|e| panic!("{dialect}: inspect after the kill: {e}"))
        .expect("held");
    assert_eq!(seen.fence, Some(leases[0].fence()));
    let fresh = try_once(&client, &unique("killed"), Duration::from_secs(5))
        .await
        .expect("free");
    client.release(&fresh).await.unwrap();
    for l in &leases {
        client
            .release(l)
            .await
            .unwrap_or_else(|e| panic!("{dialect}: release after the kill: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_ended_by_the_server_are_replaced() {
    // A server of its own: the kill ends every connection to it.
    let server = tokio::task::spawn_blocking(testkit::PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    killed_connections_are_replaced(
        "postgres",
        server.url(),
        &[
            "SELECT pg_terminate_backend(pid)::text FROM pg_stat_activity \
           WHERE pid <> pg_backend_pid() AND datname = current_database()",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_connections_ended_by_the_server_are_replaced() {
    let server = tokio::task::spawn_blocking(testkit::MariaDbServer::start)
        .await
        .unwrap()
        .expect("start MariaDB");
    killed_connections_are_replaced(
        "mariadb",
        server.url(),
        &[
            "SELECT CONCAT('KILL CONNECTION ', ID) FROM information_schema.PROCESSLIST \
           WHERE ID <> CONNECTION_ID() AND USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)",
        ],
    )
    .await;
}

/// A fresh client opens its connections at connect: its first acquire, its
/// first renewal and its release, spaced as a holder
/// spaces them, open no connection (and so pay no handshake inside the TTL).
async fn lease_operations_of_a_fresh_client_open_no_connection(url: String, port: u16) {
    let proxy = Proxy::start(([127, 0, 0, 1], port).into()).expect("proxy");
    let table = unique("locks");
    let via = through(&url, port, proxy.port());
    let client = SqlBackend::connect(&format!("{via}?table={table}"))
        .await
        .unwrap();
    // The schema step's own connection closes once it is done.
    sleep(Duration::from_millis(300)).await;
    let opened = proxy.connection_count();
    let lease = try_once(&client, &unique("fresh"), Duration::from_secs(5))
        .await
        .expect("free");
    sleep(Duration::from_millis(200)).await;
    let lease = client.renew(&lease).await.unwrap();
    sleep(Duration::from_millis(200)).await;
    client.release(&lease).await.unwrap();
    assert_eq!(
        proxy.connection_count(),
        opened,
        "a lease operation opened a connection (before the first: {opened})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_operations_of_a_fresh_client_open_no_connection() {
    let pg = tokio::task::spawn_blocking(common::pg).await.unwrap();
    lease_operations_of_a_fresh_client_open_no_connection(pg.url(), pg.port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_lease_operations_of_a_fresh_client_open_no_connection() {
    let m = tokio::task::spawn_blocking(common::maria).await.unwrap();
    lease_operations_of_a_fresh_client_open_no_connection(m.url(), m.port()).await;
}

/// Checks that `what`, called at `started` and answered `waited` later
/// (at least `blocked`), gave `lease` a deadline counted from the call.
fn counted_from_the_call(
    what: &str,
    lease: &lock_core::Lease,
    started: Instant,
    waited: Duration,
    blocked: Duration,
) {
    // Scheduling noise between the statement's start and our clock read.
    let noise = Duration::from_millis(10);
    assert!(waited >= blocked, "the {what} did not wait: {waited:?}");
    let latest = lease.policy().deadline(started, lease.ttl()) + noise;
    assert!(
        lease.deadline() <= latest,
        "{what}: the deadline is {:?} later than one counted from the call \
         ({waited:?} spent waiting for the write lock)",
        lease.deadline() - latest + noise
    );
}

/// Takes SQLite's write lock on `raw` now and gives it back after
/// `blocked`; the returned task ends then.
async fn hold_the_write_lock(
    mut raw: sqlx::AnyConnection,
    blocked: Duration,
) -> tokio::task::JoinHandle<()> {
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut raw)
        .await
        .expect("take the write lock");
    tokio::spawn(async move {
        sleep(blocked).await;
        sqlx::query("COMMIT")
            .execute(&mut raw)
            .await
            .expect("commit");
    })
}

/// SQLite has no wire to delay, but its writes can wait: while another
/// connection holds the file's write lock, an acquire and a renew sleep in
/// SQLite's busy handler. Their local deadlines are still counted from
/// before the statement was issued, never from its return, so they can
/// only come early (the conformance case checks the same on the networked
/// databases through a proxy that delays every reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_deadlines_are_counted_from_before_a_busy_wait() {
    let db = common::sqlite();
    let client = db.client().await;
    let name = unique("busy");
    let ttl = Duration::from_secs(5);
    let blocked = Duration::from_millis(300);
    // The first acquire creates the table; the raw writer needs it there.
    let first = try_once(&client, &name, ttl).await.expect("free");
    client.release(&first).await.expect("release");

    let held = hold_the_write_lock(raw_connection(&db.base).await, blocked).await;
    let started = Instant::now();
    let lease = try_once(&client, &name, ttl)
        .await
        .expect("free once the writer commits");
    let waited = started.elapsed();
    held.await.expect("writer");
    counted_from_the_call("acquire", &lease, started, waited, blocked);

    let held = hold_the_write_lock(raw_connection(&db.base).await, blocked).await;
    let started = Instant::now();
    let renewed = client.renew(&lease).await.expect("renew");
    let waited = started.elapsed();
    held.await.expect("writer");
    counted_from_the_call("renew", &renewed, started, waited, blocked);
    client.release(&renewed).await.expect("release");
}
