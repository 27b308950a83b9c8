use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockName, Locker};
use tokio::time::Instant;

use crate::fixture::Ctx;

/// 16 tasks x 50 iterations each do a read-modify-write of a shared value
/// with a yield in the middle, under the lock. A lost update or two tasks
/// inside at once means the lock failed.
pub(crate) async fn mutual_exclusion(ctx: &Ctx<'_>) {
    const TASKS: usize = 16;
    const ITERATIONS: u64 = 50;
    let name = ctx.name("counter");
    let value = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    // A few independent clients shared by the tasks: exclusion must hold
    // across clients, not only inside one.
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(ctx.locker().await);
    }
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let locker = lockers[t % lockers.len()].clone();
        let (name, value, inside) = (name.clone(), value.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ITERATIONS {
                let guard = locker
                    .lock(name.as_str())
                    .ttl(Duration::from_secs(30))
                    .wait(Duration::from_secs(120))
                    .acquire()
                    .await
                    .expect("acquire within the wait");
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two holders inside the critical section at once"
                );
                let read = value.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                value.store(read + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task panicked");
    }
    assert_eq!(
        value.load(Ordering::SeqCst),
        TASKS as u64 * ITERATIONS,
        "lost update"
    );
}

/// A held lock makes `try_acquire` answer "held" at once.
pub(crate) async fn try_acquire_on_held_lock_does_not_wait(ctx: &Ctx<'_>) {
    let name = ctx.name("held");
    let a = ctx.locker().await;
    let b = ctx.locker().await;
    let guard = a
        .lock(name.as_str())
        .acquire()
        .await
        .expect("first acquire");
    let started = Instant::now();
    // A wait configured on the builder must not matter for try_acquire.
    let second = b
        .lock(name.as_str())
        .wait(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("try_acquire");
    assert!(second.is_none(), "a held lock was granted twice");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "try_acquire waited {:?}",
        started.elapsed()
    );
    assert!(guard.is_held());
    guard.release().await.expect("release");
}

/// Names that differ by case, by Unicode, or only in the last byte of a long
/// name are different locks, and each can be held at the same time.
pub(crate) async fn distinct_names_do_not_collide(ctx: &Ctx<'_>) {
    let base = ctx.name("n");
    let long_a = format!(
        "{base}/{}",
        "x".repeat(LockName::MAX_LEN - base.as_str().len() - 1)
    );
    let mut long_b = long_a.clone();
    long_b.pop();
    long_b.push('y');
    let names = [
        format!("{base}/Job"),
        format!("{base}/job"),
        format!("{base}/JOB"),
        format!("{base}/ключ"),
        format!("{base}/ключ🔒"),
        format!("{base}/e\u{301}"), // e + combining acute: not the same as é
        format!("{base}/\u{e9}"),
        format!("{base}/a/b"),
        format!("{base}/a_b"),
        format!("{base}/a:b"),
        format!("{base}/a b"),
        // PAD SPACE collations compare these equal (docs/sql.md).
        format!("{base}/a"),
        format!("{base}/a "),
        format!("{base}/a%2Fb"),
        long_a,
        long_b,
    ];
    let locker = ctx.locker().await;
    let other = ctx.locker().await;
    let mut guards = Vec::new();
    for n in &names {
        let g = locker
            .lock(n)
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("acquire {n:?}: {e}"))
            .unwrap_or_else(|| panic!("{n:?} collided with an earlier name"));
        guards.push(g);
    }
    for (n, g) in names.iter().zip(&guards) {
        let info = locker.inspect(n).await.expect("inspect").expect("held");
        if let Some(fence) = info.fence {
            assert_eq!(fence, g.fence(), "inspect({n:?}) shows another holding");
        }
        assert!(
            other.lock(n).try_acquire().await.expect("try").is_none(),
            "{n:?} granted twice"
        );
    }
    for g in guards {
        g.release().await.expect("release");
    }
    for n in &names {
        assert!(
            locker.inspect(n).await.expect("inspect").is_none(),
            "{n:?} still held"
        );
    }
}

/// Waiters that queued one after another acquire in that order.
pub(crate) async fn waiters_acquire_in_fifo_order(ctx: &Ctx<'_>) {
    let name = ctx.name("fifo");
    let holder = ctx.locker().await;
    let guard = holder.lock(name.as_str()).acquire().await.expect("acquire");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let locker: Locker = ctx.locker().await;
        let (name, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = locker
                .lock(name.as_str())
                .wait(Duration::from_secs(60))
                .acquire()
                .await
                .expect("waiter acquires");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.expect("release");
        }));
        // Let waiter i queue before waiter i+1 starts.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    guard.release().await.expect("release");
    for t in tasks {
        t.await.expect("waiter panicked");
    }
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4]);
}

/// Exclusion near expiry: a holder that stops renewing keeps the lock until
/// its local deadline. The next grant reaches the next holder only after
/// that deadline (both measured on this process's clock), so a holder that
/// checks its deadline before each write never overlaps its successor.
pub(crate) async fn next_grant_comes_after_the_old_holders_deadline(ctx: &Ctx<'_>) {
    let name = ctx.name("near-expiry");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let holder = ctx.client().await;
    let next = ctx.client().await;
    let old = crate::cases::raw_try(&holder, &name, ttl)
        .await
        .expect("acquire");
    let limit = old.sent_at() + ttl + ctx.slack(ttl) * 2;
    let granted = loop {
        if let Some(lease) = crate::cases::raw_try(&next, &name, ttl).await {
            break (Instant::now(), lease);
        }
        assert!(
            Instant::now() < limit,
            "the abandoned lock was never granted again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (received, lease) = granted;
    assert!(
        received >= old.deadline(),
        "the next holder got the lock {:?} before the old holder's local deadline",
        old.deadline() - received
    );
    assert!(lease.fence() > old.fence(), "the next grant reused a token");
    next.release(&lease).await.expect("release");
}
