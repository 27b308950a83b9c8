//! Shared helpers of backend-redis's integration tests: spawned servers, a
//! raw connection that bypasses the lock layer, requests.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backend_redis::RedisBackend;
use lock_core::{AcquireRequest, Lease, LockBackend, LockGuard, LockName, Locker, OwnerToken};
use redis::aio::MultiplexedConnection;
use testkit::RedisServer;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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

/// A fresh server, our backend on it (its URL followed by `query`, e.g.
/// `"?format=redisson"`), and a raw connection to it for another client.
pub async fn server_and_clients(
    query: &str,
) -> (RedisServer, Arc<RedisBackend>, MultiplexedConnection) {
    let srv = server();
    let ours = backend(&format!("{}{query}", srv.url())).await;
    let foreign = raw(&srv.url()).await;
    (srv, ours, foreign)
}

/// Another client's plain lock: `SET key token NX PX px_ms`; `Some("OK")`
/// if it took it.
pub async fn foreign_set_nx(
    conn: &mut MultiplexedConnection,
    key: &str,
    token: &str,
    px_ms: u64,
) -> Option<String> {
    redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(px_ms)
        .query_async(conn)
        .await
        .unwrap()
}

/// Subscribers of `channel` (`PUBSUB NUMSUB`).
pub async fn numsub(conn: &MultiplexedConnection, channel: &str) -> i64 {
    let mut conn = conn.clone();
    let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .unwrap();
    n[0].1
}

/// Connected pub/sub clients (`CLIENT LIST TYPE pubsub`).
pub async fn pubsub_clients(conn: &MultiplexedConnection) -> usize {
    let mut conn = conn.clone();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    list.lines().filter(|l| !l.is_empty()).count()
}

/// Takes the free lock `name` for `ttl` with no wait; panics if it is held.
pub async fn acquire_free(backend: &RedisBackend, name: &LockName, ttl: Duration) -> Lease {
    backend
        .try_acquire(&req(name, ttl))
        .await
        .expect("try_acquire")
        .expect("the lock is free")
}

/// A task that acquires with `request` through `backend` and returns when
/// it returned, and what.
pub fn spawn_timed_acquire(
    backend: &Arc<RedisBackend>,
    request: AcquireRequest,
) -> JoinHandle<(Instant, Option<Lease>)> {
    let backend = backend.clone();
    tokio::spawn(async move {
        let lease = backend.acquire(&request).await.unwrap();
        (Instant::now(), lease)
    })
}

/// A task that waits up to `wait` for `lock` through `waiter`, releases it
/// at once, and returns when it got it.
pub fn spawn_waiter_that_releases(
    waiter: Locker,
    lock: &str,
    wait: Duration,
) -> JoinHandle<Instant> {
    let lock = lock.to_string();
    tokio::spawn(async move {
        let g = waiter
            .lock(&lock)
            .wait(wait)
            .acquire()
            .await
            .expect("the waiter acquires");
        let at = Instant::now();
        g.release().await.unwrap();
        at
    })
}

/// Releases `guard` and returns how long after the release the waiting
/// `task` (from [`spawn_waiter_that_releases`]) got the lock.
pub async fn release_and_time_handoff(guard: LockGuard, task: JoinHandle<Instant>) -> Duration {
    let released = Instant::now();
    guard.release().await.unwrap();
    task.await.unwrap() - released
}

/// A locker over a new backend for `url`.
pub async fn locker_on(url: &str) -> Locker {
    Locker::from_arc(backend(url).await)
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

/// Turns keyspace notifications for generic commands and expiries on, on
/// every member of `cluster` (each node publishes only its own keys'
/// events).
pub async fn keyspace_events_on(cluster: &testkit::RedisCluster) {
    for s in cluster.servers() {
        let mut c = raw(&s.url()).await;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("Kgx")
            .query_async(&mut c)
            .await
            .unwrap();
    }
}

/// A foreign cluster client (no lock layer), following MOVED by itself.
pub async fn raw_cluster(
    cluster: &testkit::RedisCluster,
) -> redis::cluster_async::ClusterConnection {
    let nodes: Vec<String> = cluster.servers().iter().map(|s| s.url()).collect();
    redis::cluster::ClusterClient::new(nodes)
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection")
}

/// The classic hand-rolled release: delete the key only if it still holds
/// `token`; whether it did.
pub async fn compare_and_delete<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    key: &str,
    token: &str,
) -> bool {
    let n: i64 = redis::Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    )
    .key(key)
    .arg(token)
    .invoke_async(conn)
    .await
    .unwrap();
    n == 1
}

/// The median of `v` (sorted in place).
pub fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// How many scripts the server at `conn` has run (`EVALSHA` + `EVAL`
/// calls in `INFO commandstats`): the server's own request count for
/// polylock's operations, each of which is one script run.
pub async fn script_calls(conn: &MultiplexedConnection) -> u64 {
    let mut conn = conn.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// A raw connection to one spawned server.
pub async fn raw_url(server: &RedisServer) -> MultiplexedConnection {
    raw(&server.url()).await
}
