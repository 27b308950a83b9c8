//! `polylock run`, `hold`, `status` and `list` as processes against real
//! servers (spawned by testkit): the command never runs past the lease's
//! deadline when the server dies, `hold` works, polylock exits promptly
//! when the server is gone, and `status`/`list` describe live holders.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

fn redis() -> (testkit::RedisServer, String) {
    let server = testkit::RedisServer::start().expect("start redis-server");
    let url = server.url();
    (server, url)
}

fn etcd() -> (testkit::EtcdServer, String) {
    let server = testkit::EtcdServer::start().expect("start etcd");
    let url = format!("etcd://127.0.0.1:{}", server.port());
    (server, url)
}

/// Runs a SIGTERM-ignoring command with a 3 s TTL, kills the server with
/// `kill`, and checks the command is dead by the lease's deadline (at most
/// a TTL after the kill: the last renewal was sent before it).
fn command_dies_by_the_deadline(dir: &Path, url: &str, kill_server: impl FnOnce()) {
    dies_by_the_deadline(
        dir,
        url,
        "echo $$ > pid; trap '' TERM; while true; do sleep 0.1; done",
        kill_server,
    );
}

/// As [`command_dies_by_the_deadline`], for the shell script `script`,
/// which writes the pid to watch to the file `pid`.
fn dies_by_the_deadline(dir: &Path, url: &str, script: &str, kill_server: impl FnOnce()) {
    let ttl = Duration::from_secs(3);
    let run = polylock(dir, Some(url))
        .args([
            "run", "--ttl", "3s", "--grace", "10s", "deadline", "--", "sh", "-c", script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = read_pid(&dir.join("pid"));
    let _cleanup = KillOnDrop(pid);
    // At least one renewal went through before the server goes away.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(alive(pid));
    kill_server();
    let killed = Instant::now();
    // A little slack past the TTL for process reaping on a busy machine;
    // the old behaviour (SIGKILL 10s after the deadline) is far beyond it.
    let dead = eventually(ttl + Duration::from_millis(900), || !alive(pid));
    assert!(
        dead,
        "the command still ran {:?} after the server died",
        killed.elapsed()
    );
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("renewals are failing"), "{err}");
}

/// The command ends while the server is down: polylock must not hang on
/// the release.
fn exits_promptly_with_the_server_gone(dir: &Path, url: &str, kill_server: impl FnOnce()) {
    let mut run = polylock(dir, Some(url))
        .args([
            "run",
            "--ttl",
            "30s",
            "prompt",
            "--",
            "sh",
            "-c",
            "touch started; while [ ! -e stop ]; do sleep 0.05; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_file(&dir.join("started"));
    kill_server();
    std::fs::write(dir.join("stop"), "").unwrap();
    let stopped = Instant::now();
    let status = run.wait().unwrap();
    let took = stopped.elapsed();
    assert!(status.success(), "{status:?}");
    // About a second by design (release budget + shutdown); generous here.
    assert!(
        took < Duration::from_secs(3),
        "exited {took:?} after the command"
    );
}

#[test]
fn redis_command_is_dead_by_the_deadline_after_the_server_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = redis();
    command_dies_by_the_deadline(dir.path(), &url, || server.kill().unwrap());
}

/// The command's leader dies at the SIGTERM, but a process it started in
/// its group ignores SIGTERM: that one is dead by the deadline too (the
/// group is killed then), not left running after polylock released.
#[test]
fn redis_a_process_the_command_started_is_dead_by_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = redis();
    dies_by_the_deadline(
        dir.path(),
        &url,
        "sh -c 'trap \"\" TERM; echo $$ > pid; while true; do sleep 0.1; done' & wait",
        || server.kill().unwrap(),
    );
}

#[test]
fn etcd_command_is_dead_by_the_deadline_after_the_server_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = etcd();
    command_dies_by_the_deadline(dir.path(), &url, || server.kill().unwrap());
}

#[test]
fn redis_exits_promptly_when_the_server_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = redis();
    exits_promptly_with_the_server_gone(dir.path(), &url, || server.kill().unwrap());
}

#[test]
fn etcd_exits_promptly_when_the_server_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = etcd();
    exits_promptly_with_the_server_gone(dir.path(), &url, || server.kill().unwrap());
}

#[test]
fn hold_works_on_redis() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = redis();
    hold_until_stdin_closes(dir.path(), Some(&url));
}

#[test]
fn hold_works_on_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = etcd();
    hold_until_stdin_closes(dir.path(), Some(&url));
}

#[test]
fn hold_works_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let server = testkit::PostgresServer::start().expect("start postgres");
    hold_until_stdin_closes(dir.path(), Some(&server.url()));
}

#[test]
fn holders_are_described_and_listed_on_redis() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = redis();
    holders_are_described_and_listed(dir.path(), Some(&url));
}

#[test]
fn holders_are_described_and_listed_on_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = etcd();
    holders_are_described_and_listed(dir.path(), Some(&url));
}

#[test]
fn holders_are_described_and_listed_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let server = testkit::PostgresServer::start().expect("start postgres");
    holders_are_described_and_listed(dir.path(), Some(&server.url()));
}

#[test]
fn holders_are_described_and_listed_on_mariadb() {
    let dir = tempfile::tempdir().unwrap();
    let server = testkit::MariaDbServer::start().expect("start mariadb");
    holders_are_described_and_listed(dir.path(), Some(&server.url()));
}

#[test]
fn holders_are_described_and_listed_on_zookeeper() {
    let dir = tempfile::tempdir().unwrap();
    let server = testkit::ZooKeeperServer::start().expect("start zookeeper");
    let url = format!("zk://{}", server.connect_string());
    holders_are_described_and_listed(dir.path(), Some(&url));
}

/// polylock paused past the lease's deadline while the command finishes,
/// and the server frozen so the release cannot answer: the loss was known
/// before the release, so `run` exits `lock lost` (76), not with the
/// command's code because the release timed out.
#[test]
fn a_loss_known_before_an_unanswered_release_exits_lock_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = redis();
    let run = polylock(dir.path(), Some(&url))
        .args([
            "run",
            "--ttl",
            "1s",
            "late",
            "--",
            "sh",
            "-c",
            "echo $$ > pid; while [ ! -e go ]; do sleep 0.05; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    read_pid(&dir.path().join("pid"));
    let polylock_pid = nix::unistd::Pid::from_raw(run.id() as i32);
    server.pause().unwrap();
    nix::sys::signal::kill(polylock_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The command ends while polylock is stopped, past the lease's deadline.
    std::fs::write(dir.path().join("go"), "").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(polylock_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let out = run.wait_with_output().unwrap();
    server.resume().unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("lost"), "{}", text(&out.stderr));
}

/// Renewals stall (the server frozen), SIGTERM goes out, then the server
/// answers again and a renewal comes through before the deadline: the
/// command, which ignores SIGTERM, is killed at the deadline it was given,
/// and polylock says so, not that the lock service refused the renewal.
#[test]
fn a_renewal_that_recovers_after_sigterm_is_not_called_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = redis();
    let run = polylock(dir.path(), Some(&url))
        .args([
            "run",
            "--ttl",
            "3s",
            "--grace",
            "10s",
            "recovers",
            "--",
            "sh",
            "-c",
            "echo $$ > pid; trap '' TERM; while true; do sleep 0.05; done",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = read_pid(&dir.path().join("pid"));
    // Before the first renewal (at 1 s); SIGTERM goes out 1 s before the
    // deadline (about 2 s in); the stalled renewal then gets its answer.
    server.pause().unwrap();
    std::thread::sleep(Duration::from_millis(2300));
    server.resume().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !alive(pid)),
        "the command outlived the deadline SIGTERM gave it"
    );
    let out = run.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{err}");
    assert!(err.contains("renewals are failing"), "{err}");
    assert!(err.contains("did not exit by the deadline"), "{err}");
    assert!(!err.contains("refused"), "{err}");
}

/// A TTL above polylock's own floor but below what the backend can grant
/// (etcd: 2 s) is a usage error naming the backend's floor, and COMMAND
/// does not run.
#[test]
fn a_ttl_below_the_backends_minimum_names_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = etcd();
    let out = output(
        polylock(dir.path(), Some(&url))
            .args(["run", "--ttl", "1500ms", "short", "--", "touch", "ran"]),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("etcd cannot grant less than 2s"),
        "the message names the backend's floor: {err}"
    );
    assert!(!dir.path().join("ran").exists(), "COMMAND ran");
}

/// A lease trusted for much less than its TTL (a ZooKeeper client with a
/// follower lag) is renewed at half that time: SIGTERM must not go out
/// before that renewal, and a command that outlives a few renewals runs
/// to its end untouched. (SIGTERM used to be due a third of the TTL
/// before the deadline: here before the first renewal.)
#[test]
fn a_lease_trusted_for_less_than_its_ttl_gets_no_sigterm_while_renewals_work() {
    let dir = tempfile::tempdir().unwrap();
    let server = testkit::ZooKeeperServer::start().expect("start zookeeper");
    // A 10 s session is trusted for 10 * 0.79 - 3.002 = 4.9 s: renewed at
    // 2.45 s, where a third of the TTL before the deadline is 1.57 s.
    let url = format!("zk://{}?follower_lag=3s", server.connect_string());
    let out = polylock(dir.path(), Some(&url))
        .args([
            "run",
            "--ttl",
            "10s",
            "--grace",
            "10s",
            "lagged",
            "--",
            "sh",
            "-c",
            "trap 'echo TERM; exit 143' TERM; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do sleep 0.5; done; echo done",
        ])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        !stdout.contains("TERM"),
        "SIGTERM while renewals worked: {stdout} / {}",
        text(&out.stderr)
    );
    assert!(stdout.contains("done"), "{stdout} / {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// polylock's stderr stalls (a full pipe whose reader hangs, a terminal
/// paused with Ctrl-S) just as renewals fail: the command, which ignores
/// SIGTERM, is still killed by the lease's deadline. What polylock writes
/// (its SIGTERM notice, the log line of the loss) never holds the signal
/// up, and polylock finishes once stderr drains.
#[test]
fn a_stalled_stderr_does_not_hold_up_the_kill_at_the_deadline() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = redis();
    let (mut reader, writer) = std::io::pipe().unwrap();
    let run = polylock(dir.path(), Some(&url))
        .args([
            "-v",
            "run",
            "--ttl",
            "3s",
            "--grace",
            "10s",
            "stalled",
            "--",
            "sh",
            "-c",
            "echo $$ > pid; trap '' TERM; while true; do sleep 0.1; done",
        ])
        .stderr(Stdio::from(writer.try_clone().unwrap()))
        .spawn()
        .unwrap();
    let pid = read_pid(&dir.path().join("pid"));
    let _cleanup = KillOnDrop(pid);
    // Fill the pipe: the filler blocks once it is full, and so does every
    // write to it after that.
    let filler = std::thread::spawn(move || {
        let mut writer = writer;
        let _ = writer.write_all(&vec![b'.'; 1 << 20]);
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(alive(pid));
    server.pause().unwrap();
    let paused = Instant::now();
    let dead = eventually(Duration::from_secs(3) + Duration::from_millis(900), || {
        !alive(pid)
    });
    assert!(
        dead,
        "the command still ran {:?} after renewals stopped, with stderr stalled",
        paused.elapsed()
    );
    // Drain stderr: polylock says what happened and exits.
    let drained = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = reader.read_to_end(&mut all);
        all
    });
    let mut run = run;
    let status = run.wait().unwrap();
    server.resume().unwrap();
    filler.join().unwrap();
    let said = text(&drained.join().unwrap());
    assert_eq!(status.code(), Some(76), "{said}");
    assert!(said.contains("renewals are failing"), "{said}");
}
