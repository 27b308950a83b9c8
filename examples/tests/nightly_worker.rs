//! The nightly worker, unchanged, against every backend: only
//! `POLYLOCK_URL` differs. On each: a worker running the job makes a second
//! one skip; a later worker runs and stores a result with a higher fence.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use polylock_examples::FencedStore;
use testkit::{EtcdServer, MariaDbServer, PostgresServer, RedisServer, ZooKeeperServer};

fn worker(url: &str, store: &Path, job_ms: u64) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nightly-worker"));
    c.arg(store)
        .arg(job_ms.to_string())
        .env("POLYLOCK_URL", url)
        .env_remove("POLYLOCK_CONFIG");
    c
}

fn run_one(url: &str, store: &Path) -> String {
    let o = worker(url, store, 10).output().unwrap();
    assert!(
        o.status.success(),
        "{url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    out.lines().last().unwrap_or("").to_string()
}

fn only_one_worker_runs(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // A long job: while it runs, another worker must skip.
    let mut first = worker(url, &store, 4000)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    let started = lines.next().unwrap().unwrap();
    assert!(started.starts_with("running fence="), "{url}: {started}");
    assert_eq!(run_one(url, &store), "skipped", "{url}");
    let done = lines.next().unwrap().unwrap();
    assert!(first.wait().unwrap().success(), "{url}");
    let first_fence: u64 = done
        .strip_prefix("ran fence=")
        .expect(&done)
        .parse()
        .unwrap();
    // The next night: the next worker runs, with a higher fence.
    let next = run_one(url, &store);
    let next_fence: u64 = next
        .strip_prefix("ran fence=")
        .expect(&next)
        .parse()
        .unwrap();
    assert!(
        next_fence > first_fence,
        "{url}: {next_fence} after {first_fence}"
    );
    let (stored, _) = FencedStore::open(&store)
        .unwrap()
        .newest()
        .unwrap()
        .unwrap();
    assert_eq!(stored, next_fence, "{url}");
}

#[test]
fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    only_one_worker_runs(&format!(
        "sqlite://{}",
        dir.path().join("locks.db").display()
    ));
}

#[test]
fn postgres() {
    let s = PostgresServer::start().unwrap();
    only_one_worker_runs(&s.url());
}

#[test]
fn mariadb() {
    let s = MariaDbServer::start().unwrap();
    only_one_worker_runs(&s.url());
}

#[test]
fn redis() {
    let s = RedisServer::start().unwrap();
    only_one_worker_runs(&s.url());
}

#[test]
fn redlock() {
    let servers = RedisServer::start_independent(3, &[]).unwrap();
    only_one_worker_runs(&format!("redlock://{}", RedisServer::host_list(&servers)));
}

#[test]
fn etcd() {
    let s = EtcdServer::start().unwrap();
    only_one_worker_runs(&format!("etcd://{}", s.addr()));
}

#[test]
fn zookeeper() {
    let s = ZooKeeperServer::start().unwrap();
    only_one_worker_runs(&format!("zk://{}", s.connect_string()));
}

#[test]
fn migration_lock_redis_to_etcd() {
    let r = RedisServer::start().unwrap();
    let e = EtcdServer::start().unwrap();
    let c = polylock::MigrateConfig::new(
        r.url(),
        format!("etcd://{}", e.addr()),
        polylock::Phase::Both,
    )
    .unwrap();
    only_one_worker_runs(&c.to_url());
}
