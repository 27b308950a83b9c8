//! polylock backend for ZooKeeper (tested against ZooKeeper 3.8), sharing
//! locks with Apache Curator's `InterProcessMutex`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lock_core::LockError> {
//! use std::time::Duration;
//! use lock_core::Locker;
//! // follower_lag: (syncLimit + 1) × tickTime of the ensemble's zoo.cfg.
//! let url = "zk://n1:2181,n2:2181,n3:2181?follower_lag=6s";
//! let locker = Locker::new(backend_zk::ZkBackend::connect(url).await?);
//! let guard = locker.lock("nightly").ttl(Duration::from_secs(30)).wait(Duration::from_secs(30)).acquire().await?;
//! // ... pass guard.fence() to every system you write to ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! URLs: `zk://[user:password@]host:port[,host:port...][/chroot][?session_timeout=..&prefix=..&acl=..&follower_lag=..]`;
//! every option is in [`ZkConfig`].
//!
//! # How a lock works
//! - **Queue.** Lock `NAME` is the directory `/{prefix}/{NAME}` (escaped
//!   where ZooKeeper forbids: see the `path` mapping in [`ZkConfig`]'s
//!   docs and [`ZkBackend::lock_path`]). A contender creates an
//!   EPHEMERAL_SEQUENTIAL node `_c_{uuid}-lock-{sequence}` in it, the name
//!   Curator's `InterProcessMutex` uses in protected mode, so Curator
//!   clients and polylock stand in one queue (on a name with no polylock
//!   names nested under it: Curator may take their directories for
//!   contenders that never leave; see [`ZkBackend::lock_path`]). Parent
//!   nodes are created as needed and left in place; only a lock directory
//!   whose sequence counter nears its 2^31 wrap is deleted, by the release
//!   that finds it empty (the next contender creates it again). A create
//!   whose reply was lost is recovered by finding the node with our uuid
//!   (and our session as its owner).
//! - **Order.** The lowest sequence holds. A waiter watches only the node
//!   just before its own; when woken it lists the directory again and
//!   checks every lower node is gone, except the second in line, woken by
//!   the holder's deletion: no node created since has a lower sequence, so
//!   it holds at once (a watch on its own node, sent with the other,
//!   tells it if its node was deleted meanwhile). That saves the hand-off
//!   one round trip. Waiters are served in the order they
//!   queued ([`lock_core::Guarantees::fair_fifo`]). A cancelled waiter's
//!   node is deleted.
//! - **Fencing.** The token is the lock node's czxid: the 64-bit zxid of
//!   the transaction that created it, global to the ensemble and strictly
//!   increasing from one holder to the next (not the 32-bit sequence).
//!   [`fenced_set_data`] writes data kept in ZooKeeper in one multi-op that
//!   checks the lock node first.
//! - **Who holds.** A node's data is the owner token, followed by the
//!   holder's [`HolderMeta`](lock_core::HolderMeta) line when the lock was
//!   taken with one (Curator writes the client's address there and reads
//!   no node's data). `inspect` and `list` return it. `list` walks the
//!   directories under the prefix root one depth at a time and maps each
//!   path back to its name exactly (a directory no name maps to is not a
//!   lock); locks whose first node polylock did not write (Curator's) are
//!   left out. `waiters` counts a directory's lock nodes but the first.
//! - **Sessions and TTL.** One session per TTL asked for; the session
//!   timeout the server negotiated is the lease's TTL. A lease not renewed
//!   within its TTL is deleted by the client at `sent_at + ttl`. Renewing
//!   reads the node (owner token, czxid, ephemeral owner), which also shows
//!   the server the session is alive; the leases of one session due
//!   together are read in one multi-read request. In an ensemble that read
//!   is answered by the member the client is connected to, and a
//!   follower cut off from its leader keeps answering for `syncLimit`
//!   ticks, while the leader, which hears of the session no more, expires
//!   it one session timeout after its last news of it, which can be a
//!   fifth of the TTL older than the cut (the client's idle pings). So
//!   every deadline loses the client's `follower_lag` (`(syncLimit + 1) ×
//!   tickTime`; 12 s by default for a URL naming several servers, zero
//!   for one, which must then not be an ensemble member: see
//!   [`ZkConfig`]) and, with a lag, a fifth of the TTL
//!   ([`clock_for`]); the shortest TTL grows with them ([`min_ttl_for`]),
//!   and the watchdog renews at half the time a lease is trusted: a holder
//!   stops trusting its lease before the leader can let another client
//!   in. When the
//!   connection drops, renewals fail and the guard reports the loss at the
//!   lease's local deadline unless the session reconnects in time. The
//!   driver gives up on a silent connection well before the session
//!   timeout, so TTLs near the 1 s minimum lose their locks to short
//!   stalls of a loaded process or network: prefer several seconds. A
//!   waiter that gives up deletes its node, retrying while the session
//!   lives, so it never becomes a holder nobody knows. When the
//!   session expires (or is closed), every lease of that session is revoked
//!   at once through [`lock_core::Lease::with_revocation`]; later
//!   acquisitions open a new session. A session with no lease, no waiter
//!   and no request for `idle_timeout` (30 s by default) is closed. A node whose ephemeral owner is not
//!   the current session is never taken for a live hold.
//!
//! Built on the `zookeeper-client` crate's primitives rather than its lock
//! recipe: the recipe only waits (no single attempt for `try_acquire`),
//! returns no `Stat` (the czxid is the fence), and cannot tell when its
//! request was sent (the lease's deadline is counted from the send).

mod backend;
mod config;
mod errors;
mod fence;
mod holdings;
mod path;
mod session;

pub use backend::{clock_for, guarantees, guarantees_for, min_ttl_for, ZkBackend, MIN_TTL};
pub use config::{
    ZkAcl, ZkConfig, DEFAULT_FOLLOWER_LAG, DEFAULT_IDLE_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_PORT,
    DEFAULT_PREFIX,
};
pub use fence::fenced_set_data;

use std::sync::Arc;

use lock_core::{LockBackend, LockError};

/// The URL schemes this backend serves.
pub const URL_SCHEMES: &[&str] = &["zk"];

/// Connects to the ensemble named by `url`, for the polylock registry.
///
/// # Cancel safety
/// Cancel safe: nothing is created on the server before the first lock.
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    Ok(Arc::new(ZkBackend::connect(url).await?))
}
