//! `follower_lag`: every deadline loses it, the shortest TTL grows with
//! it, and a TTL that then leaves a lease no renewal room is refused with
//! a typed error, before any I/O when the URL alone shows it, and without
//! holding anything when the server negotiates a shorter session. A URL
//! naming one member of an ensemble must say its lag. (That the lag
//! closes the gap a cut-off follower opens is in `faults.rs`.)

mod common;

use std::time::Duration;

use backend_zk::{min_ttl_for, ZkBackend};
use lock_core::{ClockPolicy, LockBackend, LockError};
use testkit::ZooKeeperEnsemble;
use tokio::time::timeout;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_lose_the_lag_and_short_ttls_are_raised() {
    let lag = Duration::from_secs(2);
    let client = ZkBackend::connect(&format!("{}?follower_lag=2s", common::url()))
        .await
        .expect("connect");
    let min = min_ttl_for(lag);
    assert_eq!(client.guarantees().min_ttl, min);
    let name = common::unique("lagged");
    let lease = common::try_take(&client, &name, Duration::from_secs(1))
        .await
        .expect("free");
    assert_eq!(lease.ttl(), min, "a TTL below the minimum is raised to it");
    // The lag, and the fifth of the TTL the client may go without
    // touching its session.
    let lost =
        |l: &lock_core::Lease| ClockPolicy::default().deadline(l.sent_at(), l.ttl()) - l.deadline();
    let expected = |l: &lock_core::Lease| {
        backend_zk::clock_for(ClockPolicy::default(), lag).deadline(l.sent_at(), l.ttl())
    };
    // (A microsecond for the float arithmetic of the policies.)
    let us = Duration::from_micros(1);
    assert!(
        lost(&lease) + us >= lag + lease.ttl() / 5,
        "{:?}",
        lost(&lease)
    );
    assert_eq!(lease.deadline(), expected(&lease));
    let renewed = client.renew(&lease).await.expect("renew");
    assert!(
        lost(&renewed) + us >= lag + renewed.ttl() / 5,
        "so does a renewal's"
    );
    assert_eq!(renewed.deadline(), expected(&renewed));
    // The same holding presented with the holder's own, laxer policy (as
    // one side of a migration lock carries the composite's): its renewal
    // still loses the lag.
    let lax = lock_core::Lease::new(
        renewed.name().clone(),
        renewed.owner(),
        renewed.fence(),
        renewed.ttl(),
        renewed.sent_at(),
        ClockPolicy::default(),
    )
    .with_backend_key(renewed.backend_key().unwrap().to_string())
    .in_space(client.lock_space().unwrap());
    let again = client.renew(&lax).await.expect("renew");
    assert_eq!(
        again.deadline(),
        expected(&again),
        "renewed without the lag"
    );
    client.release(&again).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_margin_the_lag_leaves_no_room_is_refused_before_any_io() {
    // Nothing listens there: an answer other than InvalidTtl means I/O.
    let client = ZkBackend::connect("zk://127.0.0.1:1,127.0.0.1:2?follower_lag=3s&op_timeout=5s")
        .await
        .expect("no I/O yet");
    let ttl = min_ttl_for(Duration::from_secs(3));
    let mut req = common::req(&common::unique("margin"), ttl, Duration::ZERO);
    // Enough room alone (lock_core's own check passes), none with the lag.
    req.clock.margin = Duration::from_secs(2);
    assert!(req.clock.check_ttl(ttl).is_ok());
    for r in [
        timeout(Duration::from_secs(1), client.try_acquire(&req)).await,
        timeout(Duration::from_secs(1), client.acquire(&req)).await,
    ] {
        match r.expect("answered without connecting") {
            Err(LockError::InvalidTtl { reason, .. }) => {
                assert!(reason.contains("follower_lag"), "{reason}")
            }
            other => panic!("expected InvalidTtl, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_server_shortens_below_the_room_is_refused_and_holds_nothing() {
    // The test kit's server grants at most 10 s; a 7 s lag leaves a 10 s
    // lease under a third of it.
    let client = ZkBackend::connect(&format!("{}?follower_lag=7s", common::url()))
        .await
        .expect("connect");
    let name = common::unique("shortened");
    let ttl = Duration::from_secs(20);
    let r = client
        .try_acquire(&common::req(&name, ttl, Duration::ZERO))
        .await;
    match r {
        Err(LockError::InvalidTtl { reason, .. }) => {
            assert!(reason.contains("granted a session of 10s"), "{reason}");
            assert!(reason.contains("follower_lag"), "{reason}");
        }
        other => panic!("expected InvalidTtl, got {other:?}"),
    }
    let other = common::client().await;
    let lease = common::try_take(&other, &name, ttl)
        .await
        .expect("the refused client left nothing behind");
    other.release(&lease).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_of_an_ensemble_needs_its_lag_said() {
    let zk = tokio::task::spawn_blocking(|| ZooKeeperEnsemble::start(3))
        .await
        .unwrap()
        .expect("start the ensemble");
    let member = zk.members()[0].addr();
    let name = common::unique("one-member");
    let ttl = Duration::from_secs(10);
    let bare = ZkBackend::connect(&format!("zk://{member}"))
        .await
        .expect("no I/O yet");
    for _ in 0..2 {
        match bare
            .try_acquire(&common::req(&name, ttl, Duration::ZERO))
            .await
        {
            Err(LockError::Config(why)) => {
                assert!(why.contains("3-server"), "{why}");
                assert!(why.contains("follower_lag"), "{why}");
            }
            other => panic!("expected a config error, got {other:?}"),
        }
    }
    assert!(matches!(
        bare.inspect(&name).await,
        Err(LockError::Config(_))
    ));
    let lag = zk.follower_lag().as_millis();
    for query in [
        format!("follower_lag={lag}ms"),
        "follower_lag=0".to_string(),
    ] {
        let said = ZkBackend::connect(&format!("zk://{member}?{query}"))
            .await
            .expect("connect");
        let lease = common::try_take(&said, &name, ttl)
            .await
            .unwrap_or_else(|| panic!("{query}: free"));
        said.release(&lease).await.expect("release");
    }
}
