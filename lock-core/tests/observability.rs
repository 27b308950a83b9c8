//! Metrics are emitted by the core, once for every backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{LockBackend, Locker, MemoryBackend};
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// Counts increments and recordings per metric name and label set.
#[derive(Default)]
struct Tally(Mutex<HashMap<String, Arc<Cell>>>);

#[derive(Default)]
struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, v: u64) {
        self.0.fetch_add(v, Ordering::SeqCst);
    }
    fn absolute(&self, v: u64) {
        self.0.store(v, Ordering::SeqCst);
    }
}

impl HistogramFn for Cell {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Tally {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let id = format!("{}{{{}}}", key.name(), labels.join(","));
        self.0.lock().unwrap().entry(id).or_default().clone()
    }
    fn get(&self, id: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(id)
            .map_or(0, |c| c.0.load(Ordering::SeqCst))
    }
}

impl Recorder for Tally {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

#[test]
fn acquire_wait_renew_failure_and_loss_are_counted() {
    let tally = Tally::default();
    metrics::with_local_recorder(&tally, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let backend = MemoryBackend::new();
            let locker = Locker::new(backend.clone());
            let g = locker.lock("m").acquire().await.unwrap();
            assert!(locker.lock("m").try_acquire().await.unwrap().is_none());
            let r = locker
                .lock("m")
                .wait(Duration::from_millis(30))
                .acquire()
                .await;
            assert!(r.is_err());
            g.release().await.unwrap();

            // A lock removed behind the holder's back: the watchdog's renew
            // is refused and the loss is counted.
            let g = locker
                .lock("m")
                .ttl(Duration::from_millis(90))
                .acquire()
                .await
                .unwrap();
            let name = g.name();
            assert!(backend.force_release(&name).await.unwrap());
            tokio::time::timeout(Duration::from_secs(2), g.lost())
                .await
                .unwrap();
            drop(g);
        });
    });
    let b = "backend=memory";
    assert_eq!(
        tally.get(&format!("polylock_acquire_seconds{{{b},outcome=acquired}}")),
        2
    );
    assert_eq!(
        tally.get(&format!("polylock_acquire_seconds{{{b},outcome=busy}}")),
        1
    );
    assert_eq!(
        tally.get(&format!("polylock_acquire_seconds{{{b},outcome=timeout}}")),
        1
    );
    assert_eq!(tally.get(&format!("polylock_lost_total{{{b}}}")), 1);
    assert!(tally.get(&format!("polylock_released_total{{{b}}}")) >= 1);
}

/// Metric keys are built once per Locker, but each count goes to the
/// recorder installed when it happens: a Locker made before the recorder
/// still reports to it.
#[test]
fn a_recorder_installed_after_the_locker_still_counts() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locker = Locker::new(MemoryBackend::new());
    // Counted by no recorder at all.
    rt.block_on(async {
        let g = locker.lock("early").acquire().await.unwrap();
        g.release().await.unwrap();
    });
    let tally = Tally::default();
    metrics::with_local_recorder(&tally, || {
        rt.block_on(async {
            let g = locker.lock("late").acquire().await.unwrap();
            g.release().await.unwrap();
        });
    });
    let b = "backend=memory";
    assert_eq!(
        tally.get(&format!("polylock_acquire_seconds{{{b},outcome=acquired}}")),
        1
    );
    assert_eq!(tally.get(&format!("polylock_released_total{{{b}}}")), 1);
}
