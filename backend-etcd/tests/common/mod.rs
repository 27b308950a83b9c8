//! Helpers shared by the integration tests: etcdctl as a second,
//! independent lock client, and small utilities around the test kit.

#![allow(dead_code)] // each test file uses a different subset

use std::future::Future;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use backend_etcd::EtcdBackend;
use lock_core::{AcquireRequest, LockGuard, LockName, Locker, OwnerToken};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use testkit::EtcdServer;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

/// A fresh single etcd, its endpoints and its `etcd://` URL.
pub(crate) fn server() -> (EtcdServer, Vec<String>, String) {
    let server = EtcdServer::start().expect("etcd starts");
    let endpoints = vec![server.endpoint()];
    let url = url_of(&endpoints);
    (server, endpoints, url)
}

/// `etcd://127.0.0.1:P,...` from the kit's `http://` endpoints.
pub(crate) fn url_of(endpoints: &[String]) -> String {
    let hosts: Vec<&str> = endpoints
        .iter()
        .map(|e| e.trim_start_matches("http://"))
        .collect();
    format!("etcd://{}", hosts.join(","))
}

/// A client and a locker over it (sharing the client, so tests can look at
/// its sessions).
pub(crate) async fn client(url: &str) -> (EtcdBackend, Locker) {
    let backend = EtcdBackend::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let locker = Locker::new(backend.clone());
    (backend, locker)
}

/// A unique lock name for one test.
pub(crate) fn name(test: &str) -> String {
    format!("itest-{:08x}/{test}", rand::random::<u32>())
}

/// `etcdctl` (v3 API) against `endpoints`, with a clean environment.
pub(crate) fn etcdctl(endpoints: &[String]) -> Command {
    let mut cmd = Command::new("etcdctl");
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--command-timeout=5s");
    cmd
}

/// Runs etcdctl to completion and returns its stdout.
pub(crate) async fn etcdctl_out(endpoints: &[String], args: &[&str]) -> String {
    let out = timeout(
        Duration::from_secs(20),
        etcdctl(endpoints).args(args).stdin(Stdio::null()).output(),
    )
    .await
    .expect("etcdctl finished")
    .expect("etcdctl ran");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `etcdctl lock NAME`: a Go `concurrency.Mutex` holder that prints its key
/// once it holds the lock, and unlocks on SIGINT.
pub(crate) struct EtcdctlLock {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// The key it holds, once it printed it.
    pub(crate) key: Option<String>,
}

impl EtcdctlLock {
    /// Starts `etcdctl lock NAME` (it queues at once).
    pub(crate) fn spawn(endpoints: &[String], name: &str) -> EtcdctlLock {
        let mut child = etcdctl(endpoints)
            .args(["lock", name])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn etcdctl lock");
        let stdout = child.stdout.take().expect("piped stdout");
        EtcdctlLock {
            child,
            lines: BufReader::new(stdout).lines(),
            key: None,
        }
    }

    /// Waits up to `limit` for etcdctl to print the key it holds.
    pub(crate) async fn held_within(&mut self, limit: Duration) -> bool {
        if self.key.is_some() {
            return true;
        }
        match timeout(limit, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => {
                self.key = Some(line.trim().to_string());
                true
            }
            Ok(other) => panic!("etcdctl lock ended without holding: {other:?}"),
            Err(_) => false,
        }
    }

    /// SIGINT: etcdctl unlocks (deletes its key) and exits.
    pub(crate) async fn release(mut self) {
        let pid = self.child.id().expect("etcdctl runs") as i32;
        kill(Pid::from_raw(pid), Signal::SIGINT).expect("SIGINT etcdctl");
        let status = timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("etcdctl exits after SIGINT")
            .expect("wait etcdctl");
        assert!(status.success(), "etcdctl lock exited with {status}");
    }
}

/// The index of the leader among `endpoints`, asking each member.
pub(crate) async fn leader_index(endpoints: &[String]) -> usize {
    for _ in 0..100 {
        let mut leader = None;
        let mut ids = Vec::new();
        for ep in endpoints {
            let status = async {
                let mut c = etcd_client::Client::connect([ep.as_str()], None)
                    .await
                    .ok()?;
                timeout(Duration::from_secs(1), c.status()).await.ok()?.ok()
            }
            .await;
            match status {
                Some(s) => {
                    leader = Some(s.leader());
                    ids.push(s.header().map(|h| h.member_id()));
                }
                None => ids.push(None),
            }
        }
        if let Some(l) = leader.filter(|&l| l != 0) {
            if let Some(i) = ids.iter().position(|id| *id == Some(l)) {
                return i;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no leader among {endpoints:?}");
}

/// Waits until `n` claims are queued on lock `name` (read with a plain
/// etcd client), so a test knows a waiter is in line before the next one.
pub(crate) async fn wait_claims(endpoints: &[String], name: &str, n: usize) {
    let mut c = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("etcd client");
    let prefix = format!("{name}/");
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    for _ in 0..200 {
        let count = c
            .get(prefix.as_str(), Some(opts.clone()))
            .await
            .expect("count")
            .count();
        if count as usize == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{name}: never saw {n} claims");
}

/// Acquires `name` with `ttl`, no wait.
pub(crate) async fn hold(locker: &Locker, name: &str, ttl: Duration) -> LockGuard {
    locker
        .lock(name)
        .ttl(ttl)
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("acquire {name}: {e}"))
        .unwrap_or_else(|| panic!("{name} is held"))
}

/// Acquires `name` with `ttl` and never renews it (a holder that stops
/// renewing: its session deletes the claim at the TTL).
pub(crate) async fn hold_unrenewed(locker: &Locker, name: &str, ttl: Duration) -> LockGuard {
    locker
        .lock(name)
        .ttl(ttl)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap()
}

/// Acquires `name` (default TTL, no wait) and releases it again.
pub(crate) async fn lock_and_unlock(locker: &Locker, name: impl AsRef<str>) {
    locker
        .lock(name)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Acquires `name`, waiting up to `wait` for it.
pub(crate) async fn acquire_waiting(
    locker: &Locker,
    name: impl AsRef<str>,
    wait: Duration,
) -> lock_core::Result<LockGuard> {
    locker.lock(name).wait(wait).acquire().await
}

/// A task that waits up to `wait` for `name` and returns its guard.
pub(crate) fn spawn_waiter(locker: Locker, name: &str, wait: Duration) -> JoinHandle<LockGuard> {
    let name = name.to_string();
    tokio::spawn(async move { acquire_waiting(&locker, &name, wait).await.unwrap() })
}

/// A raw backend request for `name` of `ttl`, no wait, by a new owner.
pub(crate) fn request(name: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(
        LockName::new(name).unwrap(),
        OwnerToken::random(),
        ttl,
        Duration::ZERO,
    )
    .unwrap()
}

/// Runs `op` and checks it returned within `limit` (`"{what} hung"`
/// otherwise).
pub(crate) async fn returns_within<T>(
    limit: Duration,
    what: &str,
    op: impl Future<Output = T>,
) -> T {
    let started = Instant::now();
    let out = op.await;
    assert!(
        started.elapsed() < limit,
        "{what} hung {:?}",
        started.elapsed()
    );
    out
}

/// Keepalives sent by all sessions of `backend`.
pub(crate) fn keepalives(backend: &EtcdBackend) -> u64 {
    backend.sessions().iter().map(|s| s.keepalives_sent).sum()
}

/// Shares a guard between tasks.
pub(crate) type Shared<T> = Arc<tokio::sync::Mutex<T>>;

/// The sum of etcd's own `grpc_server_handled_total` counter for one gRPC
/// method (`Range`, `Txn`, ...) on the member at `addr`: the requests it
/// answered, whoever sent them.
pub(crate) async fn handled(addr: std::net::SocketAddr, method: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .await
        .expect("metrics request");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("metrics answer");
    let tag = format!("grpc_method=\"{method}\"");
    body.lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{") && l.contains(&tag))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Reads (`Range`) and transactions (`Txn`) answered so far, once no new
/// one came for 300 ms: every client is idle.
pub(crate) async fn settled_reads(addr: std::net::SocketAddr) -> u64 {
    let count = || async { handled(addr, "Range").await + handled(addr, "Txn").await };
    let mut last = count().await;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = count().await;
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("etcd never went quiet");
}
