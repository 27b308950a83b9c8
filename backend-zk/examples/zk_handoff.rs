//! Prints the hand-off latency between two queued clients (release by the
//! holder → `acquire` returning in the waiter) next to the server's round
//! trip, on a ZooKeeper server started by the test kit. Measures; asserts
//! nothing about time.
//!
//! `cargo run -p backend-zk --example zk_handoff [ROUNDS]`

use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::{AcquireRequest, LockBackend, LockError, LockName, OwnerToken};
use tokio::time::{sleep, Instant};

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn show(what: &str, v: &mut [Duration], rtt: Duration) {
    let (p50, p99) = (percentile(v, 0.5), percentile(v, 0.99));
    println!(
        "{what:<22} p50 {p50:>9.1?} ({:.1} RTT)  p99 {p99:>9.1?} ({:.1} RTT)",
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
    let server = testkit::ZooKeeperServer::start().expect("start ZooKeeper");
    let url = format!("zk://{}", server.connect_string());
    let ttl = Duration::from_secs(10);
    let clients = [
        ZkBackend::connect(&url).await?,
        ZkBackend::connect(&url).await?,
    ];
    let name = LockName::new("handoff")?;
    let req = || AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, ttl);
    let raw = zookeeper_client::Client::connect(&server.connect_string())
        .await
        .expect("raw client");
    let dir = clients[0].lock_path(&name);

    // The round trip of one read on an idle connection.
    let mut rtts = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        raw.check_stat("/").await.expect("stat");
        rtts.push(t.elapsed());
    }
    let rtt = percentile(&mut rtts, 0.5);
    println!("round trip (exists /)  p50 {rtt:.1?}");

    // The raw cost of the releaser's request: delete of a node nobody
    // watches, and of one another session watches.
    let watcher = zookeeper_client::Client::connect(&server.connect_string())
        .await
        .expect("raw client");
    let (mut bare, mut watched) = (Vec::new(), Vec::new());
    let opts =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    for i in 0..rounds {
        let path = format!("/raw-{i}");
        raw.create(&path, b"", &opts).await.expect("create");
        let w = (i % 2 == 1).then(|| watcher.check_and_watch_stat(&path));
        let w = match w {
            Some(f) => Some(f.await.expect("watch").1),
            None => None,
        };
        sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        raw.delete(&path, None).await.expect("delete");
        let d = t.elapsed();
        match w {
            Some(w) => {
                w.changed().await;
                watched.push(d);
            }
            None => bare.push(d),
        }
    }
    show("raw delete, unwatched", &mut bare, rtt);
    show("raw delete, watched", &mut watched, rtt);

    let mut lease = clients[0].acquire(&req()?).await?.expect("free lock");
    let (mut handoff, mut release) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let (holder, waiter) = (&clients[i % 2], clients[(i + 1) % 2].clone());
        let r = req()?;
        let task = tokio::spawn(async move {
            let got = waiter.acquire(&r).await;
            (Instant::now(), got)
        });
        // Queued, and past its list + watch requests.
        while raw.list_children(&dir).await.map_or(0, |c| c.len()) < 2 {
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

    // The same release with nobody queued.
    let mut alone = Vec::new();
    for _ in 0..rounds {
        let lease = clients[0].acquire(&req()?).await?.expect("free lock");
        sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        clients[0].release(&lease).await?;
        alone.push(t.elapsed());
    }
    show("release, nobody queued", &mut alone, rtt);
    Ok(())
}
