//! The one piece every server uses: spawn a child process, wait until it
//! answers, pause/resume/kill/restart it, and clean up on drop.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::error::{Error, Result};

/// How often readiness is re-checked while a server starts.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// How much of a server's log is quoted in error messages.
const LOG_TAIL_BYTES: u64 = 3000;

/// Directories searched for binaries besides `$PATH`: Debian puts daemons in
/// sbin, which is not on a non-root user's `$PATH`.
const SBIN_DIRS: &[&str] = &["/usr/local/sbin", "/usr/sbin", "/sbin"];

/// Watches for the test process to die and then kills the server's process
/// group and removes its temp dir.
///
/// Drop does the cleanup in the normal case, but a server kept in a `static`
/// is never dropped, and a test binary killed by a signal or Ctrl-C runs no
/// destructors; without this, such servers (JVMs in particular) outlive the
/// test run. The reaper blocks reading a pipe whose only writer is the test
/// process; when that process exits for any reason the pipe reaches EOF.
/// It ignores terminal signals so Ctrl-C on the test run cannot kill it first.
///
/// PostgreSQL's children leave the postmaster's process group (setsid), so
/// the group is frozen first and its leader's direct children are killed by
/// parent pid before the group itself.
const REAPER_SCRIPT: &str = r#"trap '' INT TERM HUP QUIT
while read -r _; do :; done
kill -STOP -"$1" 2>/dev/null
pkill -KILL -P "$1" 2>/dev/null
kill -9 -"$1" 2>/dev/null
i=0
while kill -0 -"$1" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i+1)); done
[ -n "$2" ] && rm -rf -- "$2"
"#;

/// Readiness check: `Ok` when the server answers, otherwise a short
/// description of what the probe saw, quoted if start-up times out.
pub(crate) type Probe = Box<dyn Fn() -> std::result::Result<(), String> + Send + Sync>;

/// Finds `binary` in `extra_dirs` (searched first, e.g. PostgreSQL's
/// versioned directory), `$PATH`, or the sbin directories.
///
/// The error names the binary and the Debian `package` to install.
pub(crate) fn find_binary(
    binary: &str,
    package: &'static str,
    extra_dirs: &[PathBuf],
) -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = extra_dirs.to_vec();
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.extend(SBIN_DIRS.iter().map(PathBuf::from));
    for dir in &dirs {
        let candidate = dir.join(binary);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    Err(Error::MissingBinary {
        binary: binary.to_owned(),
        package,
        searched: if dirs.is_empty() {
            "no directories".to_owned()
        } else {
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        },
    })
}

/// Checks that a file the server needs (not a program) exists.
pub(crate) fn require_file(path: &Path, package: &'static str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(Error::MissingBinary {
            binary: path.display().to_string(),
            package,
            searched: path.display().to_string(),
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `$PATH` for spawned programs: the caller's, plus sbin so that scripts such
/// as `mariadb-install-db` find the daemons they call.
fn child_path() -> OsString {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_else(|| vec!["/usr/local/bin".into(), "/usr/bin".into(), "/bin".into()]);
    for sbin in SBIN_DIRS {
        if !dirs.iter().any(|d| d == Path::new(sbin)) {
            dirs.push(PathBuf::from(sbin));
        }
    }
    std::env::join_paths(dirs).unwrap_or_else(|_| OsString::from("/usr/bin:/bin:/usr/sbin:/sbin"))
}

/// How to run a program: kept so that a restart runs exactly the same thing.
#[derive(Debug, Clone)]
pub(crate) struct CommandSpec {
    program: PathBuf,
    args: Vec<OsString>,
    cwd: Option<PathBuf>,
    user: Option<(u32, u32)>,
    /// Set after the environment is cleared (a faked clock's variables).
    envs: Vec<(OsString, OsString)>,
}

impl CommandSpec {
    pub(crate) fn new(program: impl Into<PathBuf>) -> Self {
        CommandSpec {
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            user: None,
            envs: Vec::new(),
        }
    }

    /// Adds environment variables, kept across restarts.
    pub(crate) fn envs<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        self.envs.extend(
            vars.into_iter()
                .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())),
        );
        self
    }

    pub(crate) fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub(crate) fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub(crate) fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Runs the program as this uid/gid (for PostgreSQL, which refuses root).
    pub(crate) fn user(mut self, user: Option<(u32, u32)>) -> Self {
        self.user = user;
        self
    }

    pub(crate) fn program(&self) -> &Path {
        &self.program
    }

    /// A short human-readable name for messages: the program's file name.
    pub(crate) fn program_name(&self) -> String {
        self.program
            .file_name()
            .unwrap_or(self.program.as_os_str())
            .to_string_lossy()
            .into_owned()
    }

    /// Builds the `Command`. The environment is cleared except `$PATH` (etcd
    /// reads every `ETCD_*` variable as a flag, libpq every `PG*`, the MariaDB
    /// client `MYSQL_*`), and the child gets its own process group so that
    /// signals reach every process it forks and nothing from the terminal does.
    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .env_clear()
            .env("PATH", child_path())
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// Runs the command to completion, failing on a non-zero exit or after
    /// `timeout`. `step` describes what is being done, for the error message.
    pub(crate) fn run_checked(&self, step: &str, timeout: Duration) -> Result<Output> {
        let step = format!("{step} (`{}`)", self.program_name());
        let output = run_with_timeout_named(&mut self.command(), timeout, &step)?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(Error::Command {
                step,
                detail: describe_output(&output),
            })
        }
    }
}

/// Exit status plus the captured output, trimmed, for error messages.
pub(crate) fn describe_output(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    format!(
        "{}; stdout: {:?}; stderr: {:?}",
        output.status,
        tail_str(stdout.trim(), 1500),
        tail_str(stderr.trim(), 1500)
    )
}

fn tail_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Runs `cmd` to completion with a deadline, capturing stdout and stderr.
///
/// A non-zero exit is not an error here: inspect [`Output::status`]. The
/// command is put in its own process group (overriding any earlier setting),
/// so that on timeout it and everything it spawned are killed with SIGKILL,
/// and [`Error::TimedOut`] is returned. Stdin is `/dev/null`.
///
/// Useful in tests to run client programs (`redis-cli`, `psql`, `etcdctl`)
/// against a server that may be paused, where the client could otherwise
/// hang forever.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let step = format!("`{}`", cmd.get_program().to_string_lossy());
    run_with_timeout_named(cmd, timeout, &step)
}

fn run_with_timeout_named(cmd: &mut Command, timeout: Duration, step: &str) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|source| Error::Spawn {
        what: step.to_owned(),
        program: PathBuf::from(cmd.get_program()),
        source,
    })?;

    // Pipes are drained on threads so a chatty child cannot block on a full
    // pipe while we poll for its exit.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());

    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                kill_group_and_wait(&mut child);
                return Err(Error::TimedOut {
                    step: step.to_owned(),
                    timeout,
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                kill_group_and_wait(&mut child);
                return Err(Error::io(format!("waiting for {step}"), e));
            }
        }
    };
    // A grandchild that inherited the pipes could keep them open; do not let
    // that block us for long.
    let grace = Duration::from_secs(2);
    Ok(Output {
        status,
        stdout: stdout.recv_timeout(grace).unwrap_or_default(),
        stderr: stderr.recv_timeout(grace).unwrap_or_default(),
    })
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            // A read error just ends the capture; the exit status still tells
            // whether the command worked.
            let _ = pipe.read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// SIGKILLs the child's whole process group and reaps the child.
fn kill_group_and_wait(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(pgid) = i32::try_from(child.id()) {
        // ESRCH just means everything is gone already.
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    // In case the child moved itself to another process group.
    let _ = child.kill();
    child.wait().ok()
}

/// Connects to `addr`, sends `request`, and reads the reply until `complete`
/// says it is whole or the peer closes, all within `timeout`.
///
/// Used by readiness probes: every step has a timeout because a server that
/// is starting (or paused) may accept a connection and never answer.
pub(crate) fn tcp_exchange(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
    complete: impl Fn(&[u8]) -> bool,
) -> std::result::Result<Vec<u8>, String> {
    let deadline = Instant::now() + timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    if !request.is_empty() {
        stream
            .set_write_timeout(Some(timeout))
            .and_then(|()| stream.write_all(request))
            .map_err(|e| format!("send to {addr}: {e}"))?;
    }
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if complete(&reply) {
            return Ok(reply);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(format!(
                "no complete reply from {addr} within {timeout:?} (got {:?})",
                String::from_utf8_lossy(&reply)
            ));
        }
        stream
            .set_read_timeout(Some(remaining))
            .map_err(|e| format!("set read timeout: {e}"))?;
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(reply),
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(format!(
                    "reading from {addr}: {e} (got {:?})",
                    String::from_utf8_lossy(&reply)
                ))
            }
        }
    }
}

/// What a [`ServerProcess`] is doing right now.
struct State {
    /// The server's process; its pid is also its process group id.
    child: Option<Child>,
    /// The watchdog that cleans up if the test process dies (see
    /// [`REAPER_SCRIPT`]).
    reaper: Option<Child>,
    paused: bool,
}

/// A real server running as a child process, with the controls tests need
/// to inject faults: pause (SIGSTOP), resume (SIGCONT), kill (SIGKILL) and
/// restart on the same port with the same data directory.
///
/// Every server type in this crate wraps one of these and exposes its
/// controls; generic fault-injection code can take `&ServerProcess` (see each
/// server's `process()` method).
///
/// Signals go to the server's whole process group and to every process
/// descended from it, so that for PostgreSQL (whose children leave the
/// group) the backends freeze or die together with the postmaster, like a
/// machine that hangs or crashes.
///
/// Dropping it kills the process group and then removes the temp directory
/// holding the data and the log.
pub struct ServerProcess {
    name: String,
    spec: CommandSpec,
    probe: Probe,
    ready_timeout: Duration,
    log_path: PathBuf,
    state: Mutex<State>,
    /// Dropped after `Drop::drop` has killed the process.
    dir: TempDir,
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess")
            .field("name", &self.name)
            .field("program", &self.spec.program())
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl ServerProcess {
    /// Spawns the server but does not wait for it; see [`Self::wait_ready`].
    /// Needed for clusters, whose members only become healthy together.
    ///
    /// Output goes to `log_name` inside `dir`; `dir` is removed on drop.
    pub(crate) fn spawn(
        name: impl Into<String>,
        spec: CommandSpec,
        probe: Probe,
        ready_timeout: Duration,
        dir: TempDir,
        log_name: &str,
    ) -> Result<Self> {
        let process = ServerProcess {
            name: name.into(),
            log_path: dir.path().join(log_name),
            spec,
            probe,
            ready_timeout,
            state: Mutex::new(State {
                child: None,
                reaper: None,
                paused: false,
            }),
            dir,
        };
        process.spawn_locked(&mut process.lock())?;
        Ok(process)
    }

    /// Spawns the server and waits until its readiness probe passes. On
    /// failure everything spawned is killed and the directory removed.
    pub(crate) fn start(
        name: impl Into<String>,
        spec: CommandSpec,
        probe: Probe,
        ready_timeout: Duration,
        dir: TempDir,
        log_name: &str,
    ) -> Result<Self> {
        let process = Self::spawn(name, spec, probe, ready_timeout, dir, log_name)?;
        process.wait_ready_locked(&mut process.lock(), process.ready_timeout, true)?;
        Ok(process)
    }

    /// The server's name as used in messages, e.g. `redis-server on 127.0.0.1:20123`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The temp directory holding this server's data, config and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file the server's stdout and stderr go to (appended across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last few kilobytes of the server's log, for diagnosing a failed test.
    pub fn log_tail(&self) -> String {
        read_tail(&self.log_path).unwrap_or_else(|e| format!("(log unreadable: {e})"))
    }

    /// The pid of the running server (also its process group id), or `None`
    /// after [`kill`](Self::kill) or if it exited on its own.
    pub fn pid(&self) -> Option<u32> {
        let mut st = self.lock();
        Self::reap_if_exited(&mut st);
        st.child.as_ref().map(Child::id)
    }

    /// Whether the server process is alive (paused counts as alive).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Whether the server is currently stopped by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// Runs the readiness probe once: `true` if the server answers now.
    pub fn is_ready(&self) -> bool {
        (self.probe)().is_ok()
    }

    /// Freezes the server with SIGSTOP: connections stay open and the kernel
    /// still accepts new ones, but nothing is answered until [`resume`](Self::resume).
    pub fn pause(&self) -> Result<()> {
        let mut st = self.lock();
        let pgid = self.running_pgid(&mut st, "pause")?;
        // The group first: once the leader is stopped it cannot fork, so the
        // list of descendants taken next is complete.
        self.signal(pgid, Signal::SIGSTOP)?;
        signal_descendants(pgid, Signal::SIGSTOP);
        st.paused = true;
        Ok(())
    }

    /// Continues a paused server with SIGCONT. Resuming a running server is a no-op.
    pub fn resume(&self) -> Result<()> {
        let mut st = self.lock();
        let pgid = self.running_pgid(&mut st, "resume")?;
        signal_descendants(pgid, Signal::SIGCONT);
        self.signal(pgid, Signal::SIGCONT)?;
        st.paused = false;
        Ok(())
    }

    /// Kills the server with SIGKILL (also when paused) and waits until it is
    /// gone. The data directory stays for [`restart`](Self::restart). Killing
    /// a server that is not running is a no-op.
    pub fn kill(&self) -> Result<()> {
        self.kill_locked(&mut self.lock())
    }

    /// Kills the server if it runs, starts it again with the same command
    /// line (same port, same data directory) and waits until it is ready.
    pub fn restart(&self) -> Result<()> {
        let mut st = self.lock();
        self.kill_locked(&mut st)?;
        self.spawn_locked(&mut st)?;
        self.wait_ready_locked(&mut st, self.ready_timeout, true)
    }

    /// Waits until the readiness probe passes, e.g. after [`resume`](Self::resume)
    /// or after killing a cluster peer. Unlike start-up and
    /// [`restart`](Self::restart), a timeout here leaves the server running.
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        self.wait_ready_locked(&mut self.lock(), timeout, false)
    }

    /// Like [`wait_ready`](Self::wait_ready) with the start-up timeout, but
    /// kills the server if it does not become ready: for clusters, whose
    /// members are spawned first and awaited afterwards.
    pub(crate) fn await_startup(&self) -> Result<()> {
        self.wait_ready_locked(&mut self.lock(), self.ready_timeout, true)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent enough
        // to kill the process, which is all Drop needs.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spawn_locked(&self, st: &mut State) -> Result<()> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| Error::io(format!("opening log {}", self.log_path.display()), e))?;
        // Marks restarts in the log; losing this line would be harmless.
        let _ = writeln!(log, "==== testkit: starting {} ====", self.name);
        let log_err = log
            .try_clone()
            .map_err(|e| Error::io(format!("duplicating log handle for {}", self.name), e))?;

        let child = self
            .spec
            .command()
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| Error::Spawn {
                what: self.name.clone(),
                program: self.spec.program().to_path_buf(),
                source,
            })?;
        // Best effort: without the reaper cleanup still happens on drop.
        st.reaper = spawn_reaper(child.id(), self.dir.path()).ok();
        st.child = Some(child);
        st.paused = false;
        Ok(())
    }

    /// Polls the probe until it passes. `kill_on_timeout` is set when the
    /// server was just spawned: a server that never became ready must not be
    /// left behind (orphaned JVMs were seen otherwise).
    fn wait_ready_locked(
        &self,
        st: &mut State,
        timeout: Duration,
        kill_on_timeout: bool,
    ) -> Result<()> {
        if st.paused {
            return Err(self.invalid("wait until ready", "the server is paused; resume it first"));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let Some(child) = st.child.as_mut() else {
                return Err(self.invalid("wait until ready", "the server is not running"));
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    // Members of its process group may still run.
                    let _ = self.kill_locked(st);
                    return Err(Error::ExitedEarly {
                        what: self.name.clone(),
                        status,
                        log: self.log_excerpt(),
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = self.kill_locked(st);
                    return Err(Error::io(format!("waiting for {}", self.name), e));
                }
            }
            let last_probe = match (self.probe)() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let now = Instant::now();
            if now >= deadline {
                if kill_on_timeout {
                    let _ = self.kill_locked(st);
                }
                return Err(Error::NotReady {
                    what: self.name.clone(),
                    timeout,
                    killed: kill_on_timeout,
                    last_probe,
                    log: self.log_excerpt(),
                });
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }

    fn kill_locked(&self, st: &mut State) -> Result<()> {
        let result = match st.child.take() {
            Some(mut child) => {
                let pgid = i32::try_from(child.id()).ok();
                // Freeze the group so that the list of descendants is
                // complete and they stay our descendants (once the leader
                // dies they would be re-parented out of reach).
                let descendants = pgid
                    .map(|pgid| {
                        let _ = killpg(Pid::from_raw(pgid), Signal::SIGSTOP);
                        let descendants = descendants(pgid);
                        for &pid in &descendants {
                            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
                        }
                        descendants
                    })
                    .unwrap_or_default();
                let status = kill_group_and_wait(&mut child);
                if let Some(pgid) = pgid {
                    wait_all_gone(pgid, &descendants);
                }
                match status {
                    Some(_) => Ok(()),
                    None => Err(Error::io(
                        format!("reaping killed {}", self.name),
                        io::Error::other("wait() failed"),
                    )),
                }
            }
            None => Ok(()),
        };
        if let Some(mut reaper) = st.reaper.take() {
            // SIGKILL cannot be trapped, so the reaper never gets to delete
            // the directory that a restart still needs.
            let _ = reaper.kill();
            let _ = reaper.wait();
        }
        st.paused = false;
        result
    }

    /// Forgets a child that exited by itself, so controls report "not running".
    fn reap_if_exited(st: &mut State) {
        if let Some(child) = st.child.as_mut() {
            if matches!(child.try_wait(), Ok(Some(_))) {
                st.child = None;
            }
        }
    }

    fn running_pgid(&self, st: &mut State, operation: &'static str) -> Result<i32> {
        Self::reap_if_exited(st);
        let child = st.child.as_ref().ok_or_else(|| {
            self.invalid(operation, "the server is not running (killed or exited)")
        })?;
        i32::try_from(child.id()).map_err(|_| self.invalid(operation, "pid out of range"))
    }

    fn signal(&self, pgid: i32, signal: Signal) -> Result<()> {
        killpg(Pid::from_raw(pgid), signal).map_err(|source| Error::Signal {
            what: self.name.clone(),
            signal: signal.as_str(),
            pgid,
            source,
        })
    }

    fn invalid(&self, operation: &'static str, reason: &'static str) -> Error {
        Error::InvalidState {
            what: self.name.clone(),
            operation,
            reason,
        }
    }

    fn log_excerpt(&self) -> String {
        match read_tail(&self.log_path) {
            Ok(tail) if !tail.trim().is_empty() => {
                format!(
                    "\n--- end of {} ---\n{}",
                    self.log_path.display(),
                    tail.trim_end()
                )
            }
            _ => String::new(),
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.kill_locked(&mut self.lock());
    }
}

/// Waits (briefly) until no process of the group and none of the listed
/// descendants is left, so that a restart does not race with dying
/// children, e.g. PostgreSQL refusing to start while an old backend still
/// holds the shared memory segment.
fn wait_all_gone(pgid: i32, descendants: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let group_gone = killpg(Pid::from_raw(pgid), None).is_err();
        if group_gone && descendants.iter().all(|&pid| !is_alive(pid)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Alive means it exists and is not a zombie: a zombie has released
/// everything (ports, shared memory) and only waits to be reaped by init.
fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat_fields(&stat).is_some_and(|(state, _)| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// State and parent pid from the text of `/proc/PID/stat`. The command name
/// in parentheses may itself contain spaces and parentheses, so fields are
/// counted from the last `)`.
fn stat_fields(stat: &str) -> Option<(&str, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// All processes descended from `root`, from `/proc`.
///
/// Signalling the process group is not enough: PostgreSQL's backends and
/// auxiliary processes each call setsid(), so a "paused" postmaster would
/// otherwise leave existing connections fully working.
fn descendants(root: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        // Processes can vanish while we look; they need no signal then.
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
            if let Some((_, ppid)) = stat_fields(&stat) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(parent) = queue.pop() {
        for &child in children.get(&parent).map(Vec::as_slice).unwrap_or_default() {
            found.push(child);
            queue.push(child);
        }
    }
    found
}

/// Sends `signal` to every descendant of `root`; ones that exited meanwhile
/// are skipped silently.
fn signal_descendants(root: i32, signal: Signal) {
    for pid in descendants(root) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
    }
}

fn spawn_reaper(pgid: u32, dir: &Path) -> io::Result<Child> {
    Command::new("/bin/sh")
        .arg("-c")
        .arg(REAPER_SCRIPT)
        .arg("testkit-reaper")
        .arg(pgid.to_string())
        .arg(dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

fn read_tail(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Generates the control methods of a server type by delegating to its
/// [`ServerProcess`], so that every server has the same documented controls
/// without copies of the code.
macro_rules! server_controls {
    ($ty:ty, $($field:ident).+) => {
        impl $ty {
            /// The underlying process, for generic fault-injection helpers.
            pub fn process(&self) -> &$crate::ServerProcess {
                &self.$($field).+
            }

            /// Freezes the server with SIGSTOP (its process group and all its
            /// descendants): connections stay open, nothing is answered until
            /// [`resume`](Self::resume).
            pub fn pause(&self) -> $crate::Result<()> {
                self.$($field).+.pause()
            }

            /// Continues a paused server with SIGCONT.
            pub fn resume(&self) -> $crate::Result<()> {
                self.$($field).+.resume()
            }

            /// Kills the server with SIGKILL and waits until it is gone; the
            /// data directory is kept for [`restart`](Self::restart).
            pub fn kill(&self) -> $crate::Result<()> {
                self.$($field).+.kill()
            }

            /// Kills the server if it runs and starts it again on the same
            /// port with the same data directory, waiting until it is ready.
            pub fn restart(&self) -> $crate::Result<()> {
                self.$($field).+.restart()
            }

            /// The server's pid (also its process group id), `None` after
            /// [`kill`](Self::kill).
            pub fn pid(&self) -> Option<u32> {
                self.$($field).+.pid()
            }

            /// Waits until the server answers its readiness probe again,
            /// e.g. after [`resume`](Self::resume); on timeout it keeps running.
            pub fn wait_ready(&self, timeout: std::time::Duration) -> $crate::Result<()> {
                self.$($field).+.wait_ready(timeout)
            }

            /// Probes the server once: `true` if it answers right now.
            pub fn is_ready(&self) -> bool {
                self.$($field).+.is_ready()
            }
        }
    };
}
pub(crate) use server_controls;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_error_names_binary_package_and_script() {
        let err = find_binary("testkit-no-such-binary", "some-debian-package", &[])
            .expect_err("binary cannot exist");
        let message = err.to_string();
        assert!(message.contains("`testkit-no-such-binary`"), "{message}");
        assert!(message.contains("`some-debian-package`"), "{message}");
        assert!(message.contains("scripts/install-deps.sh"), "{message}");
    }

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let stat = "4242 (we (ird) name) S 17 4242 4242 0 -1 4194560 0 0";
        assert_eq!(stat_fields(stat), Some(("S", 17)));
        assert_eq!(stat_fields("garbage"), None);
    }

    #[test]
    fn descendants_of_a_shell_include_its_children() {
        let mut child = Command::new("/bin/sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        let root = i32::try_from(child.id()).expect("pid fits i32");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut found = Vec::new();
        while found.len() < 2 && Instant::now() < deadline {
            found = descendants(root);
            std::thread::sleep(Duration::from_millis(10));
        }
        kill_group_and_wait(&mut child);
        assert_eq!(found.len(), 2, "expected two sleeps, found {found:?}");
    }

    #[test]
    fn run_with_timeout_kills_slow_commands() {
        let started = Instant::now();
        let err = run_with_timeout(Command::new("sleep").arg("30"), Duration::from_millis(200))
            .expect_err("sleep 30 must time out");
        assert!(matches!(err, Error::TimedOut { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));

        let output = run_with_timeout(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(5),
        )
        .expect("sh runs");
        assert_eq!(output.status.code(), Some(3));
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");
    }
}
