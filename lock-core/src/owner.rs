//! Explicit, owner-scoped reentrancy.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use crate::held::Held;
use crate::name::LockName;
use crate::token::OwnerToken;

/// A logical holder that may take the same lock more than once.
///
/// Reentrancy in polylock is explicit and never tied to a thread: locks taken
/// with the same `Owner` (see [`LockBuilder::owner`](crate::LockBuilder::owner))
/// share one network lease per name and count holds. The lock is released on
/// the server when the last hold is released. Without an owner every acquire
/// is a new holder, so two tasks never share a lock by accident.
///
/// One owner's acquisitions of one name (on one backend) take turns, so two
/// first acquisitions cannot both go to the network; acquisitions of other
/// names, and re-entry into a lease the owner holds, never wait for them.
///
/// Clones are the same owner.
#[derive(Clone)]
pub struct Owner {
    pub(crate) token: OwnerToken,
    pub(crate) registry: Arc<Registry>,
}

/// Which backend a lease lives on: the address of its shared client, so
/// one owner used with two lockers never mixes their leases.
pub(crate) type BackendId = usize;

type Key = (BackendId, LockName);

/// The leases an owner holds, by backend and name.
#[derive(Default)]
pub(crate) struct Registry {
    held: Mutex<HashMap<Key, Weak<Held>>>,
    /// One turn per (backend, name) being acquired; dead entries are swept
    /// once the map has doubled since the last sweep.
    gates: Mutex<Gates>,
}

#[derive(Default)]
struct Gates {
    map: HashMap<Key, Weak<tokio::sync::Mutex<()>>>,
    swept_len: usize,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(BackendId, LockName), Weak<Held>>> {
        // Each operation is a single insert, lookup or remove: a poisoned map
        // is still consistent.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a hold to the live lease of `name`, if there is one.
    pub(crate) fn reenter(&self, backend: BackendId, name: &LockName) -> Option<Arc<Held>> {
        let key = (backend, name.clone());
        let mut map = self.map();
        let held = map.get(&key).and_then(Weak::upgrade);
        match held {
            Some(h) if h.add_hold() => Some(h),
            _ => {
                map.remove(&key);
                None
            }
        }
    }

    /// The turn of this owner's acquisitions of `name` on `backend`.
    pub(crate) fn gate(&self, backend: BackendId, name: &LockName) -> Arc<tokio::sync::Mutex<()>> {
        // Plain map operations only: a poisoned map is still consistent.
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        if gates.map.len() >= 2 * gates.swept_len.max(64) {
            gates.map.retain(|_, g| g.strong_count() > 0);
            gates.swept_len = gates.map.len();
        }
        let slot = gates.map.entry((backend, name.clone())).or_default();
        match slot.upgrade() {
            Some(gate) => gate,
            None => {
                let gate = Arc::default();
                *slot = Arc::downgrade(&gate);
                gate
            }
        }
    }

    pub(crate) fn insert(&self, backend: BackendId, name: LockName, held: &Arc<Held>) {
        self.map().insert((backend, name), Arc::downgrade(held));
    }

    /// Forgets the entry if it still points at `held`.
    pub(crate) fn remove(&self, backend: BackendId, name: &LockName, held: &Held) {
        let key = (backend, name.clone());
        let mut map = self.map();
        if map
            .get(&key)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), held as *const Held))
        {
            map.remove(&key);
        }
    }
}

impl Owner {
    /// A new owner with a fresh random token.
    pub fn new() -> Self {
        Owner {
            token: OwnerToken::random(),
            registry: Arc::default(),
        }
    }

    /// The token this owner's leases are stored under.
    pub fn token(&self) -> OwnerToken {
        self.token
    }
}

impl Default for Owner {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner").field("token", &self.token).finish()
    }
}
