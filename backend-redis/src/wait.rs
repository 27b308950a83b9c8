//! Waking waiters: one pub/sub connection per client, shared by all of its
//! waiters and multiplexing their channels.
//!
//! Why one shared connection rather than one per waiter: a subscribed
//! connection can do nothing else, so per-waiter connections would cost the
//! server a client slot (`maxclients`) and the waiter a TCP connect, a
//! handshake and a SUBSCRIBE before its first wait — for every waiter of
//! every lock. Shared, a client holds at most one extra connection, a lock
//! that several local tasks wait for is subscribed once, and subscribing is
//! a single round trip (none when the channel is already subscribed).
//!
//! An actor task owns the connection: it subscribes and unsubscribes as
//! waiters come and go (counted per channel, reconciled in one place so that
//! a SUBSCRIBE and an UNSUBSCRIBE for one channel can never cross), and turns
//! each message into a [`Notify`] wake-up of that channel's waiters. When
//! the connection breaks it wakes every waiter (a message may have been
//! lost), reconnects with backoff and subscribes again. A waiter never
//! depends on a message: `acquire_loop`'s bounded backoff polls behind it.
//!
//! A waiter's [`Subscription`] is a guard: dropping it — also by cancelling
//! the wait — releases its interest, and the actor unsubscribes the channel
//! once nobody waits on it, so a cancelled waiter leaves no subscription
//! behind.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::Client;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::{sleep_until, Instant};

/// How often an idle subscribed connection is checked with a PING: a
/// connection that silently stopped delivering is found and replaced.
const HEALTH_CHECK: Duration = Duration::from_secs(5);
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The pub/sub side of one client (or, on a cluster, of one node). Clones
/// share the connection.
#[derive(Clone)]
pub(crate) struct Subscriber {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Servers to subscribe on, tried in turn (any node of a cluster sees
    /// every PUBLISH).
    clients: Vec<Client>,
    timeout: Duration,
}

#[derive(Default)]
struct State {
    /// Waiters per channel.
    channels: HashMap<String, Channel>,
    actor: Option<mpsc::UnboundedSender<Cmd>>,
    /// Whether a subscribed connection is up now; false from the moment it
    /// is lost until a new one has subscribed every channel again.
    connected: bool,
}

struct Channel {
    waiters: usize,
    notify: Arc<Notify>,
    grants: GrantSlot,
}

enum Cmd {
    /// Make the server's subscription of this channel match its waiters;
    /// answer when done (if anyone still asks).
    Sync(String, Option<oneshot::Sender<bool>>),
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Plain map updates only; a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wanted(&self, channel: &str) -> bool {
        self.state().channels.contains_key(channel)
    }

    fn all_wanted(&self) -> Vec<String> {
        self.state().channels.keys().cloned().collect()
    }

    fn wake(&self, channel: &str, grant: Option<u64>) {
        let notify = self.state().channels.get(channel).map(|c| {
            if let Some(fence) = grant {
                c.grants.put(fence);
            }
            c.notify.clone()
        });
        if let Some(n) = notify {
            n.notify_waiters();
        }
    }

    fn wake_all(&self) {
        let all: Vec<_> = self
            .state()
            .channels
            .values()
            .map(|c| c.notify.clone())
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }
}

/// The start of the message a fair-mode release sends to the waiter it
/// granted the lock to (`fair_queue.lua`), followed by the fencing token.
pub(crate) const GRANT_MESSAGE: &str = "granted:";

/// The fencing token of the last grant message on one channel (a fair-mode
/// waiter's own), until the waiter takes it.
#[derive(Clone, Default)]
pub(crate) struct GrantSlot(Arc<Mutex<Option<u64>>>);

impl GrantSlot {
    fn put(&self, fence: u64) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(fence);
    }

    /// The token of the grant message that came since the last take.
    pub(crate) fn take(&self) -> Option<u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// One waiter's interest in a channel. Dropping it gives the interest up.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    notify: Arc<Notify>,
    grants: GrantSlot,
}

impl Subscription {
    /// Where grant messages on this channel are kept for the waiter.
    pub(crate) fn messages(&self) -> GrantSlot {
        self.grants.clone()
    }

    /// A wake-up for the next message on the channel, registered now: a
    /// message that arrives after this call and before the future is first
    /// polled still wakes it.
    pub(crate) fn arm(&self) -> Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut n = Box::pin(self.notify.notified());
        n.as_mut().enable();
        n
    }

    /// [`arm`](Self::arm), owning what it waits on, so the subscription
    /// may be replaced while the wake-up is pending.
    pub(crate) fn arm_owned(&self) -> Pin<Box<tokio::sync::futures::OwnedNotified>> {
        let mut n = Box::pin(Arc::clone(&self.notify).notified_owned());
        n.as_mut().enable();
        n
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut st = self.shared.state();
        let last = match st.channels.get_mut(&self.channel) {
            Some(c) => {
                c.waiters -= 1;
                c.waiters == 0
            }
            None => false,
        };
        if last {
            st.channels.remove(&self.channel);
            if let Some(actor) = &st.actor {
                // The actor unsubscribes; if it is gone, so is the connection.
                let _ = actor.send(Cmd::Sync(std::mem::take(&mut self.channel), None));
            }
        }
    }
}

impl Subscriber {
    /// Whether the pub/sub connection is up with every channel subscribed
    /// (as far as this client knows: a connection that silently stopped is
    /// found by the next health check).
    pub(crate) fn is_connected(&self) -> bool {
        self.shared.state().connected
    }

    pub(crate) fn new(clients: Vec<Client>, timeout: Duration) -> Self {
        Subscriber {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                clients,
                timeout,
            }),
        }
    }

    /// Registers interest in `channel` and waits until the server confirmed
    /// the subscription, at most until `limit`. Returns the guard and
    /// whether the subscription is confirmed; unconfirmed, wake-ups may
    /// still come later (the actor keeps trying) and the caller should poll
    /// more eagerly meanwhile.
    ///
    /// Must run inside a tokio runtime (the actor is spawned on it).
    pub(crate) async fn subscribe(&self, channel: &str, limit: Instant) -> (Subscription, bool) {
        let (notify, grants, actor) = {
            let mut st = self.shared.state();
            let entry = st
                .channels
                .entry(channel.to_string())
                .or_insert_with(|| Channel {
                    waiters: 0,
                    notify: Arc::new(Notify::new()),
                    grants: GrantSlot::default(),
                });
            entry.waiters += 1;
            let notify = entry.notify.clone();
            let grants = entry.grants.clone();
            let alive = st.actor.as_ref().is_some_and(|a| !a.is_closed());
            if !alive {
                // First waiter of this client, or the runtime that ran the
                // previous actor is gone: start one here.
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(actor(Arc::downgrade(&self.shared), rx));
                st.actor = Some(tx);
            }
            (notify, grants, st.actor.clone())
        };
        // The guard exists before the first await, so a cancelled caller
        // gives its interest back.
        let sub = Subscription {
            shared: Arc::clone(&self.shared),
            channel: channel.to_string(),
            notify,
            grants,
        };
        let (tx, rx) = oneshot::channel();
        let sent = actor.is_some_and(|a| a.send(Cmd::Sync(channel.to_string(), Some(tx))).is_ok());
        let confirmed = sent && matches!(tokio::time::timeout_at(limit, rx).await, Ok(Ok(true)));
        (sub, confirmed)
    }
}

/// The connection the actor owns.
struct Live {
    sink: PubSubSink,
    stream: PubSubStream,
    /// What the server has (or may have) subscribed on this connection.
    subscribed: HashSet<String>,
}

async fn actor(shared: Weak<Shared>, mut rx: mpsc::UnboundedReceiver<Cmd>) {
    let mut live: Option<Live> = None;
    let mut next_server = 0usize;
    let mut reconnect_at: Option<Instant> = None;
    let mut backoff = RECONNECT_MIN;
    let mut health = tokio::time::interval(HEALTH_CHECK);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let has_live = live.is_some();
        tokio::select! {
            cmd = rx.recv() => {
                // `None`: the client was dropped; the connection goes with us.
                let Some(Cmd::Sync(channel, reply)) = cmd else { return };
                let Some(shared) = shared.upgrade() else { return };
                let ok = sync(&shared, &mut live, &mut next_server, &channel).await;
                if !ok {
                    lost(&shared, &mut live);
                    reconnect_at.get_or_insert_with(|| Instant::now() + backoff);
                }
                if let Some(reply) = reply {
                    let _ = reply.send(ok);
                }
            }
            msg = async { live.as_mut().expect("guarded").stream.next().await }, if has_live => {
                let Some(shared) = shared.upgrade() else { return };
                match msg {
                    Some(msg) => {
                        let grant = msg
                            .get_payload::<String>()
                            .ok()
                            .and_then(|p| p.strip_prefix(GRANT_MESSAGE)?.parse().ok());
                        shared.wake(msg.get_channel_name(), grant)
                    }
                    None => {
                        tracing::debug!("polylock redis: pub/sub connection closed");
                        lost(&shared, &mut live);
                        reconnect_at = Some(Instant::now() + backoff);
                    }
                }
            }
            _ = async { sleep_until(reconnect_at.expect("guarded")).await }, if reconnect_at.is_some() => {
                reconnect_at = None;
                let Some(shared) = shared.upgrade() else { return };
                let wanted = shared.all_wanted();
                if wanted.is_empty() || live.is_some() {
                    continue;
                }
                match open(&shared, &mut next_server).await {
                    Some(mut l) => {
                        let ok = subscribe_all(&shared, &mut l, wanted).await;
                        if ok {
                            live = Some(l);
                            shared.state().connected = true;
                            backoff = RECONNECT_MIN;
                            // A release may have happened while we were away.
                            shared.wake_all();
                        } else {
                            reconnect_at = Some(Instant::now() + backoff);
                            backoff = (backoff * 2).min(RECONNECT_MAX);
                        }
                    }
                    None => {
                        reconnect_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(RECONNECT_MAX);
                    }
                }
            }
            _ = health.tick(), if has_live => {
                let Some(shared) = shared.upgrade() else { return };
                let l = live.as_mut().expect("guarded");
                if l.subscribed.is_empty() {
                    continue;
                }
                let ping = tokio::time::timeout(shared.timeout, l.sink.ping::<redis::Value>()).await;
                if !matches!(ping, Ok(Ok(_))) {
                    tracing::debug!("polylock redis: pub/sub connection stopped answering");
                    lost(&shared, &mut live);
                    reconnect_at = Some(Instant::now() + backoff);
                }
            }
        }
    }
}

/// Forgets a broken connection and wakes every waiter, since a release
/// published while it was failing may never arrive.
fn lost(shared: &Shared, live: &mut Option<Live>) {
    *live = None;
    shared.state().connected = false;
    shared.wake_all();
}

/// Brings the server's subscription of `channel` in line with its waiters.
/// Returns false when the connection failed.
async fn sync(
    shared: &Shared,
    live: &mut Option<Live>,
    next_server: &mut usize,
    channel: &str,
) -> bool {
    let wanted = shared.wanted(channel);
    let Some(l) = live.as_mut() else {
        if !wanted {
            return true;
        }
        // A new connection subscribes every channel that has waiters, not
        // only this one: the others may have lost theirs with the old one.
        let Some(mut l) = open(shared, next_server).await else {
            return false;
        };
        let ok = subscribe_all(shared, &mut l, shared.all_wanted()).await;
        if ok {
            *live = Some(l);
            shared.state().connected = true;
            shared.wake_all();
        }
        return ok;
    };
    let have = l.subscribed.contains(channel);
    let result = if wanted && !have {
        // Recorded before the command is sent: should it fail halfway, the
        // connection is dropped anyway, and nothing can stay subscribed
        // unbeknownst to us.
        l.subscribed.insert(channel.to_string());
        tokio::time::timeout(shared.timeout, l.sink.subscribe(channel)).await
    } else if !wanted && have {
        l.subscribed.remove(channel);
        tokio::time::timeout(shared.timeout, l.sink.unsubscribe(channel)).await
    } else {
        return true;
    };
    matches!(result, Ok(Ok(())))
}

async fn subscribe_all(shared: &Shared, l: &mut Live, channels: Vec<String>) -> bool {
    l.subscribed.extend(channels.iter().cloned());
    let r = tokio::time::timeout(shared.timeout, l.sink.subscribe(&channels)).await;
    matches!(r, Ok(Ok(())))
}

/// Opens a pub/sub connection to the next server that answers.
async fn open(shared: &Shared, next_server: &mut usize) -> Option<Live> {
    for _ in 0..shared.clients.len() {
        let client = &shared.clients[*next_server % shared.clients.len()];
        *next_server += 1;
        match tokio::time::timeout(shared.timeout, client.get_async_pubsub()).await {
            Ok(Ok(p)) => {
                let (sink, stream) = p.split();
                return Some(Live {
                    sink,
                    stream,
                    subscribed: HashSet::new(),
                });
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "polylock redis: pub/sub connect failed"),
            Err(_) => tracing::debug!("polylock redis: pub/sub connect timed out"),
        }
    }
    None
}

/// How a waiter learns that a lock held by a foreign client was released.
/// polylock's own releases always publish a message; foreign `plain`-format
/// clients (redis-py, redsync, node-redlock, `SET NX PX` scripts) publish
/// nothing, and Redisson publishes its unlock message on the channel
/// polylock's `redisson` format listens to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForeignWake {
    /// The server (on a cluster: every master) sends keyspace
    /// notifications for generic commands (`notify-keyspace-events`
    /// contains `K` and `g` or `A`): waiters also subscribe to the lock
    /// key's `__keyspace@DB__:KEY` channel — on a cluster on the node that
    /// owns the key's slot, followed when the slot moves, polling while the
    /// owner is unsure — so a foreign `DEL` (and, with `x`, an expiry)
    /// wakes them at once.
    KeyspaceEvents,
    /// No keyspace notifications (on a cluster: not on every master):
    /// waiters find a foreign release by polling with jittered backoff
    /// (10–100 ms) and wake at the holder's remaining TTL.
    Polling,
    /// `redisson` format: foreign Redisson clients publish their unlock
    /// message on the lock's channel, which wakes waiters at once.
    RedissonMessage,
}

impl ForeignWake {
    /// Decides the mode for a freshly connected client: the server's
    /// `notify-keyspace-events`, or on a cluster every master's (events stay
    /// on the node that owns the key, so one master without them means
    /// polling for its keys). `CONFIG GET` may be refused (managed services
    /// rename or forbid it): then polling.
    pub(crate) async fn detect(
        cfg: &crate::config::RedisConfig,
        link: &crate::conn::Link,
        nodes: Option<&crate::nodes::Nodes>,
    ) -> Self {
        if cfg.format() == crate::config::Format::Redisson {
            return ForeignWake::RedissonMessage;
        }
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("notify-keyspace-events");
        let flags = |v: &HashMap<String, String>| {
            Self::from_flags(v.get("notify-keyspace-events").map_or("", |s| s.as_str()))
        };
        let Some(nodes) = nodes else {
            return match link
                .command::<HashMap<String, String>>(&cmd, Duration::ZERO)
                .await
            {
                Ok(v) => flags(&v),
                Err(_) => ForeignWake::Polling,
            };
        };
        let Ok(members) = nodes.members(link).await else {
            return ForeignWake::Polling;
        };
        let masters: Vec<_> = members.iter().filter(|m| m.master).collect();
        if masters.is_empty() {
            return ForeignWake::Polling;
        }
        for m in masters {
            let Ok(node) = nodes.node(&m.addr) else {
                return ForeignWake::Polling;
            };
            match node.command::<HashMap<String, String>>(&cmd).await {
                Ok(v) if flags(&v) == ForeignWake::KeyspaceEvents => {}
                _ => return ForeignWake::Polling,
            }
        }
        ForeignWake::KeyspaceEvents
    }

    /// The mode for a `notify-keyspace-events` value.
    pub(crate) fn from_flags(flags: &str) -> Self {
        if flags.contains('K') && (flags.contains('g') || flags.contains('A')) {
            ForeignWake::KeyspaceEvents
        } else {
            ForeignWake::Polling
        }
    }

    /// One sentence for logs and `polylock status`.
    pub fn describe(self) -> &'static str {
        match self {
            ForeignWake::KeyspaceEvents => {
                "waiters wake on the key's keyspace notifications (del/expired) when a foreign client releases"
            }
            ForeignWake::Polling => {
                "no keyspace notifications (on every master, for a cluster), so waiters find a foreign client's release by polling (10-100 ms) or at its TTL"
            }
            ForeignWake::RedissonMessage => {
                "waiters wake on Redisson's unlock message when a foreign Redisson client releases"
            }
        }
    }
}

impl std::fmt::Display for ForeignWake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ForeignWake::KeyspaceEvents => "keyspace-events",
            ForeignWake::Polling => "polling",
            ForeignWake::RedissonMessage => "redisson-message",
        })
    }
}

/// How often a waiter polls while it cannot be sure a foreign release
/// reaches it (the slot's owner is being looked for), at random in this
/// range so waiters do not poll in step.
const UNSURE_POLL_MS: std::ops::RangeInclusive<u64> = 10..=100;

/// A wake-up future for `acquire_loop`: the next message on any of the
/// waiter's channels (and, on a cluster, on the key's keyspace channel at
/// the slot owner, or a change of the follower's mind), or the moment the
/// current holder's lease runs out on the server (`expiry`, learned from
/// the failed attempt), whichever comes first; while the follower is not
/// sure events reach the waiter, also a short jittered poll. An expiring
/// lease publishes nothing, so without the expiry a waiter would find out
/// only at its next fallback poll.
pub(crate) fn wake_up<'a>(
    subs: &'a [Subscription],
    follower: Option<&'a crate::nodes::Follower>,
    expiry: &'a Mutex<Option<Instant>>,
) -> impl Future<Output = ()> + Send + 'a {
    // Registered now, before the attempt it guards.
    let mut messages: Vec<Pin<Box<dyn Future<Output = ()> + Send + 'a>>> = subs
        .iter()
        .map(|s| Box::pin(s.arm()) as Pin<Box<dyn Future<Output = ()> + Send + 'a>>)
        .collect();
    let mut poll = None;
    if let Some(f) = follower {
        let armed = f.arm();
        messages.push(Box::pin(armed.changed));
        if let Some(k) = armed.keyspace {
            messages.push(Box::pin(k));
        }
        if !armed.sure {
            let ms = rand::Rng::random_range(&mut rand::rng(), UNSURE_POLL_MS);
            poll = Some(Instant::now() + Duration::from_millis(ms));
        }
    }
    async move {
        let message = futures::future::select_all(messages);
        // Read after the attempt, which recorded when the holder expires.
        let at = *expiry.lock().unwrap_or_else(|p| p.into_inner());
        match [at, poll].into_iter().flatten().min() {
            Some(at) => {
                tokio::select! {
                    _ = message => {}
                    _ = sleep_until(at) => {}
                }
            }
            None => {
                message.await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ForeignWake;

    #[test]
    fn keyspace_flags() {
        assert_eq!(ForeignWake::from_flags(""), ForeignWake::Polling);
        assert_eq!(ForeignWake::from_flags("Ex"), ForeignWake::Polling);
        assert_eq!(ForeignWake::from_flags("Kg"), ForeignWake::KeyspaceEvents);
        assert_eq!(ForeignWake::from_flags("KA"), ForeignWake::KeyspaceEvents);
        assert_eq!(ForeignWake::from_flags("AK"), ForeignWake::KeyspaceEvents);
        assert_eq!(ForeignWake::from_flags("Kx"), ForeignWake::Polling);
    }
}
