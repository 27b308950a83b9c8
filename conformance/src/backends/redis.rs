//! Redis: a spawned `redis-server` per wire format, and a spawned
//! three-master Redis Cluster.

use std::sync::Arc;

use async_trait::async_trait;
use backend_redis::RedisBackend;
use lock_core::{Guarantees, LockBackend, LockError};
use testkit::{RedisCluster, RedisServer};

use super::Registration;
use crate::fixture::Fixture;

/// Clients are new [`RedisBackend`]s (their own connections) to `url`.
/// `remove_behind_back` is the default: `force_release` from another client,
/// a `DEL` of the lock key.
struct RedisFixture {
    url: String,
    /// Kept alive (and killed on drop) with the fixture.
    _servers: Vec<RedisServer>,
}

#[async_trait]
impl Fixture for RedisFixture {
    fn guarantees(&self) -> Guarantees {
        backend_redis::guarantees()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(RedisBackend::connect(&self.url).await?))
    }
}

fn single(query: &str) -> Result<Arc<dyn Fixture>, String> {
    let server = RedisServer::start().map_err(|e| e.to_string())?;
    Ok(Arc::new(RedisFixture {
        url: format!("{}/0{query}", server.url()),
        _servers: vec![server],
    }))
}

fn cluster(query: &str) -> Result<Arc<dyn Fixture>, String> {
    let cluster = RedisCluster::start(3).map_err(|e| e.to_string())?;
    Ok(Arc::new(RedisFixture {
        url: format!("redis+cluster://{}{query}", cluster.seed_nodes()),
        _servers: cluster.into_servers(),
    }))
}

/// `redis-plain`: one server, the default (plain) format.
pub(super) fn plain() -> Registration {
    Registration {
        label: "redis-plain",
        guarantees: backend_redis::guarantees,
        setup: || single(""),
    }
}

/// `redis-redisson`: one server, Redisson's format.
pub(super) fn redisson() -> Registration {
    Registration {
        label: "redis-redisson",
        guarantees: backend_redis::guarantees,
        setup: || single("?format=redisson"),
    }
}

/// `redis-cluster-plain`: a three-master cluster, plain format.
pub(super) fn cluster_plain() -> Registration {
    Registration {
        label: "redis-cluster-plain",
        guarantees: backend_redis::guarantees,
        setup: || cluster(""),
    }
}

/// `redis-cluster-redisson`: a three-master cluster, Redisson's format.
pub(super) fn cluster_redisson() -> Registration {
    Registration {
        label: "redis-cluster-redisson",
        guarantees: backend_redis::guarantees,
        setup: || cluster("?format=redisson"),
    }
}
