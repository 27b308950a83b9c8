//! Interoperation with the real foreign clients, on the lock's own name:
//! redis-py's `Lock`, node-redlock 5 (over ioredis) and a hand-rolled
//! `redis-cli` client (`SET NAME uuid NX PX` + the classic
//! compare-and-delete script). Each locks its own name the way it is used
//! in the field, knowing nothing of polylock. On a single server (with and
//! without keyspace notifications) and on a Redis Cluster.
//!
//! redis-py and node-redlock are installed under `tests/peers/` by
//! `scripts/install-peers.sh` (run by `scripts/install-deps.sh`).

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use backend_redis::{ForeignWake, RedisBackend};
use common::{backend, name, req, spawn_timed_acquire, wait_req};
use lock_core::{LockBackend, LockName};
use testkit::{RedisCluster, RedisServer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{sleep, timeout, Instant};

#[derive(Clone, Copy, Debug)]
enum Kind {
    RedisPy,
    Redlock,
    RedisCli,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::RedisPy => "redis-py",
            Kind::Redlock => "node-redlock",
            Kind::RedisCli => "redis-cli",
        }
    }
}

fn peers_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers")
}

/// One foreign client.
enum Peer {
    /// A program of `tests/peers/` driven by lines on stdin/stdout.
    Program {
        label: &'static str,
        child: Child,
        stdin: ChildStdin,
        stdout: Box<Lines<BufReader<ChildStdout>>>,
    },
    /// `redis-cli` commands, one process per command.
    Cli {
        host: String,
        port: u16,
        cluster: bool,
        tokens: std::collections::HashMap<String, String>,
    },
}

const INSTALL: &str = "run scripts/install-peers.sh (scripts/install-deps.sh runs it)";

impl Peer {
    async fn start(kind: Kind, host: &str, port: u16, cluster: bool) -> Peer {
        let dir = peers_dir();
        let url = format!("redis://{host}:{port}");
        let mode = if cluster { "cluster" } else { "single" };
        let mut cmd = match kind {
            Kind::RedisCli => {
                return Peer::Cli {
                    host: host.into(),
                    port,
                    cluster,
                    tokens: Default::default(),
                }
            }
            Kind::RedisPy => {
                let python = dir.join(".venv/bin/python");
                assert!(
                    python.exists(),
                    "redis-py is not installed ({} is missing): {INSTALL}",
                    python.display()
                );
                let mut c = Command::new(python);
                c.arg(dir.join("redis_py_peer.py"));
                c
            }
            Kind::Redlock => {
                let module = dir.join("node_modules/redlock/package.json");
                assert!(
                    module.exists() && dir.join("node_modules/ioredis").exists(),
                    "node-redlock 5 / ioredis are not installed ({} is missing): {INSTALL}",
                    module.display()
                );
                let mut c = Command::new("node");
                c.arg(dir.join("redlock_peer.js"));
                c
            }
        };
        cmd.arg(&url)
            .arg(mode)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {} peer: {e}: {INSTALL}", kind.label()));
        let stdin = child.stdin.take().unwrap();
        let stdout = Box::new(BufReader::new(child.stdout.take().unwrap()).lines());
        let mut peer = Peer::Program {
            label: kind.label(),
            child,
            stdin,
            stdout,
        };
        assert_eq!(peer.reply().await, "ready");
        peer
    }

    async fn reply(&mut self) -> String {
        let Peer::Program { label, stdout, .. } = self else {
            unreachable!()
        };
        match timeout(Duration::from_secs(30), stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            other => panic!("{label} peer: no reply ({other:?})"),
        }
    }

    async fn send(&mut self, line: String) {
        let Peer::Program { stdin, .. } = self else {
            unreachable!()
        };
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Takes `name` for `ttl_ms`, retrying for up to `wait_ms` the client's
    /// own way; whether it got it.
    async fn acquire(&mut self, name: &LockName, ttl_ms: u64, wait_ms: u64) -> bool {
        if let Peer::Cli { tokens, .. } = self {
            let token = lock_core::OwnerToken::random().to_string();
            tokens.insert(name.to_string(), token.clone());
            let until = Instant::now() + Duration::from_millis(wait_ms);
            loop {
                let out = self
                    .cli(&[
                        "SET",
                        name.as_str(),
                        &token,
                        "NX",
                        "PX",
                        &ttl_ms.to_string(),
                    ])
                    .await;
                if out == "OK" {
                    return true;
                }
                assert_eq!(out, "", "SET NX PX answered {out:?}");
                if Instant::now() >= until {
                    return false;
                }
                sleep(Duration::from_millis(50)).await;
            }
        }
        self.send(format!("acquire {name} {ttl_ms} {wait_ms}"))
            .await;
        match self.reply().await.as_str() {
            "acquired" => true,
            "busy" => false,
            other => panic!("acquire: {other}"),
        }
    }

    /// Releases `name` the client's own way: true if it released its
    /// lock, false if the client found it no longer owned it.
    async fn release(&mut self, name: &LockName) -> bool {
        if let Peer::Cli { tokens, .. } = self {
            let token = tokens.remove(name.as_str()).expect("acquired before");
            let script = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                          return redis.call('del', KEYS[1]) else return 0 end";
            return match self
                .cli(&["EVAL", script, "1", name.as_str(), &token])
                .await
                .as_str()
            {
                "1" => true,
                "0" => false,
                other => panic!("compare-and-delete answered {other:?}"),
            };
        }
        self.send(format!("release {name}")).await;
        match self.reply().await.as_str() {
            "released" => true,
            "not-owned" => false,
            other => panic!("release: {other}"),
        }
    }

    async fn cli(&self, args: &[&str]) -> String {
        let Peer::Cli {
            host,
            port,
            cluster,
            ..
        } = self
        else {
            unreachable!()
        };
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", host, "-p", &port.to_string()]);
        if *cluster {
            cmd.arg("-c");
        }
        let out = cmd.args(args).output().await.expect("redis-cli runs");
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    async fn quit(self) {
        if let Peer::Program {
            mut child,
            mut stdin,
            ..
        } = self
        {
            let _ = stdin.write_all(b"quit\n").await;
            drop(stdin);
            let status = timeout(Duration::from_secs(10), child.wait()).await;
            assert!(
                matches!(status, Ok(Ok(s)) if s.success()),
                "peer exit: {status:?}"
            );
        }
    }
}

/// How long a hand-off took each way.
#[derive(Debug)]
struct Handoffs {
    to_polylock: Duration,
    to_foreign: Duration,
}

/// Every check against one foreign client, on names of its own.
async fn interop(
    kind: Kind,
    ours: &std::sync::Arc<RedisBackend>,
    host: &str,
    port: u16,
    cluster: bool,
) -> Handoffs {
    let label = kind.label();
    let mut peer = Peer::start(kind, host, port, cluster).await;
    let n = name(&format!("peers/{label}/handover"));
    let ttl = Duration::from_secs(30);

    // A foreign holder makes polylock wait.
    assert!(peer.acquire(&n, 30_000, 0).await, "{label}: a free lock");
    assert!(
        ours.try_acquire(&req(&n, ttl)).await.unwrap().is_none(),
        "polylock took a lock {label} holds"
    );
    let info = ours.inspect(&n).await.unwrap().expect("held");
    assert!(
        info.owner.starts_with("a foreign client (not polylock)"),
        "{label}: {}",
        info.owner
    );
    assert_eq!(info.fence, None, "{label}: a foreign holder has no token");
    assert!(info.expires_in.unwrap() > Duration::from_secs(25));
    let started = Instant::now();
    let waited = ours
        .acquire(&wait_req(&n, ttl, Duration::from_millis(400)))
        .await
        .unwrap();
    assert!(waited.is_none(), "polylock got a lock {label} holds");
    assert!(started.elapsed() >= Duration::from_millis(350));

    // Hand-over, foreign -> polylock: the waiter has backed off by now.
    let waiter = spawn_timed_acquire(ours, wait_req(&n, ttl, Duration::from_secs(10)));
    sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "acquired while {label} held it");
    let released_at = Instant::now();
    assert!(peer.release(&n).await, "{label}: releasing its own lock");
    let (got_at, lease) = waiter.await.unwrap();
    let lease = lease.expect("polylock acquired after the foreign release");
    let to_polylock = got_at.saturating_duration_since(released_at);

    // polylock holding makes the foreign client fail, waiting or not.
    assert!(
        !peer.acquire(&n, 30_000, 0).await,
        "{label} took a lock polylock holds"
    );
    assert!(
        !peer.acquire(&n, 30_000, 300).await,
        "{label} took a lock polylock holds, waiting"
    );

    // Hand-over, polylock -> foreign.
    let task = {
        let n = n.clone();
        tokio::spawn(async move {
            let got = peer.acquire(&n, 30_000, 10_000).await;
            (peer, got, Instant::now())
        })
    };
    sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished(), "{label} got it while polylock held it");
    let released_at = Instant::now();
    ours.release(&lease).await.unwrap();
    let (mut peer, got, got_at) = task.await.unwrap();
    assert!(got, "{label} did not get the lock polylock released");
    let to_foreign = got_at.saturating_duration_since(released_at);
    assert!(peer.release(&n).await);

    // A foreign client's late release never deletes polylock's lock.
    let m = name(&format!("peers/{label}/late"));
    assert!(peer.acquire(&m, 300, 0).await);
    let lease = ours
        .acquire(&wait_req(&m, ttl, Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("polylock acquired once the foreign lease ran out");
    assert!(
        !peer.release(&m).await,
        "{label}'s late release claims to have released"
    );
    let info = ours
        .inspect(&m)
        .await
        .unwrap()
        .expect("polylock's lock kept");
    assert_eq!(info.fence, Some(lease.fence()));
    let lease = ours.renew(&lease).await.expect("still polylock's");
    ours.release(&lease).await.unwrap();

    // polylock's late release or renew never touches the foreign lock.
    let short = ours
        .try_acquire(&req(&m, Duration::from_millis(300)))
        .await
        .unwrap()
        .expect("free");
    assert!(
        peer.acquire(&m, 30_000, 5_000).await,
        "{label} acquired once polylock's lease ran out"
    );
    let r = ours.renew(&short).await;
    assert!(r.as_ref().is_err_and(|e| e.is_lost()), "{label}: {r:?}");
    let r = ours.release(&short).await;
    assert!(r.as_ref().is_err_and(|e| e.is_lost()), "{label}: {r:?}");
    assert!(
        ours.try_acquire(&req(&m, ttl)).await.unwrap().is_none(),
        "polylock's stale release removed {label}'s lock"
    );
    assert!(peer.release(&m).await, "{label}'s lock was touched");
    peer.quit().await;
    Handoffs {
        to_polylock,
        to_foreign,
    }
}

/// One client against a single server with keyspace notifications, one
/// without, and a three-master cluster without and with them.
async fn every_deployment(kind: Kind) {
    let label = kind.label();
    let report = |deployment: &str, wake: ForeignWake, h: &Handoffs| {
        eprintln!(
            "hand-off {label:<12} {deployment:<18} ({wake}): foreign release -> polylock {:?}, \
             polylock release -> {label} {:?}",
            h.to_polylock, h.to_foreign
        );
    };

    let events = RedisServer::start_with_args(&["--notify-keyspace-events", "Kgx"]).unwrap();
    let ours = backend(&events.url()).await;
    assert_eq!(ours.foreign_wake(), ForeignWake::KeyspaceEvents);
    let h = interop(kind, &ours, "127.0.0.1", events.port(), false).await;
    report("single, keyspace", ours.foreign_wake(), &h);
    // Woken by the key's `del` event, not by a poll.
    assert!(h.to_polylock < Duration::from_millis(500), "{label}: {h:?}");
    drop(events);

    let plain = RedisServer::start().unwrap();
    let ours = backend(&plain.url()).await;
    assert_eq!(ours.foreign_wake(), ForeignWake::Polling);
    let h = interop(kind, &ours, "127.0.0.1", plain.port(), false).await;
    report("single, polling", ours.foreign_wake(), &h);
    assert!(h.to_polylock < Duration::from_secs(2), "{label}: {h:?}");
    drop(plain);

    let cluster = RedisCluster::start(3).expect("cluster");
    let ours = backend(&format!("redis+cluster://{}", cluster.seed_nodes())).await;
    assert_eq!(ours.foreign_wake(), ForeignWake::Polling);
    let port = cluster.servers()[0].port();
    let h = interop(kind, &ours, "127.0.0.1", port, true).await;
    report("cluster, polling", ours.foreign_wake(), &h);
    assert!(h.to_polylock < Duration::from_secs(2), "{label}: {h:?}");
    drop(cluster);

    // Keyspace events on every node: the waiter listens on the node that
    // owns the key's slot.
    let cluster = RedisCluster::start(3).expect("cluster");
    common::keyspace_events_on(&cluster).await;
    let ours = backend(&format!("redis+cluster://{}", cluster.seed_nodes())).await;
    assert_eq!(ours.foreign_wake(), ForeignWake::KeyspaceEvents);
    let port = cluster.servers()[0].port();
    let h = interop(kind, &ours, "127.0.0.1", port, true).await;
    report("cluster, keyspace", ours.foreign_wake(), &h);
    // Woken by the key's `del` event on its node: the waiter's fallback
    // poll has backed off to 250-500 ms by the release.
    assert!(h.to_polylock < Duration::from_millis(200), "{label}: {h:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_lock() {
    every_deployment(Kind::RedisPy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_5() {
    every_deployment(Kind::Redlock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_rolled_set_nx_px() {
    every_deployment(Kind::RedisCli).await;
}
