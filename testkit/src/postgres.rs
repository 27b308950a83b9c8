//! A real PostgreSQL server.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::unistd::{Uid, User};

use crate::clock::FakeClock;
use crate::error::{Error, Result};
use crate::ports::{on_fresh_ports, try_free_port};
use crate::process::{find_binary, run_with_timeout, server_controls, CommandSpec, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The role and database created for tests.
const USER: &str = "polylock";
const DATABASE: &str = "polylock";
/// Fixed so that a failing test's URL can be pasted into `psql` as is.
const PASSWORD: &str = "s3cret-pw";

/// A PostgreSQL server on a free port of 127.0.0.1 with a fresh cluster in
/// a temp directory, a database `polylock` owned by the role `polylock`, and
/// password (SCRAM) authentication for every TCP connection.
///
/// PostgreSQL refuses to run as root, so when the tests run as root,
/// `initdb` and `postgres` run as the `postgres` OS user (the pid held is
/// still the postmaster's). The Unix socket lives in the temp directory and
/// accepts the superuser `postgres` without a password, for test set-up.
#[derive(Debug)]
pub struct PostgresServer {
    process: ServerProcess,
    port: u16,
    socket_dir: PathBuf,
    /// The test CA that signed the server's certificate, with TLS on.
    tls_ca: Option<PathBuf>,
}

server_controls!(PostgresServer, process);

impl PostgresServer {
    /// Runs `initdb`, starts `postgres`, waits until `pg_isready` says it
    /// accepts connections, and creates the `polylock` role and database.
    pub fn start() -> Result<PostgresServer> {
        Self::start_inner(false, None)
    }

    /// Like [`start`](Self::start), with the postmaster and every backend
    /// on `clock`'s wall clock (`now()`, `clock_timestamp()`), which the
    /// SQL backend judges expiry by.
    pub fn start_with_clock(clock: &FakeClock) -> Result<PostgresServer> {
        Self::start_inner(false, Some(clock))
    }

    /// Like [`start`](Self::start), with TLS on: a certificate for
    /// `localhost`/127.0.0.1 signed by a test CA ([`tls_ca`](Self::tls_ca)),
    /// made by `openssl`. Clients may connect with or without TLS
    /// (`sslmode=require` makes it mandatory on their side, `verify-full`
    /// with the CA also checks the certificate).
    pub fn start_with_tls() -> Result<PostgresServer> {
        Self::start_inner(true, None)
    }

    /// Tried again on fresh ports when another process took this one
    /// first (ports.rs, `on_fresh_ports`).
    fn start_inner(tls: bool, clock: Option<&FakeClock>) -> Result<PostgresServer> {
        on_fresh_ports(|| Self::start_once(tls, clock))
    }

    fn start_once(tls: bool, clock: Option<&FakeClock>) -> Result<PostgresServer> {
        let bin_dirs = versioned_bin_dirs();
        let initdb = find_binary("initdb", "postgresql", &bin_dirs)?;
        let postgres = find_binary("postgres", "postgresql", &bin_dirs)?;
        let pg_isready = find_binary("pg_isready", "postgresql-client", &bin_dirs)?;
        let psql = find_binary("psql", "postgresql-client", &bin_dirs)?;
        let os_user = server_os_user()?;

        let dir = tempfile::Builder::new()
            .prefix("testkit-postgres-")
            .tempdir()
            .map_err(|e| Error::io("creating a temp dir for PostgreSQL", e))?;
        let data_dir = dir.path().join("data");
        let socket_dir = dir.path().join("sock");
        // The server user must be able to reach its directories inside our
        // (root-owned, 0700) temp dir; the data dir must be 0700 and its own.
        set_mode(dir.path(), 0o755)?;
        make_owned_dir(&data_dir, 0o700, os_user)?;
        make_owned_dir(&socket_dir, 0o755, os_user)?;

        CommandSpec::new(initdb)
            .arg("-D")
            .arg(&data_dir)
            .args([
                "--username=postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ])
            .args(["--encoding=UTF8", "--no-locale", "--no-sync"])
            .user(os_user)
            .cwd(dir.path())
            .run_checked("initializing the PostgreSQL data directory", SETUP_TIMEOUT)?;

        let mut tls_args = Vec::new();
        let mut tls_ca = None;
        if tls {
            let tls_dir = dir.path().join("tls");
            make_owned_dir(&tls_dir, 0o700, os_user)?;
            let certs = crate::tls::make_certs(&tls_dir, os_user)?;
            tls_args = vec![
                "-c".to_string(),
                "ssl=on".to_string(),
                "-c".to_string(),
                format!("ssl_cert_file={}", certs.cert.display()),
                "-c".to_string(),
                format!("ssl_key_file={}", certs.key.display()),
            ];
            tls_ca = Some(certs.ca);
        }

        let port = try_free_port()?;
        // fsync and full-page writes off: tests kill the process, never the
        // machine, and the page cache survives a SIGKILL. synchronous_commit
        // stays on: off would keep recent commits only in shared memory,
        // which a SIGKILL does lose.
        let spec = CommandSpec::new(postgres)
            .arg("-D")
            .arg(&data_dir)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", socket_dir.display()))
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=200", "-c", "logging_collector=off"])
            .args(&tls_args)
            .envs(clock.map(FakeClock::env).unwrap_or_default())
            .user(os_user)
            .cwd(dir.path());
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let process = ServerProcess::start(
            format!("PostgreSQL on {addr}"),
            spec,
            Box::new(move || is_ready(&pg_isready, port)),
            READY_TIMEOUT,
            dir,
            "postgres.log",
        )?;

        let server = PostgresServer {
            process,
            port,
            socket_dir,
            tls_ca,
        };
        // If this fails, dropping `server` kills the postmaster.
        CommandSpec::new(psql)
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&server.socket_dir)
            .args(["-p", &port.to_string(), "-U", "postgres", "-d", "postgres"])
            .arg("-c")
            .arg(format!("CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'"))
            .arg("-c")
            .arg(format!("CREATE DATABASE {DATABASE} OWNER {USER}"))
            .run_checked("creating the polylock role and database", SETUP_TIMEOUT)?;
        Ok(server)
    }

    /// The CA file (PEM) that signed the server's certificate, for a
    /// server started [with TLS](Self::start_with_tls).
    pub fn tls_ca(&self) -> Option<&Path> {
        self.tls_ca.as_deref()
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The role tests connect as: `polylock`.
    pub fn user(&self) -> &str {
        USER
    }

    /// The role's password.
    pub fn password(&self) -> &str {
        PASSWORD
    }

    /// The database created for tests: `polylock`.
    pub fn database(&self) -> &str {
        DATABASE
    }

    /// `postgres://polylock:PASSWORD@127.0.0.1:port/polylock`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    /// The directory holding the Unix socket, where the superuser `postgres`
    /// connects without a password (`psql -h DIR -p PORT -U postgres`).
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }
}

/// `pg_isready` over TCP: it distinguishes "accepting connections" from
/// "starting up", which a bare TCP connect cannot.
fn is_ready(pg_isready: &Path, port: u16) -> std::result::Result<(), String> {
    let mut cmd = Command::new(pg_isready);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", "2"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    match run_with_timeout(&mut cmd, PROBE_TIMEOUT) {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "pg_isready: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim()
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// Debian installs the server binaries in `/usr/lib/postgresql/VERSION/bin`;
/// newest version first.
fn versioned_bin_dirs() -> Vec<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .filter_map(|entry| {
                    let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
                    Some((version, entry.path().join("bin")))
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

/// The uid/gid to run the server as: `postgres` when we are root (the server
/// refuses root), otherwise ourselves (`None`).
fn server_os_user() -> Result<Option<(u32, u32)>> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    match User::from_name("postgres") {
        Ok(Some(user)) => Ok(Some((user.uid.as_raw(), user.gid.as_raw()))),
        Ok(None) => Err(Error::MissingBinary {
            binary: "OS user `postgres` (PostgreSQL refuses to run as root)".to_owned(),
            package: "postgresql",
            searched: "/etc/passwd".to_owned(),
        }),
        Err(e) => Err(Error::io("looking up the OS user `postgres`", e.into())),
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("chmod {mode:o} {}", path.display()), e))
}

fn make_owned_dir(path: &Path, mode: u32, owner: Option<(u32, u32)>) -> Result<()> {
    fs::create_dir(path).map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| Error::io(format!("chown {}", path.display()), e))?;
    }
    set_mode(path, mode)
}
