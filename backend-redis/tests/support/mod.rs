//! Shared helpers of backend-redis's integration tests: spawned servers, a
//! raw connection that bypasses the lock layer, requests.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backend_redis::RedisBackend;
use lock_core::{AcquireRequest, LockName, OwnerToken};
use testkit::RedisServer;

/// A fresh single redis-server.
pub fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server")
}

/// A raw multiplexed connection to `url` (a plain `redis://` URL), with no
/// lock layer: what another client would use.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("raw client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// A backend for `url`.
pub async fn backend(url: &str) -> Arc<RedisBackend> {
    Arc::new(RedisBackend::connect(url).await.expect("connect"))
}

/// A valid lock name.
pub fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

/// A request of `ttl` with no wait, by a new owner.
pub fn req(name: &LockName, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, Duration::ZERO).expect("request")
}

/// A request of `ttl` that may wait `wait`, by a new owner.
pub fn wait_req(name: &LockName, ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, wait).expect("request")
}

/// Polls `f` every 20 ms until it returns true or `limit` passes; returns
/// whether it did.
pub async fn eventually<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + limit;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
