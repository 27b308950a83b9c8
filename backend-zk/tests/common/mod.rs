//! One standalone ZooKeeper server per test binary.

#![allow(dead_code, unreachable_pub)]

use std::sync::OnceLock;
use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::{AcquireRequest, Lease, LockBackend, LockName, OwnerToken};
use testkit::ZooKeeperServer;

pub fn server() -> &'static ZooKeeperServer {
    static SERVER: OnceLock<ZooKeeperServer> = OnceLock::new();
    SERVER.get_or_init(|| ZooKeeperServer::start().expect("start ZooKeeper"))
}

pub fn url() -> String {
    format!("zk://{}", server().connect_string())
}

pub async fn client() -> ZkBackend {
    ZkBackend::connect(&url()).await.expect("connect")
}

pub fn unique(name: &str) -> LockName {
    let run: u32 = rand::random();
    LockName::new(format!("zk-test-{run:08x}/{name}")).unwrap()
}

pub fn req(name: &LockName, ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, wait).unwrap()
}

pub async fn try_take(c: &ZkBackend, name: &LockName, ttl: Duration) -> Option<Lease> {
    c.try_acquire(&req(name, ttl, Duration::ZERO))
        .await
        .expect("try_acquire")
}
