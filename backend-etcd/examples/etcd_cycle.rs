//! Prints the uncontended cycle (acquire + release of a free lock) three
//! ways, in alternating rounds so that load changes hit all alike: the raw
//! driver doing the fewest requests a lock needs (a put-if-absent
//! transaction with a lease, then a delete), the backend alone
//! (`try_acquire` + `release`), and the guard API over it (`Locker`).
//! Measures; asserts nothing about time. Also a target for `perf record`.
//!
//! `cargo run --release -p backend-etcd --example etcd_cycle [ROUNDS]`

use std::time::Duration;

use backend_etcd::EtcdBackend;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lock_core::{AcquireRequest, LockBackend, LockError, LockName, Locker, OwnerToken};
use tokio::time::Instant;

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let only = std::env::args().nth(2);
    let server = testkit::EtcdServer::start().expect("start etcd");
    let url = format!("etcd://{}", server.endpoint().trim_start_matches("http://"));
    let ttl = Duration::from_secs(10);
    let backend = EtcdBackend::connect(&url).await?;
    let locker = Locker::new(backend.clone());
    let name = LockName::new("cycle")?;
    let raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("raw client");
    let mut lease_client = raw.lease_client();
    let lease = lease_client.grant(300, None).await.expect("grant").id();
    let mut kv = raw.kv_client();
    let key = format!("raw/cycle/{lease:x}");
    let (mut t_raw, mut t_count, mut t_backend, mut t_locker) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let want = |w: &str| only.as_deref().is_none_or(|o| o == w);
    for _ in 0..rounds / 10 {
        if want("raw") {
            for _ in 0..10 {
                let t = Instant::now();
                let txn = Txn::new()
                    .when(vec![Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then(vec![TxnOp::put(
                        key.as_str(),
                        "owner",
                        Some(PutOptions::new().with_lease(lease)),
                    )]);
                kv.txn(txn).await.expect("txn");
                kv.delete(key.as_str(), None).await.expect("delete");
                t_raw.push(t.elapsed());
            }
        }
        if want("rawcount") {
            // The raw cycle with the backend's count of the queue in its
            // transaction: what that read costs etcd.
            for _ in 0..10 {
                let t = Instant::now();
                let txn = Txn::new()
                    .when(vec![Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then(vec![
                        TxnOp::put(
                            key.as_str(),
                            "owner",
                            Some(PutOptions::new().with_lease(lease)),
                        ),
                        TxnOp::get(
                            "raw/cycle/0",
                            Some(
                                etcd_client::GetOptions::new()
                                    .with_range("raw/cycle/g")
                                    .with_count_only(),
                            ),
                        ),
                    ]);
                kv.txn(txn).await.expect("txn");
                kv.delete(key.as_str(), None).await.expect("delete");
                t_count.push(t.elapsed());
            }
        }
        if want("backend") {
            for _ in 0..10 {
                let t = Instant::now();
                let req = AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, ttl)?;
                let l = backend.try_acquire(&req).await?.expect("free");
                backend.release(&l).await?;
                t_backend.push(t.elapsed());
            }
        }
        if want("locker") {
            for _ in 0..10 {
                let t = Instant::now();
                let g = locker
                    .lock(name.as_str())
                    .ttl(ttl)
                    .try_acquire()
                    .await?
                    .expect("free");
                g.release().await?;
                t_locker.push(t.elapsed());
            }
        }
    }
    for (what, v) in [
        ("raw", &mut t_raw),
        ("rawcount", &mut t_count),
        ("backend", &mut t_backend),
        ("locker", &mut t_locker),
    ] {
        if v.is_empty() {
            continue;
        }
        let total: Duration = v.iter().sum();
        println!(
            "{what:<8} p50 {:>9.1?}  mean {:>9.1?}  cycles/s {:.0}",
            percentile(v, 0.5),
            total / v.len() as u32,
            v.len() as f64 / total.as_secs_f64()
        );
    }
    Ok(())
}
