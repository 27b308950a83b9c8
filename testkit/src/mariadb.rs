//! A real MariaDB server.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::unistd::Uid;

use crate::clock::FakeClock;
use crate::error::{Error, Result};
use crate::ports::{on_fresh_ports, try_free_port};
use crate::process::{find_binary, server_controls, tcp_exchange, CommandSpec, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The default redo log is 96 MiB per server; tests need far less disk.
/// Server and install must agree, or the server resizes it at start-up.
const INNODB_LOG_FILE_SIZE: &str = "--innodb-log-file-size=8M";

/// The user and database created for tests.
const USER: &str = "polylock";
const DATABASE: &str = "polylock";
/// Fixed so that a failing test's URL can be pasted into a client as is.
const PASSWORD: &str = "s3cret-pw";

/// A MariaDB server on a free port of 127.0.0.1 with a fresh data directory,
/// a database `polylock` and a user `polylock` (at `127.0.0.1` and `%`) with
/// a password and all privileges on it.
///
/// The server reads no option files (`--no-defaults`) and resolves no host
/// names. Its Unix socket lives in the temp directory, where `root` connects
/// without a password, for test set-up.
#[derive(Debug)]
pub struct MariaDbServer {
    process: ServerProcess,
    port: u16,
    socket: PathBuf,
}

server_controls!(MariaDbServer, process);

impl MariaDbServer {
    /// Runs `mariadb-install-db`, starts `mariadbd`, waits until it sends
    /// its handshake, and creates the `polylock` database and user.
    pub fn start() -> Result<MariaDbServer> {
        Self::start_inner(None)
    }

    /// Like [`start`](Self::start), with `mariadbd` on `clock`'s wall
    /// clock (`NOW()`, `UTC_TIMESTAMP()`), which the SQL backend judges
    /// expiry by.
    pub fn start_with_clock(clock: &FakeClock) -> Result<MariaDbServer> {
        Self::start_inner(Some(clock))
    }

    /// Tried again on fresh ports when another process took this one
    /// first (ports.rs, `on_fresh_ports`).
    fn start_inner(clock: Option<&FakeClock>) -> Result<MariaDbServer> {
        on_fresh_ports(|| Self::start_once(clock))
    }

    fn start_once(clock: Option<&FakeClock>) -> Result<MariaDbServer> {
        let install_db = find_binary("mariadb-install-db", "mariadb-server", &[])?;
        let mariadbd = find_binary("mariadbd", "mariadb-server", &[])?;
        let client = find_binary("mariadb", "mariadb-client", &[])?;

        let dir = tempfile::Builder::new()
            .prefix("testkit-mariadb-")
            .tempdir()
            .map_err(|e| Error::io("creating a temp dir for MariaDB", e))?;
        let data_dir = dir.path().join("data");
        let socket = dir.path().join("mariadb.sock");
        let datadir_arg = format!("--datadir={}", data_dir.display());
        // As root, mariadbd insists on being told that root is intended.
        let user_arg: &[&str] = if Uid::effective().is_root() {
            &["--user=root"]
        } else {
            &[]
        };

        CommandSpec::new(install_db)
            .args(["--no-defaults", &datadir_arg])
            .args(user_arg)
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                INNODB_LOG_FILE_SIZE,
            ])
            .cwd(dir.path())
            .run_checked("initializing the MariaDB data directory", SETUP_TIMEOUT)?;

        // mariadbd keeps on-disk internal temporary tables (the Aria files
        // behind an information_schema query, say) in its tmpdir, /tmp by
        // default, shared with every other process: CI once saw such a file
        // vanish under a running query ("Error on delete of
        // '/tmp/#sql-temptable-…'", ENOENT). Each server gets its own.
        let tmp_dir = dir.path().join("tmp");
        std::fs::create_dir(&tmp_dir)
            .map_err(|e| Error::io("creating MariaDB's temporary directory", e))?;

        let port = try_free_port()?;
        // innodb_flush_log_at_trx_commit=2 writes the log at each commit
        // without fsync: a SIGKILL loses nothing, only a machine crash would.
        let spec = CommandSpec::new(mariadbd)
            .args(["--no-defaults", &datadir_arg])
            .args(user_arg)
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
            ])
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--tmpdir={}", tmp_dir.display()))
            .arg(format!(
                "--pid-file={}",
                dir.path().join("mariadbd.pid").display()
            ))
            .args([
                INNODB_LOG_FILE_SIZE,
                "--innodb-flush-log-at-trx-commit=2",
                "--max-connections=500",
            ])
            .envs(clock.map(FakeClock::env).unwrap_or_default())
            .cwd(dir.path());
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let process = ServerProcess::start(
            format!("MariaDB on {addr}"),
            spec,
            Box::new(move || handshake(addr)),
            READY_TIMEOUT,
            dir,
            "mariadb.log",
        )?;

        let server = MariaDbServer {
            process,
            port,
            socket,
        };
        let sql = format!(
            "CREATE DATABASE {DATABASE}; \
             CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
             CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'127.0.0.1'; \
             GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'%';"
        );
        // If this fails, dropping `server` kills mariadbd.
        CommandSpec::new(client)
            .arg("--no-defaults")
            .arg(format!("--socket={}", server.socket.display()))
            .args(["--user=root", "--connect-timeout=5", "-e", &sql])
            .run_checked("creating the polylock database and user", SETUP_TIMEOUT)?;
        Ok(server)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The user tests connect as: `polylock`.
    pub fn user(&self) -> &str {
        USER
    }

    /// The user's password.
    pub fn password(&self) -> &str {
        PASSWORD
    }

    /// The database created for tests: `polylock`.
    pub fn database(&self) -> &str {
        DATABASE
    }

    /// `mysql://polylock:PASSWORD@127.0.0.1:port/polylock`.
    pub fn url(&self) -> String {
        format!(
            "mysql://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    /// The server's Unix socket, where `root` connects without a password.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

/// Reads the greeting MariaDB sends on connect. It only listens once start-up
/// is complete; the first payload byte is the protocol version (10), or 0xff
/// for an error packet (e.g. too many connections).
fn handshake(addr: SocketAddr) -> std::result::Result<(), String> {
    let reply = tcp_exchange(addr, b"", PROBE_TIMEOUT, |r| r.len() >= 5)?;
    match reply.get(4) {
        Some(10) => Ok(()),
        Some(_) => Err(format!(
            "unexpected greeting {:?}",
            String::from_utf8_lossy(reply.get(4..).unwrap_or_default())
        )),
        None => Err("connection closed before the greeting".to_owned()),
    }
}
