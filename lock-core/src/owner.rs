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
/// Clones are the same owner.
#[derive(Clone)]
pub struct Owner {
    pub(crate) token: OwnerToken,
    pub(crate) registry: Arc<Registry>,
    /// Serializes this owner's acquisitions, so two first acquisitions of
    /// one name by one owner cannot both go to the network.
    pub(crate) acquiring: Arc<tokio::sync::Mutex<()>>,
}

/// Which backend a lease lives on: the address of its shared client, so
/// one owner used with two lockers never mixes their leases.
pub(crate) type BackendId = usize;

/// The leases an owner holds, by backend and name.
#[derive(Default)]
pub(crate) struct Registry {
    held: Mutex<HashMap<(BackendId, LockName), Weak<Held>>>,
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
            acquiring: Arc::default(),
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
