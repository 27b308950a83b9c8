//! Smoke tests: every server really starts, answers its own protocol, and
//! reacts to pause, resume, kill and restart as the tests built on it expect;
//! the proxy really delays, blackholes and resets.
//!
//! The tests run in parallel threads: nothing here uses fixed ports.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testkit::{
    run_with_timeout, Error, EtcdCluster, EtcdServer, MariaDbServer, Mode, PostgresServer, Proxy,
    RedisServer, ZooKeeperEnsemble, ZooKeeperServer,
};

/// How long a paused server is given to (wrongly) answer.
const PAUSED_TIMEOUT: Duration = Duration::from_millis(400);
/// How long a running server is given to answer.
const OK_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------- helpers

/// Sends one RESP command on `stream` and reads one whole reply.
fn resp_on(stream: &mut TcpStream, args: &[&str], timeout: Duration) -> io::Result<String> {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request.as_bytes())?;
    read_resp_reply(stream, timeout)
}

/// Reads one simple-string, error, integer or bulk-string reply.
fn read_resp_reply(stream: &mut TcpStream, timeout: Duration) -> io::Result<String> {
    stream.set_read_timeout(Some(timeout))?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        if is_complete_resp(&reply) {
            return Ok(String::from_utf8_lossy(&reply).into_owned());
        }
        match stream.read(&mut byte)? {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ))
            }
            _ => reply.push(byte[0]),
        }
    }
}

fn is_complete_resp(reply: &[u8]) -> bool {
    let text = String::from_utf8_lossy(reply);
    let Some(first_line_end) = text.find("\r\n") else {
        return false;
    };
    if !text.starts_with('$') {
        return true;
    }
    match text[1..first_line_end].parse::<i64>() {
        Ok(len) if len >= 0 => text.len() >= first_line_end + 2 + len as usize + 2,
        _ => true,
    }
}

/// One RESP command on a fresh connection.
fn resp(addr: SocketAddr, args: &[&str], timeout: Duration) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    resp_on(&mut stream, args, timeout)
}

fn ping(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    resp(addr, &["PING"], timeout)
}

/// Sends `request` and reads until the peer closes, within `timeout`.
fn request_until_close(addr: SocketAddr, request: &[u8], timeout: Duration) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(request)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

fn etcd_health(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    request_until_close(
        addr,
        b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        timeout,
    )
}

fn etcd_is_healthy(addr: SocketAddr) -> bool {
    etcd_health(addr, Duration::from_secs(1)).is_ok_and(|r| r.contains(r#""health":"true""#))
}

/// Polls until `condition` holds, failing the test after `timeout`.
fn eventually(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "{what}: not true within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn etcdctl(endpoints: &str, args: &[&str]) -> testkit::Result<Output> {
    let mut cmd = Command::new("etcdctl");
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(["--dial-timeout=1s", "--command-timeout=2s"])
        .args(args);
    run_with_timeout(&mut cmd, OK_TIMEOUT)
}

fn zk_four_letter(addr: SocketAddr, word: &str, timeout: Duration) -> io::Result<String> {
    request_until_close(addr, word.as_bytes(), timeout)
}

fn psql(
    pg: &PostgresServer,
    password: &str,
    sql: &str,
    timeout: Duration,
) -> testkit::Result<Output> {
    // connect_timeout below 2 s is rounded up to 2 s by libpq.
    let conninfo = format!(
        "host=127.0.0.1 port={} user={} dbname={} connect_timeout=2",
        pg.port(),
        pg.user(),
        pg.database()
    );
    let mut cmd = Command::new("psql");
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PGPASSWORD", password)
        .args([
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-w",
            "-d",
            &conninfo,
            "-c",
            sql,
        ]);
    run_with_timeout(&mut cmd, timeout)
}

/// A long-lived `psql` session, to check what happens to an open connection.
struct PsqlSession {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl PsqlSession {
    fn open(pg: &PostgresServer) -> PsqlSession {
        let mut child = Command::new("psql")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PGPASSWORD", pg.password())
            .args(["-X", "-A", "-t", "-q", "-d", &pg.url()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn psql");
        let stdin = child.stdin.take().expect("psql stdin");
        let stdout = child.stdout.take().expect("psql stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        PsqlSession {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, sql: &str) {
        writeln!(self.stdin, "{sql}").expect("write to psql");
        self.stdin.flush().expect("flush psql");
    }

    fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }
}

impl Drop for PsqlSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mariadb(
    db: &MariaDbServer,
    password: &str,
    sql: &str,
    timeout: Duration,
) -> testkit::Result<Output> {
    let mut cmd = Command::new("mariadb");
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .arg("--no-defaults")
        .args(["--protocol=tcp", "-h", "127.0.0.1"])
        .arg(format!("--port={}", db.port()))
        .arg(format!("--user={}", db.user()))
        .arg(format!("--password={password}"))
        .args(["--connect-timeout=1", "--batch", "--skip-column-names"])
        .args([db.database(), "-e", sql]);
    run_with_timeout(&mut cmd, timeout)
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "command failed: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A client command against a paused server must not succeed: it either
/// fails (its own timeout) or is killed by ours.
fn assert_no_answer(what: &str, result: testkit::Result<Output>) {
    match result {
        Err(Error::TimedOut { .. }) => {}
        Ok(output) => assert!(!output.status.success(), "{what} answered while paused"),
        Err(e) => panic!("{what}: unexpected error {e}"),
    }
}

fn assert_refused(addr: SocketAddr) {
    let err = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .expect_err("connect to a killed server");
    assert_eq!(
        err.kind(),
        io::ErrorKind::ConnectionRefused,
        "{addr}: {err}"
    );
}

fn assert_times_out<T: std::fmt::Debug>(what: &str, result: io::Result<T>) {
    match result {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) => {}
        other => panic!("{what}: expected a timeout, got {other:?}"),
    }
}

fn process_exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

// ---------------------------------------------------------------- Redis

#[test]
fn redis_answers_pauses_resumes_dies_and_restarts() {
    let redis = RedisServer::start().expect("start redis-server");
    let addr = redis.addr();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    assert_eq!(ping(addr, OK_TIMEOUT).expect("PING"), "+PONG\r\n");
    assert_eq!(
        resp(addr, &["SET", "k", "v"], OK_TIMEOUT).expect("SET"),
        "+OK\r\n"
    );

    let mut open = TcpStream::connect(addr).expect("connect");
    redis.pause().expect("pause");
    assert_times_out(
        "PING on a new connection while paused",
        ping(addr, PAUSED_TIMEOUT),
    );
    assert_times_out(
        "PING on an open connection while paused",
        resp_on(&mut open, &["PING"], PAUSED_TIMEOUT),
    );

    redis.resume().expect("resume");
    assert_eq!(
        ping(addr, OK_TIMEOUT).expect("PING after resume"),
        "+PONG\r\n"
    );
    // The PING sent while paused is answered now.
    assert_eq!(
        read_resp_reply(&mut open, OK_TIMEOUT).expect("late reply"),
        "+PONG\r\n"
    );

    let pid = redis.pid().expect("pid while running");
    redis.kill().expect("kill");
    assert_eq!(redis.pid(), None);
    assert!(!process_exists(pid), "redis-server {pid} survived kill");
    assert_refused(addr);
    assert!(redis.pause().is_err(), "pausing a killed server must fail");

    redis.restart().expect("restart");
    assert_eq!(redis.addr(), addr, "restart must reuse the port");
    assert_ne!(redis.pid(), Some(pid));
    assert_eq!(
        ping(addr, OK_TIMEOUT).expect("PING after restart"),
        "+PONG\r\n"
    );
    // Started with --save '' --appendonly no: a restart loses everything.
    assert_eq!(
        resp(addr, &["GET", "k"], OK_TIMEOUT).expect("GET"),
        "$-1\r\n"
    );

    // A frozen server can be killed and brought back.
    redis.pause().expect("pause");
    assert!(redis.process().is_paused());
    redis.kill().expect("kill while paused");
    redis.restart().expect("restart after kill while paused");
    assert!(!redis.process().is_paused());
    assert_eq!(ping(addr, OK_TIMEOUT).expect("PING"), "+PONG\r\n");

    let dir = redis.process().dir().to_path_buf();
    let pid = redis.pid().expect("pid");
    drop(redis);
    assert!(!dir.exists(), "temp dir {} left behind", dir.display());
    assert!(!process_exists(pid), "redis-server {pid} survived drop");
}

#[test]
fn redis_with_append_only_file_keeps_data_across_kill() {
    let redis = RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"])
        .expect("start");
    let addr = redis.addr();
    assert_eq!(
        resp(addr, &["SET", "k", "kept"], OK_TIMEOUT).expect("SET"),
        "+OK\r\n"
    );
    redis.kill().expect("kill");
    redis.restart().expect("restart");
    assert_eq!(
        resp(addr, &["GET", "k"], OK_TIMEOUT).expect("GET"),
        "$4\r\nkept\r\n"
    );
}

#[test]
fn redis_cluster_assigns_every_slot_and_heals_after_a_restart() {
    let cluster = testkit::RedisCluster::start(3).expect("start a three-master cluster");
    assert_eq!(cluster.servers().len(), 3);
    for server in cluster.servers() {
        let info = resp(server.addr(), &["CLUSTER", "INFO"], Duration::from_secs(2)).unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
    assert_eq!(cluster.seed_nodes().split(',').count(), 3);
    let member = &cluster.servers()[1];
    member.kill().unwrap();
    assert_refused(member.addr());
    member.restart().unwrap();
    cluster
        .wait_healthy(Duration::from_secs(30))
        .expect("the cluster heals once the member is back");
}

#[test]
fn server_that_exits_during_start_up_reports_its_log() {
    let err =
        RedisServer::start_with_args(&["--no-such-option", "x"]).expect_err("bad flag must fail");
    let message = err.to_string();
    assert!(matches!(err, Error::ExitedEarly { .. }), "{message}");
    assert!(
        message.contains("no-such-option"),
        "log tail missing: {message}"
    );
}

// ---------------------------------------------------------------- etcd

#[test]
fn etcd_single_member_lifecycle() {
    let etcd = EtcdServer::start().expect("start etcd");
    let addr = etcd.addr();
    let endpoint = etcd.endpoint();
    assert_eq!(endpoint, format!("http://127.0.0.1:{}", etcd.port()));
    assert!(etcd_is_healthy(addr));
    stdout_of(&etcdctl(&endpoint, &["put", "greeting", "hello"]).expect("etcdctl put"));
    assert_eq!(
        stdout_of(&etcdctl(&endpoint, &["get", "--print-value-only", "greeting"]).expect("get")),
        "hello"
    );

    etcd.pause().expect("pause");
    assert!(
        etcd_health(addr, PAUSED_TIMEOUT).is_err(),
        "/health answered while paused"
    );
    etcd.resume().expect("resume");
    etcd.wait_ready(OK_TIMEOUT).expect("healthy after resume");

    etcd.kill().expect("kill");
    assert_refused(addr);
    etcd.restart().expect("restart");
    assert!(etcd_is_healthy(addr));
    // etcd fsyncs every write: the key survived SIGKILL.
    assert_eq!(
        stdout_of(&etcdctl(&endpoint, &["get", "--print-value-only", "greeting"]).expect("get")),
        "hello"
    );
}

#[test]
fn etcd_cluster_survives_losing_one_member() {
    let cluster = EtcdCluster::start(3).expect("start a 3-member etcd cluster");
    let members = cluster.members();
    assert_eq!(members.len(), 3);
    assert_eq!(cluster.endpoints().len(), 3);
    for member in members {
        assert!(
            etcd_is_healthy(member.addr()),
            "{} not healthy",
            member.name()
        );
    }

    let victim = &members[0];
    victim.kill().expect("kill member");
    assert_refused(victim.addr());
    for member in &members[1..] {
        eventually(
            &format!("{} healthy with one peer down", member.name()),
            Duration::from_secs(15),
            || etcd_is_healthy(member.addr()),
        );
    }
    let survivors = format!("{},{}", members[1].endpoint(), members[2].endpoint());
    stdout_of(&etcdctl(&survivors, &["put", "k", "written-without-m0"]).expect("put"));

    victim.restart().expect("restart member");
    assert!(etcd_is_healthy(victim.addr()));
    // The restarted member catches up from the others.
    eventually(
        "restarted member sees the write",
        Duration::from_secs(10),
        || {
            etcdctl(&victim.endpoint(), &["get", "--print-value-only", "k"])
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "written-without-m0")
        },
    );

    // A paused member does not answer; the others stay healthy.
    let frozen = &members[1];
    frozen.pause().expect("pause member");
    assert!(etcd_health(frozen.addr(), PAUSED_TIMEOUT).is_err());
    eventually(
        "m2 healthy while m1 is paused",
        Duration::from_secs(15),
        || etcd_is_healthy(members[2].addr()),
    );
    frozen.resume().expect("resume member");
    frozen
        .wait_ready(Duration::from_secs(15))
        .expect("m1 healthy again");
}

// ---------------------------------------------------------------- ZooKeeper

#[test]
fn zookeeper_lifecycle() {
    let zk = ZooKeeperServer::start().expect("start ZooKeeper");
    let addr = zk.addr();
    assert_eq!(zk.connect_string(), format!("127.0.0.1:{}", zk.port()));
    let srvr = zk_four_letter(addr, "srvr", OK_TIMEOUT).expect("srvr");
    assert!(srvr.contains("Mode: standalone"), "{srvr}");

    zk.pause().expect("pause");
    assert!(
        zk_four_letter(addr, "srvr", PAUSED_TIMEOUT).is_err(),
        "srvr answered while paused"
    );
    zk.resume().expect("resume");
    zk.wait_ready(OK_TIMEOUT).expect("ready after resume");

    zk.kill().expect("kill");
    assert_refused(addr);
    zk.restart().expect("restart");
    let srvr = zk_four_letter(addr, "srvr", OK_TIMEOUT).expect("srvr after restart");
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
}

#[test]
fn zookeeper_ensemble_lifecycle() {
    let zk = ZooKeeperEnsemble::start(3).expect("start a ZooKeeper ensemble");
    let members = zk.members();
    assert_eq!(members.len(), 3);
    assert_eq!(
        zk.connect_string(),
        members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let modes: Vec<String> = members.iter().map(|m| m.mode().expect("mode")).collect();
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "follower").count(),
        2,
        "{modes:?}"
    );

    // A follower killed: the other two keep serving; back after restart.
    let follower = members
        .iter()
        .find(|m| m.mode().is_ok_and(|x| x == "follower"))
        .expect("a follower");
    follower.kill().expect("kill");
    assert_refused(follower.addr());
    for m in members.iter().filter(|m| m.id() != follower.id()) {
        m.wait_ready(OK_TIMEOUT).expect("the rest serve");
    }
    follower.restart().expect("restart the follower");
    assert!(follower.mode().is_ok(), "the restarted follower serves");

    // A member paused answers nothing; resumed, it serves again.
    follower.pause().expect("pause");
    assert!(
        zk_four_letter(follower.addr(), "srvr", PAUSED_TIMEOUT).is_err(),
        "srvr answered while paused"
    );
    follower.resume().expect("resume");
    follower.wait_ready(OK_TIMEOUT).expect("ready after resume");

    // The leader killed: the other two elect a new one.
    let leader = zk.leader().expect("a leader");
    let old = leader.id();
    leader.kill().expect("kill the leader");
    let give_up = Instant::now() + Duration::from_secs(30);
    let new = loop {
        if let Some(l) = zk.leader() {
            break l.id();
        }
        assert!(Instant::now() < give_up, "no new leader");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_ne!(new, old, "the killed leader still leads");
    leader.restart().expect("restart the old leader");
}

// ---------------------------------------------------------------- PostgreSQL

#[test]
fn postgres_lifecycle() {
    let pg = PostgresServer::start().expect("start PostgreSQL");
    let addr = pg.addr();
    assert_eq!(
        pg.url(),
        format!(
            "postgres://polylock:{}@127.0.0.1:{}/polylock",
            pg.password(),
            pg.port()
        )
    );
    assert_eq!(
        stdout_of(&psql(&pg, pg.password(), "SELECT 1", OK_TIMEOUT).expect("psql")),
        "1"
    );
    let wrong = psql(&pg, "wrong-password", "SELECT 1", OK_TIMEOUT).expect("psql");
    assert!(!wrong.status.success(), "a wrong password was accepted");
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("password authentication failed"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    stdout_of(
        &psql(
            &pg,
            pg.password(),
            "CREATE TABLE t (v text); INSERT INTO t VALUES ('kept')",
            OK_TIMEOUT,
        )
        .expect("psql"),
    );

    let mut session = PsqlSession::open(&pg);
    session.send("SELECT 'before';");
    assert_eq!(session.next_line(OK_TIMEOUT).as_deref(), Some("before"));

    pg.pause().expect("pause");
    // The open connection's backend is frozen too, not just the postmaster.
    session.send("SELECT 'during';");
    assert_eq!(
        session.next_line(PAUSED_TIMEOUT),
        None,
        "open session answered while paused"
    );
    assert_no_answer(
        "psql",
        psql(&pg, pg.password(), "SELECT 1", Duration::from_secs(4)),
    );
    pg.resume().expect("resume");
    assert_eq!(session.next_line(OK_TIMEOUT).as_deref(), Some("during"));
    assert_eq!(
        stdout_of(&psql(&pg, pg.password(), "SELECT 1", OK_TIMEOUT).expect("psql")),
        "1"
    );

    pg.kill().expect("kill");
    assert_refused(addr);
    // The backend died with the postmaster: the session sees no answer.
    session.send("SELECT 'after kill';");
    assert_eq!(session.next_line(PAUSED_TIMEOUT), None);
    drop(session);
    pg.restart().expect("restart");
    assert_eq!(
        stdout_of(&psql(&pg, pg.password(), "SELECT v FROM t", OK_TIMEOUT).expect("psql")),
        "kept"
    );
}

// ---------------------------------------------------------------- MariaDB

#[test]
fn mariadb_lifecycle() {
    let db = MariaDbServer::start().expect("start MariaDB");
    let addr = db.addr();
    assert_eq!(
        db.url(),
        format!(
            "mysql://polylock:{}@127.0.0.1:{}/polylock",
            db.password(),
            db.port()
        )
    );
    assert_eq!(
        stdout_of(&mariadb(&db, db.password(), "SELECT 1", OK_TIMEOUT).expect("mariadb")),
        "1"
    );
    // Internal temporary tables go to a directory of this server's own,
    // not the /tmp every other process shares.
    let tmpdir =
        stdout_of(&mariadb(&db, db.password(), "SELECT @@tmpdir", OK_TIMEOUT).expect("mariadb"));
    let socket_dir = db
        .socket()
        .parent()
        .expect("the socket lives in the server's directory");
    assert!(
        std::path::Path::new(&tmpdir).starts_with(socket_dir),
        "tmpdir {tmpdir} is not under the server's directory {}",
        socket_dir.display()
    );
    let wrong = mariadb(&db, "wrong-password", "SELECT 1", OK_TIMEOUT).expect("mariadb");
    assert!(!wrong.status.success(), "a wrong password was accepted");
    stdout_of(
        &mariadb(
            &db,
            db.password(),
            "CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('kept')",
            OK_TIMEOUT,
        )
        .expect("mariadb"),
    );

    db.pause().expect("pause");
    assert_no_answer(
        "mariadb",
        mariadb(&db, db.password(), "SELECT 1", Duration::from_secs(3)),
    );
    db.resume().expect("resume");
    assert_eq!(
        stdout_of(&mariadb(&db, db.password(), "SELECT 1", OK_TIMEOUT).expect("mariadb")),
        "1"
    );

    db.kill().expect("kill");
    assert_refused(addr);
    db.restart().expect("restart");
    assert_eq!(
        stdout_of(&mariadb(&db, db.password(), "SELECT v FROM t", OK_TIMEOUT).expect("mariadb")),
        "kept"
    );
}

// ---------------------------------------------------------------- Proxy

fn redis_and_proxy() -> (RedisServer, Proxy) {
    let redis = RedisServer::start().expect("start redis-server");
    let proxy = Proxy::start(redis.addr()).expect("start proxy");
    assert_eq!(proxy.upstream(), redis.addr());
    assert_eq!(proxy.addr().port(), proxy.port());
    (redis, proxy)
}

#[test]
fn proxy_pass_forwards() {
    let (_redis, proxy) = redis_and_proxy();
    assert_eq!(proxy.mode(), Mode::Pass);
    assert_eq!(ping(proxy.addr(), OK_TIMEOUT).expect("PING"), "+PONG\r\n");
    let mut conn = TcpStream::connect(proxy.addr()).expect("connect");
    for i in 0..20 {
        let value = format!("value-{i}");
        assert_eq!(
            resp_on(&mut conn, &["SET", "k", &value], OK_TIMEOUT).expect("SET"),
            "+OK\r\n"
        );
        let got = resp_on(&mut conn, &["GET", "k"], OK_TIMEOUT).expect("GET");
        assert_eq!(got, format!("${}\r\n{value}\r\n", value.len()));
    }
    assert_eq!(proxy.connection_count(), 1);
}

#[test]
fn proxy_set_upstream_resets_open_connections_and_sends_new_ones_to_the_new_server() {
    let (first, proxy) = redis_and_proxy();
    let second = RedisServer::start().expect("start a second redis-server");
    let mut old = TcpStream::connect(proxy.addr()).expect("connect");
    assert_eq!(
        resp_on(&mut old, &["SET", "who", "first"], OK_TIMEOUT).expect("SET"),
        "+OK\r\n"
    );
    proxy.set_upstream(second.addr());
    assert_eq!(proxy.upstream(), second.addr());
    // The old connection is cut, not silently kept on the old server.
    assert!(resp_on(&mut old, &["GET", "who"], OK_TIMEOUT).is_err());
    let mut new = TcpStream::connect(proxy.addr()).expect("connect again");
    assert_eq!(
        resp_on(&mut new, &["GET", "who"], OK_TIMEOUT).expect("GET"),
        "$-1\r\n",
        "the new connection reaches the second server, which has no key"
    );
    drop(first);
}

#[test]
fn proxy_delay_slows_every_exchange() {
    let (_redis, proxy) = redis_and_proxy();
    // Opened in Pass: the new mode must apply to existing connections too.
    let mut conn = TcpStream::connect(proxy.addr()).expect("connect");
    let started = Instant::now();
    assert_eq!(
        resp_on(&mut conn, &["PING"], OK_TIMEOUT).expect("PING"),
        "+PONG\r\n"
    );
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "Pass is slow already"
    );

    proxy.set_mode(Mode::Delay(Duration::from_millis(200)));
    let started = Instant::now();
    assert_eq!(
        resp_on(&mut conn, &["PING"], OK_TIMEOUT).expect("PING"),
        "+PONG\r\n"
    );
    let elapsed = started.elapsed();
    // Delayed on the way there and on the way back.
    assert!(
        elapsed >= Duration::from_millis(400),
        "round trip took only {elapsed:?}"
    );

    let started = Instant::now();
    assert_eq!(ping(proxy.addr(), OK_TIMEOUT).expect("PING"), "+PONG\r\n");
    assert!(started.elapsed() >= Duration::from_millis(200));

    proxy.set_mode(Mode::Pass);
    let started = Instant::now();
    assert_eq!(
        resp_on(&mut conn, &["PING"], OK_TIMEOUT).expect("PING"),
        "+PONG\r\n"
    );
    assert!(started.elapsed() < Duration::from_millis(150));
}

#[test]
fn proxy_blackhole_swallows_without_reset() {
    let (_redis, proxy) = redis_and_proxy();
    let mut conn = TcpStream::connect(proxy.addr()).expect("connect");
    assert_eq!(
        resp_on(&mut conn, &["PING"], OK_TIMEOUT).expect("PING"),
        "+PONG\r\n"
    );

    proxy.set_mode(Mode::Blackhole);
    // The connection stays open: writes succeed, reads time out (no EOF, no RST).
    assert_times_out(
        "PING through a blackhole",
        resp_on(&mut conn, &["PING"], PAUSED_TIMEOUT),
    );
    assert_times_out(
        "a second read through a blackhole",
        read_resp_reply(&mut conn, PAUSED_TIMEOUT),
    );
    // New connections are accepted and blackholed as well.
    assert_times_out(
        "PING on a new connection",
        ping(proxy.addr(), PAUSED_TIMEOUT),
    );

    proxy.set_mode(Mode::Pass);
    // The swallowed PINGs are gone for good; the connection itself still works.
    assert_eq!(
        resp_on(&mut conn, &["PING"], OK_TIMEOUT).expect("PING after heal"),
        "+PONG\r\n"
    );
    assert_eq!(ping(proxy.addr(), OK_TIMEOUT).expect("PING"), "+PONG\r\n");
}

#[test]
fn proxy_reset_kills_open_and_new_connections() {
    let (_redis, proxy) = redis_and_proxy();
    let mut conn = TcpStream::connect(proxy.addr()).expect("connect");
    assert_eq!(
        resp_on(&mut conn, &["PING"], OK_TIMEOUT).expect("PING"),
        "+PONG\r\n"
    );

    proxy.set_mode(Mode::Reset);
    conn.set_read_timeout(Some(OK_TIMEOUT))
        .expect("set timeout");
    let mut buf = [0u8; 16];
    match conn.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("open connection after Reset: expected RST or EOF, got {other:?}"),
    }

    let result = ping(proxy.addr(), OK_TIMEOUT);
    match &result {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::BrokenPipe
            ) => {}
        other => panic!("new connection under Reset: expected a reset, got {other:?}"),
    }
    assert_eq!(proxy.connection_count(), 0);

    proxy.set_mode(Mode::Pass);
    assert_eq!(
        ping(proxy.addr(), OK_TIMEOUT).expect("PING after Reset"),
        "+PONG\r\n"
    );
}

#[test]
fn proxy_resets_clients_when_upstream_is_down_and_closes_on_drop() {
    let (redis, proxy) = redis_and_proxy();
    let mut conn = TcpStream::connect(proxy.addr()).expect("connect");
    assert_eq!(
        resp_on(&mut conn, &["PING"], OK_TIMEOUT).expect("PING"),
        "+PONG\r\n"
    );

    redis.kill().expect("kill redis");
    // The server's close reaches the client through the proxy.
    let mut buf = [0u8; 16];
    conn.set_read_timeout(Some(OK_TIMEOUT))
        .expect("set timeout");
    match conn.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("expected EOF or RST after the server died, got {other:?}"),
    }
    assert!(
        ping(proxy.addr(), OK_TIMEOUT).is_err(),
        "PING succeeded with the server down"
    );

    redis.restart().expect("restart redis");
    let mut conn = TcpStream::connect(proxy.addr()).expect("connect");
    assert_eq!(
        resp_on(&mut conn, &["PING"], OK_TIMEOUT).expect("PING"),
        "+PONG\r\n"
    );
    let proxy_addr = proxy.addr();
    drop(proxy);
    conn.set_read_timeout(Some(OK_TIMEOUT))
        .expect("set timeout");
    match conn.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the dropped proxy to close connections, got {other:?}"),
    }
    assert_refused(proxy_addr);
}

#[test]
fn free_ports_are_unique_across_threads() {
    let handles: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(|| (0..25).map(|_| testkit::free_port()).collect::<Vec<_>>()))
        .collect();
    let mut all: Vec<u16> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("thread"))
        .collect();
    let count = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), count, "a port was handed out twice");
}
