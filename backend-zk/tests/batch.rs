//! Batched renewals against a real server: `renew_many` answers every lease
//! as `renew` would (live, released, expired, taken over, another client's),
//! in order, and sends one request per session and chunk, which the server's
//! own per-connection packet count (`cons`) shows.

mod common;

use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::{Lease, LockBackend, Locker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep, Instant};

/// Packets the server received on the connection of session `sid`.
async fn received(sid: i64) -> u64 {
    let mut s = tokio::net::TcpStream::connect(common::server().addr())
        .await
        .expect("connect for cons");
    s.write_all(b"cons").await.expect("send cons");
    let mut text = String::new();
    s.read_to_string(&mut text).await.expect("read cons");
    let want = format!("sid={sid:#x},");
    let line = text
        .lines()
        .find(|l| l.contains(&want))
        .unwrap_or_else(|| panic!("no connection with {want} in {text}"));
    let at = line.find("recved=").expect("recved in cons") + "recved=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a packet count")
}

/// Requests the server got on `sid`'s connection while `f` ran. A ping
/// of the driver's heartbeat may land in the window too.
async fn requests_during<T>(sid: i64, f: impl std::future::Future<Output = T>) -> (u64, T) {
    let before = received(sid).await;
    let out = f.await;
    (received(sid).await - before, out)
}

async fn take_many(c: &ZkBackend, prefix: &str, n: usize, ttl: Duration) -> Vec<Lease> {
    let mut leases = Vec::new();
    for i in 0..n {
        let name = common::unique(&format!("{prefix}-{i}"));
        leases.push(common::try_take(c, &name, ttl).await.expect("free"));
    }
    leases
}

fn is_lost(r: &Result<Lease, lock_core::LockError>) -> bool {
    r.as_ref().is_err_and(|e| e.is_lost())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_is_answered_per_lease_in_order() {
    let ttl = Duration::from_secs(10);
    let (a, b) = (common::client().await, common::client().await);
    let live = take_many(&a, "live", 2, ttl).await;

    let released_name = common::unique("released");
    let released = common::try_take(&a, &released_name, ttl).await.unwrap();
    a.release(&released).await.expect("release");

    // The shortest session: its lease runs out unrenewed and the client
    // deletes the node.
    let expired_name = common::unique("expired");
    let expired = common::try_take(&a, &expired_name, Duration::from_secs(1))
        .await
        .unwrap();
    let gone_by = Instant::now() + expired.ttl() + Duration::from_millis(500);

    // Removed behind our back, and held by another client since.
    let taken_name = common::unique("taken");
    let taken = common::try_take(&a, &taken_name, ttl).await.unwrap();
    assert!(b.force_release(&taken_name).await.expect("force release"));
    let theirs = common::try_take(&b, &taken_name, ttl).await.expect("free");

    // Another client's lease, handed to this one.
    let foreign_name = common::unique("foreign");
    let foreign = common::try_take(&b, &foreign_name, ttl).await.unwrap();

    while Instant::now() < gone_by {
        sleep(Duration::from_millis(100)).await;
    }
    let batch = vec![
        live[0].clone(),
        released.clone(),
        expired.clone(),
        taken.clone(),
        foreign.clone(),
        live[1].clone(),
    ];
    let before = Instant::now();
    let answers = a.renew_many(&batch).await;
    let after = Instant::now();
    assert_eq!(answers.len(), batch.len());
    for (i, lease) in [(0, &live[0]), (5, &live[1])] {
        let renewed = answers[i].as_ref().expect("a live lease renews");
        assert_eq!(renewed.fence(), lease.fence(), "same holding");
        assert_eq!(renewed.owner(), lease.owner());
        assert_eq!(renewed.ttl(), ttl, "the session's negotiated timeout");
        assert!(
            renewed.sent_at() >= before && renewed.sent_at() <= after,
            "dated from the send"
        );
        assert!(renewed.deadline() > lease.deadline());
    }
    for (i, answer) in answers.iter().enumerate().take(5).skip(1) {
        assert!(is_lost(answer), "lease {i}: {answer:?}");
    }
    // Nothing was re-created or touched for the lost ones.
    assert!(a.inspect(&released_name).await.unwrap().is_none());
    assert!(a.inspect(&expired_name).await.unwrap().is_none());
    let holder = a.inspect(&taken_name).await.unwrap().expect("held by b");
    assert_eq!(holder.fence, Some(theirs.fence()));
    b.renew(&theirs).await.expect("b still holds its lock");
    b.renew(&foreign)
        .await
        .expect("b still holds the other one");
    // A renewed lease is still released normally.
    for l in answers.into_iter().flatten() {
        a.release(&l).await.expect("release renewed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_larger_than_a_chunk_takes_one_request_per_chunk() {
    let ttl = Duration::from_secs(10);
    let c = common::client().await;
    let sid = c.session_id(ttl).await.expect("session");
    let n = 300;
    let leases = take_many(&c, "chunked", n, ttl).await;
    let (requests, answers) = requests_during(sid, c.renew_many(&leases)).await;
    assert_eq!(answers.len(), n);
    for (lease, answer) in leases.iter().zip(&answers) {
        let renewed = answer.as_ref().expect("renewed");
        assert_eq!(renewed.fence(), lease.fence(), "answers in the order asked");
    }
    // Two chunks (256 + 44), and perhaps a heartbeat: one request per
    // lease would be 300.
    assert!((2..=3).contains(&requests), "{requests} requests for {n}");

    // One lease alone: one request.
    let (requests, renewed) = requests_during(sid, c.renew(&leases[0])).await;
    renewed.expect("renew");
    assert!((1..=2).contains(&requests), "{requests} requests for one");
    for l in &leases {
        c.release(l).await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_two_sessions_takes_one_request_on_each() {
    let c = common::client().await;
    let (short, long) = (Duration::from_secs(3), Duration::from_secs(4));
    let (s1, s2) = (
        c.session_id(short).await.unwrap(),
        c.session_id(long).await.unwrap(),
    );
    assert_ne!(s1, s2, "one session per TTL");
    let mut leases = Vec::new();
    for (a, b) in take_many(&c, "short", 20, short)
        .await
        .into_iter()
        .zip(take_many(&c, "long", 20, long).await)
    {
        leases.extend([a, b]);
    }
    let (before1, before2) = (received(s1).await, received(s2).await);
    let answers = c.renew_many(&leases).await;
    let (d1, d2) = (received(s1).await - before1, received(s2).await - before2);
    for (lease, answer) in leases.iter().zip(&answers) {
        let renewed = answer.as_ref().expect("renewed");
        assert_eq!(renewed.fence(), lease.fence());
        assert_eq!(renewed.ttl(), lease.ttl(), "its own session's timeout");
    }
    assert!(
        (1..=2).contains(&d1) && (1..=2).contains(&d2),
        "{d1} and {d2}"
    );
    for l in &leases {
        c.release(l).await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_create_list_and_delete() {
    let ttl = Duration::from_secs(10);
    let c = common::client().await;
    let sid = c.session_id(ttl).await.expect("session");
    let locker = Locker::new(c);
    let name = common::unique("cycle");
    let cycle = || async {
        let g = locker
            .lock(name.as_str())
            .ttl(ttl)
            .try_acquire()
            .await
            .expect("try_acquire")
            .expect("free");
        g.release().await.expect("release");
    };
    cycle().await; // creates the parent nodes
    let n = 100;
    let (requests, ()) = requests_during(sid, async {
        for _ in 0..n {
            cycle().await;
        }
    })
    .await;
    // Three per cycle, and perhaps a heartbeat or two.
    assert!(
        (3 * n..=3 * n + 2).contains(&requests),
        "{requests} requests for {n} cycles"
    );
}
