//! Contract fixes from review (issue #9), on a real redis-server, in both
//! wire formats: a release after someone else's grant is a loss, a retried
//! attempt recognises its own unanswered grant (and only that), and an
//! evicted fencing counter never hands out a lower token, and one Redisson
//! hold never shortens the expiry another hold of the same owner relies on.

mod common;

use std::time::Duration;

use common::{acquire_free, name, req, server_and_clients};
use lock_core::{AcquireRequest, LockBackend, OwnerToken};
use redis::AsyncCommands;
use testkit::{Mode, Proxy};
use tokio::time::Instant;

const FORMATS: [&str; 2] = ["", "?format=redisson"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_renew_after_a_later_grant_are_lost() {
    for query in FORMATS {
        let (_srv, ours, _raw) = server_and_clients(query).await;
        let n = name("contract/overlap");
        let a = acquire_free(&ours, &n, Duration::from_secs(30)).await;
        // An operator removes A's lock; B takes it, works, releases.
        assert!(ours.force_release(&n).await.unwrap());
        let b = acquire_free(&ours, &n, Duration::from_secs(30)).await;
        assert!(b.fence() > a.fence());
        ours.release(&b).await.unwrap();
        // The lock is free again, but A's section was not exclusive.
        let r = ours.release(&a).await;
        assert!(
            r.as_ref().is_err_and(|e| e.is_lost()),
            "{query}: release after another grant: {r:?}"
        );
        let r = ours.renew(&a).await;
        assert!(
            r.as_ref().is_err_and(|e| e.is_lost()),
            "{query}: renew after another grant: {r:?}"
        );
        // Nobody else was granted it: releasing a removed lock is still Ok.
        let c = acquire_free(&ours, &n, Duration::from_secs(30)).await;
        assert!(ours.force_release(&n).await.unwrap());
        ours.release(&c).await.expect("no later grant: idempotent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_recognises_its_own_orphaned_grant() {
    let srv = common::server();
    let proxy = Proxy::start(srv.addr()).unwrap();
    let ours = common::backend(&format!(
        "redis://127.0.0.1:{}/0?op_timeout=300ms",
        proxy.port()
    ))
    .await;
    let direct = common::backend(&srv.url()).await;
    let mut raw = common::raw(&srv.url()).await;
    let n = name("contract/orphan");
    let owner = OwnerToken::random();
    let ttl = Duration::from_secs(30);
    let request = AcquireRequest::new(n.clone(), owner, ttl, Duration::from_secs(3)).unwrap();
    // Opens the connection while the network is fast.
    assert!(ours.inspect(&n).await.unwrap().is_none());
    // The first attempt runs on the server; its reply comes after the
    // operation timeout.
    proxy.set_mode(Mode::Delay(Duration::from_millis(500)));
    let first = ours.try_acquire(&request).await;
    assert!(first.as_ref().is_err_and(|e| e.is_retryable()), "{first:?}");
    let landed = common::eventually(Duration::from_secs(10), || async {
        direct.inspect(&n).await.unwrap().is_some()
    })
    .await;
    assert!(landed, "the first attempt never ran");
    let orphan = direct.inspect(&n).await.unwrap().expect("held");
    assert_eq!(orphan.owner, owner.to_string());
    let _: () = raw.pexpire(n.as_str(), 10_000).await.unwrap();
    proxy.set_mode(Mode::Pass);
    // The retry finds our own grant at once instead of waiting for it.
    let started = Instant::now();
    let lease = ours
        .acquire(&request)
        .await
        .unwrap()
        .expect("the retry recognises its own grant");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(Some(lease.fence()), orphan.fence, "the same grant");
    let pttl: i64 = raw.pttl(n.as_str()).await.unwrap();
    assert!(pttl > 25_000, "the retry's TTL applies: {pttl}");
    // Another owner still cannot take it.
    assert!(ours.try_acquire(&req(&n, ttl)).await.unwrap().is_none());
    // An answered grant is not taken over by the same owner's next
    // acquisition: that would hand out its token again, and its release
    // would delete the new holder's lock.
    assert!(ours.try_acquire(&request).await.unwrap().is_none());
    ours.release(&lease).await.unwrap();
    assert!(ours.inspect(&n).await.unwrap().is_none());
}

/// One owner token, a grant held: a second acquisition's attempt is
/// refused on the server and its answer lost; its next attempt must not
/// take over the held grant, which carries the same token. The second
/// acquisition comes through another client (one `lock_core::Owner` used
/// with two lockers) or through the same client (the retry carries its own
/// attempt's id, which the held grant does not). In both modes of the
/// plain format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_attempt_takes_over_no_grant_of_the_same_owner() {
    for query in ["", "&fair=true"] {
        for same_client in [false, true] {
            let case = if same_client {
                "same client"
            } else {
                "other client"
            };
            let srv = common::server();
            let proxy = Proxy::start(srv.addr()).unwrap();
            let second = common::backend(&format!(
                "redis://127.0.0.1:{}/0?op_timeout=300ms{query}",
                proxy.port()
            ))
            .await;
            let first = if same_client {
                second.clone()
            } else {
                common::backend(&format!("{}?op_timeout=300ms{query}", srv.url())).await
            };
            let n = name("contract/shared-owner");
            let request = AcquireRequest::new(
                n.clone(),
                OwnerToken::random(),
                Duration::from_secs(30),
                Duration::ZERO,
            )
            .unwrap();
            let held = first
                .try_acquire(&request)
                .await
                .unwrap()
                .expect("the first acquisition takes it");
            // Opens the second client's connection while the network is fast.
            assert!(second.inspect(&n).await.unwrap().is_some());
            proxy.set_mode(Mode::Delay(Duration::from_millis(500)));
            let lost_answer = second.try_acquire(&request).await;
            assert!(
                lost_answer.as_ref().is_err_and(|e| e.is_retryable()),
                "{query} {case}: {lost_answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(1200)).await;
            proxy.set_mode(Mode::Pass);
            let again = second.try_acquire(&request).await.unwrap();
            assert!(
                again.is_none(),
                "{query} {case}: the second acquisition took over the held grant: {again:?}"
            );
            first
                .renew(&held)
                .await
                .unwrap_or_else(|e| panic!("{query} {case}: the first holding: {e}"));
            first.release(&held).await.unwrap();
        }
    }
}

/// Scripts the server has run (`EVAL`/`EVALSHA` calls).
async fn scripts_run(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_eval"))
        .filter_map(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("calls=")))
        .map(|v| v.parse::<u64>().unwrap())
        .sum()
}

/// One owner waiting through a second client while the first holds: the
/// wait is cancelled while its retry is on the way (the server ran it, the
/// answer is still on the slow link). The undo the cancelled retry sends
/// behind it must free only what that retry won, never the first client's
/// live grant under the same owner token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_retry_frees_no_other_clients_grant_of_the_same_owner() {
    for query in ["", "?fair=true"] {
        let (srv, first, mut raw) = server_and_clients(query).await;
        let proxy = Proxy::start(srv.addr()).unwrap();
        let sep = if query.is_empty() { "?" } else { "&" };
        let second = common::backend(&format!(
            "redis://127.0.0.1:{}/0{query}{sep}op_timeout=5s",
            proxy.port()
        ))
        .await;
        let n = name("contract/cancelled-retry");
        let owner = OwnerToken::random();
        let request = |wait| {
            let mut r =
                AcquireRequest::new(n.clone(), owner, Duration::from_secs(30), wait).unwrap();
            // Retries follow one another closely.
            r.retry = Some(lock_core::wait::Backoff {
                initial: Duration::from_millis(5),
                max: Duration::from_millis(5),
            });
            r
        };
        let held = first
            .try_acquire(&request(Duration::ZERO))
            .await
            .unwrap()
            .expect("the first client takes it");
        // The second client's connection and scripts are ready.
        assert!(second
            .try_acquire(&request(Duration::ZERO))
            .await
            .unwrap()
            .is_none());
        proxy.set_mode(Mode::Delay(Duration::from_millis(300)));
        let before = scripts_run(&mut raw).await;
        let waiting = tokio::spawn({
            let (second, req) = (second.clone(), request(Duration::from_secs(30)));
            async move { second.acquire(&req).await }
        });
        // The first attempt, then a retry, ran on the server: the retry's
        // answer is still on its way when the wait is cancelled.
        let started = Instant::now();
        while scripts_run(&mut raw).await < before + 2 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{query}: no retry ran"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        waiting.abort();
        // The undo follows the retry on its connection, through the delay.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        proxy.set_mode(Mode::Pass);
        let holder: Option<String> = raw.get(n.as_str()).await.unwrap();
        assert!(
            holder.is_some(),
            "{query}: the cancelled retry's undo freed the first client's grant"
        );
        first
            .renew(&held)
            .await
            .unwrap_or_else(|e| panic!("{query}: the first holding: {e}"));
        first.release(&held).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_retry_takes_back_its_unanswered_grant_without_a_second_hold() {
    let (srv, ours, mut raw) = server_and_clients("?format=redisson").await;
    let n = name("contract/redisson-orphan");
    let ttl = Duration::from_secs(30);
    let request =
        AcquireRequest::new(n.clone(), OwnerToken::random(), ttl, Duration::from_secs(5)).unwrap();
    // The first attempt reaches the server while it is paused, and its
    // caller gives up before any reply: the grant lands with nobody told.
    srv.pause().unwrap();
    let gave_up =
        tokio::time::timeout(Duration::from_millis(300), ours.try_acquire(&request)).await;
    assert!(gave_up.is_err(), "a paused server answered: {gave_up:?}");
    srv.resume().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !raw.exists::<_, bool>(n.as_str()).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the unanswered attempt never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The retry of the same request finds that grant at once, with one hold.
    let started = Instant::now();
    let lease = ours
        .acquire(&request)
        .await
        .unwrap()
        .expect("the retry takes back its own grant");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let holds: Vec<(String, String)> = raw.hgetall(n.as_str()).await.unwrap();
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert_eq!(
        holds[0].1, "1",
        "the retry counted a second hold: {holds:?}"
    );
    // So one release frees it.
    ours.release(&lease).await.unwrap();
    assert!(
        ours.inspect(&n).await.unwrap().is_none(),
        "still held after the only release"
    );
    // A second acquire of the same owner without an unanswered attempt
    // before it still re-enters, as Redisson does.
    let first = ours.try_acquire(&request).await.unwrap().expect("free");
    let again = ours.try_acquire(&request).await.unwrap().expect("re-enter");
    assert_eq!(again.fence(), first.fence());
    let holds: Vec<(String, String)> = raw.hgetall(n.as_str()).await.unwrap();
    assert_eq!(holds[0].1, "2", "{holds:?}");
    ours.release(&again).await.unwrap();
    ours.release(&first).await.unwrap();
}

/// One owner holds a Redisson-format lock (one acquisition), and a second
/// acquisition of the same owner on the same client sends an attempt that
/// never reaches the server. Its next attempt is no take-back of the first
/// acquisition's hold: it adds its own, so that the first's release leaves
/// the lock held and nobody else gets it while the second holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_retry_after_an_attempt_that_never_ran_adds_its_own_hold() {
    let srv = common::server();
    let proxy = Proxy::start(srv.addr()).unwrap();
    let ours = common::backend(&format!(
        "redis://127.0.0.1:{}/0?format=redisson&op_timeout=300ms",
        proxy.port()
    ))
    .await;
    let other = common::backend(&format!("{}?format=redisson", srv.url())).await;
    let mut raw = common::raw(&srv.url()).await;
    let n = name("contract/redisson-never-ran");
    let request = req(&n, Duration::from_secs(30));
    let first = ours.try_acquire(&request).await.unwrap().expect("free");
    // The second acquisition's attempt is lost on the way: it never runs.
    proxy.set_mode(Mode::Blackhole);
    let lost = ours.try_acquire(&request).await;
    assert!(
        lost.as_ref().is_err_and(|e| e.is_retryable()),
        "an attempt on a cut link: {lost:?}"
    );
    proxy.set_mode(Mode::Pass);
    let holds: Vec<(String, String)> = raw.hgetall(n.as_str()).await.unwrap();
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert_eq!(holds[0].1, "1", "the lost attempt ran: {holds:?}");
    let second = ours
        .try_acquire(&request)
        .await
        .unwrap()
        .expect("the same owner re-enters");
    let holds: Vec<(String, String)> = raw.hgetall(n.as_str()).await.unwrap();
    assert_eq!(
        holds[0].1, "2",
        "the retry took the first acquisition's hold for its own: {holds:?}"
    );
    ours.release(&first).await.unwrap();
    assert!(
        other
            .try_acquire(&req(&n, Duration::from_secs(30)))
            .await
            .unwrap()
            .is_none(),
        "another owner got the lock while the second acquisition holds it"
    );
    ours.renew(&second).await.expect("the second holding");
    ours.release(&second).await.unwrap();
    assert!(ours.inspect(&n).await.unwrap().is_none(), "still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_fence_counter_never_hands_out_a_lower_token() {
    for query in FORMATS {
        let (_srv, ours, mut raw) = server_and_clients(query).await;
        let n = name("contract/evicted");
        let mut highest = 0;
        for _ in 0..3 {
            let lease = acquire_free(&ours, &n, Duration::from_secs(30)).await;
            assert!(lease.fence().get() > highest);
            highest = lease.fence().get();
            ours.release(&lease).await.unwrap();
        }
        // What an allkeys-* maxmemory policy does to an idle counter.
        let counter = ours.keys(&n).unwrap().fence;
        let removed: i64 = raw.del(&counter).await.unwrap();
        assert_eq!(removed, 1, "{query}: {counter}");
        let after = acquire_free(&ours, &n, Duration::from_secs(30)).await;
        assert!(
            after.fence().get() > highest,
            "{query}: token {} after the counter was evicted, {highest} before",
            after.fence()
        );
        assert!(after.fence().get() < 1 << 53, "exact in a double");
        ours.release(&after).await.unwrap();
    }
}

/// Redisson format: the holds of one owner share the hash's expiry, while
/// each lease has its own deadline. A hold taken, renewed or released with
/// a short TTL must leave the expiry covering a longer-lived hold of the
/// same owner: cut short, the key expires while that lease still believes
/// it holds, and another client takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_hold_never_shortens_another_holds_expiry() {
    let (_srv, ours, mut raw) = server_and_clients("?format=redisson").await;
    let n = name("contract/redisson-expiry");
    let owner = OwnerToken::random();
    let long = Duration::from_secs(60);
    let short = Duration::from_secs(2);
    let at = |ttl| AcquireRequest::new(n.clone(), owner, ttl, Duration::ZERO).unwrap();
    let first = ours.try_acquire(&at(long)).await.unwrap().expect("free");
    let second = ours
        .try_acquire(&at(short))
        .await
        .unwrap()
        .expect("re-enter");
    let covers_the_long_lease = |pttl: i64| pttl > 50_000;
    let pttl: i64 = raw.pttl(n.as_str()).await.unwrap();
    assert!(
        covers_the_long_lease(pttl),
        "re-entry with a short TTL: PTTL {pttl} ms"
    );
    let renewed = ours.renew(&second).await.unwrap();
    let pttl: i64 = raw.pttl(n.as_str()).await.unwrap();
    assert!(
        covers_the_long_lease(pttl),
        "renewal of the short hold: PTTL {pttl} ms"
    );
    ours.release(&renewed).await.unwrap();
    let pttl: i64 = raw.pttl(n.as_str()).await.unwrap();
    assert!(
        covers_the_long_lease(pttl),
        "release of the short hold: PTTL {pttl} ms"
    );
    // Past the short TTL, the long hold is still the holder.
    tokio::time::sleep(short + Duration::from_millis(500)).await;
    let other = ours.try_acquire(&req(&n, long)).await.unwrap();
    assert!(
        other.is_none(),
        "another client took the lock of a live lease"
    );
    // And renewing the long lease extends the expiry as before.
    let first = ours.renew(&first).await.unwrap();
    ours.release(&first).await.unwrap();
    assert!(ours.inspect(&n).await.unwrap().is_none());
}

/// A wait that ends while its attempt is unanswered (the attempt's script
/// ran on the server, its reply came after the op_timeout) gives back what
/// the attempt took: the lock is free again long before its TTL, where it
/// was held by nobody for the whole TTL. In both modes of the plain format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_ends_on_an_unanswered_attempt_gives_back_its_grant() {
    for mode in ["", "&fair=true"] {
        let srv = common::server();
        let proxy = Proxy::start(srv.addr()).unwrap();
        let ours = common::backend(&format!(
            "redis://127.0.0.1:{}/0?op_timeout=1500ms{mode}",
            proxy.port()
        ))
        .await;
        let direct = common::backend(&format!("{}?op_timeout=2s{mode}", srv.url())).await;
        let n = name(&format!("contract/unanswered{mode}"));
        let ttl = Duration::from_secs(30);
        let held = acquire_free(&direct, &n, ttl).await;
        // Opens the connection while the network is fast.
        assert!(ours.inspect(&n).await.unwrap().is_some());
        // Each way 1 s: the attempt runs on the server at about 1 s, after
        // the release below, and its reply would come at 2 s, past the
        // 1.5 s op_timeout and the 1 s wait.
        proxy.set_mode(Mode::Delay(Duration::from_secs(1)));
        let request =
            AcquireRequest::new(n.clone(), OwnerToken::random(), ttl, Duration::from_secs(1))
                .unwrap();
        let wait = tokio::spawn({
            let (ours, request) = (ours.clone(), request.clone());
            async move { ours.acquire(&request).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        direct.release(&held).await.unwrap();
        let r = wait.await.unwrap();
        assert!(!matches!(r, Ok(Some(_))), "{mode}: answered in time: {r:?}");
        let orphan = direct.inspect(&n).await.unwrap();
        assert_eq!(
            orphan.map(|h| h.owner),
            Some(request.owner.to_string()),
            "{mode}: the scenario needs the unanswered attempt to hold the lock"
        );
        proxy.set_mode(Mode::Pass);
        let given_back = common::eventually(Duration::from_secs(10), || async {
            direct.inspect(&n).await.unwrap().is_none()
        })
        .await;
        assert!(given_back, "{mode}: still held by nobody, its TTL {ttl:?}");
        let next = acquire_free(&direct, &n, ttl).await;
        direct.release(&next).await.unwrap();
    }
}

/// A cancelled retry's undo that reaches the server late (its connection
/// stalled past the undo's own timeout) never releases the lock the same
/// owner's next acquisition holds: that acquisition does not reuse the
/// cancelled retry's attempt id, which the undo names. (It did while the
/// unanswered mark stayed behind the undo.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_undo_of_a_cancelled_retry_spares_the_same_owners_next_lock() {
    let srv = common::server();
    let proxy = Proxy::start(srv.addr()).unwrap();
    let ours = common::backend(&format!(
        "redis://127.0.0.1:{}/0?op_timeout=1s",
        proxy.port()
    ))
    .await;
    let direct = common::backend(&srv.url()).await;
    let mut raw = common::raw(&srv.url()).await;
    let n = name("contract/late-undo");
    let owner = OwnerToken::random();
    let scripts = |stats: String| -> u64 {
        stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    // Held for 1 s and never renewed: the waiter retries when it expires.
    let held = acquire_free(&direct, &n, Duration::from_secs(1)).await;
    let started = Instant::now();
    let waiting = AcquireRequest::new(
        n.clone(),
        owner,
        Duration::from_secs(30),
        Duration::from_secs(30),
    )
    .unwrap();
    let wait = tokio::spawn({
        let (ours, waiting) = (ours.clone(), waiting.clone());
        async move { ours.acquire(&waiting).await }
    });
    // The first attempt is refused; then the waiter's connections stall.
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.stall_open_connections();
    let before: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await
        .unwrap();
    // The waiter's next retry goes out on the stalled connection; the
    // wait is cancelled while it is on its way, and the undo queues
    // behind it, to time out after 1 s.
    tokio::time::sleep_until(started + Duration::from_millis(700)).await;
    assert!(!wait.is_finished(), "the wait ended: {wait:?}");
    wait.abort();
    drop(held);
    // After the undo's timeout, before the wait's own give-back (two
    // op_timeouts after the retry was sent), once the lock has expired.
    tokio::time::sleep_until(started + Duration::from_millis(2000)).await;
    assert!(direct.inspect(&n).await.unwrap().is_none(), "expired");
    // The same owner again, on a fresh connection.
    let again = AcquireRequest::new(
        n.clone(),
        owner,
        Duration::from_secs(30),
        Duration::from_secs(3),
    )
    .unwrap();
    let lease = ours
        .acquire(&again)
        .await
        .unwrap()
        .expect("the lock is free");
    // The retry and its undo reach the server now.
    proxy.resume_stalled();
    let delivered = common::eventually(Duration::from_secs(5), || {
        let mut raw = raw.clone();
        let before = scripts(before.clone());
        async move {
            let now: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut raw)
                .await
                .unwrap();
            scripts(now) >= before + 3
        }
    })
    .await;
    assert!(
        delivered,
        "the scenario needs the stalled retry and its undo to reach the server late"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let holder = direct.inspect(&n).await.unwrap();
    assert_eq!(
        holder.as_ref().and_then(|h| h.fence),
        Some(lease.fence()),
        "the late undo released the lock the same owner holds: {holder:?}"
    );
    ours.release(&lease).await.unwrap();
}
