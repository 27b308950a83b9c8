//! `polylock run` and `hold` as processes on the SQLite default: signals,
//! parent death, refusals before the command runs, flock(1) flags, help.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

#[test]
fn sigkill_of_polylock_kills_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = polylock(dir.path(), None)
        .args([
            "run",
            "orphan",
            "--",
            "sh",
            "-c",
            "sleep 60 & echo $! > child; echo $$ > pid; while true; do sleep 0.1; done",
        ])
        .spawn()
        .unwrap();
    let pid = read_pid(&dir.path().join("pid"));
    let child = read_pid(&dir.path().join("child"));
    assert!(alive(pid));
    kill(Pid::from_raw(run.id() as i32), Signal::SIGKILL).unwrap();
    run.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !alive(pid)),
        "the command outlived polylock"
    );
    // What the README says COMMAND must see to itself: a process it started
    // in the background is not killed with it.
    let orphan_lives = alive(child);
    let _ = kill(child, Signal::SIGKILL);
    assert!(
        orphan_lives,
        "the command's own child died with it: the README's caveat is out of date"
    );
}

#[test]
fn sighup_is_forwarded_and_the_lock_released() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = polylock(dir.path(), None)
        .args([
            "run",
            "hangup",
            "--",
            "sh",
            "-c",
            "trap 'exit 43' HUP; touch started; while true; do sleep 0.1; done",
        ])
        .spawn()
        .unwrap();
    wait_file(&dir.path().join("started"));
    kill(Pid::from_raw(run.id() as i32), Signal::SIGHUP).unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(43));
    assert_eq!(
        status_code(dir.path(), None, "hangup"),
        Some(1),
        "still held"
    );
}

/// A signal polylock forwards ends the command itself, but a process it
/// started in its group ignores it: the lock stays held until that process
/// is gone too (README), then polylock releases it and exits.
#[test]
fn after_a_forwarded_signal_the_lock_is_kept_until_the_group_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = polylock(dir.path(), None)
        .args([
            "run",
            "drain",
            "--",
            "sh",
            "-c",
            "sh -c 'trap \"\" TERM; echo $$ > pid; while true; do sleep 0.1; done' & wait",
        ])
        .spawn()
        .unwrap();
    let member = read_pid(&dir.path().join("pid"));
    let _cleanup = KillOnDrop(member);
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        alive(member),
        "the member does not ignore SIGTERM after all"
    );
    assert!(
        run.try_wait().unwrap().is_none(),
        "polylock exited while a process of the command's group still ran"
    );
    assert_eq!(
        status_code(dir.path(), None, "drain"),
        Some(0),
        "released while a process of the command's group still ran"
    );
    kill(member, Signal::SIGKILL).unwrap();
    let done = eventually(Duration::from_secs(10), || {
        run.try_wait().unwrap().is_some()
    });
    assert!(done, "polylock still waits after the group is gone");
    assert_eq!(
        status_code(dir.path(), None, "drain"),
        Some(1),
        "still held"
    );
}

#[test]
fn one_sigint_to_the_process_group_reaches_the_command_once() {
    let dir = tempfile::tempdir().unwrap();
    // `wait` is interrupted by a trapped signal, so each delivery runs the
    // trap once; the background sleep ignores SIGINT (non-interactive sh).
    let mut run = polylock(dir.path(), None)
        .args([
            "run",
            "ctrl-c",
            "--",
            "sh",
            "-c",
            "trap 'echo int >> ints' INT; trap 'exit 0' TERM; touch started; \
             while true; do sleep 1 & wait $!; done",
        ])
        .process_group(0)
        .spawn()
        .unwrap();
    wait_file(&dir.path().join("started"));
    let group = Pid::from_raw(run.id() as i32);
    // What a terminal's Ctrl-C or `kill -INT -PGID` does: the whole group.
    killpg(group, Signal::SIGINT).unwrap();
    let ints = dir.path().join("ints");
    wait_file(&ints);
    // Give a second copy every chance to arrive before counting.
    std::thread::sleep(Duration::from_millis(1500));
    kill(group, Signal::SIGTERM).unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(0));
    let got = std::fs::read_to_string(&ints).unwrap();
    assert_eq!(got.lines().count(), 1, "SIGINT delivered {got:?}");
}

#[test]
fn memory_urls_and_tiny_ttls_are_refused_before_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["run", "x", "--", "touch", "ran"][..],
        &["hold", "x"],
        &["status", "x"],
        &["release", "--force", "x"],
    ] {
        let out = output(polylock(dir.path(), Some("memory://t")).args(args));
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("inside one process") && err.contains("across processes"),
            "{args:?}: {err}"
        );
    }
    // A migration lock with an in-process side, in any phase: the side in
    // use is no cross-process lock, and a side not in use yet will be.
    let file = dir.path().join("side.db");
    let sqlite = format!("sqlite://{}", file.display());
    let encoded = |url: &str| url.replace(':', "%3A").replace('/', "%2F");
    for url in [
        format!("migrate+{sqlite}?to={}&phase=both", encoded("memory://t")),
        format!("migrate+{sqlite}?to={}&phase=legacy", encoded("memory://t")),
        format!("migrate+memory://t?to={}&phase=target", encoded(&sqlite)),
    ] {
        for args in [
            &["run", "x", "--", "touch", "ran"][..],
            &["hold", "x"],
            &["status", "x"],
            &["release", "--force", "x"],
        ] {
            let out = output(polylock(dir.path(), Some(&url)).args(args));
            assert_eq!(out.status.code(), Some(64), "{url} {args:?}");
            let err = text(&out.stderr);
            assert!(
                err.contains("inside one process") && err.contains("across processes"),
                "{url} {args:?}: {err}"
            );
        }
    }
    assert!(
        !file.exists(),
        "the SQLite side was connected before the refusal"
    );
    for ttl in ["1ms", "5ms", "999ms"] {
        let out = output(
            polylock(dir.path(), None).args(["run", "--ttl", ttl, "x", "--", "touch", "ran"]),
        );
        assert_eq!(out.status.code(), Some(64), "{ttl}");
        let err = text(&out.stderr);
        assert!(err.contains("smallest TTL is 1s"), "{err}");
        let out = output(polylock(dir.path(), None).args(["hold", "--ttl", ttl, "x"]));
        assert_eq!(out.status.code(), Some(64), "hold {ttl}");
    }
    assert!(!dir.path().join("ran").exists(), "the command ran");
    // Refused before any I/O: not even the SQLite file was created.
    assert!(!dir.path().join("polylock.db").exists());
}

#[test]
fn nonblock_conflict_exit_code_and_shell_command_work_like_flock() {
    let dir = tempfile::tempdir().unwrap();
    let out = output(polylock(dir.path(), None).args([
        "run",
        "job",
        "-c",
        "echo \"$POLYLOCK_NAME:$POLYLOCK_FENCE\"; exit 5",
    ]));
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "job:1");

    let (mut holder, fence) = start_hold(dir.path(), None, "job");
    assert_eq!(fence, 2);
    let started = Instant::now();
    let out =
        output(polylock(dir.path(), None).args(["run", "-n", "-E", "3", "job", "-c", "touch ran"]));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    // -n does not wait (the default wait is 10s).
    assert!(started.elapsed() < Duration::from_secs(8));
    let out = output(
        polylock(dir.path(), None).args(["run", "-w", "200ms", "job", "--", "touch", "ran"]),
    );
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(!dir.path().join("ran").exists(), "ran without the lock");
    // -c and a COMMAND together are ambiguous.
    let out = output(polylock(dir.path(), None).args(["run", "job", "-c", "true", "--", "true"]));
    assert_eq!(out.status.code(), Some(64));
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

#[test]
fn hold_works_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    hold_until_stdin_closes(dir.path(), None);
    // And until interrupted, terminated or hung up (README): released.
    for (i, signal) in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP]
        .into_iter()
        .enumerate()
    {
        let name = format!("h{}", i + 2);
        let (mut holder, _) = start_hold(dir.path(), None, &name);
        assert_eq!(status_code(dir.path(), None, &name), Some(0));
        kill(Pid::from_raw(holder.id() as i32), signal).unwrap();
        assert!(holder.wait().unwrap().success(), "{signal}");
        assert_eq!(status_code(dir.path(), None, &name), Some(1), "{signal}");
    }
}

#[test]
fn holders_are_described_and_listed_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    holders_are_described_and_listed(dir.path(), None);
}

#[test]
fn list_is_refused_where_the_backend_cannot_enumerate_or_is_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let out = output(polylock(dir.path(), Some("memory://")).arg("list"));
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("inside one process"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn help_lists_every_scheme_the_exit_codes_and_examples() {
    let dir = tempfile::tempdir().unwrap();
    let help = text(&output(polylock(dir.path(), None).arg("--help")).stdout);
    for scheme in polylock::available_schemes() {
        assert!(
            help.contains(&format!("{scheme}://")),
            "{scheme} missing: {help}"
        );
    }
    assert!(help.contains("etcd://"));
    assert!(help.contains("126 "), "{help}");
    assert!(help.contains("POLYLOCK_NAME"), "{help}");
    for sub in ["run", "hold", "status", "release"] {
        let h = text(&output(polylock(dir.path(), None).args([sub, "--help"])).stdout);
        assert!(h.contains("Examples:"), "{sub}: {h}");
    }
    let out = output(polylock(dir.path(), None).args(["run", "foo", "echo", "hi"]));
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("put the command after `--`"),
        "{}",
        text(&out.stderr)
    );
    let out = output(polylock(dir.path(), None).args(["run", "--ttl", "-1", "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    assert!(!err.contains("-- -1"), "{err}");
    assert!(err.contains("not a duration"), "{err}");
}

#[test]
fn status_escapes_names_for_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let name = "evil\n\u{1b}[31mred";
    let (mut holder, _) = start_hold(dir.path(), None, name);
    let out = output(polylock(dir.path(), None).args(["status", name]));
    assert_eq!(out.status.code(), Some(0));
    let shown = text(&out.stdout);
    assert!(!shown.contains('\u{1b}'), "{shown:?}");
    assert!(
        shown.starts_with("evil\\n\\u{1b}[31mred: held by"),
        "{shown:?}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let out = output(polylock(dir.path(), None).args(["status", name]));
    let shown = text(&out.stdout);
    // The name stays on its first line; the lines after it are status's
    // own, indented (the wake-up mode).
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], "evil\\n\\u{1b}[31mred: free", "{shown:?}");
    assert!(lines[1..].iter().all(|l| l.starts_with("  ")), "{shown:?}");
    assert!(!shown.contains('\u{1b}'), "{shown:?}");
}

#[test]
fn a_non_redis_server_gives_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = conn
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\r\nbad\n");
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    let out = output(polylock(dir.path(), Some(&url)).args(["run", "-n", "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("polylock: cannot connect"), "{err}");
}

#[test]
fn a_forced_release_names_the_cause_and_verbose_shows_renewals() {
    let dir = tempfile::tempdir().unwrap();
    let run = polylock(dir.path(), None)
        .args([
            "-vv",
            "run",
            "--ttl",
            "1s",
            "taken",
            "-c",
            "touch started; sleep 30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_file(&dir.path().join("started"));
    // Let at least one renewal (every third of the TTL) happen.
    std::thread::sleep(Duration::from_millis(800));
    let out = output(polylock(dir.path(), None).args(["release", "--force", "taken"]));
    assert!(out.status.success());
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76));
    let err = text(&out.stderr);
    assert!(err.contains("renewed"), "no trace of renewals: {err}");
    assert!(err.contains("refused the renewal"), "{err}");
    // RUST_LOG is honoured too.
    let out = output(
        polylock(dir.path(), None)
            .env("RUST_LOG", "lock_core=trace")
            .args(["run", "--ttl", "1s", "quiet", "--", "sleep", "0.8"]),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("renewed"),
        "{}",
        text(&out.stderr)
    );
}

/// On a terminal (a pty from util-linux `script`), Ctrl-C reaches the
/// command once, and the command can read the terminal: it owns the
/// foreground while it runs.
#[test]
fn ctrl_c_on_a_terminal_reaches_the_command_once_and_it_reads_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let polylock_bin = env!("CARGO_BIN_EXE_polylock");
    let inner = format!(
        "{polylock_bin} run tty -- sh -c 'trap \"echo int >> ints\" INT; touch started; i=0; \
         while [ $i -lt 100 ]; do i=$((i+1)); if read line; then [ \"$line\" = done ] && exit 7; fi; done; exit 1'"
    );
    let mut script = std::process::Command::new("script")
        .args(["-qfec", &inner, "/dev/null"])
        .current_dir(dir.path())
        .env_remove("POLYLOCK_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("util-linux `script` is needed for this test");
    wait_file(&dir.path().join("started"));
    let mut tty = script.stdin.take().unwrap();
    tty.write_all(b"\x03").unwrap();
    tty.flush().unwrap();
    let ints = dir.path().join("ints");
    wait_file(&ints);
    // Give a second copy every chance to arrive before counting.
    std::thread::sleep(Duration::from_millis(1500));
    tty.write_all(b"done\n").unwrap();
    tty.flush().unwrap();
    let out = script.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stdout));
    let got = std::fs::read_to_string(&ints).unwrap();
    assert_eq!(got.lines().count(), 1, "SIGINT delivered {got:?}");
    drop(tty);
}

/// An interactive bash on a pty (util-linux `script`), typed into and read
/// as a user would.
struct Shell {
    tty: std::process::ChildStdin,
    screen: std::sync::Arc<std::sync::Mutex<String>>,
    script: std::process::Child,
}

impl Drop for Shell {
    fn drop(&mut self) {
        // A failing test must not leave the session running.
        let _ = self.script.kill();
        let _ = self.script.wait();
    }
}

impl Shell {
    fn start(dir: &std::path::Path) -> Shell {
        let mut script = std::process::Command::new("script")
            .args([
                "-qfec",
                "env PS1='$ ' bash --norc --noprofile -i",
                "/dev/null",
            ])
            .current_dir(dir)
            .env_remove("POLYLOCK_URL")
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("util-linux `script` and bash are needed for this test");
        let screen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut out = script.stdout.take().unwrap();
        let seen = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut out, &mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Shell {
            tty: script.stdin.take().unwrap(),
            screen,
            script,
        }
    }

    fn type_in(&mut self, keys: &str) {
        self.tty.write_all(keys.as_bytes()).unwrap();
        self.tty.flush().unwrap();
    }

    fn screen(&self) -> String {
        self.screen.lock().unwrap().clone()
    }

    /// Waits until `text` is on the screen `times` times.
    fn wait_for(&self, text: &str, times: usize) {
        assert!(
            eventually(Duration::from_secs(20), || self
                .screen()
                .matches(text)
                .count()
                >= times),
            "{text:?} did not appear; the screen:\n{}",
            self.screen()
        );
    }
}

/// Ctrl-Z stops the command, and with it polylock's job, as it would stop
/// the command started alone: the shell reports the job stopped and can
/// continue it with `fg`. A stopped job renews nothing: after a stop
/// shorter than the TTL the command goes on and the lock is still held;
/// after a longer one another process takes the lock, and `fg` kills the
/// command instead of continuing it (exit 76). The markers are typed with
/// `""` inside, so the terminal's echo of the line does not match them.
#[test]
fn ctrl_z_stops_the_job_and_fg_continues_it_unless_the_lock_expired() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_polylock");
    let mut shell = Shell::start(dir.path());
    shell.type_in(&format!(
        "{bin} run --ttl 30s short -- sh -c 'echo ST\"\"ARTED; sleep 4; echo FIN\"\"ISHED'\n"
    ));
    shell.wait_for("STARTED", 1);
    shell.type_in("\x1a");
    shell.wait_for("Stopped", 1);
    // Still held: the stop was far shorter than the TTL.
    let other = output(polylock(dir.path(), None).args(["run", "-n", "short", "--", "true"]));
    assert_eq!(other.status.code(), Some(75), "{}", text(&other.stderr));
    shell.type_in("fg; echo \"R\"\"C=$?\"\n");
    shell.wait_for("FINISHED", 1);
    shell.wait_for("RC=0", 1);

    shell.type_in(&format!(
        "{bin} run --ttl 1s long -- sh -c 'echo ST\"\"ARTED; sleep 30; echo FIN\"\"ISHED'\n"
    ));
    shell.wait_for("STARTED", 2);
    shell.type_in("\x1a");
    shell.wait_for("Stopped", 2);
    // The stopped job let the lock expire: another process takes it.
    let taken = eventually(Duration::from_secs(10), || {
        output(polylock(dir.path(), None).args(["run", "-n", "long", "--", "true"]))
            .status
            .success()
    });
    assert!(taken, "the stopped job kept the lock");
    shell.type_in("fg; echo \"R\"\"C=$?\"\n");
    shell.wait_for("RC=76", 1);
    let screen = shell.screen();
    assert!(screen.contains("was lost"), "{screen}");
    assert_eq!(screen.matches("FINISHED").count(), 1, "{screen}");
    shell.type_in("exit\n");
}

/// The state letter of `pid` in /proc (`T`: stopped).
fn state_of(pid: Pid) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.trim().chars().next())
        })
        .unwrap_or('?')
}

/// Job control where the terminal is not polylock's stdin, and where
/// polylock shares its process group: Ctrl-Z reaches polylock itself, and
/// the command, which never runs while polylock is stopped, stops with it;
/// in a pipeline the terminal stays with polylock's group. A SIGSTOP of
/// the command alone (a debugger, `cpulimit`) is no job stop: polylock
/// keeps renewing.
#[test]
fn the_job_stops_as_a_whole_and_a_sigstop_of_the_command_is_not_mirrored() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_polylock");
    let mut shell = Shell::start(dir.path());
    // stdin a pipe: Ctrl-Z goes to polylock's group, which keeps the
    // terminal.
    shell.type_in(&format!(
        "echo | {bin} run --ttl 30s piped -- sh -c 'echo $$ > pid; echo ST\"\"ARTED; \
         while true; do date +%s%N > tick; sleep 0.05; done'\n"
    ));
    shell.wait_for("STARTED", 1);
    let pid = read_pid(&dir.path().join("pid"));
    shell.type_in("\x1a");
    shell.wait_for("Stopped", 1);
    assert!(
        eventually(Duration::from_secs(5), || state_of(pid) == 'T'),
        "the command runs on while the job is stopped (state {})",
        state_of(pid)
    );
    shell.type_in("fg\n");
    assert!(
        eventually(Duration::from_secs(10), || state_of(pid) != 'T'),
        "fg did not continue the command"
    );
    shell.type_in("\x03");
    shell.wait_for("$ ", 3);

    // In a pipeline the command does not get the terminal: it reads its
    // group (field 5) and the terminal's foreground group (field 8).
    shell.type_in(&format!(
        "{bin} run --ttl 30s piped -- sh -c 'cut -d\" \" -f5,8 /proc/$$/stat > groups' | cat\n"
    ));
    let groups = dir.path().join("groups");
    wait_file(&groups);
    let mut line = String::new();
    assert!(eventually(Duration::from_secs(5), || {
        line = std::fs::read_to_string(&groups).unwrap_or_default();
        line.ends_with('\n')
    }));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 2, "{line:?}");
    assert_ne!(
        fields[0], fields[1],
        "the command got the terminal in a pipeline: {line:?}"
    );

    // A SIGSTOP of the command alone: polylock runs on and keeps the lock.
    shell.type_in(&format!(
        "{bin} run --ttl 1s alone -- sh -c 'echo $$ > pid2; echo ST\"\"ARTED; sleep 30'\n"
    ));
    shell.wait_for("STARTED", 2);
    let pid = read_pid(&dir.path().join("pid2"));
    kill(pid, Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let other = output(polylock(dir.path(), None).args(["run", "-n", "alone", "--", "true"]));
    assert_eq!(
        other.status.code(),
        Some(75),
        "the lock was not kept while the command alone was stopped: {}",
        text(&other.stderr)
    );
    kill(pid, Signal::SIGCONT).unwrap();
    shell.type_in("\x03");
    shell.type_in("exit\n");
}

/// polylock as the whole session of a terminal (as under `ssh -t host
/// polylock ...`): its process group is orphaned, so no shell could ever
/// continue a stopped job. Ctrl-Z, which stops the command that owns the
/// terminal, is then undone at once: the command finishes on its own.
#[test]
fn ctrl_z_in_an_orphaned_session_does_not_leave_the_command_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_polylock");
    let inner = format!("{bin} run orphaned -- sh -c 'touch started; sleep 2; touch finished'");
    let mut script = std::process::Command::new("script")
        .args(["-qfec", &inner, "/dev/null"])
        .current_dir(dir.path())
        .env_remove("POLYLOCK_URL")
        .env("SHELL", "/bin/sh")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("util-linux `script` is needed for this test");
    let _guard = KillOnDrop(Pid::from_raw(script.id() as i32));
    wait_file(&dir.path().join("started"));
    let mut tty = script.stdin.take().unwrap();
    tty.write_all(b"\x1a").unwrap();
    tty.flush().unwrap();
    assert!(
        eventually(Duration::from_secs(15), || dir
            .path()
            .join("finished")
            .exists()),
        "the command stayed stopped"
    );
    drop(tty);
    let out = script.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

/// polylock run from a script, which waits for it in the same process
/// group: the command still gets the terminal (the script is no pipeline
/// peer), reads it, and a Ctrl-Z stops the script too, so the shell
/// reports the job stopped and `fg` continues all of it.
#[test]
fn from_a_script_the_command_reads_the_terminal_and_the_whole_job_stops() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_polylock");
    let mut shell = Shell::start(dir.path());
    shell.type_in(&format!(
        "bash -c '{bin} run --ttl 30s scripted -- sh -c \"echo ST\"\"ARTED; read x; echo GOT\\$x; \
         sleep 3; echo FIN\"\"ISHED\"; echo AF\"\"TER'\n"
    ));
    shell.wait_for("STARTED", 1);
    shell.type_in("hello\n");
    shell.wait_for("GOThello", 1);
    shell.type_in("\x1a");
    shell.wait_for("Stopped", 1);
    shell.type_in("fg\n");
    shell.wait_for("FINISHED", 1);
    shell.wait_for("AFTER", 1);
    shell.type_in("exit\n");
}

/// After a forwarded signal the lock is kept while the command's group
/// drains; a second signal kills the group at once, rather than waiting
/// for the lease's deadline (an hour here).
#[test]
fn a_second_signal_ends_the_drain_of_the_commands_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = polylock(dir.path(), None)
        .args([
            "run",
            "--ttl",
            "1h",
            "drained",
            "--",
            "sh",
            "-c",
            "(trap '' INT TERM; exec sleep 300) & echo $! > bg; echo $$ > pid; wait",
        ])
        .spawn()
        .unwrap();
    let _guard = KillOnDrop(Pid::from_raw(run.id() as i32));
    let leader = read_pid(&dir.path().join("pid"));
    let bg = read_pid(&dir.path().join("bg"));
    let _bg_guard = KillOnDrop(bg);
    let polylock_pid = Pid::from_raw(run.id() as i32);
    kill(polylock_pid, Signal::SIGINT).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !alive(leader)),
        "the forwarded SIGINT did not end the leader"
    );
    assert!(alive(bg), "the background process ignores SIGINT");
    kill(polylock_pid, Signal::SIGINT).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !alive(bg)),
        "a second signal did not end the drain"
    );
    let status = run.wait().unwrap();
    assert!(status.code().is_some(), "{status:?}");
}

/// polylock paused past the lease's deadline (SIGSTOP): on resume the loss
/// is noticed late, and the command is killed at once, not after --grace.
#[test]
fn a_loss_noticed_late_kills_the_command_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = polylock(dir.path(), None)
        .args([
            "run",
            "--ttl",
            "1s",
            "--grace",
            "10s",
            "paused",
            "--",
            "sh",
            "-c",
            "echo $$ > pid; trap '' TERM; while true; do sleep 0.1; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = read_pid(&dir.path().join("pid"));
    let polylock_pid = Pid::from_raw(run.id() as i32);
    kill(polylock_pid, Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    kill(polylock_pid, Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    // Far below the 10s grace, generous for a busy machine.
    assert!(
        eventually(Duration::from_secs(3), || !alive(pid)),
        "the command still ran {:?} after polylock resumed",
        resumed.elapsed()
    );
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("was lost"),
        "{}",
        text(&out.stderr)
    );
}
