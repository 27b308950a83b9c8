//! Sessions: one lease per client and TTL, renewal cost flat in the number
//! of held locks, loss when etcd revokes the lease, fenced writes,
//! connection and credential errors.

mod common;

use std::time::Duration;

use backend_etcd::{fenced_put, EtcdBackend};
use common::{
    client, etcdctl_out, hold, hold_unrenewed, keepalives, lock_and_unlock, name, request, server,
};
use lock_core::{LockBackend, LockError};
use tokio::time::{sleep, timeout, Instant};

/// 1,000 locks on one client ride on one lease: as many keepalives per
/// second as a client holding one lock, and `etcdctl lease list` shows one
/// lease per client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_locks_share_one_session_and_its_keepalives() {
    let (_server, endpoints, url) = server();
    let ttl = Duration::from_secs(3);
    let (many_backend, many) = client(&url).await;
    let (one_backend, one) = client(&url).await;
    let base = name("thousand");

    let single = hold(&one, &format!("{base}/single"), ttl).await;
    let mut guards = Vec::new();
    for chunk in (0..1000).collect::<Vec<_>>().chunks(100) {
        let batch = chunk.iter().map(|i| {
            let (many, base) = (many.clone(), base.clone());
            async move { hold(&many, &format!("{base}/{i}"), ttl).await }
        });
        guards.extend(futures::future::join_all(batch).await);
    }
    let sessions = many_backend.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].held, 1000);
    assert_eq!(sessions[0].ttl, ttl);
    let leases = etcdctl_out(&endpoints, &["lease", "list"]).await;
    assert!(leases.starts_with("found 2 leases"), "{leases}");

    // Let every watchdog renew a few times, and count keepalives meanwhile.
    let (many_before, one_before) = (keepalives(&many_backend), keepalives(&one_backend));
    let window = ttl * 3;
    sleep(window).await;
    let many_sent = keepalives(&many_backend) - many_before;
    let one_sent = keepalives(&one_backend) - one_before;
    println!(
        "keepalives in {window:?}: 1,000 locks {many_sent} ({:.2}/s), 1 lock {one_sent} ({:.2}/s)",
        many_sent as f64 / window.as_secs_f64(),
        one_sent as f64 / window.as_secs_f64()
    );
    // A keepalive every TTL/3: about 9 in three TTLs, a few more if
    // watchdogs nudged one early. Never one per lock.
    assert!(
        (6..=20).contains(&many_sent),
        "1,000 locks: {many_sent} keepalives"
    );
    assert!(
        (6..=20).contains(&one_sent),
        "1 lock: {one_sent} keepalives"
    );
    assert!(many_sent <= one_sent * 2 + 2, "{many_sent} vs {one_sent}");
    assert!(guards.iter().all(|g| g.is_held()), "a lock was lost");
    assert!(single.is_held());

    for g in guards {
        g.release().await.unwrap();
    }
    single.release().await.unwrap();
    assert_eq!(many_backend.sessions()[0].held, 0);
}

/// A lock is held on the TTL etcd grants, in whole seconds, and each TTL
/// has its own session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_are_granted_in_whole_seconds_one_session_each() {
    let (_server, _endpoints, url) = server();
    let (backend, locker) = client(&url).await;
    let base = name("ttls");
    let short = hold(&locker, &format!("{base}/a"), Duration::from_millis(300)).await;
    assert_eq!(
        short.lease().ttl(),
        Duration::from_secs(2),
        "etcd's minimum"
    );
    let odd = hold(&locker, &format!("{base}/b"), Duration::from_millis(2500)).await;
    assert_eq!(odd.lease().ttl(), Duration::from_secs(3));
    let same = hold(&locker, &format!("{base}/c"), Duration::from_secs(3)).await;
    let mut ttls: Vec<_> = backend.sessions().iter().map(|s| s.ttl).collect();
    ttls.sort();
    assert_eq!(ttls, [Duration::from_secs(2), Duration::from_secs(3)]);
    let key = |g: &lock_core::LockGuard| {
        g.lease()
            .backend_key()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(key(&odd), key(&same), "one lease for one TTL");
    assert_ne!(key(&short), key(&odd));
    for g in [short, odd, same] {
        g.release().await.unwrap();
    }
}

/// Revoking the session lease behind the client's back deletes every key
/// on it: every lock on it reports lost, and later locks use a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_loses_all_its_locks_and_a_new_one_starts() {
    let (_server, endpoints, url) = server();
    let (backend, locker) = client(&url).await;
    let base = name("revoked");
    let ttl = Duration::from_secs(3);
    let guards = vec![
        hold(&locker, &format!("{base}/1"), ttl).await,
        hold(&locker, &format!("{base}/2"), ttl).await,
        hold(&locker, &format!("{base}/3"), ttl).await,
    ];
    let lease = backend.sessions()[0].lease_id;
    etcdctl_out(&endpoints, &["lease", "revoke", &format!("{lease:x}")]).await;
    let revoked_at = Instant::now();
    for g in &guards {
        timeout(ttl, g.lost())
            .await
            .expect("lost() after the revoke");
        assert!(!g.is_held());
    }
    println!("lost {:?} after the revoke", revoked_at.elapsed());
    for g in guards {
        assert!(g.release().await.is_err_and(|e| e.is_lost()));
    }
    let again = hold(&locker, &format!("{base}/1"), ttl).await;
    let sessions = backend.sessions();
    assert_eq!(sessions.len(), 1);
    assert_ne!(sessions[0].lease_id, lease, "a new session");
    again.release().await.unwrap();
}

/// `renew` of a raw lease reports a newer keepalive and keeps the lock
/// past its first TTL; never touching the lock lets the session delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_reports_the_session_keepalive() {
    let (_server, _endpoints, url) = server();
    let (backend, _locker) = client(&url).await;
    let lock = name("renew");
    let req = request(&lock, Duration::from_secs(2));
    let lease = backend.try_acquire(&req).await.unwrap().expect("free");
    let before = keepalives(&backend);
    let renewed = backend.renew(&lease).await.unwrap();
    assert!(renewed.sent_at() > lease.sent_at(), "renew moved forward");
    assert_eq!(renewed.fence(), lease.fence());
    assert!(keepalives(&backend) - before <= 1, "one keepalive at most");
    // Immediately again: waits for (at most) one more keepalive.
    let again = backend.renew(&renewed).await.unwrap();
    assert!(again.sent_at() > renewed.sent_at());
    backend.release(&again).await.unwrap();
    assert!(backend.renew(&again).await.is_err_and(|e| e.is_lost()));
}

/// `fenced_put` writes only while the lease's claim exists; a holder that
/// lost the lock cannot write any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_put_refuses_a_stale_holder() {
    let (_server, endpoints, url) = server();
    let (a_backend, a) = client(&url).await;
    let (b_backend, b) = client(&url).await;
    let lock = name("fenced");
    let data = format!("{lock}-data");
    let ttl = Duration::from_secs(2);
    let first = hold_unrenewed(&a, &lock, ttl).await;
    let stale = first.lease();
    fenced_put(&a_backend, &stale, data.clone(), "from a")
        .await
        .unwrap();
    // a stops renewing; the session deletes its claim at the TTL, b takes over.
    let second = b
        .lock(&lock)
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(second.fence() > first.fence());
    fenced_put(&b_backend, &second.lease(), data.clone(), "from b")
        .await
        .unwrap();
    let r = fenced_put(&a_backend, &stale, data.clone(), "stale a").await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
    let value = etcdctl_out(&endpoints, &["get", "--print-value-only", &data]).await;
    assert_eq!(value.trim(), "from b");
    let second_lease = second.lease();
    second.release().await.unwrap();
    let r = fenced_put(&b_backend, &second_lease, data, "after release").await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
    drop(first);
}

/// The session outlives its locks while the client lives; dropping the
/// client revokes it, so its keys go at once instead of after the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_revokes_its_session() {
    let (_server, endpoints, url) = server();
    let (backend, locker) = client(&url).await;
    let g = hold(&locker, &name("drop"), Duration::from_secs(30)).await;
    drop(g);
    sleep(Duration::from_millis(200)).await;
    assert_eq!(backend.sessions().len(), 1, "the session outlives one lock");
    drop(locker);
    drop(backend);
    let mut leases = String::new();
    for _ in 0..50 {
        leases = etcdctl_out(&endpoints, &["lease", "list"]).await;
        if leases.starts_with("found 0 leases") {
            return;
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("the session lease was not revoked: {leases}");
}

/// Nothing listens: the error names the endpoint, is retryable, and comes
/// within the connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_a_clear_error_in_time() {
    let port = testkit::free_port();
    let started = Instant::now();
    let r = EtcdBackend::connect(&format!("etcd://127.0.0.1:{port}?connect_timeout=1s")).await;
    let took = started.elapsed();
    let e = r.expect_err("nothing listens");
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(took < Duration::from_secs(3), "took {took:?}");

    // A listener that accepts and never answers: the probe times out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let started = Instant::now();
    let r = EtcdBackend::connect(&format!("etcd://{addr}?connect_timeout=1s")).await;
    let e = r.expect_err("nobody answers");
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}

/// user:password auth: the right password works (also for a user limited to
/// a prefix), a wrong one is a permanent error that never shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_password_auth() {
    let (_server, endpoints, url) = server();
    let host = url.trim_start_matches("etcd://");
    etcdctl_out(
        &endpoints,
        &["user", "add", "root:r00tpw", "--interactive=false"],
    )
    .await;
    etcdctl_out(&endpoints, &["user", "grant-role", "root", "root"]).await;
    etcdctl_out(
        &endpoints,
        &["user", "add", "app:s3cr%t@pw", "--interactive=false"],
    )
    .await;
    etcdctl_out(&endpoints, &["role", "add", "locker"]).await;
    etcdctl_out(
        &endpoints,
        &[
            "role",
            "grant-permission",
            "locker",
            "readwrite",
            "--prefix=true",
            "applocks/",
        ],
    )
    .await;
    etcdctl_out(&endpoints, &["user", "grant-role", "app", "locker"]).await;
    etcdctl_out(&endpoints, &["auth", "enable"]).await;

    let (_root, root) = client(&format!("etcd://root:r00tpw@{host}")).await;
    lock_and_unlock(&root, name("auth")).await;

    // '%' and '@' in the password are percent-encoded in the URL.
    let app_url = format!("etcd://app:s3cr%25t%40pw@{host}?prefix=applocks/");
    let (_app, app) = client(&app_url).await;
    let g = app.lock(name("auth")).acquire().await.unwrap();
    assert!(g.lease().backend_key().unwrap().starts_with("applocks/"));
    g.release().await.unwrap();
    // Outside its prefix the user has no permission: permanent.
    let (_app2, outside) = client(&format!("etcd://app:s3cr%25t%40pw@{host}")).await;
    let e = outside
        .lock(name("auth"))
        .acquire()
        .await
        .expect_err("no permission");
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("ermission"), "{e}");

    let e = EtcdBackend::connect(&format!("etcd://app:wrong-pw@{host}"))
        .await
        .expect_err("wrong password");
    let msg = e.to_string();
    assert!(!e.is_retryable(), "{msg}");
    assert!(msg.contains("authentication failed"), "{msg}");
    assert!(
        !msg.contains("wrong-pw") && !format!("{e:?}").contains("wrong-pw"),
        "{msg}"
    );
    let dbg = format!("{:?}", EtcdBackend::connect(&app_url).await.unwrap());
    assert!(!dbg.contains("s3cr"), "{dbg}");
}

/// etcd with JWT tokens refuses a token older than its last user or role
/// change ("revision of auth store is old", applying nothing), which
/// etcd-client does not renew by itself: the client logs in again and
/// goes on. The holder renews and releases, and the client takes locks,
/// after a role change that does not concern it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_change_after_login_does_not_lock_a_jwt_client_out() {
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = (keys.path().join("jwt.key"), keys.path().join("jwt.pub"));
    for args in [
        vec!["genrsa", "-out", private.to_str().unwrap(), "2048"],
        vec![
            "rsa",
            "-in",
            private.to_str().unwrap(),
            "-pubout",
            "-out",
            public.to_str().unwrap(),
        ],
    ] {
        let out = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .expect("openssl runs (scripts/install-deps.sh installs it)");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    }
    let jwt = format!(
        "jwt,pub-key={},priv-key={},sign-method=RS256,ttl=10m",
        public.display(),
        private.display()
    );
    let server = tokio::task::spawn_blocking(move || {
        testkit::EtcdServer::start_with_args(&["--auth-token".into(), jwt])
    })
    .await
    .unwrap()
    .expect("etcd with JWT tokens starts");
    let endpoints = vec![server.endpoint()];
    let host = common::url_of(&endpoints);
    let host = host.trim_start_matches("etcd://");
    for args in [
        &["user", "add", "root:r00tpw", "--interactive=false"][..],
        &["user", "grant-role", "root", "root"],
        &["auth", "enable"],
    ] {
        etcdctl_out(&endpoints, args).await;
    }
    let (_backend, locker) = client(&format!("etcd://root:r00tpw@{host}")).await;
    let guard = locker
        .lock(name("jwt-auth-change"))
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let root = "--user=root:r00tpw";
    etcdctl_out(&endpoints, &[root, "role", "add", "unrelated"]).await;
    guard
        .renew()
        .await
        .expect("a renewal after an unrelated auth change");
    guard
        .release()
        .await
        .expect("a release after an unrelated auth change");
    etcdctl_out(&endpoints, &[root, "role", "add", "unrelated-too"]).await;
    locker
        .lock(name("jwt-auth-change-2"))
        .try_acquire()
        .await
        .expect("a lock after an unrelated auth change")
        .expect("free")
        .release()
        .await
        .unwrap();
}

/// A session with no locks and no acquisition for a while (30 s, or two
/// TTLs if longer) closes and revokes its lease: sessions are per TTL, and
/// TTLs used once must not keep keepalive streams forever. The next lock
/// starts a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_closes_and_the_next_lock_starts_a_new_one() {
    let (_server, endpoints, url) = server();
    let (backend, locker) = client(&url).await;
    let lock = name("idle");
    let ttl = Duration::from_secs(2);
    hold(&locker, &lock, ttl).await.release().await.unwrap();
    let first = backend.sessions()[0].lease_id;
    sleep(Duration::from_secs(20)).await;
    assert_eq!(backend.sessions().len(), 1, "closed too early");
    sleep(Duration::from_secs(11)).await;
    assert!(backend.sessions().is_empty(), "{:?}", backend.sessions());
    let leases = etcdctl_out(&endpoints, &["lease", "list"]).await;
    assert!(leases.starts_with("found 0 leases"), "{leases}");
    let g = hold(&locker, &lock, ttl).await;
    assert_ne!(backend.sessions()[0].lease_id, first);
    g.release().await.unwrap();
}

/// A forged lease (another owner, the real key and fence) presented to the
/// holder's own client is refused and leaves the real holding intact, on
/// the server and in the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_lease_on_the_holders_own_client_changes_nothing() {
    let (_server, _endpoints, url) = server();
    let (backend, _locker) = client(&url).await;
    let req = request(&name("forged"), Duration::from_secs(5));
    let real = backend.try_acquire(&req).await.unwrap().expect("free");
    let forged = lock_core::Lease::new(
        real.name().clone(),
        lock_core::OwnerToken::random(),
        real.fence(),
        real.ttl(),
        Instant::now(),
        real.policy(),
    )
    .with_backend_key(real.backend_key().unwrap());
    assert!(backend.release(&forged).await.is_err_and(|e| e.is_lost()));
    assert!(backend.renew(&forged).await.is_err_and(|e| e.is_lost()));
    assert_eq!(backend.sessions()[0].held, 1);
    let renewed = backend.renew(&real).await.expect("the real holder renews");
    let info = backend.inspect(real.name()).await.unwrap().expect("held");
    assert_eq!(info.fence, Some(real.fence()));
    backend.release(&renewed).await.unwrap();
    assert_eq!(backend.sessions()[0].held, 0);
}

/// A holder whose claim was deleted by someone else (force release) while
/// B took the lock, worked and released: A's release and renew say Lost,
/// since its critical section was not exclusive. A holder that stopped
/// renewing, whose session reaped the claim, likewise. Releasing one's
/// own release again stays `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_someone_else_held_says_lost() {
    let (_server, _endpoints, url) = server();
    let (a, _) = client(&url).await;
    let (b, _) = client(&url).await;
    let lock = name("overlap");
    let ttl = Duration::from_secs(10);
    let held_a = a
        .try_acquire(&request(&lock, ttl))
        .await
        .unwrap()
        .expect("A");
    assert!(b.force_release(held_a.name()).await.unwrap());
    let held_b = b
        .try_acquire(&request(&lock, ttl))
        .await
        .unwrap()
        .expect("B");
    b.release(&held_b).await.unwrap();
    let r = a.renew(&held_a).await;
    assert!(r.as_ref().is_err_and(|e| e.is_lost()), "renew: {r:?}");
    let r = a.release(&held_a).await;
    assert!(r.as_ref().is_err_and(|e| e.is_lost()), "release: {r:?}");
    b.release(&held_b).await.expect("B's second release");

    // A stops renewing: its session deletes the claim at the TTL; B holds
    // and releases in between.
    let short = Duration::from_secs(2);
    let held_a = a
        .try_acquire(&request(&lock, short))
        .await
        .unwrap()
        .expect("A again");
    let started = Instant::now();
    let held_b = loop {
        if let Some(l) = b.try_acquire(&request(&lock, ttl)).await.unwrap() {
            break l;
        }
        assert!(started.elapsed() < short * 4, "A's claim was never reaped");
        sleep(Duration::from_millis(100)).await;
    };
    b.release(&held_b).await.unwrap();
    let r = a.release(&held_a).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "release after reap: {r:?}"
    );
}

/// A lease revoked behind the client's back: every lease of that session
/// is marked revoked within a fraction of a keepalive interval (TTL/3 =
/// 10 s here), from the watch on the session's own key, not at the next
/// keepalive or renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_lease_revokes_its_leases_at_once() {
    let (_server, endpoints, url) = server();
    let (backend, _) = client(&url).await;
    let base = name("pushed");
    let ttl = Duration::from_secs(30);
    let mut leases = Vec::new();
    for i in 0..3 {
        let l = backend
            .try_acquire(&request(&format!("{base}/{i}"), ttl))
            .await
            .unwrap()
            .expect("free");
        leases.push(l);
    }
    assert!(leases.iter().all(|l| l.revocation().is_some()));
    // The sentinel key is in place once the watch is up; give it a moment
    // on a busy machine.
    sleep(Duration::from_millis(500)).await;
    assert!(leases.iter().all(|l| !l.is_revoked()));
    let id = backend.sessions()[0].lease_id;
    let mut raw = etcd_client::Client::connect(&endpoints, None)
        .await
        .expect("etcd client");
    raw.lease_revoke(id).await.expect("revoke");
    let revoked_at = Instant::now();
    timeout(
        Duration::from_secs(3),
        leases[0].revocation().unwrap().cancelled(),
    )
    .await
    .expect("the lease's revocation fired well before the next keepalive");
    println!("revoked {:?} after the revoke", revoked_at.elapsed());
    assert!(leases.iter().all(|l| l.is_revoked()));
    let r = backend.renew(&leases[1]).await;
    assert!(r.as_ref().is_err_and(|e| e.is_lost()), "{r:?}");
}

/// A session that ends on the client's side (the client is dropped)
/// revokes its leases' tokens at once; a lease of another session is not
/// touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_session_revokes_its_leases() {
    let (_server, _endpoints, url) = server();
    let (gone, _) = client(&url).await;
    let (stays, _) = client(&url).await;
    let base = name("closed");
    let ttl = Duration::from_secs(30);
    let mine = gone
        .try_acquire(&request(&format!("{base}/a"), ttl))
        .await
        .unwrap()
        .unwrap();
    let other = stays
        .try_acquire(&request(&format!("{base}/b"), ttl))
        .await
        .unwrap()
        .unwrap();
    assert!(!mine.is_revoked());
    drop(gone);
    assert!(mine.is_revoked(), "dropping the client ends its session");
    sleep(Duration::from_millis(300)).await;
    assert!(!other.is_revoked(), "another client's lease was revoked");
    stays
        .renew(&other)
        .await
        .expect("the other client still holds");
    stays.release(&other).await.unwrap();
}
