//! The session: one etcd lease per client and TTL, kept alive in the
//! background and shared by every lock the client holds with that TTL.
//!
//! # Why one lease for many locks
//! Renewal then costs one keepalive every TTL/3 per session, whatever the
//! number of locks held: a watchdog's `renew` does not send a keepalive of
//! its own; it waits for the session's next one (nudging it if none is
//! coming soon) and reports it. This is the model of etcd's own
//! `concurrency.Session`.
//!
//! # Time
//! A keepalive answered by etcd with TTL > 0 proves the lease lives until
//! at least `sent + TTL`, where `sent` is when the request LEFT (the leader
//! resets the lease when it receives the request, which is later). So every
//! lease handed out is dated from the send time of the session's latest
//! answered keepalive (or of the grant), never from a reply.
//!
//! # Locks that are not renewed
//! The lease outlives any one lock, so a lock that its holder stops
//! renewing would otherwise be kept alive by the other locks' keepalives.
//! The session therefore also expires locks itself: each held lock has an
//! expiry (`sent + TTL` of the latest renewal reported for it), and past it
//! the session deletes the key. A process that dies or freezes stops the
//! keepalives, and etcd expires the lease and every key attached to it.
//!
//! # Loss
//! If no keepalive is answered before the local deadline of the latest
//! answered one, or etcd answers TTL 0 (revoked or expired), the session is
//! lost: every lock on it reports `Lost` from then on, its keys are given
//! up (best-effort revoke), and the next acquisition starts a new session.
//!
//! A lease revoked by someone else (`etcdctl lease revoke`, an operator
//! tool) is noticed at once rather than at the next keepalive: each session
//! puts one key of its own attached to its lease, `{prefix}\0polylock-session/{id}`,
//! and watches its deletion, which etcd performs exactly when the lease is
//! revoked or expires. (A NUL cannot occur in a lock name, so this key is
//! never a claim of any lock.) Every lease handed out on a session carries
//! the session's revocation token ([`Session::revocation`]), cancelled the
//! moment the session is known to be over, so guards learn of the loss
//! without waiting for their next renewal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp};
use futures::future::BoxFuture;
use futures::FutureExt;
use lock_core::{ClockPolicy, LockError, OwnerToken};
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;

use crate::conn::{Conn, Retry};
use crate::errors::{is_lease_gone, lease_gone};
use crate::queue::{self, WatchEnd};
use crate::slot::Slot;

/// How long a session with no locks and no acquisition in progress lives
/// on, at least. Sessions are per TTL, so an application that used many
/// TTLs once does not keep a keepalive stream for each forever.
const IDLE_MIN: Duration = Duration::from_secs(30);

/// The session's view of its lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseState {
    /// When the latest keepalive (or the grant) that etcd answered with a
    /// live lease was sent.
    pub(crate) last_ok_sent: Instant,
    /// The TTL etcd reported in that answer.
    pub(crate) ttl: Duration,
    /// The session is over (lost, idle-closed or shut down).
    pub(crate) closed: bool,
}

/// A lock held on this session.
pub(crate) struct HeldLock {
    create_rev: i64,
    owner: OwnerToken,
    /// The session deletes the key at this instant unless it is renewed.
    expires: Instant,
    /// Held until the key is gone from etcd (see [`crate::slot`]).
    slot: Option<Slot>,
}

struct Locks {
    closed: bool,
    /// Acquisitions in progress on this session.
    users: usize,
    held: HashMap<String, HeldLock>,
}

/// Public numbers about one session, for operators, tests and benchmarks.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// The etcd lease id (the suffix of this session's lock keys, in hex).
    pub lease_id: i64,
    /// The TTL etcd granted, in whole seconds.
    pub ttl: Duration,
    /// Keepalive requests sent so far (stream openings included).
    pub keepalives_sent: u64,
    /// Locks held on this session now.
    pub held: usize,
}

pub(crate) struct Session {
    pub(crate) id: i64,
    /// The TTL this session serves, as asked (sessions are keyed by it).
    pub(crate) asked_secs: u64,
    conn: Conn,
    state: watch::Sender<LeaseState>,
    /// The latest instant a renew needs a keepalive sent after.
    want_after: Mutex<Option<Instant>>,
    nudge: Notify,
    locks: Mutex<Locks>,
    /// Cancelled when the session is over, for whoever waits on it.
    gone: CancellationToken,
    keepalives: AtomicU64,
}

/// An acquisition in progress on a session; keeps it from idling out.
pub(crate) struct SessionUse(Arc<Session>);

impl Drop for SessionUse {
    fn drop(&mut self) {
        let mut locks = self.0.locks();
        locks.users = locks.users.saturating_sub(1);
    }
}

/// The session is over; the slot comes back to the caller.
pub(crate) struct Closed(pub(crate) Option<Slot>);

fn policy() -> ClockPolicy {
    ClockPolicy::default()
}

impl Session {
    /// Grants a lease of `secs` and starts its keepalive task.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped grant may leave an unused lease, which
    /// etcd expires after its TTL.
    pub(crate) async fn start(
        conn: Conn,
        secs: u64,
        prefix: &str,
    ) -> Result<Arc<Session>, LockError> {
        let sent = Instant::now();
        let asked = i64::try_from(secs).unwrap_or(i64::MAX);
        let (id, granted) = conn.grant(asked).await?;
        // Capped: a TTL no lock can ask for is a broken answer, and would
        // overflow the deadlines computed from it.
        let ttl =
            Duration::from_secs(u64::try_from(granted.max(1)).unwrap_or(1)).min(lock_core::MAX_TTL);
        let session = Arc::new(Session {
            id,
            asked_secs: secs,
            conn,
            state: watch::Sender::new(LeaseState {
                last_ok_sent: sent,
                ttl,
                closed: false,
            }),
            want_after: Mutex::new(None),
            nudge: Notify::new(),
            locks: Mutex::new(Locks {
                closed: false,
                users: 0,
                held: HashMap::new(),
            }),
            gone: CancellationToken::new(),
            keepalives: AtomicU64::new(0),
        });
        tracing::debug!(lease = id, ttl = ?ttl, "polylock: etcd session started");
        tokio::spawn(Arc::clone(&session).keep_alive());
        tokio::spawn(Arc::clone(&session).watch_lease(sentinel_key(prefix, id)));
        Ok(session)
    }

    fn locks(&self) -> MutexGuard<'_, Locks> {
        // Critical sections are single map operations and flag updates.
        self.locks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn state(&self) -> LeaseState {
        *self.state.borrow()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.gone.is_cancelled()
    }

    /// The token cancelled when the session is over (lost, revoked, shut
    /// down), for the leases handed out on it: see
    /// [`Lease::with_revocation`](lock_core::Lease::with_revocation).
    pub(crate) fn revocation(&self) -> CancellationToken {
        self.gone.clone()
    }

    /// Completes when the session is over.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn closed(&self) {
        self.gone.cancelled().await
    }

    /// Marks an acquisition in progress; `None` if the session is over.
    pub(crate) fn begin_use(self: &Arc<Self>) -> Option<SessionUse> {
        let mut locks = self.locks();
        if locks.closed {
            return None;
        }
        locks.users += 1;
        Some(SessionUse(Arc::clone(self)))
    }

    pub(crate) fn info(&self) -> SessionInfo {
        SessionInfo {
            lease_id: self.id,
            ttl: self.state().ttl,
            keepalives_sent: self.keepalives.load(Ordering::Relaxed),
            held: self.locks().held.len(),
        }
    }

    /// Records a lock just acquired on this session, expiring at the
    /// current lease's end unless renewed. Returns the lease state to date
    /// the lock from; `Err` with the slot if the session is over.
    pub(crate) fn register(
        &self,
        key: String,
        create_rev: i64,
        owner: OwnerToken,
        slot: Option<Slot>,
    ) -> Result<LeaseState, Closed> {
        let mut locks = self.locks();
        // Read under the locks mutex: a loss sets `closed` under it too, so
        // either this lock is cleared by the loss or it is refused here.
        let state = self.state();
        if locks.closed || state.closed {
            return Err(Closed(slot));
        }
        locks.held.insert(
            key,
            HeldLock {
                create_rev,
                owner,
                expires: state.last_ok_sent + state.ttl,
                slot,
            },
        );
        // No need to wake the keepalive task: the new expiry is a TTL after
        // the latest keepalive, and the task wakes for the next keepalive
        // (TTL/3 after it) before that, and then schedules the reap.
        Ok(state)
    }

    /// Whether this session holds `key` for `owner` at `create_rev`.
    pub(crate) fn holds(&self, key: &str, owner: OwnerToken, create_rev: i64) -> bool {
        self.locks()
            .held
            .get(key)
            .is_some_and(|h| h.owner == owner && h.create_rev == create_rev)
    }

    /// Moves the expiry of a held lock; false if it is not held any more.
    pub(crate) fn extend(&self, key: &str, create_rev: i64, expires: Instant) -> bool {
        let mut locks = self.locks();
        match locks.held.get_mut(key) {
            Some(h) if h.create_rev == create_rev => {
                h.expires = h.expires.max(expires);
                true
            }
            _ => false,
        }
    }

    /// Forgets a held lock whose key is gone from etcd (released, or found
    /// missing), freeing its slot. Only the exact holding (key, revision
    /// and owner) is forgotten: a forged or stale lease presented to this
    /// client must not drop the real holder's entry.
    pub(crate) fn forget(&self, key: &str, create_rev: i64, owner: OwnerToken) {
        let removed = {
            let mut locks = self.locks();
            match locks.held.get(key) {
                Some(h) if h.create_rev == create_rev && h.owner == owner => locks.held.remove(key),
                _ => None,
            }
        };
        // The slot is released here, outside the session's mutex.
        drop(removed);
    }

    /// Waits for a keepalive sent after `after` to be answered, asking the
    /// keepalive task to send one now if none is in flight. `Err` if the
    /// session ends or `until` passes first.
    ///
    /// # Cancel safety
    /// Cancel safe: at worst one keepalive is sent that nobody waits for.
    pub(crate) async fn keepalive_after(
        &self,
        after: Instant,
        until: Instant,
    ) -> Result<LeaseState, ()> {
        let mut rx = self.state.subscribe();
        let mut asked = false;
        loop {
            let st = *rx.borrow_and_update();
            if st.closed {
                return Err(());
            }
            if st.last_ok_sent > after {
                return Ok(st);
            }
            if !asked {
                {
                    let mut want = self.want_after.lock().unwrap_or_else(|p| p.into_inner());
                    *want = Some(want.map_or(after, |w| w.max(after)));
                }
                self.nudge.notify_one();
                asked = true;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return Err(()) },
                _ = sleep_until(until) => return Err(()),
            }
        }
    }

    /// Ends the session because etcd no longer knows its lease (a request
    /// attached to it was refused): its locks are lost.
    pub(crate) fn expired(&self) {
        self.close("etcd no longer knows the session lease");
    }

    /// Ends the session from outside (the client is dropped): stops the
    /// keepalives and revokes the lease, which deletes its keys.
    pub(crate) fn shutdown(self: &Arc<Self>) {
        if self.close("the client was dropped") {
            self.spawn_revoke();
        }
    }

    /// Marks the session over and clears its locks. Returns whether this
    /// call closed it.
    fn close(&self, why: &str) -> bool {
        self.close_unless(why, |_| false)
    }

    /// [`close`](Self::close), unless `keep` says otherwise, judged under
    /// the same hold of the locks mutex that marks the session closed.
    fn close_unless(&self, why: &str, keep: impl FnOnce(&Locks) -> bool) -> bool {
        let held = {
            let mut locks = self.locks();
            if locks.closed || keep(&locks) {
                return false;
            }
            locks.closed = true;
            std::mem::take(&mut locks.held)
        };
        self.state.send_modify(|s| s.closed = true);
        self.gone.cancel();
        if !held.is_empty() {
            tracing::warn!(
                lease = self.id,
                locks = held.len(),
                reason = why,
                "polylock: etcd session lost; its locks are lost"
            );
        } else {
            tracing::debug!(
                lease = self.id,
                reason = why,
                "polylock: etcd session closed"
            );
        }
        // Dropping the held locks frees their slots: later acquisitions use
        // a new session, hence new keys, so nothing can be confused.
        drop(held);
        true
    }

    /// Revokes the lease in the background, best effort: if etcd is
    /// unreachable, the lease expires by itself after its TTL.
    fn spawn_revoke(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (conn, id) = (self.conn.clone(), self.id);
        rt.spawn(async move {
            if let Err(e) = conn.revoke(id).await {
                tracing::debug!(lease = id, error = %e, "polylock: revoking the etcd session lease failed");
            }
        });
    }

    /// Deletes the keys of locks whose expiry passed; returns the earliest
    /// expiry left.
    fn reap(self: &Arc<Self>) -> Option<Instant> {
        let now = Instant::now();
        let (expired, next) = {
            let mut locks = self.locks();
            let keys: Vec<String> = locks
                .held
                .iter()
                .filter(|(_, h)| h.expires <= now)
                .map(|(k, _)| k.clone())
                .collect();
            let expired: Vec<(String, HeldLock)> = keys
                .into_iter()
                .filter_map(|k| locks.held.remove_entry(&k))
                .collect();
            let next = locks.held.values().map(|h| h.expires).min();
            (expired, next)
        };
        for (key, held) in expired {
            tracing::debug!(lease = self.id, key = %key, "polylock: lock not renewed before its TTL; deleting it");
            spawn_cleanup(
                self.conn.clone(),
                Arc::clone(self),
                key,
                Cleanup::Revision(held.create_rev),
                held.slot,
            );
        }
        next
    }

    /// Closes the session if it is idle: no lock held, no acquisition going
    /// on. Checked and closed under the locks mutex, so no acquisition can
    /// start on it meanwhile.
    fn close_if_idle(&self) -> bool {
        self.close_unless("idle", |locks| locks.users > 0 || !locks.held.is_empty())
    }

    fn is_idle(&self) -> bool {
        let locks = self.locks();
        locks.users == 0 && locks.held.is_empty()
    }

    /// The keepalive task. Sends a keepalive TTL/3 after the latest
    /// answered one (or at once when a renew asks), retries failures with
    /// backoff on a fresh stream, reaps unrenewed locks, and ends the
    /// session at the local deadline, on TTL 0, when idle, or on shutdown.
    async fn keep_alive(self: Arc<Self>) {
        let mut conn: Option<KeepAlive> = None;
        let mut inflight: Option<(Instant, BoxFuture<'static, Exchange>)> = None;
        let mut retry_at: Option<Instant> = None;
        let mut pause = Duration::from_millis(25);
        let mut idle_since: Option<Instant> = None;
        loop {
            let st = self.state();
            if st.closed {
                return;
            }
            let now = Instant::now();
            let deadline = policy().deadline(st.last_ok_sent, st.ttl);
            if now >= deadline {
                self.close("no keepalive was answered before the local deadline");
                self.spawn_revoke();
                return;
            }
            let next_reap = self.reap();
            // Idle sessions close after a while (never while in use).
            let idle_after = IDLE_MIN.max(st.ttl * 2);
            if self.is_idle() {
                let since = *idle_since.get_or_insert(now);
                if now >= since + idle_after && self.close_if_idle() {
                    self.spawn_revoke();
                    return;
                }
            } else {
                idle_since = None;
            }
            let idle_check = idle_since.map(|s| s + idle_after);
            let due = retry_at.unwrap_or(st.last_ok_sent + st.ttl / 3);
            let idle = inflight.is_none();
            let wake = {
                let answer = async {
                    match inflight.as_mut() {
                        Some((_, fut)) => fut.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    _ = self.gone.cancelled() => return,
                    ex = answer => Wake::Answer(ex),
                    _ = sleep_until(deadline) => Wake::Tick,
                    _ = sleep_until(due), if idle => Wake::Send,
                    _ = self.nudge.notified(), if idle => Wake::Nudged,
                    _ = sleep_until_opt(next_reap) => Wake::Tick,
                    _ = sleep_until_opt(idle_check) => Wake::Tick,
                }
            };
            match wake {
                Wake::Tick => {}
                Wake::Nudged => {
                    let wanted = self
                        .want_after
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_some_and(|w| w >= st.last_ok_sent);
                    if wanted {
                        inflight = Some(self.send(conn.take(), &st));
                    }
                }
                Wake::Send => inflight = Some(self.send(conn.take(), &st)),
                Wake::Answer(ex) => {
                    let (sent, _) = inflight.take().expect("an answer comes from a request");
                    match ex {
                        Exchange::Alive(ttl, c) => {
                            conn = Some(c);
                            retry_at = None;
                            pause = Duration::from_millis(25);
                            self.state.send_modify(|s| {
                                if sent > s.last_ok_sent {
                                    s.last_ok_sent = sent;
                                }
                                if let Some(ttl) = ttl {
                                    s.ttl = ttl;
                                }
                            });
                        }
                        Exchange::Gone => {
                            self.close("etcd reports the session lease revoked or expired");
                            return;
                        }
                        Exchange::Failed(why) => {
                            tracing::debug!(lease = self.id, error = %why, "polylock: etcd keepalive failed; retrying on a new stream");
                            let now = Instant::now();
                            retry_at = Some(now + pause);
                            pause = (pause * 2).min(st.ttl / 6).max(Duration::from_millis(25));
                        }
                    }
                }
            }
        }
    }

    /// Puts the session's sentinel key on its lease and watches its
    /// deletion: etcd deletes it exactly when the lease is revoked or
    /// expires, so the session ends then, not at the next keepalive. A
    /// deletion while the lease lives (by hand) puts the key back.
    async fn watch_lease(self: Arc<Self>, key: String) {
        let mut pause = Duration::from_millis(50);
        let mut watching_from: Option<i64> = None;
        loop {
            if self.is_closed() {
                return;
            }
            let step = async {
                let rev = match watching_from {
                    Some(rev) => rev,
                    None => match put_sentinel(&self.conn, &key, self.id).await {
                        Ok(rev) => rev,
                        Err(e) if lease_gone(&e) => return Err(true),
                        Err(_) => return Err(false),
                    },
                };
                watching_from = Some(rev);
                match queue::wait_deleted(&self.conn, &key, rev).await {
                    // Deleted, or the watch ended without telling: does the
                    // lease still live?
                    Ok(WatchEnd::Deleted | WatchEnd::Recheck) => {}
                    Err(_) => return Err(false),
                }
                match self.conn.time_to_live(self.id).await {
                    Ok(r) if r.ttl() > 0 => {
                        // Alive: put the key back (it may have been deleted
                        // by hand) and watch again from there.
                        watching_from = None;
                        Ok(())
                    }
                    // Gone (etcd answers -1). A live lease with less than a
                    // second left answers 0 (whole seconds, truncated):
                    // asked again after a pause, or the keepalive decides.
                    Ok(r) if r.ttl() < 0 => Err(true),
                    Ok(_) => Err(false),
                    Err(e) if lease_gone(&e) => Err(true),
                    Err(_) => Err(false),
                }
            };
            let outcome = tokio::select! {
                _ = self.gone.cancelled() => return,
                o = step => o,
            };
            match outcome {
                Ok(()) => pause = Duration::from_millis(50),
                Err(true) => {
                    self.close("etcd revoked or expired the session lease");
                    return;
                }
                Err(false) => {
                    tokio::select! {
                        _ = self.gone.cancelled() => return,
                        _ = sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Starts one keepalive exchange; opening the stream counts as one.
    fn send(
        &self,
        conn: Option<KeepAlive>,
        st: &LeaseState,
    ) -> (Instant, BoxFuture<'static, Exchange>) {
        self.keepalives.fetch_add(1, Ordering::Relaxed);
        // An exchange that hangs (a paused member, a blackholed link) is
        // abandoned well before the deadline, so the retry can reach
        // another member on a fresh stream.
        let limit = (st.ttl / 4)
            .max(Duration::from_millis(200))
            .min(self.conn.op_timeout());
        let sent = Instant::now();
        let fut = exchange(self.conn.clone(), self.id, conn, limit).boxed();
        (sent, fut)
    }
}

/// The key a session keeps on its lease to learn of the lease's end; see
/// the module docs.
pub(crate) fn sentinel_key(prefix: &str, id: i64) -> String {
    format!("{prefix}\0polylock-session/{id:x}")
}

/// Puts the sentinel `key` on lease `id`; the revision of the put.
///
/// # Cancel safety
/// Cancel safe: a put of the same empty value, repeatable.
async fn put_sentinel(conn: &Conn, key: &str, id: i64) -> Result<i64, LockError> {
    let txn = Txn::new().and_then(vec![TxnOp::put(
        key,
        "",
        Some(PutOptions::new().with_lease(id)),
    )]);
    let r = conn
        .txn("watching the session lease", Retry::Any, txn)
        .await?;
    r.header().map(|h| h.revision()).ok_or_else(|| {
        crate::errors::unexpected("watching the session lease", "the answer has no header")
    })
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// An open keepalive stream (boxed: it is large and moves around).
type KeepAlive = Box<(LeaseKeeper, LeaseKeepAliveStream)>;

enum Wake {
    Answer(Exchange),
    Send,
    Nudged,
    Tick,
}

enum Exchange {
    /// The lease lives; the TTL etcd reported (unknown on a stream opening,
    /// whose answer etcd-client consumes).
    Alive(Option<Duration>, KeepAlive),
    /// etcd says the lease does not exist.
    Gone,
    /// No answer (error, closed stream, timeout): try again on a new stream.
    Failed(String),
}

async fn exchange(conn: Conn, id: i64, stream: Option<KeepAlive>, limit: Duration) -> Exchange {
    let attempt = async move {
        match stream {
            None => match conn.keep_alive(id).await {
                Ok(c) => Exchange::Alive(None, Box::new(c)),
                Err(e) if is_lease_gone(&e) => Exchange::Gone,
                Err(e) => Exchange::Failed(e.to_string()),
            },
            Some(open) => {
                let (mut keeper, mut stream) = *open;
                if let Err(e) = keeper.keep_alive().await {
                    return Exchange::Failed(e.to_string());
                }
                match stream.message().await {
                    Ok(Some(r)) if r.ttl() > 0 => {
                        let ttl =
                            Duration::from_secs(r.ttl().unsigned_abs()).min(lock_core::MAX_TTL);
                        Exchange::Alive(Some(ttl), Box::new((keeper, stream)))
                    }
                    Ok(Some(_)) => Exchange::Gone,
                    Ok(None) => Exchange::Failed("the keepalive stream closed".into()),
                    Err(e) if is_lease_gone(&e) => Exchange::Gone,
                    Err(e) => Exchange::Failed(e.to_string()),
                }
            }
        }
    };
    match timeout(limit, attempt).await {
        Ok(ex) => ex,
        Err(_) => Exchange::Failed(format!("no keepalive answer within {limit:?}")),
    }
}

/// How a cleanup recognises the key it may delete.
#[derive(Clone, Debug)]
pub(crate) enum Cleanup {
    /// The key's create revision is known.
    Revision(i64),
    /// Only the value written is known (the create's answer never came).
    Value(String),
}

/// Deletes `key` in the background if it is still the claim described by
/// `how`, retrying until it is gone or the session is over (then etcd
/// deletes it with the lease). Holds `slot` until done.
pub(crate) fn spawn_cleanup(
    conn: Conn,
    session: Arc<Session>,
    key: String,
    how: Cleanup,
    slot: Option<Slot>,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        // No runtime: the key goes with the session lease.
        return;
    };
    rt.spawn(async move {
        let slot = slot;
        let mut pause = Duration::from_millis(20);
        loop {
            match delete_claim(&conn, &key, &how).await {
                Ok(false) if matches!(how, Cleanup::Value(_)) => {
                    drop(slot);
                    look_again_later(&conn, &session, &key, &how).await;
                    return;
                }
                Ok(_) => return,
                Err(e) if e.is_retryable() && !session.is_closed() => {
                    tracing::debug!(key = %key, error = %e, "polylock: deleting an etcd claim failed; retrying");
                    tokio::select! {
                        _ = session.closed() => return,
                        _ = sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, "polylock: could not delete an etcd claim; it goes with the session lease");
                    return;
                }
            }
        }
    });
}

/// After a cleanup of a create whose answer never came found nothing: the
/// create may still be applied (a member that held it resumes and passes
/// it on), and the claim would then stand in the queue, held by nobody, for
/// as long as the session lives. Looks again a few times (after one, two,
/// four and eight operation timeouts), deleting it by its value, which no
/// other claim has. The client's own next acquisition of the name removes
/// such a claim too (`queue::create`).
async fn look_again_later(conn: &Conn, session: &Session, key: &str, how: &Cleanup) {
    let mut after = conn.op_timeout();
    for _ in 0..4 {
        tokio::select! {
            _ = session.closed() => return,
            _ = sleep(after) => {}
        }
        if let Ok(true) = delete_claim(conn, key, how).await {
            tracing::debug!(
                key,
                "polylock: deleted a claim whose create landed after its cleanup"
            );
            return;
        }
        after *= 2;
    }
}

/// Deletes `key` if it is the claim described by `how`; returns whether it
/// deleted something.
///
/// # Cancel safety
/// Cancel safe: the delete happened or not.
pub(crate) async fn delete_claim(conn: &Conn, key: &str, how: &Cleanup) -> Result<bool, LockError> {
    let cmp = match how {
        Cleanup::Revision(rev) => Compare::create_revision(key, CompareOp::Equal, *rev),
        Cleanup::Value(v) => Compare::value(key, CompareOp::Equal, v.as_bytes()),
    };
    let txn = Txn::new()
        .when(vec![cmp])
        .and_then(vec![TxnOp::delete(key, None)]);
    // Not repeatable for force_release, which looks for the next holder
    // when this answers false.
    Ok(conn
        .txn("deleting a claim", Retry::NotSent, txn)
        .await?
        .succeeded())
}
