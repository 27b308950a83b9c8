//! Batched renewals against a real etcd: every per-lease answer of `renew`
//! kept, and the request count proved by the server's own counters.

mod common;

use std::time::Duration;

use backend_etcd::EtcdBackend;
use common::{handled, name, server};
use lock_core::{AcquireRequest, Lease, LockBackend, LockName, OwnerToken};
use tokio::time::sleep;

async fn take(client: &EtcdBackend, name: &str, ttl: Duration) -> Lease {
    let req =
        AcquireRequest::new(LockName::new(name).unwrap(), OwnerToken::random(), ttl, ttl).unwrap();
    client
        .try_acquire(&req)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name} is free"))
}

/// 300 leases (more than the 128 keys one transaction reads) renewed in one
/// call: three read transactions and no range read at all, where a renew
/// per lease reads each claim key by its own request; one keepalive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_costs_one_transaction_per_128_leases() {
    let (server, _endpoints, url) = server();
    let client = EtcdBackend::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(10);
    let base = name("count");
    let mut leases = Vec::new();
    for i in 0..300 {
        leases.push(take(&client, &format!("{base}-{i}"), ttl).await);
    }
    let keepalives = client.sessions()[0].keepalives_sent;
    let (txn0, range0) = (
        handled(server.addr(), "Txn").await,
        handled(server.addr(), "Range").await,
    );
    let answers = client.renew_many(&leases).await;
    let (txn1, range1) = (
        handled(server.addr(), "Txn").await,
        handled(server.addr(), "Range").await,
    );
    assert_eq!(answers.len(), leases.len());
    for (old, answer) in leases.iter().zip(&answers) {
        let renewed = answer.as_ref().expect("a live lease is renewed");
        assert_eq!(renewed.name(), old.name(), "answers out of order");
        assert_eq!(renewed.fence(), old.fence());
        assert!(renewed.deadline() > old.deadline(), "deadline not moved");
    }
    assert_eq!(txn1 - txn0, 3, "one read transaction per 128 leases");
    assert_eq!(range1 - range0, 0, "no read of its own per lease");
    let sent = client.sessions()[0].keepalives_sent - keepalives;
    assert!(
        (1..=2).contains(&sent),
        "one keepalive for the batch, {sent} sent"
    );
    for l in answers.into_iter().map(Result::unwrap) {
        client.release(&l).await.unwrap();
    }
}

/// One batch, larger than a transaction's 128 keys, mixing live leases
/// (on two sessions: two TTLs), one released, one expired (not renewed
/// past its TTL: the session deleted its key), one whose name another
/// client holds now, and one whose key another client deleted: each is
/// answered as `renew` answers it, in order, and nobody else's lock is
/// touched or a gone one re-created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_answers_each_lease_as_renew_would() {
    let (_server, _endpoints, url) = server();
    let client = EtcdBackend::connect(&url).await.unwrap();
    let other = EtcdBackend::connect(&url).await.unwrap();
    let (short, long) = (Duration::from_secs(2), Duration::from_secs(10));
    let base = name("mixed");
    let expired = take(&client, &format!("{base}-expired"), short).await;
    let mut leases = Vec::new();
    for i in 0..140 {
        leases.push(take(&client, &format!("{base}-{i}"), long).await);
    }
    let other_ttl = take(
        &client,
        &format!("{base}-other-ttl"),
        Duration::from_secs(5),
    )
    .await;
    let released = take(&client, &format!("{base}-released"), long).await;
    client.release(&released).await.unwrap();
    let taken_over = take(&client, &format!("{base}-taken"), long).await;
    client.release(&taken_over).await.unwrap();
    let theirs = take(&other, &format!("{base}-taken"), long).await;
    let forced = take(&client, &format!("{base}-forced"), long).await;
    assert!(other.force_release(forced.name()).await.unwrap());
    // The short lock passes its TTL unrenewed; its session deletes its key.
    sleep(short + Duration::from_millis(1500)).await;
    assert!(other.inspect(expired.name()).await.unwrap().is_none());

    let mut batch = vec![expired.clone(), released.clone()];
    batch.extend(leases[..70].iter().cloned());
    batch.push(taken_over.clone());
    batch.push(other_ttl.clone());
    batch.extend(leases[70..].iter().cloned());
    batch.push(forced.clone());
    let answers = client.renew_many(&batch).await;
    assert_eq!(answers.len(), batch.len());
    for (old, answer) in batch.iter().zip(&answers) {
        let gone = [&expired, &released, &taken_over, &forced]
            .iter()
            .any(|g| g.name() == old.name());
        if gone {
            assert!(
                answer.as_ref().is_err_and(|e| e.is_lost()),
                "{}: {answer:?}",
                old.name()
            );
        } else {
            let renewed = answer.as_ref().expect("a live lease is renewed");
            assert_eq!(renewed.name(), old.name(), "answers out of order");
            assert_eq!(renewed.fence(), old.fence());
            assert_eq!(renewed.ttl(), old.ttl(), "its own session's TTL");
            assert!(renewed.deadline() > old.deadline(), "deadline not moved");
        }
    }
    // Nothing re-created, and the other client's lock is still its own.
    for gone in [&expired, &released, &forced] {
        assert!(other.inspect(gone.name()).await.unwrap().is_none());
    }
    let info = other.inspect(theirs.name()).await.unwrap().expect("held");
    assert_eq!(info.fence, Some(theirs.fence()));
    other.release(&theirs).await.unwrap();
    // The live leases still release cleanly.
    for answer in answers.into_iter().flatten() {
        client.release(&answer).await.unwrap();
    }
}
