//! polylock and the real `etcdctl lock` (Go's `clientv3/concurrency`
//! Mutex) exclude each other on the same name, hand over both ways, and
//! share one FIFO queue.

mod common;

use std::time::Duration;

use common::{
    acquire_waiting, client, etcdctl, etcdctl_out, name, server, spawn_waiter, wait_claims,
    EtcdctlLock,
};
use tokio::time::{sleep, timeout, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_etcdctl_holds_polylock_waits_then_gets_it() {
    let (_server, endpoints, url) = server();
    let lock = name("etcdctl-first");
    let mut go = EtcdctlLock::spawn(&endpoints, &lock);
    assert!(
        go.held_within(Duration::from_secs(10)).await,
        "etcdctl got the lock"
    );
    let go_key = go.key.clone().unwrap();
    assert!(
        go_key.starts_with(&format!("{lock}/")),
        "etcdctl key {go_key}"
    );

    let (backend, locker) = client(&url).await;
    assert!(
        locker.lock(&lock).try_acquire().await.unwrap().is_none(),
        "polylock took a lock etcdctl holds"
    );
    let info = locker.inspect(&lock).await.unwrap().expect("held");
    assert_eq!(info.owner, go_key, "inspect shows etcdctl's claim");
    let go_fence = info.fence.expect("fence");
    assert!(info
        .expires_in
        .is_some_and(|d| d <= Duration::from_secs(60)));

    let waiter = tokio::spawn({
        let (locker, lock) = (locker.clone(), lock.clone());
        async move {
            let g = acquire_waiting(&locker, &lock, Duration::from_secs(30))
                .await
                .expect("polylock acquires after etcdctl");
            (Instant::now(), g)
        }
    });
    sleep(Duration::from_millis(700)).await;
    assert!(
        !waiter.is_finished(),
        "polylock got the lock while etcdctl held it"
    );
    let released = Instant::now();
    go.release().await;
    let (got, guard) = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("hand-over")
        .unwrap();
    assert!(got >= released);
    assert!(
        got - released < Duration::from_secs(2),
        "hand-over took {:?}",
        got - released
    );
    assert!(guard.fence() > go_fence, "fence did not increase");
    // polylock's own claim follows the same layout.
    let ours = guard.lease().backend_key().unwrap().to_string();
    let lease_hex = format!("{:x}", backend.sessions()[0].lease_id);
    assert_eq!(ours, format!("{lock}/{lease_hex}"));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_polylock_holds_etcdctl_waits_then_gets_it() {
    let (_server, endpoints, url) = server();
    let lock = name("polylock-first");
    let (_backend, locker) = client(&url).await;
    let guard = locker.lock(&lock).acquire().await.unwrap();
    let mut go = EtcdctlLock::spawn(&endpoints, &lock);
    assert!(
        !go.held_within(Duration::from_millis(1500)).await,
        "etcdctl got a lock polylock holds"
    );
    guard.release().await.unwrap();
    assert!(
        go.held_within(Duration::from_secs(3)).await,
        "etcdctl did not get the lock after polylock released"
    );
    // And back: polylock queues behind etcdctl again.
    assert!(locker.lock(&lock).try_acquire().await.unwrap().is_none());
    go.release().await;
    let again = acquire_waiting(&locker, &lock, Duration::from_secs(5))
        .await
        .unwrap();
    again.release().await.unwrap();

    // `etcdctl lock NAME -- cmd` runs cmd under the lock.
    let guard = locker.lock(&lock).acquire().await.unwrap();
    let fence = guard.fence().get();
    let run = tokio::spawn({
        let (endpoints, lock) = (endpoints.clone(), lock.clone());
        async move {
            etcdctl(&endpoints)
                .args(["lock", &lock, "--", "sh", "-c", "echo $ETCD_LOCK_REV"])
                .output()
                .await
                .unwrap()
        }
    });
    sleep(Duration::from_millis(800)).await;
    assert!(
        !run.is_finished(),
        "etcdctl ran its command under a held lock"
    );
    guard.release().await.unwrap();
    let out = timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success());
    let rev: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        rev > fence,
        "etcdctl's revision {rev} is not above polylock's fence {fence}"
    );
    assert!(
        locker.inspect(&lock).await.unwrap().is_none(),
        "etcdctl released"
    );
}

/// One queue for both implementations: polylock and etcdctl waiters get the
/// lock in the order they queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_across_polylock_and_etcdctl() {
    let (_server, endpoints, url) = server();
    let lock = name("fifo-mixed");
    let (_b0, holder) = client(&url).await;
    let guard = holder.lock(&lock).acquire().await.unwrap();

    // Each waiter is seen queued in etcd before the next one starts.
    let mut e1 = EtcdctlLock::spawn(&endpoints, &lock);
    wait_claims(&endpoints, &lock, 2).await;
    let (_b2, p2) = client(&url).await;
    let w2 = spawn_waiter(p2, &lock, Duration::from_secs(60));
    wait_claims(&endpoints, &lock, 3).await;
    let mut e3 = EtcdctlLock::spawn(&endpoints, &lock);
    wait_claims(&endpoints, &lock, 4).await;
    let (_b4, p4) = client(&url).await;
    let w4 = spawn_waiter(p4, &lock, Duration::from_secs(60));
    wait_claims(&endpoints, &lock, 5).await;

    guard.release().await.unwrap();
    assert!(
        e1.held_within(Duration::from_secs(3)).await,
        "first waiter (etcdctl)"
    );
    sleep(Duration::from_millis(300)).await;
    assert!(!w2.is_finished() && !w4.is_finished());
    assert!(!e3.held_within(Duration::from_millis(10)).await);

    e1.release().await;
    let g2 = timeout(Duration::from_secs(3), w2)
        .await
        .expect("second waiter (polylock)")
        .unwrap();
    assert!(
        !e3.held_within(Duration::from_millis(300)).await,
        "third jumped the queue"
    );
    assert!(!w4.is_finished());

    g2.release().await.unwrap();
    assert!(
        e3.held_within(Duration::from_secs(3)).await,
        "third waiter (etcdctl)"
    );
    sleep(Duration::from_millis(300)).await;
    assert!(!w4.is_finished(), "fourth jumped the queue");

    e3.release().await;
    let g4 = timeout(Duration::from_secs(3), w4)
        .await
        .expect("fourth waiter (polylock)")
        .unwrap();
    g4.release().await.unwrap();
}

/// `?prefix=` prepends to the key prefix: etcdctl must lock `PREFIX+NAME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_option_places_the_keys() {
    let (_server, endpoints, url) = server();
    let lock = name("prefixed");
    let (backend, locker) = client(&format!("{url}?prefix=app%2F")).await;
    let guard = locker.lock(&lock).acquire().await.unwrap();
    let key = guard.lease().backend_key().unwrap().to_string();
    assert!(key.starts_with(&format!("app/{lock}/")), "{key}");
    assert_eq!(backend.key_prefix(&guard.name()), format!("app/{lock}/"));
    let listed = etcdctl_out(&endpoints, &["get", "--prefix", "--keys-only", "app/"]).await;
    assert!(listed.contains(&key), "{listed}");

    // etcdctl on the bare name is another lock; on PREFIX+NAME the same one.
    let mut bare = EtcdctlLock::spawn(&endpoints, &lock);
    assert!(bare.held_within(Duration::from_secs(5)).await);
    bare.release().await;
    let mut same = EtcdctlLock::spawn(&endpoints, &format!("app/{lock}"));
    assert!(!same.held_within(Duration::from_millis(1000)).await);
    guard.release().await.unwrap();
    assert!(same.held_within(Duration::from_secs(3)).await);
    same.release().await;
}

/// Names are used verbatim: `a` and `a/b` are different locks for polylock,
/// even though the prefix of `a` starts the keys of `a/b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_and_its_slash_extension_are_different_locks() {
    let (_server, _endpoints, url) = server();
    let base = name("nested");
    let (_b1, one) = client(&url).await;
    let (_b2, two) = client(&url).await;
    // a/b first: its key sorts under a's prefix, and must not count as a's holder.
    let deep = two.lock(format!("{base}/b")).acquire().await.unwrap();
    let deep_hex = two.lock(format!("{base}/0")).acquire().await.unwrap();
    let top = one
        .lock(&base)
        .try_acquire()
        .await
        .unwrap()
        .expect("a is free while a/b and a/0 are held");
    assert!(one
        .inspect(&base)
        .await
        .unwrap()
        .is_some_and(|i| i.fence == Some(top.fence())));
    assert!(two.lock(&base).try_acquire().await.unwrap().is_none());
    top.release().await.unwrap();
    assert!(one.inspect(&base).await.unwrap().is_none());
    deep.release().await.unwrap();
    deep_hex.release().await.unwrap();
}
