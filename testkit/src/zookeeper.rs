//! Real ZooKeeper servers (standalone, or an ensemble), run directly on the JVM.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::clock::FakeClock;
use crate::error::{Error, Result};
use crate::ports::{on_fresh_ports, try_free_port};
use crate::process::{
    find_binary, require_file, server_controls, tcp_exchange, CommandSpec, ServerProcess,
};
use crate::proxy::{Mode, Proxy};

/// The JVM starts in about a second alone, but much slower while other
/// servers start in parallel on a two-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// ZooKeeper 3.8.0 can accept a four-letter word during start-up and never
/// answer it, so the probe must give up on its own.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where Debian's `libzookeeper-java` (pulled in by `zookeeper`) puts the
/// server; its manifest's Class-Path names the other jars it needs.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// ZooKeeper logs through slf4j; without a binding it logs nothing at all.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// Tick of 500 ms: sessions can then time out in one second
/// (2 × tickTime), which keeps session-expiry tests short.
const TICK_TIME_MS: u64 = 500;
/// Ticks a follower waits for its leader before giving it up.
const SYNC_LIMIT: u32 = 5;

/// A standalone ZooKeeper server on a free port of 127.0.0.1, with its own
/// data directory, `tickTime=500` and the four-letter words `srvr`, `stat`,
/// `ruok`, `mntr`, `conf`, `cons`, `envi`, `wchs`, `dump` and `isro` enabled.
#[derive(Debug)]
pub struct ZooKeeperServer {
    process: ServerProcess,
    port: u16,
}

server_controls!(ZooKeeperServer, process);

impl ZooKeeperServer {
    /// Starts the server and waits until `srvr` reports a mode.
    pub fn start() -> Result<ZooKeeperServer> {
        Self::start_inner(None)
    }

    /// Like [`start`](Self::start), with the JVM's wall clock on `clock`
    /// (its monotonic clock, `System.nanoTime`, is left alone).
    pub fn start_with_clock(clock: &FakeClock) -> Result<ZooKeeperServer> {
        Self::start_inner(Some(clock))
    }

    /// Tried again on fresh ports when another process took this one
    /// first (ports.rs, `on_fresh_ports`).
    fn start_inner(clock: Option<&FakeClock>) -> Result<ZooKeeperServer> {
        on_fresh_ports(|| Self::start_once(clock))
    }

    fn start_once(clock: Option<&FakeClock>) -> Result<ZooKeeperServer> {
        let port = try_free_port()?;
        let dir = temp_dir()?;
        let spec = server_spec(dir.path(), port, None, STANDALONE_MAIN)?
            .envs(clock.map(FakeClock::env).unwrap_or_default());
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let process = ServerProcess::start(
            format!("ZooKeeper on {addr}"),
            spec,
            Box::new(move || srvr(addr).map(drop)),
            READY_TIMEOUT,
            dir,
            "zookeeper.log",
        )?;
        Ok(ZooKeeperServer { process, port })
    }

    /// The client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's `tickTime` (500 ms). Session timeouts are clamped to
    /// between 2 and 20 ticks, i.e. 1 s to 10 s.
    pub fn tick_time(&self) -> Duration {
        Duration::from_millis(TICK_TIME_MS)
    }

    /// The client connect string, `127.0.0.1:port`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// The main class of a standalone server.
const STANDALONE_MAIN: &str = "org.apache.zookeeper.server.ZooKeeperServerMain";
/// The main class of an ensemble member.
const QUORUM_MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

fn temp_dir() -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("testkit-zookeeper-")
        .tempdir()
        .map_err(|e| Error::io("creating a temp dir for ZooKeeper", e))
}

/// Writes `zoo.cfg` (and `myid` for an ensemble member) into `dir` and
/// returns the JVM command line. `quorum`: this member's id and the
/// `server.N=` lines of the whole ensemble.
fn server_spec(
    dir: &Path,
    port: u16,
    quorum: Option<(usize, &str)>,
    main: &str,
) -> Result<CommandSpec> {
    let java = find_java()?;
    let zk_jar = require_file(Path::new(ZOOKEEPER_JAR), "zookeeper")?;
    let slf4j = require_file(Path::new(SLF4J_SIMPLE_JAR), "libslf4j-java")?;
    let config = dir.join("zoo.cfg");
    let data_dir = dir.join("data");
    // forceSync=no: no fsync per write. A SIGKILL does not lose data that
    // reached the page cache, and tests never crash the machine.
    let mut text = format!(
        "tickTime={TICK_TIME_MS}\n\
         initLimit=10\n\
         syncLimit={SYNC_LIMIT}\n\
         dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress=127.0.0.1\n\
         maxClientCnxns=0\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=srvr,stat,ruok,mntr,conf,cons,envi,wchs,dump,isro\n\
         forceSync=no\n",
        data_dir.display()
    );
    if let Some((id, servers)) = quorum {
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| Error::io(format!("creating {}", data_dir.display()), e))?;
        std::fs::write(data_dir.join("myid"), format!("{id}\n"))
            .map_err(|e| Error::io("writing myid", e))?;
        text.push_str(servers);
    }
    std::fs::write(&config, text)
        .map_err(|e| Error::io(format!("writing {}", config.display()), e))?;
    let classpath = format!("{}:{}", zk_jar.display(), slf4j.display());
    // Small heap and C1 only: start-up time matters, throughput does not.
    // -XX:-UsePerfData keeps the JVM from leaving files in /tmp.
    Ok(CommandSpec::new(java)
        .args([
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-Djava.awt.headless=true",
            "-cp",
            &classpath,
            main,
        ])
        .arg(&config)
        .cwd(dir))
}

/// One server of a [`ZooKeeperEnsemble`].
#[derive(Debug)]
pub struct ZooKeeperMember {
    process: ServerProcess,
    id: usize,
    port: u16,
}

server_controls!(ZooKeeperMember, process);

impl ZooKeeperMember {
    /// The member's `myid` (1, 2, 3, ...).
    pub fn id(&self) -> usize {
        self.id
    }

    /// The client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// What `srvr` says the member is now: `leader`, `follower`, or an
    /// error while it is not serving (no quorum, stopped).
    pub fn mode(&self) -> std::result::Result<String, String> {
        let text = srvr(self.addr())?;
        text.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_string())
            .ok_or_else(|| format!("srvr answered {:?}", text.trim()))
    }
}

/// A ZooKeeper ensemble of several servers on 127.0.0.1 (quorum and
/// election ports of their own, `tickTime=500`), each with its own data
/// directory and the usual controls (pause, resume, kill, restart), so
/// tests can take members away while clients keep their sessions.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    members: Vec<ZooKeeperMember>,
    /// With [`start_with_cuttable_links`](Self::start_with_cuttable_links):
    /// `(from, to, proxy)`, the proxy member `from` reaches member `to`'s
    /// quorum port through.
    links: Vec<(usize, usize, Proxy)>,
}

impl ZooKeeperEnsemble {
    /// Starts `size` servers and waits until every one serves (which needs
    /// an elected leader).
    pub fn start(size: usize) -> Result<ZooKeeperEnsemble> {
        Self::start_inner(size, false)
    }

    /// As [`start`](Self::start), but each member reaches the others'
    /// quorum ports (where a follower connects to its leader) through a
    /// proxy of its own, so that [`cut_off`](Self::cut_off) can silence a
    /// member's link to its leader while its clients still reach it. Only
    /// the connection open at the cut goes through the proxy for sure: a
    /// member may take the leader's view of the addresses when it joins,
    /// and reconnect around the proxy after giving its leader up.
    pub fn start_with_cuttable_links(size: usize) -> Result<ZooKeeperEnsemble> {
        Self::start_inner(size, true)
    }

    /// Silences (as a partition does: no reset, no close) the links from
    /// member `id` to every other member's quorum port: a follower cut off
    /// this way keeps serving its clients' reads until it gives its
    /// leader up, `syncLimit` ticks later.
    pub fn cut_off(&self, id: usize) -> Result<()> {
        let mut any = false;
        for (_, _, proxy) in self.links.iter().filter(|(from, _, _)| *from == id) {
            proxy.set_mode(Mode::Blackhole);
            any = true;
        }
        if any {
            Ok(())
        } else {
            Err(Error::InvalidState {
                what: format!("ZooKeeper server.{id}"),
                operation: "cut_off",
                reason: "the ensemble was not started with cuttable links",
            })
        }
    }

    /// The most a follower cut off from its leader can keep a session
    /// alive past the leader's expiry of it: `(syncLimit + 1) × tickTime`,
    /// 3 s here (backend-zk's `follower_lag`).
    pub fn follower_lag(&self) -> Duration {
        Duration::from_millis(TICK_TIME_MS) * (SYNC_LIMIT + 1)
    }

    fn start_inner(size: usize, cuttable: bool) -> Result<ZooKeeperEnsemble> {
        if size == 0 {
            return Err(Error::InvalidState {
                what: "ZooKeeper ensemble".to_owned(),
                operation: "start",
                reason: "an ensemble needs at least one server",
            });
        }
        let ports = (0..size)
            .map(|_| Ok((try_free_port()?, try_free_port()?, try_free_port()?)))
            .collect::<Result<Vec<(u16, u16, u16)>>>()?;
        let mut links = Vec::new();
        // Member `id`'s `server.N=` lines: its own ports, and the others'
        // (their quorum port through a proxy when cuttable).
        let mut servers_of = |id: usize| -> Result<String> {
            let mut text = String::new();
            for (i, &(_, quorum, election)) in ports.iter().enumerate() {
                let to = i + 1;
                let quorum = if cuttable && to != id {
                    let proxy = Proxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, quorum)))?;
                    let port = proxy.port();
                    links.push((id, to, proxy));
                    port
                } else {
                    quorum
                };
                text.push_str(&format!("server.{to}=127.0.0.1:{quorum}:{election}\n"));
            }
            Ok(text)
        };
        // All members must run before any serves; if one fails, returning
        // drops the others, which kills them.
        let mut members = Vec::with_capacity(size);
        for (i, &(port, _, _)) in ports.iter().enumerate() {
            let id = i + 1;
            let dir = temp_dir()?;
            let servers = servers_of(id)?;
            let spec = server_spec(dir.path(), port, Some((id, &servers)), QUORUM_MAIN)?;
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let process = ServerProcess::spawn(
                format!("ZooKeeper server.{id} on {addr}"),
                spec,
                Box::new(move || srvr(addr).map(drop)),
                READY_TIMEOUT,
                dir,
                "zookeeper.log",
            )?;
            members.push(ZooKeeperMember { process, id, port });
        }
        for m in &members {
            m.process.await_startup()?;
        }
        Ok(ZooKeeperEnsemble { members, links })
    }

    /// The members, by id.
    pub fn members(&self) -> &[ZooKeeperMember] {
        &self.members
    }

    /// The member that says it leads, if one does now.
    pub fn leader(&self) -> Option<&ZooKeeperMember> {
        self.members
            .iter()
            .find(|m| m.mode().is_ok_and(|mode| mode == "leader"))
    }

    /// A polylock URL of the ensemble: `zk://` + the connect string, with
    /// the ensemble's true [`follower_lag`](Self::follower_lag) (a URL
    /// naming several servers defaults to a bound for ZooKeeper's sample
    /// configuration, above the longest session these servers grant).
    pub fn url(&self) -> String {
        format!(
            "zk://{}?follower_lag={}ms",
            self.connect_string(),
            self.follower_lag().as_millis()
        )
    }

    /// The client connect string, `127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Sends the `srvr` four-letter word; a serving server's reply has a
/// `Mode:` line, while one still starting says it is not serving requests.
fn srvr(addr: SocketAddr) -> std::result::Result<String, String> {
    let reply = tcp_exchange(addr, b"srvr", PROBE_TIMEOUT, |_| false)?;
    let text = String::from_utf8_lossy(&reply).into_owned();
    if text.contains("Mode: ") {
        Ok(text)
    } else {
        Err(format!("srvr answered {:?}", text.trim()))
    }
}

/// `java` from `$JAVA_HOME/bin` or the usual places.
fn find_java() -> Result<PathBuf> {
    let extra: Vec<PathBuf> = std::env::var_os("JAVA_HOME")
        .map(|home| vec![PathBuf::from(home).join("bin")])
        .unwrap_or_default();
    find_binary("java", "default-jre-headless", &extra)
}
