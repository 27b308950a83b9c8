//! polylock backend for etcd (v3 API; tested against etcd 3.4).
//!
//! ```no_run
//! # async fn demo() -> Result<(), lock_core::LockError> {
//! use std::time::Duration;
//! use lock_core::Locker;
//! let locker = Locker::new(backend_etcd::EtcdBackend::connect("etcd://n1:2379,n2:2379,n3:2379").await?);
//! let guard = locker.lock("nightly").ttl(Duration::from_secs(10)).wait(Duration::from_secs(30)).acquire().await?;
//! // ... pass guard.fence() to every system you write to ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! URLs: `etcd://[user:password@]host:port[,host:port...][?prefix=...]`, or
//! `etcds://` for TLS; every option is in [`EtcdConfig`].
//!
//! # How a lock works
//! - **Session.** Each client keeps one etcd lease per TTL in use, granted
//!   once and kept alive by a background task that sends a keepalive every
//!   TTL/3 on one stream. Every lock the client takes with that TTL is
//!   attached to it, so renewing costs the same for 1 lock or 1,000
//!   (see [`SessionInfo`]). A lock whose holder stops renewing is deleted by
//!   the session at its TTL; a client that dies or freezes stops the
//!   keepalives and etcd deletes all its keys when the lease expires. A
//!   session with no lock and no acquisition for 30 s (or two TTLs, if
//!   longer) is revoked; the next lock starts a new one.
//! - **Queue.** Lock `NAME` is the key prefix `{prefix}NAME/` and a claim
//!   is the key `{prefix}NAME/{lease id in hex}`, created only if absent:
//!   the layout of etcd's `clientv3/concurrency` Mutex, so `etcdctl lock
//!   NAME` and Go services using `concurrency.NewMutex` on the same name
//!   exclude each other with polylock. The default prefix is empty for
//!   that reason; `?prefix=app/` makes the prefix of `NAME` `app/NAME/`.
//!   Names are used verbatim (any UTF-8, `/` included); a claim is only a
//!   key directly under the prefix whose rest is a lease id, so `a` and
//!   `a/b` are different locks.
//! - **Order.** The claim with the lowest create revision holds. A waiter
//!   waits for the deletion of the claim just before its own and of the one
//!   before that, and reads the queue again only on those: no thundering
//!   herd of reads on every release. The deletes come through one range
//!   watch per lock per client (from "now", shared by that client's
//!   waiters, so each client receives every delete of the lock's claims
//!   once), made ready before the waiter reads the queue, so no delete is
//!   missed; on a delete it reads the queue again (the claims ahead and
//!   its own claim, in one transaction). The
//!   waiter whose only claim ahead is the holder's watches both keys on one
//!   range watch instead (deletes of other keys sorting between the two
//!   are skipped), and holds at the holder's delete without another
//!   request: nothing can queue ahead of it any more, and its own claim
//!   (on its live lease) would have been deleted before, or in the same
//!   revision (a range delete such as `etcdctl del --prefix`, which the
//!   watch reports as one note), and the waiter then reads again.
//!   So a hand-off is the release plus one watch event.
//!   Waiters get the lock in the order they queued ([`Guarantees::fair_fifo`]).
//!   Tasks of one client asking for the same name queue inside the client
//!   first (one claim key per name per session), then in etcd.
//! - **Fencing.** The fencing token is the holder's create revision:
//!   global, never reused, kept across restarts and leader changes, and
//!   strictly increasing from one holder to the next. [`fenced_put`] writes
//!   data kept in etcd only while the claim still exists with that revision.
//! - **Loss.** If no keepalive is answered before the local deadline, or
//!   etcd says the lease is gone, every lock on the session reports `Lost`
//!   and later acquisitions start a new session. Each session also keeps
//!   one key of its own on its lease, `{prefix}\0polylock-session/{lease id
//!   in hex}` (never a claim: lock names cannot contain NUL), and watches
//!   its deletion, so a lease revoked or expired by etcd ends the session at
//!   once. Every [`Lease`](lock_core::Lease) carries the session's
//!   revocation token ([`Lease::revocation`](lock_core::Lease::revocation)),
//!   cancelled the moment the session ends, for guards to learn of the loss
//!   without waiting for a renewal.
//! - **Release.** A claim that vanished without this client releasing it
//!   (force-released, reaped, gone with its lease) makes `release` say
//!   `Lost`: etcd keeps no record of who held the lock after it, so the
//!   critical section may not have been exclusive. Releasing again what this
//!   client released is `Ok`.
//! - **Who holds.** A claim's value is the owner token, followed by the
//!   holder's [`HolderMeta`](lock_core::HolderMeta) line when the lock was
//!   taken with one (written in the claim's own create transaction), which
//!   `inspect` and `list` return. `list` is one range read over
//!   `{prefix}{name prefix}` (keys only, in pages at one revision), grouped
//!   by name, the lowest create revision holding; only holders whose value
//!   polylock wrote are listed (not `etcdctl lock`'s, whose value is empty,
//!   nor other recipes' keys in the same layout). `waiters` counts a
//!   name's claims but the holder's, foreign ones included.
//! - **Cancellation.** A cancelled waiter's claim is deleted in the
//!   background (there is no async drop), so it does not hold its place in
//!   the queue; if etcd cannot be reached, it goes with the session lease.
//!
//! [`Guarantees::fair_fifo`]: lock_core::Guarantees::fair_fifo

mod backend;
mod config;
mod conn;
mod errors;
mod fence;
mod queue;
mod session;
mod slot;
mod watch;

pub use backend::{guarantees, EtcdBackend, MIN_TTL};
pub use config::{EtcdConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_PORT};
pub use fence::fenced_put;
pub use session::SessionInfo;

use std::sync::Arc;

use lock_core::{LockBackend, LockError};

/// The URL schemes this backend serves (`etcds://` is TLS).
pub const URL_SCHEMES: &[&str] = &["etcd", "etcds"];

/// Connects to the etcd cluster named by `url`, for the polylock registry.
///
/// # Cancel safety
/// Cancel safe: nothing is created on the server before the first lock.
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    Ok(Arc::new(EtcdBackend::connect(url).await?))
}
