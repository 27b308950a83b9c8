//! One claim per lock name per client at a time.
//!
//! A client's claim on lock `NAME` is the key `NAME/{lease id}`: one key
//! per session, as in etcd's concurrency Mutex. Two tasks of one client
//! asking for the same name would map to the same key and both believe
//! they own it, so they queue here first, in a FIFO tokio mutex per name,
//! and only the task holding the slot has a claim key in etcd. The slot is
//! held from the attempt until the claim key is gone from etcd (released,
//! reaped, cleaned up after a cancel), so a new claim can never be mistaken
//! for the previous one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use lock_core::LockName;
use tokio::sync::OwnedMutexGuard;

type Gate = Arc<tokio::sync::Mutex<()>>;

/// The slots of one client.
#[derive(Default)]
pub(crate) struct Slots {
    gates: Mutex<HashMap<LockName, Gate>>,
}

/// The right of one task to have a claim on one name.
pub(crate) struct Slot {
    guard: Option<OwnedMutexGuard<()>>,
    name: LockName,
    slots: Arc<Slots>,
}

impl Slots {
    fn gates(&self) -> MutexGuard<'_, HashMap<LockName, Gate>> {
        // Every critical section is one lookup, insert or remove.
        self.gates.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gate(&self, name: &LockName) -> Gate {
        Arc::clone(self.gates().entry(name.clone()).or_default())
    }

    /// The slot if it is free now.
    pub(crate) fn try_take(self: &Arc<Self>, name: &LockName) -> Option<Slot> {
        let guard = self.gate(name).try_lock_owned().ok();
        let slot = Slot {
            guard,
            name: name.clone(),
            slots: Arc::clone(self),
        };
        // A failed try still made the gate: dropping `slot` cleans it up.
        slot.guard.is_some().then_some(slot)
    }

    /// Waits for the slot, in arrival order.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait leaves the queue.
    pub(crate) async fn take(self: &Arc<Self>, name: &LockName) -> Slot {
        let mut slot = Slot {
            guard: None,
            name: name.clone(),
            slots: Arc::clone(self),
        };
        slot.guard = Some(self.gate(name).lock_owned().await);
        slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut gates = self.slots.gates();
        // Only the map holds the gate: nobody waits or holds; forget it so
        // the map does not grow with every name ever used.
        if gates
            .get(&self.name)
            .is_some_and(|g| Arc::strong_count(g) == 1)
        {
            gates.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_slot_per_name_and_no_leak() {
        let slots = Arc::new(Slots::default());
        let a = LockName::new("a").unwrap();
        let b = LockName::new("b").unwrap();
        let first = slots.try_take(&a).expect("free");
        assert!(slots.try_take(&a).is_none());
        let other = slots.try_take(&b).expect("another name is free");
        let waiter = tokio::spawn({
            let (slots, a) = (slots.clone(), a.clone());
            async move { slots.take(&a).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        let second = waiter.await.unwrap();
        drop(second);
        drop(other);
        assert!(slots.gates().is_empty(), "gates leaked");
    }
}
