//! Names that nest, `list` over the prefix root and the waiter count,
//! next to directories and nodes other ZooKeeper clients made.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use lock_core::{AcquireRequest, HolderMeta, LockBackend, LockName, OwnerToken};
use zookeeper_client::{Acls, CreateMode};

fn meta() -> HolderMeta {
    HolderMeta::new(
        "db-1",
        77,
        "vacuum --all",
        UNIX_EPOCH + Duration::from_millis(1_780_000_000_456),
    )
}

/// A lock below another whose last segment reads like a lock node
/// (`x/lock-0000000000`) has its directory among `x`'s lock nodes; `x`
/// must still be free, and both must be listed under their own names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_below_another_does_not_block_it() {
    let c = common::client().await;
    let parent = common::unique("nested");
    let ttl = Duration::from_secs(10);
    let mut held = Vec::new();
    for n in [
        "lock-0000000000",
        "_c_x-lock-0000000001",
        "x-lock-99999999999",
    ] {
        let child = LockName::new(format!("{parent}/{n}")).unwrap();
        held.push(
            common::try_take(&c, &child, ttl)
                .await
                .unwrap_or_else(|| panic!("{child} is free")),
        );
    }
    let other = common::client().await;
    let top = common::try_take(&other, &parent, ttl)
        .await
        .expect("the parent is free although names below it are held");
    let listed = other.list(parent.as_str(), 10).await.expect("list");
    let mut want: Vec<&LockName> = held.iter().map(|l| l.name()).collect();
    want.push(top.name());
    want.sort();
    assert_eq!(listed.iter().map(|(n, _)| n).collect::<Vec<_>>(), want);
    other.release(&top).await.unwrap();
    for l in &held {
        c.release(l).await.unwrap();
    }
}

/// `list` gives back exact names (escaped paths, nested names, spaces,
/// non-ASCII), their descriptions, and leaves out directories no name maps
/// to and nodes polylock did not write; `waiters` counts every queued node
/// but the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_maps_paths_to_exact_names_and_skips_foreign_nodes() {
    let c = common::client().await;
    let run = common::unique("list");
    let names = ["%x", "/lead", "a", "a/..", "a/b", "b c", "ü"];
    let ttl = Duration::from_secs(10);
    let mut leases = Vec::new();
    for n in names {
        let req = AcquireRequest::new(
            LockName::new(format!("{run}/{n}")).unwrap(),
            OwnerToken::random(),
            ttl,
            Duration::ZERO,
        )
        .unwrap()
        .with_meta(meta());
        leases.push(c.try_acquire(&req).await.unwrap().expect("free"));
    }
    leases.sort_by(|a, b| a.name().cmp(b.name()));

    // Another client's nodes: a directory no name maps to, holding a lock
    // node, and a node with foreign data first in one of ours.
    let raw = zookeeper_client::Client::connect(&common::server().connect_string())
        .await
        .unwrap();
    let root = c.lock_path(&run);
    let dirs = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let nodes = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    raw.mkdir(&format!("{root}/odd%zz"), &dirs).await.unwrap();
    raw.create(&format!("{root}/odd%zz/lock-"), b"x", &nodes)
        .await
        .unwrap();
    raw.mkdir(&format!("{root}/foreign"), &dirs).await.unwrap();
    raw.create(&format!("{root}/foreign/lock-"), b"10.0.0.1", &nodes)
        .await
        .unwrap();

    let listed = c.list(&format!("{run}/"), 100).await.expect("list");
    let got: Vec<&LockName> = listed.iter().map(|(n, _)| n).collect();
    let want: Vec<&LockName> = leases.iter().map(|l| l.name()).collect();
    assert_eq!(got, want, "listed names");
    for ((_, info), lease) in listed.iter().zip(&leases) {
        assert_eq!(info.fence, Some(lease.fence()));
        assert_eq!(info.meta, Some(meta()));
    }
    let limited = c.list(&format!("{run}/a"), 2).await.expect("list");
    assert_eq!(
        limited.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        [format!("{run}/a"), format!("{run}/a/..")]
    );

    // Two more nodes in `a`: one polylock waiter and one foreign node.
    let a = LockName::new(format!("{run}/a")).unwrap();
    assert_eq!(c.waiters(&a).await.unwrap(), Some(0));
    raw.create(&format!("{}/lock-", c.lock_path(&a)), b"", &nodes)
        .await
        .unwrap();
    assert_eq!(c.waiters(&a).await.unwrap(), Some(1));
    let unknown = LockName::new(format!("{run}/never")).unwrap();
    assert_eq!(c.waiters(&unknown).await.unwrap(), Some(0));

    for l in &leases {
        c.release(l).await.unwrap();
    }
    let after = c.list(&format!("{run}/"), 100).await.expect("list");
    // `a`'s foreign waiter is first now, and it is not ours.
    assert!(after.is_empty(), "{after:?}");
}
