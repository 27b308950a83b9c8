//! One acquire at a time per lock name and owner, within one client.
//!
//! A backend that recovers the grant of an attempt whose answer it never
//! saw (a timeout, a broken connection, a dropped future) recognises that
//! grant by the owner token alone. An explicit [`Owner`](crate::Owner) uses
//! one token for all its acquisitions, so a second acquisition of the same
//! name under the same owner would look just like that recovery, and could
//! take over, or later free, a grant that is not its own. Backends keep the
//! two apart by letting one attempt (with whatever cleans up after it) run
//! at a time per name and owner: an attempt takes a [`Turn`] before it sends
//! and keeps it until its outcome is settled.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_core::{turns::Turns, LockName, OwnerToken};
//!
//! let turns = Turns::default();
//! let (name, owner) = (LockName::new("jobs").unwrap(), OwnerToken::random());
//! let first = turns.take(&name, owner).await;
//! // A second attempt under the same name and owner waits for the first.
//! let second = turns.take(&name, owner);
//! tokio::pin!(second);
//! assert!(futures::poll!(second.as_mut()).is_pending());
//! drop(first);
//! let _second = second.await;
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::{LockName, OwnerToken};

type Key = (LockName, OwnerToken);
type Gate = Arc<tokio::sync::Mutex<()>>;
type Gates = Arc<Mutex<HashMap<Key, Gate>>>;

/// Where one client's acquisitions of a name under one owner take turns.
/// Cloning shares the turns. An entry lives only while a turn is taken or
/// awaited, so the map stays as small as the attempts in flight.
#[derive(Clone, Default)]
pub struct Turns {
    gates: Gates,
}

impl Turns {
    /// Waits for the turn of `name` under `owner`; held until the returned
    /// [`Turn`] is dropped. Turns are handed out first come, first served
    /// (in the order the futures are first polled).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future before it resolves takes no turn
    /// and keeps no one else waiting.
    pub fn take(
        &self,
        name: &LockName,
        owner: OwnerToken,
    ) -> impl std::future::Future<Output = Turn> + Send + 'static {
        let key = (name.clone(), owner);
        let gate = {
            let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(gates.entry(key.clone()).or_default())
        };
        // Owns the gate until the wait starts, so a future dropped at any
        // point still clears the entry.
        let mut turn = Turn {
            gates: Arc::clone(&self.gates),
            key,
            gate: Some(gate),
            guard: None,
        };
        async move {
            if let Some(gate) = turn.gate.take() {
                turn.guard = Some(gate.lock_owned().await);
            }
            turn
        }
    }

    /// How many names and owners have a turn taken or awaited.
    pub fn in_use(&self) -> usize {
        self.gates.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl fmt::Debug for Turns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turns")
            .field("in_use", &self.in_use())
            .finish()
    }
}

/// The turn of one name and owner; the next attempt waits until it drops.
/// It owns what it needs, so it can move into a task that cleans up after
/// an attempt nobody waits for any more.
#[must_use = "the turn ends when it is dropped"]
pub struct Turn {
    gates: Gates,
    key: Key,
    gate: Option<Gate>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl fmt::Debug for Turn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turn")
            .field("name", &self.key.0)
            .field("held", &self.guard.is_some())
            .finish()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        drop(self.gate.take());
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map holds the gate: nobody has or awaits a turn.
        if gates
            .get(&self.key)
            .is_some_and(|g| Arc::strong_count(g) == 1)
        {
            gates.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> LockName {
        LockName::new(s).unwrap()
    }

    /// Different names or owners never wait for each other.
    #[tokio::test]
    async fn only_the_same_name_and_owner_take_turns() {
        let turns = Turns::default();
        let (a, b) = (OwnerToken::random(), OwnerToken::random());
        let _one = turns.take(&name("x"), a).await;
        let _other_owner = turns.take(&name("x"), b).await;
        let _other_name = turns.take(&name("y"), a).await;
        assert_eq!(turns.in_use(), 3);
    }

    /// A turn moved into a task holds the next attempt back until the
    /// task ends, and the map forgets the entry once nobody uses it.
    #[tokio::test]
    async fn a_turn_moved_into_a_task_holds_the_next_one_back() {
        let turns = Turns::default();
        let owner = OwnerToken::random();
        let first = turns.take(&name("x"), owner).await;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _first = first;
            let _ = rx.await;
        });
        let next = turns.take(&name("x"), owner);
        tokio::pin!(next);
        assert!(futures::poll!(next.as_mut()).is_pending());
        tx.send(()).unwrap();
        task.await.unwrap();
        drop(next.await);
        assert_eq!(turns.in_use(), 0);
    }

    /// A wait for a turn that is dropped leaves no entry behind and does
    /// not keep the turn from the next one.
    #[tokio::test]
    async fn a_cancelled_wait_leaves_nothing() {
        let turns = Turns::default();
        let owner = OwnerToken::random();
        let first = turns.take(&name("x"), owner).await;
        {
            let waiting = turns.take(&name("x"), owner);
            tokio::pin!(waiting);
            assert!(futures::poll!(waiting.as_mut()).is_pending());
        }
        drop(first);
        assert_eq!(turns.in_use(), 0);
        drop(turns.take(&name("x"), owner).await);
        assert_eq!(turns.in_use(), 0);
        // The same when the cancelled wait is the last one to go.
        let first = turns.take(&name("x"), owner).await;
        let mut waiting = Box::pin(turns.take(&name("x"), owner));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(first);
        drop(waiting);
        assert_eq!(turns.in_use(), 0);
    }
}
