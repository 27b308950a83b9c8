//! Direct connections to single nodes of a Redis Cluster, beside the
//! routed cluster connection, for what only one node can answer:
//! keyspace notifications are published on the node that owns the key's
//! slot only (so a waiter subscribes there, [`Follower`]), and `SCAN`,
//! `PUBSUB NUMSUB` and `CONFIG GET` speak for the node they are sent to.
//!
//! A node's connections are made on first use and kept; one that timed out
//! or broke is replaced by the next command.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::Rng;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, ErrorKind, FromRedisValue, ServerErrorKind};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use crate::config::{Node, RedisConfig};
use crate::conn::{client_for, Link};
use crate::errors::Fail;
use crate::wait::{Subscriber, Subscription};

/// How often a waiter checks that the node it listens on still owns the
/// key's slot. Between two checks a slot move goes unnoticed, which costs
/// a foreign release at most the fallback poll (500 ms), never the wait.
const RECHECK: Duration = Duration::from_secs(1);

/// How long to pause between tries while the owner is unknown (the waiter
/// polls meanwhile).
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_millis(200);

/// MOVED redirections followed before giving up on one starting node.
const MAX_HOPS: usize = 4;

/// The nodes of one cluster client, by `host:port`.
#[derive(Clone)]
pub(crate) struct Nodes {
    shared: Arc<Shared>,
}

struct Shared {
    cfg: RedisConfig,
    map: Mutex<HashMap<String, Arc<NodeLink>>>,
}

/// One node: a command connection and a pub/sub connection.
pub(crate) struct NodeLink {
    pub(crate) addr: String,
    client: Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    pub(crate) subscriber: Subscriber,
    timeout: Duration,
}

/// A member of the cluster as `CLUSTER NODES` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) addr: String,
    pub(crate) master: bool,
}

impl Nodes {
    pub(crate) fn new(cfg: &RedisConfig) -> Self {
        Nodes {
            shared: Arc::new(Shared {
                cfg: cfg.clone(),
                map: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<NodeLink>>> {
        // Inserts and lookups only: a poisoned map is still consistent.
        self.shared.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node at `addr` (`host:port`), connecting lazily.
    pub(crate) fn node(&self, addr: &str) -> Result<Arc<NodeLink>, Fail> {
        if let Some(n) = self.map().get(addr) {
            return Ok(Arc::clone(n));
        }
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse().ok()?)))
            .ok_or_else(|| {
                Fail::Redis(redis::RedisError::from((
                    ErrorKind::Client,
                    "a cluster node address without a port",
                    addr.to_string(),
                )))
            })?;
        let node = Node {
            host: host.to_string(),
            port,
        };
        let client = client_for(&self.shared.cfg, &node)?;
        let timeout = self.shared.cfg.timeout;
        let link = Arc::new(NodeLink {
            addr: addr.to_string(),
            subscriber: Subscriber::new(vec![client.clone()], timeout),
            client,
            conn: Mutex::new(None),
            timeout,
        });
        Ok(Arc::clone(
            self.map().entry(addr.to_string()).or_insert(link),
        ))
    }

    /// The seed nodes of the URL, as `host:port`.
    fn seeds(&self) -> Vec<String> {
        self.shared
            .cfg
            .nodes
            .iter()
            .map(|n| format!("{}:{}", n.host, n.port))
            .collect()
    }

    /// Every member the cluster lists (`CLUSTER NODES`, asked through the
    /// routed connection), without those marked failed or without an
    /// address.
    pub(crate) async fn members(&self, link: &Link) -> Result<Vec<Member>, Fail> {
        let text: String = link
            .command(redis::cmd("CLUSTER").arg("NODES"), Duration::ZERO)
            .await?;
        Ok(parse_members(&text))
    }

    /// The node that owns `key`'s slot, by asking nodes directly (`hint`
    /// first, then the seeds) and following `MOVED`: the answer comes from
    /// the owner itself. An error while unsure: a slot being migrated
    /// (`ASK`), a node that does not answer, a cluster that is down.
    pub(crate) async fn owner_of(&self, key: &str, hint: Option<&str>) -> Result<String, Fail> {
        let mut starts: Vec<String> = hint.map(str::to_string).into_iter().collect();
        starts.extend(self.seeds());
        let mut last = None;
        for start in starts {
            let mut addr = start;
            for _ in 0..MAX_HOPS {
                let node = self.node(&addr)?;
                match node.command::<i64>(redis::cmd("EXISTS").arg(key)).await {
                    Ok(_) => return Ok(addr),
                    Err(Fail::Redis(e))
                        if e.kind() == ErrorKind::Server(ServerErrorKind::Moved) =>
                    {
                        let Some((to, _slot)) = e.redirect_node() else {
                            last = Some(Fail::Redis(e));
                            break;
                        };
                        // A node that does not know its own address
                        // announces `:port`: the host is the one we asked.
                        addr = match to.strip_prefix(':') {
                            Some(port) => {
                                format!("{}:{port}", addr.rsplit_once(':').map_or("", |(h, _)| h))
                            }
                            None => to.to_string(),
                        };
                    }
                    Err(f) => {
                        last = Some(f);
                        break;
                    }
                }
            }
        }
        // `starts` holds at least the URL's seeds, so some attempt failed.
        Err(last.unwrap_or(Fail::Timeout(self.shared.cfg.timeout)))
    }
}

impl NodeLink {
    /// Runs `cmd` on this node alone, within the command timeout.
    pub(crate) async fn command<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Fail> {
        let existing = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut conn = match existing {
            Some(c) => c,
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout));
                let c = match tokio::time::timeout(
                    self.timeout * 2,
                    self.client
                        .get_multiplexed_async_connection_with_config(&config),
                )
                .await
                {
                    Ok(r) => r?,
                    Err(_) => return Err(Fail::Timeout(self.timeout * 2)),
                };
                *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
                c
            }
        };
        let r = match tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => Fail::Redis(e),
            Err(_) => Fail::Timeout(self.timeout),
        };
        // A reply that may still be owed, or a broken socket: the next
        // command starts a fresh connection.
        let broken = match &r {
            Fail::Redis(e) => e.is_io_error() || e.is_connection_dropped() || e.is_timeout(),
            Fail::Timeout(_) => true,
        };
        if broken {
            *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        Err(r)
    }
}

/// The members in `CLUSTER NODES` output: `id host:port@bus[,hostname]
/// flags master-id ...`, one a line.
fn parse_members(text: &str) -> Vec<Member> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let _id = f.next()?;
            let addr = f.next()?.split(['@', ',']).next()?;
            let flags = f.next()?;
            let unusable = flags
                .split(',')
                .any(|x| matches!(x, "fail" | "noaddr" | "handshake"));
            if unusable || addr.starts_with(':') || addr.is_empty() {
                return None;
            }
            Some(Member {
                addr: addr.to_string(),
                master: flags.split(',').any(|x| x == "master"),
            })
        })
        .collect()
}

/// Keeps a subscription to one key's keyspace channel on the node that owns
/// the key's slot, for one waiter: a background task finds the owner,
/// subscribes there, confirms the owner again, and re-checks every
/// [`RECHECK`]; when the slot moved (`MOVED`, a failover), the node stops
/// answering or its pub/sub connection drops, it says so (the waiter then
/// polls) and subscribes on the new owner. Dropping it stops the task and
/// gives the subscription up.
pub(crate) struct Follower {
    state: Arc<FollowState>,
    task: JoinHandle<()>,
}

struct FollowState {
    now: Mutex<Followed>,
    /// Woken when the follower becomes sure or unsure, so the waiter tries
    /// again (a release may have gone unseen) and re-arms accordingly.
    changed: Arc<Notify>,
}

#[derive(Default)]
struct Followed {
    /// The node believed to own the slot, and the subscription there.
    on: Option<(Arc<NodeLink>, Subscription)>,
    /// Whether the owner was confirmed after subscribing, and has been
    /// since.
    sure: bool,
}

/// What a waiter arms before an attempt.
pub(crate) struct Armed {
    /// The key's next keyspace event on the owner's node, if subscribed.
    pub(crate) keyspace: Option<std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>>,
    /// The follower's next change of mind.
    pub(crate) changed: std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>,
    /// Whether keyspace events of the key reach this waiter now; if not, it
    /// must poll.
    pub(crate) sure: bool,
}

impl FollowState {
    fn now(&self) -> MutexGuard<'_, Followed> {
        // Replaced wholesale only: a poisoned value is still consistent.
        self.now.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unsure(&self) {
        let mut f = self.now();
        // The old subscription stays until a new one is confirmed: its
        // events may still come, and a waiter that is not sure polls anyway.
        let was = f.sure;
        f.sure = false;
        drop(f);
        if was {
            self.changed.notify_waiters();
        }
    }
}

impl Follower {
    /// Starts following `key`'s slot, subscribing to `channel` (the key's
    /// keyspace channel) on its owner. Must run inside a tokio runtime.
    pub(crate) fn start(nodes: Nodes, key: String, channel: String) -> Follower {
        let state = Arc::new(FollowState {
            now: Mutex::new(Followed::default()),
            changed: Arc::new(Notify::new()),
        });
        let task = tokio::spawn(follow(nodes, key, channel, Arc::clone(&state)));
        Follower { state, task }
    }

    /// The wake-ups for the next attempt, registered now.
    pub(crate) fn arm(&self) -> Armed {
        let mut changed = Box::pin(Arc::clone(&self.state.changed).notified_owned());
        changed.as_mut().enable();
        let f = self.state.now();
        let (keyspace, live) = match &f.on {
            Some((node, sub)) => (Some(sub.arm_owned()), node.subscriber.is_connected()),
            None => (None, false),
        };
        Armed {
            keyspace,
            changed,
            sure: f.sure && live,
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn follow(nodes: Nodes, key: String, channel: String, state: Arc<FollowState>) {
    let mut hint: Option<String> = None;
    loop {
        let sure = match nodes.owner_of(&key, hint.as_deref()).await {
            Ok(addr) => {
                hint = Some(addr.clone());
                let holds = {
                    let f = state.now();
                    f.sure
                        && f.on
                            .as_ref()
                            .is_some_and(|(n, _)| n.addr == addr && n.subscriber.is_connected())
                };
                holds || subscribe_on(&nodes, &key, &channel, &addr, &state).await
            }
            Err(e) => {
                // Through the one place that scrubs the password from a
                // driver's text.
                let e = crate::errors::to_lock_error(
                    &nodes.shared.cfg,
                    "finding the owner of the key's slot",
                    e,
                );
                tracing::debug!(key = %key, error = %e, "polylock redis: the owner of the key's slot is unsure; polling");
                state.unsure();
                false
            }
        };
        let pause = if sure {
            RECHECK
        } else {
            let ms = rand::rng().random_range(RETRY_MIN.as_millis()..=RETRY_MAX.as_millis());
            Duration::from_millis(ms as u64)
        };
        sleep(pause).await;
    }
}

/// Subscribes on `addr` and confirms afterwards that it still owns the
/// slot: only then can no event of the key be missed from here on.
async fn subscribe_on(
    nodes: &Nodes,
    key: &str,
    channel: &str,
    addr: &str,
    state: &FollowState,
) -> bool {
    state.unsure();
    let Ok(node) = nodes.node(addr) else {
        return false;
    };
    let (sub, confirmed) = node
        .subscriber
        .subscribe(channel, Instant::now() + node.timeout)
        .await;
    if !confirmed {
        return false;
    }
    if nodes.owner_of(key, Some(addr)).await.ok().as_deref() != Some(addr) {
        return false;
    }
    let mut f = state.now();
    f.on = Some((node, sub));
    f.sure = true;
    drop(f);
    tracing::debug!(key = %key, node = %addr, "polylock redis: waiting on the keyspace events of the slot's owner");
    state.changed.notify_waiters();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines() {
        let text = "\
07c3 127.0.0.1:30004@31004,host-a slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460
6ec2 127.0.0.1:30005@31005 master,fail - 1426238316232 0 5 disconnected
ab12 :0@0 master,noaddr - 0 0 6 disconnected
";
        assert_eq!(
            parse_members(text),
            vec![
                Member {
                    addr: "127.0.0.1:30004".into(),
                    master: false
                },
                Member {
                    addr: "127.0.0.1:30002".into(),
                    master: true
                },
                Member {
                    addr: "127.0.0.1:30001".into(),
                    master: true
                },
            ]
        );
    }
}
