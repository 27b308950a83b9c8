//! Documented claims about the `polylock` command, checked as processes:
//! the exit codes of `run`, `hold` and `list` (exit_help.txt, main.rs),
//! the waiting count `status` shows (README, docs/migration.md), and the
//! config file's `ttl` and `wait` as the CLI's defaults (README).

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Whether `pid` catches `sig` (a handler installed: `SigCgt` in
/// /proc/PID/status). `run` listens to SIGINT, SIGTERM and SIGHUP just
/// before it starts waiting for the lock.
fn catches(pid: Pid, sig: Signal) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig as u64 - 1)) != 0)
}

/// The pid of a spawned polylock.
fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(child.id() as i32)
}

/// exit_help.txt: "the command's own exit code (128+N if it died of
/// signal N)".
#[test]
fn run_exits_128_plus_n_when_its_command_died_of_signal_n() {
    let dir = tempfile::tempdir().unwrap();
    for (sig, code) in [("KILL", 137), ("TERM", 143)] {
        let out = output(polylock(dir.path(), None).args([
            "run",
            "signalled",
            "--",
            "sh",
            "-c",
            &format!("kill -{sig} $$"),
        ]));
        assert_eq!(
            out.status.code(),
            Some(code),
            "SIG{sig}: {}",
            text(&out.stderr)
        );
    }
}

/// exit_help.txt: "128+N  polylock got signal N while waiting for the
/// lock; the command did not run".
#[test]
fn run_exits_128_plus_n_when_signalled_while_waiting_for_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (mut holder, _) = start_hold(dir.path(), None, "waited");
    let _holder_guard = KillOnDrop(pid_of(&holder));
    for (sig, code) in [(Signal::SIGINT, 130), (Signal::SIGTERM, 143)] {
        let ran = dir.path().join(format!("ran-{sig}"));
        let run = polylock(dir.path(), None)
            .args(["run", "-w", "60s", "waited", "--", "touch"])
            .arg(&ran)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = pid_of(&run);
        let _guard = KillOnDrop(pid);
        assert!(
            eventually(Duration::from_secs(20), || catches(pid, sig)),
            "run never listened to {sig}"
        );
        // Well into the wait.
        std::thread::sleep(Duration::from_millis(300));
        let sent = Instant::now();
        kill(pid, sig).unwrap();
        let out = run.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{sig}: {}",
            text(&out.stderr)
        );
        // Far below the 60 s wait.
        assert!(sent.elapsed() < Duration::from_secs(20), "{sig}");
        assert!(!ran.exists(), "{sig}: the command ran");
    }
    // The holder was not disturbed.
    assert_eq!(status_code(dir.path(), None, "waited"), Some(0));
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

/// exit_help.txt: "`hold` exits ... 76 if the lock was lost".
#[test]
fn hold_exits_76_when_its_lock_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (mut holder, _) = start_hold_with(dir.path(), None, "lost", &["--ttl", "3s"]);
    let _guard = KillOnDrop(pid_of(&holder));
    // Kept open: `hold` also ends (releasing) when its stdin closes, which
    // `wait_with_output` would do.
    let _stdin = holder.stdin.take();
    let out = output(polylock(dir.path(), None).args(["release", "--force", "lost"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let released = Instant::now();
    let out = holder.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{err}");
    // Noticed at the next renewal (a third of the TTL); generous.
    assert!(released.elapsed() < Duration::from_secs(15), "{err}");
    assert!(
        err.contains(
            "polylock: lock \"lost\" was lost: the lock service refused the renewal: the lease \
             is no longer ours"
        ),
        "{err}"
    );
}

/// main.rs (`list`'s help): "Backends that cannot enumerate their locks
/// say so (exit 64)". Redlock declares no `list`.
#[test]
fn list_exits_64_on_redlock_which_cannot_enumerate() {
    let dir = tempfile::tempdir().unwrap();
    let servers = testkit::RedisServer::start_independent(3, &[]).expect("start redis-servers");
    let url = format!("redlock://{}", testkit::RedisServer::host_list(&servers));
    // The nodes answer: a lock can be held through them.
    let out = output(polylock(dir.path(), Some(&url)).args(["run", "-n", "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for args in [&["list"][..], &["list", "reports/"]] {
        let out = output(polylock(dir.path(), Some(&url)).args(args));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(
            err.trim_end(),
            "polylock: the redlock backend cannot enumerate its locks (`polylock status NAME` \
             shows one lock)",
            "{args:?}"
        );
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }
}

/// README / docs/migration.md: `status` shows how many clients wait,
/// where the backend can count them (etcd can).
#[test]
fn status_on_etcd_shows_how_many_clients_wait() {
    let dir = tempfile::tempdir().unwrap();
    let server = testkit::EtcdServer::start().expect("start etcd");
    let url = format!("etcd://127.0.0.1:{}", server.port());
    let url = Some(url.as_str());
    let status = || {
        let out = output(polylock(dir.path(), url).args(["status", "queued"]));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let shows = |waiting: &str| {
        let mut last = String::new();
        let seen = eventually(Duration::from_secs(20), || {
            last = status();
            last.contains(&format!("\n  waiting:       {waiting}\n"))
        });
        assert!(seen, "never showed {waiting:?}: {last}");
    };
    let (mut holder, _) = start_hold(dir.path(), url, "queued");
    let _holder_guard = KillOnDrop(pid_of(&holder));
    shows("0 clients");
    let waiter = || {
        polylock(dir.path(), url)
            .args(["run", "-w", "30s", "queued", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = waiter();
    let _first_guard = KillOnDrop(pid_of(&first));
    shows("1 client");
    let second = waiter();
    let _second_guard = KillOnDrop(pid_of(&second));
    shows("2 clients");
    // Released: each waiter takes it in turn, runs `true` and exits 0.
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    for w in [first, second] {
        let out = w.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
}

/// Writes a config file for a SQLite lock table in `dir` with `extra`
/// lines; its path as a string.
fn config(dir: &Path, file: &str, extra: &str) -> String {
    let path = dir.join(file);
    std::fs::write(&path, format!("url = \"sqlite://cfg.db\"\n{extra}")).unwrap();
    path.to_str().unwrap().to_string()
}

/// README: the config file's `wait` is `run`'s wait unless --wait.
#[test]
fn the_config_files_wait_is_runs_default_wait() {
    let dir = tempfile::tempdir().unwrap();
    let short = config(dir.path(), "short.toml", "wait = \"300ms\"\n");
    let long = config(dir.path(), "long.toml", "wait = \"5s\"\n");
    let (mut holder, _) = start_hold_with(dir.path(), None, "busy", &["--config", &short]);
    let _guard = KillOnDrop(pid_of(&holder));
    let run = |file: &str| {
        let started = Instant::now();
        let out = output(
            polylock(dir.path(), None)
                .env_remove("POLYLOCK_CONFIG")
                .args(["--config", file, "run", "busy", "--", "touch", "ran"]),
        );
        (out, started.elapsed())
    };
    let (out, took) = run(&short);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("not taken within 300ms"), "{err}");
    // The default wait is 10s; generous for a loaded machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let (out, took) = run(&long);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("not taken within 5s"), "{err}");
    assert!(took >= Duration::from_secs(4), "took {took:?}");
    assert!(!dir.path().join("ran").exists(), "ran without the lock");
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

/// README: the config file's `ttl` is the lease length of `run`/`hold`
/// unless --ttl: `status` shows at most that much time left.
#[test]
fn the_config_files_ttl_is_holds_default_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "ttl.toml", "ttl = \"7s\"\n");
    let (mut holder, _) = start_hold_with(dir.path(), None, "leased", &["--config", &file]);
    let _guard = KillOnDrop(pid_of(&holder));
    let out = output(
        polylock(dir.path(), None)
            .env_remove("POLYLOCK_CONFIG")
            .args(["--config", &file, "status", "leased"]),
    );
    let s = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{s}{}", text(&out.stderr));
    let left = s
        .lines()
        .find_map(|l| l.strip_prefix("  expires in:    "))
        .unwrap_or_else(|| panic!("no time left shown: {s}"));
    let left = polylock::duration::parse(left, polylock::duration::BareNumber::Secs)
        .unwrap_or_else(|e| panic!("{left:?}: {e}"));
    // The default TTL is 30s, renewed every 10s: at least 20s left.
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(7),
        "{s}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}
