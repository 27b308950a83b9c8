//! Redlock over N >= 3 independent Redis masters (`redlock://`), with a
//! fencing token that keeps increasing.
//!
//! ```no_run
//! # async fn f() -> Result<(), lock_core::LockError> {
//! use lock_core::Locker;
//! let backend = backend_redis::RedlockBackend::connect(
//!     "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?timeout=50ms",
//! )
//! .await?;
//! let guard = Locker::new(backend).lock("invoices").acquire().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # On each node
//! Exactly the keys, values and scripts of the `plain` format of
//! `redis://` (see the crate docs): the lock key is the lock name, its
//! value the owner token (followed by a dot and a nonce of the acquire
//! attempt, see [`attempt_value`]), beside it the `__polylock__:{TAG}`
//! hash with the node's fencing counter. So node-redlock 5 over the same nodes and name
//! excludes with polylock and polylock with it (`tests/redlock.rs`); on
//! each node the key and value are the ones the `plain` format shares with
//! redis-py and `SET NX PX` scripts (`tests/peers.rs`). Two scripts are Redlock's own: one raises a node's
//! counter to the lease's token (`scripts/redlock_raise_fence.lua`), one
//! undoes a failed attempt (`scripts/redlock_undo.lua`).
//!
//! # The algorithm
//! - **Acquire** sends the `plain` acquire script (`SET NX PX` + the
//!   counter's increment) to every node at once, each under the per-node
//!   `timeout`, and waits for every answer or timeout. It succeeds when a
//!   majority granted AND the validity is positive:
//!   `validity = ttl - elapsed - drift`, `drift = ttl x drift_factor +
//!   drift` (`elapsed` counted from the moment the requests were sent). The
//!   lease's local deadline is the end of that validity, counted from the
//!   send (`Lease::deadline` = send time + `ttl x (1 - drift_factor) -
//!   drift`; where the request's own `ClockPolicy` is stricter, it wins).
//!   Otherwise the attempt is undone on every node that may hold it: those
//!   that granted it, and the silent ones (their grant may have happened
//!   with the reply lost); not on those that refused, which hold someone
//!   else's value. The undo adds no timeout to the attempt: the caller
//!   waits for it only as long as the step before had left of its
//!   `timeout` (it goes on in the background past that, and on silent
//!   nodes always does). So an attempt answers within one `timeout`, two
//!   when the token had to be written back (below), and
//!   the attempt reports "not acquired": `Ok(None)` when other holders
//!   alone made a majority impossible, else a retryable error that says how
//!   many nodes granted, which failed and why, and what validity was left.
//!   A waiting `acquire` subscribes to the lock's release channel on
//!   every node and attempts again on the first release message from any
//!   of them (a release publishes on each node), or after a random
//!   (jittered) delay of at most `retry_delay`, whichever comes first.
//! - **Renew** runs the `plain` owner- and token-checked extension on every
//!   node; it succeeds only when a majority extended and the lease's
//!   remaining validity (its deadline) had not run out when they answered.
//!   When the nodes that did not answer (in time) could still make that
//!   majority and the deadline is ahead, it returns a retryable error (the
//!   watchdog asks again; `lost()` fires at the deadline at the latest).
//!   A batch of renewals (`renew_many`) waits for each node up to a tenth
//!   of its shortest TTL when that is longer than `timeout`: the nodes
//!   answer the batches of many leases in turn, and a batch's answer is
//!   judged against the validity counted from its send, which can afford it.
//!   Otherwise the lease is lost: renew returns [`LockError::Lost`], after
//!   releasing the lease on every node it still holds.
//! - **Release** runs the `plain` owner- and token-checked delete on every
//!   node, which also removes the attempt's own key where the node's
//!   counter is above the lease's token (`redlock_release.lua`: a node
//!   that granted the attempt after its counter was re-seeded, its answer
//!   not counted; the value carries the attempt's nonce, so the key can
//!   be nobody else's). A majority released, or no node was granted to
//!   anyone since (the lease expired untouched): `Ok`. Fewer released and a node was granted
//!   to someone else since: `Lost`. Too few nodes answered to tell: a
//!   retryable error.
//!
//! # Fencing tokens, and the assumption they rest on
//! Every node keeps its own counter (the `plain` format's). An acquire
//! takes T, the maximum of the counters the granting majority returned
//! (each incremented by the grant), writes T back to the granting nodes
//! that returned less (`counter = max(counter, T)`, only where the key
//! still holds our token), and hands the lease out only when a majority
//! holds the lock with counter T. A node that returned T needs no
//! write-back, so when counters are in step (every node returned T, as
//! after any earlier write-back) the acquire is one round trip. A later
//! acquire needs a majority of its own, and any two majorities of the
//! same N nodes share at least one node: that node's counter is at least
//! T, its grant increments it, and the later token (a maximum that
//! includes it) is larger than T. The counter is never reset
//! by release, and a missing counter starts at the node's clock in
//! microseconds, as in the `plain` format.
//!
//! That argument needs the shared node to REMEMBER T. It holds when every
//! node persists each write before answering (`appendonly yes` with
//! `appendfsync always`) or, as the Redlock description requires, when a
//! crashed node is kept down for longer than the longest TTL before it
//! rejoins (its majority's locks have expired by then; its counter, if lost,
//! restarts from its clock, above every token it handed out unless the clock
//! stepped back). A node that restarts at once without its data breaks not
//! only fencing but exclusion itself: with it, a second client can gather a
//! majority while the first still holds. `tests/redlock.rs` demonstrates
//! both halves (`demonstration_*`).
//!
//! # Clocks
//! Expiry is judged by each node's own clock (`PX`); the drift allowance
//! covers clocks that run at different RATES. A node whose wall clock jumps
//! forward expires its keys early and weakens the majority like a node that
//! restarted empty.

mod config;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use lock_core::wait::{acquire_loop, Backoff};
use lock_core::{
    AcquireRequest, ClockPolicy, ExpiryClock, FencingGuarantee, FencingToken, Guarantees,
    HolderInfo, Lease, LockBackend, LockError, LockName, LockSpace, OwnerToken, WaitMechanism,
};
use redis::{FromRedisValue, Script, ScriptInvocation};
use tokio::sync::OnceCell;
use tokio::time::Instant;

pub use config::{
    RedlockConfig, DEFAULT_DRIFT, DEFAULT_DRIFT_FACTOR, DEFAULT_NODE_TIMEOUT, DEFAULT_RETRY_DELAY,
    MIN_NODES,
};

use crate::backend::{foreign_value, renew_chunked, PX_UNIT};
use crate::config::{Format, RedisConfig};
use crate::conn::{client_for, Link};
use crate::errors::{connect_error, is_retryable, Fail, RedisFailure};
use crate::format::{Keys, Layout, LockKeys, FORCE_RELEASE, RELEASE_MESSAGE};
use crate::wait::{wake_up, Subscriber, Subscription};

/// The backend name in errors and guarantees.
const REDLOCK: &str = "redlock";

/// The shortest TTL granted: a shorter request is granted this long, so
/// that the drift allowance and a round trip to every node leave a
/// positive validity.
pub const REDLOCK_MIN_TTL: Duration = Duration::from_millis(100);

/// What can make Redlock's fencing tokens go backwards.
pub const REDLOCK_FENCING_CAVEAT: &str =
    "each node keeps its own counter and a lease's token is the \
     maximum over a majority, written back to it: a node of that majority that restarts without \
     having persisted its writes (no appendfsync always) and rejoins before the longest TTL has \
     passed can let a later majority miss the token, repeating or lowering it; so can a node whose \
     clock stepped back past its counter's creation";

static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/redlock_raise_fence.lua")));
static UNDO: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/redlock_undo.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/counter_fn.lua"),
        include_str!("../scripts/plain_release_fn.lua"),
        include_str!("../scripts/redlock_release.lua")
    ))
});

/// What Redlock promises: see [`crate::guarantees`].
pub(crate) fn guarantees() -> Guarantees {
    let mut g = Guarantees::new(REDLOCK);
    g.fencing = FencingGuarantee::UnlessDataLoss(REDLOCK_FENCING_CAVEAT);
    g.fair_fifo = false;
    g.expiry_clock = ExpiryClock::Server;
    g.survives_restart = false;
    g.survives_failover = false;
    g.wait = WaitMechanism::PubSub;
    g.min_ttl = REDLOCK_MIN_TTL;
    g.ttl_granularity = Duration::from_millis(1);
    g.force_release = true;
    // Written by each node's grant beside the lock; `inspect` shows the
    // description a majority of the holder's nodes keep.
    g.holder_meta = true;
    g.batch_renew = true;
    g
}

/// A batch renewal's per-node limit is this share of its shortest TTL
/// (when that is more than the node timeout). The node timeout is sized
/// for one request of one lock; the watchdog sends the batches of
/// thousands of leases at once, and each node answers them in turn, so the
/// last chunk's answer comes after every chunk before it. Its leases can
/// afford the wait: a renewal runs at a third of the TTL and its answer is
/// judged against the validity counted from the send. Cut at the node
/// timeout, the late chunks failed and their leases fell back to one
/// renewal each (824 requests/s at 10,000 held locks instead of about 60).
const BATCH_SHARE_OF_TTL: u32 = 10;

/// One node: its `redis://` configuration and a command connection made on
/// first use, so a node that is down when the client starts joins later.
struct Node {
    config: Arc<RedisConfig>,
    /// This node's place in the URL.
    index: usize,
    /// The servers this client's nodes turned out to be (see
    /// [`Servers`]), shared by them all.
    servers: Arc<Servers>,
    link: Arc<OnceCell<Link>>,
    /// A connect is under way in a task of its own (see [`Node::link`]).
    connecting: Arc<AtomicBool>,
}

impl Node {
    fn addr(&self) -> String {
        node_addr(&self.config)
    }

    fn new(config: RedisConfig, index: usize, servers: Arc<Servers>) -> Node {
        Node {
            config: Arc::new(config),
            index,
            servers,
            link: Arc::new(OnceCell::new()),
            connecting: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The node's connection, connecting (handshake, `PING`, script loads)
    /// if there is none yet.
    ///
    /// A connect takes several round trips, each bounded by the node
    /// timeout, while a request waits for one node at most one timeout: on
    /// a slow link (a node in another region) a connect bounded by the
    /// request would be cut off every time and the node never join. So the
    /// first request to find no connection also starts one in a task of its
    /// own, which runs to its end; the request waits for it as long as its
    /// own limit allows, and a later request finds the connection made.
    ///
    /// # Cancel safety
    /// Cancel safe: the background connect goes on, and a connect the
    /// caller itself was running is taken up by the next caller.
    async fn link(&self) -> Result<&Link, Fail> {
        if let Some(link) = self.link.get() {
            return Ok(link);
        }
        if tokio::runtime::Handle::try_current().is_ok()
            && !self.connecting.swap(true, Ordering::AcqRel)
        {
            let (cell, config, connecting, servers, index) = (
                Arc::clone(&self.link),
                Arc::clone(&self.config),
                Arc::clone(&self.connecting),
                Arc::clone(&self.servers),
                self.index,
            );
            tokio::spawn(async move {
                let connect = || connect_node(&config, index, &servers);
                if let Err(fail) = cell.get_or_try_init(connect).await {
                    tracing::debug!(
                        "polylock redlock: connecting to a node failed: {}",
                        describe(&config, &fail)
                    );
                }
                connecting.store(false, Ordering::Release);
            });
        }
        self.link
            .get_or_try_init(|| connect_node(&self.config, self.index, &self.servers))
            .await
    }

    /// Runs one script within `limit`, connecting first if need be.
    async fn invoke<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
        limit: Duration,
    ) -> Result<T, Fail> {
        let extra = limit.saturating_sub(self.config.timeout);
        match tokio::time::timeout(limit, async {
            self.link().await?.invoke_within(inv, extra).await
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(Fail::Timeout(limit)),
        }
    }

    fn describe(&self, fail: &Fail) -> String {
        describe(&self.config, fail)
    }
}

/// Which server each node of a client is, by the server's `run_id` (new at
/// every server start): one server listed twice under two names
/// (`localhost` and `127.0.0.1`, two DNS names of one host) would count
/// twice toward the majority, so a minority would look like one. The URL
/// parser catches the same address written twice; this catches the rest.
#[derive(Debug, Default)]
struct Servers {
    /// `run_id` → the index of the node that reported it.
    seen: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

impl Servers {
    /// Records that node `index` is the server `run_id`; an error names
    /// the other node already found to be that server.
    fn record(&self, run_id: String, index: usize) -> Result<(), usize> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.entry(run_id) {
            std::collections::hash_map::Entry::Occupied(e) if *e.get() != index => Err(*e.get()),
            std::collections::hash_map::Entry::Occupied(_) => Ok(()),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(index);
                Ok(())
            }
        }
    }
}

/// A command connection to the node of `config`, with every script of
/// Redlock loaded, once the node proved to be a server no other node of
/// the client is ([`Servers`]). A node that is another's server never
/// connects: its requests fail, so it never counts toward a majority.
async fn connect_node(config: &RedisConfig, index: usize, servers: &Servers) -> Result<Link, Fail> {
    let link = Link::connect(config).await?;
    // A server that refuses `INFO` (an ACL without it, a managed service
    // that renamed it) or hides `run_id` (a proxy) cannot be told apart;
    // the URL check is all there is then.
    let info: String = match link
        .command(redis::cmd("INFO").arg("server"), Duration::ZERO)
        .await
    {
        Ok(info) => info,
        Err(Fail::Redis(e)) if e.code().is_some() => String::new(),
        Err(fail) => return Err(fail),
    };
    if let Some(run_id) = info
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
    {
        if let Err(other) = servers.record(run_id.to_string(), index) {
            return Err(Fail::Redis(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a Redlock node is listed twice",
                format!(
                    "node {} is the same server as node {} (the same run_id): Redlock needs \
                     independent nodes, and one counted twice would make a minority look \
                     like a majority",
                    index + 1,
                    other + 1
                ),
            ))));
        }
    }
    let mut scripts: Vec<&Script> = vec![&RAISE_FENCE, &UNDO, &RELEASE, &FORCE_RELEASE];
    let plain = plain_layout(String::new()).scripts();
    scripts.extend([
        &plain.acquire,
        &plain.renew,
        &plain.renew_many,
        &plain.inspect,
    ]);
    link.load_scripts(&scripts).await?;
    Ok(link)
}

/// The address of the node of `config`, as `host:port`.
fn node_addr(config: &RedisConfig) -> String {
    let n = &config.nodes[0];
    if n.host.contains(':') {
        format!("[{}]:{}", n.host, n.port)
    } else {
        format!("{}:{}", n.host, n.port)
    }
}

/// `fail` on the node of `config`, its address first, without secrets.
fn describe(config: &RedisConfig, fail: &Fail) -> String {
    let addr = node_addr(config);
    match fail {
        Fail::Timeout(d) => format!("{addr}: no reply within {d:?}"),
        Fail::Redis(e) => config.scrub(format!("{addr}: {e}")),
    }
}

/// The value one acquire attempt stores on the nodes: the owner token, a
/// dot, and a nonce of this attempt.
///
/// Why not the owner token alone: a retry of the same request would then
/// find the key of an earlier attempt whose reply was lost on a node and
/// count it as its own grant (the `plain` script's take-over), while that
/// earlier attempt's undo, still queued on the node, may delete it right
/// after: the retry would count a node that no longer holds the lock
/// toward its majority. With a value per attempt, a retry never mistakes
/// an earlier attempt's key for its own grant, and an undo only ever
/// removes its own attempt's key.
fn attempt_value(owner: OwnerToken) -> String {
    format!("{owner}.{}", &OwnerToken::random().to_string()[..16])
}

/// The value `lease` stored on the nodes. The lease carries it as its
/// backend key, which is only believed when it begins with the lease's own
/// owner token: a lease presented with another owner's token cannot use a
/// copied key to touch this owner's lock.
fn stored_value(lease: &Lease) -> String {
    let owner = lease.owner().to_string();
    match lease.backend_key() {
        Some(v)
            if v.strip_prefix(owner.as_str())
                .is_some_and(|r| r.starts_with('.')) =>
        {
            v.to_string()
        }
        _ => owner,
    }
}

fn plain_layout(prefix: String) -> Layout {
    Layout {
        format: Format::Plain,
        prefix,
        cluster: false,
    }
}

/// A Redlock client of N independent Redis masters.
///
/// Holds one multiplexed command connection per node (made on first use,
/// replaced when a reply goes missing). Clones share them. Make it inside
/// the tokio runtime that will use it.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedlockConfig,
    layout: Layout,
    nodes: Vec<Node>,
    /// One pub/sub connection per node, opened by the first waiter: a
    /// release publishes on every node it held, so a waiter subscribed on
    /// all of them hears it from any node of the holder's majority.
    subscribers: Vec<Subscriber>,
    /// The lock space stamped on this client's leases (Redlock, the
    /// database and the key prefix); renew and release refuse another space's.
    space: LockSpace,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("url", &self.inner.config.redacted_url())
            .field("nodes", &self.inner.nodes.len())
            .field("quorum", &self.inner.config.quorum())
            .finish_non_exhaustive()
    }
}

/// What the nodes answered to one request, for the decision and the error
/// message.
struct Tally<'a> {
    nodes: &'a [Node],
    /// Nodes that did what was asked.
    ok: usize,
    /// Nodes that answered no (held by another, not ours any more).
    refused: usize,
    /// Nodes that failed, with why.
    failed: Vec<String>,
    /// Some node failed in a way a retry will not fix.
    permanent: bool,
}

impl<'a> Tally<'a> {
    fn new(nodes: &'a [Node]) -> Self {
        Tally {
            nodes,
            ok: 0,
            refused: 0,
            failed: Vec::new(),
            permanent: false,
        }
    }

    fn fail(&mut self, node: usize, fail: &Fail) {
        if let Fail::Redis(e) = fail {
            self.permanent |= !is_retryable(e);
        }
        self.failed.push(self.nodes[node].describe(fail));
    }

    /// `"acquire of lock "x": 2 of 5 nodes granted (3 needed); 1 refused
    /// (held by another client); 2 failed: a: ..., b: ...; ..."`.
    fn message(&self, what: &str, name: &LockName, ok: &str, refused: &str, tail: &str) -> String {
        let n = self.nodes.len();
        let mut m = format!(
            "{what} of lock {name:?}: {} of {n} nodes {ok} ({} needed)",
            self.ok,
            n / 2 + 1
        );
        if self.refused > 0 {
            m.push_str(&format!("; {} {refused}", self.refused));
        }
        if !self.failed.is_empty() {
            m.push_str(&format!(
                "; {} failed: {}",
                self.failed.len(),
                self.failed.join(", ")
            ));
        }
        if !tail.is_empty() {
            m.push_str("; ");
            m.push_str(tail);
        }
        m
    }

    fn error(&self, text: String) -> LockError {
        if self.permanent {
            LockError::permanent(REDLOCK, RedisFailure(text))
        } else {
            LockError::transient(REDLOCK, RedisFailure(text))
        }
    }
}

impl RedlockBackend {
    /// Parses `url` (see [`RedlockConfig::parse`]) and connects.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped connect leaves nothing behind.
    pub async fn connect(url: &str) -> Result<RedlockBackend, LockError> {
        Self::connect_with(RedlockConfig::parse(url)?).await
    }

    /// Connects to every node at once and succeeds when a majority
    /// answered; the others are connected on first use. Refused
    /// credentials or a missing database on any node are a
    /// [`LockError::Config`].
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped connect leaves nothing behind.
    pub async fn connect_with(config: RedlockConfig) -> Result<RedlockBackend, LockError> {
        let servers = Arc::new(Servers::default());
        let nodes: Vec<Node> = config
            .nodes
            .iter()
            .enumerate()
            .map(|(i, c)| Node::new(c.clone(), i, Arc::clone(&servers)))
            .collect();
        // Connecting costs a handshake and the script loads: more than one
        // request's timeout.
        let limit = config.timeout * 4;
        let replies = join_all(nodes.iter().map(|n| async move {
            match tokio::time::timeout(limit, n.link()).await {
                Ok(r) => r.map(|_| ()),
                Err(_) => Err(Fail::Timeout(limit)),
            }
        }))
        .await;
        let mut tally = Tally::new(&nodes);
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(()) => tally.ok += 1,
                Err(fail) => {
                    tally.failed.push(nodes[i].describe(&fail));
                    if let e @ LockError::Config(_) = connect_error(&nodes[i].config, fail) {
                        return Err(LockError::Config(format!(
                            "`{}`: {e}",
                            config.redacted_url()
                        )));
                    }
                }
            }
        }
        if tally.ok < config.quorum() {
            let text = format!(
                "connecting to {}: {} of {} nodes answered ({} needed); {}",
                config.redacted_url(),
                tally.ok,
                nodes.len(),
                config.quorum(),
                tally.failed.join(", ")
            );
            return Err(LockError::transient(REDLOCK, RedisFailure(text)));
        }
        tracing::info!(url = %config.redacted_url(), nodes = nodes.len(), answered = tally.ok, "polylock redlock: connected");
        let layout_prefix = config.nodes[0].prefix.clone();
        let layout = plain_layout(layout_prefix.clone());
        let subscribers = nodes
            .iter()
            .map(|n| {
                client_for(&n.config, &n.config.nodes[0])
                    .map(|c| Subscriber::new(vec![c], config.timeout))
                    .map_err(|e| connect_error(&n.config, Fail::Redis(e)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The database too: the same prefix on another database of the
        // same nodes is another set of locks.
        let space = LockSpace::named(&["redlock", &config.nodes[0].db.to_string(), &layout_prefix]);
        Ok(RedlockBackend {
            inner: Arc::new(Inner {
                config,
                layout,
                nodes,
                subscribers,
                space,
            }),
        })
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    /// Where the lock `name` lives on each node: the `plain` format's key,
    /// fencing counter and channel.
    pub fn keys(&self, name: &LockName) -> Result<LockKeys, LockError> {
        self.inner.layout.keys(name)
    }

    fn key_set(&self, name: &LockName) -> Result<Keys, LockError> {
        self.inner.layout.key_set(name)
    }

    fn quorum(&self) -> usize {
        self.inner.config.quorum()
    }

    /// Runs `inv` on every node at once, each within the per-node timeout.
    async fn on_all<T: FromRedisValue>(&self, inv: &ScriptInvocation<'_>) -> Vec<Result<T, Fail>> {
        self.on_all_within(inv, self.inner.config.timeout).await
    }

    /// [`on_all`](Self::on_all) with a per-node limit of `limit`.
    async fn on_all_within<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
        limit: Duration,
    ) -> Vec<Result<T, Fail>> {
        join_all(self.inner.nodes.iter().map(|n| n.invoke(inv, limit))).await
    }

    /// Removes what the attempt that stored `value` took: on the nodes that
    /// `granted` it, and on the `silent` ones (no reply, an error), whose
    /// grant may have happened with the reply lost. A node that refused
    /// holds someone else's value, so it is not asked (that was a round
    /// trip per refused attempt).
    ///
    /// Each runs in a task of its own, which may outlive the call: that is
    /// safe, as it deletes only this attempt's own value. The caller waits
    /// for the granting nodes, so that its next attempt does not meet its
    /// own leftover, but no later than `until` (the end of the step before:
    /// the undo adds no timeout of its own); a hanging silent node never
    /// holds it up.
    async fn undo(
        &self,
        keys: &Keys,
        value: &str,
        granted: &[usize],
        silent: &[usize],
        until: Instant,
    ) {
        let spawn = |nodes: Vec<usize>| {
            let this = self.clone();
            let (keys, value) = (keys.clone(), value.to_string());
            tokio::spawn(async move { this.undo_on(keys, value, nodes).await })
        };
        if !silent.is_empty() {
            spawn(silent.to_vec());
        }
        if !granted.is_empty() {
            let _ = tokio::time::timeout_at(until, spawn(granted.to_vec())).await;
        }
    }

    async fn undo_on(&self, keys: Keys, value: String, nodes: Vec<usize>) {
        let mut inv = UNDO.prepare_invoke();
        inv.key(&keys.lock).arg(&value).arg(keys.channel());
        let limit = self.inner.config.timeout;
        let replies = join_all(
            nodes
                .iter()
                .map(|&i| self.inner.nodes[i].invoke::<i64>(&inv, limit)),
        )
        .await;
        for (&i, r) in nodes.iter().zip(replies) {
            if let Err(f) = r {
                tracing::debug!(
                    node = %self.inner.nodes[i].addr(),
                    "polylock redlock: undoing an attempt failed ({}); it expires at its TTL",
                    self.inner.nodes[i].describe(&f)
                );
            }
        }
    }

    /// The stricter of `asked` and this client's configured drift: node
    /// clocks may run fast by that much, whoever asks.
    fn policy_for(&self, asked: ClockPolicy) -> ClockPolicy {
        ClockPolicy {
            drift: asked.drift.max(self.inner.config.drift_factor),
            margin: asked.margin.max(self.inner.config.drift),
        }
    }

    /// Refuses, before any I/O, a TTL that this client's drift settings
    /// leave no renewal room in ([`ClockPolicy::check_ttl`]): the Locker
    /// checked it against the policy asked for, which `drift=` and
    /// `drift_factor=` may make stricter here. Without this, every round
    /// would be granted, found to have no validity, and undone, for the
    /// whole wait.
    fn check_ttl(&self, req: &AcquireRequest) -> Result<(), LockError> {
        let (ttl, _) = guarantees().granted_ttl(req.ttl, PX_UNIT);
        self.policy_for(req.clock)
            .check_ttl(ttl)
            .map_err(|e| match e {
                LockError::InvalidTtl { ttl, reason } => LockError::InvalidTtl {
                    ttl,
                    reason: format!("{reason} (or lower this client's drift= or drift_factor=)"),
                },
                other => other,
            })
    }

    /// One acquire attempt; see the module docs.
    async fn attempt(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let keys = self.key_set(&req.name)?;
        let (ttl, ttl_ms) = guarantees().granted_ttl(req.ttl, PX_UNIT);
        let owner = attempt_value(req.owner);
        let scripts = self.inner.layout.scripts();
        let mut inv = scripts.acquire.prepare_invoke();
        let meta = req
            .meta
            .as_ref()
            .map(lock_core::HolderMeta::encode)
            .unwrap_or_default();
        inv.key(&keys.lock)
            .key(keys.fence())
            .arg(&owner)
            .arg(ttl_ms)
            .arg(&meta)
            // The value is this attempt's alone: a key holding it can only
            // be this attempt's own grant (a send the driver repeated), so
            // it is always taken over; the value serves as the attempt id
            // (ARGV[5]) the take-over checks and records.
            .arg("1")
            .arg(&owner);
        let policy = self.policy_for(req.clock);
        // Measured before sending: the validity can only come out short.
        let sent_at = Instant::now();
        let replies = self.on_all::<(i64, i64)>(&inv).await;
        // The undo waits no longer than the step it follows had left.
        let mut step_end = sent_at + self.inner.config.timeout;
        let mut tally = Tally::new(&self.inner.nodes);
        let mut granted = Vec::new();
        let mut silent = Vec::new();
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok((1, fence)) => granted.push((i, fence)),
                Ok(_) => tally.refused += 1,
                Err(f) => {
                    tally.fail(i, &f);
                    silent.push(i);
                }
            }
        }
        tally.ok = granted.len();
        let granted_at: Vec<usize> = granted.iter().map(|&(i, _)| i).collect();
        let validity_left = |now: Instant| {
            let deadline = policy.deadline(sent_at, ttl);
            match deadline.checked_duration_since(now) {
                Some(d) if !d.is_zero() => format!("validity left {d:?} of a {ttl:?} TTL"),
                _ => format!(
                    "no validity left: {:?} of a {ttl:?} TTL elapsed, drift allowance {:?}",
                    now - sent_at,
                    ttl - (deadline - sent_at)
                ),
            }
        };

        let expired = policy.deadline(sent_at, ttl) <= Instant::now();
        if tally.ok >= self.quorum() && expired {
            // No validity left already: the write-back would only cost
            // another round trip.
            let text = tally.message(
                "acquire",
                &req.name,
                "granted",
                "held by another client",
                &format!(
                    "not acquired (undone on every node): {}",
                    validity_left(Instant::now())
                ),
            );
            self.undo(&keys, &owner, &granted_at, &silent, step_end)
                .await;
            return Err(tally.error(text));
        }
        if tally.ok >= self.quorum() {
            let fence = granted.iter().map(|&(_, f)| f).max().unwrap_or_default();
            let token = u64::try_from(fence).ok().and_then(FencingToken::new);
            if let Some(token) = token {
                // Write the token back to the granting nodes behind it
                // before the lease exists: the argument in the module docs.
                // A node whose grant returned T already holds the lock with
                // counter T; when those alone are a majority (counters in
                // step, the usual case) no write-back is needed at all.
                let (at_token, behind): (Vec<_>, Vec<_>) =
                    granted.iter().partition(|&&(_, f)| f == fence);
                let behind = if at_token.len() >= self.quorum() {
                    Vec::new()
                } else {
                    behind
                };
                let mut raise = RAISE_FENCE.prepare_invoke();
                raise
                    .key(&keys.lock)
                    .key(keys.fence())
                    .arg(&owner)
                    .arg(fence);
                let limit = self.inner.config.timeout;
                step_end = Instant::now() + limit;
                let raised = join_all(
                    behind
                        .iter()
                        .map(|&&(i, _)| self.inner.nodes[i].invoke::<i64>(&raise, limit)),
                )
                .await;
                let mut written = Tally::new(&self.inner.nodes);
                written.ok = at_token.len();
                for (&&(i, _), r) in behind.iter().zip(raised) {
                    match r {
                        Ok(1) => written.ok += 1,
                        Ok(_) => written.refused += 1,
                        Err(f) => {
                            written.fail(i, &f);
                            silent.push(i);
                        }
                    }
                }
                let lease = Lease::new(req.name.clone(), req.owner, token, ttl, sent_at, policy)
                    .with_backend_key(owner.as_str());
                let now = Instant::now();
                if written.ok >= self.quorum() && lease.deadline() > now {
                    return Ok(Some(lease));
                }
                let text = if written.ok >= self.quorum() {
                    tally.message(
                        "acquire",
                        &req.name,
                        "granted",
                        "held by another client",
                        &format!(
                            "not acquired (undone on every node): {}",
                            validity_left(now)
                        ),
                    )
                } else {
                    written.message(
                        "acquire",
                        &req.name,
                        "took the fencing token",
                        "no longer held",
                        &format!(
                            "not acquired (undone on every node); {}",
                            validity_left(now)
                        ),
                    )
                };
                self.undo(&keys, &owner, &granted_at, &silent, step_end)
                    .await;
                written.permanent |= tally.permanent;
                return Err(written.error(text));
            }
            self.undo(&keys, &owner, &granted_at, &silent, step_end)
                .await;
            return Err(LockError::permanent(
                REDLOCK,
                RedisFailure(format!(
                    "acquire of lock {:?}: a node's fencing counter returned {fence}",
                    req.name
                )),
            ));
        }

        let now = Instant::now();
        self.undo(&keys, &owner, &granted_at, &silent, step_end)
            .await;
        let n = self.inner.nodes.len();
        if tally.refused > n - self.quorum() {
            // Other holders alone rule a majority out: plainly held.
            return Ok(None);
        }
        Err(tally.error(tally.message(
            "acquire",
            &req.name,
            "granted",
            "held by another client",
            &format!(
                "not acquired (undone on every node); {}",
                validity_left(now)
            ),
        )))
    }

    /// What one lease's renew on the nodes (their answers in `tally`, the
    /// request sent at `sent_at`) comes to: the extended lease with a
    /// majority within the old and the new validity, else `Lost`, after
    /// releasing it where it still holds.
    async fn judge_renewal(
        &self,
        lease: &Lease,
        tally: &Tally<'_>,
        ttl_ms: u64,
        sent_at: Instant,
    ) -> Result<Lease, LockError> {
        let ttl = Duration::from_millis(ttl_ms);
        // This client's drift allowance whatever the lease carries (a
        // migration lock rebuilds its sides' leases under the laxer policy
        // of the two).
        let renewed = lease
            .renewed(ttl, sent_at)
            .with_deadline_no_later_than(self.policy_for(lease.policy()).deadline(sent_at, ttl));
        let now = Instant::now();
        if tally.ok >= self.quorum() && now < lease.deadline() && now < renewed.deadline() {
            return Ok(renewed);
        }
        // Nodes that did not answer (in time) may still hold our key: while
        // they could make up a majority with those that renewed, and the
        // lease's own deadline is ahead, the lease stands and the caller
        // (the watchdog) asks again. A slow moment of two nodes must not end
        // a lease with most of its TTL left (seen with 10,000 leases held).
        // Lost is for refusals that rule a majority out, and for time up.
        if !tally.permanent
            && tally.ok + tally.failed.len() >= self.quorum()
            && now < lease.deadline()
        {
            return Err(tally.error(tally.message(
                "renew",
                lease.name(),
                "extended",
                "no longer ours",
                "the lease holds until its deadline; try again",
            )));
        }
        let left = lease
            .deadline()
            .checked_duration_since(now)
            .map_or("none".to_string(), |d| format!("{d:?}"));
        tracing::warn!(
            "polylock redlock: {}",
            tally.message(
                "renew",
                lease.name(),
                "extended",
                "no longer ours",
                &format!("validity left {left}; the lease is lost"),
            )
        );
        self.release_in_background(lease);
        Err(LockError::Lost {
            name: lease.name().to_string(),
        })
    }

    /// [`renew_many`](LockBackend::renew_many) of at most [`RENEW_CHUNK`](crate::backend::RENEW_CHUNK)
    /// leases: one script run on every node.
    async fn renew_chunk(&self, batch: &[(&Lease, Keys)]) -> Vec<Result<Lease, LockError>> {
        let mut inv = self.inner.layout.scripts().renew_many.prepare_invoke();
        inv.key(&batch[0].1.lock);
        let mut ttls = Vec::with_capacity(batch.len());
        for (lease, keys) in batch {
            let (_, ttl_ms) = guarantees().granted_ttl(lease.renewal_ttl(), PX_UNIT);
            inv.arg(&keys.lock)
                .arg(keys.fence())
                .arg(stored_value(lease))
                .arg(lease.fence().get())
                .arg(ttl_ms);
            ttls.push(ttl_ms);
        }
        let sent_at = Instant::now();
        let shortest = batch
            .iter()
            .map(|(l, _)| l.renewal_ttl())
            .min()
            .unwrap_or_default();
        let limit = self.inner.config.timeout.max(shortest / BATCH_SHARE_OF_TTL);
        let replies = self.on_all_within::<Vec<i64>>(&inv, limit).await;
        let judged = batch
            .iter()
            .zip(ttls)
            .enumerate()
            .map(|(j, ((lease, _), ttl_ms))| {
                let mut tally = Tally::new(&self.inner.nodes);
                for (i, r) in replies.iter().enumerate() {
                    match r {
                        Ok(codes) if codes.len() == batch.len() => match codes[j] {
                            1 => tally.ok += 1,
                            // The node could not read this lease's keys (a key
                            // of another type): a failure, as renew counts it.
                            -2 => tally.failed.push(format!(
                                "{}: the lock's keys could not be read",
                                self.inner.nodes[i].addr()
                            )),
                            _ => tally.refused += 1,
                        },
                        Ok(codes) => tally.failed.push(format!(
                            "{}: {} answers for {} leases",
                            self.inner.nodes[i].addr(),
                            codes.len(),
                            batch.len()
                        )),
                        Err(f) => tally.fail(i, f),
                    }
                }
                async move { self.judge_renewal(lease, &tally, ttl_ms, sent_at).await }
            });
        join_all(judged).await
    }

    /// Releases `lease` on every node where it still holds, quietly and in
    /// a task of its own: for a lease already declared lost, whose renew
    /// answers at once (within its op_timeout) instead of after a second
    /// round. The lease is over (refused by too many nodes, or past its
    /// deadline): this frees early the nodes that still hold it.
    fn release_in_background(&self, lease: &Lease) {
        let (this, lease) = (self.clone(), lease.clone());
        tokio::spawn(async move {
            if let Err(e) = this.release(&lease).await {
                tracing::debug!(error = %e, "polylock redlock: releasing a lost lease; what is left expires at its TTL");
            }
        });
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    /// One Redlock round: the acquire script on every node at once, then
    /// (with a majority) the token written back to the granting nodes that
    /// returned less, unless a majority returned it already; on failure,
    /// the attempt undone on every node. Costs one round trip when the
    /// nodes' counters are in step, two when some must be written back
    /// (one more on failure), each as long as the slowest node within the
    /// per-node timeout.
    ///
    /// # Cancel safety
    /// Not cancel safe: if dropped after the scripts were sent, the lock
    /// may be taken on some nodes with nobody holding the lease; they free
    /// it at its TTL.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.check_ttl(req)?;
        self.inner.space.stamp(self.attempt(req).await)
    }

    /// Attempts until one succeeds or `req.wait` runs out. After a first
    /// refused attempt the waiter subscribes to the lock's release channel
    /// on every node (the release script publishes on each node it held)
    /// and attempts again on the first message from any of them; between
    /// messages it still attempts after a random pause of at most
    /// `retry_delay`, which covers a holder that expired without a release,
    /// a foreign client's release (it publishes nothing) and a node whose
    /// subscription is down.
    ///
    /// # Cancel safety
    /// Cancel safe while it waits (its subscriptions are given up), also
    /// during a retry: that round finishes in its own task, which releases
    /// the lock if the round won it. A drop during the first attempt is like
    /// dropping [`try_acquire`](LockBackend::try_acquire).
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        self.check_ttl(req)?;
        self.inner.space.stamp(self.wait_for(req).await)
    }

    /// A lease of this client's lock space ([`LockSpace`]) only: see `renew_checked`.
    ///
    /// # Cancel safety
    /// Cancel safe, as `renew_checked`.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.inner.space.check(lease)?;
        self.renew_checked(lease).await
    }

    /// Leases of this client's lock space ([`LockSpace`]) in one batch: see
    /// `renew_many_checked`; a batch with another space's lease is renewed
    /// lease by lease.
    ///
    /// # Cancel safety
    /// Cancel safe, as `renew_many_checked`.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if self.inner.space.any_foreign(leases) {
            return lock_core::renew_each(self, leases).await;
        }
        self.renew_many_checked(leases).await
    }

    /// A lease of this client's lock space ([`LockSpace`]) only: see `release_checked`.
    ///
    /// # Cancel safety
    /// Cancel safe, as `release_checked`.
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.inner.space.check(lease)?;
        self.release_checked(lease).await
    }
    /// The `plain` inspect script on every node; the holder is the one a
    /// majority agrees on.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        let keys = self.key_set(name)?;
        let mut inv = self.inner.layout.scripts().inspect.prepare_invoke();
        inv.key(&keys.lock).key(keys.fence());
        type Row = (
            Option<String>,
            i64,
            Option<u64>,
            Option<String>,
            Option<String>,
        );
        let replies = self.on_all::<Row>(&inv).await;
        let mut tally = Tally::new(&self.inner.nodes);
        let mut rows = Vec::new();
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(row) => rows.push(row),
                Err(f) => tally.fail(i, &f),
            }
        }
        let majority = rows
            .iter()
            .filter_map(|r| r.0.as_deref())
            .find(|v| rows.iter().filter(|r| r.0.as_deref() == Some(*v)).count() >= self.quorum());
        let Some(value) = majority.map(str::to_string) else {
            if rows.len() < self.quorum() {
                tally.ok = rows.len();
                return Err(tally.error(tally.message(
                    "inspect",
                    name,
                    "answered",
                    "",
                    "too few to tell who holds it",
                )));
            }
            return Ok(None);
        };
        let mine: Vec<_> = rows
            .iter()
            .filter(|r| r.0.as_deref() == Some(value.as_str()))
            .collect();
        let expires_in = mine
            .iter()
            .filter_map(|r| u64::try_from(r.1).ok())
            .min()
            .map(Duration::from_millis);
        let ours = mine.iter().any(|r| r.3.as_deref() == Some(value.as_str()));
        Ok(Some(if ours {
            let fence = mine
                .iter()
                .filter(|r| r.3.as_deref() == Some(value.as_str()))
                .filter_map(|r| r.2)
                .max()
                .and_then(FencingToken::new);
            // The description a majority of nodes keep beside this holding.
            let ours: Vec<_> = mine
                .iter()
                .filter(|r| r.3.as_deref() == Some(value.as_str()))
                .collect();
            let meta = ours
                .iter()
                .filter_map(|r| r.4.as_deref())
                .find(|m| {
                    ours.iter().filter(|r| r.4.as_deref() == Some(*m)).count() >= self.quorum()
                })
                .and_then(lock_core::HolderMeta::decode);
            HolderInfo::new(value, fence, expires_in).with_meta(meta)
        } else {
            HolderInfo::new(foreign_value(&value), None, expires_in)
        }))
    }

    /// Deletes the lock key on every node, whoever holds it; the counters
    /// are kept. `Ok(true)` when some node had it.
    ///
    /// # Cancel safety
    /// Cancel safe: the lock is removed on some nodes or none.
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        let keys = self.key_set(name)?;
        let mut inv = FORCE_RELEASE.prepare_invoke();
        inv.key(&keys.lock).arg(keys.channel()).arg(RELEASE_MESSAGE);
        let replies = self.on_all::<i64>(&inv).await;
        let mut tally = Tally::new(&self.inner.nodes);
        let mut removed = false;
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(r) => {
                    tally.ok += 1;
                    removed |= r == 1;
                }
                Err(f) => tally.fail(i, &f),
            }
        }
        if tally.ok < self.quorum() && !removed {
            return Err(tally.error(tally.message(
                "force_release",
                name,
                "answered",
                "",
                "could not tell whether it was held",
            )));
        }
        Ok(removed)
    }

    /// See [`LockSpace`]: leases of another space are refused before any
    /// I/O.
    fn lock_space(&self) -> Option<LockSpace> {
        Some(self.inner.space)
    }

    fn guarantees(&self) -> Guarantees {
        guarantees()
    }
}

/// The trait's operations behind the check that the lease is of this
/// client's lock space ([`LockSpace`]).
impl RedlockBackend {
    /// Attempts until one succeeds or `req.wait` runs out (the trait's
    /// `acquire`, before the lease is stamped with its lock space).
    async fn wait_for(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let max = self.inner.config.retry_delay;
        let backoff = req.backoff_or(Backoff {
            initial: (max / 4).max(Duration::from_millis(1)),
            max,
        });
        // The wait counts from the call, the first round included.
        let deadline = req.wait_deadline();
        // An uncontended lock costs one round and no subscription. A first
        // round that took the whole wait is the answer: no round starts
        // after the wait ended.
        match self.attempt(req).await {
            Ok(Some(lease)) => return Ok(Some(lease)),
            Err(e) if !e.is_retryable() => return Err(e),
            other if req.wait.is_zero() || Instant::now() >= deadline => return other,
            _ => {}
        }
        let channel = self.key_set(&req.name)?.channel();
        let limit = deadline.min(Instant::now() + self.inner.config.timeout);
        // Waits for a majority of confirmed subscriptions, not for all: a
        // release publishes on every node of its holder's majority, and two
        // majorities share a node, so one message is sure to reach us; a
        // node that is down or slow does not hold the waiter up. The
        // polling backoff covers everything else.
        let mut pending: FuturesUnordered<_> = self
            .inner
            .subscribers
            .iter()
            .map(|s| s.subscribe(&channel, limit))
            .collect();
        let (mut subs, mut confirmed): (Vec<Subscription>, usize) = (Vec::new(), 0);
        while let Some((sub, ok)) = pending.next().await {
            subs.push(sub);
            confirmed += usize::from(ok);
            if confirmed >= self.quorum() {
                break;
            }
        }
        drop(pending);
        // No expiry to wait for: a holder whose lease runs out publishes
        // nothing, and the backoff's next attempt finds it gone.
        let expiry = std::sync::Mutex::new(None);
        // The subscriptions are live from here on, so the loop's first
        // attempt (made now) cannot miss a release that came after the one
        // above.
        // The retries run detached (see `lock_core::wait::detached`): a
        // wait cancelled mid-round lets the round finish and undoes a win.
        let attempt = || {
            let (this, req) = (self.clone(), req.clone());
            lock_core::wait::detached(
                async move { this.attempt(&req).await },
                lock_core::wait::release_if_won(self.clone()),
            )
        };
        acquire_loop(attempt, deadline, backoff, || wake_up(&subs, None, &expiry)).await
    }

    /// The `plain` owner- and token-checked extension on every node; a
    /// majority within the lease's validity, or the lease is lost (and
    /// released where it still holds).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped renew extended the lease on some nodes or
    /// none; the old lease's deadline stays valid either way.
    async fn renew_checked(&self, lease: &Lease) -> Result<Lease, LockError> {
        let keys = self.key_set(lease.name())?;
        let (_, ttl_ms) = guarantees().granted_ttl(lease.renewal_ttl(), PX_UNIT);
        let mut inv = self.inner.layout.scripts().renew.prepare_invoke();
        inv.key(&keys.lock)
            .key(keys.fence())
            .arg(stored_value(lease))
            .arg(lease.fence().get())
            .arg(ttl_ms);
        let sent_at = Instant::now();
        let replies = self.on_all::<i64>(&inv).await;
        let mut tally = Tally::new(&self.inner.nodes);
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(1) => tally.ok += 1,
                Ok(_) => tally.refused += 1,
                Err(f) => tally.fail(i, &f),
            }
        }
        self.judge_renewal(lease, &tally, ttl_ms, sent_at).await
    }

    /// The `plain` batch renew script ([`RENEW_CHUNK`](crate::backend::RENEW_CHUNK) leases at most per
    /// run) on every node at once: one request per node for each chunk, the
    /// chunks sent together. Each lease is then judged by its own majority
    /// and validity exactly as [`renew`](LockBackend::renew) judges it, and
    /// a lease that is lost is released where it still holds.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`renew`](LockBackend::renew): each lease was
    /// extended on some nodes or none, and its old deadline stays valid.
    async fn renew_many_checked(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        renew_chunked(
            leases,
            |n| self.key_set(n),
            |c| async move { self.renew_chunk(&c).await },
        )
        .await
    }

    /// The `plain` owner- and token-checked delete on every node.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release removed the lock on some nodes or
    /// none; the rest expires at its TTL.
    async fn release_checked(&self, lease: &Lease) -> Result<(), LockError> {
        let keys = self.key_set(lease.name())?;
        let mut inv = RELEASE.prepare_invoke();
        inv.key(&keys.lock)
            .key(keys.fence())
            .arg(stored_value(lease))
            .arg(lease.fence().get())
            .arg(keys.channel());
        let replies = self.on_all::<i64>(&inv).await;
        let mut tally = Tally::new(&self.inner.nodes);
        let mut taken_since = 0;
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(1) => tally.ok += 1,
                Ok(0) => {}
                Ok(_) => {
                    tally.refused += 1;
                    taken_since += 1;
                }
                Err(f) => tally.fail(i, &f),
            }
        }
        if tally.ok >= self.quorum() {
            return Ok(());
        }
        if taken_since > 0 {
            return Err(LockError::Lost {
                name: lease.name().to_string(),
            });
        }
        if tally.failed.is_empty() {
            // Expired everywhere, and nobody was granted it since.
            return Ok(());
        }
        Err(tally.error(tally.message(
            "release",
            lease.name(),
            "released",
            "held by another since",
            "the release could not be confirmed; what is left expires at its TTL",
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_deadline_is_the_validity_from_the_send() {
        let cfg = RedlockConfig::parse("redlock://a,b,c?drift_factor=0.1&drift=5ms").unwrap();
        let ttl = Duration::from_secs(1);
        let sent = Instant::now();
        let policy = ClockPolicy {
            drift: ClockPolicy::default().drift.max(cfg.drift_factor),
            margin: ClockPolicy::default().margin.max(cfg.drift),
        };
        // validity = ttl - elapsed - drift, so the deadline (send + elapsed
        // + validity) is send + ttl - drift, whatever the elapsed time.
        assert_eq!(policy.deadline(sent, ttl), sent + ttl - cfg.drift_for(ttl));
    }

    #[test]
    fn a_lease_uses_its_stored_value_only_under_its_own_owner_token() {
        let name = LockName::new("x").unwrap();
        let owner = OwnerToken::random();
        let value = attempt_value(owner);
        assert_ne!(value, attempt_value(owner), "one nonce per attempt");
        let fence = FencingToken::new(7).unwrap();
        let policy = ClockPolicy::default();
        let ttl = Duration::from_secs(1);
        let lease = Lease::new(name.clone(), owner, fence, ttl, Instant::now(), policy)
            .with_backend_key(value.as_str());
        assert_eq!(stored_value(&lease), value);
        // A forged lease that copied the key under another owner's token.
        let other = OwnerToken::random();
        let forged = Lease::new(name, other, fence, ttl, Instant::now(), policy)
            .with_backend_key(value.as_str());
        assert_eq!(stored_value(&forged), other.to_string());
    }

    #[test]
    fn min_ttl_leaves_room_for_the_default_drift() {
        let cfg = RedlockConfig::parse("redlock://a,b,c").unwrap();
        assert!(cfg.drift_for(REDLOCK_MIN_TTL) < REDLOCK_MIN_TTL / 10);
        let g = guarantees();
        assert_eq!(g.effective_ttl(Duration::from_millis(5)), REDLOCK_MIN_TTL);
    }
}
