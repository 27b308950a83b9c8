//! [`RedisBackend`]: the [`LockBackend`] implementation.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::turns::{Turn, Turns};
use lock_core::wait::{acquire_loop, Backoff};
use lock_core::{
    validate_list, AcquireRequest, ExpiryClock, FencingGuarantee, FencingToken, Guarantees,
    HolderInfo, HolderMeta, Lease, LockBackend, LockError, LockName, LockSpace, OwnerToken,
    WaitMechanism,
};
use tokio::time::Instant;

use crate::config::{Algorithm, Format, RedisConfig};
use crate::conn::{client_for, Link, Pinned};
use crate::errors::{connect_error, to_lock_error, Fail, FailText, RedisFailure, BACKEND};
use crate::format::{all_scripts, Keys, Layout, LockKeys, FAIR, FORCE_RELEASE, RELEASE_MESSAGE};
use crate::nodes::{Follower, Nodes};
use crate::wait::{wake_up, ForeignWake, GrantSlot, Subscriber};

/// What can make fencing tokens go backwards on Redis.
pub const FENCING_CAVEAT: &str = "the counter lives in the Redis data set: a failover to a replica \
     that had not received the increment repeats tokens, and a counter that is lost (restart without \
     persistence, eviction) restarts from the server's clock, which a clock stepped back defeats";

/// Fallback polling while subscribed and every release is announced (our
/// message, Redisson's message, or a keyspace event): messages do the
/// waking, this only bounds the delay when one is lost.
const SUBSCRIBED_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_millis(500),
};

/// Fallback polling of a fair-mode waiter: each attempt also pushes its
/// queue entry's deadline on, so the longest pause stays far below
/// [`MIN_QUEUE_ENTRY_LIFE`].
const FAIR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_millis(300),
};

/// The shortest life of a fair-mode queue entry between two attempts of
/// its waiter; it is twice the operation timeout when that is longer, so a
/// slow reply does not cost a live waiter its place. A crashed waiter
/// holds up the queue this long at most.
const MIN_QUEUE_ENTRY_LIFE: Duration = Duration::from_secs(2);

/// How recent a fair-mode waiter's last attempt must be for a release to
/// grant it the lock outright (its own token, kept in its queue entry, for
/// [`GRANT_CLAIM`]) instead of waking it to try. A live waiter attempts at
/// least every [`FAIR_BACKOFF`] maximum (plus the attempt's own time); an
/// entry older than this may belong to a waiter that died.
const GRANT_FRESHNESS: Duration = Duration::from_secs(1);

/// How long a fair-mode release grants the lock to the waiter it hands it
/// to (or the waiter's TTL, if shorter). The waiter is not asked whether it
/// still lives: a grant to one that died within [`GRANT_FRESHNESS`] of its
/// last attempt (or whose leave after a cancelled wait was lost) leaves the
/// lock to nobody, and this bounds that to a claim window instead of a
/// whole TTL. A live waiter's lease is granted for the window and renews to
/// its TTL at a third of it (the watchdog's first renewal); the grant is
/// trusted only while half the window is left (`granted`), so that first
/// renewal always comes before the window ends.
const GRANT_CLAIM: Duration = Duration::from_secs(2);

/// Polling for a foreign holder's release when the server sends no
/// keyspace events: it announces nothing, so this is the hand-off delay.
const FOREIGN_POLL_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(10),
    max: Duration::from_millis(100),
};

/// The most leases one batch-renew script run carries. A script blocks the
/// server while it runs, for three commands per lease, so the chunk bounds
/// how long any other client can be held up by a renewal; the chunks of one
/// batch go out together on the multiplexed connection.
pub const RENEW_CHUNK: usize = 128;

/// What a Redis lock backend promises for `algorithm`.
///
/// [`Algorithm::SingleInstance`], whatever server it talks to:
/// - fencing: [`FencingGuarantee::UnlessDataLoss`] ([`FENCING_CAVEAT`]).
/// - expiry by the server's clock (`PX`, `PEXPIRE`).
/// - `survives_restart: false`: Redis acknowledges a write before it is on
///   disk (RDB snapshots are periodic; AOF's default `appendfsync everysec`
///   fsyncs once a second), so a restart can lose a just-acquired lock and
///   admit a second holder. Only `appendonly yes` + `appendfsync always`
///   closes that window; the backend cannot know how the server is run.
/// - `survives_failover: false`: replication is asynchronous; `WAIT`
///   (`wait_replicas=`) narrows the window but does not close it.
/// - waiters wake on pub/sub messages; `force_release` is supported.
/// - holder metadata (in polylock's bookkeeping hash beside the lock),
///   `list` (a `SCAN` of the bookkeeping hashes, on every master of a
///   cluster) and waiter counts (`PUBSUB NUMSUB` of the release channel,
///   summed over a cluster's nodes) are supported.
/// - `batch_renew`: [`renew_many`](LockBackend::renew_many) runs one script
///   per [`RENEW_CHUNK`] leases (on a cluster, one per node the chunk's keys
///   live on).
///
/// [`Algorithm::Redlock`]:
/// - fencing: [`FencingGuarantee::UnlessDataLoss`]
///   ([`REDLOCK_FENCING_CAVEAT`](crate::REDLOCK_FENCING_CAVEAT)).
/// - expiry by each node's clock (`PX`).
/// - `survives_restart: false`: a node that restarts without its data (or
///   a majority of them) can admit a second holder; the backend cannot know
///   how the nodes persist.
/// - waiters wake on the release message, subscribed on every node (a
///   release publishes on each node it held), and still attempt after a
///   jittered delay of at most `retry_delay` between messages.
/// - TTLs of at least [`REDLOCK_MIN_TTL`](crate::REDLOCK_MIN_TTL), in milliseconds;
///   `force_release` removes the lock on every node.
/// - holder metadata: each node's grant writes it beside the lock, and
///   `inspect` shows what a majority of the holder's nodes agree on. No
///   `list` and no waiter count.
/// - `batch_renew`: one script per node for each [`RENEW_CHUNK`] leases.
pub fn guarantees(algorithm: Algorithm) -> Guarantees {
    if algorithm == Algorithm::Redlock {
        return crate::redlock::guarantees();
    }
    let mut g = Guarantees::new(BACKEND);
    g.fencing = FencingGuarantee::UnlessDataLoss(FENCING_CAVEAT);
    g.fair_fifo = false;
    g.expiry_clock = ExpiryClock::Server;
    g.survives_restart = false;
    g.survives_failover = false;
    g.wait = WaitMechanism::PubSub;
    g.min_ttl = Duration::from_millis(1);
    g.ttl_granularity = Duration::from_millis(1);
    g.force_release = true;
    g.holder_meta = true;
    g.list = true;
    g.counts_waiters = true;
    g.batch_renew = true;
    g
}

/// What a Redis lock backend with `config` promises: [`guarantees`] of a
/// single instance, and with `fair=true` ([`RedisConfig::fair`]) waiters
/// served in arrival order (`fair_fifo`), among polylock clients in fair
/// mode; waiter counts are then the live entries of the lock's queue.
pub fn guarantees_for(config: &RedisConfig) -> Guarantees {
    let mut g = guarantees(Algorithm::SingleInstance);
    g.fair_fifo = config.fair;
    g
}

/// A lock client of one Redis server or Redis Cluster.
///
/// Holds one multiplexed command connection (reconnecting by itself) and,
/// once something waits, one pub/sub connection shared by all waiters.
/// Clones share both. Make it inside the tokio runtime that will use it.
///
/// ```no_run
/// # async fn f() -> Result<(), lock_core::LockError> {
/// use lock_core::Locker;
/// let backend = backend_redis::RedisBackend::connect("redis://127.0.0.1:6379/0").await?;
/// let locker = Locker::new(backend);
/// let guard = locker.lock("nightly-report").acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    layout: Layout,
    link: Link,
    subscriber: Subscriber,
    /// A cluster's nodes, each reachable on its own.
    nodes: Option<Nodes>,
    /// The slot followers of the keys this client's waiters wait for, one
    /// per key however many of its tasks wait (each checks the slot's
    /// owner every second).
    followers: Mutex<HashMap<String, Weak<Follower>>>,
    foreign_wake: ForeignWake,
    /// Acquire attempts (name, owner) whose reply never arrived: timed
    /// out, failed on the wire, or dropped. Such an attempt may have taken
    /// the lock on the server; the next attempt of the same owner takes
    /// that grant back instead of waiting for it (in the Redisson format,
    /// the same holder field would otherwise count one more hold). Without
    /// a mark, a grant under the owner's token is another acquisition's,
    /// never taken over (plain_acquire.lua).
    ///
    /// With each mark, the id of the unanswered attempt, written beside the
    /// grant (or, in the Redisson format, the hold) it may have made (the
    /// bookkeeping hash's `attempt`) and reused by the attempts after it:
    /// an owner token may serve several acquisitions (one
    /// [`lock_core::Owner`] used twice, or with two lockers), and only that
    /// attempt's grant is taken over.
    unanswered: Mutex<HashMap<(LockName, OwnerToken), Mark>>,
    /// One acquire attempt at a time per name and owner, each with what
    /// cleans up after it (`RetryInFlight`, a detached retry's undo). The
    /// unanswered mark lets an attempt take over the grant of the one
    /// before; an [`lock_core::Owner`]'s next acquisition waits here until
    /// that cleanup has run, so it is never the grant taken over, nor the
    /// one the cleanup then frees.
    turns: Turns,
    /// The lock space stamped on this client's leases (wire format,
    /// database and key prefix); renew and release refuse another space's.
    space: LockSpace,
}

/// How many unanswered attempts a client remembers.
const MAX_UNANSWERED: usize = 4096;

/// A waiting acquire's retry in flight (plain format). Dropped before its
/// answer (the wait was cancelled), it sends an owner-checked release of
/// the attempt's owner on the same connection (`pinned` before the retry
/// went out; kept although the dropped retry condemned it). The server runs
/// commands of one connection in order, so that release runs after the
/// retry's script:
/// if the retry took the lock, the release frees it (and wakes the
/// waiters, or in fair mode hands the lock on); if not, it changes nothing.
/// Its fencing token is the highest there is, so the counter check passes,
/// and the owner and the attempt decide: it frees only a grant the retry's
/// attempt made (its id, kept with the unanswered mark), never another
/// acquisition's under the same owner token (one [`lock_core::Owner`] on two
/// clients). An Owner's next acquisition of the name on this client waits
/// for the retry's turn, which the release keeps until it is answered.
struct RetryInFlight<'a> {
    backend: &'a RedisBackend,
    req: &'a AcquireRequest,
    /// `None` once answered.
    turn: Option<Turn>,
    /// The connection the retry goes out on.
    pinned: Pinned,
}

impl Drop for RetryInFlight<'_> {
    fn drop(&mut self) {
        let (Some(turn), Ok(rt), Some(fence)) = (
            self.turn.take(),
            tokio::runtime::Handle::try_current(),
            FencingToken::new(u64::MAX),
        ) else {
            return;
        };
        // The unanswered mark the retry left holds the id its grant (if
        // any) carries; without a mark nothing of the retry was sent. The
        // mark goes with the undo: left in place, the same owner's next
        // acquisition would reuse the id, and should this undo reach the
        // server late (a stalled connection, after its own timeout), it
        // would release that acquisition's lock. A grant of the retry that
        // the undo misses expires at its TTL.
        let attempt = self
            .backend
            .inner
            .unanswered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(self.req.name.clone(), self.req.owner))
            .map(|m| m.id);
        let Some(attempt) = attempt else {
            return;
        };
        let backend = self.backend.clone();
        let lease = self.req.lease(fence, self.req.ttl, Instant::now());
        let pinned = self.pinned.clone();
        rt.spawn(async move {
            let _turn = turn;
            match backend
                .release_via(&lease, Some(&pinned), Some(&attempt))
                .await
            {
                // Released what the retry won, found nothing, or found
                // someone else's lock (left untouched): all as it should be.
                Ok(()) | Err(LockError::Lost { .. }) => {}
                Err(e) => {
                    tracing::debug!(name = %lease.name(), error = %e, "polylock redis: could not undo a cancelled retry; a lock it took expires at its TTL");
                }
            }
        });
    }
}

/// Marks an attempt unanswered until it is disarmed by a reply; dropping
/// the attempt's future leaves the mark in place.
struct Unanswered<'a> {
    set: &'a Mutex<HashMap<(LockName, OwnerToken), Mark>>,
    key: Option<(LockName, OwnerToken)>,
}

/// An unanswered mark: see `Inner::unanswered`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mark {
    /// The unanswered attempt's id, reused by the attempts after it.
    id: String,
    /// When the last attempt under this mark was sent.
    last_sent: Instant,
}

impl<'a> Unanswered<'a> {
    /// Marks `key`; returns the guard, the attempt's id, and whether an
    /// earlier attempt of the same owner on the same name went unanswered
    /// (its id is then this attempt's too: its grant is the one this
    /// attempt may take over).
    fn mark(
        set: &'a Mutex<HashMap<(LockName, OwnerToken), Mark>>,
        key: (LockName, OwnerToken),
    ) -> (Self, String, bool) {
        // Every critical section is one insert, remove or clear.
        let mut marks = set.lock().unwrap_or_else(|p| p.into_inner());
        // Marks of attempts nobody retried would pile up; forgetting them
        // only costs a retry its recovery (one extra hold in the Redisson
        // format, a wait for its own grant's TTL in the plain one), never
        // safety.
        if marks.len() >= MAX_UNANSWERED {
            marks.clear();
        }
        let earlier = marks.contains_key(&key);
        // Marked right before the send.
        let now = Instant::now();
        let mark = marks.entry(key.clone()).or_insert_with(|| Mark {
            id: format!("{:016x}", rand::random::<u64>()),
            last_sent: now,
        });
        mark.last_sent = now;
        let id = mark.id.clone();
        drop(marks);
        (
            Unanswered {
                set,
                key: Some(key),
            },
            id,
            earlier,
        )
    }

    /// The server answered: the outcome is known.
    fn answered(mut self) {
        if let Some(key) = self.key.take() {
            self.set
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
        }
    }
}

/// A waiting acquire in progress: see [`RedisBackend::give_back_unanswered`].
struct WaitEnded<'a> {
    backend: &'a RedisBackend,
    req: &'a AcquireRequest,
    with_lease: bool,
}

impl Drop for WaitEnded<'_> {
    fn drop(&mut self) {
        if !self.with_lease {
            self.backend.give_back_unanswered(self.req);
        }
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.inner.config.redacted_url())
            .field("format", &self.inner.config.format())
            .field("cluster", &self.inner.config.is_cluster())
            .field("foreign_wake", &self.inner.foreign_wake)
            .finish_non_exhaustive()
    }
}

/// A lock's holder as `inspect` shows it, and whether it is the holder of
/// the last polylock grant.
struct Holder {
    info: HolderInfo,
    ours: bool,
}

/// The outcome of one attempt.
enum Attempt {
    Acquired(Lease),
    /// Held by someone else; `expires_in` is the holder's remaining TTL on
    /// the server, if it has one.
    Held {
        expires_in: Option<Duration>,
        /// When the refused request was sent, and the lock's fencing
        /// counter it saw (fair mode): a grant message with a higher token
        /// was made after that request, so the lock's expiry on the server
        /// is no earlier than this send time plus the TTL.
        refused: Option<(Instant, u64)>,
    },
}

impl RedisBackend {
    /// Parses `url` (see [`RedisConfig::parse`]) and connects.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped connect leaves nothing behind.
    pub async fn connect(url: &str) -> Result<RedisBackend, LockError> {
        Self::connect_with(RedisConfig::parse(url)?).await
    }

    /// Connects with a parsed configuration: checks that the server answers
    /// with these credentials and database, and loads the scripts.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped connect leaves nothing behind.
    pub async fn connect_with(config: RedisConfig) -> Result<RedisBackend, LockError> {
        let link = Link::connect(&config)
            .await
            .map_err(|f| connect_error(&config, f))?;
        link.load_scripts(&all_scripts())
            .await
            .map_err(|f| to_lock_error(&config, "loading the lock scripts", f))?;
        let clients = config
            .nodes
            .iter()
            .map(|n| client_for(&config, n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| connect_error(&config, Fail::Redis(e)))?;
        let subscriber = Subscriber::new(clients, config.timeout);
        let layout = Layout {
            format: config.format,
            prefix: config.prefix.clone(),
            cluster: config.cluster,
        };
        let nodes = config.cluster.then(|| Nodes::new(&config));
        let foreign_wake = ForeignWake::detect(&config, &link, nodes.as_ref()).await;
        let space = LockSpace::named(&[
            "redis",
            config.format.as_str(),
            &config.db.to_string(),
            &config.prefix,
        ]);
        let backend = RedisBackend {
            inner: Arc::new(Inner {
                config,
                layout,
                link,
                subscriber,
                nodes,
                followers: Mutex::default(),
                foreign_wake,
                unanswered: Mutex::default(),
                turns: Turns::default(),
                space,
            }),
        };
        tracing::info!(
            url = %backend.inner.config.redacted_url(),
            format = %backend.inner.config.format(),
            foreign_wake = %foreign_wake,
            "polylock redis: connected; waiters wake by {}",
            backend.wake_mode()
        );
        Ok(backend)
    }

    /// How this client's waiters learn that a foreign holder (a client
    /// other than polylock) released: decided at connect time from the
    /// format and the server's `notify-keyspace-events`.
    pub fn foreign_wake(&self) -> ForeignWake {
        self.inner.foreign_wake
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// Where the lock `name` lives: its key, fencing counter and release
    /// channel, for interoperating clients and operators. Fails only for a
    /// name the format cannot store (a name with braces, in the `redisson`
    /// format, on a cluster).
    pub fn keys(&self, name: &LockName) -> Result<LockKeys, LockError> {
        self.inner.layout.keys(name)
    }

    fn key_set(&self, name: &LockName) -> Result<Keys, LockError> {
        self.inner.layout.key_set(name)
    }

    fn err(&self, what: &str, name: &LockName, fail: Fail) -> LockError {
        to_lock_error(
            &self.inner.config,
            &format!("{what} of lock {name:?}"),
            fail,
        )
    }

    /// Runs `inv` (on `via`'s connection when given, see
    /// [`Link::invoke_on`]); with `wait_replicas`, in one pipeline with
    /// `WAIT` on the same connection, returning how many replicas
    /// acknowledged.
    async fn run_script<T: redis::FromRedisValue>(
        &self,
        what: &str,
        name: &LockName,
        key: &str,
        inv: &redis::ScriptInvocation<'_>,
        via: Option<&Pinned>,
    ) -> Result<(T, Option<u32>), LockError> {
        let r = match self.inner.config.wait_replicas {
            None => self
                .inner
                .link
                .invoke_via(via, inv)
                .await
                .map(|r| (r, None)),
            Some(replicas) => self
                .inner
                .link
                .invoke_and_wait(via, inv, key, replicas, self.inner.config.wait_timeout)
                .await
                .map(|(r, acked)| (r, Some(acked))),
        };
        r.map_err(|f| self.err(what, name, f))
    }

    /// The error for a write fewer than `wait_replicas` acknowledged.
    fn unreplicated(&self, what: &str, name: &LockName, acked: u32, undone: &str) -> LockError {
        LockError::transient(
            BACKEND,
            RedisFailure(format!(
                "{what} of lock {name:?}: only {acked} of {} replicas acknowledged it within {:?}; {undone}",
                self.inner.config.wait_replicas.unwrap_or_default(),
                self.inner.config.wait_timeout,
            )),
        )
    }

    /// The turn an acquire attempt of `req` takes first (see `Inner::turns`).
    fn turn(
        &self,
        req: &AcquireRequest,
    ) -> impl std::future::Future<Output = Turn> + Send + 'static {
        self.inner.turns.take(&req.name, req.owner)
    }

    /// One acquire attempt, keeping what a waiter needs to know. In fair
    /// mode `waiter` is the attempt's queue entry and whether a refused
    /// attempt joins (or stays in) the queue. Called in the turn of `req`'s
    /// name and owner (`RedisBackend::turn`), held at least until it returns.
    /// `via`: the connection it must go out on (a retry whose cancellation
    /// sends its undo there, behind it).
    async fn attempt(
        &self,
        req: &AcquireRequest,
        waiter: Option<(&str, bool)>,
        via: Option<&Pinned>,
    ) -> Result<Attempt, LockError> {
        let keys = self.key_set(&req.name)?;
        let (ttl, ttl_ms) = self.guarantees().granted_ttl(req.ttl, PX_UNIT);
        let scripts = self.inner.layout.scripts();
        let holder = self.inner.layout.holder(req.owner);
        let (pending, attempt_id, recover) =
            Unanswered::mark(&self.inner.unanswered, (req.name.clone(), req.owner));
        let meta = req
            .meta
            .as_ref()
            .map(HolderMeta::encode)
            .unwrap_or_default();
        let mut inv = match waiter {
            Some(_) => FAIR.acquire.prepare_invoke(),
            None => scripts.acquire.prepare_invoke(),
        };
        inv.key(&keys.lock).key(keys.fence());
        match (self.inner.layout.format, waiter) {
            // Fair mode is plain-format only (refused at parse otherwise).
            (Format::Plain, Some((id, join))) => inv
                .key(keys.queue())
                .key(keys.queue_deadlines())
                .key(keys.queue_waiters())
                .arg(&holder)
                .arg(ttl_ms)
                .arg(&meta)
                .arg(id)
                .arg(if join { "1" } else { "0" })
                .arg(self.queue_entry_life().as_millis() as u64)
                .arg(keys.wake_prefix())
                .arg(keys.channel())
                .arg(GRANT_FRESHNESS.as_millis() as u64)
                .arg(1)
                .arg(ttl_ms.min(GRANT_CLAIM.as_millis() as u64))
                .arg(&attempt_id),
            // A grant under our token is taken over only when it carries
            // this attempt's id (plain_acquire.lua), which no other grant
            // does: it is this attempt's own, from an earlier unanswered
            // attempt whose id this one reuses, or from a send the driver
            // repeated after a broken connection (which would otherwise
            // find its own grant held). So the takeover is always asked for.
            (Format::Plain, None) => inv
                .arg(&holder)
                .arg(ttl_ms)
                .arg(&meta)
                .arg(1)
                .arg(&attempt_id),
            // The hold taken back must be the one this attempt's id added
            // (redisson_acquire.lua), not another acquisition's of the
            // same owner.
            (Format::Redisson, _) => inv
                .key(keys.bookkeeping())
                .arg(ttl_ms)
                .arg(&holder)
                .arg(u8::from(recover))
                .arg(&meta)
                .arg(&attempt_id),
        };
        // Measured before sending: the deadline can only come early.
        let sent_at = Instant::now();
        let reply = self
            .run_script("acquire", &req.name, &keys.lock, &inv, via)
            .await;
        // A failure that is not retryable is the server's definite answer;
        // a retryable one (timeout, connection) leaves the outcome unknown.
        if reply.as_ref().map_or_else(|e| !e.is_retryable(), |_| true) {
            pending.answered();
        }
        let (answer, acked): (Vec<i64>, _) = reply?;
        let (taken, n) = match answer[..] {
            [taken, n, ..] => (taken, n),
            _ => {
                return Err(LockError::permanent(
                    BACKEND,
                    RedisFailure(format!(
                        "acquire of lock {:?}: the script answered {answer:?}",
                        req.name
                    )),
                ))
            }
        };
        if taken != 1 {
            let expires_in = u64::try_from(n).ok().map(Duration::from_millis);
            let refused = answer
                .get(2)
                .and_then(|c| u64::try_from(*c).ok())
                .map(|counter| (sent_at, counter));
            return Ok(Attempt::Held {
                expires_in,
                refused,
            });
        }
        let fence = u64::try_from(n)
            .ok()
            .and_then(FencingToken::new)
            .ok_or_else(|| {
                LockError::permanent(
                    BACKEND,
                    RedisFailure(format!(
                        "acquire of lock {:?}: the fencing counter {} returned {n}",
                        req.name,
                        keys.fence()
                    )),
                )
            })?;
        let lease = req.lease(fence, ttl, sent_at);
        if let (Some(acked), Some(replicas)) = (acked, self.inner.config.wait_replicas) {
            if acked < replicas {
                // Undone, since it could vanish in a failover.
                if let Err(e) = self.release(&lease).await {
                    tracing::debug!(error = %e, "polylock redis: undoing an unreplicated acquire failed; it expires at its TTL");
                }
                return Err(self.unreplicated(
                    "acquire",
                    &req.name,
                    acked,
                    "the lock was released again",
                ));
            }
        }
        Ok(Attempt::Acquired(lease))
    }

    /// The renewed lease for a renew script's "extended", sent at
    /// `sent_at`; with `wait_replicas`, an error when too few replicas
    /// acknowledged it.
    fn extended(
        &self,
        lease: &Lease,
        ttl_ms: u64,
        sent_at: Instant,
        acked: Option<u32>,
    ) -> Result<Lease, LockError> {
        if let (Some(acked), Some(replicas)) = (acked, self.inner.config.wait_replicas) {
            if acked < replicas {
                // The extension may vanish in a failover: the lease keeps
                // its old deadline, and the watchdog retries.
                return Err(self.unreplicated(
                    "renew",
                    lease.name(),
                    acked,
                    "the lease keeps its previous deadline",
                ));
            }
        }
        Ok(lease.renewed(Duration::from_millis(ttl_ms), sent_at))
    }

    /// [`renew_many`](LockBackend::renew_many) of at most [`RENEW_CHUNK`]
    /// leases: one script run, or on a cluster one per node they span.
    async fn renew_chunk(&self, batch: &[(&Lease, Keys)]) -> Vec<Result<Lease, LockError>> {
        let cluster = self.inner.nodes.is_some();
        let scripts = self.inner.layout.scripts();
        let script = if cluster {
            &scripts.renew_many_cluster
        } else {
            &scripts.renew_many
        };
        let mut out: Vec<Option<Result<Lease, LockError>>> = batch.iter().map(|_| None).collect();
        let mut left: Vec<usize> = (0..batch.len()).collect();
        // Leases to renew on their own, after the script runs.
        let mut alone = Vec::new();
        while let Some(&first) = left.first() {
            let first_key = &batch[first].1.lock;
            let mut inv = script.prepare_invoke();
            inv.key(first_key);
            let mut ttls = Vec::with_capacity(left.len());
            for &i in &left {
                let (lease, keys) = &batch[i];
                let (_, ttl_ms) = self.guarantees().granted_ttl(lease.renewal_ttl(), PX_UNIT);
                inv.arg(&keys.lock)
                    .arg(keys.fence())
                    .arg(self.inner.layout.holder(lease.owner()))
                    .arg(lease.fence().get())
                    .arg(ttl_ms);
                ttls.push(ttl_ms);
            }
            // Measured before sending: the deadlines can only come early.
            let sent_at = Instant::now();
            let reply: Result<(Vec<i64>, Option<u32>), Fail> = match self.inner.config.wait_replicas
            {
                None => self.inner.link.invoke(&inv).await.map(|r| (r, None)),
                Some(replicas) => self
                    .inner
                    .link
                    .invoke_and_wait(
                        None,
                        &inv,
                        first_key,
                        replicas,
                        self.inner.config.wait_timeout,
                    )
                    .await
                    .map(|(r, acked)| (r, Some(acked))),
            };
            match reply {
                Ok((codes, acked)) if codes.len() == left.len() => {
                    let mut next = Vec::new();
                    for ((&i, code), ttl_ms) in left.iter().zip(codes).zip(ttls) {
                        let lease = batch[i].0;
                        match code {
                            1 => out[i] = Some(self.extended(lease, ttl_ms, sent_at, acked)),
                            // Served by another node: the next run goes there.
                            -2 if cluster && i != first => next.push(i),
                            -2 => alone.push(i),
                            _ => {
                                out[i] = Some(Err(LockError::Lost {
                                    name: lease.name().to_string(),
                                }))
                            }
                        }
                    }
                    left = next;
                }
                Ok((codes, _)) => {
                    let text = format!(
                        "the batch renew script answered {} times for {} leases",
                        codes.len(),
                        left.len()
                    );
                    for i in left.drain(..) {
                        out[i] = Some(Err(LockError::permanent(
                            BACKEND,
                            RedisFailure(format!("renew of lock {:?}: {text}", batch[i].0.name())),
                        )));
                    }
                }
                // The server refused the run itself: each lease on its own.
                Err(Fail::Redis(e))
                    if cluster
                        && !(e.is_io_error()
                            || e.is_timeout()
                            || e.is_connection_dropped()
                            || e.is_connection_refusal()) =>
                {
                    tracing::debug!(error = %self.inner.config.scrub(e.to_string()), "polylock redis: a batch renew was refused; renewing its leases one by one");
                    alone.append(&mut left);
                }
                Err(fail) => {
                    let text = FailText::new(&self.inner.config, &fail);
                    for i in left.drain(..) {
                        out[i] = Some(Err(
                            text.error(&format!("renew of lock {:?}", batch[i].0.name()))
                        ));
                    }
                }
            }
        }
        let singles =
            futures::future::join_all(alone.iter().map(|&i| self.renew(batch[i].0))).await;
        for (i, r) in alone.into_iter().zip(singles) {
            out[i] = Some(r);
        }
        every_answer(out, batch.iter().map(|(l, _)| *l))
    }

    /// Who holds `name`, and whether it is the holder polylock's
    /// bookkeeping records (a lock this library took).
    async fn holder(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let keys = self.key_set(name)?;
        let mut inv = self.inner.layout.scripts().inspect.prepare_invoke();
        inv.key(&keys.lock).key(keys.fence());
        if self.inner.layout.format == Format::Redisson {
            inv.key(keys.bookkeeping());
        }
        let err = |e: redis::RedisError| self.err("inspect", name, Fail::Redis(e));
        let reply: Vec<redis::Value> = self
            .inner
            .link
            .invoke(&inv)
            .await
            .map_err(|f| self.err("inspect", name, f))?;
        let mut reply = reply.into_iter();
        let mut next = || reply.next().unwrap_or(redis::Value::Nil);
        let holder = next();
        let pttl: i64 = redis::from_redis_value(next()).map_err(|e| err(e.into()))?;
        let fence: Option<u64> = redis::from_redis_value(next()).map_err(|e| err(e.into()))?;
        // The holder of the last polylock grant (the token, or the
        // Redisson field), and its description.
        let last_grant: Option<String> =
            redis::from_redis_value(next()).map_err(|e| err(e.into()))?;
        let meta: Option<String> = redis::from_redis_value(next()).map_err(|e| err(e.into()))?;
        let expires_in = u64::try_from(pttl).ok().map(Duration::from_millis);
        let holder = match self.inner.layout.format {
            Format::Plain => {
                let redis::Value::BulkString(value) = holder else {
                    return Ok(None);
                };
                let value = String::from_utf8_lossy(&value).into_owned();
                // Ours exactly when the value is the token of the last
                // polylock grant: foreign clients never write that field.
                if last_grant.as_deref() == Some(value.as_str()) {
                    Holder {
                        info: HolderInfo::new(value, fence.and_then(FencingToken::new), expires_in)
                            .with_meta(meta.as_deref().and_then(HolderMeta::decode)),
                        ours: true,
                    }
                } else {
                    Holder {
                        info: HolderInfo::new(self.foreign_holder(&value), None, expires_in),
                        ours: false,
                    }
                }
            }
            Format::Redisson => {
                let pairs: Vec<String> =
                    redis::from_redis_value(holder).map_err(|e| err(e.into()))?;
                // field, count, field, count, ...: a Redisson lock has one
                // field; show them all if someone wrote more.
                let fields: Vec<_> = pairs.chunks(2).map(|p| p[0].clone()).collect();
                if fields.is_empty() {
                    return Ok(None);
                }
                let owner = fields.join(",");
                let fence = fence
                    .filter(|_| self.inner.layout.looks_like_ours(&owner))
                    .and_then(FencingToken::new);
                let ours = fields.len() == 1 && last_grant.as_deref() == Some(owner.as_str());
                let meta = meta
                    .as_deref()
                    .filter(|_| ours)
                    .and_then(HolderMeta::decode);
                Holder {
                    info: HolderInfo::new(owner, fence, expires_in).with_meta(meta),
                    ours,
                }
            }
        };
        Ok(Some(holder))
    }

    /// Every key that looks like this layout's bookkeeping, from `SCAN` on
    /// the server or on every master of the cluster (duplicates possible
    /// while slots move).
    async fn bookkeeping_keys(&self) -> Result<Vec<String>, LockError> {
        let pattern = self.inner.layout.bookkeeping_pattern();
        let err = |f| to_lock_error(&self.inner.config, "list (SCAN)", f);
        let scan = |cursor: u64| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            cmd
        };
        let mut keys = Vec::new();
        match &self.inner.nodes {
            None => {
                let mut cursor = 0;
                loop {
                    let (next, mut batch): (u64, Vec<String>) = self
                        .inner
                        .link
                        .command(&scan(cursor), Duration::ZERO)
                        .await
                        .map_err(err)?;
                    keys.append(&mut batch);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Some(nodes) => {
                let members = nodes.members(&self.inner.link).await.map_err(err)?;
                for m in members.iter().filter(|m| m.master) {
                    let node = nodes.node(&m.addr).map_err(err)?;
                    let mut cursor = 0;
                    loop {
                        let (next, mut batch): (u64, Vec<String>) =
                            node.command(&scan(cursor)).await.map_err(err)?;
                        keys.append(&mut batch);
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
        }
        Ok(keys)
    }

    /// The follower of `key`'s slot owner, shared by this client's waiters
    /// of that key; it stops when the last of them is done.
    fn follower(&self, nodes: &Nodes, key: &str, channel: String) -> Arc<Follower> {
        // Lookups, inserts and a sweep of dead entries only.
        let mut map = self
            .inner
            .followers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(key).and_then(Weak::upgrade) {
            return f;
        }
        map.retain(|_, f| f.strong_count() > 0);
        let f = Arc::new(Follower::start(nodes.clone(), key.to_string(), channel));
        map.insert(key.to_string(), Arc::downgrade(&f));
        f
    }

    /// [`acquire`](LockBackend::acquire) of the plain mode, or in fair mode
    /// of the queue entry `waiter` (which the first refused attempt joins).
    async fn wait_for(
        &self,
        req: &AcquireRequest,
        waiter: Option<&str>,
    ) -> Result<Option<Lease>, LockError> {
        let deadline = req.wait_deadline();
        let queued = waiter.map(|id| (id, !req.wait.is_zero()));
        // When the current holder's lease ends, learned by each attempt, so
        // the wake-up sleeps no longer than that.
        let expiry = Arc::new(Mutex::new(None));
        let expiry_ref = &expiry;
        // Fair mode: the grant message a release sent to this waiter's own
        // channel (set once subscribed), and the last refused attempt's
        // send time and fencing counter.
        let grants: OnceLock<GrantSlot> = OnceLock::new();
        let refused: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
        let (grants_ref, refused_ref) = (&grants, &refused);
        let mut tries = 0u32;
        let mut attempt = move || {
            tries += 1;
            // A wait cancelled while a retry's command sits in the
            // connection's buffer must not leave the grant that command may
            // still win (another client's release can reach the server
            // first) to nobody until its TTL. Plain format: the retry's drop
            // sends an owner-checked release behind it on the same
            // connection (see `RetryInFlight`), so a woken waiter's retry
            // pays no task. Redisson format, whose release needs the
            // grant's fencing token: the retry runs detached and its task
            // undoes a win nobody waits for.
            let retry = tries > 1;
            // (Fair mode is plain format only, so a detached retry never
            // queues.)
            // Either keeps its turn until the undo is done.
            let detached = (retry && self.inner.layout.format == Format::Redisson).then(|| {
                let (this, req) = (self.clone(), req.clone());
                let undo = {
                    let this = self.clone();
                    move |(answer, turn): (Attempt, Turn)| async move {
                        // Named in the block, so the block owns it: the
                        // turn ends when the undo is done, not before.
                        let _turn = turn;
                        if let Attempt::Acquired(lease) = answer {
                            lock_core::wait::undo_grant(&this, &lease).await;
                        }
                    }
                };
                lock_core::wait::detached(
                    async move {
                        let turn = this.turn(&req).await;
                        let answer = this.attempt(&req, None, None).await?;
                        Ok((answer, turn))
                    },
                    undo,
                )
            });
            async move {
                if let Some(lease) = self.granted(req, grants_ref.get(), refused_ref) {
                    // An unanswered attempt of this wait may have taken
                    // the grant back under its id: the grant is this
                    // lease's now, so the mark goes, or the owner's next
                    // acquisition would take it over as that attempt's.
                    self.inner
                        .unanswered
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&(req.name.clone(), req.owner));
                    return Ok(Some(lease));
                }
                let attempt = match detached {
                    Some(detached) => detached.await.map(|(answer, _turn)| answer),
                    None => {
                        let turn = self.turn(req).await;
                        if retry {
                            let mut in_flight = RetryInFlight {
                                backend: self,
                                req,
                                turn: Some(turn),
                                pinned: self.inner.link.pin(),
                            };
                            // On the pinned connection, so that the undo
                            // of a drop goes out behind it, not on a fresh
                            // connection it could overtake.
                            let attempt = self.attempt(req, queued, Some(&in_flight.pinned)).await;
                            in_flight.turn = None;
                            attempt
                        } else {
                            let attempt = self.attempt(req, queued, None).await;
                            drop(turn);
                            attempt
                        }
                    }
                };
                let ends = match &attempt {
                    Ok(Attempt::Held {
                        expires_in,
                        refused: seen,
                    }) => {
                        if seen.is_some() {
                            *refused_ref.lock().unwrap_or_else(|p| p.into_inner()) = *seen;
                        }
                        // +1 ms: the server expires strictly after the TTL.
                        expires_in
                            .and_then(|d| Instant::now().checked_add(d + Duration::from_millis(1)))
                    }
                    _ => None,
                };
                *expiry_ref.lock().unwrap_or_else(|p| p.into_inner()) = ends;
                attempt.map(|a| match a {
                    Attempt::Acquired(lease) => Some(lease),
                    Attempt::Held { .. } => None,
                })
            }
        };
        // An uncontended lock costs one round trip and no subscription.
        // A first attempt that took the whole wait (a server slow to
        // answer, or not answering) is the answer: no attempt starts after
        // the wait ended.
        match attempt().await {
            Ok(Some(lease)) => return Ok(Some(lease)),
            Err(e) if !e.is_retryable() => return Err(e),
            other if req.wait.is_zero() || Instant::now() >= deadline => return other,
            _ => {}
        }
        let keys = self.key_set(&req.name)?;
        let released = keys.channel();
        let limit = deadline.min(Instant::now() + self.inner.config.timeout);
        let mut subs = Vec::with_capacity(3);
        let (sub, mut subscribed) = match waiter {
            None => self.inner.subscriber.subscribe(&released, limit).await,
            Some(id) => {
                // The waiter's own channel, on which a fair releaser wakes
                // it alone; the lock's channel still carries releases with
                // nobody queued and forced ones.
                let own = format!("{}{id}", keys.wake_prefix());
                let ((own, own_ok), (sub, ok)) = futures::join!(
                    self.inner.subscriber.subscribe(&own, limit),
                    self.inner.subscriber.subscribe(&released, limit)
                );
                let _ = grants.set(own.messages());
                subs.push(own);
                (sub, own_ok && ok)
            }
        };
        subs.push(sub);
        let mut follower = None;
        if self.inner.foreign_wake == ForeignWake::KeyspaceEvents {
            // A foreign client's release announces itself only this way.
            let channel = format!("__keyspace@{}__:{}", self.inner.config.db(), keys.lock);
            match &self.inner.nodes {
                // Published on the slot owner's node alone: subscribed
                // there, and followed when the slot moves.
                Some(nodes) => follower = Some(self.follower(nodes, &keys.lock, channel)),
                None => {
                    let (sub, ok) = self.inner.subscriber.subscribe(&channel, limit).await;
                    subs.push(sub);
                    subscribed &= ok;
                }
            }
        }
        // The subscription is live from here on, so the loop's first attempt
        // (made now) cannot miss a release that came after the one above.
        // The caller's pacing, when it asked for one, paces the fallback.
        let mut backoff = req.backoff_or(if !subscribed {
            tracing::debug!(name = %req.name, "polylock redis: no pub/sub; waiting by polling");
            Backoff::default()
        } else if self.inner.foreign_wake == ForeignWake::Polling {
            FOREIGN_POLL_BACKOFF
        } else if waiter.is_some() {
            FAIR_BACKOFF
        } else {
            SUBSCRIBED_BACKOFF
        });
        if waiter.is_some() {
            // A fair waiter keeps its place in the queue, and is handed the
            // lock outright, only while it attempts often enough (see
            // MIN_QUEUE_ENTRY_LIFE, GRANT_FRESHNESS): a caller's slower
            // pacing is capped at the fair mode's own.
            backoff.max = backoff.max.min(FAIR_BACKOFF.max);
            backoff.initial = backoff.initial.min(backoff.max);
        }
        let follower = follower.as_deref();
        acquire_loop(attempt, deadline, backoff, || {
            wake_up(&subs, follower, &expiry)
        })
        .await
    }

    /// The lease a fair-mode release handed this waiter, if its message
    /// came and can be trusted without asking the server again.
    ///
    /// Why the deadline is safe: the message carries the grant's fencing
    /// token. The last refused attempt saw the counter at some value when
    /// the server ran it, after it was sent; a token above that value was
    /// issued by a grant that ran later still, for the claim window this
    /// waiter's queue entry asked ([`GRANT_CLAIM`], or its TTL if shorter).
    /// So the lock expires on the server no earlier than that attempt's send
    /// time plus the window, and the lease (granted for the window, renewed
    /// to the TTL asked) has its deadline counted from that send time. A
    /// message with a token no higher (a grant that came before the
    /// refusal, since lost) is not trusted; neither is one whose deadline
    /// would leave less than half the window (the refusal was long ago:
    /// the first renewal, at a third of it, must come first), nor one when
    /// replicas must acknowledge the grant: the next
    /// attempt then takes the grant over (the acquire script's recovery),
    /// with a fresh send time, or learns that it is gone.
    fn granted(
        &self,
        req: &AcquireRequest,
        grants: Option<&GrantSlot>,
        refused: &Mutex<Option<(Instant, u64)>>,
    ) -> Option<Lease> {
        let fence = grants?.take()?;
        if self.inner.config.wait_replicas.is_some() {
            return None;
        }
        let (sent_at, counter) = (*refused.lock().unwrap_or_else(|p| p.into_inner()))?;
        if fence <= counter {
            return None;
        }
        let (ttl, ttl_ms) = self.guarantees().granted_ttl(req.ttl, PX_UNIT);
        // As the attempt wrote it in its queue entry, which the grant used.
        let claim = Duration::from_millis(ttl_ms.min(GRANT_CLAIM.as_millis() as u64));
        let lease = req
            .lease(FencingToken::new(fence)?, claim, sent_at)
            .with_renewal_ttl(ttl);
        (lease.deadline() > Instant::now() + claim / 2).then_some(lease)
    }

    /// A waiting acquire ended without a lease (its wait ran out, it
    /// failed, or it was dropped): an attempt of it that got no answer (its
    /// `op_timeout` ran out, and its connection was replaced) may still
    /// take the lock when its script reaches the server, for nobody. A task
    /// releases that grant by the attempt's id two `op_timeout`s after the
    /// attempt was sent, when a script still on its way has most likely
    /// run; one the network held up longer expires at its TTL, as before.
    ///
    /// The task decides in the name and owner's turn: it waits for an
    /// attempt still in flight, and acts only on a mark that no attempt
    /// sent after the wait ended changed: an acquisition of the same owner
    /// that took the grant over in between cleared the mark (its lock is
    /// never released), and one whose own attempt went unanswered keeps
    /// the mark for its next attempt. Plain format (and fair mode) only:
    /// the Redisson format's release cannot name an attempt.
    fn give_back_unanswered(&self, req: &AcquireRequest) {
        if self.inner.layout.format != Format::Plain {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (this, req) = (self.clone(), req.clone());
        // Marks of attempts sent after this are another acquisition's (the
        // same owner taking the name again), which it may still take over.
        let ended_at = Instant::now();
        runtime.spawn(async move {
            let key = (req.name.clone(), req.owner);
            let mark = |this: &RedisBackend| {
                this.inner
                    .unanswered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                    .cloned()
            };
            // An attempt still in flight holds the turn until it returns.
            drop(this.turn(&req).await);
            let Some(seen) = mark(&this) else {
                return;
            };
            if seen.last_sent > ended_at {
                return;
            }
            // Its reply was due one op_timeout after the send; a script
            // still on its way has most likely run one more later.
            tokio::time::sleep_until(seen.last_sent + this.inner.config.timeout * 2).await;
            let _turn = this.turn(&req).await;
            {
                let mut marks = this
                    .inner
                    .unanswered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                // Unchanged: nothing was sent under this mark since, and no
                // answer cleared it.
                if marks.get(&key) != Some(&seen) {
                    return;
                }
                marks.remove(&key);
            }
            let attempt = seen.id;
            let Some(fence) = FencingToken::new(u64::MAX) else {
                return;
            };
            let lease = req.lease(fence, req.ttl, Instant::now());
            match this.release_via(&lease, None, Some(&attempt)).await {
                // Released the grant, found nothing, or found someone
                // else's lock (left untouched).
                Ok(()) | Err(LockError::Lost { .. }) => {}
                Err(e) => {
                    tracing::debug!(name = %req.name, error = %e, "polylock redis: could not give back what an unanswered attempt may have taken; it expires at its TTL");
                }
            }
        });
    }

    /// [`release`](LockBackend::release), on `via`'s connection when given
    /// (see [`RetryInFlight`]).
    async fn release_via(
        &self,
        lease: &Lease,
        via: Option<&Pinned>,
        attempt: Option<&str>,
    ) -> Result<(), LockError> {
        self.inner.space.check(lease)?;
        let keys = self.key_set(lease.name())?;
        let holder = self.inner.layout.holder(lease.owner());
        let fair = self.inner.config.fair;
        let mut inv = if fair {
            FAIR.release.prepare_invoke()
        } else {
            self.inner.layout.scripts().release.prepare_invoke()
        };
        inv.key(&keys.lock)
            .key(keys.fence())
            .arg(&holder)
            .arg(lease.fence().get());
        if self.inner.layout.format == Format::Redisson {
            inv.key(keys.bookkeeping()).arg(
                self.guarantees()
                    .granted_ttl(lease.renewal_ttl(), PX_UNIT)
                    .1,
            );
        }
        inv.arg(keys.channel());
        if fair {
            inv.key(keys.queue())
                .key(keys.queue_deadlines())
                .key(keys.queue_waiters())
                .arg(keys.wake_prefix())
                .arg(GRANT_FRESHNESS.as_millis() as u64);
        }
        if let Some(attempt) = attempt {
            // Plain and fair only (a cancelled retry's undo).
            inv.arg(attempt);
        }
        let sent = match via {
            Some(pinned) => self.inner.link.invoke_on(pinned, &inv).await,
            None => self.inner.link.invoke(&inv).await,
        };
        let r: i64 = sent.map_err(|f| self.err("release", lease.name(), f))?;
        if r >= 0 {
            Ok(())
        } else {
            Err(LockError::Lost {
                name: lease.name().to_string(),
            })
        }
    }

    /// How long a fair-mode queue entry lives after its waiter's last
    /// attempt.
    fn queue_entry_life(&self) -> Duration {
        MIN_QUEUE_ENTRY_LIFE.max(self.inner.config.timeout * 2)
    }

    /// Takes waiter `id` out of the lock's queue, waking the next waiter
    /// if `id` was first and the lock is free.
    async fn leave_queue(&self, keys: &Keys, id: &str) -> Result<(), LockError> {
        let mut inv = FAIR.leave.prepare_invoke();
        inv.key(&keys.lock)
            .key(keys.fence())
            .key(keys.queue())
            .key(keys.queue_deadlines())
            .key(keys.queue_waiters())
            .arg(id)
            .arg(keys.wake_prefix())
            .arg(keys.channel())
            .arg(GRANT_FRESHNESS.as_millis() as u64);
        self.inner
            .link
            .invoke::<i64>(&inv)
            .await
            .map(drop)
            .map_err(|f| to_lock_error(&self.inner.config, "leaving the queue of waiters", f))
    }

    /// What `inspect` shows for a holder other than polylock.
    fn foreign_holder(&self, value: &str) -> String {
        format!(
            "{}; {}",
            foreign_value(value),
            self.inner.foreign_wake.describe()
        )
    }
}

/// Renews `leases` through `chunk`, [`RENEW_CHUNK`] at a time and every
/// chunk at once, and puts each answer back at its lease's place; a lease
/// whose keys cannot be made is answered by that error without a request.
/// The one piece of the single-instance and the Redlock batches.
pub(crate) async fn renew_chunked<'a, Fut>(
    leases: &'a [Lease],
    keys: impl Fn(&LockName) -> Result<Keys, LockError>,
    chunk: impl Fn(Vec<(&'a Lease, Keys)>) -> Fut,
) -> Vec<Result<Lease, LockError>>
where
    Fut: std::future::Future<Output = Vec<Result<Lease, LockError>>>,
{
    let mut out: Vec<Option<Result<Lease, LockError>>> = leases.iter().map(|_| None).collect();
    let mut batch = Vec::with_capacity(leases.len());
    let mut at = Vec::with_capacity(leases.len());
    for (i, lease) in leases.iter().enumerate() {
        match keys(lease.name()) {
            Ok(k) => {
                batch.push((lease, k));
                at.push(i);
            }
            Err(e) => out[i] = Some(Err(e)),
        }
    }
    let mut chunks = Vec::new();
    let mut rest = batch.into_iter().peekable();
    while rest.peek().is_some() {
        chunks.push(chunk(rest.by_ref().take(RENEW_CHUNK).collect()));
    }
    let answers = futures::future::join_all(chunks).await;
    for (i, r) in at.into_iter().zip(answers.into_iter().flatten()) {
        out[i] = Some(r);
    }
    every_answer(out, leases)
}

/// The answers of a batch, one per lease; a lease left without one (which
/// the batch code never does) gets a permanent error rather than a panic.
pub(crate) fn every_answer<'a>(
    out: Vec<Option<Result<Lease, LockError>>>,
    leases: impl IntoIterator<Item = &'a Lease>,
) -> Vec<Result<Lease, LockError>> {
    out.into_iter()
        .zip(leases)
        .map(|(r, lease)| {
            r.unwrap_or_else(|| {
                Err(LockError::permanent(
                    BACKEND,
                    RedisFailure(format!(
                        "renew of lock {:?}: the batch gave no answer",
                        lease.name()
                    )),
                ))
            })
        })
        .collect()
}

/// A fresh fair-mode waiter id: random, so two waiters never share one,
/// and not derived from the owner token (which never leaves the lease).
fn new_waiter_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// One `acquire` call's place in a fair lock's queue. Dropped while still
/// armed (the call was cancelled), it leaves the queue from a spawned task,
/// best effort: the entry's deadline removes it otherwise. That task first
/// takes the turn of the call's name and owner, which a retry in flight
/// holds until the release sent behind it is answered (`RetryInFlight`):
/// so the leave runs after that retry, which would otherwise queue the
/// waiter again if it landed after the leave (the leave may go out on a
/// fresh connection, the retry sits on a slow one).
struct QueueEntry {
    backend: RedisBackend,
    keys: Keys,
    name: LockName,
    owner: OwnerToken,
    id: String,
    armed: bool,
}

impl QueueEntry {
    fn new(backend: RedisBackend, keys: Keys, req: &AcquireRequest) -> Self {
        QueueEntry {
            backend,
            keys,
            name: req.name.clone(),
            owner: req.owner,
            id: new_waiter_id(),
            armed: true,
        }
    }

    /// The entry is gone already (granted) or was never made.
    fn disarm(&mut self) {
        self.armed = false;
    }

    /// Leaves the queue now; a failure leaves it to the entry's deadline.
    async fn leave(&mut self) {
        if let Err(e) = self.backend.leave_queue(&self.keys, &self.id).await {
            tracing::debug!(error = %e, "polylock redis: leaving the queue failed; the entry expires by itself");
        }
        self.armed = false;
    }
}

impl Drop for QueueEntry {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, keys, id) = (
            self.backend.clone(),
            self.keys.clone(),
            std::mem::take(&mut self.id),
        );
        let turn = backend.inner.turns.take(&self.name, self.owner);
        rt.spawn(async move {
            let _turn = turn.await;
            if let Err(e) = backend.leave_queue(&keys, &id).await {
                tracing::debug!(error = %e, "polylock redis: a cancelled waiter could not leave the queue; the entry expires by itself");
            }
        });
    }
}

/// How `inspect` names a holder other than polylock: the start of the
/// value it stored (a token of its own, not a secret of ours).
pub(crate) fn foreign_value(value: &str) -> String {
    const SHOWN: usize = 12;
    let shown: String = value.chars().take(SHOWN).collect();
    let more = if value.chars().count() > SHOWN {
        "…"
    } else {
        ""
    };
    format!("a foreign client (not polylock), value {shown:?}{more}")
}

/// The unit of `PX` and `PEXPIRE`, in which TTLs are sent (through
/// [`Guarantees::granted_ttl`], so the declared minimum and step apply).
pub(crate) const PX_UNIT: Duration = Duration::from_millis(1);

#[async_trait]
impl LockBackend for RedisBackend {
    /// One script run: `SET NX PX` + the counter bump (plain) or the
    /// Redisson hash update + `INCR`, pipelined with `WAIT` on the same
    /// connection if replicas were asked for. A lock that already holds
    /// this request's owner token as the last polylock grant (left by an
    /// earlier attempt whose reply was lost) is recognised as ours and
    /// returned with its token, instead of waiting for ourselves (plain
    /// format).
    ///
    /// # Cancel safety
    /// Not cancel safe: if dropped after the script was sent, the lock may
    /// be taken on the server with nobody holding the lease; it then stays
    /// taken until its TTL runs out.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        // Fair mode: a fresh id is never first in a non-empty queue, so a
        // try succeeds only when nobody waits, and never joins.
        let id = self.inner.config.fair.then(new_waiter_id);
        let turn = self.turn(req).await;
        let attempt = self
            .attempt(req, id.as_deref().map(|id| (id, false)), None)
            .await;
        drop(turn);
        self.inner.space.stamp(attempt.map(|a| match a {
            Attempt::Acquired(lease) => Some(lease),
            Attempt::Held { .. } => None,
        }))
    }

    /// Tries once; if the lock is held, subscribes to its release channel
    /// and retries on every release message, on the holder's expiry, and on
    /// a bounded fallback poll, until `req.wait` runs out.
    ///
    /// # Fair mode
    /// In fair mode ([`RedisConfig::fair`]) the first refused attempt also
    /// joins the lock's queue, each later one keeps the entry alive, and
    /// the lock is granted only to the queue's first live waiter; a release
    /// wakes that waiter alone, on its own channel (the lock's channel and,
    /// with keyspace events, the key's still wake everyone, for forced and
    /// foreign releases). The call leaves the queue when it returns without
    /// the lock.
    ///
    /// # Cancel safety
    /// Dropping the future while it waits leaves nothing behind: its
    /// subscription is given up (and the channel unsubscribed once no
    /// waiter of this client needs it); in fair mode a spawned task takes
    /// its queue entry out (best effort: the entry's deadline does
    /// otherwise). Dropping it during a retry is safe too: an
    /// owner-checked release follows the retry on the same connection
    /// (plain format), or the retry finishes in its own task, which then
    /// releases a win or leaves the queue again (Redisson format). Dropping
    /// it during the first attempt is like dropping
    /// [`try_acquire`](LockBackend::try_acquire), except in the plain
    /// format: there, whenever the wait ends without the lock (dropped
    /// too), an attempt of it that got no answer (its `op_timeout` ran out)
    /// is given back by its attempt id two `op_timeout`s after its send,
    /// in case its script still ran (see `give_back_unanswered`); only a
    /// script the network held up longer than that can still leave a lock
    /// that nobody holds until its TTL. The Redisson format's release cannot name an
    /// attempt, so such a grant of it expires at its TTL, or is taken back
    /// by the same owner's next attempt.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        // Ended without a lease (also when dropped): what an unanswered
        // attempt of it may have taken is given back.
        let mut ended = WaitEnded {
            backend: self,
            req,
            with_lease: false,
        };
        if !self.inner.config.fair {
            let r = self.wait_for(req, None).await;
            ended.with_lease = matches!(r, Ok(Some(_)));
            return self.inner.space.stamp(r);
        }
        let mut entry = QueueEntry::new(self.clone(), self.key_set(&req.name)?, req);
        let r = self.wait_for(req, Some(&entry.id)).await;
        ended.with_lease = matches!(r, Ok(Some(_)));
        match &r {
            // A granting script took the entry out; a request that may not
            // wait never joined.
            Ok(Some(_)) => entry.disarm(),
            _ if req.wait.is_zero() => entry.disarm(),
            // The server answers: leave now, so that the queue is right
            // when this returns.
            Ok(None) => entry.leave().await,
            // It may not: leaving could take another op_timeout, past what
            // a caller waits for (the wait plus one op_timeout). The entry's
            // drop leaves from a task.
            Err(_) => {}
        }
        self.inner.space.stamp(r)
    }

    /// Compare-owner-and-`PEXPIRE`, by script.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped renew either extended the lease or did not;
    /// the old lease's deadline stays valid either way.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.inner.space.check(lease)?;
        let keys = self.key_set(lease.name())?;
        let (_, ttl_ms) = self.guarantees().granted_ttl(lease.renewal_ttl(), PX_UNIT);
        let holder = self.inner.layout.holder(lease.owner());
        let mut inv = self.inner.layout.scripts().renew.prepare_invoke();
        inv.key(&keys.lock)
            .key(keys.fence())
            .arg(&holder)
            .arg(lease.fence().get())
            .arg(ttl_ms);
        let sent_at = Instant::now();
        let (r, acked): (i64, _) = self
            .run_script("renew", lease.name(), &keys.lock, &inv, None)
            .await?;
        if r == 1 {
            self.extended(lease, ttl_ms, sent_at, acked)
        } else {
            Err(LockError::Lost {
                name: lease.name().to_string(),
            })
        }
    }

    /// One script run per [`RENEW_CHUNK`] leases (the chunks sent together),
    /// each lease judged as [`renew`](LockBackend::renew) judges it: owner
    /// and fencing token compared on the server, `PEXPIRE` only on a key
    /// that is still ours, the deadline counted from the chunk's send. On a
    /// cluster a chunk runs on the node of its first lease's slot, then on
    /// the node of the first lease that node does not serve, and so on: one
    /// run per node the chunk spans. A lease whose key the node it was sent
    /// to refused to read (a slot that moved), or a chunk the server
    /// refused as a whole (a server older than Redis 7 on a cluster), is
    /// renewed on its own, through the driver's MOVED/ASK handling.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`renew`](LockBackend::renew): each lease was
    /// extended or not, and its old deadline stays valid either way.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if self.inner.space.any_foreign(leases) {
            return lock_core::renew_each(self, leases).await;
        }
        renew_chunked(
            leases,
            |n| self.key_set(n),
            |c| async move { self.renew_chunk(&c).await },
        )
        .await
    }

    /// Compare-owner-and-delete, by script, publishing the release to
    /// waiters. In the `redisson` format this drops one hold; the hash goes
    /// (and the message is published) with the last.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped release either happened or did not; the lock
    /// then expires at its TTL.
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.release_via(lease, None, None).await
    }

    /// One script reads the holder, its remaining TTL, the fencing
    /// counter and polylock's bookkeeping together. The fencing token is
    /// shown when the holder looks like a polylock holder: it is then the
    /// last token issued for the name, which is the holder's own. The
    /// holder's description only while the bookkeeping names the live
    /// holder.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        Ok(self.holder(name).await?.map(|h| h.info))
    }

    /// polylock's locks under `prefix`: the bookkeeping hashes are found
    /// by `SCAN` (on every master of a cluster), the exact name recovered
    /// from each key, and each candidate, in name order, read like
    /// [`inspect`](LockBackend::inspect) and kept when it is held by the
    /// owner its bookkeeping records (live and unexpired, and not a foreign
    /// client's).
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        let limit = validate_list(prefix, limit)?;
        let mut names: Vec<LockName> = self
            .bookkeeping_keys()
            .await?
            .iter()
            .filter_map(|k| self.inner.layout.name_of_bookkeeping(k))
            .filter(|n| n.as_str().starts_with(prefix))
            .collect();
        names.sort();
        names.dedup();
        // Every name ever locked keeps its bookkeeping (the fencing counter
        // is never deleted), so most candidates may be free: read them a
        // few at a time, in order, until `limit` held ones are found.
        let mut held = Vec::new();
        for chunk in names.chunks(32) {
            let reads = chunk.iter().map(|n| self.holder(n));
            for (name, h) in chunk.iter().zip(futures::future::join_all(reads).await) {
                if let Some(h) = h? {
                    if h.ours && held.len() < limit {
                        held.push((name.clone(), h.info));
                    }
                }
            }
            if held.len() >= limit {
                break;
            }
        }
        Ok(held)
    }

    /// The connections subscribed to the lock's release channel, as the
    /// server counts them (`PUBSUB NUMSUB`; on a cluster summed over every
    /// node, since each counts only its own clients): one per waiting
    /// client, whichever of its tasks wait (they share a subscription), and
    /// Redisson clients waiting on the same channel in the `redisson`
    /// format. A waiter counts from its first failed attempt until it
    /// returns. Foreign `plain`-format clients wait by retrying and are not
    /// seen.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>, LockError> {
        let keys = self.key_set(name)?;
        if self.inner.config.fair {
            let mut inv = FAIR.waiters.prepare_invoke();
            inv.key(keys.queue_deadlines());
            let n: i64 = self
                .inner
                .link
                .invoke(&inv)
                .await
                .map_err(|f| self.err("waiters", name, f))?;
            return Ok(Some(n.max(0) as usize));
        }
        let mut cmd = redis::cmd("PUBSUB");
        cmd.arg("NUMSUB").arg(keys.channel());
        let count = |v: Vec<(String, i64)>| v.first().map_or(0, |(_, n)| *n).max(0) as usize;
        let err = |f| self.err("waiters", name, f);
        let Some(nodes) = &self.inner.nodes else {
            let v = self
                .inner
                .link
                .command(&cmd, Duration::ZERO)
                .await
                .map_err(err)?;
            return Ok(Some(count(v)));
        };
        let members = nodes.members(&self.inner.link).await.map_err(err)?;
        let mut total = 0;
        for m in members {
            let node = nodes.node(&m.addr).map_err(err)?;
            total += count(node.command(&cmd).await.map_err(err)?);
        }
        Ok(Some(total))
    }

    /// Deletes the lock key whoever holds it and publishes the release
    /// message; the fencing counter is kept.
    ///
    /// # Cancel safety
    /// Cancel safe: the lock is either removed or not.
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        let keys = self.key_set(name)?;
        let mut inv = FORCE_RELEASE.prepare_invoke();
        inv.key(&keys.lock).arg(keys.channel()).arg(RELEASE_MESSAGE);
        let r: i64 = self
            .inner
            .link
            .invoke(&inv)
            .await
            .map_err(|f| self.err("force_release", name, f))?;
        Ok(r == 1)
    }

    /// pub/sub for polylock's own releases, and for foreign releases what
    /// [`RedisBackend::foreign_wake`] found at connect time.
    fn wake_mode(&self) -> String {
        let cluster = self.inner.nodes.is_some();
        let foreign = match self.inner.foreign_wake {
            ForeignWake::KeyspaceEvents if cluster => {
                "keyspace notifications for foreign releases, on the node that owns the key's slot \
                 (polling while that node is unsure)"
            }
            ForeignWake::KeyspaceEvents => "keyspace notifications for foreign releases",
            ForeignWake::Polling if cluster => {
                "polling (10-100 ms) for foreign releases: keyspace notifications are off on some \
                 master"
            }
            ForeignWake::Polling => {
                "polling (10-100 ms) for foreign releases: the server sends no keyspace \
                 notifications"
            }
            ForeignWake::RedissonMessage => "pub/sub for Redisson's own releases as well",
        };
        if self.inner.config.fair {
            format!(
                "fair FIFO queue: a polylock release wakes the oldest waiter alone, on its own \
                 pub/sub channel; {foreign}"
            )
        } else {
            format!("pub/sub for polylock releases; {foreign}")
        }
    }

    /// See [`LockSpace`]: leases of another space are refused before any
    /// I/O.
    fn lock_space(&self) -> Option<LockSpace> {
        Some(self.inner.space)
    }

    fn guarantees(&self) -> Guarantees {
        guarantees_for(&self.inner.config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_milliseconds() {
        let g = guarantees(Algorithm::SingleInstance);
        let ttl_millis = |ttl| g.granted_ttl(ttl, PX_UNIT).1;
        assert_eq!(ttl_millis(Duration::from_micros(1)), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_millis(Duration::from_secs(3)), 3000);
        assert_eq!(ttl_millis(lock_core::MAX_TTL), 365 * 24 * 3600 * 1000);
    }
}
