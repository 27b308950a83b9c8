//! One shared watch per lock and client: the deletes that waiters wait for.
//!
//! # Why shared
//! etcd 3.4 registers a new watch from the revision after the one it read
//! when the create request came in. A write that commits between those two
//! steps leaves the watch "unsynced", and unsynced watches are caught up by
//! a loop that runs every 100 ms. Under contention a watch per wait lost
//! that race about once in fifty hand-offs, each then taking up to 100 ms
//! instead of about one. A watch that lives across many waits can lose it
//! only when it is created. Waiters also save the watch's round trip.
//!
//! # Coverage
//! A waiter subscribes, waits until the watch exists
//! ([`Subscription::ready`]), and only then reads the queue. Every delete
//! with a revision above that read's then reaches it, and deletes reach it
//! in revision order, since one stream carries the lock's whole claim
//! range. When the stream breaks, deletes may be lost until it is back:
//! every waiter is told to read again ([`Note::Recheck`]), once the new
//! watch exists.
//!
//! # Lifetime
//! The first waiter of a lock on this client opens its watch; it stays
//! while any waiter is subscribed and for [`LINGER`] after the last one
//! left, so that back-to-back waits reuse it. Dropping the client stops
//! them all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchFilterType, WatchOptions};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use crate::conn::Conn;
use crate::queue::claim_range;

/// How long a lock's watch outlives its last waiter.
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// Deletes a waiter has not taken yet; one that falls further behind reads
/// the queue again.
const BACKLOG: usize = 256;

/// What a lock's watch tells its waiters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Note {
    /// Keys of the lock's claim range deleted at revision `rev`: every
    /// one that revision deleted, in one note (one transaction or a range
    /// delete removes several at once, and a waiter must see whether its
    /// own claim went in the same revision as the one ahead of it).
    Deleted { keys: Arc<[Arc<str>]>, rev: i64 },
    /// Deletes may have been missed (the watch broke, or this waiter fell
    /// behind): read the queue again.
    Recheck,
}

/// This client's lock watches, by lock prefix.
pub(crate) struct Watches {
    shared: Arc<Shared>,
}

struct Shared {
    conn: Conn,
    linger: Duration,
    map: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    tx: broadcast::Sender<Note>,
    ready: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Shared {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Critical sections are single lookups, inserts and removes.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Watches {
    /// Watches whose locks' watches stay `linger` after their last waiter
    /// ([`LINGER`] outside tests).
    pub(crate) fn new(conn: Conn, linger: Duration) -> Self {
        Watches {
            shared: Arc::new(Shared {
                conn,
                linger,
                map: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Subscribes to the deletes under lock prefix `pfx`, opening its watch
    /// if this client has none. Call [`Subscription::ready`] before reading
    /// the queue.
    pub(crate) fn subscribe(&self, pfx: &str) -> Subscription {
        let mut map = self.shared.map();
        if let Some(e) = map.get(pfx).filter(|e| !e.task.is_finished()) {
            return Subscription {
                rx: e.tx.subscribe(),
                ready: e.ready.clone(),
                pfx: Arc::from(pfx),
            };
        }
        let (tx, rx) = broadcast::channel(BACKLOG);
        let (ready_tx, ready) = watch::channel(false);
        let task = tokio::spawn(run(
            Arc::downgrade(&self.shared),
            self.shared.conn.clone(),
            self.shared.linger,
            pfx.to_string(),
            tx.clone(),
            ready_tx,
        ));
        map.insert(
            pfx.to_string(),
            Entry {
                tx,
                ready: ready.clone(),
                task,
            },
        );
        Subscription {
            rx,
            ready,
            pfx: Arc::from(pfx),
        }
    }

    /// How many lock watches this client keeps open.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.shared
            .map()
            .values()
            .filter(|e| !e.task.is_finished())
            .count()
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        // The watches never outlive their client.
        for (_, e) in self.shared.map().drain() {
            e.task.abort();
        }
    }
}

/// One waiter's view of a lock's watch.
pub(crate) struct Subscription {
    rx: broadcast::Receiver<Note>,
    ready: watch::Receiver<bool>,
    pfx: Arc<str>,
}

impl Subscription {
    /// The lock prefix whose deletes it carries.
    pub(crate) fn prefix(&self) -> Arc<str> {
        Arc::clone(&self.pfx)
    }

    /// Waits until the watch exists: a read of the queue made after this
    /// returns misses no later delete. Pending while the watch cannot be
    /// opened; callers bound it by their deadline.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn ready(&mut self) {
        if self.ready.wait_for(|r| *r).await.is_err() {
            // The client is gone: nothing will come.
            std::future::pending::<()>().await;
        }
    }

    /// The next note about a delete above revision `after` (what the
    /// caller's read already saw is skipped).
    ///
    /// # Cancel safety
    /// Cancel safe: a note is taken only when returned.
    pub(crate) async fn next(&mut self, after: i64) -> Note {
        loop {
            match self.rx.recv().await {
                Ok(Note::Deleted { rev, .. }) if rev <= after => {}
                Ok(note) => return note,
                Err(broadcast::error::RecvError::Lagged(_)) => return Note::Recheck,
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    }
}

/// The watch of one lock: open it, forward its deletes, open it again when
/// it breaks; end once nobody subscribed for [`LINGER`].
async fn run(
    shared: Weak<Shared>,
    conn: Conn,
    linger: Duration,
    pfx: String,
    tx: broadcast::Sender<Note>,
    ready: watch::Sender<bool>,
) {
    let (start, end) = claim_range(&pfx);
    let opts = WatchOptions::new()
        .with_range(end)
        .with_filters([WatchFilterType::NoPut]);
    let mut pause = Duration::from_millis(50);
    let mut idle_since = None;
    // A busy lock's deletes must not keep an unused watch alive.
    let mut idle_check = tokio::time::interval(linger / 2);
    idle_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether nobody subscribed for LINGER; if so, the entry is gone.
    let mut done = |tx: &broadcast::Sender<Note>| {
        if tx.receiver_count() > 0 {
            idle_since = None;
            return false;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < linger {
            return false;
        }
        let Some(shared) = shared.upgrade() else {
            return true;
        };
        // Subscriptions are made under this lock: none can arrive between
        // the count and the removal.
        let mut map = shared.map();
        if tx.receiver_count() > 0 {
            idle_since = None;
            return false;
        }
        map.remove(&pfx);
        true
    };
    loop {
        let mut stream = match conn.watch(start.clone(), opts.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "polylock etcd: cannot watch the lock yet; retrying");
                sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                if done(&tx) {
                    return;
                }
                continue;
            }
        };
        loop {
            let message = tokio::select! {
                m = stream.message() => m,
                _ = idle_check.tick() => {
                    if done(&tx) {
                        return;
                    }
                    continue;
                }
            };
            let Ok(Some(r)) = message else { break };
            if r.created() {
                pause = Duration::from_millis(50);
                ready.send_replace(true);
                // Whoever read while no watch existed reads again.
                let _ = tx.send(Note::Recheck);
            }
            // etcd never splits one revision's events between answers, and
            // sends them in revision order.
            let mut batch: Option<(i64, Vec<Arc<str>>)> = None;
            for kv in r
                .events()
                .iter()
                .filter(|e| e.event_type() == EventType::Delete)
                .filter_map(|e| e.kv())
            {
                let key = Arc::from(String::from_utf8_lossy(kv.key()).as_ref());
                match &mut batch {
                    Some((rev, keys)) if *rev == kv.mod_revision() => keys.push(key),
                    _ => {
                        if let Some((rev, keys)) = batch.take() {
                            let _ = tx.send(Note::Deleted {
                                keys: keys.into(),
                                rev,
                            });
                        }
                        batch = Some((kv.mod_revision(), vec![key]));
                    }
                }
            }
            if let Some((rev, keys)) = batch {
                let _ = tx.send(Note::Deleted {
                    keys: keys.into(),
                    rev,
                });
            }
            if r.canceled() || r.compact_revision() != 0 {
                break;
            }
        }
        ready.send_replace(false);
        let _ = tx.send(Note::Recheck);
        if done(&tx) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::Retry;
    use etcd_client::{Txn, TxnOp};

    async fn etcd_conn(server: &testkit::EtcdServer) -> Conn {
        let client = etcd_client::Client::connect([server.endpoint()], None)
            .await
            .unwrap();
        Conn::new(&client, Duration::from_secs(5))
    }

    /// Puts `key`; the revision of the write.
    async fn put(conn: &Conn, key: &str) -> i64 {
        let r = conn
            .txn(
                "test put",
                Retry::Any,
                Txn::new().and_then(vec![TxnOp::put(key, "v", None)]),
            )
            .await
            .unwrap();
        r.header().unwrap().revision()
    }

    async fn delete(conn: &Conn, key: &str) -> i64 {
        let r = conn
            .txn(
                "test delete",
                Retry::Any,
                Txn::new().and_then(vec![TxnOp::delete(key, None)]),
            )
            .await
            .unwrap();
        r.header().unwrap().revision()
    }

    fn deleted(keys: &[&str], rev: i64) -> Note {
        Note::Deleted {
            keys: keys.iter().map(|k| Arc::from(*k)).collect(),
            rev,
        }
    }

    async fn next(sub: &mut Subscription, after: i64) -> Note {
        tokio::time::timeout(Duration::from_secs(10), sub.next(after))
            .await
            .expect("a note within 10 s")
    }

    /// Deletes in the lock's claim range reach every subscriber, in
    /// revision order, above the revision it asks from; puts, and keys of
    /// other locks, do not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deletes_reach_each_subscriber_in_revision_order() {
        let server = testkit::EtcdServer::start().unwrap();
        let conn = etcd_conn(&server).await;
        let watches = Watches::new(conn.clone(), LINGER);
        let mut a = watches.subscribe("l/");
        let mut b = watches.subscribe("l/");
        let mut other = watches.subscribe("m/");
        assert_eq!(watches.open(), 2, "one watch per lock, shared");
        for s in [&mut a, &mut b, &mut other] {
            tokio::time::timeout(Duration::from_secs(10), s.ready())
                .await
                .expect("the watch is made");
        }
        // Subscribed before the watch existed: told to read again.
        assert_eq!(next(&mut a, 0).await, Note::Recheck);
        assert_eq!(next(&mut b, 0).await, Note::Recheck);
        assert_eq!(next(&mut other, 0).await, Note::Recheck);

        let seen = put(&conn, "l/1").await;
        put(&conn, "l/2").await;
        put(&conn, "m/1").await;
        let d1 = delete(&conn, "l/1").await;
        let d2 = delete(&conn, "l/2").await;
        let d3 = delete(&conn, "m/1").await;
        for s in [&mut a, &mut b] {
            assert_eq!(next(s, seen).await, deleted(&["l/1"], d1));
            assert_eq!(next(s, seen).await, deleted(&["l/2"], d2));
        }
        assert_eq!(next(&mut other, seen).await, deleted(&["m/1"], d3));

        // Keys deleted in one revision (a transaction, a range delete)
        // come in one note.
        put(&conn, "l/5").await;
        put(&conn, "l/6").await;
        let both = conn
            .txn(
                "test delete two",
                Retry::Any,
                Txn::new().and_then(vec![TxnOp::delete("l/6", None), TxnOp::delete("l/5", None)]),
            )
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let note = next(&mut a, d2).await;
        let Note::Deleted { keys, rev } = &note else {
            panic!("{note:?}");
        };
        assert_eq!(*rev, both);
        let mut keys: Vec<&str> = keys.iter().map(|k| &**k).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["l/5", "l/6"]);
        let _ = next(&mut b, d2).await;

        // What a read already saw is skipped.
        put(&conn, "l/3").await;
        let d4 = delete(&conn, "l/3").await;
        put(&conn, "l/4").await;
        let d5 = delete(&conn, "l/4").await;
        assert_eq!(next(&mut a, d4).await, deleted(&["l/4"], d5));
    }

    /// A watch outlives its last subscriber by its linger time, is reused
    /// within it, and closes after it; dropping the client closes the rest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_lingers_after_its_last_waiter_then_closes() {
        let server = testkit::EtcdServer::start().unwrap();
        let conn = etcd_conn(&server).await;
        let linger = Duration::from_millis(400);
        let watches = Watches::new(conn.clone(), linger);
        let mut first = watches.subscribe("l/");
        first.ready().await;
        drop(first);
        tokio::time::sleep(linger / 4).await;
        let mut again = watches.subscribe("l/");
        assert_eq!(watches.open(), 1);
        tokio::time::timeout(Duration::from_millis(50), again.ready())
            .await
            .expect("a lingering watch is ready at once");
        // Held beyond the linger time by a waiter: still open.
        tokio::time::sleep(linger * 3).await;
        assert_eq!(watches.open(), 1, "closed under a waiter");
        drop(again);
        let gone = Instant::now();
        while watches.open() > 0 {
            assert!(
                gone.elapsed() < linger * 4,
                "the idle watch stayed open past its linger time"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone.elapsed() >= linger / 2, "closed before lingering");

        let _kept = watches.subscribe("m/");
        assert_eq!(watches.open(), 1);
        let task = {
            let map = watches.shared.map();
            map.get("m/").map(|e| e.task.abort_handle()).unwrap()
        };
        drop(watches);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(task.is_finished(), "the client is gone; its watch stays");
    }

    /// When the stream breaks (the server restarts), every waiter is told
    /// to read again once the new watch exists, and deletes flow again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broken_watch_comes_back_and_tells_waiters_to_read_again() {
        let server = testkit::EtcdServer::start().unwrap();
        let conn = etcd_conn(&server).await;
        let watches = Watches::new(conn.clone(), LINGER);
        let mut sub = watches.subscribe("l/");
        sub.ready().await;
        assert_eq!(next(&mut sub, 0).await, Note::Recheck);
        server.restart().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut rechecks = 0;
        // Notes until the watch is back: at least one Recheck.
        loop {
            let note = tokio::time::timeout_at(deadline, sub.next(0))
                .await
                .expect("told to read again after the restart");
            if note == Note::Recheck {
                rechecks += 1;
                if *sub.ready.borrow() {
                    break;
                }
            }
        }
        assert!(rechecks >= 1);
        sub.ready().await;
        put(&conn, "l/1").await;
        let d = delete(&conn, "l/1").await;
        loop {
            match next(&mut sub, 0).await {
                Note::Recheck => continue,
                note => {
                    assert_eq!(note, deleted(&["l/1"], d));
                    break;
                }
            }
        }
    }
}
