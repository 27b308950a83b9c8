//! What a client keeps per held lock, and the expiry of leases that are not
//! renewed.
//!
//! A ZooKeeper node lives as long as its session, but a lease still ends at
//! its TTL: a holding not renewed by `sent_at + ttl` is deleted by the
//! client. One expiry task per client (not one per lock) sleeps until the
//! earliest such time, so taking a lock spawns nothing and costs only two
//! map entries; the task is woken early only when a holding expires before
//! the time it planned to look next.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use lock_core::{ClockPolicy, FencingToken, OwnerToken};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::session::Session;

/// One held lock.
pub(crate) struct Held {
    pub(crate) owner: OwnerToken,
    pub(crate) fence: FencingToken,
    /// When the server-side lease ends unless renewed: `sent_at + ttl` of
    /// the last acquire or renew.
    pub(crate) expires: Instant,
    /// Tells apart holdings that expire at the same instant in `expiry`.
    id: u64,
    pub(crate) session: Arc<Session>,
    /// A release's delete got no clear answer: it may have landed, so a
    /// later attempt that finds no node is that release, not a loss.
    pub(crate) release_sent: bool,
    /// The clock policy the holding was granted under (its follower lag
    /// included): a renewal's deadline is never later than it gives, also
    /// for a lease that arrives with a laxer policy (one side of a
    /// migration lock carries the composite's).
    pub(crate) policy: ClockPolicy,
}

/// The holdings of one client by node path, with their expiry order.
///
/// The path is one allocation shared by the map, the expiry order and the
/// lease's backend key.
#[derive(Default)]
pub(crate) struct Holdings {
    by_path: HashMap<Arc<str>, Held>,
    expiry: BTreeMap<(Instant, u64), Arc<str>>,
    next_id: u64,
    /// When the expiry task looks next; `None` while no task runs.
    planned: Option<Instant>,
    /// Which start of the expiry task is the current one.
    generation: u64,
}

/// What the caller of [`Holdings::insert`] must do for the expiry task.
#[must_use]
pub(crate) enum Expiry {
    /// Nothing: the task looks before this holding expires.
    Planned,
    /// The task sleeps past this holding's expiry: wake it.
    Wake,
    /// No task runs: start one with this generation.
    Start(u64),
}

impl Holdings {
    pub(crate) fn get(&self, path: &str) -> Option<&Held> {
        self.by_path.get(path)
    }

    /// Records a new holding.
    pub(crate) fn insert(
        &mut self,
        path: Arc<str>,
        owner: OwnerToken,
        fence: FencingToken,
        expires: Instant,
        session: Arc<Session>,
        policy: ClockPolicy,
    ) -> Expiry {
        let id = self.next_id;
        self.next_id += 1;
        self.expiry.insert((expires, id), path.clone());
        let old = self.by_path.insert(
            path,
            Held {
                owner,
                fence,
                expires,
                id,
                session,
                release_sent: false,
                policy,
            },
        );
        if let Some(old) = old {
            // A path names one attempt (its uuid), so this does not
            // happen; if it did, the old entry must not expire the new.
            self.expiry.remove(&(old.expires, old.id));
        }
        match self.planned {
            None => {
                self.generation += 1;
                self.planned = Some(expires);
                Expiry::Start(self.generation)
            }
            Some(at) if expires < at => {
                self.planned = Some(expires);
                Expiry::Wake
            }
            Some(_) => Expiry::Planned,
        }
    }

    /// Records whether a release of the holding at `path` may have landed.
    pub(crate) fn set_release_sent(&mut self, path: &str, sent: bool) {
        if let Some(h) = self.by_path.get_mut(path) {
            h.release_sent = sent;
        }
    }

    /// Forgets a holding (released, or found lost).
    pub(crate) fn remove(&mut self, path: &str) -> Option<(Arc<str>, Held)> {
        let (path, held) = self.by_path.remove_entry(path)?;
        self.expiry.remove(&(held.expires, held.id));
        Some((path, held))
    }

    /// Moves the expiry of the holding at `path` to `expires`, if it is
    /// still the holding with `fence` and has not expired yet; never
    /// earlier: of two renewals in flight at once (the watchdog's and one
    /// by hand), the one sent first may be answered last, and the holder
    /// keeps the later deadline. Answers the clock policy the holding was
    /// granted under, `None` when nothing moved.
    pub(crate) fn extend(
        &mut self,
        path: &str,
        fence: FencingToken,
        expires: Instant,
    ) -> Option<ClockPolicy> {
        let h = self.by_path.get_mut(path)?;
        if h.fence != fence || h.expires <= Instant::now() {
            return None;
        }
        let key = self.expiry.remove(&(h.expires, h.id))?;
        h.expires = expires.max(h.expires);
        let expires = h.expires;
        self.expiry.insert((expires, h.id), key);
        // Later than before, so the task's plan stays right.
        Some(h.policy)
    }

    /// Takes out every holding whose expiry is at or before `now`, and
    /// plans the task's next look (`None`: nothing left, the task ends).
    fn take_due(&mut self, now: Instant) -> (Vec<(Arc<str>, Held)>, Option<Instant>) {
        let mut due = Vec::new();
        while let Some(entry) = self.expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let path = entry.remove();
            if let Some(h) = self.by_path.remove(&path) {
                due.push((path, h));
            }
        }
        let next = self.expiry.first_key_value().map(|((at, _), _)| *at);
        self.planned = next;
        (due, next)
    }

    /// The expiry task of `generation` stopped without planning a look
    /// (its runtime shut down): the next holding starts a new one.
    fn task_gone(&mut self, generation: u64) {
        if self.generation == generation {
            self.planned = None;
        }
    }
}

/// Where the expiry task finds the client's holdings, and what it does with
/// an expired one. The task holds the client only weakly, so dropping the
/// client still closes its sessions.
pub(crate) trait Owner: Send + Sync + 'static {
    /// The client's holdings.
    fn holdings(&self) -> std::sync::MutexGuard<'_, Holdings>;
    /// Deletes the node of a holding whose lease ran out (the holding is
    /// already out of the map).
    fn expired(self: Arc<Self>, path: Arc<str>, held: Held);
}

/// Starts the expiry task of `generation` for `owner`; `wake` wakes it
/// early (see [`Expiry::Wake`]).
pub(crate) fn start<O: Owner>(owner: &Arc<O>, wake: Arc<Notify>, generation: u64) {
    struct Ends<O: Owner>(std::sync::Weak<O>, u64);
    impl<O: Owner> Drop for Ends<O> {
        fn drop(&mut self) {
            if let Some(o) = self.0.upgrade() {
                o.holdings().task_gone(self.1);
            }
        }
    }
    let weak = Arc::downgrade(owner);
    tokio::spawn(async move {
        let ends = Ends(weak, generation);
        loop {
            let next = {
                let Some(owner) = ends.0.upgrade() else {
                    return;
                };
                let (due, next) = owner.holdings().take_due(Instant::now());
                for (path, held) in due {
                    owner.clone().expired(path, held);
                }
                match next {
                    Some(at) => at,
                    None => return,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = wake.notified() => {}
            }
        }
    });
}
