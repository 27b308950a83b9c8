//! Holder metadata in the claim value, `list` over the key prefix and the
//! waiter count, next to the foreign clients sharing the layout
//! (`etcdctl lock`, other keys on leases).

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::{client, name, request, server, EtcdctlLock};
use etcd_client::{PutOptions, Txn, TxnOp};
use lock_core::{HolderMeta, Lease, LockBackend, LockName, OwnerToken};
use tokio::time::{sleep, Instant};

fn meta() -> HolderMeta {
    HolderMeta::new(
        "web-3",
        4242,
        "backup --full",
        UNIX_EPOCH + Duration::from_millis(1_780_000_000_123),
    )
}

/// A release through a client that did not take the lease (the compare
/// path, not the session's own delete) finds the described claim by its
/// owner and deletes it; a forged lease (another owner, the same key and
/// fence) deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_described_claim_is_released_by_its_owner_only() {
    let (_server, _endpoints, url) = server();
    let (holder, _) = client(&url).await;
    let (other, _) = client(&url).await;
    let lock = name("described-release");
    let req = request(&lock, Duration::from_secs(10)).with_meta(meta());
    let lease = holder.try_acquire(&req).await.unwrap().expect("free");
    let forged = Lease::new(
        lease.name().clone(),
        OwnerToken::random(),
        lease.fence(),
        lease.ttl(),
        Instant::now(),
        lease.policy(),
    )
    .with_backend_key(lease.backend_key().unwrap());
    let r = other.release(&forged).await;
    assert!(r.as_ref().is_err_and(|e| e.is_lost()), "forged: {r:?}");
    let seen = other.inspect(lease.name()).await.unwrap().expect("held");
    assert_eq!(
        seen.fence,
        Some(lease.fence()),
        "the forged release deleted"
    );
    assert_eq!(seen.meta, Some(meta()));

    other
        .release(&lease)
        .await
        .expect("the owner's lease releases through any client");
    assert_eq!(other.inspect(lease.name()).await.unwrap(), None);
}

/// `list` maps claim keys back to the exact names (`a`, `a/b`, a name
/// whose last segment looks like a lease id, spaces, non-ASCII) under the
/// URL's prefix, and leaves out what polylock did not write: an `etcdctl
/// lock` holder, keys on a lease that do not end in its id, a key on its
/// own lease with a foreign value (Go's election writes one), and the
/// session's own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_maps_keys_to_exact_names_and_skips_foreign_keys() {
    let (_server, endpoints, url) = server();
    let (ours, _) = client(&format!("{url}?prefix=app/")).await;
    let run = name("list");
    let names = ["a", "a/b", "a/ff", "b x", "ü/z"];
    let mut leases = Vec::new();
    for n in names {
        let req = request(&format!("{run}/{n}"), Duration::from_secs(10)).with_meta(meta());
        leases.push(ours.try_acquire(&req).await.unwrap().expect("free"));
    }

    let mut raw = etcd_client::Client::connect(endpoints.clone(), None)
        .await
        .unwrap();
    let grant = raw.lease_grant(30, None).await.unwrap().id();
    let on_lease = Some(PutOptions::new().with_lease(grant));
    raw.txn(Txn::new().and_then(vec![
        // Ends in a hex segment, but not its lease's id.
        TxnOp::put(format!("app/{run}/f1/abc"), "v", on_lease.clone()),
        // A Go election candidate: its lease's id, its own value.
        TxnOp::put(
            format!("app/{run}/elect/{grant:x}"),
            "candidate-1",
            on_lease.clone(),
        ),
        // No lease at all.
        TxnOp::put(format!("app/{run}/plain/1"), "", None),
    ]))
    .await
    .unwrap();
    let mut go = EtcdctlLock::spawn(&endpoints, &format!("app/{run}/go"));
    assert!(go.held_within(Duration::from_secs(10)).await);

    let listed = ours.list(&format!("{run}/"), 100).await.unwrap();
    let got: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    let want: Vec<String> = names.iter().map(|n| format!("{run}/{n}")).collect();
    assert_eq!(got, want, "listed names");
    for ((_, info), lease) in listed.iter().zip(&leases) {
        assert_eq!(info.fence, Some(lease.fence()));
        assert_eq!(info.meta, Some(meta()));
        assert!(info
            .expires_in
            .is_some_and(|d| d <= Duration::from_secs(10)));
    }
    // The etcdctl holder is a holder all the same for inspect.
    let go_name = LockName::new(format!("{run}/go")).unwrap();
    let go_holder = ours
        .inspect(&go_name)
        .await
        .unwrap()
        .expect("etcdctl holds");
    assert_eq!(go_holder.meta, None);
    // A prefix ending inside a segment, and the limit.
    let a: Vec<String> = ours
        .list(&format!("{run}/a"), 2)
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n.as_str().to_string())
        .collect();
    assert_eq!(a, [format!("{run}/a"), format!("{run}/a/b")]);
    // Without the URL's prefix, the names are other names.
    let (unprefixed, _) = client(&url).await;
    let seen = unprefixed.list(&run, 100).await.unwrap();
    assert!(seen.is_empty(), "{seen:?}");
    let seen = unprefixed.list(&format!("app/{run}"), 100).await.unwrap();
    assert_eq!(seen.len(), names.len(), "{seen:?}");
    assert!(seen[0].0.as_str().starts_with("app/"));

    go.release().await;
    for lease in &leases {
        ours.release(lease).await.unwrap();
    }
    assert!(ours.list(&run, 100).await.unwrap().is_empty());
}

/// `etcdctl lock` queues behind a described polylock claim and gets the
/// lock at its release; polylock's and etcdctl's waiters are both counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_both_clients_are_counted_and_etcdctl_ignores_the_value() {
    let (_server, endpoints, url) = server();
    let (holder, _) = client(&url).await;
    let (waiting, _) = client(&url).await;
    let lock = name("waiters");
    let lock_name = LockName::new(lock.as_str()).unwrap();
    let req = request(&lock, Duration::from_secs(10)).with_meta(meta());
    let lease = holder.try_acquire(&req).await.unwrap().expect("free");
    assert_eq!(holder.waiters(&lock_name).await.unwrap(), Some(0));
    let mut go = EtcdctlLock::spawn(&endpoints, &lock);
    common::wait_claims(&endpoints, &lock, 2).await;
    let ours = tokio::spawn({
        let req = lock_core::AcquireRequest::new(
            lock_name.clone(),
            OwnerToken::random(),
            Duration::from_secs(10),
            Duration::from_secs(30),
        )
        .unwrap();
        async move {
            let l = waiting.acquire(&req).await.unwrap().expect("served");
            waiting.release(&l).await.unwrap();
        }
    });
    common::wait_claims(&endpoints, &lock, 3).await;
    assert_eq!(holder.waiters(&lock_name).await.unwrap(), Some(2));
    assert!(
        !go.held_within(Duration::from_millis(500)).await,
        "etcdctl took a held lock"
    );
    holder.release(&lease).await.unwrap();
    assert!(
        go.held_within(Duration::from_secs(10)).await,
        "etcdctl is next in line"
    );
    assert_eq!(holder.waiters(&lock_name).await.unwrap(), Some(1));
    go.release().await;
    tokio::time::timeout(Duration::from_secs(20), ours)
        .await
        .expect("polylock's waiter is served")
        .unwrap();
    let start = Instant::now();
    while holder.waiters(&lock_name).await.unwrap() != Some(0) {
        assert!(start.elapsed() < Duration::from_secs(10), "never back to 0");
        sleep(Duration::from_millis(20)).await;
    }
}
