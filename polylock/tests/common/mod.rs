//! Helpers for the tests that spawn the `polylock` binary.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// `polylock` in `dir`, with `url` (None: the SQLite default).
pub(crate) fn polylock(dir: &Path, url: Option<&str>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_polylock"));
    c.current_dir(dir)
        .env_remove("POLYLOCK_URL")
        .env_remove("RUST_LOG");
    if let Some(url) = url {
        c.env("POLYLOCK_URL", url);
    }
    c
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(crate) fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn polylock")
}

/// Polls `cond` every 20 ms for up to `limit`; whether it became true.
pub(crate) fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Waits until `path` exists (the command writes it once it runs).
pub(crate) fn wait_file(path: &Path) {
    assert!(
        eventually(Duration::from_secs(20), || path.exists()),
        "{} never appeared",
        path.display()
    );
}

/// The pid the command wrote to `path` (`echo $$ > path`).
pub(crate) fn read_pid(path: &Path) -> Pid {
    wait_file(path);
    let mut s = String::new();
    assert!(eventually(Duration::from_secs(5), || {
        s = std::fs::read_to_string(path).unwrap_or_default();
        s.ends_with('\n')
    }));
    Pid::from_raw(s.trim().parse().expect("a pid"))
}

/// Kills `pid` when dropped: a process a failing test leaves behind (one
/// that ignores SIGTERM, say) must not keep running, nor hold the test
/// run's output pipes open.
pub(crate) struct KillOnDrop(pub(crate) Pid);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
    }
}

/// Whether `pid` runs: exists and is not a zombie (a process whose parent
/// died is reaped by init, which in a container may never happen).
pub(crate) fn alive(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X"))
}

/// `status NAME` exit code (0 held, 1 free).
pub(crate) fn status_code(dir: &Path, url: Option<&str>, name: &str) -> Option<i32> {
    output(polylock(dir, url).args(["status", name]))
        .status
        .code()
}

/// Starts `hold NAME` with stdin kept open; returns it and the fencing
/// token it printed.
pub(crate) fn start_hold(dir: &Path, url: Option<&str>, name: &str) -> (Child, u64) {
    start_hold_with(dir, url, name, &[])
}

/// `hold` takes the lock (status says held), prints a fence, and releases
/// it when its stdin closes.
pub(crate) fn hold_until_stdin_closes(dir: &Path, url: Option<&str>) {
    let (mut child, fence) = start_hold(dir, url, "held-by-hold");
    assert!(fence >= 1);
    assert_eq!(status_code(dir, url, "held-by-hold"), Some(0), "not held");
    // A second holder cannot get it meanwhile.
    let busy = output(polylock(dir, url).args(["run", "-n", "held-by-hold", "--", "true"]));
    assert_eq!(busy.status.code(), Some(75), "{}", text(&busy.stderr));
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        status_code(dir, url, "held-by-hold"),
        Some(1),
        "not released"
    );
}

/// `hold NAME` with `extra` flags; as [`start_hold`].
pub(crate) fn start_hold_with(
    dir: &Path,
    url: Option<&str>,
    name: &str,
    extra: &[&str],
) -> (Child, u64) {
    let mut child = polylock(dir, url)
        .arg("hold")
        .args(extra)
        .arg(name)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hold");
    let stdout: ChildStdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let fence = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("hold printed {line:?}"));
    (child, fence)
}

/// This host's name as the kernel has it (what polylock stores).
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("/proc/sys/kernel/hostname")
        .trim()
        .to_string()
}

/// Two `hold` processes under one prefix: `status` names each one's host,
/// pid and command, `list PREFIX` shows both (and nothing outside the
/// prefix), a `--no-meta` holder is shown without them, and once all are
/// released `list` finds nothing (exit 1).
pub(crate) fn holders_are_described_and_listed(dir: &Path, url: Option<&str>) {
    let host = host_name();
    let (mut a, _) = start_hold(dir, url, "described/a");
    let (mut b, _) = start_hold(dir, url, "described/b c");
    let (mut quiet, _) = start_hold_with(dir, url, "described-quiet", &["--no-meta"]);
    let out = output(polylock(dir, url).args(["status", "described/a"]));
    let s = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{s}{}", text(&out.stderr));
    assert!(s.contains(&format!("pid:           {}\n", a.id())), "{s}");
    assert!(s.contains(&format!("host:          {host}\n")), "{s}");
    assert!(s.contains("command:       polylock hold\n"), "{s}");
    assert!(s.contains("since:         ") && s.contains(" UTC ("), "{s}");
    assert!(s.contains("wake-up:       "), "{s}");
    let out = output(polylock(dir, url).args(["status", "described-quiet"]));
    let s = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{s}");
    assert!(
        !s.contains("pid:") && !s.contains("host:"),
        "--no-meta: {s}"
    );

    let out = output(polylock(dir, url).args(["list", "described/"]));
    let s = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{s}{}", text(&out.stderr));
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 2, "{s}");
    assert!(lines[0].starts_with("described/a  "), "{s}");
    assert!(lines[1].starts_with("described/b c  "), "{s}");
    assert!(
        lines[0].ends_with(&format!("pid {} on {host}", a.id())),
        "{s}"
    );
    assert!(
        lines[1].ends_with(&format!("pid {} on {host}", b.id())),
        "{s}"
    );
    let all = text(&output(polylock(dir, url).arg("list")).stdout);
    assert!(
        all.lines().any(|l| l.starts_with("described-quiet  ")),
        "{all}"
    );

    for child in [&mut a, &mut b, &mut quiet] {
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
    let out = output(polylock(dir, url).args(["list", "described"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}
