//! Benchmark (not a test), against a spawned redis-server:
//!
//! 1. the raw round trip (`PING`) of this client and server;
//! 2. single-client acquire+release cycles through the lock layer, next to
//!    the same two scripts sent raw (EVALSHA acquire + EVALSHA release,
//!    through the same driver connection type, no lock layer), and next to
//!    `SET NX PX` + `DEL`; the figure that matters is the ratio (target
//!    >= 0.9);
//! 3. hand-off latency with 8 clients contending for one lock: from the
//!    moment the holder starts its release to the moment the next holder's
//!    acquire returns (target: median under 3 round trips).
//!
//! Every figure comes from one run on one machine, so the ratios hold even
//! where the absolute numbers do not.
//!
//! Run: `cargo bench -p backend-redis --bench cycle` (release mode).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend_redis::RedisBackend;
use lock_core::{AcquireRequest, LockBackend, LockName, OwnerToken};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

/// How long the cycle comparison runs, in all.
const MEASURE: Duration = Duration::from_secs(12);
const BATCH: u64 = 50;
fn contenders() -> usize {
    std::env::var("BENCH_CONTENDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}
const HANDOFFS: usize = 3000;

fn main() {
    let server = testkit::RedisServer::start().expect("start redis-server");
    let rt = if std::env::var("BENCH_RT").as_deref() == Ok("current") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    };
    rt.block_on(run(&server.url()));
}

async fn run(url: &str) {
    let client = redis::Client::open(url).expect("client");
    let mut raw = ConnectionManager::new(client)
        .await
        .expect("raw connection");
    let backend = RedisBackend::connect(url).await.expect("backend");
    let name = LockName::new("bench/cycle").unwrap();
    let keys = backend.keys(&name).unwrap();

    // Warm-up: connections, scripts, allocator.
    for _ in 0..2000 {
        let _: String = redis::cmd("PING").query_async(&mut raw).await.unwrap();
        lock_cycle(&backend, &name).await;
    }

    let rtt = ping_rtt(&mut raw, Duration::ZERO).await;
    let idle_rtt = ping_rtt(&mut raw, Duration::from_millis(2)).await;
    println!("redis-server {url}, tokio multi-thread runtime (2 workers), release build");
    println!();
    println!(
        "raw PING round trip            median {:>7.1} µs (back to back)",
        us(rtt)
    );
    println!(
        "raw PING round trip, idle      median {:>7.1} µs (each after 2 ms idle, as in a hand-off)",
        us(idle_rtt)
    );

    let acquire = redis::Script::new(include_str!("../scripts/plain_acquire.lua"));
    let release = redis::Script::new(include_str!("../scripts/plain_release.lua"));
    let raw_scripts = || {
        let mut raw = raw.clone();
        let (acquire, release, keys) = (&acquire, &release, &keys);
        async move {
            let token = OwnerToken::random().to_string();
            let (ok, fence): (i64, i64) = acquire
                .key(&keys.lock)
                .key(&keys.fence)
                .arg(&token)
                .arg(30_000)
                .invoke_async(&mut raw)
                .await
                .unwrap();
            assert_eq!(ok, 1);
            let r: i64 = release
                .key(&keys.lock)
                .key(&keys.fence)
                .arg(&token)
                .arg(fence)
                .arg(&keys.channel)
                .invoke_async(&mut raw)
                .await
                .unwrap();
            assert_eq!(r, 1);
        }
    };
    let raw_setdel = || {
        let mut raw = raw.clone();
        let key = &keys.lock;
        async move {
            let token = OwnerToken::random().to_string();
            let ok: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut raw)
                .await
                .unwrap();
            assert!(ok.is_some());
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };
    // Small batches of the three, interleaved, so that load from anything
    // else on the machine hits all three alike.
    let (mut t_lock, mut t_raw, mut t_setdel) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut cycles = 0u64;
    let start = Instant::now();
    while start.elapsed() < MEASURE {
        t_lock += batch(|| lock_cycle(&backend, &name)).await;
        t_raw += batch(raw_scripts).await;
        t_setdel += batch(raw_setdel).await;
        cycles += BATCH;
    }
    let per = |t: Duration| cycles as f64 / t.as_secs_f64();
    let (lock, scripts, setdel) = (per(t_lock), per(t_raw), per(t_setdel));
    println!(
        "acquire+release via the lock   {lock:>9.0} cycles/s  ({:.1} µs/cycle)",
        1e6 / lock
    );
    println!(
        "same two EVALSHA, raw          {scripts:>9.0} cycles/s  ({:.1} µs/cycle)",
        1e6 / scripts
    );
    println!(
        "SET NX PX + DEL, raw           {setdel:>9.0} cycles/s  ({:.1} µs/cycle)",
        1e6 / setdel
    );
    println!(
        "ratio lock / raw EVALSHA       {:>9.3}   (target >= 0.9; {cycles} cycles each)",
        lock / scripts
    );
    println!("ratio lock / raw SET+DEL       {:>9.3}", lock / setdel);

    let handoffs = handoff(url).await;
    let (med, p99) = (percentile(&handoffs, 0.5), percentile(&handoffs, 0.99));
    println!();
    println!(
        "hand-off, {} clients on one lock, {} hand-offs:",
        contenders(),
        handoffs.len()
    );
    println!(
        "  median {:>7.1} µs = {:.2} RTT = {:.2} idle RTT   (target < 3 RTT)",
        us(med),
        us(med) / us(rtt),
        us(med) / us(idle_rtt)
    );
    println!(
        "  p99    {:>7.1} µs = {:.2} RTT = {:.2} idle RTT",
        us(p99),
        us(p99) / us(rtt),
        us(p99) / us(idle_rtt)
    );
    let floor = raw_handoff(url).await;
    let (fmed, fp99) = (percentile(&floor, 0.5), percentile(&floor, 0.99));
    println!(
        "  floor without the lock layer (PUBLISH -> raw subscriber -> one EVALSHA):\n  median {:>7.1} µs = {:.2} RTT = {:.2} idle RTT, p99 {:.1} µs",
        us(fmed),
        us(fmed) / us(rtt),
        us(fmed) / us(idle_rtt),
        us(fp99)
    );
    let rtt_after = ping_rtt(&mut raw, Duration::ZERO).await;
    println!(
        "raw PING round trip after      median {:>7.1} µs",
        us(rtt_after)
    );
}

async fn lock_cycle(backend: &RedisBackend, name: &LockName) {
    let req = AcquireRequest::new(
        name.clone(),
        OwnerToken::random(),
        Duration::from_secs(30),
        Duration::ZERO,
    )
    .unwrap();
    let lease = backend.try_acquire(&req).await.unwrap().expect("free");
    backend.release(&lease).await.unwrap();
}

/// How long `BATCH` runs of `f`, back to back, take.
async fn batch<F, Fut>(mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let start = Instant::now();
    for _ in 0..BATCH {
        f().await;
    }
    start.elapsed()
}

/// Median PING round trip, with `pause` between pings.
async fn ping_rtt(raw: &mut ConnectionManager, pause: Duration) -> Duration {
    let n = if pause.is_zero() { 5000 } else { 1000 };
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(raw).await.unwrap();
        samples.push(t.elapsed());
    }
    percentile(&samples, 0.5)
}

/// Several clients loop acquire (waiting) → hold 200 µs → release → step
/// back 2 ms. A sample is taken when the lock passed to a client that was
/// already waiting when the previous holder started its release, and runs
/// from that moment to the waiter's acquire returning.
async fn handoff(url: &str) -> Vec<Duration> {
    let name = LockName::new("bench/handoff").unwrap();
    // (when the last release started, by which client)
    let last: Arc<Mutex<Option<(Instant, usize)>>> = Arc::new(Mutex::new(None));
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for id in 0..contenders() {
        let backend = RedisBackend::connect(url).await.expect("contender");
        let (name, last, samples) = (name.clone(), last.clone(), samples.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                if samples.lock().unwrap().len() >= HANDOFFS {
                    return;
                }
                let req = AcquireRequest::new(
                    name.clone(),
                    OwnerToken::random(),
                    Duration::from_secs(30),
                    Duration::from_secs(30),
                )
                .unwrap();
                let waiting_since = Instant::now();
                let lease = backend.acquire(&req).await.unwrap().expect("acquired");
                let got = Instant::now();
                if let Some((at, by)) = *last.lock().unwrap() {
                    if by != id && waiting_since < at {
                        samples.lock().unwrap().push(got - at);
                    }
                }
                // Hold briefly, as a critical section would.
                tokio::time::sleep(Duration::from_micros(200)).await;
                *last.lock().unwrap() = Some((Instant::now(), id));
                backend.release(&lease).await.unwrap();
                // Step back so the lock goes to a waiter, not back to us.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut s = samples.lock().unwrap().clone();
    s.sort();
    s
}

/// The same path with no lock layer: one client publishes, another's raw
/// pub/sub stream receives and sends one EVALSHA; from the publish to that
/// reply. What the driver and machine cost before polylock adds anything.
async fn raw_handoff(url: &str) -> Vec<Duration> {
    use futures::StreamExt;
    let client = redis::Client::open(url).unwrap();
    let mut publisher = ConnectionManager::new(client.clone()).await.unwrap();
    let mut conn = ConnectionManager::new(client.clone()).await.unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("bench/floor").await.unwrap();
    let mut stream = pubsub.into_on_message();
    let started: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let acquire = redis::Script::new(include_str!("../scripts/plain_acquire.lua"));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let receiver = tokio::spawn({
        let started = started.clone();
        async move {
            let mut samples = Vec::new();
            while samples.len() < HANDOFFS {
                let _msg = stream.next().await.unwrap();
                let _: (i64, i64) = acquire
                    .key("bench/floor/lock")
                    .key("bench/floor/fence")
                    .arg("t")
                    .arg(1)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                let t0 = started.lock().unwrap().take().unwrap();
                samples.push(t0.elapsed());
                let _ = done_tx.send(());
            }
            samples
        }
    });
    for _ in 0..HANDOFFS {
        tokio::time::sleep(Duration::from_millis(2)).await;
        *started.lock().unwrap() = Some(Instant::now());
        let _: i64 = redis::cmd("PUBLISH")
            .arg("bench/floor")
            .arg("0")
            .query_async(&mut publisher)
            .await
            .unwrap();
        done_rx.recv().await.unwrap();
    }
    let mut s = receiver.await.unwrap();
    s.sort();
    s
}

fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
