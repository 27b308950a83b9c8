//! Throughput and latency of the etcd backend next to the raw cost of the
//! same etcd requests, measured in one run against one spawned etcd:
//!
//! 1. uncontended acquire + release cycles per second — raw backend calls
//!    and the guard API — next to a raw etcd client doing what a cycle
//!    minimally costs (a put-if-absent transaction with a lease, then a
//!    delete) and doing exactly the backend's two requests;
//! 2. hand-off latency between queued waiters (release → next acquire);
//! 3. keepalive requests per second with 1 and with 1,000 held locks.
//!
//! `cargo bench -p backend-etcd --bench cycle` (release mode). Optional
//! arguments: the number of cycles (default 2000).

use std::sync::Arc;
use std::time::Duration;

use backend_etcd::EtcdBackend;
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use lock_core::{AcquireRequest, LockBackend, LockName, Locker, OwnerToken};
use testkit::EtcdServer;
use tokio::time::{sleep, Instant};

fn main() {
    let cycles: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    let server = EtcdServer::start().expect("etcd starts");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(&server, cycles));
}

async fn run(server: &EtcdServer, cycles: usize) {
    let url = format!("etcd://{}", server.endpoint().trim_start_matches("http://"));
    println!(
        "etcd {} — {cycles} cycles per measurement",
        server.endpoint()
    );

    // Warm up every path (connections, session, server caches).
    let raw = Client::connect([server.endpoint()], None)
        .await
        .expect("raw client");
    let backend = EtcdBackend::connect(&url).await.expect("backend");
    let locker = Locker::new(backend.clone());
    let mut raw_k = RawKeys::new(&raw, "bench-raw/").await;
    let mut same_k = RawKeys::new(&raw, "bench-same/").await;
    raw_k.plain(50).await;
    same_k.same_as_backend(50).await;
    backend_cycles(&backend, 50).await;
    guard_cycles(&locker, 50).await;

    // The machine is shared (etcd runs on it too, and maybe other work):
    // run the variants in many short interleaved rounds, so that load
    // changes hit all of them alike, and compare total times.
    let rounds = 20;
    let per = (cycles / rounds).max(1);
    let mut t = [Duration::ZERO; 4];
    for r in 0..rounds {
        for v in 0..4 {
            // Rotate the order each round.
            let v = (v + r) % 4;
            let started = Instant::now();
            match v {
                0 => raw_k.plain(per).await,
                1 => same_k.same_as_backend(per).await,
                2 => backend_cycles(&backend, per).await,
                _ => guard_cycles(&locker, per).await,
            }
            t[v] += started.elapsed();
        }
    }
    raw_k.done().await;
    same_k.done().await;
    let n = (rounds * per) as f64;
    let rate = |d: Duration| n / d.as_secs_f64();
    println!();
    println!(
        "uncontended acquire + release ({} cycles each, {rounds} interleaved rounds):",
        rounds * per
    );
    println!(
        "  raw etcd: txn put-if-absent with lease + delete       {:>7.0} cycles/s",
        rate(t[0])
    );
    println!(
        "  raw etcd: the backend's own two requests              {:>7.0} cycles/s  ratio {:.3}",
        rate(t[1]),
        rate(t[1]) / rate(t[0])
    );
    println!(
        "  backend try_acquire + release                         {:>7.0} cycles/s  ratio {:.3} (vs own requests {:.3})",
        rate(t[2]),
        rate(t[2]) / rate(t[0]),
        rate(t[2]) / rate(t[1])
    );
    println!(
        "  Locker try_acquire + guard.release (with watchdog)    {:>7.0} cycles/s  ratio {:.3} (vs own requests {:.3})",
        rate(t[3]),
        rate(t[3]) / rate(t[0]),
        rate(t[3]) / rate(t[1])
    );

    locker_overhead().await;
    handoff(&url, 200).await;
    keepalives(&url).await;
}

/// A plain etcd client doing by hand what one cycle costs, on its own key
/// with its own lease.
struct RawKeys {
    c: Client,
    lease: i64,
    pfx: &'static str,
    key: String,
}

const OWNER: &str = "0123456789abcdef0123456789abcdef";

impl RawKeys {
    async fn new(client: &Client, pfx: &'static str) -> RawKeys {
        let mut c = client.clone();
        let lease = c.lease_grant(60, None).await.expect("grant").id();
        let key = format!("{pfx}{lease:x}");
        RawKeys { c, lease, pfx, key }
    }

    /// A transaction that creates the key with the lease if absent, then a
    /// delete: the minimum for a lock with a lease.
    async fn plain(&mut self, n: usize) {
        for _ in 0..n {
            let txn = Txn::new()
                .when(vec![Compare::create_revision(
                    self.key.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(vec![TxnOp::put(
                    self.key.as_str(),
                    OWNER,
                    Some(PutOptions::new().with_lease(self.lease)),
                )]);
            assert!(self.c.txn(txn).await.expect("txn").succeeded());
            self.c
                .delete(self.key.as_str(), None)
                .await
                .expect("delete");
        }
    }

    /// The two requests the backend sends: a create-if-absent transaction
    /// that also counts the claims, then the delete.
    async fn same_as_backend(&mut self, n: usize) {
        let pfx = self.pfx;
        for _ in 0..n {
            let count = GetOptions::new()
                .with_range(format!("{pfx}g"))
                .with_count_only();
            let txn = Txn::new()
                .when(vec![Compare::create_revision(
                    self.key.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(vec![
                    TxnOp::put(
                        self.key.as_str(),
                        OWNER,
                        Some(PutOptions::new().with_lease(self.lease)),
                    ),
                    TxnOp::get(format!("{pfx}0"), Some(count)),
                ]);
            let r = self.c.txn(txn).await.expect("txn");
            assert!(r.succeeded());
            // A holder's own release is a plain delete (see the backend).
            self.c
                .delete(self.key.as_str(), None)
                .await
                .expect("delete");
        }
    }

    async fn done(mut self) {
        let _ = self.c.lease_revoke(self.lease).await;
    }
}

async fn backend_cycles(backend: &EtcdBackend, n: usize) {
    let name = LockName::new("bench-backend").unwrap();
    for _ in 0..n {
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
            .expect("free");
        backend.release(&lease).await.expect("release");
    }
}

async fn guard_cycles(locker: &Locker, n: usize) {
    for _ in 0..n {
        let g = locker
            .lock("bench-guard")
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
        g.release().await.expect("release");
    }
}

/// What the guard API adds per cycle, measured on the in-process backend
/// (no I/O): the push onto the watchdog's renewal heap (no task per lock),
/// the span, the metrics.
async fn locker_overhead() {
    let memory = lock_core::MemoryBackend::new();
    let locker = Locker::new(memory.clone());
    let n = 20_000;
    let name = LockName::new("overhead").unwrap();
    let started = Instant::now();
    for _ in 0..n {
        let req = AcquireRequest::new(
            name.clone(),
            OwnerToken::random(),
            Duration::from_secs(30),
            Duration::ZERO,
        )
        .unwrap();
        let lease = memory.try_acquire(&req).await.unwrap().unwrap();
        memory.release(&lease).await.unwrap();
    }
    let raw = started.elapsed() / n;
    let started = Instant::now();
    guard_cycles(&locker, n as usize).await;
    let guarded = started.elapsed() / n;
    println!();
    println!(
        "guard API cost per cycle, on the in-process backend: {guarded:?} vs {raw:?} raw \
         (+{:?} per cycle, lock-core's watchdog heap and bookkeeping)",
        guarded.saturating_sub(raw)
    );
}

/// Two clients pass one lock back and forth, the other always queued:
/// the time from the start of a release to the waiter's acquire returning.
async fn handoff(url: &str, rounds: usize) {
    let a = Locker::new(EtcdBackend::connect(url).await.unwrap());
    let b = Locker::new(EtcdBackend::connect(url).await.unwrap());
    let name = "bench-handoff";
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let samples = Arc::new(std::sync::Mutex::new(Vec::with_capacity(rounds)));
    let mut holder = a.lock(name).acquire().await.unwrap();
    // `b` waits; each time it gets the lock, the other side queues again.
    let spawn_waiter =
        |locker: Locker, tx: tokio::sync::mpsc::UnboundedSender<(usize, Instant)>, i: usize| {
            tokio::spawn(async move {
                let g = locker
                    .lock(name)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .expect("waiter acquires");
                tx.send((i, Instant::now())).unwrap();
                g
            })
        };
    let lockers = [a, b];
    for i in 0..rounds {
        let next = &lockers[(i + 1) % 2];
        let waiter = spawn_waiter(next.clone(), tx.clone(), i);
        // Let the waiter queue and start watching.
        sleep(Duration::from_millis(20)).await;
        let released = Instant::now();
        holder.release().await.unwrap();
        let (_, got) = rx.recv().await.unwrap();
        samples.lock().unwrap().push(got - released);
        holder = waiter.await.unwrap();
    }
    holder.release().await.unwrap();
    let mut s = samples.lock().unwrap().clone();
    s.sort();
    let pct = |p: f64| s[((s.len() as f64 * p) as usize).min(s.len() - 1)];
    println!();
    println!("hand-off to a queued waiter ({rounds} hand-offs, release start → acquire returns):");
    println!(
        "  p50 {:?}  p90 {:?}  p99 {:?}  max {:?}",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        s[s.len() - 1]
    );
}

/// Keepalive requests per second of a client holding 1 lock and of one
/// holding 1,000, over the same window, watchdogs renewing all of them.
async fn keepalives(url: &str) {
    let ttl = Duration::from_secs(3);
    let one_backend = EtcdBackend::connect(url).await.unwrap();
    let many_backend = EtcdBackend::connect(url).await.unwrap();
    let one = Locker::new(one_backend.clone());
    let many = Locker::new(many_backend.clone());
    let single = one
        .lock("bench-ka/single")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let mut guards = Vec::new();
    for i in 0..1000 {
        guards.push(
            many.lock(format!("bench-ka/{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let count = |b: &EtcdBackend| b.sessions().iter().map(|s| s.keepalives_sent).sum::<u64>();
    let (one0, many0) = (count(&one_backend), count(&many_backend));
    let window = Duration::from_secs(12);
    sleep(window).await;
    let (one1, many1) = (count(&one_backend), count(&many_backend));
    let secs = window.as_secs_f64();
    println!();
    println!("keepalive requests per second, TTL {ttl:?}, over {window:?}:");
    println!("  1 held lock       {:.2}/s", (one1 - one0) as f64 / secs);
    println!(
        "  1,000 held locks  {:.2}/s  (sessions: {}, all held: {})",
        (many1 - many0) as f64 / secs,
        many_backend.sessions().len(),
        guards.iter().all(|g| g.is_held())
    );
    single.release().await.unwrap();
    for g in guards {
        g.release().await.unwrap();
    }
}
