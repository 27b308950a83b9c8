//! TTLs longer than a connect request can carry (a signed 32-bit count of
//! milliseconds, about 24.8 days) ask for the longest session it can: the
//! server then grants its own maximum, as for any long TTL, where the
//! wrapped-around value would have got its minimum.

mod common;

use std::time::Duration;

use lock_core::LockBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_past_what_a_session_request_carries_gets_the_servers_longest_session() {
    let client = common::client().await;
    let day = Duration::from_secs(24 * 3600);
    let mut granted = Vec::new();
    for days in [20, 30, 50, 365] {
        let name = common::unique(&format!("long-ttl-{days}"));
        let lease = common::try_take(&client, &name, day * days)
            .await
            .expect("free");
        granted.push((days, lease.ttl()));
        client.release(&lease).await.expect("release");
    }
    let longest = granted[0].1;
    // The wrapped-around request got the server's minimum session.
    let name = common::unique("long-ttl-min");
    let shortest = common::try_take(&client, &name, client.guarantees().min_ttl)
        .await
        .expect("free");
    client.release(&shortest).await.expect("release");
    assert!(
        longest > shortest.ttl(),
        "a 20-day TTL got a session of {longest:?}, the shortest TTL {:?}",
        shortest.ttl()
    );
    for (days, ttl) in &granted {
        assert_eq!(
            *ttl, longest,
            "a {days}-day TTL got a session of {ttl:?}, a 20-day one {longest:?}: {granted:?}"
        );
    }
}
