//! ZooKeeper sessions: one per lease length, watched for expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use lock_core::LockError;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, SessionState};

use crate::config::ZkConfig;
use crate::errors::{from_zk, timed, BACKEND};

/// One ZooKeeper session and the signal that it ended.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) client: Client,
    /// Cancelled when the session expires, is closed or fails its
    /// authentication: every lease of the session carries it.
    pub(crate) ended: CancellationToken,
}

impl Session {
    /// The session timeout the server negotiated: the TTL of its leases.
    pub(crate) fn timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    /// The session id, as ZooKeeper stores it in `ephemeralOwner`.
    pub(crate) fn id(&self) -> i64 {
        self.client.session_id().0
    }

    pub(crate) fn is_live(&self) -> bool {
        !self.ended.is_cancelled() && !self.client.state().is_terminated()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Stops the state watcher task, which would otherwise wait forever
        // on a client that no longer exists.
        self.ended.cancel();
    }
}

/// The sessions of one client, keyed by the timeout asked for in ms.
///
/// A session nobody uses (no lease, no waiter, no request: only this map
/// holds it) for the client's `idle_timeout` is closed, so a process that
/// asked for many TTLs over its life does not keep a session per TTL open
/// on the ensemble forever. The next lock of that TTL opens a new one.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    by_timeout: Arc<Mutex<HashMap<u64, Slot>>>,
    /// One connect at a time, so concurrent first locks share a session.
    connecting: tokio::sync::Mutex<()>,
    reaper: OnceLock<()>,
    /// What the membership check found (`ZkConfig::check_membership`):
    /// `None` fine, `Some(why)` every call is refused.
    membership: OnceLock<Option<String>>,
}

#[derive(Debug)]
struct Slot {
    session: Arc<Session>,
    /// Since when the reaper has seen nobody but the map hold the session.
    idle_since: Option<Instant>,
}

impl Sessions {
    /// The live session for `timeout`, connecting a new one when there is
    /// none or the last one ended (a new session serves later locks).
    ///
    /// # Cancel safety
    /// Cancel safe: a session connected by a dropped call is kept for the
    /// next one (until it has been idle for `idle_timeout`).
    pub(crate) async fn get(
        &self,
        config: &ZkConfig,
        timeout: Duration,
    ) -> Result<Arc<Session>, LockError> {
        let key = timeout.as_millis() as u64;
        if let Some(s) = self.live(key) {
            return Ok(s);
        }
        // Boxed: connecting is rare and its future is kilobytes, which
        // would otherwise be part of every acquire's and release's future
        // (allocated and copied on each call through the trait).
        Box::pin(self.connect(config, timeout, key)).await
    }

    /// The slow path of [`get`](Self::get): one caller at a time connects.
    async fn connect(
        &self,
        config: &ZkConfig,
        timeout: Duration,
        key: u64,
    ) -> Result<Arc<Session>, LockError> {
        // The whole call answers within one op_timeout (the LockBackend
        // contract), the wait for another caller's connect included; the
        // next call tries again. Not the session timeout, which a long TTL
        // makes minutes long while the servers are unreachable.
        let started = Instant::now();
        let limit = config.op_timeout;
        let _one = tokio::time::timeout(limit, self.connecting.lock())
            .await
            .map_err(|_| {
                LockError::transient(BACKEND, format!("connect: no answer within {limit:?}"))
            })?;
        if let Some(s) = self.live(key) {
            return Ok(s);
        }
        if let Some(Some(why)) = self.membership.get() {
            return Err(LockError::Config(why.clone()));
        }
        let servers = config.connect_string();
        let mut connector = Client::connector().with_session_timeout(timeout);
        if let Some(d) = &config.auth {
            // Sent with the session's first requests, and again after
            // every reconnect by the driver.
            connector = connector.with_auth("digest", &d.auth_data());
        }
        let connect = connector.connect(&servers);
        let client = timed("connect", limit.saturating_sub(started.elapsed()), connect)
            .await?
            .map_err(|e| from_zk(&format!("connecting to {}", config.redacted_url()), e))?;
        if config.check_membership && self.membership.get().is_none() {
            let left = limit.saturating_sub(started.elapsed());
            let found = membership(config, &client, left).await?;
            if let Some(why) = self.membership.get_or_init(|| found) {
                // Dropping the client closes the session it opened.
                return Err(LockError::Config(why.clone()));
            }
        }
        let session = Arc::new(Session {
            ended: CancellationToken::new(),
            client,
        });
        watch_state(&session);
        self.slots().insert(
            key,
            Slot {
                session: session.clone(),
                idle_since: None,
            },
        );
        self.reaper
            .get_or_init(|| spawn_reaper(Arc::downgrade(&self.by_timeout), config.idle_timeout));
        Ok(session)
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Slot>> {
        self.by_timeout.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self, key: u64) -> Option<Arc<Session>> {
        let mut map = self.slots();
        match map.get_mut(&key) {
            Some(slot) if slot.session.is_live() => {
                slot.idle_since = None;
                Some(slot.session.clone())
            }
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }
}

/// Reads the server's membership (`/zookeeper/config`, empty on a
/// standalone server): `Some(why)` when the one server the URL names
/// belongs to an ensemble of several, whose members answer reads on their
/// own while the URL set no `follower_lag`. A server that does not let the
/// node be read is taken as it is (with a warning): nothing tells.
async fn membership(
    config: &ZkConfig,
    client: &Client,
    limit: Duration,
) -> Result<Option<String>, LockError> {
    let data = match timed("reading /zookeeper/config", limit, client.get_config()).await? {
        Ok((data, _)) => data,
        Err(e @ (zookeeper_client::Error::NoAuth | zookeeper_client::Error::NoNode)) => {
            tracing::warn!(
                backend = BACKEND,
                error = %e,
                "cannot read /zookeeper/config to tell a standalone server from an ensemble \
                 member; set follower_lag if it is a member"
            );
            return Ok(None);
        }
        Err(e) => return Err(from_zk("reading /zookeeper/config", e)),
    };
    let members = String::from_utf8_lossy(&data)
        .lines()
        .filter(|l| l.trim_start().starts_with("server."))
        .count();
    if members < 2 {
        return Ok(None);
    }
    Ok(Some(format!(
        "`{}` names one server, but it is a member of a {members}-server ZooKeeper ensemble, \
         whose followers answer renewals on their own while cut off from their leader: set \
         follower_lag to (syncLimit + 1) x tickTime of its zoo.cfg (12s for ZooKeeper's \
         sample configuration), or follower_lag=0 to accept that risk",
        config.redacted_url()
    )))
}

/// Closes the sessions of `slots` that nobody but the map has held for
/// `idle`, checking a few times per `idle` (so a session goes between
/// `idle` and `idle * 1.25` after its last use). Ends with the client.
fn spawn_reaper(slots: Weak<Mutex<HashMap<u64, Slot>>>, idle: Duration) {
    let period = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            let Some(slots) = slots.upgrade() else { return };
            let now = Instant::now();
            let mut closed = Vec::new();
            {
                let mut map = slots.lock().unwrap_or_else(|p| p.into_inner());
                map.retain(|_, slot| {
                    // The map holds a count under its lock, so a `get` cannot
                    // hand the session out between this check and removal.
                    if Arc::strong_count(&slot.session) > 1 {
                        slot.idle_since = None;
                        return true;
                    }
                    let since = *slot.idle_since.get_or_insert(now);
                    if now.duration_since(since) < idle && slot.session.is_live() {
                        return true;
                    }
                    closed.push(slot.session.clone());
                    false
                });
            }
            for s in closed {
                tracing::debug!(
                    backend = BACKEND,
                    session = s.id(),
                    "closing an idle ZooKeeper session"
                );
                // Dropping the last handle closes the session on the server.
                drop(s);
            }
        }
    });
}

/// Cancels `session.ended` when the session reaches a terminal state.
/// Disconnected is not terminal: the leases then end at their local
/// deadlines unless the session reconnects and renews them in time.
fn watch_state(session: &Arc<Session>) {
    let mut states = session.client.state_watcher();
    let ended = session.ended.clone();
    let weak = Arc::downgrade(session);
    tokio::spawn(async move {
        let mut state = states.state();
        loop {
            if state.is_terminated() {
                tracing::warn!(backend = BACKEND, ?state, "ZooKeeper session ended");
                ended.cancel();
                return;
            }
            if state == SessionState::Disconnected {
                tracing::debug!(backend = BACKEND, "ZooKeeper session disconnected");
            }
            tokio::select! {
                s = states.changed() => state = s,
                _ = ended.cancelled() => return,
            }
            if weak.strong_count() == 0 {
                return;
            }
        }
    });
}
