//! [`EtcdBackend`]: the [`LockBackend`] over etcd.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, ConnectOptions};
use futures::{FutureExt, StreamExt, TryStreamExt};
use lock_core::{
    AcquireRequest, ExpiryClock, FencingGuarantee, FencingToken, Guarantees, HolderInfo, Lease,
    LockBackend, LockError, LockName, LockSpace, OwnerToken, WaitMechanism,
};
use tokio::time::{sleep, sleep_until, timeout_at, Instant};

use crate::config::EtcdConfig;
use crate::conn::Conn;
use crate::errors::{from_etcd, is_auth_failure, lease_gone, retryable, timed_out, BACKEND};
use crate::queue::{self, Claim, Released, Values};
use crate::session::{spawn_cleanup, Cleanup, Closed, Session, SessionInfo, SessionUse};
use crate::slot::{Slot, Slots};
use crate::watch::{Subscription, Watches};
use lock_core::wait::{Backoff, Pacer};
use lock_core::{owner_value, parse_owner_value};

/// The smallest lease etcd grants with its default election timing
/// (`ceil(1.5 * election timeout)` = 2 s); shorter requests are raised.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// While waiting on a watch, read the queue again this often anyway, in
/// case a stream went silent without an error (a frozen member).
const RECHECK: Duration = Duration::from_secs(5);

/// A pause before retrying a failed read while waiting in the queue.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The pacing of a waiting acquire's new attempts after a retryable
/// failure (a leader election, a broken connection), unless the request
/// brings its own ([`AcquireRequest::retry`]).
const ERROR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(20),
    max: Duration::from_millis(500),
};

/// How long a release keeps asking after a retryable failure: long enough
/// for a connection that broke under it to be made again, short enough
/// that a release with etcd down does not hang until the lease's deadline.
const RELEASE_RETRY: Duration = Duration::from_secs(1);

/// A polylock client of an etcd cluster.
///
/// One value is one client: one gRPC channel balanced over the endpoints,
/// and one session lease per distinct TTL (in whole seconds), kept alive in
/// the background and shared by every lock taken with that TTL (revoked
/// after 30 s without locks). Clones share the client. Dropping the last
/// clone revokes the sessions, which deletes their keys at once.
///
/// # TTLs
/// etcd grants leases in whole seconds with a 2 s minimum, so a TTL is
/// rounded up (1.2 s → 2 s); the [`Lease`] reports the TTL etcd granted.
/// Locks with different TTLs use different sessions (and so different
/// claim keys); locks with the same TTL share one.
///
/// # Renew, release, reuse
/// `renew` and `release` must go through the client that acquired the
/// lease: its session keeps the lease alive. `renew` sends no request of
/// its own besides one read of the claim key; it reports the session's
/// latest keepalive.
///
/// # One claim per name per client
/// Tasks of one client asking for the same name queue in the client first
/// and enter etcd's queue one at a time (see the crate docs).
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::Locker;
/// let backend = backend_etcd::EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
/// let locker = Locker::new(backend);
/// let guard = locker.lock("reports").ttl(Duration::from_secs(10)).acquire().await?;
/// println!("fencing token {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: EtcdConfig,
    /// The lock space stamped on this client's leases; renew and release
    /// refuse another space's.
    space: LockSpace,
    conn: Conn,
    sessions: Mutex<Vec<Arc<Session>>>,
    /// One grant at a time, so concurrent first acquisitions share it.
    granting: tokio::sync::Mutex<()>,
    slots: Arc<Slots>,
    /// Holdings this client released (or tried to, without an answer),
    /// newest last: a second release of one of them is `Ok`, while a claim
    /// that vanished otherwise says `Lost`.
    released: Mutex<ReleasedLog>,
    /// The lock watches this client's waiters share.
    watches: Watches,
}

/// How many released holdings a client remembers for idempotent releases.
/// Beyond that, releasing a long-released holding again says `Lost`: never
/// a wrong `Ok`.
const RELEASED_MEMORY: usize = 4096;

/// The last [`RELEASED_MEMORY`] holdings (claim key, create revision)
/// released through this client.
#[derive(Default)]
struct ReleasedLog {
    order: std::collections::VecDeque<(String, i64)>,
    set: std::collections::HashSet<(String, i64)>,
}

impl ReleasedLog {
    fn record(&mut self, key: &str, rev: i64) {
        let entry = (key.to_string(), rev);
        if self.set.insert(entry.clone()) {
            self.order.push_back(entry);
        }
        while self.order.len() > RELEASED_MEMORY {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    fn contains(&self, key: &str, rev: i64) -> bool {
        self.set.contains(&(key.to_string(), rev))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for s in self
            .sessions
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            s.shutdown();
        }
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("url", &self.inner.config.redacted_url())
            .field("prefix", &self.inner.config.prefix())
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Parses `url` (see [`EtcdConfig`]) and connects.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created on the server before the first lock.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(EtcdConfig::parse(url)?).await
    }

    /// Connects with a parsed configuration, and checks that the cluster
    /// answers (and accepts the credentials) within the connect timeout.
    /// The error names the endpoints, never the password.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is created on the server before the first lock.
    pub async fn connect_with(config: EtcdConfig) -> Result<Self, LockError> {
        let endpoints = config.endpoints().join(",");
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout())
            // HTTP/2 pings find a dead or silent connection so the channel
            // reconnects. etcd punishes pings more often than every 5 s, and
            // any ping without an open stream.
            .with_keep_alive(Duration::from_secs(10), config.connect_timeout())
            .with_keep_alive_while_idle(false)
            // A member cut off from the leader refuses requests at once
            // instead of serving stale watches.
            .with_require_leader(true);
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        if config.tls() {
            options = options.with_tls(tls_options(&config)?);
        }
        let context = format!("could not connect to etcd at {endpoints}");
        // With several endpoints, the balanced channel may pick a dead member
        // first: keep trying until the connect timeout, then report the last
        // failure (or the timeout).
        let deadline = Instant::now() + config.connect_timeout();
        let mut made: Option<Client> = None;
        let mut last: Option<etcd_client::Error> = None;
        let client = loop {
            let attempt = async {
                let c = match made.take() {
                    Some(c) => c,
                    None => Client::connect(config.endpoint_urls(), Some(options.clone())).await?,
                };
                // etcd-client connects lazily: ask something small so that an
                // unreachable cluster is an error now, naming the endpoints.
                let probe = c.maintenance_client().status().await;
                Ok::<_, etcd_client::Error>((c, probe))
            };
            let e = match timeout_at(deadline, attempt).await {
                Ok(Ok((c, Ok(_)))) => break c,
                // Some etcd versions keep Status for admins: an answer is enough.
                Ok(Ok((c, Err(etcd_client::Error::GRpcStatus(s)))))
                    if s.code() == tonic::Code::PermissionDenied =>
                {
                    break c
                }
                Ok(Ok((c, Err(e)))) => {
                    made = Some(c);
                    e
                }
                Ok(Err(e)) => e,
                Err(_) => {
                    return Err(match last {
                        Some(e) => from_etcd(context, e),
                        None => timed_out(context, config.connect_timeout()),
                    })
                }
            };
            if is_auth_failure(&e) {
                let user = config.user().unwrap_or_default();
                return Err(LockError::permanent(
                    BACKEND,
                    format!("{context}: authentication failed for user {user:?}"),
                ));
            }
            if !retryable(&e) || Instant::now() + RETRY_PAUSE >= deadline {
                return Err(from_etcd(context, e));
            }
            last = Some(e);
            sleep(RETRY_PAUSE).await;
        };
        let conn = Conn::new(&client, config.op_timeout());
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                space: LockSpace::named(&["etcd", config.prefix()]),
                config,
                watches: Watches::new(conn.clone(), crate::watch::LINGER),
                conn,
                sessions: Mutex::new(Vec::new()),
                granting: tokio::sync::Mutex::new(()),
                slots: Arc::default(),
                released: Mutex::default(),
            }),
        })
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The live sessions of this client: one per TTL in use.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.sessions_list()
            .iter()
            .filter(|s| !s.is_closed())
            .map(|s| s.info())
            .collect()
    }

    /// The etcd key prefix of lock `name`: `{prefix}{name}/`. Claims are
    /// the keys directly under it.
    pub fn key_prefix(&self, name: &LockName) -> String {
        queue::lock_prefix(self.inner.config.prefix(), name)
    }

    /// How long a renewal waits for its session's keepalive: one
    /// `op_timeout`, and never past the lease's `deadline`.
    fn keepalive_limit(&self, deadline: Instant) -> Instant {
        deadline.min(Instant::now() + self.inner.config.op_timeout())
    }

    /// A renewal whose keepalive did not answer by its
    /// [`keepalive_limit`](Self::keepalive_limit): the lease is lost once its
    /// deadline passed or its session ended; before that, the server was only
    /// slow to answer, and the lease still holds until its deadline.
    fn unanswered(&self, session: &Session, lease: &Lease) -> LockError {
        if session.is_closed() || Instant::now() >= lease.deadline() {
            return LockError::Lost {
                name: lease.name().to_string(),
            };
        }
        LockError::transient(
            BACKEND,
            format!(
                "renewing {:?}: no keepalive answer within {:?}",
                lease.name(),
                self.inner.config.op_timeout()
            ),
        )
    }

    pub(crate) fn conn(&self) -> &Conn {
        &self.inner.conn
    }

    /// The time left of session lease `id`: `Some(None)` for a key on no
    /// lease, `None` when the lease is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn time_to_live(&self, id: i64) -> Result<Option<Option<Duration>>, LockError> {
        if id == 0 {
            return Ok(Some(None));
        }
        let r = self.conn().time_to_live(id).await?;
        // etcd answers -1 for a lease that expired or was revoked.
        Ok(u64::try_from(r.ttl())
            .ok()
            .map(|secs| Some(Duration::from_secs(secs))))
    }

    fn released_log(&self) -> MutexGuard<'_, ReleasedLog> {
        // Critical sections are single set operations.
        self.inner
            .released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// One release attempt, as [`release`](LockBackend::release) describes.
    async fn release_once(&self, lease: &Lease) -> Result<(), LockError> {
        let lost = || LockError::Lost {
            name: lease.name().to_string(),
        };
        let Some(key) = lease.backend_key() else {
            return Err(lost());
        };
        let rev = i64::try_from(lease.fence().get()).unwrap_or(-1);
        let session = self.session_of_key(key);
        // Fast path: this client holds exactly this claim. The key embeds
        // our session's lease id, and only this client creates it, one
        // claim per name at a time (the slot, held until the key is gone).
        // So the key in etcd is this very claim, or nothing, or a later
        // claim of ours made after this one was reaped: the delete compares
        // the create revision (one request still), not the value.
        if let Some(s) = session
            .as_ref()
            .filter(|s| s.holds(key, lease.owner(), rev))
        {
            let deleted = {
                let mut attempt = ReleaseAttempt::new(self, key, rev);
                attempt.finish_if_dropped = Some((Arc::clone(s), lease.owner()));
                let r = queue::delete_own(self.conn(), key, rev).await;
                attempt.finish_if_dropped = None;
                let deleted = r?;
                attempt.may_have_deleted = deleted;
                deleted
            };
            s.forget(key, rev, lease.owner());
            if deleted {
                return Ok(());
            }
            // Held by us, yet gone: someone else deleted it, or the lease
            // ended. Unless an earlier release of ours got no answer.
            return if self.was_released(key, rev) {
                Ok(())
            } else {
                Err(lost())
            };
        }
        let pfx = self.key_prefix(lease.name());
        let outcome = {
            let mut attempt = ReleaseAttempt::new(self, key, rev);
            queue::release(
                self.conn(),
                &pfx,
                key,
                lease.owner(),
                rev,
                &mut attempt.may_have_deleted,
            )
            .await?
        };
        // Whatever the outcome, this holding's claim is not in etcd any more
        // (deleted now, gone before, or replaced): forget it locally.
        if let Some(session) = session {
            session.forget(key, rev, lease.owner());
        }
        match outcome {
            Released::Deleted => Ok(()),
            // Gone because we released it before (anyone may hold it now).
            _ if self.was_released(key, rev) => Ok(()),
            Released::AlreadyFree | Released::HeldByOther => Err(lost()),
        }
    }

    fn was_released(&self, key: &str, rev: i64) -> bool {
        self.released_log().contains(key, rev)
    }

    fn sessions_list(&self) -> MutexGuard<'_, Vec<Arc<Session>>> {
        // Critical sections are single list operations.
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn live_session(&self, secs: u64) -> Option<(Arc<Session>, SessionUse)> {
        let mut list = self.sessions_list();
        list.retain(|s| !s.is_closed());
        let s = list.iter().find(|s| s.asked_secs == secs)?;
        let used = s.begin_use()?;
        Some((Arc::clone(s), used))
    }

    /// The session for `ttl`, granting one if there is none alive.
    async fn session(&self, ttl: Duration) -> Result<(Arc<Session>, SessionUse), LockError> {
        // etcd leases count whole seconds; the declared minimum applies.
        let (_, secs) = guarantees().granted_ttl(ttl, Duration::from_secs(1));
        if let Some(found) = self.live_session(secs) {
            return Ok(found);
        }
        // Another caller may be starting a session: wait for it no longer
        // than a request may take.
        let op_timeout = self.inner.config.op_timeout();
        let _granting = timeout_at(
            lock_core::call::request_deadline(op_timeout),
            self.inner.granting.lock(),
        )
        .await
        .map_err(|_| crate::errors::timed_out("starting a session", op_timeout))?;
        if let Some(found) = self.live_session(secs) {
            return Ok(found);
        }
        let session =
            Session::start(self.inner.conn.clone(), secs, self.inner.config.prefix()).await?;
        let used = session
            .begin_use()
            .ok_or_else(|| LockError::transient(BACKEND, "a new etcd session ended at once"))?;
        self.sessions_list().push(Arc::clone(&session));
        Ok((session, used))
    }

    /// The live session a claim key belongs to.
    fn session_of_key(&self, key: &str) -> Option<Arc<Session>> {
        let id = queue::lease_of_key(key)?;
        self.sessions_list()
            .iter()
            .find(|s| s.id == id && !s.is_closed())
            .cloned()
    }

    /// One acquisition: create the claim, and if it is not first, either
    /// give up (`deadline` None) or wait for the predecessors until
    /// `deadline`.
    async fn attempt(
        &self,
        req: &AcquireRequest,
        slot: Slot,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>, LockError> {
        let conn = self.conn();
        let pfx = self.key_prefix(&req.name);
        let value = owner_value(req.owner, req.meta.as_ref());
        let mut slot = Some(slot);
        let mut expired_sessions = 0;
        loop {
            let (session, _using) = self.session(req.ttl).await?;
            let key = queue::claim_key(&pfx, session.id);
            let mut claim = Queued {
                conn: conn.clone(),
                session: Arc::clone(&session),
                key: key.clone(),
                how: Cleanup::Value(value.clone()),
                slot: slot.take(),
                armed: true,
            };
            let created = match queue::create(conn, &pfx, &key, &value, session.id).await {
                Ok(c) => c,
                Err(e) if lease_gone(&e) && expired_sessions < 2 => {
                    // The session lease expired in etcd before our keepalive
                    // task noticed: end it and queue on a new one.
                    expired_sessions += 1;
                    session.expired();
                    slot = claim.slot.take();
                    claim.armed = false;
                    continue;
                }
                Err(e) => return Err(e),
            };
            claim.how = Cleanup::Revision(created.rev);
            // Not alone in the range: one read tells whether ours is first
            // and, if not, whom to wait for. A waiter subscribes to the
            // lock's watch before that read, so the watch covers it.
            let mut sub = None;
            let ahead = if created.alone {
                None
            } else {
                if let Some(deadline) = deadline {
                    let mut s = self.inner.watches.subscribe(&pfx);
                    if timeout_at(deadline, s.ready()).await.is_err() {
                        let _ = claim.delete().await;
                        return Ok(None);
                    }
                    sub = Some(s);
                }
                let a = queue::look_ahead(conn, &pfx, &key, created.rev).await?;
                (!a.first(&key, created.rev, session.id)).then_some(a)
            };
            if let Some(ahead) = ahead {
                let (Some(deadline), Some(sub)) = (deadline, sub.as_mut()) else {
                    claim.delete().await?;
                    return Ok(None);
                };
                match self
                    .wait_turn(&session, sub, &key, created.rev, deadline, ahead)
                    .await?
                {
                    Turn::Mine => {}
                    Turn::TimedOut => {
                        // Leave the queue; if that fails the guard retries
                        // in the background, and the answer is the same.
                        let _ = claim.delete().await;
                        return Ok(None);
                    }
                    Turn::Gone => {
                        // Our claim vanished (session lost, or deleted by an
                        // operator): queue again with a fresh claim. The old
                        // one's cleanup compares its revision, so it cannot
                        // touch the new one even under the same key.
                        slot = claim.slot.take();
                        drop(claim);
                        if Instant::now() >= deadline {
                            return Ok(None);
                        }
                        continue;
                    }
                }
            }
            let fence = FencingToken::new(u64::try_from(created.rev).unwrap_or(0))
                .ok_or_else(|| crate::errors::unexpected("acquiring", "create revision 0"))?;
            match session.register(key.clone(), created.rev, req.owner, claim.slot.take()) {
                Ok(state) => {
                    claim.armed = false;
                    let lease = req
                        .lease(fence, state.ttl, state.last_ok_sent)
                        .with_backend_key(key)
                        .with_revocation(session.revocation());
                    return Ok(Some(lease));
                }
                Err(Closed(back)) => {
                    // The session ended between the create and now: its
                    // lease is gone or going, and the lock with it.
                    slot = back;
                    drop(claim);
                    match deadline {
                        Some(d) if Instant::now() < d => continue,
                        _ => {
                            return Err(LockError::transient(
                                BACKEND,
                                "the etcd session ended while acquiring",
                            ))
                        }
                    }
                }
            }
        }
    }

    /// Waits until our claim (created at `my_rev`) is the lowest: wait for
    /// the delete of the claim just before it, then look again; behind the
    /// last claim ahead, its delete alone says so (see
    /// [`queue::wait_last`]). The deletes come from the lock's shared
    /// watch `sub`; `seen` is a look at the queue made once it was ready.
    async fn wait_turn(
        &self,
        session: &Session,
        sub: &mut Subscription,
        key: &str,
        my_rev: i64,
        deadline: Instant,
        seen: queue::Ahead,
    ) -> Result<Turn, LockError> {
        let conn = self.conn();
        let pfx = sub.prefix();
        let pfx = &*pfx;
        let mut seen = Some(seen);
        loop {
            if Instant::now() >= deadline {
                return Ok(Turn::TimedOut);
            }
            if session.is_closed() {
                return Ok(Turn::Gone);
            }
            let ahead = match seen.take() {
                Some(a) => a,
                None => {
                    // Read only once the watch exists, so it covers the read.
                    let read = async {
                        sub.ready().await;
                        queue::look_ahead(conn, pfx, key, my_rev).await
                    };
                    match timeout_at(deadline, read).await {
                        Err(_) => return Ok(Turn::TimedOut),
                        Ok(Err(e)) if e.is_retryable() => {
                            pause_until(RETRY_PAUSE, deadline).await;
                            continue;
                        }
                        Ok(Err(e)) => return Err(e),
                        Ok(Ok(a)) => a,
                    }
                }
            };
            // Our claim must still be there, on our session's lease (so
            // that lease is alive in etcd as of the read).
            if !ahead.is_mine(key, my_rev, session.id) {
                return Ok(Turn::Gone);
            }
            let Some(pred) = ahead.pred.as_ref() else {
                return Ok(Turn::Mine);
            };
            let waiting = async {
                if ahead.only {
                    queue::wait_last(sub, key, my_rev, session.id, &ahead).await
                } else {
                    // Also wait for the claim before it: when that one goes,
                    // ours is next in line and waits as such (above) while
                    // its predecessor holds, so the hand-off to ours needs no
                    // read.
                    let mut keys = vec![pred.key.as_str()];
                    keys.extend(ahead.pred2.as_ref().map(|c| c.key.as_str()));
                    queue::wait_ahead_deleted(sub, &keys, ahead.rev).await;
                    queue::LastEnd::Recheck
                }
            };
            let ended = tokio::select! {
                r = waiting => r,
                _ = sleep_until(deadline) => return Ok(Turn::TimedOut),
                _ = session.closed() => return Ok(Turn::Gone),
                _ = sleep(RECHECK) => queue::LastEnd::Recheck,
            };
            if ended == queue::LastEnd::Mine {
                return Ok(Turn::Mine);
            }
        }
    }
}

/// A release in flight: unless its deletes all answered that they deleted
/// nothing (a failure after such an answer included), the holding counts
/// as released by us (a delete that happened, or one whose answer never
/// came), so that a second release is `Ok`.
struct ReleaseAttempt<'a> {
    backend: &'a EtcdBackend,
    key: &'a str,
    rev: i64,
    may_have_deleted: bool,
    /// Set while the delete of a claim this client holds is on the wire:
    /// if the release is dropped then, a task finishes it (the delete
    /// again, which compares the create revision, then the session forgets
    /// the claim). Without it the session kept the claim and its name's
    /// slot until the claim's lease ran out, and this client's next
    /// acquisition of the name found it held while others found it free.
    finish_if_dropped: Option<(Arc<Session>, OwnerToken)>,
}

impl<'a> ReleaseAttempt<'a> {
    fn new(backend: &'a EtcdBackend, key: &'a str, rev: i64) -> Self {
        ReleaseAttempt {
            backend,
            key,
            rev,
            may_have_deleted: true,
            finish_if_dropped: None,
        }
    }
}

impl Drop for ReleaseAttempt<'_> {
    fn drop(&mut self) {
        if self.may_have_deleted {
            self.backend.released_log().record(self.key, self.rev);
        }
        let Some((session, owner)) = self.finish_if_dropped.take() else {
            return;
        };
        // Without a runtime the claim goes with its lease, as before.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, key, rev) = (self.backend.clone(), self.key.to_string(), self.rev);
        runtime.spawn(async move {
            // An error leaves the claim held: the session keeps it, and
            // reaps it with its lease, as for any release that failed.
            if queue::delete_own(backend.conn(), &key, rev).await.is_ok() {
                session.forget(&key, rev, owner);
            }
        });
    }
}

/// How waiting in the queue ended.
enum Turn {
    Mine,
    TimedOut,
    Gone,
}

async fn pause_until(pause: Duration, deadline: Instant) {
    sleep_until(deadline.min(Instant::now() + pause)).await;
}

fn tls_options(config: &EtcdConfig) -> Result<etcd_client::TlsOptions, LockError> {
    let mut tls = etcd_client::TlsOptions::new().with_native_roots();
    if let Some(path) = &config.ca {
        let pem = std::fs::read(path).map_err(|e| {
            LockError::Config(format!(
                "`{}`: cannot read the CA file {}: {e}",
                config.redacted_url(),
                path.display()
            ))
        })?;
        tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
    }
    Ok(tls)
}

/// A claim in etcd that must not outlive its attempt: if the attempt is
/// dropped (cancelled) or fails after sending the create, `Drop` hands its
/// deletion to the runtime, with the slot, so it leaves the queue.
struct Queued {
    conn: Conn,
    session: Arc<Session>,
    key: String,
    how: Cleanup,
    slot: Option<Slot>,
    armed: bool,
}

impl Queued {
    /// Deletes the claim now.
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, `Drop` deletes in the background.
    async fn delete(&mut self) -> Result<(), LockError> {
        crate::session::delete_claim(&self.conn, &self.key, &self.how).await?;
        self.armed = false;
        Ok(())
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if self.armed {
            spawn_cleanup(
                self.conn.clone(),
                Arc::clone(&self.session),
                std::mem::take(&mut self.key),
                self.how.clone(),
                self.slot.take(),
            );
        }
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    /// Creates the claim; if it is not the lowest, deletes it and answers
    /// `None`. Also `None` at once if another task of this client is using
    /// the name.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: a dropped attempt's claim is deleted in the
    /// background (or goes with the session lease).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        let Some(slot) = self.inner.slots.try_take(&req.name) else {
            return Ok(None);
        };
        // The session, the claim, the look at the queue and the claim's
        // removal when not first: one op_timeout for them all.
        let attempt = lock_core::call::within(
            self.inner.config.op_timeout(),
            self.attempt(req, slot, None),
        );
        self.inner.space.stamp(attempt.await)
    }

    /// Queues a claim and watches the deletion of the claim just before it
    /// until it is the lowest, or `req.wait` runs out (then the claim is
    /// deleted and the answer is `None`). Retryable failures (a leader
    /// election, a broken connection) are retried until the wait runs out.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped waiter's claim is deleted in the background,
    /// so it does not keep its place in the queue.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        if req.wait.is_zero() {
            return self.try_acquire(req).await;
        }
        let deadline = req.wait_deadline();
        let mut pacer = Pacer::new(req.backoff_or(ERROR_BACKOFF));
        let attempts = async {
            loop {
                let Ok(slot) = timeout_at(deadline, self.inner.slots.take(&req.name)).await else {
                    return Ok(None);
                };
                // A slot free at the deadline comes back all the same: no
                // attempt starts after the wait.
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                match self.attempt(req, slot, Some(deadline)).await {
                    // A failed attempt cleans up its claim in the background
                    // and holds the slot until then, so the retry waits for
                    // that.
                    Err(e) if e.is_retryable() && Instant::now() < deadline => {
                        tracing::debug!(name = %req.name, error = %e, "polylock: etcd acquire failed; retrying until the wait ends");
                        pacer.pause_until(deadline).await;
                    }
                    other => return other,
                }
            }
        };
        // The answer is owed by the wait plus one op_timeout: an attempt
        // that began just before the wait ended included.
        let limit = req.wait.saturating_add(self.inner.config.op_timeout());
        let won = lock_core::call::within(limit, attempts).await;
        self.inner.space.stamp(won)
    }

    /// Reports the session's latest answered keepalive after checking that
    /// the claim still exists with the same create revision on the same
    /// lease. Waits for a keepalive newer than the lease (nudging one) so
    /// that the watchdog always moves forward, for one `op_timeout` at most:
    /// without an answer by then, a retryable error (the lease still holds
    /// until its deadline). `Err(Lost)` if the claim or the session is gone
    /// or the deadline passed; never re-creates.
    ///
    /// # Cancel safety
    /// Cancel safe: read only, apart from a keepalive the session sends
    /// anyway.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.inner.space.check(lease)?;
        let lost = || LockError::Lost {
            name: lease.name().to_string(),
        };
        let Some(key) = lease.backend_key() else {
            return Err(lost());
        };
        let rev = i64::try_from(lease.fence().get()).unwrap_or(-1);
        let Some(session) = self.session_of_key(key) else {
            return Err(lost());
        };
        if !session.holds(key, lease.owner(), rev) {
            return Err(lost());
        }
        // A failed read ends the call at once, and a keepalive is waited
        // for one op_timeout at most: never until the lease's deadline.
        let (claim, fresh) = futures::future::try_join(
            queue::claim_of(self.conn(), key),
            session
                .keepalive_after(lease.sent_at(), self.keepalive_limit(lease.deadline()))
                .map(Ok),
        )
        .await?;
        match claim {
            Some(c) if c.create_rev == rev && c.lease == session.id => {}
            _ => {
                session.forget(key, rev, lease.owner());
                return Err(lost());
            }
        }
        let state = fresh.map_err(|()| self.unanswered(&session, lease))?;
        // An answer past the lease's deadline comes too late for it, as in
        // `renew_many`, also when the keepalive it reports is older.
        if Instant::now() > lease.deadline() {
            return Err(lost());
        }
        if !session.extend(key, rev, state.last_ok_sent + state.ttl) {
            return Err(lost());
        }
        Ok(lease.renewed(state.ttl, state.last_ok_sent))
    }

    /// [`renew`](LockBackend::renew) for many leases at once: the claim
    /// keys are read by one read-only transaction per 128 leases (etcd's
    /// default limit of operations per transaction), and each session the
    /// leases are on sends one keepalive for all of them (the locks of one
    /// client and TTL share one etcd lease). Each lease is then answered as
    /// `renew` would: its claim must exist with its create revision on its
    /// session's lease, else `Err(Lost)` for that lease alone; the renewed
    /// lease is dated from the send time of that keepalive.
    ///
    /// # Cancel safety
    /// Cancel safe: read only, apart from keepalives the sessions send
    /// anyway.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if self.inner.space.any_foreign(leases) {
            return lock_core::renew_each(self, leases).await;
        }
        let lost = |lease: &Lease| LockError::Lost {
            name: lease.name().to_string(),
        };
        // Each lease's key, revision and session, or its answer already.
        let mut out: Vec<Option<Result<Lease, LockError>>> = Vec::with_capacity(leases.len());
        let mut live: Vec<(usize, &str, i64, Arc<Session>)> = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            let rev = i64::try_from(lease.fence().get()).unwrap_or(-1);
            let found = lease.backend_key().and_then(|key| {
                let session = self.session_of_key(key)?;
                session
                    .holds(key, lease.owner(), rev)
                    .then_some((key, session))
            });
            match found {
                Some((key, session)) => {
                    live.push((i, key, rev, session));
                    out.push(None);
                }
                None => out.push(Some(Err(lost(lease)))),
            }
        }
        // One keepalive per session, sent after every lease on it was dated.
        let mut sessions: Vec<(Arc<Session>, Instant, Instant)> = Vec::new();
        for (i, _, _, session) in &live {
            let (sent, deadline) = (leases[*i].sent_at(), leases[*i].deadline());
            match sessions
                .iter_mut()
                .find(|(s, _, _)| Arc::ptr_eq(s, session))
            {
                Some((_, after, until)) => {
                    *after = (*after).max(sent);
                    *until = (*until).max(deadline);
                }
                None => sessions.push((Arc::clone(session), sent, deadline)),
            }
        }
        let keys: Vec<&str> = live.iter().map(|(_, k, _, _)| *k).collect();
        let (claims, fresh) = tokio::join!(
            queue::claims_of_many(self.conn(), &keys),
            futures::future::join_all(sessions.iter().map(|(s, after, until)| {
                s.keepalive_after(*after, self.keepalive_limit(*until))
            })),
        );
        let answered = Instant::now();
        for ((i, key, rev, session), claim) in live.into_iter().zip(claims) {
            let lease = &leases[i];
            let k = sessions
                .iter()
                .position(|(s, _, _)| Arc::ptr_eq(s, &session))
                .expect("every live lease's session is listed");
            out[i] = Some(match claim {
                Err(e) => Err(e),
                Ok(Some(c)) if c.create_rev == rev && c.lease == session.id => match fresh[k] {
                    // A keepalive answered past this lease's deadline comes
                    // too late for it, as in `renew`.
                    Ok(state) if answered <= lease.deadline() => {
                        if session.extend(key, rev, state.last_ok_sent + state.ttl) {
                            Ok(lease.renewed(state.ttl, state.last_ok_sent))
                        } else {
                            Err(lost(lease))
                        }
                    }
                    Ok(_) => Err(lost(lease)),
                    Err(()) => Err(self.unanswered(&session, lease)),
                },
                Ok(_) => {
                    session.forget(key, rev, lease.owner());
                    Err(lost(lease))
                }
            });
        }
        out.into_iter()
            .map(|r| r.expect("every lease is answered"))
            .collect()
    }

    /// Deletes the claim if it is still ours (same value and create
    /// revision; a plain delete when this client holds exactly this claim).
    /// Released through this client before: `Ok`. Otherwise, a claim that
    /// is gone or replaced says `Err(Lost)`: it was deleted by someone else
    /// (a force release) or with its session lease, and etcd keeps no record
    /// of who was granted the lock after it, so the critical section may
    /// not have been exclusive. Another holder's claim is never touched.
    ///
    /// A delete that fails with a retryable error (a connection broken
    /// under it) is sent again every 100 ms for up to a second, while the
    /// lease's deadline is ahead: a second delete that finds the claim gone after a first one
    /// whose answer was lost is `Ok` (see below), so asking again cannot
    /// report a loss that did not happen, and the lock is free at once
    /// instead of at the TTL.
    ///
    /// # Cancel safety
    /// Cancel safe: a release of a claim this client holds that is dropped
    /// while its delete is on the wire is finished by a task of its own
    /// (the delete again, then the claim forgotten), so this client can
    /// take the name again at once; a claim the release could not delete
    /// is deleted by the session when its TTL passes without a renew. A
    /// release dropped (or failed) after sending counts as released for a
    /// second release.
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        self.inner.space.check(lease)?;
        let op_timeout = self.inner.config.op_timeout();
        // Every request and retry of the release within one op_timeout.
        lock_core::call::within(op_timeout, async {
            let until = lease
                .deadline()
                .min(Instant::now() + RELEASE_RETRY)
                .min(lock_core::call::request_deadline(op_timeout));
            loop {
                match self.release_once(lease).await {
                    Err(e) if e.is_retryable() && Instant::now() + RETRY_PAUSE < until => {
                        tracing::debug!(error = %e, name = %lease.name(), "polylock etcd: release failed; trying again");
                        sleep(RETRY_PAUSE).await;
                    }
                    other => return other,
                }
            }
        })
        .await
    }

    /// The lowest claim: `owner` is its key (ending with the holder's lease
    /// id in hex), `fence` its create revision, `expires_in` the time to
    /// live of its lease, `meta` the description polylock stored in its
    /// value (none for a foreign holder).
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        let pfx = self.key_prefix(name);
        let Some(holder) = queue::holder(self.conn(), &pfx, Values::Fetch).await? else {
            return Ok(None);
        };
        // A lease gone since the read: nothing left to live.
        let expires_in = self
            .time_to_live(holder.lease)
            .await?
            .unwrap_or(Some(Duration::ZERO));
        Ok(Some(holder_info(holder, expires_in)))
    }

    /// One range read (in pages of keys, at one revision) over
    /// `{prefix}{name prefix}`, grouped by lock name; the holder of each is
    /// its lowest create revision, listed when polylock wrote its value
    /// (claims of `etcdctl lock` and Go's Mutex have an empty value, and
    /// other Go recipes share the layout). Then one time-to-live read per
    /// distinct session lease.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        let limit = lock_core::validate_list(prefix, limit)?;
        let holders =
            queue::holders_under(self.conn(), self.inner.config.prefix(), prefix, limit).await?;
        let mut leases: Vec<i64> = holders.iter().map(|(_, c)| c.lease).collect();
        leases.sort_unstable();
        leases.dedup();
        let ttls: std::collections::HashMap<i64, Option<Duration>> = futures::stream::iter(leases)
            .map(|id| async move { Ok::<_, LockError>((id, self.time_to_live(id).await?)) })
            .buffer_unordered(16)
            .try_filter_map(|(id, ttl)| async move { Ok(ttl.map(|t| (id, t))) })
            .try_collect()
            .await?;
        Ok(holders
            .into_iter()
            // A lease that ended since the read took its keys with it.
            .filter_map(|(name, claim)| {
                let ttl = *ttls.get(&claim.lease)?;
                Some((name, holder_info(claim, ttl)))
            })
            .collect())
    }

    /// The claim keys of the name (polylock's and foreign ones) but the
    /// holder's: the clients queued in etcd, one per client and name.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>, LockError> {
        let claims = queue::claim_count(self.conn(), &self.key_prefix(name)).await?;
        Ok(Some(claims.saturating_sub(1)))
    }

    /// Deletes the holder's claim (the lowest), whoever it is; the next in
    /// line then holds. `false` if nobody held.
    ///
    /// # Cancel safety
    /// Cancel safe: the claim is deleted or not.
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        let pfx = self.key_prefix(name);
        loop {
            let Some(holder) = queue::holder(self.conn(), &pfx, Values::Skip).await? else {
                return Ok(false);
            };
            let how = Cleanup::Revision(holder.create_rev);
            if crate::session::delete_claim(self.conn(), &holder.key, &how).await? {
                return Ok(true);
            }
            // The holder changed between the read and the delete: look again.
        }
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

/// What the etcd backend promises (the same for every client).
pub fn guarantees() -> Guarantees {
    let mut g = Guarantees::new(BACKEND);
    g.fencing = FencingGuarantee::Strict;
    g.fair_fifo = true;
    g.expiry_clock = ExpiryClock::Consensus;
    g.survives_restart = true;
    g.survives_failover = true;
    g.wait = WaitMechanism::Watch;
    g.min_ttl = MIN_TTL;
    g.ttl_granularity = Duration::from_secs(1);
    g.force_release = true;
    g.holder_meta = true;
    g.list = true;
    g.counts_waiters = true;
    g.batch_renew = true;
    g
}

/// What `inspect` and `list` say about a holder read with its value.
fn holder_info(claim: Claim, expires_in: Option<Duration>) -> HolderInfo {
    let fence = u64::try_from(claim.create_rev)
        .ok()
        .and_then(FencingToken::new);
    let meta = parse_owner_value(&claim.value).and_then(|(_, meta)| meta);
    HolderInfo::new(claim.key, fence, expires_in).with_meta(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        let g = guarantees();
        let ttl_secs = |ttl| g.granted_ttl(ttl, Duration::from_secs(1)).1;
        // Below the declared minimum: the minimum (etcd raised 1 s to it).
        assert_eq!(ttl_secs(Duration::from_millis(1)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(2)), 2);
        assert_eq!(ttl_secs(Duration::from_millis(2001)), 3);
        assert_eq!(
            g.effective_ttl(Duration::from_millis(300)),
            Duration::from_secs(2)
        );
        assert!(g.fair_fifo);
    }
}
