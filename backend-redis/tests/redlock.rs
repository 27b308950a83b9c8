//! Redlock (`redlock://`) against five real, independent redis-server
//! processes: killed and paused nodes, slow nodes, fencing across restarts,
//! the documented unsafe case, and node-redlock 5 on the same nodes.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use backend_redis::RedlockBackend;
use futures::StreamExt;
use lock_core::{AcquireRequest, Lease, LockBackend, LockError, LockName, Locker, OwnerToken};
use rand::seq::IndexedRandom;
use testkit::{Mode, Proxy, RedisServer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{sleep, sleep_until, timeout, Instant};

/// The per-node timeout of these tests' clients.
const NODE_TIMEOUT: Duration = Duration::from_millis(100);

fn five() -> Vec<RedisServer> {
    RedisServer::start_independent(5, &[]).expect("start five redis-servers")
}

fn url(servers: &[RedisServer], query: &str) -> String {
    format!("redlock://{}{query}", RedisServer::host_list(servers))
}

async fn client(servers: &[RedisServer]) -> Arc<RedlockBackend> {
    Arc::new(
        RedlockBackend::connect(&url(servers, "?timeout=100ms"))
            .await
            .expect("connect"),
    )
}

fn name(s: &str) -> LockName {
    LockName::new(format!("redlock-test-{:08x}/{s}", rand::random::<u32>())).unwrap()
}

fn req(name: &LockName, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, Duration::ZERO).unwrap()
}

/// The lock key's value on one node, read without the lock layer.
async fn value_on(server: &RedisServer, key: &str) -> Option<String> {
    let mut c = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// How many of `servers` have the lock key `key`.
async fn holding(servers: &[&RedisServer], key: &str) -> usize {
    let mut n = 0;
    for s in servers {
        n += usize::from(value_on(s, key).await.is_some());
    }
    n
}

/// Runs a blocking test-kit control (kill, restart, pause) off the runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_killed_acquire_renew_and_release_still_work() {
    let servers = five();
    let c = client(&servers).await;
    servers[0].kill().unwrap();
    servers[3].kill().unwrap();
    let n = name("two-down");
    let lease = c
        .try_acquire(&req(&n, Duration::from_secs(5)))
        .await
        .expect("acquire with three of five nodes")
        .expect("free");
    let alive = [&servers[1], &servers[2], &servers[4]];
    assert_eq!(holding(&alive, n.as_str()).await, 3);
    let renewed = c.renew(&lease).await.expect("renew with three of five");
    assert!(renewed.deadline() > lease.deadline());
    let other = client(&servers).await;
    assert!(other
        .try_acquire(&req(&n, Duration::from_secs(5)))
        .await
        .expect("a second client's attempt")
        .is_none());
    c.release(&renewed)
        .await
        .expect("release with three of five");
    assert_eq!(holding(&alive, n.as_str()).await, 0);
    let next = other
        .try_acquire(&req(&n, Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("free after release");
    assert!(next.fence() > lease.fence());
    other.release(&next).await.unwrap();
}

/// Waiters wake on the release message of any node: with two of five
/// nodes down, a waiter whose next poll is seconds away (`retry_delay`
/// 20 s: the first comes 2.5 s or more after its refused attempt) gets the
/// lock within a second of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_with_two_nodes_down() {
    let servers = five();
    servers[1].kill().unwrap();
    servers[3].kill().unwrap();
    let holder = client(&servers).await;
    let waiter = Arc::new(
        RedlockBackend::connect(&url(&servers, "?timeout=100ms&retry_delay=20s"))
            .await
            .expect("connect"),
    );
    let n = name("woken");
    let lease = holder
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    let queued = tokio::spawn({
        let (waiter, n) = (waiter.clone(), n.clone());
        async move {
            let wait = AcquireRequest::new(
                n,
                OwnerToken::random(),
                Duration::from_secs(30),
                Duration::from_secs(30),
            )
            .unwrap();
            let got = waiter.acquire(&wait).await;
            (Instant::now(), got)
        }
    });
    sleep(Duration::from_millis(500)).await;
    assert!(
        !queued.is_finished(),
        "the waiter did not wait for the holder"
    );
    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let (at, got) = timeout(Duration::from_secs(25), queued)
        .await
        .expect("the waiter never got the lock")
        .unwrap();
    let next = got.expect("the waiter's acquire").expect("acquired");
    assert!(
        at - released < Duration::from_secs(1),
        "acquired {:?} after the release: that is the polling, not a wake-up",
        at - released
    );
    assert!(next.fence() > lease.fence());
    waiter.release(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_killed_acquire_fails_fast_renew_loses_and_survivors_are_clean() {
    let servers = five();
    let c = client(&servers).await;
    let locker = Locker::from_arc(c.clone());
    let held = name("held");
    let ttl = Duration::from_millis(1500);
    let guard = locker.lock(held.as_str()).ttl(ttl).acquire().await.unwrap();
    for s in &servers[..3] {
        s.kill().unwrap();
    }

    let n = name("three-down");
    let started = Instant::now();
    let r = c.try_acquire(&req(&n, Duration::from_secs(5))).await;
    let took = started.elapsed();
    let Err(e) = r else {
        panic!("acquire with two of five nodes: {r:?}")
    };
    assert!(e.is_retryable(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("2 of 5 nodes granted") && text.contains("3 failed"),
        "the error should say how many answered and which failed: {text}"
    );
    assert!(
        text.contains(&servers[0].addr().to_string()),
        "the error should name the failed nodes: {text}"
    );
    // One round to every node plus one to undo, each bounded by the
    // per-node timeout; generous for a loaded machine.
    assert!(
        took < NODE_TIMEOUT * 2 + Duration::from_secs(1),
        "acquire took {took:?}"
    );
    let survivors = [&servers[3], &servers[4]];
    assert_eq!(
        holding(&survivors, n.as_str()).await,
        0,
        "the failed attempt was not undone"
    );

    // The watchdog's renewals cannot reach a majority: they fail (retryably:
    // the dead nodes might be slow ones still holding the key) until the
    // lease's deadline, and lost() fires then, before the TTL is out on the
    // survivors.
    timeout(ttl + Duration::from_secs(1), guard.lost())
        .await
        .expect("lost() did not fire");
    assert!(!guard.is_held());
    // The survivors' keys go by their TTL, counted from the last renewal.
    let clean_by = Instant::now() + ttl + Duration::from_secs(1);
    while holding(&survivors, held.as_str()).await > 0 {
        assert!(
            Instant::now() < clean_by,
            "the lost lease outlived its TTL on the surviving nodes"
        );
        sleep(Duration::from_millis(50)).await;
    }
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_majority_acquire_fails_within_the_node_timeout_and_no_stray_lock_outlives_its_ttl()
{
    let servers = Arc::new(five());
    // A per-node timeout long enough to tell one from two.
    let node_timeout = Duration::from_millis(1500);
    let c = RedlockBackend::connect(&url(&servers, "?timeout=1500ms"))
        .await
        .expect("connect");
    // Connections are made before the pause, as in a running service.
    let warm = name("warm");
    let l = c
        .try_acquire(&req(&warm, Duration::from_secs(1)))
        .await
        .unwrap()
        .unwrap();
    c.release(&l).await.unwrap();

    for s in &servers[..3] {
        s.pause().unwrap();
    }
    let n = name("paused");
    let ttl = Duration::from_millis(800);
    let started = Instant::now();
    let r = c.try_acquire(&req(&n, ttl)).await;
    let took = started.elapsed();
    assert!(r.is_err(), "acquire with a paused majority: {r:?}");
    assert!(
        took >= node_timeout && took < node_timeout + Duration::from_millis(1200),
        "acquire with a paused majority took {took:?}: it should give up after one \
         per-node timeout ({node_timeout:?}), not hang nor wait a second one for the undo"
    );
    let resumed_at = Instant::now();
    for s in &servers[..3] {
        s.resume().unwrap();
    }
    // The paused nodes now run the requests they had queued, the acquire
    // among them: whatever they set expires within its TTL of now.
    let all: Vec<&RedisServer> = servers.iter().collect();
    sleep(ttl + Duration::from_millis(500)).await;
    assert_eq!(
        holding(&all, n.as_str()).await,
        0,
        "a stray lock survived {:?} after SIGCONT, past its {ttl:?} TTL",
        resumed_at.elapsed()
    );
    let next = c
        .try_acquire(&req(&n, ttl))
        .await
        .unwrap()
        .expect("free after the pause");
    c.release(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_slower_than_its_validity_is_not_acquired_and_is_undone() {
    let servers = five();
    let delay = Duration::from_millis(150);
    let proxies: Vec<Proxy> = servers
        .iter()
        .map(|s| Proxy::start(s.addr()).unwrap())
        .collect();
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let connect = |query: &str| {
        let url = format!("redlock://{}{query}", hosts.join(","));
        async move { RedlockBackend::connect(&url).await.expect("connect") }
    };
    let slow = connect("?timeout=3s").await;
    let all: Vec<&RedisServer> = servers.iter().collect();
    for p in &proxies {
        p.set_mode(Mode::Delay(delay));
    }

    // Slower than the TTL itself: the round trip alone is twice the delay.
    let n = name("slower-than-ttl");
    let ttl = Duration::from_millis(200);
    let r = slow.try_acquire(&req(&n, ttl)).await;
    let Err(e) = r else {
        panic!("an acquire slower than its TTL: {r:?}")
    };
    assert!(e.to_string().contains("no validity left"), "{e}");
    assert_eq!(holding(&all, n.as_str()).await, 0);

    // The undo is visible when the keys would otherwise live on: a drift
    // allowance that leaves no validity after this round trip, with a TTL
    // that outlasts it by far.
    // 6 s × 0.99 − 3.9 s: trusted for 2.04 s, past a third of the TTL (so
    // not refused before I/O), and less than the 2.2 s round trip below;
    // the attempt and its undo take 4.4 s of the 6 s TTL.
    let undone = connect("?timeout=5s&drift=3900ms").await;
    for p in &proxies {
        p.set_mode(Mode::Delay(Duration::from_millis(1100)));
    }
    let n = name("no-validity");
    let ttl = Duration::from_millis(6000);
    let sent = Instant::now();
    let r = undone.try_acquire(&req(&n, ttl)).await;
    assert!(
        r.as_ref()
            .is_err_and(|e| e.to_string().contains("no validity left")),
        "{r:?}"
    );
    let left = holding(&all, n.as_str()).await;
    assert!(
        sent.elapsed() < ttl,
        "checked too late to tell the undo from the TTL"
    );
    assert_eq!(left, 0, "the attempt was not undone on {left} nodes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_across_200_holders_while_minorities_restart() {
    let servers = Arc::new(
        RedisServer::start_independent(5, &["--appendonly", "yes", "--appendfsync", "always"])
            .expect("start five persistent redis-servers"),
    );
    // fsync on every write is slow on a shared disk: a longer per-node
    // timeout than the other tests'.
    let connect = || async {
        RedlockBackend::connect(&url(&servers, "?timeout=2s"))
            .await
            .expect("connect")
    };
    let clients = [connect().await, connect().await];
    let n = name("fence");
    let mut last: Option<Lease> = None;
    let mut down: Vec<usize> = Vec::new();
    let mut restarts = 0;
    for i in 0..200 {
        if i % 20 == 5 {
            // A random minority goes down for a while.
            let k = if rand::random::<bool>() { 1 } else { 2 };
            down = (0..5usize)
                .collect::<Vec<_>>()
                .choose_multiple(&mut rand::rng(), k)
                .copied()
                .collect();
            for &d in &down {
                servers[d].kill().unwrap();
            }
        }
        if i % 20 == 15 {
            for d in std::mem::take(&mut down) {
                let s = Arc::clone(&servers);
                blocking(move || s[d].restart()).await.unwrap();
                restarts += 1;
            }
        }
        let c = &clients[i % 2];
        let give_up = Instant::now() + Duration::from_secs(10);
        let lease = loop {
            match c.try_acquire(&req(&n, Duration::from_secs(5))).await {
                Ok(Some(lease)) => break lease,
                Ok(None) => panic!("holder {i}: held, though every holder released"),
                // A node that just came back may still refuse a moment.
                Err(e) if e.is_retryable() && Instant::now() < give_up => {
                    sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("holder {i}: {e}"),
            }
        };
        if let Some(prev) = &last {
            assert!(
                lease.fence() > prev.fence(),
                "holder {i}: token {:?} after {:?}",
                lease.fence(),
                prev.fence()
            );
        }
        loop {
            match c.release(&lease).await {
                Ok(()) => break,
                Err(e) if e.is_retryable() && Instant::now() < give_up => {
                    sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("holder {i}: release: {e}"),
            }
        }
        last = Some(lease);
    }
    assert!(restarts >= 10, "only {restarts} restarts happened");
}

/// Holds `n` on exactly nodes 0, 1 and 2 of five (3 and 4 are down while it
/// is taken, then come back empty).
async fn hold_on_a_bare_majority(
    servers: &Arc<Vec<RedisServer>>,
    c: &RedlockBackend,
    n: &LockName,
    ttl: Duration,
) -> Lease {
    servers[3].kill().unwrap();
    servers[4].kill().unwrap();
    let lease = c.try_acquire(&req(n, ttl)).await.unwrap().expect("free");
    for d in [3, 4] {
        let s = Arc::clone(servers);
        blocking(move || s[d].restart()).await.unwrap();
    }
    lease
}

/// DEMONSTRATION of the documented guarantee, not a flaky failure: Redlock
/// is only safe when a node that crashed either kept its data or stays down
/// past the longest TTL. Here a node of the holder's bare majority restarts
/// AT ONCE without persistence: the second client gathers a majority (the
/// empty node plus the two others) while the first still holds. This test
/// passes when that overlap happens, as the module docs say it will.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demonstration_an_immediate_restart_without_persistence_admits_a_second_holder() {
    let servers = Arc::new(five());
    let (a, b) = (client(&servers).await, client(&servers).await);
    let n = name("unsafe");
    let ttl = Duration::from_secs(10);
    let first = hold_on_a_bare_majority(&servers, &a, &n, ttl).await;
    let s = Arc::clone(&servers);
    blocking(move || s[2].restart()).await.unwrap();
    let give_up = Instant::now() + Duration::from_secs(5);
    let second = loop {
        match b.try_acquire(&req(&n, ttl)).await {
            Ok(Some(l)) => break l,
            Ok(None) => panic!("the restarted node kept the lock without persistence?"),
            Err(e) if e.is_retryable() && Instant::now() < give_up => {
                sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(
        Instant::now() < first.deadline(),
        "the second grant came after the first holder's deadline: no overlap shown"
    );
    // Both believe they hold it: exactly the documented unsafe case.
    assert_ne!(first.owner(), second.owner());
    b.release(&second).await.unwrap();
}

/// DEMONSTRATION of the documented guarantee: the same run as above, but
/// the crashed node stays down past the holder's TTL before it rejoins.
/// While it is down nobody else gathers a majority; the lock is granted
/// again only after the first holder's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demonstration_a_restart_delayed_past_the_ttl_keeps_exclusion() {
    let servers = Arc::new(five());
    let (a, b) = (client(&servers).await, client(&servers).await);
    let n = name("safe");
    let ttl = Duration::from_millis(1500);
    let first = hold_on_a_bare_majority(&servers, &a, &n, ttl).await;
    servers[2].kill().unwrap();
    let mut attempts = 0;
    loop {
        let sent = Instant::now();
        if sent >= first.deadline() {
            break;
        }
        let r = b.try_acquire(&req(&n, ttl)).await;
        if let Ok(Some(l)) = &r {
            panic!(
                "a second holder while the first held (attempt sent {:?} before its \
                 deadline): {l:?}",
                first.deadline() - sent
            );
        }
        attempts += 1;
        sleep(Duration::from_millis(50)).await;
    }
    assert!(
        attempts >= 5,
        "only {attempts} attempts while the first held"
    );
    // Past the TTL on every node's clock too, then the node rejoins.
    sleep_until(first.sent_at() + ttl + Duration::from_millis(100)).await;
    let s = Arc::clone(&servers);
    blocking(move || s[2].restart()).await.unwrap();
    let second = b
        .try_acquire(&req(&n, ttl))
        .await
        .unwrap()
        .expect("free after the first holder's TTL");
    assert!(Instant::now() > first.deadline());
    assert!(second.fence() > first.fence());
    b.release(&second).await.unwrap();
}

/// A node-redlock 5 client over the same five nodes (`tests/peers/`).
struct NodeRedlock {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl NodeRedlock {
    async fn start(servers: &[RedisServer]) -> NodeRedlock {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers");
        assert!(
            dir.join("node_modules/redlock/package.json").exists(),
            "node-redlock 5 is not installed: run scripts/install-peers.sh"
        );
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let mut child = Command::new("node")
            .arg(dir.join("redlock_peer.js"))
            .arg(urls.join(","))
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting node");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut peer = NodeRedlock {
            _child: child,
            stdin,
            stdout,
        };
        assert_eq!(peer.reply().await, "ready");
        peer
    }

    async fn reply(&mut self) -> String {
        match timeout(Duration::from_secs(30), self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            other => panic!("node-redlock peer: no reply ({other:?})"),
        }
    }

    async fn say(&mut self, line: &str) -> String {
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.write_all(b"\n").await.unwrap();
        self.stdin.flush().await.unwrap();
        self.reply().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_on_the_same_five_nodes_and_name_excludes_both_ways() {
    let servers = five();
    let ours = client(&servers).await;
    let mut theirs = NodeRedlock::start(&servers).await;
    let n = name("interop");

    assert_eq!(
        theirs.say(&format!("acquire {n} 10000 0")).await,
        "acquired"
    );
    let all: Vec<&RedisServer> = servers.iter().collect();
    let on = holding(&all, n.as_str()).await;
    assert!(
        on >= 3,
        "node-redlock should lock the name itself on a majority: {on} of 5"
    );
    assert!(
        ours.try_acquire(&req(&n, Duration::from_secs(10)))
            .await
            .unwrap()
            .is_none(),
        "polylock took a lock node-redlock holds"
    );
    let info = ours.inspect(&n).await.unwrap().expect("held");
    assert!(info.owner.contains("foreign"), "{info:?}");
    assert_eq!(theirs.say(&format!("release {n}")).await, "released");

    let lease = ours
        .try_acquire(&req(&n, Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free after node-redlock released");
    assert_eq!(
        theirs.say(&format!("acquire {n} 10000 0")).await,
        "busy",
        "node-redlock took a lock polylock holds"
    );
    ours.release(&lease).await.unwrap();
    assert_eq!(
        theirs.say(&format!("acquire {n} 10000 0")).await,
        "acquired"
    );
    assert_eq!(theirs.say(&format!("release {n}")).await, "released");
    theirs.stdin.write_all(b"quit\n").await.unwrap();
}

#[tokio::test]
async fn fewer_than_three_nodes_is_a_config_error_before_any_io() {
    // Nothing listens on these ports: a connection attempt would fail with
    // a backend error, not a configuration error.
    for url in ["redlock://127.0.0.1:1", "redlock://127.0.0.1:1,127.0.0.1:2"] {
        let r = RedlockBackend::connect(url).await;
        assert!(matches!(r, Err(LockError::Config(_))), "{url}: {r:?}");
    }
}

/// A raw command on one node, without the lock layer.
async fn on_node(server: &RedisServer, cmd: &mut redis::Cmd) -> redis::Value {
    let mut c = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    cmd.query_async(&mut c).await.unwrap()
}

/// The write-back makes the argument hold: a later majority that shares
/// only ONE node with the holder's still counts on from the holder's token,
/// even though that token came from a node the later majority lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_majority_sharing_one_node_counts_on_from_the_written_back_token() {
    let servers = five();
    let c = client(&servers).await;
    let n = name("intersect");
    let keys = c.keys(&n).unwrap();
    let base: u64 = 1_000_000_000_000_000;
    for (i, s) in servers.iter().enumerate() {
        let start = if i == 0 { base + 1000 } else { base };
        on_node(
            s,
            redis::cmd("HSET").arg(&keys.fence).arg("fence").arg(start),
        )
        .await;
    }
    // Another client holds the name on nodes 3 and 4: the first holder's
    // majority is exactly 0, 1, 2, and node 0 hands out the largest token.
    for s in &servers[3..] {
        on_node(
            s,
            redis::cmd("SET")
                .arg(&keys.lock)
                .arg("foreign")
                .arg("PX")
                .arg(30_000),
        )
        .await;
    }
    let first = c
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("a majority is free");
    assert_eq!(first.fence().get(), base + 1001);
    for s in &servers[..3] {
        let v = on_node(s, redis::cmd("HGET").arg(&keys.fence).arg("fence")).await;
        let counter: u64 = redis::from_redis_value(v).unwrap();
        assert_eq!(
            counter,
            first.fence().get(),
            "the token was not written back"
        );
    }
    c.release(&first).await.unwrap();
    // Now the other client holds nodes 0 and 1: the next majority is 2, 3,
    // 4, sharing only node 2 with the first.
    for s in &servers[3..] {
        on_node(s, redis::cmd("DEL").arg(&keys.lock)).await;
    }
    for s in &servers[..2] {
        on_node(
            s,
            redis::cmd("SET")
                .arg(&keys.lock)
                .arg("foreign")
                .arg("PX")
                .arg(30_000),
        )
        .await;
    }
    let second = c
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("a majority is free");
    assert!(
        second.fence() > first.fence(),
        "token {:?} after {:?}",
        second.fence(),
        first.fence()
    );
    c.release(&second).await.unwrap();
}

/// Scripts each node has run (`EVAL`/`EVALSHA` calls), from its
/// `INFO commandstats`.
async fn scripts_run(servers: &[RedisServer]) -> Vec<u64> {
    let mut out = Vec::new();
    for s in servers {
        let v = on_node(s, redis::cmd("INFO").arg("commandstats")).await;
        let info: String = redis::from_redis_value(v).unwrap();
        out.push(
            info.lines()
                .filter(|l| l.starts_with("cmdstat_eval"))
                .filter_map(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("calls=")))
                .map(|v| v.parse::<u64>().unwrap())
                .sum(),
        );
    }
    out
}

/// Sets the fencing counter of `name` on each node.
async fn set_counters(servers: &[RedisServer], keys: &backend_redis::LockKeys, at: &[u64]) {
    for (s, v) in servers.iter().zip(at) {
        on_node(s, redis::cmd("HSET").arg(&keys.fence).arg("fence").arg(*v)).await;
    }
}

/// A refused attempt costs one script per node: the nodes that refused
/// hold someone else's value, so the attempt's undo does not ask them (it
/// used to, a second round trip per refused attempt of every waiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_runs_one_script_per_node() {
    let servers = five();
    let (holder, other) = (client(&servers).await, client(&servers).await);
    let n = name("refused-once");
    let held = holder
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    // The other client's scripts are loaded and its links open.
    assert!(other
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .is_none());
    let before = scripts_run(&servers).await;
    let r = other.try_acquire(&req(&n, Duration::from_secs(30))).await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    let after = scripts_run(&servers).await;
    let ran: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(
        ran,
        vec![1; servers.len()],
        "scripts per node for one refused attempt"
    );
    holder.release(&held).await.unwrap();
}

/// An attempt that chains requests (the scripts, then the undo where a
/// minority granted) answers within one node timeout in all, on links so
/// slow that each round trip takes most of it; the undo finishes in the
/// background, so the minority's keys do not outlive the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_and_its_undo_answer_within_one_node_timeout() {
    let servers = five();
    let proxies: Vec<Proxy> = servers
        .iter()
        .map(|s| Proxy::start(s.addr()).unwrap())
        .collect();
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let node_timeout = Duration::from_secs(2);
    let slow = RedlockBackend::connect(&format!("redlock://{}?timeout=2s", hosts.join(",")))
        .await
        .expect("connect");
    // Links open and scripts loaded while the network is fast.
    let warm = slow
        .try_acquire(&req(&name("warm"), Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("free");
    slow.release(&warm).await.unwrap();
    // Someone else's value on three nodes: a grant on two, then the undo.
    let n = name("chained");
    for s in &servers[..3] {
        on_node(
            s,
            redis::cmd("SET")
                .arg(n.as_str())
                .arg("someone-else")
                .arg("PX")
                .arg(60_000),
        )
        .await;
    }
    // Each round trip: 1.3 s of the 2 s.
    for p in &proxies {
        p.set_mode(Mode::Delay(Duration::from_millis(650)));
    }
    let started = Instant::now();
    let r = slow.try_acquire(&req(&n, Duration::from_secs(30))).await;
    let took = started.elapsed();
    for p in &proxies {
        p.set_mode(Mode::Pass);
    }
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(
        took <= node_timeout + Duration::from_millis(500),
        "the attempt answered after {took:?} with a {node_timeout:?} node timeout"
    );
    let minority: Vec<&RedisServer> = servers[3..].iter().collect();
    let started = Instant::now();
    while holding(&minority, n.as_str()).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the minority's grant was never undone"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// The write-back costs a second round trip only where it is needed: when
/// a majority of the granting nodes returned the token itself (counters in
/// step, the usual case), an acquire runs one script per node; when fewer
/// did, the nodes behind are written back and end at the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_written_back_only_when_no_majority_returned_it() {
    let servers = five();
    let c = client(&servers).await;
    let n = name("in-step");
    let keys = c.keys(&n).unwrap();
    // Loads every script on every node: a first EVALSHA of a script a node
    // lacks is answered NOSCRIPT and sent again, which would count twice.
    let warm = c
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    c.release(&warm).await.unwrap();
    let raise = include_str!("../scripts/redlock_raise_fence.lua");
    for s in &servers {
        on_node(s, redis::cmd("SCRIPT").arg("LOAD").arg(raise)).await;
    }
    let base: u64 = 1_000_000_000_000;
    let cases: [(&str, [u64; 5], [u64; 5]); 3] = [
        // Every counter in step: no write-back.
        ("in step", [base; 5], [1; 5]),
        // Two nodes behind, but the other three are a majority at the
        // token: no write-back, the two stay behind (a renew raises them).
        (
            "a majority in step",
            [base - 7, base - 3, base, base, base],
            [1; 5],
        ),
        // One node ahead: the token is its count, the four others are
        // written back to it.
        (
            "one ahead",
            [base + 100, base, base, base, base],
            [1, 2, 2, 2, 2],
        ),
    ];
    for (case, counters, scripts) in cases {
        set_counters(&servers, &keys, &counters).await;
        let before = scripts_run(&servers).await;
        let lease = c
            .try_acquire(&req(&n, Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("free");
        let after = scripts_run(&servers).await;
        let ran: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(ran, scripts, "{case}: scripts run per node by one acquire");
        let token = counters.iter().max().unwrap() + 1;
        assert_eq!(lease.fence().get(), token, "{case}");
        for (i, s) in servers.iter().enumerate() {
            let v = on_node(s, redis::cmd("HGET").arg(&keys.fence).arg("fence")).await;
            let counter: u64 = redis::from_redis_value(v).unwrap();
            let expected = if scripts[i] == 2 {
                token
            } else {
                counters[i] + 1
            };
            assert_eq!(counter, expected, "{case}: node {i}'s counter");
        }
        c.release(&lease).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_a_config_error_that_never_shows_the_password() {
    let servers = RedisServer::start_independent(3, &[]).expect("start three redis-servers");
    // Set after start: the test kit's readiness probe does not log in.
    for s in &servers {
        on_node(
            s,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("requirepass")
                .arg("right-one"),
        )
        .await;
    }
    let r = RedlockBackend::connect(&format!(
        "redlock://:hunter2@{}",
        RedisServer::host_list(&servers)
    ))
    .await;
    let Err(e) = r else {
        panic!("connected with a wrong password: {r:?}")
    };
    assert!(matches!(e, LockError::Config(_)), "{e:?}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
    let ok = RedlockBackend::connect(&format!(
        "redlock://:right-one@{}",
        RedisServer::host_list(&servers)
    ))
    .await
    .expect("the right password");
    assert!(!format!("{ok:?}").contains("right-one"));
}

/// A key an earlier attempt of the same request left on a majority (its
/// reply lost, its undo still on the way) is not taken for this attempt's
/// own grant: the undo could delete it right after, and the attempt would
/// have counted nodes that no longer hold the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_attempts_leftover_is_not_counted_as_a_grant() {
    let servers = five();
    let c = client(&servers).await;
    for form in ["bare owner token", "owner token and nonce"] {
        let n = name("leftover");
        let keys = c.keys(&n).unwrap();
        let r = req(&n, Duration::from_secs(30));
        let left = match form {
            "bare owner token" => r.owner.to_string(),
            _ => format!("{}.0123456789abcdef", r.owner),
        };
        for s in &servers[..3] {
            on_node(
                s,
                redis::cmd("SET")
                    .arg(&keys.lock)
                    .arg(&left)
                    .arg("PX")
                    .arg(30_000),
            )
            .await;
            on_node(
                s,
                redis::cmd("HSET")
                    .arg(&keys.fence)
                    .arg("fence")
                    .arg(1_000_000_000_000_000u64)
                    .arg("owner")
                    .arg(&left),
            )
            .await;
        }
        let got = c.try_acquire(&r).await.expect("attempt");
        assert!(
            got.is_none(),
            "{form}: an earlier attempt's leftover on a majority was counted as this attempt's grant"
        );
        let all: Vec<&RedisServer> = servers.iter().collect();
        assert_eq!(
            holding(&all, n.as_str()).await,
            3,
            "{form}: the leftovers must be left alone"
        );
    }
}

/// Holder metadata on Redlock: each node's grant keeps it beside the lock,
/// and `inspect` shows it only while a majority of the holder's nodes agree
/// on it (a minority that lost or changed it does not decide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_meta_needs_a_majority() {
    let servers = five();
    let ours = client(&servers).await;
    let n = name("redlock/meta");
    let meta = lock_core::HolderMeta::of_this_process("nightly");
    let lease = ours
        .try_acquire(&req(&n, Duration::from_secs(30)).with_meta(meta.clone()))
        .await
        .unwrap()
        .expect("free");
    assert_eq!(
        ours.inspect(&n).await.unwrap().unwrap().meta,
        Some(meta.clone())
    );
    let hash = ours.keys(&n).unwrap().bookkeeping;
    let erase = |i: usize| {
        let url = servers[i].url();
        let hash = hash.clone();
        async move {
            let mut c = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let _: i64 = redis::cmd("HDEL")
                .arg(&hash)
                .arg("meta")
                .query_async(&mut c)
                .await
                .unwrap();
        }
    };
    erase(0).await;
    erase(1).await;
    assert_eq!(
        ours.inspect(&n).await.unwrap().unwrap().meta,
        Some(meta),
        "three of five nodes still agree"
    );
    erase(2).await;
    assert_eq!(
        ours.inspect(&n).await.unwrap().unwrap().meta,
        None,
        "two of five nodes are no majority"
    );
    ours.release(&lease).await.unwrap();
}

/// `renew_many` with one node down: a batch of two chunks mixing live,
/// released, expired and foreign-held leases (a foreign holder on three
/// nodes) and one lease missing on a single node. Each lease is judged by
/// its own majority as `renew` judges it: the live ones and the one with a
/// majority left are renewed, the others are `Lost` and the foreign keys
/// untouched. Every live node ran one batch script per chunk, plus the
/// release of each lost lease (a renew per lease would be one run per
/// lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_renew_judges_each_lease_by_its_majority_in_one_request_per_node() {
    let servers = five();
    let c = client(&servers).await;
    let n = backend_redis::RENEW_CHUNK + 10;
    let names: Vec<LockName> = (0..n).map(|i| name(&format!("batch-{i}"))).collect();
    let (released, expired, foreign, minority) = (1, 2, 3, 4);
    let mut leases = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let ttl = if i == expired {
            backend_redis::REDLOCK_MIN_TTL
        } else {
            Duration::from_secs(30)
        };
        leases.push(c.try_acquire(&req(n, ttl)).await.unwrap().expect("free"));
    }
    c.release(&leases[released]).await.unwrap();
    let mut raws = Vec::new();
    for s in &servers {
        raws.push(
            redis::Client::open(s.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        );
    }
    for raw in raws.iter_mut().take(3) {
        let _: () = redis::cmd("SET")
            .arg(names[foreign].as_str())
            .arg("someone-else")
            .arg("PX")
            .arg(60_000)
            .query_async(raw)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("DEL")
        .arg(names[minority].as_str())
        .query_async(&mut raws[0])
        .await
        .unwrap();
    servers[4].kill().unwrap();
    sleep(Duration::from_millis(300)).await;
    let mut before = Vec::new();
    for raw in &raws[..4] {
        before.push(common::script_calls(raw).await);
    }
    let answers = c.renew_many(&leases).await;
    assert_eq!(answers.len(), n);
    let lost = [released, expired, foreign];
    for (i, a) in answers.iter().enumerate() {
        if lost.contains(&i) {
            assert!(a.as_ref().is_err_and(|e| e.is_lost()), "lease {i}: {a:?}");
        } else {
            let renewed = a.as_ref().expect("renewed by a majority");
            assert_eq!(renewed.name(), &names[i], "answers out of order");
            assert_eq!(renewed.fence(), leases[i].fence());
            assert!(renewed.deadline() > leases[i].deadline());
        }
    }
    let chunks = n.div_ceil(backend_redis::RENEW_CHUNK) as u64;
    for (i, raw) in raws[..4].iter().enumerate() {
        let calls = common::script_calls(raw).await - before[i];
        assert_eq!(
            calls,
            chunks + lost.len() as u64,
            "node {i}: script runs for {n} leases ({chunks} chunks, {} releases of lost leases)",
            lost.len()
        );
    }
    for s in &servers[..3] {
        assert_eq!(
            value_on(s, names[foreign].as_str()).await.as_deref(),
            Some("someone-else"),
            "the foreign holder's key"
        );
    }
    for s in &servers[..4] {
        assert_eq!(
            value_on(s, names[expired].as_str()).await,
            None,
            "re-created"
        );
    }
}

/// Nodes that granted the lock but missed the write-back of its token (the
/// write-back timed out there) are still part of the holder's majority:
/// with two of five nodes down and two of the three others behind on the
/// token, renew and release still work, and the renew brings the lagging
/// counters up to the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_missed_the_token_write_back_still_count_for_renew_and_release() {
    let servers = five();
    let c = client(&servers).await;
    let n = name("missed-raise");
    let keys = c.keys(&n).unwrap();
    let lease = c
        .try_acquire(&req(&n, Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free");
    let behind = lease.fence().get() - 1;
    for s in &servers[..2] {
        on_node(
            s,
            redis::cmd("HSET").arg(&keys.fence).arg("fence").arg(behind),
        )
        .await;
    }
    servers[3].kill().unwrap();
    servers[4].kill().unwrap();
    let renewed = c
        .renew(&lease)
        .await
        .expect("renew on the three nodes holding the key");
    for s in &servers[..3] {
        let v = on_node(s, redis::cmd("HGET").arg(&keys.fence).arg("fence")).await;
        let counter: u64 = redis::from_redis_value(v).unwrap();
        assert_eq!(counter, lease.fence().get(), "the counter stayed behind");
    }
    // Behind again, for the release.
    for s in &servers[..2] {
        on_node(
            s,
            redis::cmd("HSET").arg(&keys.fence).arg("fence").arg(behind),
        )
        .await;
    }
    c.release(&renewed)
        .await
        .expect("release on the three nodes holding the key");
    let alive = [&servers[0], &servers[1], &servers[2]];
    assert_eq!(holding(&alive, n.as_str()).await, 0);
}

/// Many batch renewals sent at once (as the watchdog sends them for
/// thousands of leases taken together) queue behind each other on every
/// node: a chunk's answer comes after the chunks sent before it. The
/// per-node timeout is for one request of one lock; a chunk gets a share
/// of its leases' TTL instead, so a queue of chunks is not taken for
/// nodes that do not answer (with the node timeout alone, the late chunks
/// failed and thousands of leases fell back to one renewal each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_renewals_queued_on_the_nodes_are_not_cut_by_the_node_timeout() {
    let servers = RedisServer::start_independent(3, &[]).expect("start three redis-servers");
    // The set-up takes its locks with a generous node timeout: 8192
    // acquisitions 64 at a time on a loaded machine can miss 100 ms on all
    // three nodes at once, and that is not what this test is about.
    let taker = Arc::new(
        RedlockBackend::connect(&url(&servers, "?timeout=5s"))
            .await
            .expect("connect"),
    );
    let leases: Vec<Lease> = futures::stream::iter(0..8192)
        .map(|i| {
            let taker = taker.clone();
            async move {
                taker
                    .try_acquire(&req(&name(&format!("queued-{i}")), Duration::from_secs(30)))
                    .await
                    .expect("acquire")
                    .expect("free")
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    // The same nodes through a client whose node timeout is shorter than
    // the queue of 64 chunks per node takes to drain.
    let renewer = Arc::new(
        RedlockBackend::connect(&url(&servers, "?timeout=10ms"))
            .await
            .expect("connect"),
    );
    let answers = futures::future::join_all(leases.chunks(512).map(|batch| {
        let renewer = renewer.clone();
        async move { (batch, renewer.renew_many(batch).await) }
    }))
    .await;
    let mut failed = Vec::new();
    for (batch, answers) in answers {
        assert_eq!(answers.len(), batch.len());
        for (lease, a) in batch.iter().zip(answers) {
            match a {
                Ok(renewed) => assert!(renewed.deadline() > lease.deadline()),
                Err(e) => failed.push(e.to_string()),
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} batch renewals failed, the first: {}",
        failed.len(),
        leases.len(),
        failed[0]
    );
}

/// The pacing a caller asks for (`Locker::with_retry`) paces a waiter's
/// attempts between release messages: over the same wait for a lock that
/// stays held, a fast pacing runs many more attempts than a slow one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_attempts_follow_the_requested_pacing() {
    let servers = RedisServer::start_independent(3, &[]).expect("start three redis-servers");
    let holder = client(&servers).await;
    let n = name("paced");
    let lease = holder
        .try_acquire(&req(&n, Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    let mut attempts = Vec::new();
    for pace in [Duration::from_millis(20), Duration::from_millis(500)] {
        let locker = Locker::from_arc(client(&servers).await)
            .with_retry(lock_core::wait::Backoff::new(pace, pace).unwrap());
        let before = scripts_run(&servers[..1]).await[0];
        let r = locker
            .lock(n.as_str())
            .wait(Duration::from_millis(1500))
            .acquire()
            .await;
        assert!(r.is_err(), "acquired a held lock");
        attempts.push(scripts_run(&servers[..1]).await[0] - before);
    }
    let (fast, slow) = (attempts[0], attempts[1]);
    assert!(
        fast >= 20 && fast > slow * 4,
        "{fast} scripts on a node at a 20 ms pacing, {slow} at 500 ms"
    );
    holder.release(&lease).await.unwrap();
}

/// A node down when the client connected joins later over a link too slow
/// to connect within one request's timeout (a connect is a handshake, a
/// `PING` and the script loads, each a round trip): the connect goes on in
/// the background past the request that started it, and later requests
/// use the node. Cut off with each request, it never joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_a_slow_link_joins_after_the_client_started() {
    let servers = RedisServer::start_independent(3, &[]).expect("start three redis-servers");
    let proxy = Proxy::start(servers[2].addr()).expect("proxy");
    proxy.set_mode(Mode::Blackhole);
    let url = format!(
        "redlock://{},{},{}?timeout=200ms",
        servers[0].addr(),
        servers[1].addr(),
        proxy.addr()
    );
    let c = RedlockBackend::connect(&url)
        .await
        .expect("a majority answers");
    // 30 ms each way: one request (60 ms) fits the timeout with room for
    // a loaded machine's scheduling, a connect (ten round trips and
    // more) does not.
    proxy.set_mode(Mode::Delay(Duration::from_millis(30)));
    let n = name("slow-node");
    let key = c.keys(&n).unwrap().lock;
    let until = Instant::now() + Duration::from_secs(15);
    let mut joined = false;
    while !joined && Instant::now() < until {
        let lease = c
            .try_acquire(&req(&n, Duration::from_secs(10)))
            .await
            .unwrap()
            .expect("the lock is free");
        joined = value_on(&servers[2], &key).await.is_some();
        c.release(&lease).await.unwrap();
        sleep(Duration::from_millis(200)).await;
    }
    assert!(joined, "the node behind the slow link never held the lock");
}

/// A node whose fencing counter is above the lease's token while it holds
/// the lease's own key (it granted the attempt after a re-seed of its
/// counter, too late to count, or its answer was lost) refuses the
/// owner-and-token-checked release. The release then removes the key by the
/// attempt's value, which only this attempt can have written, instead of
/// leaving it to block that node for the rest of the TTL; and it counts the
/// node as released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_re_seeded_above_the_token_is_still_released() {
    let servers = five();
    let c = client(&servers).await;
    let n = name("re-seeded");
    let keys = c.keys(&n).unwrap();
    let lease = c
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    let above = lease.fence().get() + 1_000_000;
    for s in &servers[..3] {
        on_node(
            s,
            redis::cmd("HSET").arg(&keys.fence).arg("fence").arg(above),
        )
        .await;
    }
    c.release(&lease)
        .await
        .expect("released: the nodes above the token still held our key");
    let all: Vec<&RedisServer> = servers.iter().collect();
    assert_eq!(
        holding(&all, n.as_str()).await,
        0,
        "a node kept the released lease's key"
    );
    // The lock is free on every node at once, not after the TTL.
    let next = c
        .try_acquire(&req(&n, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free again");
    assert!(next.fence().get() > above);
    c.release(&next).await.unwrap();
}

/// A renewal keeps the client's own clock-drift allowance whatever policy
/// the lease it is given carries (a migration lock rebuilds its sides'
/// leases with the laxer policy of the two): the renewed deadline loses
/// `drift_factor` of the TTL and `drift`, as the grant's did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_keeps_the_configured_drift_whatever_the_lease_carries() {
    let servers = RedisServer::start_independent(3, &[]).expect("start three redis-servers");
    let client = RedlockBackend::connect(&url(&servers, "?drift_factor=0.2&drift=200ms"))
        .await
        .expect("connect");
    let ttl = Duration::from_secs(10);
    // drift 0.2 × 10 s + 200 ms.
    let trusted = Duration::from_millis(7_800);
    let n = name("drift-renewal");
    let lease = client
        .try_acquire(&req(&n, ttl))
        .await
        .unwrap()
        .expect("free");
    assert!(lease.deadline() <= lease.sent_at() + trusted, "{lease:?}");
    let laxer = Lease::new(
        n.clone(),
        lease.owner(),
        lease.fence(),
        ttl,
        lease.sent_at(),
        lock_core::ClockPolicy::default(),
    )
    .with_backend_key(lease.backend_key().expect("the attempt's value"));
    let renewed = client.renew(&laxer).await.expect("renew");
    assert!(
        renewed.deadline() <= renewed.sent_at() + trusted,
        "the renewal trusted {:?} of a {ttl:?} TTL",
        renewed.deadline() - renewed.sent_at()
    );
    client.release(&lease).await.unwrap();
}

/// A TTL that this client's `drift=` leaves no renewal room in is refused
/// before any I/O, as `InvalidTtl`, not granted, found to have no validity
/// and undone round after round for the whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_the_configured_drift_leaves_no_room_in_is_refused_before_any_io() {
    let servers = RedisServer::start_independent(3, &[]).expect("start three redis-servers");
    let client = RedlockBackend::connect(&url(&servers, "?drift=1s"))
        .await
        .expect("connect");
    let n = name("drift-ttl");
    let stats_before = {
        let mut c = redis::Client::open(servers[0].url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        redis::cmd("INFO")
            .arg("commandstats")
            .query_async::<String>(&mut c)
            .await
            .unwrap()
    };
    let short = Duration::from_secs(1);
    let waiting = AcquireRequest::new(
        n.clone(),
        OwnerToken::random(),
        short,
        Duration::from_secs(5),
    )
    .unwrap();
    let started = Instant::now();
    for r in [
        client.try_acquire(&req(&n, short)).await,
        client.acquire(&waiting).await,
    ] {
        assert!(
            matches!(&r, Err(LockError::InvalidTtl { reason, .. }) if reason.contains("drift=")),
            "{r:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the refusal took {:?}: it waited",
        started.elapsed()
    );
    let all: Vec<&RedisServer> = servers.iter().collect();
    assert_eq!(holding(&all, n.as_str()).await, 0);
    let stats_after = {
        let mut c = redis::Client::open(servers[0].url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        redis::cmd("INFO")
            .arg("commandstats")
            .query_async::<String>(&mut c)
            .await
            .unwrap()
    };
    let evals = |stats: &str| -> u64 {
        stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    assert_eq!(
        evals(&stats_before),
        evals(&stats_after),
        "scripts ran on a node for a refused TTL"
    );
    // A TTL with room is granted.
    let lease = client
        .try_acquire(&req(&n, Duration::from_secs(4)))
        .await
        .unwrap()
        .expect("free");
    client.release(&lease).await.unwrap();
}

/// One server listed twice under two addresses (here: its own and a
/// proxy's in front of it) is refused when the nodes connect: it would
/// count twice toward the majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_listed_under_two_addresses_is_refused() {
    let servers = RedisServer::start_independent(2, &[]).expect("start two redis-servers");
    let alias = Proxy::start(servers[0].addr()).unwrap();
    let url = format!(
        "redlock://{},{},{}",
        servers[0].addr(),
        alias.addr(),
        servers[1].addr()
    );
    let r = RedlockBackend::connect(&url).await;
    assert!(
        matches!(&r, Err(LockError::Config(m)) if m.contains("same server")),
        "{r:?}"
    );
    // Three independent servers connect.
    let third = RedisServer::start().unwrap();
    let url = format!(
        "redlock://{},{},{}",
        servers[0].addr(),
        servers[1].addr(),
        third.addr()
    );
    RedlockBackend::connect(&url).await.expect("connect");
}

/// A lease is of its database: a client of another database of the same
/// nodes refuses it, where it would find nothing there to release and
/// answer Ok while the lock stayed held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_one_database_is_foreign_to_a_client_of_another() {
    let servers = RedisServer::start_independent(3, &[]).expect("start three redis-servers");
    let zero =
        RedlockBackend::connect(&format!("redlock://{}/0", RedisServer::host_list(&servers)))
            .await
            .expect("connect");
    let one = RedlockBackend::connect(&format!("redlock://{}/1", RedisServer::host_list(&servers)))
        .await
        .expect("connect");
    let n = name("db-space");
    let lease = zero
        .try_acquire(&req(&n, Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free");
    for r in [one.release(&lease).await, one.renew(&lease).await.map(drop)] {
        assert!(matches!(r, Err(LockError::ForeignLease { .. })), "{r:?}");
    }
    let all: Vec<&RedisServer> = servers.iter().collect();
    assert_eq!(
        holding(&all, n.as_str()).await,
        3,
        "still held on every node"
    );
    zero.release(&lease).await.unwrap();
}
