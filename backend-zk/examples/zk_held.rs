//! Prints the requests per second a ZooKeeper server (started by the test
//! kit) receives while one client holds many locks with automatic renewal,
//! as `polylock bench` counts them (`mntr`'s `zk_packets_received` over one
//! TTL). Measures; asserts nothing.
//!
//! `cargo run --release -p backend-zk --example zk_held [LOCKS...]`

use std::time::Duration;

use backend_zk::ZkBackend;
use futures::StreamExt;
use lock_core::{LockError, Locker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep, Instant};

async fn packets(addr: std::net::SocketAddr) -> u64 {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("mntr");
    s.write_all(b"mntr").await.expect("mntr");
    let mut text = String::new();
    s.read_to_string(&mut text).await.expect("mntr");
    text.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
        .expect("zk_packets_received")
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if counts.is_empty() {
        vec![100, 10_000]
    } else {
        counts
    };
    let ttl = Duration::from_secs(15);
    let server = testkit::ZooKeeperServer::start().expect("start ZooKeeper");
    for n in counts {
        let backend = ZkBackend::connect(&format!("zk://{}", server.connect_string())).await?;
        let locker = Locker::new(backend);
        let guards: Vec<_> = futures::stream::iter(0..n)
            .map(|i| {
                let locker = locker.clone();
                async move {
                    locker
                        .lock(format!("held/{n}/{i}"))
                        .ttl(ttl)
                        .acquire()
                        .await
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        let granted = guards[0].lease().ttl();
        sleep(granted / 3).await;
        let (c0, t0) = (packets(server.addr()).await, Instant::now());
        sleep(granted).await;
        let (c1, secs) = (packets(server.addr()).await, t0.elapsed().as_secs_f64());
        let held = guards.iter().all(|g| g.is_held());
        println!(
            "{n:>6} locks, TTL {granted:?}: {:.1} server requests/s, all held: {held}",
            (c1 - c0) as f64 / secs
        );
        futures::stream::iter(guards)
            .for_each_concurrent(64, |g| async move {
                let _ = g.release().await;
            })
            .await;
    }
    Ok(())
}
