//! Guard behaviour that the conformance suite cannot reach: dropping without
//! a runtime, and the owned lost signal.

use std::time::Duration;

use lock_core::{LockBackend, LockName, Locker, MemoryBackend};

#[test]
fn drop_without_a_runtime_does_not_block_and_leaves_the_ttl_to_expire() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(async {
        locker
            .lock("orphan")
            .ttl(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap()
    });
    drop(rt);
    let started = std::time::Instant::now();
    drop(guard); // no runtime here: must return at once
    assert!(started.elapsed() < Duration::from_millis(50));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let name = LockName::new("orphan").unwrap();
        assert!(
            backend.inspect(&name).await.unwrap().is_some(),
            "with no runtime, the lock stays until its TTL"
        );
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(
            backend.inspect(&name).await.unwrap().is_none(),
            "TTL expired it"
        );
    });
}

#[tokio::test]
async fn drop_inside_a_runtime_releases_in_the_background() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let guard = locker.lock("dropped").acquire().await.unwrap();
    let signal = guard.lost_signal();
    drop(guard);
    tokio::time::timeout(Duration::from_secs(1), signal)
        .await
        .expect("the owned signal completes once the guard is gone");
    let name = LockName::new("dropped").unwrap();
    for _ in 0..100 {
        if backend.inspect(&name).await.unwrap().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("drop did not release the lock");
}

#[tokio::test]
async fn with_lock_cancels_the_closure_when_the_lock_is_lost() {
    let backend = MemoryBackend::new();
    let locker = Locker::new(backend.clone());
    let thief = backend.clone();
    let r = locker
        .lock("cancel-me")
        .ttl(Duration::from_millis(150))
        .run(|_fence| async move {
            thief
                .force_release(&LockName::new("cancel-me").unwrap())
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
            "finished"
        })
        .await;
    assert!(matches!(r, Err(lock_core::LockError::Lost { .. })), "{r:?}");
    let ok = locker
        .with_lock("cancel-me", |f| async move { f.get() })
        .await;
    assert_eq!(ok.unwrap(), 2);
}

#[test]
fn guards_lockers_and_their_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Locker>();
    send_sync::<lock_core::Owner>();
    let locker = Locker::new(MemoryBackend::new());
    let acquire = locker.lock("s").acquire();
    send(&acquire);
    let run = locker.with_lock("s", |_| async {});
    send(&run);
    fn guard_is_send(g: lock_core::LockGuard) -> impl Send {
        g
    }
    let _ = guard_is_send;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeping_released_leases_keeps_live_renewals() {
    // 20k acquire/release cycles with the default 30 s TTL schedule renewals
    // 10 s out, so the watchdog sweeps released ones many times meanwhile
    // (the bound itself is checked in watchdog.rs); a live lease's renewal
    // must survive every sweep.
    let locker = Locker::new(MemoryBackend::new());
    let keeper = locker
        .lock("kept")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    for _ in 0..20_000 {
        let g = locker.lock("churn").acquire().await.unwrap();
        g.release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(keeper.is_held(), "a sweep dropped a live lease's renewal");
    keeper.release().await.unwrap();
}

/// `lost()` waits through renewals: each one moves the deadline it waits
/// for, so a lock kept for many TTLs never reads as lost; it fires at once
/// when the release starts.
#[tokio::test]
async fn lost_waits_through_renewals_and_fires_at_release() {
    let locker = Locker::new(MemoryBackend::new());
    // Long enough that a loaded machine's scheduling delays stay well
    // inside a TTL's margin (a renewal goes out every 100 ms).
    let ttl = Duration::from_millis(300);
    let guard = locker.lock("renewed").ttl(ttl).acquire().await.unwrap();
    let first_deadline = guard.lease().deadline();
    let signal = guard.lost_signal();
    tokio::pin!(signal);
    assert!(
        tokio::time::timeout(ttl * 5, &mut signal).await.is_err(),
        "lost() fired while the watchdog renewed the lease"
    );
    assert!(guard.is_held());
    assert!(guard.lease().deadline() > first_deadline + ttl * 3);
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_millis(100), signal)
        .await
        .expect("lost() fires when the release starts");
}
