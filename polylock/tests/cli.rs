//! The `polylock` command end to end, spawned as a process, on the embedded
//! SQLite default.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn polylock(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_polylock"));
    c.current_dir(dir).env_remove("POLYLOCK_URL");
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_ok(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn polylock")
}

/// Waits until `status NAME` reports the lock held.
fn wait_held(dir: &Path, name: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let out = run_ok(polylock(dir).args(["status", name]));
        if out.status.code() == Some(0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{name} never became held");
}

#[test]
fn runs_the_command_with_the_fence_and_passes_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    for expected_fence in 1..=2 {
        let out = run_ok(polylock(dir.path()).args([
            "run",
            "job",
            "--",
            "sh",
            "-c",
            "echo fence=$POLYLOCK_FENCE name=$POLYLOCK_NAME; exit 7",
        ]));
        assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout).trim(),
            format!("fence={expected_fence} name=job")
        );
    }
    // With nothing configured, the lock file is created in the current directory.
    assert!(dir.path().join("polylock.db").exists());
    // Released after the command: status says free (exit 1).
    let out = run_ok(polylock(dir.path()).args(["status", "job"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("job: free"));
}

#[test]
fn a_held_lock_makes_run_exit_75_without_running_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let mut holder = polylock(dir.path())
        .args(["run", "busy", "--", "sleep", "3"])
        .spawn()
        .unwrap();
    wait_held(dir.path(), "busy");
    let status = run_ok(polylock(dir.path()).args(["status", "busy"]));
    let shown = text(&status.stdout);
    assert!(
        shown.contains("held by") && shown.contains("fencing token: 1"),
        "{shown}"
    );
    let started = Instant::now();
    let out =
        run_ok(polylock(dir.path()).args(["run", "--wait", "300ms", "busy", "--", "touch", "ran"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        text(&out.stderr).contains("not taken within 300ms"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !dir.path().join("ran").exists(),
        "the command ran without the lock"
    );
    assert!(holder.wait().unwrap().success());
}

#[test]
fn concurrent_runs_on_one_name_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    // All start at once on a fresh database file (first use races the
    // table creation and SQLite's switch to WAL). Each run checks for a
    // marker, creates it, works, removes it, and logs its fencing token.
    let script = "if [ -e inside ]; then echo OVERLAP; fi; touch inside; sleep 0.2; \
                  rm inside; echo $POLYLOCK_FENCE >> fences";
    let children: Vec<_> = (0..6)
        .map(|_| {
            polylock(dir.path())
                .args(["run", "--wait", "60s", "shared", "--", "sh", "-c", script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            !text(&out.stdout).contains("OVERLAP"),
            "two commands ran at once"
        );
    }
    let fences = std::fs::read_to_string(dir.path().join("fences")).unwrap();
    let fences: Vec<u64> = fences.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(fences.len(), 6);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not increasing: {fences:?}"
    );
}

#[test]
fn losing_the_lock_terminates_the_command_and_exits_76() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = polylock(dir.path())
        .args([
            "run",
            "--ttl",
            "1s",
            "--grace",
            "300ms",
            "doomed",
            "--",
            "sh",
            "-c",
            "echo $$ > pid; trap '' TERM; while true; do sleep 0.1; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_held(dir.path(), "doomed");
    // The operator's escape hatch removes the lock behind the holder's back.
    let out = run_ok(polylock(dir.path()).args(["release", "doomed"]));
    assert_eq!(out.status.code(), Some(64), "--force is required");
    let out = run_ok(polylock(dir.path()).args(["release", "doomed", "--force"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let started = Instant::now();
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(76));
    // Lost at the next renewal (ttl/3), then TERM ignored, KILL after grace.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let pid: i32 = std::fs::read_to_string(dir.path().join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        kill(Pid::from_raw(pid), None).is_err(),
        "the command survived the lost lock"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("was lost"), "{err}");
}

#[test]
fn sigterm_is_forwarded_and_the_lock_released() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = polylock(dir.path())
        .args([
            "run",
            "polite",
            "--",
            "sh",
            "-c",
            "trap 'exit 42' TERM; touch started; while true; do sleep 0.1; done",
        ])
        .spawn()
        .unwrap();
    wait_held(dir.path(), "polite");
    let start = Instant::now();
    while !dir.path().join("started").exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(42));
    let out = run_ok(polylock(dir.path()).args(["status", "polite"]));
    assert_eq!(
        out.status.code(),
        Some(1),
        "lock still held: {}",
        text(&out.stdout)
    );
}

/// A `--ttl` or `--wait` above the maximum is a usage error said before
/// connecting: the lock service here refuses connections, which would
/// be exit 69 (unavailable) had polylock tried.
#[test]
fn a_ttl_or_wait_above_the_maximum_is_refused_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let unreachable = "redis://127.0.0.1:1";
    let out = run_ok(polylock(dir.path()).args(["--url", unreachable, "run", "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    for (flag, what) in [("--ttl", "invalid TTL"), ("--wait", "invalid wait")] {
        let out = run_ok(polylock(dir.path()).args([
            "--url",
            unreachable,
            "run",
            flag,
            "99999999",
            "x",
            "--",
            "true",
        ]));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flag}: {err}");
        assert!(
            err.contains(what) && err.contains("the maximum is"),
            "{flag}: {err}"
        );
    }
}

#[test]
fn bad_input_is_a_usage_error_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(polylock(dir.path()).args([
        "--url",
        "postgres://app:hunter2@/",
        "run",
        "x",
        "--",
        "true",
    ]));
    assert!(
        matches!(out.status.code(), Some(64 | 69)),
        "{:?}",
        out.status
    );
    assert!(
        !text(&out.stderr).contains("hunter2"),
        "{}",
        text(&out.stderr)
    );
    let out = run_ok(polylock(dir.path()).args(["--url", "nosuch://h", "run", "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("unknown lock URL scheme"),
        "{}",
        text(&out.stderr)
    );
    let out = run_ok(polylock(dir.path()).args(["run", "--ttl", "0s", "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("invalid TTL"),
        "{}",
        text(&out.stderr)
    );
    let out = run_ok(polylock(dir.path()).args(["run", "x", "--", "/nonexistent/cmd"]));
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    // A file that exists but cannot be executed: 126, as a shell says it.
    std::fs::write(dir.path().join("not-executable"), "#!/bin/sh\n").unwrap();
    let out = run_ok(polylock(dir.path()).args(["run", "x", "--", "./not-executable"]));
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
    let out = run_ok(polylock(dir.path()).args(["status", ""]));
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("invalid lock name"),
        "{}",
        text(&out.stderr)
    );
}

/// Waits until `file` exists in `dir`.
fn wait_file(dir: &Path, file: &str) {
    let start = Instant::now();
    while !dir.join(file).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{file} never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_release_that_finds_another_holder_exits_76_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    // A holds with a long TTL (no renewal during the test), until `a-go`.
    let a = polylock(dir.path())
        .args([
            "run",
            "--ttl",
            "60s",
            "shared-job",
            "--",
            "sh",
            "-c",
            "while [ ! -e a-go ]; do sleep 0.05; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_held(dir.path(), "shared-job");
    // An operator removes A's lock; B takes it and works until `b-go`.
    let out = run_ok(polylock(dir.path()).args(["release", "shared-job", "--force"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let b = polylock(dir.path())
        .args([
            "run",
            "--wait",
            "20s",
            "shared-job",
            "--",
            "sh",
            "-c",
            "touch b-in; while [ ! -e b-go ]; do sleep 0.05; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_file(dir.path(), "b-in");
    // A's command ends while B holds: A's work overlapped B's.
    std::fs::write(dir.path().join("a-go"), "").unwrap();
    let a = a.wait_with_output().unwrap();
    let err = text(&a.stderr);
    assert_eq!(a.status.code(), Some(76), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("was lost"), "{err}");
    std::fs::write(dir.path().join("b-go"), "").unwrap();
    let b = b.wait_with_output().unwrap();
    assert!(b.status.success(), "{}", text(&b.stderr));
}

#[test]
fn status_shows_only_a_prefix_of_the_owner_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut holder = polylock(dir.path())
        .args([
            "run",
            "secretive",
            "--",
            "sh",
            "-c",
            "while [ ! -e go ]; do sleep 0.05; done",
        ])
        .spawn()
        .unwrap();
    wait_held(dir.path(), "secretive");
    let out = run_ok(polylock(dir.path()).args(["status", "secretive"]));
    let shown = text(&out.stdout);
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert!(holder.wait().unwrap().success());
    let line = shown
        .lines()
        .find(|l| l.contains("held by"))
        .unwrap_or_else(|| panic!("{shown}"));
    let owner = line.rsplit("held by ").next().unwrap().trim();
    let hex: String = owner.chars().take_while(char::is_ascii_hexdigit).collect();
    assert_eq!(hex.len(), 8, "show 8 hex digits of the owner: {line}");
    assert_eq!(owner, format!("{hex}…"), "{line}");
}

/// `polylock compare` and `polylock bench` hand their arguments to the
/// `polylock-compare` / `polylock-bench` binaries installed beside polylock,
/// and say how to build them when they are not there.
#[test]
fn compare_and_bench_run_the_tool_installed_beside_polylock() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("polylock");
    std::fs::copy(env!("CARGO_BIN_EXE_polylock"), &exe).unwrap();
    let missing = run_ok(
        Command::new(&exe)
            .args(["bench", "--quick"])
            .env("PATH", dir.path()),
    );
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
    let err = text(&missing.stderr);
    assert!(
        err.contains("polylock-bench") && err.contains("cargo"),
        "{err}"
    );

    let tool = dir.path().join("polylock-compare");
    std::fs::write(&tool, "#!/bin/sh\necho \"compare got: $*\"\nexit 3\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run_ok(
        Command::new(&exe)
            .args(["compare", "--quick", "--backends", "sqlite,redis"])
            .env("PATH", "/nonexistent"),
    );
    assert_eq!(
        text(&out.stdout),
        "compare got: --quick --backends sqlite,redis\n"
    );
    // Flags polylock has too (`--url`, `-v`) are the tool's after its name,
    // however many times they come.
    let out = run_ok(
        Command::new(&exe)
            .args(["compare", "--url", "redis://a", "--url", "etcd://b", "-v"])
            .env("PATH", "/nonexistent"),
    );
    assert_eq!(
        text(&out.stdout),
        "compare got: --url redis://a --url etcd://b -v\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "the tool's exit code is polylock's"
    );
}

/// A command that only prints, writing into a pipe whose reader has gone
/// (`polylock list | head -1`), ends quietly as other Unix tools do: by
/// SIGPIPE, with no panic message and not with the panic's exit code 101.
#[test]
fn printing_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    // A held lock, so that `list` and `status` have a line to print.
    let mut holder = polylock(dir.path())
        .args(["hold", "report"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_held(dir.path(), "report");
    for args in [
        &["guarantees"][..],
        &["status", "report"][..],
        &["list"][..],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = polylock(dir.path())
            .args(args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(
            out.status.signal(),
            Some(Signal::SIGPIPE as i32),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}
