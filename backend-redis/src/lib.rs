//! polylock's Redis backend: one server (`redis://`, `rediss://`) or a Redis
//! Cluster (`redis+cluster://`), in the `plain` or the Redisson wire format;
//! and Redlock over independent servers (`redlock://`, [`RedlockBackend`]:
//! the `plain` format on each node, a majority, and a fencing token that
//! keeps increasing).
//!
//! ```no_run
//! # async fn f() -> Result<(), lock_core::LockError> {
//! use lock_core::Locker;
//! use backend_redis::RedisBackend;
//!
//! let locker = Locker::new(RedisBackend::connect("redis://127.0.0.1:6379/0").await?);
//! let guard = locker.lock("invoices").acquire().await?;
//! // ... write with guard.fence() ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How a lock works
//! - **Keys** (`plain` format): the lock is a string at key `NAME` itself
//!   (`PREFIX NAME` only with `?prefix=`) whose value is the owner token,
//!   the key and kind of value redis-py's `Lock(NAME)`, redsync,
//!   node-redlock (`acquire([NAME])`) and `SET NAME token NX PX` scripts
//!   use. Beside it, in the `__polylock__:` namespace that no lock key may
//!   enter: a hash `__polylock__:{TAG}[:KEY]` with fields `fence` (the
//!   fencing counter), `owner` (the token of the last polylock grant) and,
//!   when the holder gave one, `meta` (its [`HolderMeta`](lock_core::HolderMeta)
//!   line), and the release channel `__polylock__:released:{TAG}[:KEY]`. `TAG`
//!   hashes to the lock key's Redis Cluster slot: the name's own `{tag}`,
//!   else the key itself, else (a key like `a}b{` that cannot sit between
//!   braces) a short tag found once per slot by CRC16 and cached.
//!   [`RedisBackend::keys`] says where a lock lives.
//! - **Acquire** is one Lua script: `SET key token NX PX ttl` and, when that
//!   succeeded, `HINCRBY` of the lock's fencing counter, whose new value is
//!   the lease's fencing token. (Redisson format: create the hash with our
//!   field at count 1, `PEXPIRE`, `INCR`.) One round trip, atomic. When the
//!   key already holds this request's token as the last polylock grant (an
//!   earlier attempt ran on the server but its reply was lost), the attempt
//!   takes that grant over instead of waiting for itself (`plain` format).
//! - **Renew** is compare-owner-and-`PEXPIRE`, **release** is
//!   compare-owner-and-`DEL` plus a `PUBLISH` on the lock's channel; both
//!   scripts. Never a bare `DEL`, never an expiry set on a key that is not
//!   ours, so a late renew cannot resurrect a lock, and a foreign holder's
//!   key is never deleted, renewed or overwritten. Both also check that the
//!   fencing counter still equals the lease's token, so an older lease of the
//!   same owner cannot touch a newer holding, and a release after someone
//!   else was granted the lock (the counter moved on) is
//!   [`LockError::Lost`](lock_core::LockError), even when the lock is free
//!   again by then: the holding was not exclusive.
//! - **Batched renewals** ([`LockBackend::renew_many`],
//!   `batch_renew`): one script run per [`RENEW_CHUNK`] leases, each lease
//!   checked and extended as its own renew would be; on a cluster one run
//!   per node a chunk's keys live on, on Redlock one request per node per
//!   chunk (`tests/batch.rs`, `tests/cluster.rs`, `tests/redlock.rs` count
//!   the server's script calls).
//! - Scripts are in `scripts/*.lua`, sent by SHA-1 (`EVALSHA`), loaded at
//!   connect time and again by the driver on `NOSCRIPT`.
//! - **Waiting**: after one failed attempt the waiter subscribes to the
//!   lock's channel (one pub/sub connection per client, shared by its
//!   waiters; see the `wait` module) and retries on each release message,
//!   when the holder's TTL runs out, and on a jittered fallback poll.
//!   A cancelled waiter gives up its subscription.
//! - **Foreign holders** publish nothing. At connect the client reads the
//!   server's `notify-keyspace-events` (on a cluster: every master's) and
//!   logs which wake-up is in effect ([`RedisBackend::foreign_wake`],
//!   [`ForeignWake`], and in words `LockBackend::wake_mode`): with keyspace
//!   events (`K` with `g` or `A`) waiters also subscribe to the lock key's
//!   `__keyspace@DB__:KEY` channel and wake on its `del`/`expired` event;
//!   without them waiters poll every 10–100 ms (jittered). On a cluster a
//!   node publishes only its own keys' events, so each waiter subscribes
//!   on the node that owns the key's slot, found by asking nodes directly
//!   and following `MOVED`, confirmed again after subscribing, and checked
//!   every second: when the slot moves (resharding, failover), the node
//!   stops answering or its pub/sub connection drops, the waiter polls
//!   (10–100 ms) until it is subscribed on the new owner
//!   (`tests/cluster.rs`). `inspect` (and so `polylock status`) shows a
//!   foreign holder as such: the start of its value, its PTTL, and the
//!   wake-up mode. The `redisson` format wakes on Redisson's own unlock
//!   message.
//! - **Holder metadata** ([`AcquireRequest::meta`](lock_core::AcquireRequest)):
//!   written by the grant script into polylock's bookkeeping hash (`plain`:
//!   the hash above; `redisson`: `__polylock__:redisson:{TAG}[:NAME]`
//!   beside Redisson's keys, with the holder's field in `owner`), never
//!   into the lock's own value or hash, which foreign clients compare. A
//!   grant without metadata removes the previous holder's; `inspect` and
//!   `list` return it only while the bookkeeping's owner is the live
//!   holder. Redlock keeps it on each node and shows what a majority of the
//!   holder's nodes agree on.
//! - **`list`** `SCAN`s the bookkeeping hashes (on every master of a
//!   cluster), recovers each exact name from its key, and keeps the locks
//!   held by the owner the bookkeeping records (polylock's own, live; a
//!   foreign holder of the same key is not listed), in name order.
//!   **`waiters`** is `PUBSUB NUMSUB` of the lock's release channel
//!   (summed over a cluster's nodes): the clients waiting with polylock (a
//!   client's tasks share one connection and count once) and, in the
//!   `redisson` format, Redisson's own waiters; foreign `plain` clients
//!   poll and are not seen.
//! - **Cluster**: the lock key, its counter and its channel share a slot,
//!   so each script touches one slot.
//! - **Fair mode** (`?fair=true`, `plain` format, one server or a cluster;
//!   [`RedisConfig::fair`]): beside the bookkeeping, in the same slot, a
//!   sorted set `__polylock__:queue:{TAG}[:KEY]` of waiter ids by arrival
//!   and one of their deadlines, `__polylock__:queue-deadlines:{TAG}[:KEY]`.
//!   The acquire script drops entries past their deadline, grants only a
//!   free lock with no older live waiter, and otherwise queues the waiter
//!   (once) or pushes its deadline on; a try (no wait) never queues and
//!   never jumps the queue. Each queued attempt also records the waiter's
//!   TTL, token and description in `__polylock__:queue-waiters:{TAG}[:KEY]`,
//!   so that the release script grants the lock straight to the oldest live
//!   waiter whose last attempt is under a second old, and tells it so alone,
//!   on its own channel `__polylock__:wake:{TAG}[:KEY]:ID`: the waiter holds
//!   the lock without another round trip, its deadline counted from its
//!   last refused attempt's send (why that is safe: `RedisBackend`'s
//!   `granted`; `tests/fair.rs`). Such a grant is for a claim window of
//!   2 s (or the TTL, if shorter): the lease's [`Lease::ttl`](lock_core::Lease::ttl)
//!   says so, and its first renewal (the watchdog's, at a third of it)
//!   asks for the TTL the waiter asked for. So a waiter that died right
//!   after its last attempt leaves the lock to nobody for at most that
//!   window, not a whole TTL. An older entry (its waiter may have died)
//!   is only woken to try. A waiter that gives up or is cancelled leaves the
//!   queue, frees a lock granted to it that it never took up, and hands it
//!   to the next waiter; one that crashed leaves it at its deadline.
//!   `waiters` counts the live queue entries. Fairness holds
//!   among polylock clients in fair mode: foreign clients and polylock
//!   clients without `fair=true` do not see the queue (`tests/fair.rs`,
//!   and the conformance suite's FIFO case on `redis-fair` and
//!   `redis-cluster-fair`).
//!
//! # Fencing tokens, and what can make them go backwards
//! The counter is never reset by release (nor by `force_release`). A
//! counter that does not exist starts at the server's clock in
//! microseconds (`TIME`), so a counter that was evicted (an `allkeys-*`
//! `maxmemory-policy`) or deleted starts again above every token it handed
//! out: it would have had to be bumped more than once per microsecond to
//! overtake the clock. Tokens are therefore large numbers (about 1.7·10¹⁵),
//! below 2⁵³. What still moves them back: the server's clock stepped back
//! past the counter's creation time, a restart of a server that does not
//! persist every write (RDB only, or AOF with the default `appendfsync
//! everysec`) together with a rewound clock, and a failover to a replica
//! that had not received the latest increment (tokens can then repeat); a
//! fenced resource then rejects the new holder's writes until the counter
//! passes the highest token it saw. Hence
//! [`FencingGuarantee::UnlessDataLoss`](lock_core::FencingGuarantee).
//!
//! **Eviction policy**: run lock servers with `maxmemory-policy
//! noeviction`. `allkeys-*` policies can evict a live lock key (another
//! client then acquires while the holder still works) as well as counters;
//! `volatile-*` policies evict exactly the keys with an expiry, which are
//! the live locks. Evicted counters are survived as above; evicted locks
//! are not.
//!
//! # Replica acknowledgement (`wait_replicas=N&wait_timeout=MS`)
//! Off by default. When on, each acquire and each renewal is sent in one
//! pipeline with `WAIT N MS`, so the `WAIT` runs on the connection that
//! wrote (`WAIT` only counts acknowledgements of its own connection's
//! writes) and, on a cluster, on the node of the lock's slot. An acquire
//! that fewer than N replicas acknowledged in time is released again and
//! fails with a retryable error; such a renewal fails with a retryable
//! error and the lease keeps its previous deadline (the watchdog retries).
//! Releases are not waited for. The trade-off: every acquire and renewal
//! costs a replication round trip, a missing replica makes them fail after
//! `wait_timeout`, and because `WAIT` blocks the (shared, multiplexed)
//! connection it runs on, other commands of this client wait behind it
//! meanwhile. It narrows, but does not close, the failover window: `WAIT`
//! does not make Redis replication synchronous.
//!
//! # Wire formats
//! See [`Format`]. `plain` interoperates with redis-py's `Lock`, redsync,
//! node-redlock and `SET key token NX PX` scripts on the lock's own name
//! (tested with the real redis-py, node-redlock 5 and `redis-cli`, on a
//! server and on a cluster: `tests/peers.rs`); `redisson` with Redisson's
//! `RLock` (and its fenced lock's token key).
//!
//! # Errors
//! Driver errors become [`LockError::Backend`](lock_core::LockError) with a
//! `retryable` flag: connection, timeout, `BUSY`, `LOADING`, `TRYAGAIN`,
//! `CLUSTERDOWN`, `MOVED`/`ASK`, `READONLY` are retryable; `WRONGTYPE`,
//! `NOAUTH`, `WRONGPASS`, `NOPERM` and other command errors are not. A bad
//! database index or refused credentials at connect time are
//! [`LockError::Config`](lock_core::LockError). Passwords never appear in
//! errors, logs or `Debug` output.

mod backend;
mod config;
mod conn;
mod errors;
mod format;
mod nodes;
mod redlock;
mod wait;

pub use backend::{guarantees, guarantees_for, RedisBackend, FENCING_CAVEAT, RENEW_CHUNK};
pub use config::{
    Algorithm, Format, RedisConfig, DEFAULT_OP_TIMEOUT, DEFAULT_PREFIX, DEFAULT_WAIT_TIMEOUT,
};
pub use format::{redisson_field, LockKeys};
pub use redlock::{
    RedlockBackend, RedlockConfig, DEFAULT_DRIFT, DEFAULT_DRIFT_FACTOR, DEFAULT_NODE_TIMEOUT,
    DEFAULT_RETRY_DELAY, MIN_NODES, REDLOCK_FENCING_CAVEAT, REDLOCK_MIN_TTL,
};
pub use wait::ForeignWake;

use std::sync::Arc;

use lock_core::{LockBackend, LockError};

/// The URL schemes this backend serves; [`Algorithm::of_scheme`] says which
/// algorithm each selects.
pub const URL_SCHEMES: &[&str] = &["redis", "rediss", "redis+cluster", "redlock"];

/// Connects to the server, cluster or Redlock set named by `url`
/// ([`RedisBackend::connect`] or [`RedlockBackend::connect`], by scheme).
///
/// # Cancel safety
/// Cancel safe: a dropped connect leaves no lock behind.
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    let scheme = lock_core::url::scheme_of(url).unwrap_or_default();
    Ok(match Algorithm::of_scheme(scheme) {
        Some(Algorithm::Redlock) => Arc::new(RedlockBackend::connect(url).await?),
        _ => Arc::new(RedisBackend::connect(url).await?),
    })
}
