//! What a held lock costs in client memory: every lock held through the
//! guard API, counted by this binary's own global allocator (live bytes, as
//! `polylock bench` counts them), stays under 2 KiB.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lock_core::Locker;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// The one unsafe item: a global allocator must implement an unsafe trait.
// It only forwards to the system allocator and keeps a count.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds alloc's contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Live heap bytes per lock while `n` locks are held.
async fn bytes_per_held_lock(locker: &Locker, n: usize) -> f64 {
    let prefix = common::unique(&format!("held-{n}"));
    let before = LIVE.load(Ordering::Relaxed);
    let guards: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let locker = locker.clone();
            let name = format!("{prefix}/{i}");
            async move {
                locker
                    .lock(name)
                    .ttl(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("acquire")
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let after = LIVE.load(Ordering::Relaxed);
    assert!(guards.iter().all(|g| g.is_held()));
    let per = after.saturating_sub(before) as f64 / n as f64;
    futures::stream::iter(guards)
        .for_each_concurrent(64, |g| async move { g.release().await.expect("release") })
        .await;
    per
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_costs_under_two_kib_of_client_memory() {
    let locker = Locker::new(common::client().await);
    // Sessions, the watchdog and the maps exist before the count starts,
    // as they do in a client that has taken a lock before.
    let warm = bytes_per_held_lock(&locker, 10).await;
    assert!(warm > 0.0);
    for n in [200, 2000] {
        let per = bytes_per_held_lock(&locker, n).await;
        println!("{n} held locks: {per:.0} bytes each");
        assert!(per < 2048.0, "{n} held locks cost {per:.0} bytes each");
    }
}
