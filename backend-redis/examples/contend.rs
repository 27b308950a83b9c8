//! Quick measurements on a redis-server started by the test kit, for
//! profiling between bench runs: the uncontended cycle (`try_acquire` +
//! `release`) next to a raw `SET NX PX` + `DEL`, and 8 workers (each its
//! own client) contending for one name with a 1 ms busy hold, in the
//! default and the fair mode. Measures; asserts nothing about time.
//!
//! `cargo run --release -p backend-redis --example contend [SECONDS]`

use std::sync::Arc;
use std::time::Duration;

use backend_redis::RedisBackend;
use lock_core::{AcquireRequest, LockBackend, LockError, LockName, OwnerToken};
use tokio::time::Instant;

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

async fn cycle(url: &str, secs: f64) -> Result<(), LockError> {
    let b = RedisBackend::connect(url).await?;
    let name = LockName::new("cycle")?;
    let ttl = Duration::from_secs(10);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let t = Instant::now();
    while Instant::now() < until {
        let req = AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, Duration::ZERO)?;
        let lease = b.try_acquire(&req).await?.expect("free");
        b.release(&lease).await?;
        n += 1;
    }
    let ours = n as f64 / t.elapsed().as_secs_f64();
    let mut raw = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let t = Instant::now();
    while Instant::now() < until {
        let _: Option<String> = redis::cmd("SET")
            .arg("raw")
            .arg("x")
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut raw)
            .await
            .unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg("raw")
            .query_async(&mut raw)
            .await
            .unwrap();
        n += 1;
    }
    let raw_rate = n as f64 / t.elapsed().as_secs_f64();
    println!(
        "{url:<40} cycle {ours:>7.0}/s  raw {raw_rate:>7.0}/s  ratio {:.2}",
        ours / raw_rate
    );
    Ok(())
}

async fn contend(url: &str, secs: f64) -> Result<(), LockError> {
    let name = LockName::new("contended")?;
    let ttl = Duration::from_secs(10);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let b = Arc::new(RedisBackend::connect(url).await?);
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            while Instant::now() < until {
                let req = AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, ttl)?;
                let asked = Instant::now();
                let lease = b.acquire(&req).await?.expect("within the wait");
                waits.push(asked.elapsed());
                let hold = Instant::now() + Duration::from_millis(1);
                while Instant::now() < hold {
                    tokio::task::yield_now().await;
                }
                b.release(&lease).await?;
            }
            Ok::<_, LockError>(waits)
        }));
    }
    let t = Instant::now();
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await.expect("worker")?);
    }
    let rate = waits.len() as f64 / t.elapsed().as_secs_f64();
    let p99 = percentile(&mut waits, 0.99);
    let max = *waits.last().unwrap();
    println!(
        "{url:<40} 8 workers, hold 1 ms: {rate:>5.0} acq/s  wait p99 {p99:.1?}  max {max:.1?}"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3.0);
    let server = testkit::RedisServer::start().expect("start redis-server");
    let url = server.url();
    cycle(&url, secs).await?;
    cycle(&format!("{url}/0?fair=true"), secs).await?;
    contend(&url, secs).await?;
    contend(&format!("{url}/0?fair=true"), secs).await?;
    Ok(())
}
