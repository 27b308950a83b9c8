//! [`ZkBackend`]: the [`LockBackend`] over ZooKeeper.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::FutureExt;
use lock_core::wait::{Backoff, Pacer};
use lock_core::{
    AcquireRequest, ClockPolicy, ExpiryClock, FencingGuarantee, FencingToken, Guarantees,
    HolderInfo, Lease, LockBackend, LockError, LockName, LockSpace, WaitMechanism,
};
use tokio::sync::Notify;
use tokio::time::{sleep, sleep_until, Instant};
use zookeeper_client::{
    CreateMode, Error, EventType, MultiReadResult, Stat, StateWatcher, WatchedEvent,
};

use crate::config::ZkConfig;
use crate::errors::{again, from_zk, outcome_unknown, retryable, timed, BACKEND};
use crate::holdings::{self, Expiry, Held, Holdings};
use crate::path::{
    is_ours, may_lead_to, name_of_path, name_path, node_path, node_prefix, queue, sequence_of,
};
use crate::session::{Session, Sessions};
use lock_core::{owner_value, parse_owner_value};

/// The longest session timeout a connect request can ask for: the
/// protocol sends it as a signed 32-bit count of milliseconds (about 24.8
/// days). A longer TTL asked as such would wrap around to a negative or
/// arbitrary timeout, which the server turns into its minimum.
const MAX_SESSION_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);
/// The smallest session timeout a ZooKeeper server grants with the test
/// kit's `tickTime=500` (two ticks). A server with a longer tick raises
/// it; the lease then reports what the server negotiated.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// While waiting on a watch, read the queue again this often anyway, in
/// case a watch event was missed.
const RECHECK: Duration = Duration::from_secs(2);

/// The session timeout asked for by requests that hold no lock: the
/// longest a default-configured server grants (20 ticks of 2 s is 40 s;
/// the test kit's servers give 10 s).
const ADMIN_SESSION: Duration = Duration::from_secs(30);

/// The pacing of a waiting acquire's new passes after a retryable failure
/// (a lost connection, an expired session), unless the request brings its
/// own ([`AcquireRequest::retry`]).
const ERROR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_millis(500),
};

/// Whether the session's connection changed state since `states` last
/// looked. The driver sets the watches of a dropped connection again on
/// the next one and the server then reports what changed meanwhile in the
/// driver's own (arbitrary) order, not in the order it happened: after
/// that, our node's deletion need not come before our predecessor's.
fn reconnected(states: &mut StateWatcher) -> bool {
    states.changed().now_or_never().is_some()
}

/// How many released node paths a client remembers, to answer a repeated
/// release with `Ok`.
const REMEMBERED: usize = 4096;

/// The most leases one renewal request reads (the watchdog hands over at
/// most 256 at a time). A lock node's data is at most the owner token and
/// an encoded [`lock_core::HolderMeta`] (under 1.7 KB), so the answer stays
/// far below ZooKeeper's default `jute.maxbuffer` of 1 MiB.
pub(crate) const RENEW_CHUNK: usize = 256;

/// The longest a connected session of this client goes without a request
/// or a ping, as a share of its timeout: the driver pings a connection
/// that sent nothing for 3/20 of the session timeout, looking every 1/20.
/// A follower passes the session's news on to the leader only from such
/// touches, so the leader's last news of it before a cut can be this old.
const IDLE_TOUCH_SHARE: f64 = 0.2;

/// The clock policy a client with this `follower_lag` computes deadlines
/// with (see [`ZkConfig`]'s "Ensembles"): `policy` with the lag added to
/// its margin and, with any lag, the share of the TTL the client may go
/// without touching its session (the driver's idle pings, 1/5) added to its
/// drift. A follower cut off from its leader answers for up to the lag
/// after the cut, and the leader's last news of the session may be that
/// share of the TTL older than the cut.
///
/// ```
/// use std::time::Duration;
/// use lock_core::ClockPolicy;
/// let plain = ClockPolicy::default();
/// assert_eq!(backend_zk::clock_for(plain, Duration::ZERO), plain);
/// let lagged = backend_zk::clock_for(plain, Duration::from_secs(3));
/// let ttl = Duration::from_secs(10);
/// // (A microsecond for the float arithmetic.)
/// let slack = Duration::from_micros(1);
/// assert!(lagged.trusted(ttl) + Duration::from_secs(3) + ttl / 5 <= plain.trusted(ttl) + slack);
/// ```
pub fn clock_for(policy: ClockPolicy, follower_lag: Duration) -> ClockPolicy {
    if follower_lag.is_zero() {
        return policy;
    }
    ClockPolicy {
        drift: policy.drift + IDLE_TOUCH_SHARE,
        margin: policy.margin.saturating_add(follower_lag),
    }
}

/// The shortest TTL a client with this `follower_lag` grants: the
/// shortest a lease under the default [`ClockPolicy`] is trusted for more
/// than a third of, with the lag taken off ([`clock_for`]), as every TTL
/// must be ([`ClockPolicy::check_ttl`]). The watchdog renews such a lease
/// at half the time it is trusted, leaving the other half for a retry.
/// [`MIN_TTL`] for no lag; shorter TTLs are raised to it.
///
/// ```
/// use std::time::Duration;
/// use lock_core::ClockPolicy;
/// let lag = Duration::from_secs(3);
/// let min = backend_zk::min_ttl_for(lag);
/// let lagged = backend_zk::clock_for(ClockPolicy::default(), lag);
/// assert!(lagged.check_ttl(min).is_ok());
/// assert!(lagged.check_ttl(min - Duration::from_millis(5)).is_err());
/// assert_eq!(backend_zk::min_ttl_for(Duration::ZERO), backend_zk::MIN_TTL);
/// ```
pub fn min_ttl_for(lag: Duration) -> Duration {
    if lag.is_zero() {
        return MIN_TTL;
    }
    let policy = clock_for(ClockPolicy::default(), lag);
    // trusted(ttl) = ttl * (1 - drift) - margin must pass ttl / 3.
    let share = 1.0 - policy.drift - 1.0 / 3.0;
    let at_least = policy.margin.as_secs_f64() / share;
    // Whole milliseconds (what a session timeout is), past the bound.
    let ms = (at_least * 1000.0).floor() as u64 + 1;
    Duration::from_millis(ms).max(MIN_TTL)
}

/// What a client of `config` promises: [`guarantees`], with the shortest
/// TTL its `follower_lag` leaves ([`min_ttl_for`]).
pub fn guarantees_for(config: &ZkConfig) -> Guarantees {
    let mut g = guarantees();
    g.min_ttl = min_ttl_for(config.follower_lag);
    g
}

/// What this backend promises (a client with no `follower_lag`: see
/// [`guarantees_for`]).
pub fn guarantees() -> Guarantees {
    let mut g = Guarantees::new(BACKEND);
    g.fencing = FencingGuarantee::Strict;
    g.fair_fifo = true;
    g.expiry_clock = ExpiryClock::Consensus;
    g.survives_restart = true;
    g.survives_failover = true;
    g.wait = WaitMechanism::Watch;
    g.min_ttl = MIN_TTL;
    g.ttl_granularity = Duration::from_millis(1);
    g.force_release = true;
    g.holder_meta = true;
    g.list = true;
    g.counts_waiters = true;
    g.batch_renew = true;
    g
}

/// What `inspect` and `list` say about a holder's node: its data as the
/// owner (the owner token for polylock's nodes, a Curator client's address
/// for theirs), its czxid as the fence, the description polylock stored.
fn holder_info(data: &[u8], stat: &Stat) -> HolderInfo {
    let fence = u64::try_from(stat.czxid).ok().and_then(FencingToken::new);
    match parse_owner_value(data) {
        Some((owner, meta)) => HolderInfo::new(owner.to_string(), fence, None).with_meta(meta),
        None => HolderInfo::new(String::from_utf8_lossy(data).into_owned(), fence, None),
    }
}

/// A polylock client of a ZooKeeper ensemble.
///
/// One value is one client: one session per distinct TTL (the session
/// timeout the server negotiates is the lease's TTL), or one session for
/// all locks when the URL sets `session_timeout`. Clones share the client;
/// dropping the last clone closes its sessions, which deletes their nodes.
///
/// # Renew, release
/// The session keeps a node alive while the client lives, but a lease is
/// still a lease: a holding that is not renewed within its TTL is deleted
/// by this client at `sent_at + ttl` (never before the holder's local
/// deadline). `renew` reads the node (which also touches the session on
/// the server) and moves that expiry; `renew_many` reads the nodes of up to
/// 256 leases of one session in one multi-read (ZooKeeper 3.6 or later), so
/// the watchdog's renewals of many held locks cost a request per batch, not
/// per lock. Both must go through the client that acquired the lease.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::Locker;
/// let backend = backend_zk::ZkBackend::connect("zk://127.0.0.1:2181").await?;
/// let locker = Locker::new(backend);
/// let guard = locker.lock("reports").ttl(Duration::from_secs(10)).acquire().await?;
/// println!("fencing token {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("url", &self.inner.config.redacted_url())
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: ZkConfig,
    /// [`guarantees_for`] the config, computed once.
    guarantees: Guarantees,
    /// The lock space stamped on this client's leases; renew and release
    /// refuse another space's.
    space: LockSpace,
    sessions: Sessions,
    /// Holdings of this client by node path, in expiry order too.
    held: Mutex<Holdings>,
    /// Wakes the expiry task when a holding expires before its next look.
    expiry_wake: Arc<Notify>,
    /// Node paths this client released (or expired), oldest first, with
    /// what the lock's directory looked like right after.
    gone: Mutex<VecDeque<(Arc<str>, Gone)>>,
}

#[derive(Clone, Copy, Debug)]
enum Gone {
    /// Released by its holder.
    Released,
    /// Deleted at its expiry; `pzxid` is the lock directory's last child
    /// change seen right after, so a later holder shows as a change.
    Expired { pzxid: Option<i64> },
}

/// What ended a wait in the queue.
enum Woke {
    /// Our own node's watch fired.
    Own,
    /// The predecessor's watch fired with this event.
    Pred(EventType),
    /// A recheck, the session's end or the wait's.
    Other,
}

/// Where a contender stands in the queue.
enum Standing {
    /// First in line: the list request that showed it was sent at this
    /// instant, while the session was alive.
    First(Instant),
    /// Behind this node (its name in the directory); `true` when that
    /// node was first in line, i.e. ours was second.
    Behind(String, bool),
    /// Our node is no longer there.
    Vanished,
}

impl ZkBackend {
    /// Connects to the ensemble named by `url` (see [`ZkConfig`]). Opens no
    /// session yet: the first lock does.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created before the first lock.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Ok(Self::new(ZkConfig::parse(url)?))
    }

    /// A client with these options (no I/O).
    pub fn new(config: ZkConfig) -> Self {
        ZkBackend {
            inner: Arc::new(Inner {
                space: LockSpace::named(&["zookeeper", &config.chroot, &config.prefix]),
                guarantees: guarantees_for(&config),
                config,
                sessions: Sessions::default(),
                held: Mutex::default(),
                expiry_wake: Arc::default(),
                gone: Mutex::default(),
            }),
        }
    }

    /// The client's options.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The directory of `name`'s lock nodes, as clients of this URL see it.
    ///
    /// A Curator `InterProcessMutex` on this path shares the lock. A name
    /// nested under it (`NAME/...`) is a directory among its lock nodes,
    /// which polylock skips and Curator does not: it sorts the children by
    /// the text after their last `lock-` (the whole name without one) and
    /// waits on the child before its own, so a directory sorting before
    /// the ten-digit sequences (starting with `%`, `-`, `.` or a short run
    /// of zeros) makes every Curator client wait forever. Share a lock with
    /// Curator only on a name with no names nested under it.
    pub fn lock_path(&self, name: &LockName) -> String {
        let c = &self.inner.config;
        let rel = name_path(name);
        let mut p = String::with_capacity(c.chroot.len() + c.prefix.len() + rel.len() + 2);
        for piece in [c.chroot.as_str(), "/", c.prefix.as_str(), "/", rel.as_str()] {
            p.push_str(piece);
        }
        p
    }

    /// The session id (as ZooKeeper stores it in a node's ephemeral owner)
    /// of the session serving `ttl`, connecting it if needed.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn session_id(&self, ttl: Duration) -> Result<i64, LockError> {
        Ok(self.session(ttl).await?.id())
    }

    async fn session(&self, ttl: Duration) -> Result<Arc<Session>, LockError> {
        self.inner
            .sessions
            .get(&self.inner.config, self.session_timeout(ttl))
            .await
    }

    /// The session timeout asked for a lock of `ttl`: at most what the
    /// protocol can carry ([`MAX_SESSION_TIMEOUT`]); the server grants no
    /// more than its `maxSessionTimeout` anyway.
    fn session_timeout(&self, ttl: Duration) -> Duration {
        self.inner
            .config
            .session_timeout
            .unwrap_or_else(|| self.inner.guarantees.effective_ttl(ttl))
            .min(MAX_SESSION_TIMEOUT)
    }

    /// `req` for one pass of this client: its deadlines lose the
    /// `follower_lag`, and a TTL that leaves no renewal room then is
    /// refused before any I/O.
    fn lagged_request(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireRequest, LockError> {
        let clock = clock_for(req.clock, self.inner.config.follower_lag);
        clock
            .check_ttl(self.session_timeout(req.ttl))
            .map_err(|e| self.lag_error(e))?;
        Ok(AcquireRequest {
            wait,
            clock,
            ..req.clone()
        })
    }

    /// `e` ([`LockError::InvalidTtl`]) saying that the follower lag is
    /// part of the margin.
    fn lag_error(&self, e: LockError) -> LockError {
        match e {
            LockError::InvalidTtl { ttl, reason } if !self.inner.config.follower_lag.is_zero() => {
                LockError::InvalidTtl {
                    ttl,
                    reason: format!(
                        "{reason} (the margin includes this client's follower_lag of {:?})",
                        self.inner.config.follower_lag
                    ),
                }
            }
            other => other,
        }
    }

    /// The session for requests that hold nothing (inspect, force release,
    /// fenced writes): a long timeout, so a loaded machine does not make
    /// reads fail on a short lock session's reconnects.
    pub(crate) async fn any_session(&self) -> Result<Arc<Session>, LockError> {
        let c = &self.inner.config;
        let timeout = c.session_timeout.unwrap_or(ADMIN_SESSION);
        self.inner.sessions.get(c, timeout).await
    }

    /// The first node in line in `dir`, with its data and stat.
    async fn holder_of(
        &self,
        s: &Session,
        dir: &str,
    ) -> Result<Option<(Vec<u8>, Stat)>, LockError> {
        loop {
            let children = match timed("list", self.op(), s.client.list_children(dir)).await? {
                Ok(c) => c,
                Err(Error::NoNode) => return Ok(None),
                Err(e) => return Err(from_zk(&format!("listing {dir}"), e)),
            };
            let Some((_, first)) = queue(children).into_iter().next() else {
                return Ok(None);
            };
            if let Some(found) = self.node(s, &format!("{dir}/{first}")).await? {
                return Ok(Some(found));
            }
            // Released between the two reads: look again.
        }
    }

    /// The data and stat of the node at `path`; `None` if it is gone.
    async fn node(&self, s: &Session, path: &str) -> Result<Option<(Vec<u8>, Stat)>, LockError> {
        match timed("get", self.op(), s.client.get_data(path)).await? {
            Ok(found) => Ok(Some(found)),
            Err(Error::NoNode) => Ok(None),
            Err(e) => Err(from_zk(&format!("reading {path}"), e)),
        }
    }

    /// The children of `path`, none if it does not exist.
    async fn children(&self, s: &Session, path: &str) -> Result<Vec<String>, LockError> {
        match timed("list", self.op(), s.client.list_children(path)).await? {
            Ok(c) => Ok(c),
            Err(Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(from_zk(&format!("listing {path}"), e)),
        }
    }

    /// Runs the read `f` again while the connection is being
    /// re-established (up to `op_timeout`).
    async fn reading<T, F, Fut>(&self, mut f: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, LockError>>,
    {
        let give_up = Instant::now() + self.op();
        loop {
            match f().await {
                Err(e) if e.is_retryable() && Instant::now() < give_up => {
                    sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    async fn inspect_once(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        let s = self.any_session().await?;
        let found = self.holder_of(&s, &self.lock_path(name)).await?;
        Ok(found.map(|(data, stat)| holder_info(&data, &stat)))
    }

    /// Walks the directories under the prefix root, one depth at a time
    /// (the directories of one depth listed together), going only where a
    /// name starting with `prefix` can be; then reads the first node of
    /// each lock directory, in name order, until `limit` of polylock's
    /// holders are found.
    async fn list_once(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let s = self.any_session().await?;
        let c = &self.inner.config;
        let root = format!("{}/{}", c.chroot, c.prefix);
        let abs = |rel: &str| {
            if rel.is_empty() {
                root.clone()
            } else {
                format!("{root}/{rel}")
            }
        };
        // Directories to list at the next depth, relative to the root.
        let mut level = vec![String::new()];
        // Lock directories: the name and the first node in line.
        let mut locks: Vec<(LockName, String)> = Vec::new();
        while !level.is_empty() {
            let listed = futures::future::try_join_all(level.iter().map(|rel| {
                let (s, path) = (&s, abs(rel));
                async move { Ok::<_, LockError>((rel, self.children(s, &path).await?)) }
            }))
            .await?;
            let mut next = Vec::new();
            for (rel, children) in listed {
                // Lock nodes have no children; the prefix root holds none
                // (names map below it, the first segment unescaped).
                let dirs: Vec<&String> = children
                    .iter()
                    .filter(|c| rel.is_empty() || sequence_of(c).is_none())
                    .collect();
                for child in dirs {
                    let rel = if rel.is_empty() {
                        child.clone()
                    } else {
                        format!("{rel}/{child}")
                    };
                    // A directory no name maps to has no lock of ours below
                    // it either: the mapping escapes segment by segment.
                    if name_of_path(&rel).is_some_and(|n| may_lead_to(n.as_str(), prefix)) {
                        next.push(rel);
                    }
                }
                if rel.is_empty() {
                    continue;
                }
                let Some(name) = name_of_path(rel).filter(|n| n.as_str().starts_with(prefix))
                else {
                    continue;
                };
                if let Some((_, first)) = queue(children).into_iter().next() {
                    locks.push((name, format!("{}/{first}", abs(rel))));
                }
            }
            level = next;
        }
        locks.sort();
        let mut out = Vec::new();
        for chunk in locks.chunks(64) {
            let read = futures::future::try_join_all(chunk.iter().map(|(name, node)| {
                let s = &s;
                async move {
                    let found = match self.node(s, node).await? {
                        Some(found) => Some(found),
                        // Released since the listing: whoever is first now.
                        None => {
                            let dir = node.rsplit_once('/').map_or("", |(d, _)| d);
                            self.holder_of(s, dir).await?
                        }
                    };
                    Ok::<_, LockError>((name, found))
                }
            }))
            .await?;
            for (name, found) in read {
                let Some((data, stat)) = found else { continue };
                if parse_owner_value(&data).is_none() {
                    // A Curator client's (or another tool's) holder.
                    continue;
                }
                out.push((name.clone(), holder_info(&data, &stat)));
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    fn op(&self) -> Duration {
        self.inner.config.op_timeout
    }

    /// Creates our node with `data` (see [`crate::data`]) under `dir`, creating the parents when
    /// missing. A lost reply is recovered by finding the node by its uuid,
    /// until `answer_by`.
    ///
    /// # Cancel safety
    /// Dropped (or failing) before it returns, any create of ours that
    /// may still land is cleaned up in the background: see [`Entering`].
    async fn enter(
        &self,
        s: &Session,
        dir: &str,
        data: &str,
        answer_by: Instant,
    ) -> Result<(String, Stat), LockError> {
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let uuid = uuid::Uuid::new_v4()
            .hyphenated()
            .encode_lower(&mut text)
            .to_owned();
        let prefix = node_prefix(dir, &uuid);
        let mut entering = Entering::new(s, dir, &uuid, self.op());
        // Directories made for this create: one, or a few more when the
        // directory goes again in between (a worn directory's reset by
        // another client, an operator's deleteall, Curator's container
        // cleanup).
        let mut parents_made = 0;
        let mut tries = 0;
        loop {
            tries += 1;
            let answer = entering
                .create(&prefix, data, self.inner.config.acls())
                .await?;
            match answer {
                Ok((_, seq)) if seq.into_i64() < 0 => {
                    // The directory's 32-bit child counter wrapped: names no
                    // longer sort by age, so no queue order can be trusted.
                    // Ours goes (the sweep finds it by its uuid).
                    entering.uncertain = true;
                    return Err(LockError::permanent(
                        BACKEND,
                        format!(
                            "the child counter of {dir} wrapped past 2^31 (it counts every node \
                             created or deleted there), so its nodes no longer sort by age; \
                             polylock resets the directory when a release finds it empty past \
                             2^30, which a lock never free did not allow: delete {dir} while \
                             nobody holds or waits for the lock (zkCli: deleteall {dir})"
                        ),
                    ));
                }
                Ok((stat, seq)) => {
                    entering.disarm();
                    return Ok((node_path(&prefix, seq.into_i64()), stat));
                }
                Err(Error::NoNode) if parents_made < 3 => {
                    parents_made += 1;
                    let dirs = CreateMode::Persistent.with_acls(self.inner.config.acls());
                    timed("mkdir", self.op(), s.client.mkdir(dir, &dirs))
                        .await?
                        .map_err(|e| from_zk(&format!("creating {dir}"), e))?;
                }
                Err(e) if outcome_unknown(&e) => {
                    // The create may or may not have been applied: the
                    // uuid tells, once the session is reachable again.
                    entering.uncertain = true;
                    if let Some(found) = self.recover(s, dir, &uuid, answer_by).await? {
                        entering.disarm();
                        return Ok(found);
                    }
                    // Not there after a sync. Still `uncertain`: a driver
                    // timeout may leave the create queued on the server, so
                    // a failure from here on sweeps once more.
                    if tries >= 3 {
                        return Err(from_zk("create", e));
                    }
                }
                Err(e) => return Err(from_zk(&format!("creating a node in {dir}"), e)),
            }
        }
    }

    /// [`find_ours`](Self::find_ours), retried while the connection is
    /// being re-established (up to `op_timeout`, and not past `answer_by`:
    /// a caller is owed an answer then, and a node left uncertain is swept
    /// in the background).
    async fn recover(
        &self,
        s: &Session,
        dir: &str,
        uuid: &str,
        answer_by: Instant,
    ) -> Result<Option<(String, Stat)>, LockError> {
        let give_up = answer_by.min(Instant::now() + self.op());
        loop {
            match self.find_ours(s, dir, uuid, give_up).await {
                Err(e)
                    if e.is_retryable() && Instant::now() < give_up && !s.ended.is_cancelled() =>
                {
                    sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    /// The node of this session with `uuid` in `dir`, if the server has it;
    /// every request answered by `give_up`.
    async fn find_ours(
        &self,
        s: &Session,
        dir: &str,
        uuid: &str,
        give_up: Instant,
    ) -> Result<Option<(String, Stat)>, LockError> {
        let left = || give_up.saturating_duration_since(Instant::now());
        // The server we reconnected to may lag behind the one that applied
        // the create: catch it up first, or a node of ours could be missed
        // and a second one created behind it.
        timed("sync", left(), s.client.sync(dir))
            .await?
            .map_err(|e| from_zk(&format!("syncing {dir}"), e))?;
        let children = match timed("list", left(), s.client.list_children(dir)).await? {
            Ok(c) => c,
            Err(Error::NoNode) => return Ok(None),
            Err(e) => return Err(from_zk(&format!("listing {dir}"), e)),
        };
        for child in children.iter().filter(|c| is_ours(c, uuid)) {
            let path = format!("{dir}/{child}");
            match timed("get", left(), s.client.get_data(&path)).await? {
                // A node with our uuid is ours only if this session owns it.
                Ok((_, stat)) if stat.ephemeral_owner == s.id() => return Ok(Some((path, stat))),
                Ok(_) | Err(Error::NoNode) => {}
                Err(e) => return Err(from_zk(&format!("reading {path}"), e)),
            }
        }
        Ok(None)
    }

    async fn standing(&self, s: &Session, dir: &str, node: &str) -> Result<Standing, LockError> {
        let sent = Instant::now();
        let children = match timed("list", self.op(), s.client.list_children(dir)).await? {
            Ok(c) => c,
            Err(Error::NoNode) => return Ok(Standing::Vanished),
            Err(e) => return Err(from_zk(&format!("listing {dir}"), e)),
        };
        let q = queue(children);
        match q.iter().position(|(_, c)| c == node) {
            None => Ok(Standing::Vanished),
            Some(0) => Ok(Standing::First(sent)),
            Some(i) => Ok(Standing::Behind(q[i - 1].1.clone(), i == 1)),
        }
    }

    /// Turns our first-in-line node into a lease, and starts its expiry.
    fn grant(
        &self,
        req: &AcquireRequest,
        s: &Arc<Session>,
        path: String,
        stat: &Stat,
        sent: Instant,
    ) -> Result<Lease, LockError> {
        let fence = u64::try_from(stat.czxid)
            .ok()
            .and_then(FencingToken::new)
            .ok_or_else(|| {
                LockError::permanent(BACKEND, format!("{path} has czxid {}", stat.czxid))
            })?;
        let ttl = s.timeout();
        // One allocation for the path: the lease's key, the holding's key
        // and its place in the expiry order share it.
        let key: Arc<str> = path.into();
        let lease = req
            .lease(fence, ttl, sent)
            .with_backend_key(key.clone())
            .with_revocation(s.ended.clone());
        let expiry =
            self.inner
                .held()
                .insert(key, req.owner, fence, sent + ttl, s.clone(), req.clock);
        match expiry {
            Expiry::Planned => {}
            Expiry::Wake => self.inner.expiry_wake.notify_one(),
            Expiry::Start(generation) => {
                holdings::start(&self.inner, self.inner.expiry_wake.clone(), generation)
            }
        }
        Ok(lease)
    }

    /// One pass through the queue: create, then wait (up to `req.wait`)
    /// for the predecessors to go.
    ///
    /// # Hand-off without a second listing
    /// A waiter woken by its predecessor's deletion lists the directory
    /// again, to check every lower node is gone, except when the listing
    /// that found the predecessor showed it first in line: a node created
    /// after that listing has a higher sequence than ours, so with the
    /// first one deleted no lower node is left, and ours is first. Two
    /// more things the listing would have shown are checked without it:
    /// - our node is still there: a watch on it, registered with the
    ///   predecessor's (one more request in the same round trip), would
    ///   have fired first, as ZooKeeper delivers a session's events in
    ///   order and the client hands them out in that order (the select
    ///   below looks at it first). Not across a reconnect: the watches are
    ///   set again on the new connection, and what changed meanwhile comes
    ///   in the driver's order, so a reconnect since our node's watch was
    ///   set sends the waiter to the listing;
    /// - the session is alive: the event came on it, and the lease is
    ///   dated from when the watch request was sent (the server heard the
    ///   session then), which must leave three quarters of the time a
    ///   lease is trusted.
    ///
    /// A node a foreign client creates with a hand-picked sequence lower
    /// than ours is outside the protocol and is not looked for.
    async fn contend(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let wait_until = req.wait_deadline();
        // The answer is owed by the wait plus one op_timeout.
        let answer_by = wait_until.checked_add(self.op()).unwrap_or(wait_until);
        let dir = self.lock_path(&req.name);
        let data = owner_value(req.owner, req.meta.as_ref());
        loop {
            let s = self.session(req.ttl).await?;
            // The server may negotiate less than asked.
            req.clock.check_ttl(s.timeout()).map_err(|e| {
                self.lag_error(match e {
                    LockError::InvalidTtl { reason, .. } => LockError::InvalidTtl {
                        ttl: req.ttl,
                        reason: format!(
                            "the server granted a session of {:?}: {reason}",
                            s.timeout()
                        ),
                    },
                    other => other,
                })
            })?;
            let (path, stat) = self.enter(&s, &dir, &data, answer_by).await?;
            let node = path.rsplit('/').next().unwrap_or_default().to_string();
            let mut ours = NodeGuard::new(&s, &path, self.op());
            // Fires when our own node changes (it is only ever deleted) or
            // the session ends (not on a reconnect); with the connection's
            // states since that watch was set.
            let mut own: Option<(BoxFuture<'static, WatchedEvent>, StateWatcher)> = None;
            loop {
                if s.ended.is_cancelled() {
                    break;
                }
                match self.standing(&s, &dir, &node).await? {
                    Standing::Vanished => break,
                    Standing::First(sent) => {
                        // `stat` is this session's own: `enter` returns a
                        // node it created or one whose owner it checked.
                        ours.disarm();
                        return self.grant(req, &s, path, &stat, sent).map(Some);
                    }
                    Standing::Behind(pred, pred_is_first) => {
                        if Instant::now() >= wait_until {
                            ours.delete_now().await;
                            return Ok(None);
                        }
                        let pred = format!("{dir}/{pred}");
                        let watch_own = own.is_none() && pred_is_first;
                        // Before the watches leave, so that a reconnect
                        // after it shows.
                        let states = watch_own.then(|| s.client.state_watcher());
                        let watch_sent = Instant::now();
                        let (watched, own_watched) = tokio::join!(
                            timed("watch", self.op(), s.client.check_and_watch_stat(&pred)),
                            async {
                                if !watch_own {
                                    return None;
                                }
                                Some(
                                    timed("watch", self.op(), s.client.check_and_watch_stat(&path))
                                        .await,
                                )
                            }
                        );
                        match (own_watched, states) {
                            // Our node is gone: enter again.
                            (Some(Ok(Ok((None, _)))), _) => break,
                            (Some(Ok(Ok((Some(_), w)))), Some(states)) => {
                                own = Some((w.changed().boxed(), states))
                            }
                            // Only the fast hand-off needs it: without it,
                            // the next listing checks.
                            _ => {}
                        }
                        let watched =
                            watched?.map_err(|e| from_zk(&format!("watching {pred}"), e))?;
                        let (Some(_), watcher) = watched else {
                            continue;
                        };
                        let woke = tokio::select! {
                            biased;
                            _ = async {
                                match own.as_mut() {
                                    Some((f, _)) => f.await,
                                    None => std::future::pending().await,
                                }
                            } => Woke::Own,
                            e = watcher.changed() => Woke::Pred(e.event_type),
                            _ = sleep(RECHECK) => Woke::Other,
                            _ = s.ended.cancelled() => Woke::Other,
                            _ = sleep_until(wait_until) => Woke::Other,
                        };
                        // Read once: reading takes the state change.
                        if own.as_mut().is_some_and(|(_, states)| reconnected(states)) {
                            // After a reconnect, no fast hand-off on this
                            // watch of our node; the next listing sets a
                            // new one.
                            own = None;
                        }
                        match woke {
                            Woke::Own => own = None,
                            Woke::Pred(EventType::NodeDeleted)
                                if pred_is_first
                                    && own.is_some()
                                    && watch_sent.elapsed()
                                        < req.clock.trusted(s.timeout()) / 4
                                    && !s.ended.is_cancelled() =>
                            {
                                ours.disarm();
                                return self.grant(req, &s, path, &stat, watch_sent).map(Some);
                            }
                            Woke::Pred(_) | Woke::Other => {}
                        }
                    }
                }
            }
            // Our node vanished (removed behind our back, or with its
            // session): enter again, at the back of the queue.
            ours.disarm();
            if Instant::now() >= wait_until {
                return Ok(None);
            }
        }
    }

    /// The holding behind `lease`, if this client has it: its session,
    /// its expiry, and whether a release of it may have landed.
    fn held_session(&self, lease: &Lease, path: &str) -> Option<(Arc<Session>, Instant, bool)> {
        let held = self.inner.held();
        let h = held.get(path)?;
        (h.owner == lease.owner() && h.fence == lease.fence())
            .then(|| (h.session.clone(), h.expires, h.release_sent))
    }

    /// The session to renew `lease` on, or `Err(Lost)` without any request
    /// when this client no longer holds it (released, expired, taken by
    /// another client, its session ended).
    fn renewable(&self, lease: &Lease) -> Result<Arc<Session>, LockError> {
        let lost = || LockError::Lost {
            name: lease.name().to_string(),
        };
        let path = lease.backend_key().ok_or_else(lost)?;
        let (s, expires, _) = self.held_session(lease, path).ok_or_else(lost)?;
        if expires <= Instant::now() || s.ended.is_cancelled() {
            return Err(lost());
        }
        Ok(s)
    }

    /// Renews `leases`, all of session `s` (at most [`RENEW_CHUNK`]), with
    /// ONE multi-read of their nodes: each node must still be there with
    /// our owner token, our czxid (the fence) and our session as its
    /// ephemeral owner. The request also tells the server the session is
    /// alive, and the server keeps every ephemeral node of a live session,
    /// so the read is the whole renewal: nothing is written, and a node that
    /// is gone is never created again.
    async fn renew_chunk(&self, s: &Session, leases: &[&Lease]) -> Vec<Result<Lease, LockError>> {
        let lost = |l: &Lease| LockError::Lost {
            name: l.name().to_string(),
        };
        let mut reader = s.client.new_multi_reader();
        for l in leases {
            // `renewable` checked the key; the path was valid when created.
            if let Err(e) = reader.add_get_data(l.backend_key().unwrap_or_default()) {
                let e = from_zk("renewing", e);
                return leases.iter().map(|_| Err(again(&e))).collect();
            }
        }
        let sent = Instant::now();
        let answers = match timed("renew", self.op(), reader.commit()).await {
            Ok(Ok(a)) if a.len() == leases.len() => a,
            Ok(Ok(a)) => {
                let e = LockError::permanent(
                    BACKEND,
                    format!("renewing: {} answers to {} reads", a.len(), leases.len()),
                );
                return leases.iter().map(|_| Err(again(&e))).collect();
            }
            Ok(Err(e)) => {
                let e = from_zk("renewing", e);
                return leases.iter().map(|_| Err(again(&e))).collect();
            }
            Err(e) => return leases.iter().map(|_| Err(again(&e))).collect(),
        };
        let ttl = s.timeout();
        let mut held = self.inner.held();
        leases
            .iter()
            .zip(answers)
            .map(|(l, answer)| {
                let path = l.backend_key().unwrap_or_default();
                match answer {
                    MultiReadResult::Data { data, stat } => {
                        let same = parse_owner_value(&data).is_some_and(|(o, _)| o == l.owner())
                            && u64::try_from(stat.czxid).ok() == Some(l.fence().get())
                            && stat.ephemeral_owner == s.id();
                        // Moves the expiry only if the holding is still
                        // this lease's and had not expired meanwhile.
                        let extended = if same {
                            held.extend(path, l.fence(), sent + ttl)
                        } else {
                            None
                        };
                        match extended {
                            Some(granted) => Ok(l
                                .renewed(ttl, sent)
                                .with_deadline_no_later_than(granted.deadline(sent, ttl))),
                            None => Err(lost(l)),
                        }
                    }
                    MultiReadResult::Error { err: Error::NoNode } => Err(lost(l)),
                    MultiReadResult::Error { err } => Err(from_zk(&format!("reading {path}"), err)),
                    other => Err(LockError::permanent(
                        BACKEND,
                        format!("reading {path}: unexpected answer {other:?}"),
                    )),
                }
            })
            .collect()
    }

    async fn dir_pzxid(&self, s: &Session, dir: &str) -> Option<(i64, i32)> {
        // Synced first: a lagging member could show a directory older than
        // a grant the leader has made (then a release would say Ok, not
        // Lost).
        let until = lock_core::call::request_deadline(self.op());
        let read = async {
            s.client.sync(dir).await?;
            s.client.check_stat(dir).await
        };
        match tokio::time::timeout_at(until, read).await {
            Ok(Ok(Some(stat))) => Some((stat.pzxid, stat.num_children)),
            _ => None,
        }
    }
}

impl Inner {
    fn held(&self) -> std::sync::MutexGuard<'_, Holdings> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember(&self, path: Arc<str>, gone: Gone) {
        let mut g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() >= REMEMBERED {
            g.pop_front();
        }
        g.push_back((path, gone));
    }

    fn gone(&self, path: &str) -> Option<Gone> {
        let g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().rev().find(|(p, _)| &**p == path).map(|(_, s)| *s)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The expiry task holds the client weakly: let it see that now
        // rather than at the next expiry.
        self.expiry_wake.notify_one();
    }
}

impl holdings::Owner for Inner {
    fn holdings(&self) -> std::sync::MutexGuard<'_, Holdings> {
        self.held()
    }

    /// A lease ends at its TTL even though the session would keep the
    /// node: deletes it, and remembers the directory's state right after so
    /// a late release of this lease can tell whether anyone took it since.
    fn expired(self: Arc<Self>, path: Arc<str>, held: Held) {
        tokio::spawn(async move {
            let op = self.config.op_timeout;
            let client = &held.session.client;
            // Until gone (while the session lives): a node left by one
            // failed delete would stay first in line, held by nobody.
            delete_until_gone(client.clone(), path.to_string(), op).await;
            let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or_default();
            let pzxid = match tokio::time::timeout(op, client.check_stat(dir)).await {
                Ok(Ok(Some(stat))) if stat.num_children == 0 => Some(stat.pzxid),
                _ => None,
            };
            self.remember(path, Gone::Expired { pzxid });
        });
    }
}

type CreateAnswer = Result<(Stat, zookeeper_client::CreateSequence), Error>;

/// Our node while [`ZkBackend::enter`] creates it. Each create runs in a
/// task of its own, so neither a timeout nor a dropped acquire cuts it off
/// from its answer. Dropped armed (an error, a timeout, the acquire itself
/// dropped) while a create may have landed, it leaves a task that waits for
/// the create still in flight, then deletes every node with our uuid,
/// after a sync, for as long as the session lives: a node nobody waits on
/// would come first in line and hold the lock for nobody.
struct Entering {
    client: Option<zookeeper_client::Client>,
    dir: String,
    uuid: String,
    op: Duration,
    /// The create in flight, until its answer was read.
    pending: Option<tokio::task::JoinHandle<CreateAnswer>>,
    /// An earlier create's outcome is unknown: a node of ours may exist.
    uncertain: bool,
}

impl Entering {
    fn new(s: &Session, dir: &str, uuid: &str, op: Duration) -> Self {
        Entering {
            client: Some(s.client.clone()),
            dir: dir.to_string(),
            uuid: uuid.to_string(),
            op,
            pending: None,
            uncertain: false,
        }
    }

    /// Sends a create and waits up to `op` for its answer; past that, the
    /// create stays pending (for the cleanup) and a retryable error is
    /// returned.
    async fn create(
        &mut self,
        prefix: &str,
        data: &str,
        acls: zookeeper_client::Acls<'static>,
    ) -> Result<CreateAnswer, LockError> {
        let Some(client) = self.client.clone() else {
            return Err(LockError::permanent(
                BACKEND,
                "create after the node was handed over",
            ));
        };
        let (prefix, data) = (prefix.to_string(), data.as_bytes().to_vec());
        let task = self.pending.insert(tokio::spawn(async move {
            let opts = CreateMode::EphemeralSequential.with_acls(acls);
            client.create(&prefix, &data, &opts).await
        }));
        let joined = timed("create", self.op, task).await?;
        self.pending = None;
        joined.map_err(|e| LockError::transient(BACKEND, format!("create: the task ended: {e}")))
    }

    /// The node was handed to the caller (or no create was sent).
    fn disarm(&mut self) {
        self.client = None;
    }
}

impl Drop for Entering {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if self.pending.is_none() && !self.uncertain {
            // Every create sent was answered, and none made a node.
            return;
        }
        // No runtime (dropped outside one): the nodes go with the session.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (dir, uuid) = (
            std::mem::take(&mut self.dir),
            std::mem::take(&mut self.uuid),
        );
        rt.spawn(sweep_ours(client, dir, uuid, self.op, self.pending.take()));
    }
}

/// Waits for `pending` (the driver answers or fails every request it
/// sent), then deletes every node with `uuid` under `dir`, from a listing
/// taken after a sync; tries again while the session lives.
async fn sweep_ours(
    client: zookeeper_client::Client,
    dir: String,
    uuid: String,
    op: Duration,
    pending: Option<tokio::task::JoinHandle<CreateAnswer>>,
) {
    if let Some(create) = pending {
        let _ = create.await;
    }
    let mut pause = Duration::from_millis(50);
    loop {
        if client.state().is_terminated() {
            return;
        }
        let synced = tokio::time::timeout(op, client.sync(&dir)).await;
        if matches!(synced, Ok(Ok(()))) {
            match tokio::time::timeout(op, client.list_children(&dir)).await {
                Ok(Ok(children)) => {
                    for child in children.iter().filter(|c| is_ours(c, &uuid)) {
                        delete_until_gone(client.clone(), format!("{dir}/{child}"), op).await;
                    }
                    return;
                }
                Ok(Err(Error::NoNode)) => return,
                _ => {}
            }
        }
        sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Deletes a waiter's node if the wait ends without a lock (cancelled,
/// failed, given up): a waiter that left does not keep its place.
struct NodeGuard {
    client: Option<zookeeper_client::Client>,
    path: String,
    op: Duration,
}

impl NodeGuard {
    fn new(s: &Session, path: &str, op: Duration) -> Self {
        NodeGuard {
            client: Some(s.client.clone()),
            path: path.to_string(),
            op,
        }
    }

    fn disarm(&mut self) {
        self.client = None;
    }

    /// Deletes the node, waiting up to `op` for it; a delete that did not
    /// get through by then goes on in the background.
    async fn delete_now(&mut self) {
        // Waited for no longer than the call may take; the delete goes on
        // in the background past that.
        let until = lock_core::call::request_deadline(self.op);
        if let Some(task) = self.spawn_delete() {
            let _ = tokio::time::timeout_at(until, task).await;
        }
    }

    fn spawn_delete(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let client = self.client.take()?;
        // No runtime (dropped outside one): the node goes with its session.
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let path = std::mem::take(&mut self.path);
        Some(rt.spawn(delete_until_gone(client, path, self.op)))
    }
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        // No async drop: the delete goes to the runtime.
        let _ = self.spawn_delete();
    }
}

/// Past this sequence number, a release that leaves the lock's directory
/// empty deletes the directory, so that its 32-bit child counter (one count
/// per node created or deleted there) starts again from zero before it can
/// wrap, when names would stop sorting by age.
const WORN_SEQUENCE: i64 = 1 << 30;

/// After deleting the lock node `path`: if its sequence is past
/// [`WORN_SEQUENCE`], deletes the directory in the background, which the
/// server refuses unless it is empty (a contender arriving meanwhile
/// creates it again, as for a first lock). Never touches anyone's node.
fn reset_if_worn(client: &zookeeper_client::Client, path: &str, op: Duration) {
    let Some((dir, child)) = path.rsplit_once('/') else {
        return;
    };
    if sequence_of(child).is_none_or(|seq| seq < WORN_SEQUENCE) {
        return;
    }
    let (client, dir) = (client.clone(), dir.to_string());
    tokio::spawn(async move {
        let _ = tokio::time::timeout(op, client.delete(&dir, None)).await;
    });
}

/// Deletes `path`, a node of `client`'s session, trying again while the
/// session lives. A waiter's node left behind by one failed delete (a
/// connection lost at that moment) would come first in line once the
/// nodes before it go, and hold the lock for nobody until its session
/// ends.
async fn delete_until_gone(client: zookeeper_client::Client, path: String, op: Duration) {
    let mut pause = Duration::from_millis(50);
    loop {
        match tokio::time::timeout(op, client.delete(&path, None)).await {
            Ok(Ok(()) | Err(Error::NoNode)) => return,
            Ok(Err(e)) if !outcome_unknown(&e) && !retryable(&e) => {
                // Refused (an ACL, say): trying again changes nothing.
                tracing::warn!(backend = BACKEND, %path, error = %e, "could not delete a waiter's node");
                return;
            }
            // Connection trouble or no answer in time.
            Ok(Err(_)) | Err(_) => {}
        }
        if client.state().is_terminated() {
            return;
        }
        sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

impl ZkBackend {
    /// The body of [`LockBackend::release`], under its call deadline.
    async fn release_now(&self, lease: &Lease) -> Result<(), LockError> {
        let lost = || LockError::Lost {
            name: lease.name().to_string(),
        };
        let path = lease.backend_key().ok_or_else(lost)?;
        let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or_default();
        if let Some((s, _, release_sent)) = self.held_session(lease, path) {
            if s.ended.is_cancelled() {
                // The session ended: its nodes went with it, ours too
                // (unless our earlier delete got there first).
                self.inner.held().remove(path);
                return if release_sent { Ok(()) } else { Err(lost()) };
            }
            // Marked before the delete leaves: if this future is dropped
            // after it did, a retried release that finds no node is this
            // one, not a loss. (The match below reads the mark as it was.)
            self.inner.held().set_release_sent(path, true);
            // The path holds a uuid of this client's own attempt, and
            // polylock never writes lock nodes (version 0): a node still
            // there at version 0 is this holding, so no read is needed
            // before the delete.
            let r = timed("delete", self.op(), s.client.delete(path, Some(0))).await?;
            let forget = || self.inner.held().remove(path);
            let released = || {
                if let Some((path, _)) = forget() {
                    self.inner.remember(path, Gone::Released);
                }
                Ok(())
            };
            // A failed request keeps the holding: the caller may retry.
            return match r {
                Ok(()) => {
                    reset_if_worn(&s.client, path, self.op());
                    released()
                }
                // Our earlier delete landed after all (or, as likely, the
                // node went otherwise after it was sent: told apart by
                // nothing the server keeps).
                Err(Error::NoNode) if release_sent => released(),
                Err(Error::NoNode) => {
                    forget();
                    Err(lost())
                }
                // Someone wrote to our node (Curator's revoker, an
                // operator): the holding counts as lost, but the node is
                // still ours (our uuid, our session) and, left in place,
                // would head the queue for as long as the session lives.
                // Deleted whatever its version; a failure keeps the
                // holding for the caller's retry.
                Err(Error::BadVersion) => {
                    match timed("delete", self.op(), s.client.delete(path, None)).await? {
                        Ok(()) | Err(Error::NoNode) => {
                            forget();
                            Err(lost())
                        }
                        Err(e) => Err(from_zk(&format!("deleting {path}"), e)),
                    }
                }
                Err(e) => {
                    if !outcome_unknown(&e) {
                        // Refused: this delete did not land.
                        self.inner.held().set_release_sent(path, release_sent);
                    }
                    Err(from_zk(&format!("deleting {path}"), e))
                }
            };
        }
        match self.inner.gone(path) {
            Some(Gone::Released) => Ok(()),
            Some(Gone::Expired { pzxid: Some(then) }) => {
                let s = self.any_session().await?;
                match self.dir_pzxid(&s, dir).await {
                    Some((now, 0)) if now == then => Ok(()),
                    _ => Err(lost()),
                }
            }
            _ => Err(lost()),
        }
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    /// Creates a node and keeps it only if it is first in line.
    ///
    /// # Cancel safety
    /// Dropped after the create left, the node is deleted in the
    /// background (or goes with the session).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let one = self.lagged_request(req, Duration::ZERO)?;
        // The session, the node, the look at the queue and the node's
        // removal when not first: one op_timeout for them all.
        let won = lock_core::call::within(self.op(), self.contend(&one)).await;
        self.inner.space.stamp(won)
    }

    /// Queues a node and waits for the predecessor's deletion (a watch on
    /// that node only); re-checks every lower node when woken.
    ///
    /// # Cancel safety
    /// Dropping the future deletes its node in the background, so it does
    /// not hold its place in the queue.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let deadline = req.wait_deadline();
        // Each pass waits what is left of the one wait, not a fresh one.
        let mut pass = self.lagged_request(req, req.wait)?;
        let mut pacer = Pacer::new(req.backoff_or(ERROR_BACKOFF));
        // The answer is owed by the wait plus one op_timeout: a pass that
        // began just before the wait ended included.
        let passes = async {
            loop {
                pass.wait = deadline.saturating_duration_since(Instant::now());
                match self.contend(&pass).await {
                    Err(e) if e.is_retryable() && Instant::now() < deadline => {
                        pacer.pause_until(deadline).await;
                        // No pass starts after the wait.
                        if Instant::now() >= deadline {
                            return Err(e);
                        }
                    }
                    other => return other,
                }
            }
        };
        let won = lock_core::call::within(req.wait.saturating_add(self.op()), passes).await;
        self.inner.space.stamp(won)
    }

    /// Reads the node (touching the session) and moves the lease's expiry:
    /// [`renew_many`](LockBackend::renew_many) with one lease.
    ///
    /// # Cancel safety
    /// Cancel safe: the expiry moves only once the read answered.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        // Before the batch, which renews a batch with a foreign lease
        // through this method, one lease at a time.
        self.inner.space.check(lease)?;
        let mut answers = self.renew_many(std::slice::from_ref(lease)).await;
        answers
            .pop()
            .unwrap_or_else(|| Err(LockError::permanent(BACKEND, "renewing: no answer")))
    }

    /// Renews the leases of each session with one multi-read per
    /// 256 leases (a request per session a batch spans, all in
    /// flight together), not one request per lease: see
    /// [`Guarantees::batch_renew`]. A lease this client no longer holds is
    /// `Err(Lost)` without a request.
    ///
    /// # Cancel safety
    /// Cancel safe: a lease's expiry moves only once its read answered.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if self.inner.space.any_foreign(leases) {
            return lock_core::renew_each(self, leases).await;
        }
        let mut answers: Vec<Option<Result<Lease, LockError>>> =
            leases.iter().map(|_| None).collect();
        // The leases of each session, by their place in `leases`.
        let mut by_session: Vec<(Arc<Session>, Vec<usize>)> = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            match self.renewable(lease) {
                Ok(s) => match by_session.iter_mut().find(|(t, _)| Arc::ptr_eq(t, &s)) {
                    Some((_, at)) => at.push(i),
                    None => by_session.push((s, vec![i])),
                },
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        let chunks = by_session.iter().flat_map(|(s, at)| {
            at.chunks(RENEW_CHUNK).map(move |at| async move {
                let chunk: Vec<&Lease> = at.iter().map(|&i| &leases[i]).collect();
                (at, self.renew_chunk(s, &chunk).await)
            })
        });
        for (at, renewed) in futures::future::join_all(chunks).await {
            for (&i, r) in at.iter().zip(renewed) {
                answers[i] = Some(r);
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(LockError::permanent(BACKEND, "renewing: no answer"))))
            .collect()
    }

    /// Deletes the node if it is still this holding.
    ///
    /// # Cancel safety
    /// Cancel safe: the node is deleted or not; an undeleted one expires at
    /// the lease's TTL.
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.inner.space.check(lease)?;
        // The delete and, for a lease past its session, the look at the
        // directory: one op_timeout for them all.
        lock_core::call::within(self.op(), self.release_now(lease)).await
    }

    /// The first node in line: its owner token (or, for a Curator holder,
    /// its data as it is), its czxid as the fence, the holder's description
    /// when polylock stored one (see the crate docs).
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        self.reading(|| self.inspect_once(name)).await
    }

    /// The lock directories under the prefix root whose first node is
    /// polylock's (its data is an owner token), with the names mapped back
    /// from the paths exactly (see [`ZkBackend::lock_path`]); directories
    /// other clients named outside that mapping, and locks Curator clients
    /// hold, are not listed.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        let limit = lock_core::validate_list(prefix, limit)?;
        self.reading(|| self.list_once(prefix, limit)).await
    }

    /// The lock nodes in the name's directory (polylock's and Curator's)
    /// but the first.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>, LockError> {
        let dir = self.lock_path(name);
        let queued = self
            .reading(|| async {
                let s = self.any_session().await?;
                Ok(queue(self.children(&s, &dir).await?).len())
            })
            .await?;
        Ok(Some(queued.saturating_sub(1)))
    }

    /// Deletes the first node in line, whoever created it.
    ///
    /// # Cancel safety
    /// Cancel safe: the node is deleted or not.
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        let s = self.any_session().await?;
        let dir = self.lock_path(name);
        // A follower behind the leader would list a holder already gone
        // (the delete then finds nothing and the live holder stays), or
        // none yet: caught up first.
        match timed("sync", self.op(), s.client.sync(&dir)).await? {
            Ok(()) | Err(Error::NoNode) => {}
            Err(e) => return Err(from_zk(&format!("syncing {dir}"), e)),
        }
        let children = match timed("list", self.op(), s.client.list_children(&dir)).await? {
            Ok(c) => c,
            Err(Error::NoNode) => return Ok(false),
            Err(e) => return Err(from_zk(&format!("listing {dir}"), e)),
        };
        let Some((_, first)) = queue(children).into_iter().next() else {
            return Ok(false);
        };
        let path = format!("{dir}/{first}");
        match timed("delete", self.op(), s.client.delete(&path, None)).await? {
            Ok(()) => Ok(true),
            Err(Error::NoNode) => Ok(false),
            Err(e) => Err(from_zk(&format!("deleting {path}"), e)),
        }
    }

    /// See [`LockSpace`]: leases of another space are refused before any
    /// I/O.
    fn lock_space(&self) -> Option<LockSpace> {
        Some(self.inner.space)
    }

    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_ttl_matches_what_sessions_are_asked_for() {
        let g = guarantees();
        assert_eq!(g.effective_ttl(Duration::from_millis(300)), MIN_TTL);
        assert_eq!(
            g.effective_ttl(Duration::from_millis(1500)),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn the_default_lag_raises_the_shortest_ttl_to_what_the_readme_says() {
        // README.md, the zk:// row: "26.3 s with the default lag".
        let min = min_ttl_for(crate::DEFAULT_FOLLOWER_LAG);
        assert_eq!(min, Duration::from_millis(26_282));
        let g = guarantees_for(&ZkConfig::parse("zk://a,b,c").unwrap());
        assert_eq!(g.min_ttl, min);
        let readme = include_str!("../../README.md");
        assert!(readme.contains("26.3 s with the default lag"));
    }

    #[test]
    fn lock_paths_follow_chroot_prefix_and_escaping() {
        let b = ZkBackend::new(ZkConfig::parse("zk://h/app?prefix=locks").unwrap());
        let n = LockName::new("a//b").unwrap();
        assert_eq!(b.lock_path(&n), "/app/locks/a%2F%2Fb");
        let b = ZkBackend::new(ZkConfig::parse("zk://h").unwrap());
        assert_eq!(
            b.lock_path(&LockName::new("reports/nightly").unwrap()),
            "/polylock/reports/nightly"
        );
        assert!(!format!("{b:?}").is_empty());
    }
}
