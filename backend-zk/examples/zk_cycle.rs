//! Prints the uncontended lock cycle (`try_acquire` + `release` through the
//! guard API) next to the raw ZooKeeper requests a lock cycle needs
//! (ephemeral sequential create + get children + delete) from one client,
//! one task and 64 tasks on distinct names, on a server started by the test
//! kit; and the requests the server counted per polylock cycle. Measures;
//! asserts nothing about time.
//!
//! `cargo run --release -p backend-zk --example zk_cycle [SECONDS]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::{LockError, Locker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode};

const TTL: Duration = Duration::from_secs(10);

async fn polylock_cycle(locker: &Locker, name: &str) -> Result<(), LockError> {
    let g = locker
        .lock(name)
        .ttl(TTL)
        .try_acquire()
        .await?
        .expect("uncontended");
    g.release().await
}

async fn raw_cycle(c: &Client, name: &str) {
    let dir = format!("/raw/{name}");
    let prefix = format!("{dir}/lock-");
    let node = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, seq) = match c.create(&prefix, b"0123456789abcdef", &node).await {
        Err(zookeeper_client::Error::NoNode) => {
            let dirs = CreateMode::Persistent.with_acls(Acls::anyone_all());
            c.mkdir(&dir, &dirs).await.expect("mkdir");
            c.create(&prefix, b"0123456789abcdef", &node).await
        }
        r => r,
    }
    .expect("create");
    c.list_children(&dir).await.expect("list");
    c.delete(&format!("{prefix}{seq}"), None)
        .await
        .expect("delete");
}

/// Packets the server received on the connection of session `sid` (`cons`).
async fn received(addr: std::net::SocketAddr, sid: i64) -> u64 {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("cons");
    s.write_all(b"cons").await.expect("cons");
    let mut text = String::new();
    s.read_to_string(&mut text).await.expect("cons");
    let want = format!("sid=0x{sid:x},");
    let line = text
        .lines()
        .find(|l| l.contains(&want))
        .unwrap_or_else(|| panic!("no connection of {want} in {text}"));
    let at = line.find("recved=").expect("recved") + "recved=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count")
}

async fn one_task(locker: &Locker, raw: &Client, d: Duration) {
    let rounds = 10;
    let per = d / (2 * rounds);
    let (mut mine, mut theirs) = ((0u64, Duration::ZERO), (0u64, Duration::ZERO));
    for r in 0..rounds {
        for side in [r % 2, 1 - r % 2] {
            let t = Instant::now();
            let mut n = 0;
            while t.elapsed() < per {
                if side == 0 {
                    polylock_cycle(locker, "bench/cycle").await.expect("cycle");
                } else {
                    raw_cycle(raw, "bench-cycle").await;
                }
                n += 1;
            }
            let acc = if side == 0 { &mut mine } else { &mut theirs };
            acc.0 += n;
            acc.1 += t.elapsed();
        }
    }
    let (a, b) = (
        mine.0 as f64 / mine.1.as_secs_f64(),
        theirs.0 as f64 / theirs.1.as_secs_f64(),
    );
    println!(
        "1 task:   polylock {a:>7.0}/s  raw {b:>7.0}/s  ratio {:.2}",
        a / b
    );
}

async fn many(locker: &Locker, raw: &Client, tasks: usize, d: Duration) {
    let (mut mine, mut theirs) = (0.0, 0.0);
    for r in 0..4 {
        let polylock = r % 2 == 0;
        let done = Arc::new(AtomicU64::new(0));
        let stop = Instant::now() + d / 4;
        let t = Instant::now();
        let hs: Vec<_> = (0..tasks)
            .map(|i| {
                let (done, locker, raw) = (done.clone(), locker.clone(), raw.clone());
                tokio::spawn(async move {
                    while Instant::now() < stop {
                        if polylock {
                            polylock_cycle(&locker, &format!("bench/par/{i}"))
                                .await
                                .expect("cycle");
                        } else {
                            raw_cycle(&raw, &format!("bench-par-{i}")).await;
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in hs {
            h.await.expect("task");
        }
        let rate = done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64();
        if polylock {
            mine += rate / 2.0;
        } else {
            theirs += rate / 2.0;
        }
    }
    println!(
        "{tasks} tasks: polylock {mine:>7.0}/s  raw {theirs:>7.0}/s  ratio {:.2}",
        mine / theirs
    );
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4.0);
    let d = Duration::from_secs_f64(secs);
    let server = testkit::ZooKeeperServer::start().expect("start ZooKeeper");
    let backend = ZkBackend::connect(&format!("zk://{}", server.connect_string())).await?;
    let sid = backend.session_id(TTL).await?;
    let locker = Locker::new(backend);
    let raw = Client::connect(&server.connect_string())
        .await
        .expect("raw client");
    let dirs = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let _ = raw.create("/raw", b"", &dirs).await;
    for _ in 0..50 {
        polylock_cycle(&locker, "bench/cycle").await?;
        raw_cycle(&raw, "bench-cycle").await;
    }
    let n = 500;
    let before = received(server.addr(), sid).await;
    for _ in 0..n {
        polylock_cycle(&locker, "bench/cycle").await?;
    }
    let after = received(server.addr(), sid).await;
    println!(
        "requests per polylock cycle: {:.2}",
        (after - before) as f64 / n as f64
    );
    one_task(&locker, &raw, d).await;
    many(&locker, &raw, 64, d).await;
    Ok(())
}
