//! Redis: a spawned `redis-server` per wire format and for the fair mode, a
//! spawned three-master Redis Cluster (both formats, and the fair mode), and
//! five independent servers for Redlock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backend_redis::{Algorithm, RedisBackend, RedisConfig, RedlockBackend};
use lock_core::{Guarantees, LockBackend, LockError};
use testkit::{RedisCluster, RedisServer};

use super::Registration;
use crate::fixture::{Fixture, Link};

/// Clients are new [`RedisBackend`]s (their own connections) to `url`.
/// `remove_behind_back` is the default: `force_release` from another client,
/// a `DEL` of the lock key.
struct RedisFixture {
    url: String,
    /// Kept alive (and killed on drop) with the fixture.
    servers: Vec<RedisServer>,
    /// Cluster clients learn node addresses from the cluster and would
    /// bypass a proxy.
    cluster: bool,
}

#[async_trait]
impl Fixture for RedisFixture {
    fn guarantees(&self) -> Guarantees {
        RedisConfig::parse(&self.url).map_or_else(
            |_| backend_redis::guarantees(Algorithm::SingleInstance),
            |c| backend_redis::guarantees_for(&c),
        )
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(RedisBackend::connect(&self.url).await?))
    }

    async fn client_through_proxy(
        &self,
        op_timeout: Duration,
    ) -> Result<Option<(Arc<dyn LockBackend>, Link)>, LockError> {
        let (false, [server]) = (self.cluster, self.servers.as_slice()) else {
            return Ok(None);
        };
        let link = Link::to(&[server.addr()])?;
        let url = link.url(&self.url, "op_timeout", op_timeout);
        Ok(Some((Arc::new(RedisBackend::connect(&url).await?), link)))
    }
}

fn single(query: &str) -> Result<Arc<dyn Fixture>, String> {
    let server = RedisServer::start().map_err(|e| e.to_string())?;
    Ok(Arc::new(RedisFixture {
        url: format!("{}/0{query}", server.url()),
        servers: vec![server],
        cluster: false,
    }))
}

fn cluster(query: &str, keyspace_events: bool) -> Result<Arc<dyn Fixture>, String> {
    let cluster = RedisCluster::start(3).map_err(|e| e.to_string())?;
    if keyspace_events {
        // Each node publishes its own keys' events only: all of them, so
        // waiters follow the slot owner's keyspace channel.
        for s in cluster.servers() {
            let port = s.port().to_string();
            let out = std::process::Command::new("redis-cli")
                .args([
                    "-p",
                    &port,
                    "CONFIG",
                    "SET",
                    "notify-keyspace-events",
                    "Kgx",
                ])
                .output()
                .map_err(|e| format!("redis-cli CONFIG SET: {e}"))?;
            if !String::from_utf8_lossy(&out.stdout).contains("OK") {
                return Err(format!("redis-cli CONFIG SET on {port}: {out:?}"));
            }
        }
    }
    Ok(Arc::new(RedisFixture {
        url: format!("redis+cluster://{}{query}", cluster.seed_nodes()),
        servers: cluster.into_servers(),
        cluster: true,
    }))
}

/// `redis-plain`: one server, the default (plain) format.
pub(super) fn plain() -> Registration {
    Registration {
        label: "redis-plain",
        guarantees: || backend_redis::guarantees(Algorithm::SingleInstance),
        setup: || single(""),
    }
}

/// `redis-redisson`: one server, Redisson's format.
pub(super) fn redisson() -> Registration {
    Registration {
        label: "redis-redisson",
        guarantees: || backend_redis::guarantees(Algorithm::SingleInstance),
        setup: || single("?format=redisson"),
    }
}

/// `redis-cluster-plain`: a three-master cluster with keyspace
/// notifications on every node, plain format: waiters subscribe on the
/// owner of each key's slot (the cluster without them is
/// `backend-redis/tests/peers.rs`'s).
pub(super) fn cluster_plain() -> Registration {
    Registration {
        label: "redis-cluster-plain",
        guarantees: || backend_redis::guarantees(Algorithm::SingleInstance),
        setup: || cluster("", true),
    }
}

/// `redis-cluster-redisson`: a three-master cluster, Redisson's format.
pub(super) fn cluster_redisson() -> Registration {
    Registration {
        label: "redis-cluster-redisson",
        guarantees: || backend_redis::guarantees(Algorithm::SingleInstance),
        setup: || cluster("?format=redisson", false),
    }
}

/// What a fair-mode client declares: `fair_fifo` on top of the single
/// instance's guarantees.
fn fair_guarantees() -> Guarantees {
    let config = RedisConfig::parse("redis://127.0.0.1/0?fair=true").expect("a valid URL");
    backend_redis::guarantees_for(&config)
}

/// `redis-fair`: one server, plain format, `fair=true` (a queue of waiters
/// on the server, the head woken alone), so the FIFO case runs on it.
pub(super) fn fair() -> Registration {
    Registration {
        label: "redis-fair",
        guarantees: fair_guarantees,
        setup: || single("?fair=true"),
    }
}

/// `redis-cluster-fair`: the fair mode on a three-master cluster with
/// keyspace notifications (the queue keys share the lock key's slot).
pub(super) fn cluster_fair() -> Registration {
    Registration {
        label: "redis-cluster-fair",
        guarantees: fair_guarantees,
        setup: || cluster("?fair=true", true),
    }
}

/// Redlock clients are new [`RedlockBackend`]s over five independent
/// servers.
struct RedlockFixture {
    servers: Vec<RedisServer>,
}

#[async_trait]
impl Fixture for RedlockFixture {
    fn guarantees(&self) -> Guarantees {
        backend_redis::guarantees(Algorithm::Redlock)
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        let url = format!("redlock://{}", RedisServer::host_list(&self.servers));
        Ok(Arc::new(RedlockBackend::connect(&url).await?))
    }

    /// Every node behind its own proxy; `op_timeout` is the per-node
    /// timeout.
    async fn client_through_proxy(
        &self,
        op_timeout: Duration,
    ) -> Result<Option<(Arc<dyn LockBackend>, Link)>, LockError> {
        let servers: Vec<_> = self.servers.iter().map(RedisServer::addr).collect();
        let link = Link::to(&servers)?;
        let url = format!("redlock://{}", RedisServer::host_list(&self.servers));
        let url = link.url(&url, "timeout", op_timeout);
        Ok(Some((Arc::new(RedlockBackend::connect(&url).await?), link)))
    }
}

/// `redlock`: Redlock over five independent servers.
pub(super) fn redlock() -> Registration {
    Registration {
        label: "redlock",
        guarantees: || backend_redis::guarantees(Algorithm::Redlock),
        setup: || {
            let servers = RedisServer::start_independent(5, &[]).map_err(|e| e.to_string())?;
            Ok(Arc::new(RedlockFixture { servers }))
        },
    }
}
