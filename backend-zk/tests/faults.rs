//! Faults: a session expired behind a holder's back, a server paused past
//! the session timeout, an ensemble member and the leader killed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_zk::{fenced_set_data, ZkBackend};
use lock_core::{LockBackend, Locker};
use testkit::{Mode, Proxy, ZooKeeperEnsemble, ZooKeeperServer};
use tokio::time::{sleep, timeout, Instant};

fn locker(b: &Arc<ZkBackend>) -> Locker {
    Locker::from_arc(b.clone() as Arc<dyn LockBackend>)
}

/// The holder's traffic is silenced past its session timeout, so the server
/// expires its session: the holder reports the loss by its local deadline,
/// before the other client gets in; the next holder's fenced write is
/// accepted and the old holder's is refused; once the network is back the
/// old lease is revoked at once (session Expired) and a new session serves
/// the holder's later acquisitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_while_holding() {
    let server = common::server();
    let proxy = Proxy::start(server.addr()).expect("proxy");
    let holder = Arc::new(
        ZkBackend::connect(&format!("zk://{}", proxy.addr()))
            .await
            .expect("connect"),
    );
    let other = Arc::new(common::client().await);
    let name = common::unique("expiry");
    let ttl = Duration::from_secs(2);
    let data = format!("/polylock-fenced-{}", rand::random::<u32>());

    let guard = locker(&holder)
        .lock(name.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .expect("acquire");
    let lease = guard.lease();
    fenced_set_data(&holder, &lease, &data, b"holder")
        .await
        .expect("the holder writes while it holds");
    // A second lease of the same session, held without a guard.
    let second = common::try_take(&holder, &common::unique("expiry-second"), ttl)
        .await
        .expect("a second lock");
    let waiter = tokio::spawn({
        let other = other.clone();
        let name = name.clone();
        async move {
            let g = locker(&other)
                .lock(name.as_str())
                .ttl(ttl)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
                .expect("the other client acquires after the expiry");
            (Instant::now(), g)
        }
    });
    sleep(Duration::from_millis(300)).await;
    // The holder's last renewal before the cut promises at least this.
    let promised = guard.lease().deadline();
    proxy.set_mode(Mode::Blackhole);
    timeout(ttl * 2, guard.lost())
        .await
        .expect("the holder was not told of the loss by its deadline");
    let lost_at = Instant::now();
    assert!(
        lost_at <= promised + Duration::from_millis(300),
        "told {:?} after the deadline",
        lost_at - promised
    );
    let (got_at, next) = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the other client never got the lock")
        .expect("task");
    assert!(
        got_at >= lost_at,
        "the other client got in before the holder was told"
    );
    assert!(
        got_at >= promised,
        "the lock was free {:?} before the holder's local deadline",
        promised - got_at
    );
    assert!(next.fence() > lease.fence());
    fenced_set_data(&other, &next.lease(), &data, b"next")
        .await
        .expect("the next holder writes");

    proxy.set_mode(Mode::Pass);
    let revoked = lease
        .revocation()
        .expect("leases carry the session's signal")
        .clone();
    timeout(Duration::from_secs(20), revoked.cancelled())
        .await
        .expect("the expired session did not revoke its lease");
    assert!(
        second.is_revoked(),
        "every lease of the expired session is revoked, not only the guard's"
    );
    let r = holder.renew(&second).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "renew after expiry: {r:?}"
    );
    let r = fenced_set_data(&holder, &lease, &data, b"stale").await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "stale fenced write: {r:?}"
    );
    let next_fence = next.fence();
    next.release().await.expect("release");
    let again = locker(&holder)
        .lock(name.as_str())
        .ttl(ttl)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("a new session serves the holder's next acquisition");
    assert!(again.fence() > next_fence);
    again.release().await.expect("release");
    drop(guard);
}

/// The server frozen past the session timeout: the holder reports the loss
/// at its local deadline, while the server is still frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_past_the_session_timeout() {
    let server = tokio::task::spawn_blocking(ZooKeeperServer::start)
        .await
        .unwrap()
        .expect("start");
    let url = format!("zk://{}", server.connect_string());
    let holder = Arc::new(ZkBackend::connect(&url).await.expect("connect"));
    let name = common::unique("paused");
    let ttl = Duration::from_secs(2);
    let guard = locker(&holder)
        .lock(name.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .expect("acquire");
    let deadline = guard.lease().deadline();
    server.pause().expect("pause");
    let r = timeout(ttl * 2, guard.lost()).await;
    let lost_at = Instant::now();
    server.resume().expect("resume");
    r.expect("no loss reported while the server was frozen");
    assert!(
        lost_at <= deadline + ttl,
        "told {:?} after the local deadline",
        lost_at.saturating_duration_since(deadline)
    );
    // Whatever the server decides after it wakes, the lock is usable again.
    let other = Arc::new(ZkBackend::connect(&url).await.expect("connect"));
    let g = locker(&other)
        .lock(name.as_str())
        .ttl(ttl)
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .expect("acquire after the pause");
    g.release().await.expect("release");
}

/// In a three-server ensemble, the holder keeps its lock while a follower
/// and then the leader are killed (its session moves to a live server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_keeps_the_lock_when_a_member_or_the_leader_dies() {
    let zk = tokio::task::spawn_blocking(|| ZooKeeperEnsemble::start(3))
        .await
        .unwrap()
        .expect("start the ensemble");
    let url = zk.url();
    let holder = Arc::new(ZkBackend::connect(&url).await.expect("connect"));
    let other = Arc::new(ZkBackend::connect(&url).await.expect("connect"));
    let name = common::unique("ensemble");
    // The longest session the test kit's servers grant (20 ticks).
    let ttl = Duration::from_secs(10);
    let guard = locker(&holder)
        .lock(name.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .expect("acquire");
    let fence = guard.fence();

    let members = zk.members();
    let follower = members
        .iter()
        .find(|m| m.mode().is_ok_and(|x| x == "follower"))
        .expect("a follower");
    follower.kill().expect("kill a follower");
    sleep(Duration::from_secs(3)).await;
    assert!(
        guard.is_held(),
        "the holder lost its lock when a follower died"
    );
    let r = locker(&other)
        .lock(name.as_str())
        .ttl(ttl)
        .try_acquire()
        .await;
    assert!(
        matches!(r, Ok(None)) || r.as_ref().is_err_and(|e| e.is_retryable()),
        "the lock was free with a follower down: {r:?}"
    );
    tokio::task::block_in_place(|| follower.restart()).expect("restart the follower");

    let leader = zk.leader().expect("a leader");
    leader.kill().expect("kill the leader");
    let give_up = Instant::now() + Duration::from_secs(30);
    while zk.leader().is_none() {
        assert!(Instant::now() < give_up, "no new leader");
        sleep(Duration::from_millis(200)).await;
    }
    // Some renewals after the new leader took over.
    sleep(ttl / 2).await;
    assert!(
        guard.is_held(),
        "the holder lost its lock when the leader died"
    );
    let info = other
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("still held");
    assert_eq!(
        info.fence,
        Some(fence),
        "another holder after the leader change"
    );
    guard
        .release()
        .await
        .expect("release after the leader change");
    tokio::task::block_in_place(|| leader.restart()).expect("restart the old leader");
}

/// A waiter gives up while its connection is silenced, so the delete of
/// its node cannot get through then; the session outlives the silence.
/// The node must still go once the connection is back: left behind, it
/// would come first in line after the holder's release and hold the lock
/// for nobody while the waiter's session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gave_up_during_a_network_cut_leaves_no_node() {
    let server = common::server();
    let proxy = Proxy::start(server.addr()).expect("proxy");
    let waiter = Arc::new(
        ZkBackend::connect(&format!("zk://{}?op_timeout=500ms", proxy.addr()))
            .await
            .expect("connect"),
    );
    let holder = common::client().await;
    let name = common::unique("gave-up");
    // A 6 s session: its client calls the connection lost after 2.4 s of
    // silence (failing the delete in flight), and the server keeps the
    // session through a 3.5 s cut.
    let ttl = Duration::from_secs(6);
    let held = common::try_take(&holder, &name, ttl)
        .await
        .expect("the holder takes the lock");
    // The waiter client lives on (closing it would end its session, and
    // the node with it).
    let waiting = tokio::spawn({
        let (name, waiter) = (name.clone(), waiter.clone());
        async move {
            waiter
                .acquire(&common::req(&name, ttl, Duration::from_millis(800)))
                .await
                .map(|l| l.is_some())
        }
    });
    // Queued by now; the cut comes before the wait ends.
    sleep(Duration::from_millis(400)).await;
    let cut = Instant::now();
    proxy.set_mode(Mode::Blackhole);
    let gave_up = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter gives up")
        .unwrap();
    assert!(!matches!(gave_up, Ok(true)), "the waiter got a held lock");
    sleep(Duration::from_millis(3500).saturating_sub(cut.elapsed())).await;
    proxy.set_mode(Mode::Pass);
    holder.release(&held).await.expect("release");
    // The waiter's session reconnects and its node goes; another client
    // then finds the lock free.
    let third = common::client().await;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(lease) = common::try_take(&third, &name, ttl).await {
            third.release(&lease).await.expect("release");
            break;
        }
        let holder = third.inspect(&name).await.expect("inspect");
        assert!(
            Instant::now() < until,
            "the lock stayed held after every holder and waiter left: {holder:?}"
        );
        sleep(Duration::from_millis(100)).await;
    }
    drop(waiter);
}

/// A call that has to open a session (a TTL no session of this client has
/// yet) answers within one op_timeout while the servers are unreachable,
/// with a retryable error: the connect is bounded by op_timeout, not by
/// the session timeout asked for, which a long TTL makes long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_session_answers_within_op_timeout_when_cut_off() {
    let server = common::server();
    let proxy = Proxy::start(server.addr()).expect("proxy");
    let client = ZkBackend::connect(&format!("zk://{}?op_timeout=1s", proxy.addr()))
        .await
        .expect("connect");
    proxy.set_mode(Mode::Blackhole);
    let name = common::unique("cut-connect");
    for ttl in [Duration::from_secs(30), Duration::from_secs(40)] {
        let started = Instant::now();
        let r = timeout(
            Duration::from_secs(20),
            client.try_acquire(&common::req(&name, ttl, Duration::ZERO)),
        )
        .await
        .unwrap_or_else(|_| panic!("a {ttl:?} try_acquire still had no answer after 20 s"));
        let took = started.elapsed();
        assert!(
            matches!(&r, Err(e) if e.is_retryable()),
            "expected a retryable error, got {r:?}"
        );
        assert!(
            took < Duration::from_millis(2500),
            "a {ttl:?} try_acquire answered after {took:?}, op_timeout is 1 s"
        );
    }
    proxy.set_mode(Mode::Pass);
}

/// A release whose future was dropped after its delete left, and which
/// landed, is answered `Ok` when the caller releases again, not `Lost`:
/// nothing else removed the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_retried_after_a_dropped_one_landed_is_ok() {
    let server = common::server();
    let proxy = Proxy::start(server.addr()).expect("proxy");
    let client = Arc::new(
        ZkBackend::connect(&format!("zk://{}", proxy.addr()))
            .await
            .expect("connect"),
    );
    let name = common::unique("dropped-release");
    let lease = common::try_take(&client, &name, Duration::from_secs(10))
        .await
        .expect("free");
    proxy.set_mode(Mode::Delay(Duration::from_millis(300)));
    let first = tokio::spawn({
        let (client, lease) = (client.clone(), lease.clone());
        async move { client.release(&lease).await }
    });
    // The delete is on its way (300 ms to the server); its answer is not.
    sleep(Duration::from_millis(100)).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // It lands, and its answer comes back to nobody.
    sleep(Duration::from_millis(900)).await;
    proxy.set_mode(Mode::Pass);
    assert_eq!(client.inspect(&name).await.expect("inspect"), None);
    client
        .release(&lease)
        .await
        .expect("the retried release is the dropped one's, not a loss");
}

/// A follower cut off from its leader answers reads for `syncLimit` ticks
/// before it gives the leader up, while the leader, which hears of the
/// session no more, expires it one session timeout after its last news. A
/// renewal the cut-off follower answered must not give the holder a
/// deadline past the moment another client is granted the lock: the
/// client takes `follower_lag` off it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_by_a_cut_off_follower_ends_before_the_next_grant() {
    let zk = tokio::task::spawn_blocking(|| ZooKeeperEnsemble::start_with_cuttable_links(3))
        .await
        .unwrap()
        .expect("start the ensemble");
    let give_up = Instant::now() + Duration::from_secs(30);
    let (leader, follower) = loop {
        let leader = zk.leader();
        let follower = zk
            .members()
            .iter()
            .find(|m| m.mode().is_ok_and(|x| x == "follower"));
        if let (Some(l), Some(f)) = (leader, follower) {
            break (l, f);
        }
        assert!(Instant::now() < give_up, "no leader and follower");
        sleep(Duration::from_millis(200)).await;
    };
    // The holder reaches only the follower, through a link the test cuts
    // once the follower has answered the renewal.
    let link = Proxy::start(follower.addr()).expect("proxy");
    let holder = ZkBackend::connect(&format!(
        "zk://{}?follower_lag={}ms",
        link.addr(),
        zk.follower_lag().as_millis()
    ))
    .await
    .expect("connect");
    let other = Arc::new(
        // On the leader, no follower reads to allow for.
        ZkBackend::connect(&format!("zk://{}?follower_lag=0", leader.addr()))
            .await
            .expect("connect"),
    );
    let name = common::unique("cut-follower");
    // The longest session the test kit's servers grant (20 ticks).
    let ttl = Duration::from_secs(10);
    let lease = common::try_take(&holder, &name, ttl)
        .await
        .expect("the holder takes the lock");
    let waiting = tokio::spawn({
        let (other, name) = (other.clone(), name.clone());
        async move {
            let lease = other
                .acquire(&common::req(&name, ttl, Duration::from_secs(40)))
                .await;
            (Instant::now(), lease)
        }
    });
    // A renewal the leader hears of (the follower passes the session's
    // news on at the leader's next ping, a quarter second at most), then
    // the cut.
    let lease = holder.renew(&lease).await.expect("renew before the cut");
    sleep(Duration::from_secs(1)).await;
    zk.cut_off(follower.id()).expect("cut the follower off");
    // The follower gives its leader up 2.25-2.5 s after its last news of
    // it (syncLimit ticks; the leader pings every half tick).
    sleep(Duration::from_millis(1200)).await;
    let renewed = holder
        .renew(&lease)
        .await
        .expect("the cut-off follower still answers the renewal");
    link.set_mode(Mode::Blackhole);
    let (granted_at, granted) = timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the other client gets the lock once the session expires")
        .unwrap();
    let granted = granted
        .expect("the other client's acquire")
        .expect("granted within the wait");
    assert!(granted.fence() > renewed.fence());
    // The leader never heard of that renewal (the cut held): it let the
    // other client in before a session timeout from it.
    assert!(
        granted_at < renewed.sent_at() + renewed.ttl(),
        "granted {:?} after the renewal",
        granted_at - renewed.sent_at()
    );
    assert!(
        renewed.deadline() <= granted_at,
        "the holder trusts its lease {:?} past the next grant",
        renewed.deadline() - granted_at
    );
    other.release(&granted).await.expect("release");
    drop(holder);
}
