//! Benchmark (not a test), against five spawned redis-servers: the
//! uncontended Redlock cycle (acquire + release) for N = 3 and N = 5, next
//! to N times the cost of the same cycle on one node (`redis://`, the same
//! scripts and driver) measured in the same run.
//!
//! Redlock sends to every node at once, so a phase should cost about one
//! round trip, not N: the ratio `redlock / (N x single)` should stay well
//! below 1 (a Redlock cycle has one more phase than a single-node one: the
//! fencing token written back to the quorum).
//!
//! Beside them, the raw fan-out of this machine: one `PING` to 1, 3 and 5
//! nodes at once. On a machine with fewer cores than nodes the servers'
//! work cannot overlap, and that ratio, not 1, is the floor of Redlock's.
//!
//! Run: `cargo bench -p backend-redis --bench redlock` (release mode).

use std::time::Duration;

use backend_redis::{RedisBackend, RedlockBackend};
use lock_core::{AcquireRequest, LockBackend, LockName, OwnerToken};
use testkit::RedisServer;
use tokio::time::Instant;

const MEASURE: Duration = Duration::from_secs(4);
const WARMUP: usize = 300;

fn main() {
    let servers = RedisServer::start_independent(5, &[]).expect("start five redis-servers");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(&servers));
}

async fn run(servers: &[RedisServer]) {
    let name = LockName::new("bench/redlock").unwrap();
    let single = RedisBackend::connect(&servers[0].url())
        .await
        .expect("single-node backend");
    let three = RedlockBackend::connect(&format!(
        "redlock://{}?timeout=1s",
        RedisServer::host_list(&servers[..3])
    ))
    .await
    .expect("redlock N=3");
    let five = RedlockBackend::connect(&format!(
        "redlock://{}?timeout=1s",
        RedisServer::host_list(servers)
    ))
    .await
    .expect("redlock N=5");

    // What this machine allows: one PING to every node at once, next to
    // one PING to one node. On few cores the servers' own work does not
    // overlap, and this ratio bounds what Redlock's fan-out can reach.
    let mut raws = Vec::new();
    for s in servers {
        let client = redis::Client::open(s.url()).expect("client");
        raws.push(
            redis::aio::ConnectionManager::new(client)
                .await
                .expect("raw connection"),
        );
    }
    let ping1 = median_of(|| ping_all(&raws[..1])).await;
    let ping3 = median_of(|| ping_all(&raws[..3])).await;
    let ping5 = median_of(|| ping_all(&raws)).await;

    let one = median_cycle(&single, &name).await;
    let n3 = median_cycle(&three, &name).await;
    let n5 = median_cycle(&five, &name).await;
    println!(
        "five redis-servers on 127.0.0.1, tokio multi-thread runtime (2 workers), release build"
    );
    println!("uncontended cycle = try_acquire + release, median over {MEASURE:?} each");
    println!();
    println!(
        "raw PING fan-out             1 node {:>7.1} µs   3 nodes {:>7.1} µs ({:.2}x)   5 nodes {:>7.1} µs ({:.2}x)",
        us(ping1),
        us(ping3),
        ping3.as_secs_f64() / ping1.as_secs_f64(),
        us(ping5),
        ping5.as_secs_f64() / ping1.as_secs_f64()
    );
    println!("single node (redis://)      {:>8.1} µs", us(one));
    for (n, d) in [(3u32, n3), (5, n5)] {
        println!(
            "redlock N={n}                 {:>8.1} µs   N x single {:>8.1} µs   ratio {:.2}",
            us(d),
            us(one * n),
            d.as_secs_f64() / (one * n).as_secs_f64()
        );
    }
}

async fn cycle(backend: &dyn LockBackend, name: &LockName) {
    let req = AcquireRequest::new(
        name.clone(),
        OwnerToken::random(),
        Duration::from_secs(30),
        Duration::ZERO,
    )
    .unwrap();
    let lease = backend
        .try_acquire(&req)
        .await
        .expect("acquire")
        .expect("uncontended");
    backend.release(&lease).await.expect("release");
}

async fn median_cycle(backend: &dyn LockBackend, name: &LockName) -> Duration {
    median_of(|| cycle(backend, name)).await
}

async fn ping_all(conns: &[redis::aio::ConnectionManager]) {
    futures::future::join_all(conns.iter().map(|c| {
        let mut c = c.clone();
        async move {
            let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
        }
    }))
    .await;
}

async fn median_of<F, Fut>(mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..WARMUP {
        f().await;
    }
    let mut samples = Vec::new();
    let end = Instant::now() + MEASURE;
    while Instant::now() < end {
        let t = Instant::now();
        f().await;
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
