//! Throughput and latency of the ZooKeeper backend next to the raw cost of
//! the same ZooKeeper requests, measured in one run against one spawned
//! standalone server:
//!
//! 1. uncontended acquire + release cycles per second — raw backend calls
//!    and the guard API — next to a raw `zookeeper-client` session doing
//!    what a cycle costs: create an ephemeral sequential node, list the
//!    directory, delete the node;
//! 2. one server round trip (an `exists` request), and the raw floor of a
//!    hand-off (a delete by one session, the watch event at another, its
//!    get children);
//! 3. hand-off latency between queued waiters (release → next acquire).
//!
//! `cargo bench -p backend-zk --bench cycle` (release mode). Optional
//! argument: the number of cycles (default 2000).

use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::{AcquireRequest, LockBackend, LockName, Locker, OwnerToken};
use testkit::ZooKeeperServer;
use tokio::time::{sleep, Instant};
use zookeeper_client::{Acls, Client, CreateMode};

fn main() {
    let cycles: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    let server = ZooKeeperServer::start().expect("ZooKeeper starts");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(&server, cycles));
}

async fn run(server: &ZooKeeperServer, cycles: usize) {
    let url = format!("zk://{}", server.connect_string());
    println!(
        "ZooKeeper {} — {cycles} cycles per measurement",
        server.connect_string()
    );
    let raw = Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&server.connect_string())
        .await
        .expect("raw client");
    let dirs = CreateMode::Persistent.with_acls(Acls::anyone_all());
    raw.mkdir("/bench-raw/dir", &dirs).await.expect("mkdir");
    let backend = ZkBackend::connect(&url).await.expect("backend");
    let locker = Locker::new(backend.clone());

    raw_cycles(&raw, 50).await;
    backend_cycles(&backend, 50).await;
    guard_cycles(&locker, 50).await;

    // Interleaved short rounds so load changes on the shared machine hit
    // every variant alike.
    let rounds = 20;
    let per = (cycles / rounds).max(1);
    let mut t = [Duration::ZERO; 3];
    for r in 0..rounds {
        for v in 0..3 {
            let v = (v + r) % 3;
            let started = Instant::now();
            match v {
                0 => raw_cycles(&raw, per).await,
                1 => backend_cycles(&backend, per).await,
                _ => guard_cycles(&locker, per).await,
            }
            t[v] += started.elapsed();
        }
    }
    let n = (rounds * per) as f64;
    let rate = |d: Duration| n / d.as_secs_f64();
    println!();
    println!(
        "uncontended acquire + release ({} cycles each, {rounds} interleaved rounds):",
        rounds * per
    );
    println!(
        "  raw ZooKeeper: create + get children + delete     {:>7.0} cycles/s",
        rate(t[0])
    );
    println!(
        "  backend try_acquire + release                     {:>7.0} cycles/s  ratio {:.3}",
        rate(t[1]),
        rate(t[1]) / rate(t[0])
    );
    println!(
        "  Locker try_acquire + guard.release (watchdog)     {:>7.0} cycles/s  ratio {:.3}",
        rate(t[2]),
        rate(t[2]) / rate(t[0])
    );

    let rtt = round_trip(&raw, 200).await;
    println!();
    println!("one server round trip (exists after 20 ms idle), p50 of 200: {rtt:?}");
    let floor = raw_handoff(server, 200, false).await;
    println!(
        "raw hand-off floor (delete by one session -> watch event at another -> its get children, after 20 ms idle), p50 of 200:\n  one task: {floor:?}"
    );
    let tasks = raw_handoff(server, 200, true).await;
    println!("  the waiter on a task of its own (as the hand-offs below): {tasks:?}");
    backend_handoff(&url, 200, rtt).await;
    handoff(&url, 200, rtt).await;
}

/// Hand-off through the backend alone (no Locker, no watchdog).
async fn backend_handoff(url: &str, rounds: usize, rtt: Duration) {
    let clients = [
        std::sync::Arc::new(ZkBackend::connect(url).await.unwrap()),
        std::sync::Arc::new(ZkBackend::connect(url).await.unwrap()),
    ];
    let name = LockName::new("bench-handoff-raw").unwrap();
    let req = |wait| {
        AcquireRequest::new(
            name.clone(),
            OwnerToken::random(),
            Duration::from_secs(10),
            wait,
        )
        .unwrap()
    };
    let mut holder = (
        0,
        clients[0]
            .acquire(&req(Duration::ZERO))
            .await
            .unwrap()
            .unwrap(),
    );
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let next = (i + 1) % 2;
        let c = clients[next].clone();
        let r = req(Duration::from_secs(30));
        let waiter = tokio::spawn(async move {
            let l = c.acquire(&r).await.unwrap().expect("waiter acquires");
            (Instant::now(), l)
        });
        sleep(Duration::from_millis(20)).await;
        let released = Instant::now();
        clients[holder.0].release(&holder.1).await.unwrap();
        let (got, lease) = waiter.await.unwrap();
        samples.push(got - released);
        holder = (next, lease);
    }
    clients[holder.0].release(&holder.1).await.unwrap();
    samples.sort();
    let p50 = samples[samples.len() / 2];
    println!(
        "backend hand-off (no Locker), p50 of {rounds}: {p50:?} ({:.1} round trips)",
        p50.as_secs_f64() / rtt.as_secs_f64()
    );
}

/// What a hand-off minimally costs in ZooKeeper requests, with raw clients.
async fn raw_handoff(server: &ZooKeeperServer, n: usize, spawned: bool) -> Duration {
    let a = Client::connect(&server.connect_string()).await.unwrap();
    let b = Client::connect(&server.connect_string()).await.unwrap();
    let opts = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    let mut s = Vec::with_capacity(n);
    for _ in 0..n {
        a.create("/bench-raw/dir/holder", b"x", &opts)
            .await
            .unwrap();
        let (_, watcher) = b
            .check_and_watch_stat("/bench-raw/dir/holder")
            .await
            .unwrap();
        let t = Instant::now();
        if spawned {
            let b = b.clone();
            let waiter = tokio::spawn(async move {
                watcher.changed().await;
                b.list_children("/bench-raw/dir").await.unwrap();
                Instant::now()
            });
            a.delete("/bench-raw/dir/holder", None).await.unwrap();
            s.push(waiter.await.unwrap() - t);
        } else {
            a.delete("/bench-raw/dir/holder", None).await.unwrap();
            watcher.changed().await;
            b.list_children("/bench-raw/dir").await.unwrap();
            s.push(t.elapsed());
        }
    }
    s.sort();
    s[s.len() / 2]
}

async fn raw_cycles(c: &Client, n: usize) {
    let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    for _ in 0..n {
        let (_, seq) = c
            .create("/bench-raw/dir/_c_0123-lock-", b"owner", &opts)
            .await
            .expect("create");
        let children = c.list_children("/bench-raw/dir").await.expect("list");
        assert!(!children.is_empty());
        c.delete(&format!("/bench-raw/dir/_c_0123-lock-{seq}"), None)
            .await
            .expect("delete");
    }
}

async fn backend_cycles(b: &ZkBackend, n: usize) {
    let name = LockName::new("bench-backend").unwrap();
    for _ in 0..n {
        let req = AcquireRequest::new(
            name.clone(),
            OwnerToken::random(),
            Duration::from_secs(10),
            Duration::ZERO,
        )
        .unwrap();
        let lease = b.try_acquire(&req).await.unwrap().expect("uncontended");
        b.release(&lease).await.unwrap();
    }
}

async fn guard_cycles(l: &Locker, n: usize) {
    for _ in 0..n {
        let g = l
            .lock("bench-guard")
            .ttl(Duration::from_secs(10))
            .try_acquire()
            .await
            .unwrap()
            .expect("uncontended");
        g.release().await.unwrap();
    }
}

async fn round_trip(c: &Client, n: usize) -> Duration {
    let mut s = Vec::with_capacity(n);
    for _ in 0..n {
        // The same idle as before each hand-off.
        sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        c.check_stat("/bench-raw").await.expect("exists");
        s.push(t.elapsed());
    }
    s.sort();
    s[s.len() / 2]
}

async fn handoff(url: &str, rounds: usize, rtt: Duration) {
    let a = Locker::new(ZkBackend::connect(url).await.unwrap());
    let b = Locker::new(ZkBackend::connect(url).await.unwrap());
    let name = "bench-handoff";
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let mut samples = Vec::with_capacity(rounds);
    let mut holder = a.lock(name).acquire().await.unwrap();
    let lockers = [a, b];
    for i in 0..rounds {
        let next = lockers[(i + 1) % 2].clone();
        let tx = tx.clone();
        let waiter = tokio::spawn(async move {
            let g = next
                .lock(name)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .expect("waiter acquires");
            tx.send(Instant::now()).unwrap();
            g
        });
        // Let the waiter queue and start watching.
        sleep(Duration::from_millis(20)).await;
        let released = Instant::now();
        holder.release().await.unwrap();
        let got = rx.recv().await.unwrap();
        samples.push(got - released);
        holder = waiter.await.unwrap();
    }
    holder.release().await.unwrap();
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    println!();
    println!("hand-off to a queued waiter ({rounds} hand-offs, release start → acquire returns):");
    println!(
        "  p50 {:?} ({:.1} round trips)  p90 {:?}  p99 {:?}  max {:?}",
        pct(0.5),
        pct(0.5).as_secs_f64() / rtt.as_secs_f64(),
        pct(0.9),
        pct(0.99),
        samples[samples.len() - 1]
    );
}
