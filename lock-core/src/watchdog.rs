//! The watchdog: renews held leases at a third of their TTL (or at half
//! the time a lease is trusted, when its deadline comes before two thirds
//! of its TTL).
//!
//! One scheduler task per [`Locker`](crate::Locker) (shared by its clones)
//! keeps every held lease's next renewal time in a heap and sleeps until the
//! earliest. Taking a lock only pushes onto that heap: no task is spawned
//! and, in the steady state, no thread is woken (the scheduler is told only
//! when a new renewal is due before its planned wake-up). A renewal itself
//! runs as a short task of its own, so a slow server never delays the
//! renewals of other locks.
//!
//! Leases of one backend client that are due together are renewed
//! together: each lease may be renewed from a quarter of its TTL on (or
//! three eighths of the time it is trusted, if sooner), so a
//! wake-up for the earliest due lease also takes every lease of the same
//! client already past its quarter, and hands them to
//! [`LockBackend::renew_many`](crate::LockBackend::renew_many) in batches of
//! at most [`MAX_BATCH`] when the backend declares
//! [`batch_renew`](crate::Guarantees::batch_renew). Renewal traffic then
//! grows with the number of wake-ups, not with the number of held locks.
//!
//! A renewal that fails is retried with backoff until the lease's local
//! deadline (a lease whose batch failed is retried on its own); then, or at
//! once when the backend says the lease is no longer ours, the lease is
//! marked lost. Release, drop of the last guard and loss cancel
//! `held.gone`: the lease is skipped from then on and its own in-flight
//! renewal is aborted, so renewals never outlive the guards. A batch in
//! flight is not aborted for one released lease (that would delay the
//! others): its answer for that lease is dropped, and since renewals are
//! owner-checked on the server it cannot extend a lock released before it
//! arrived.
//!
//! Every watched lease keeps its scheduler alive (the Locker is not needed:
//! a guard is renewed for as long as it lives). The scheduler task runs on
//! one runtime; if that runtime shuts down under it, the task's drop
//! restarts it on the runtime of each lease still queued (the first live
//! one wins), so leases taken on other runtimes keep being renewed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};
use tracing::Instrument;

use crate::held::Held;
use crate::observe;

/// How long the scheduler sleeps when nothing is due sooner. Short enough
/// that an idle scheduler notices its locker is gone, long enough to cost
/// nothing.
const IDLE: Duration = Duration::from_secs(1);

/// The most leases the watchdog hands to one `renew_many` call: bounds one request's
/// size (and the leases a single slow answer can delay).
pub const MAX_BATCH: usize = 256;

/// The renewal scheduler of one locker.
#[derive(Default)]
pub(crate) struct Watchdog {
    inner: Arc<Scheduler>,
}

/// The shared state of a scheduler, kept alive by its locker and by every
/// lease it renews.
#[derive(Default)]
pub(crate) struct Scheduler {
    state: Mutex<State>,
    wake: Notify,
}

type Inner = Scheduler;

#[derive(Default)]
struct State {
    /// (renew at, insertion number, lease): the earliest first.
    queue: BinaryHeap<Reverse<Entry>>,
    next_id: u64,
    /// Queue length after the last sweep of released leases.
    swept_len: usize,
    /// When the scheduler will look at the queue next (None: not running).
    planned: Option<Instant>,
    task: Option<JoinHandle<()>>,
    /// Which spawn of the scheduler task is current.
    generation: u64,
}

struct Entry {
    at: Instant,
    /// From when the lease may be renewed early, with others due then.
    early: Instant,
    id: u64,
    held: Weak<Held>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.id) == (other.at, other.id)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.id).cmp(&(other.at, other.id))
    }
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog").finish_non_exhaustive()
    }
}

impl Watchdog {
    /// Schedules the next renewal of `held` at `sent_at + ttl/3` of its
    /// current lease (or half the time it is trusted), and ties this scheduler's life to the lease. Must run
    /// inside a tokio runtime.
    pub(crate) fn watch(&self, held: &Arc<Held>) {
        held.keep_scheduler(Arc::clone(&self.inner));
        schedule(&self.inner, held);
    }
}

fn lock(inner: &Inner) -> std::sync::MutexGuard<'_, State> {
    // Every critical section is a heap push/pop or a field assignment.
    inner.state.lock().unwrap_or_else(|p| p.into_inner())
}

fn schedule(inner: &Arc<Inner>, held: &Arc<Held>) {
    let (at, early) = {
        let lease = held.lease();
        let (sent_at, ttl) = (lease.sent_at(), lease.ttl());
        let trusted = lease.deadline().saturating_duration_since(sent_at);
        // Three quarters of the way to the renewal.
        let early = crate::lease::later(sent_at, (ttl / 4).min(trusted * 3 / 8));
        (lease.renewal_due(), early)
    };
    let mut st = lock(inner);
    // Released leases stay queued until their renewal time comes round;
    // with many short holdings that adds up, so sweep them out once the
    // queue has doubled since the last sweep (amortized O(1) per push).
    if st.queue.len() >= 2 * st.swept_len.max(512) {
        st.queue
            .retain(|Reverse(e)| e.held.upgrade().is_some_and(|h| !h.gone.is_cancelled()));
        st.swept_len = st.queue.len();
    }
    let id = st.next_id;
    st.next_id += 1;
    st.queue.push(Reverse(Entry {
        at,
        early,
        id,
        held: Arc::downgrade(held),
    }));
    // (Re)start the scheduler if it is not running on a live runtime: the
    // runtime it ran on may have shut down since.
    if !ensure_running(inner, &mut st, at) && st.planned.is_none_or(|p| at < p) {
        st.planned = Some(at);
        drop(st);
        inner.wake.notify_one();
    }
}

/// Spawns the scheduler task on the current runtime unless it runs; true if
/// it was spawned (it then looks at the queue at once).
fn ensure_running(inner: &Arc<Inner>, st: &mut State, at: Instant) -> bool {
    if st.task.as_ref().is_some_and(|t| !t.is_finished()) {
        return false;
    }
    st.generation += 1;
    st.planned = Some(at);
    // Made before the spawn and moved into the task: a runtime that drops
    // the task before its first poll (a current-thread runtime whose
    // `block_on` returned first, then shut down) still restarts it.
    let restart = Restart {
        inner: Arc::downgrade(inner),
        generation: st.generation,
    };
    // A runtime that is shutting down drops the task right here, with the
    // state locked: its Restart must not take the lock then, and the
    // finished handle makes the next schedule spawn again.
    let task = {
        let _spawning = Spawning::begin();
        tokio::spawn(run(restart))
    };
    st.task = Some(task);
    true
}

thread_local! {
    /// Set while `ensure_running` spawns the scheduler with the state
    /// locked.
    static SPAWNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as spawning the scheduler until dropped, also when
/// the spawn panics (no runtime): a mark left behind would keep every later
/// Restart on the thread from doing its work.
struct Spawning;

impl Spawning {
    fn begin() -> Self {
        SPAWNING.set(true);
        Spawning
    }
}

impl Drop for Spawning {
    fn drop(&mut self) {
        SPAWNING.set(false);
    }
}

/// Restarts the scheduler if its task went away while leases are queued.
/// Lives in the scheduler task: the task ends normally only once its state
/// is gone, so a drop with the state still alive means its runtime shut
/// down (or a renewal panicked) under it.
struct Restart {
    inner: Weak<Inner>,
    generation: u64,
}

impl Drop for Restart {
    fn drop(&mut self) {
        if SPAWNING.get() {
            return;
        }
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let runtimes: Vec<tokio::runtime::Handle> = {
            let mut st = lock(&inner);
            if st.generation != self.generation {
                return;
            }
            st.task = None;
            st.planned = None;
            st.queue
                .iter()
                .filter_map(|Reverse(e)| e.held.upgrade())
                .filter(|h| !h.gone.is_cancelled())
                .filter_map(|h| h.runtime.clone())
                .collect()
        };
        restart_on_each(runtimes.into_iter(), &inner);
    }
}

/// Has each of `runtimes` (once each) start the scheduler if it is not
/// running. The dying runtime drops what is spawned on it unpolled; the
/// first live one restarts the scheduler, and the rest find it running.
fn restart_on_each(runtimes: impl Iterator<Item = tokio::runtime::Handle>, inner: &Arc<Inner>) {
    let mut seen = Vec::new();
    for rt in runtimes {
        if !seen.contains(&rt.id()) {
            seen.push(rt.id());
            restart_on(&rt, inner);
        }
    }
}

/// Has `rt` start the scheduler if it is not running, or wake it.
fn restart_on(rt: &tokio::runtime::Handle, inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    rt.spawn(async move {
        if let Some(inner) = weak.upgrade() {
            let mut st = lock(&inner);
            if !ensure_running(&inner, &mut st, Instant::now()) {
                drop(st);
                inner.wake.notify_one();
            }
        }
    });
}

/// The scheduler loop. Between rounds it holds only a weak reference, so it
/// ends at its next wake-up (within [`IDLE`]) once its locker (every clone)
/// and every lease it renews are gone.
async fn run(restart: Restart) {
    let inner = restart.inner.clone();
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut due = Vec::new();
        let next = {
            let mut st = lock(&strong);
            // The heap is ordered by due time. Leases past their early
            // point ride along only with a wake-up that renews something
            // anyway (a batch that would otherwise follow shortly); an idle
            // wake-up must not renew them at a quarter of their TTL.
            while st
                .queue
                .peek()
                .is_some_and(|Reverse(e)| e.at <= now || (!due.is_empty() && e.early <= now))
            {
                if let Some(Reverse(e)) = st.queue.pop() {
                    due.push(e.held);
                }
            }
            let next = st
                .queue
                .peek()
                .map_or(now + IDLE, |Reverse(e)| e.at.min(now + IDLE));
            st.planned = Some(next);
            next
        };
        // is_held also records a revocation or a passed deadline as a
        // loss: such a lease is not renewed.
        let live = due.iter().filter_map(Weak::upgrade).filter(|h| h.is_held());
        for group in batches(live) {
            match <[Arc<Held>; 1]>::try_from(group) {
                Ok([held]) => spawn_renew(&strong, held),
                Err(group) => {
                    let requeue = Requeue::new(&strong, &group);
                    tokio::spawn(renew_batch(Arc::clone(&strong), group, requeue));
                }
            }
        }
        // A schedule() between the unlock above and this wait leaves a
        // permit in `wake`, so it is not missed.
        tokio::select! {
            _ = strong.wake.notified() => {}
            _ = sleep_until(next) => {}
        }
    }
}

/// Splits the due leases into what one task renews: the leases of one
/// client that batches renewals, at most [`MAX_BATCH`] at a time, and every
/// other lease alone.
fn batches(due: impl Iterator<Item = Arc<Held>>) -> Vec<Vec<Arc<Held>>> {
    let mut out: Vec<Vec<Arc<Held>>> = Vec::new();
    // Per client seen: whether it batches, and the index in `out` of its
    // batch being filled. Few clients per locker, so a list will do.
    let mut clients: Vec<(crate::owner::BackendId, bool, usize)> = Vec::new();
    for held in due {
        let id = crate::held::backend_id(&held.backend);
        let seen = match clients.iter().position(|c| c.0 == id) {
            Some(i) => i,
            None => {
                clients.push((id, held.backend.guarantees().batch_renew, usize::MAX));
                clients.len() - 1
            }
        };
        let (_, batching, open) = &mut clients[seen];
        match out.get_mut(*open) {
            Some(batch) if *batching && batch.len() < MAX_BATCH => batch.push(held),
            _ => {
                out.push(vec![held]);
                *open = out.len() - 1;
            }
        }
    }
    out
}

/// Spawns one renewal of `held`, retried until its deadline, which
/// schedules the next; its release can abort it.
fn spawn_renew(inner: &Arc<Inner>, held: Arc<Held>) {
    // Made before the spawn and moved into the task: a task its runtime
    // drops before the first poll (shutting down) still puts the lease back.
    let requeue = Requeue::new(inner, std::slice::from_ref(&held));
    let task = tokio::spawn({
        let (inner, held) = (Arc::clone(inner), Arc::clone(&held));
        async move {
            renew_until_deadline(inner, held).await;
            requeue.disarm();
        }
    });
    held.set_watchdog(task.abort_handle());
}

/// One `renew_many` for leases of one client. Each answer is handled as a
/// single renewal's would be; a lease whose answer is a failure other than
/// a loss (or that got no answer before the earliest deadline of the
/// batch) goes on alone, retried until its own deadline.
///
/// `requeue` is made by the spawner, before the spawn: see [`spawn_renew`].
async fn renew_batch(inner: Arc<Inner>, mut group: Vec<Arc<Held>>, requeue: Requeue) {
    // Released (or revoked) since the scheduler took them: not sent at all.
    group.retain(|h| h.is_held());
    if group.is_empty() {
        requeue.disarm();
        return;
    }
    let leases: Vec<_> = group.iter().map(|h| h.current()).collect();
    let backend = Arc::clone(&group[0].backend);
    let deadline = leases
        .iter()
        .map(crate::Lease::deadline)
        .min()
        .unwrap_or_else(Instant::now);
    let span = observe::span!(
        DEBUG,
        "polylock.renew_many",
        backend = group[0].backend_name,
        leases = leases.len(),
    );
    let answers = timeout_at(deadline, backend.renew_many(&leases))
        .instrument(span)
        .await
        .ok()
        .filter(|a| a.len() == leases.len());
    requeue.disarm();
    let Some(answers) = answers else {
        for held in group {
            if !held.gone.is_cancelled() {
                held.metrics.renew_failed();
                spawn_renew(&inner, held);
            }
        }
        return;
    };
    for (held, answer) in group.into_iter().zip(answers) {
        if held.gone.is_cancelled() {
            continue;
        }
        match answer {
            Ok(renewed) => {
                if held.publish_renewal(renewed).is_ok() && !held.gone.is_cancelled() {
                    schedule(&inner, &held);
                }
            }
            Err(e) if e.is_lost() => {
                held.mark_lost("the backend reports the lease is no longer ours");
            }
            Err(e) => {
                held.metrics.renew_failed();
                tracing::debug!(
                    backend = held.backend_name,
                    name = %held.current().name(),
                    error = %e,
                    "polylock: batched renew failed; retrying alone until the deadline"
                );
                spawn_renew(&inner, held);
            }
        }
    }
}

/// Puts leases back in the queue when their renewal task is dropped before
/// it finished (its runtime shut down): while a renewal runs, the lease is
/// not queued, so nothing else would renew it again.
struct Requeue {
    inner: Arc<Inner>,
    held: Vec<Weak<Held>>,
    armed: bool,
}

impl Requeue {
    fn new(inner: &Arc<Inner>, held: &[Arc<Held>]) -> Self {
        Requeue {
            inner: Arc::clone(inner),
            held: held.iter().map(Arc::downgrade).collect(),
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Requeue {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let live: Vec<Arc<Held>> = self
            .held
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|h| !h.gone.is_cancelled())
            .collect();
        if live.is_empty() {
            return;
        }
        let mut st = lock(&self.inner);
        let now = Instant::now();
        for held in &live {
            let id = st.next_id;
            st.next_id += 1;
            st.queue.push(Reverse(Entry {
                at: now,
                early: now,
                id,
                held: Arc::downgrade(held),
            }));
        }
        let running = st.task.as_ref().is_some_and(|t| !t.is_finished());
        drop(st);
        if running {
            // If that task is dying too, its Restart finds these entries.
            self.inner.wake.notify_one();
        } else {
            // Each lease's runtime, as Restart does: the first may be the
            // one dying, which drops what is spawned on it.
            restart_on_each(live.iter().filter_map(|h| h.runtime.clone()), &self.inner);
        }
    }
}

async fn renew_until_deadline(inner: Arc<Inner>, held: Arc<Held>) {
    let mut pause =
        (held.current().ttl() / 20).clamp(Duration::from_millis(5), Duration::from_secs(1));
    loop {
        // Ends it once the lease is released, revoked or past its deadline
        // (the last two recorded as a loss).
        if !held.is_held() {
            return;
        }
        // Read again every round: a renewal by hand (`LockGuard::renew`)
        // may have moved the deadline while these attempts failed.
        let lease = held.current();
        let deadline = lease.deadline();
        let span = observe::span!(
            DEBUG,
            "polylock.renew",
            backend = held.backend_name,
            name = %lease.name(),
            fence = lease.fence().get(),
        );
        let attempt = tokio::select! {
            _ = held.gone.cancelled() => return,
            r = timeout_at(deadline, held.backend.renew(&lease)).instrument(span) => r,
        };
        match attempt {
            Ok(Ok(renewed)) => {
                tracing::trace!(
                    backend = held.backend_name,
                    name = %renewed.name(),
                    fence = renewed.fence().get(),
                    "polylock: renewed"
                );
                if held.publish_renewal(renewed).is_ok() && !held.gone.is_cancelled() {
                    schedule(&inner, &held);
                }
                return;
            }
            Ok(Err(e)) if e.is_lost() => {
                held.mark_lost("the backend reports the lease is no longer ours");
                return;
            }
            Ok(Err(e)) => {
                held.metrics.renew_failed();
                tracing::debug!(
                    backend = held.backend_name,
                    name = %lease.name(),
                    error = %e,
                    "polylock: renew failed; retrying until the deadline"
                );
                let until = held.current().deadline().min(Instant::now() + pause);
                tokio::select! {
                    _ = held.gone.cancelled() => return,
                    _ = sleep_until(until) => {}
                }
                pause = (pause * 2)
                    .min(lease.ttl() / 6)
                    .max(Duration::from_millis(5));
            }
            // No answer by the deadline: the next round's is_held records
            // the loss, unless a renewal by hand moved the deadline.
            Err(_elapsed) => held.metrics.renew_failed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcquireRequest, LockBackend, LockName, MemoryBackend, OwnerToken};

    #[tokio::test]
    async fn released_leases_are_swept_from_the_queue() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let watchdog = Watchdog::default();
        for i in 0..5000 {
            let name = LockName::new(format!("n{i}")).unwrap();
            let req = AcquireRequest::new(
                name,
                OwnerToken::random(),
                Duration::from_secs(30),
                Duration::ZERO,
            )
            .unwrap();
            let lease = backend.try_acquire(&req).await.unwrap().unwrap();
            let metrics = Arc::new(crate::observe::Metrics::new("memory"));
            let held = Held::new(Arc::clone(&backend), lease, None, metrics);
            watchdog.watch(&held);
            assert!(held.drop_hold().is_some(), "the only hold was given back");
        }
        let queued = lock(&watchdog.inner).queue.len();
        assert!(queued <= 1025, "{queued} renewals queued for 0 live leases");
    }
}
