//! The queue: FIFO over many waiters, a cancelled waiter in the middle,
//! a waiter behind a holder that stops renewing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    acquire_waiting, client, handled, hold_unrenewed, name, server, settled_reads, wait_claims,
};
use lock_core::LockBackend;
use tokio::time::{sleep, timeout, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_get_the_lock_in_queue_order() {
    let (_server, endpoints, url) = server();
    let lock = name("fifo8");
    let (_h, holder) = client(&url).await;
    let guard = holder.lock(&lock).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (_b, locker) = client(&url).await;
        let (name, order) = (lock.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = acquire_waiting(&locker, &name, Duration::from_secs(60))
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        wait_claims(&endpoints, &lock, i + 2).await;
    }
    guard.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(30), t).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

/// Waiter 3 watches waiter 2; when 2 gives up, 3 finds waiter 1 ahead and
/// watches it instead, and still comes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_in_the_middle_is_skipped() {
    let (_server, endpoints, url) = server();
    let lock = name("middle");
    let (_h, holder) = client(&url).await;
    let guard = holder.lock(&lock).acquire().await.unwrap();
    let waiter = |i: usize| {
        let (url, lock) = (url.clone(), lock.clone());
        async move {
            let (_b, locker) = client(&url).await;
            let g = acquire_waiting(&locker, &lock, Duration::from_secs(60))
                .await
                .unwrap();
            (i, Instant::now(), g)
        }
    };
    let w1 = tokio::spawn(waiter(1));
    wait_claims(&endpoints, &lock, 2).await;
    let w2 = tokio::spawn(waiter(2));
    wait_claims(&endpoints, &lock, 3).await;
    let w3 = tokio::spawn(waiter(3));
    wait_claims(&endpoints, &lock, 4).await;
    w2.abort();
    assert!(w2.await.unwrap_err().is_cancelled());
    wait_claims(&endpoints, &lock, 3).await; // its claim left the queue
    sleep(Duration::from_millis(300)).await;
    assert!(!w1.is_finished() && !w3.is_finished());

    guard.release().await.unwrap();
    let (_, t1, g1) = timeout(Duration::from_secs(5), w1).await.unwrap().unwrap();
    sleep(Duration::from_millis(300)).await;
    assert!(!w3.is_finished(), "waiter 3 passed waiter 1");
    let released = Instant::now();
    g1.release().await.unwrap();
    let (_, t3, g3) = timeout(Duration::from_secs(5), w3).await.unwrap().unwrap();
    assert!(t3 > t1 && t3 >= released);
    assert!(
        t3 - released < Duration::from_secs(2),
        "hand-off {:?}",
        t3 - released
    );
    g3.release().await.unwrap();
}

/// The holder stops renewing: its session deletes the claim at the TTL, and
/// the waiter watching that claim gets the lock right then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_an_abandoned_lock_gets_it_at_the_ttl() {
    let (_server, _endpoints, url) = server();
    let lock = name("abandoned");
    let ttl = Duration::from_secs(2);
    let (_h, holder) = client(&url).await;
    let (_w, waiter) = client(&url).await;
    let abandoned = hold_unrenewed(&holder, &lock, ttl).await;
    let granted = abandoned.lease().sent_at();
    let g = waiter
        .lock(&lock)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let after = granted.elapsed();
    assert!(after >= ttl.mul_f64(0.9), "taken over after {after:?}");
    assert!(
        after < ttl + Duration::from_millis(700),
        "taken over after {after:?}"
    );
    assert!(!abandoned.is_held());
    assert!(g.fence() > abandoned.fence());
    g.release().await.unwrap();
}

/// The waiter just behind the holder holds at the holder's delete without
/// a request of its own (it knows nothing can queue ahead of it, and its
/// watch covers its own claim too): etcd answers no read and no
/// transaction between the release (itself one transaction) and the
/// waiter holding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_waiter_holds_without_reading_the_queue_again() {
    let (server, endpoints, url) = server();
    let lock = name("no-read");
    let (_h, holder) = client(&url).await;
    let (_w, waiter) = client(&url).await;
    for _ in 0..3 {
        let guard = holder.lock(&lock).acquire().await.unwrap();
        let w = waiter.clone();
        let l = lock.clone();
        let task = tokio::spawn(async move {
            acquire_waiting(&w, &l, Duration::from_secs(30))
                .await
                .unwrap()
        });
        wait_claims(&endpoints, &lock, 2).await;
        let before = settled_reads(server.addr()).await;
        let deletes = handled(server.addr(), "DeleteRange").await;
        guard.release().await.unwrap();
        let g = timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        let after = handled(server.addr(), "Range").await + handled(server.addr(), "Txn").await;
        assert_eq!(
            handled(server.addr(), "DeleteRange").await - deletes,
            0,
            "the release is a compare-and-delete transaction, not a bare delete"
        );
        // The release's own transaction, and nothing of the waiter's.
        assert_eq!(after - before, 1, "requests between release and holding");
        g.release().await.unwrap();
    }
}

/// The waiter just behind the holder whose own claim is deleted by hand
/// must not hold at the holder's release: the waiter behind it, now first
/// in line, does, and the first one queues again behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_claim_was_deleted_does_not_hold() {
    let (_server, endpoints, url) = server();
    let lock = name("deleted-waiter");
    let (_h, holder) = client(&url).await;
    let guard = holder.lock(&lock).acquire().await.unwrap();
    let waiter = |i: usize| {
        let (url, lock) = (url.clone(), lock.clone());
        async move {
            let (b, locker) = client(&url).await;
            let g = acquire_waiting(&locker, &lock, Duration::from_secs(60))
                .await
                .unwrap();
            (i, Instant::now(), g, b)
        }
    };
    let w2 = tokio::spawn(waiter(2));
    wait_claims(&endpoints, &lock, 2).await;
    let w3 = tokio::spawn(waiter(3));
    wait_claims(&endpoints, &lock, 3).await;
    sleep(Duration::from_millis(300)).await;
    // Waiter 2's claim: the second lowest create revision.
    let mut raw = etcd_client::Client::connect(endpoints.clone(), None)
        .await
        .unwrap();
    let opts = etcd_client::GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let claims = raw.get(format!("{lock}/"), Some(opts)).await.unwrap();
    let second = claims.kvs()[1].key().to_vec();
    raw.delete(second, None).await.unwrap();
    sleep(Duration::from_millis(500)).await;
    assert!(!w2.is_finished() && !w3.is_finished());

    guard.release().await.unwrap();
    let (_, t3, g3, _b3) = timeout(Duration::from_secs(10), w3).await.unwrap().unwrap();
    sleep(Duration::from_millis(500)).await;
    assert!(!w2.is_finished(), "waiter 2 holds beside waiter 3");
    let released = Instant::now();
    let fence3 = g3.fence();
    g3.release().await.unwrap();
    let (_, t2, g2, _b2) = timeout(Duration::from_secs(10), w2).await.unwrap().unwrap();
    assert!(t2 > t3 && t2 >= released);
    assert!(g2.fence() > fence3, "waiter 2 queued again, behind 3");
    g2.release().await.unwrap();
}

/// Deeper in the queue too: the third in line also watches the claim two
/// ahead, and when that one goes (the second holds), it reads the queue
/// once while the second holds; so when the second releases, the third
/// holds without a request of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_third_in_line_holds_without_reading_the_queue_again() {
    let (server, endpoints, url) = server();
    let lock = name("no-read-3");
    let (_h, holder) = client(&url).await;
    let guard = holder.lock(&lock).acquire().await.unwrap();
    let spawn = |locker: lock_core::Locker| {
        let l = lock.clone();
        tokio::spawn(async move {
            acquire_waiting(&locker, &l, Duration::from_secs(30))
                .await
                .unwrap()
        })
    };
    let (_a, second) = client(&url).await;
    let (_b, third) = client(&url).await;
    let w2 = spawn(second);
    wait_claims(&endpoints, &lock, 2).await;
    let w3 = spawn(third);
    wait_claims(&endpoints, &lock, 3).await;
    guard.release().await.unwrap();
    let g2 = timeout(Duration::from_secs(10), w2).await.unwrap().unwrap();
    let before = settled_reads(server.addr()).await;
    g2.release().await.unwrap();
    let g3 = timeout(Duration::from_secs(10), w3).await.unwrap().unwrap();
    let after = handled(server.addr(), "Range").await + handled(server.addr(), "Txn").await;
    // The release's own transaction, and nothing of the third's.
    assert_eq!(after - before, 1, "requests between release and holding");
    g3.release().await.unwrap();
}

/// An operator clears a stuck lock with one range delete (`etcdctl del
/// --prefix NAME/`), which removes the holder's and the waiter's claims in
/// the same revision: the waiter must not take the holder's delete for its
/// turn (its own claim is gone too), so whatever it ends up holding is a
/// claim on the server, and another client is refused meanwhile. The
/// delete events of one revision come in key order, so the rounds go on
/// until the holder's key sorted first at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_delete_of_holder_and_waiter_gives_no_second_holder() {
    let (_server, endpoints, url) = server();
    let mut raw = etcd_client::Client::connect(endpoints.clone(), None)
        .await
        .unwrap();
    let mut holder_first = 0;
    for round in 0..16 {
        let lock = name("range-deleted");
        let (_h, holder) = client(&url).await;
        let guard = holder.lock(&lock).acquire().await.unwrap();
        let (_w, waiter) = client(&url).await;
        let waiting = {
            let lock = lock.clone();
            tokio::spawn(async move {
                acquire_waiting(&waiter, &lock, Duration::from_secs(20))
                    .await
                    .map(|g| (g, waiter))
            })
        };
        wait_claims(&endpoints, &lock, 2).await;
        sleep(Duration::from_millis(200)).await;
        let opts = etcd_client::GetOptions::new().with_prefix().with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        );
        let claims = raw.get(format!("{lock}/"), Some(opts)).await.unwrap();
        if claims.kvs()[0].key() < claims.kvs()[1].key() {
            holder_first += 1;
        }
        raw.delete(
            format!("{lock}/"),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
        let (g, _waiter) = timeout(Duration::from_secs(20), waiting)
            .await
            .expect("the waiter answers")
            .unwrap()
            .expect("the waiter queues again and holds");
        let (_o, other) = client(&url).await;
        let second = other.lock(&lock).try_acquire().await.unwrap();
        assert!(
            second.is_none(),
            "round {round}: a second holder beside the waiter, whose claim the range delete removed"
        );
        g.release().await.unwrap();
        drop(guard);
        if holder_first >= 2 {
            return;
        }
    }
    panic!("the holder's key never sorted first ({holder_first} rounds): the test proved nothing");
}

/// A claim of this client that no acquisition holds: an earlier attempt's
/// create that landed after its cleanup had looked (its answer never came,
/// and a member that held it applied it later). The client's next
/// acquisition of the name removes it and queues as usual, instead of
/// failing for good on "already exists"; and a cleanup that found nothing
/// looks again, so the stray claim does not block other clients while
/// this one holds other locks on the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_ours_that_nobody_holds_is_removed() {
    let (_server, endpoints, url) = server();
    let lock = name("stray");
    let (backend, locker) = client(&url).await;
    // The session all of this client's 30 s locks ride on.
    let keep = locker.lock(name("stray-keep")).acquire().await.unwrap();
    let lease_id = backend.sessions()[0].lease_id;
    let n = lock_core::LockName::new(lock.as_str()).unwrap();
    let stray = format!("{}{lease_id:x}", backend.key_prefix(&n));
    let mut raw = etcd_client::Client::connect(endpoints.clone(), None)
        .await
        .unwrap();
    raw.put(
        stray.clone(),
        "an attempt that gave up",
        Some(etcd_client::PutOptions::new().with_lease(lease_id)),
    )
    .await
    .unwrap();
    let g = timeout(Duration::from_secs(10), locker.lock(&lock).try_acquire())
        .await
        .expect("answers")
        .expect("a stray claim of ours does not fail the acquisition")
        .expect("nobody else holds it");
    assert_ne!(
        raw.get(stray.clone(), None).await.unwrap().kvs()[0].value(),
        b"an attempt that gave up",
        "the stray claim is still there"
    );
    g.release().await.unwrap();
    keep.release().await.unwrap();
}

/// A release dropped while its delete is on the wire (applied by etcd, the
/// answer not yet back) is finished by the client: its next acquisition of
/// the name gets it at once, as other clients do, where the session kept
/// the claim and the name's slot until the claim's lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_dropped_on_the_wire_frees_the_name_for_this_client_too() {
    let (server, _, url) = common::server();
    let proxy = testkit::Proxy::start(server.addr()).expect("proxy");
    let slow =
        backend_etcd::EtcdBackend::connect(&format!("etcd://{}?op_timeout=5s", proxy.addr()))
            .await
            .expect("connect");
    let other = backend_etcd::EtcdBackend::connect(&url)
        .await
        .expect("connect");
    let lock = lock_core::LockName::new(name("dropped-release")).unwrap();
    let req = || {
        lock_core::AcquireRequest::new(
            lock.clone(),
            lock_core::OwnerToken::random(),
            Duration::from_secs(10),
            Duration::ZERO,
        )
        .unwrap()
    };
    let lease = slow.try_acquire(&req()).await.unwrap().expect("free");
    // Each way 300 ms: etcd applies the delete at about 300 ms, the answer
    // would be back at about 600.
    proxy.set_mode(testkit::Mode::Delay(Duration::from_millis(300)));
    let r = timeout(Duration::from_millis(450), slow.release(&lease)).await;
    assert!(r.is_err(), "the release answered within 450 ms: {r:?}");
    proxy.set_mode(testkit::Mode::Pass);
    // Well within the 10 s TTL the session would have kept the slot for.
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let free = other.inspect(&lock).await.expect("inspect").is_none();
        match slow.try_acquire(&req()).await.expect("try_acquire") {
            Some(again) if free => {
                slow.release(&again).await.expect("release");
                break;
            }
            Some(again) => panic!("taken while another client saw it held: {again:?}"),
            None => {
                assert!(
                    Instant::now() < until,
                    "3 s after the dropped release this client still finds the name held \
                     (free for another client: {free})"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
