//! Prints the hand-off latency between two queued clients (release by the
//! holder → `acquire` returning in the waiter) next to the server's round
//! trip and the raw cost of its pieces (a delete, the watch event it
//! sends, a read), on an etcd server started by the test kit. Measures;
//! asserts nothing about time.
//!
//! `cargo run --release -p backend-etcd --example etcd_handoff [ROUNDS]`

use std::time::Duration;

use backend_etcd::EtcdBackend;
use etcd_client::{EventType, WatchFilterType, WatchOptions};
use lock_core::{AcquireRequest, LockBackend, LockError, LockName, OwnerToken};
use tokio::time::{sleep, Instant};

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn show(what: &str, v: &mut [Duration], rtt: Duration) {
    let (p50, p99) = (percentile(v, 0.5), percentile(v, 0.99));
    println!(
        "{what:<26} p50 {p50:>9.1?} ({:.1} RTT)  p99 {p99:>9.1?} ({:.1} RTT)",
        p50.as_secs_f64() / rtt.as_secs_f64(),
        p99.as_secs_f64() / rtt.as_secs_f64()
    );
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let server = testkit::EtcdServer::start().expect("start etcd");
    let url = format!("etcd://{}", server.endpoint().trim_start_matches("http://"));
    let ttl = Duration::from_secs(10);
    let clients = [
        EtcdBackend::connect(&url).await?,
        EtcdBackend::connect(&url).await?,
    ];
    let name = LockName::new("handoff")?;
    let req = || AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, ttl);
    let raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("raw client");
    let mut kv = raw.kv_client();

    // The round trip of one plain get, as the bench measures it.
    let mut rtts = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        kv.get("raw/ping", None).await.expect("get");
        rtts.push(t.elapsed());
    }
    let rtt = percentile(&mut rtts, 0.5);
    println!("round trip (get)           p50 {rtt:.1?}");

    // The releaser's request alone, and when the watcher sees it.
    let (mut deletes, mut events) = (Vec::new(), Vec::new());
    let mut watch = raw.watch_client();
    for i in 0..rounds {
        let key = format!("raw/{i}");
        kv.put(key.as_str(), "v", None).await.expect("put");
        let mut stream = watch
            .watch(
                key.as_str(),
                Some(WatchOptions::new().with_filters([WatchFilterType::NoPut])),
            )
            .await
            .expect("watch");
        stream.message().await.expect("created");
        sleep(Duration::from_millis(5)).await;
        let t = Instant::now();
        let seen = async {
            loop {
                let r = stream.message().await.expect("watch").expect("open");
                if r.events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return t.elapsed();
                }
            }
        };
        let del = async {
            kv.delete(key.as_str(), None).await.expect("delete");
            t.elapsed()
        };
        let (d, e) = tokio::join!(del, seen);
        deletes.push(d);
        events.push(e);
    }
    show("raw delete", &mut deletes, rtt);
    show("raw delete → watch event", &mut events, rtt);

    let prefix = clients[0].key_prefix(&name);
    let mut lease = clients[0].acquire(&req()?).await?.expect("free lock");
    let (mut handoff, mut release) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let (holder, waiter) = (&clients[i % 2], clients[(i + 1) % 2].clone());
        let r = req()?;
        let task = tokio::spawn(async move {
            let got = waiter.acquire(&r).await;
            (Instant::now(), got)
        });
        // Queued, and past its read + watch requests.
        loop {
            let n = kv
                .get(
                    prefix.as_str(),
                    Some(
                        etcd_client::GetOptions::new()
                            .with_prefix()
                            .with_count_only(),
                    ),
                )
                .await
                .expect("count")
                .count();
            if n >= 2 {
                break;
            }
            sleep(Duration::from_millis(1)).await;
        }
        sleep(Duration::from_millis(20)).await;
        let t0 = Instant::now();
        holder.release(&lease).await?;
        release.push(t0.elapsed());
        let (t1, got) = task.await.expect("task");
        lease = got?.expect("served");
        handoff.push(t1 - t0);
    }
    show("release, waiter queued", &mut release, rtt);
    show("hand-off", &mut handoff, rtt);
    clients[rounds % 2].release(&lease).await?;

    // An uncontended cycle next to the raw one (put-if-absent + delete).
    let mut cycle = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let lease = clients[0].try_acquire(&req()?).await?.expect("free lock");
        clients[0].release(&lease).await?;
        cycle.push(t.elapsed());
    }
    show("cycle (try_acquire+release)", &mut cycle, rtt);
    Ok(())
}
