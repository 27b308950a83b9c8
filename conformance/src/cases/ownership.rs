use std::time::Duration;

use lock_core::{AcquireRequest, Lease, LockBackend, LockError, MemoryBackend, OwnerToken};
use tokio::time::Instant;

use crate::cases::{raw_try, time_until_free};
use crate::fixture::Ctx;

fn forged_from(real: &Lease) -> Lease {
    let forged = Lease::new(
        real.name().clone(),
        OwnerToken::random(),
        real.fence(),
        real.ttl(),
        Instant::now(),
        real.policy(),
    );
    match real.backend_key() {
        Some(k) => forged.with_backend_key(k),
        None => forged,
    }
}

/// A release (or renew) presented with someone else's identity, or with a
/// lease that expired and was taken over, is refused and leaves the real
/// holder's lock in place.
pub(crate) async fn forged_or_stale_release_is_refused(ctx: &Ctx<'_>) {
    let name = ctx.name("forged");
    let holder = ctx.client().await;
    let attacker = ctx.client().await;
    let real = raw_try(&holder, &name, Duration::from_secs(30))
        .await
        .expect("acquire");

    let forged = forged_from(&real);
    let r = attacker.release(&forged).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "forged release: {r:?}"
    );
    let r = attacker.renew(&forged).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "forged renew: {r:?}"
    );
    let info = attacker
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("still held");
    if let Some(f) = info.fence {
        assert_eq!(f, real.fence());
    }
    assert!(raw_try(&attacker, &name, Duration::from_secs(30))
        .await
        .is_none());
    holder
        .renew(&real)
        .await
        .expect("the real holder can still renew");
    holder
        .release(&real)
        .await
        .expect("the real holder can release");

    // Stale: a lease that expired and was taken over by someone else.
    let stale_name = ctx.name("stale");
    let ttl = ctx.ttl(Duration::from_millis(300));
    let stale = raw_try(&holder, &stale_name, ttl).await.expect("acquire");
    let (_, fresh) = time_until_free(&attacker, &stale_name, ttl * 2 + ctx.slack(ttl) * 4)
        .await
        .expect("the lease expired");
    assert!(fresh.fence() > stale.fence());
    let r = holder.release(&stale).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "stale release: {r:?}"
    );
    let r = holder.renew(&stale).await;
    assert!(r.as_ref().is_err_and(|e| e.is_lost()), "stale renew: {r:?}");
    let info = holder
        .inspect(&stale_name)
        .await
        .expect("inspect")
        .expect("new holder kept it");
    if let Some(f) = info.fence {
        assert_eq!(f, fresh.fence(), "the new holder's lock was replaced");
    }
    attacker.release(&fresh).await.expect("release");
}

/// Releasing twice, or releasing a lease whose lock is already free, is `Ok`.
pub(crate) async fn release_is_idempotent(ctx: &Ctx<'_>) {
    let name = ctx.name("idem");
    let client = ctx.client().await;
    let lease = raw_try(&client, &name, Duration::from_secs(30))
        .await
        .expect("acquire");
    client.release(&lease).await.expect("first release");
    client.release(&lease).await.expect("second release");
    assert!(client.inspect(&name).await.expect("inspect").is_none());
    // Through the guard API, then the raw lease again.
    let locker = ctx.locker().await;
    let guard = locker.lock(name.as_str()).acquire().await.expect("acquire");
    let lease = guard.lease();
    guard.release().await.expect("guard release");
    locker
        .backend()
        .release(&lease)
        .await
        .expect("release after guard release");
    assert!(client.inspect(&name).await.expect("inspect").is_none());
}

/// An overlap is never reported as success: holder A's lock is removed
/// behind its back, B takes it, works and releases; A's later release and
/// renew say `Lost`, because the lock was granted to someone else after
/// A's last acquire. Nothing is resurrected.
pub(crate) async fn release_after_an_overlap_reports_lost(ctx: &Ctx<'_>) {
    let name = ctx.name("overlap");
    let a = ctx.client().await;
    let b = ctx.client().await;
    let first = raw_try(&a, &name, Duration::from_secs(30))
        .await
        .expect("acquire");
    ctx.fixture()
        .remove_behind_back(&name)
        .await
        .expect("remove behind back");
    let second = raw_try(&b, &name, Duration::from_secs(30))
        .await
        .expect("free after the removal");
    b.release(&second).await.expect("release");
    let r = a.release(&first).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "release after another holder came and went must report Lost: {r:?}"
    );
    let r = a.renew(&first).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "renew after another holder came and went must report Lost: {r:?}"
    );
    assert!(
        a.inspect(&name).await.expect("inspect").is_none(),
        "a late release or renew resurrected the lock"
    );
}

/// The same owner token with an older fence is refused: after an owner
/// releases and takes the lock again, its old lease can neither renew nor
/// release the new holding.
pub(crate) async fn same_owner_with_an_older_fence_is_refused(ctx: &Ctx<'_>) {
    let name = ctx.name("old-fence");
    let client = ctx.client().await;
    let other = ctx.client().await;
    let owner = OwnerToken::random();
    let req = AcquireRequest::new(name.clone(), owner, Duration::from_secs(30), Duration::ZERO)
        .expect("valid request");
    let old = client
        .try_acquire(&req)
        .await
        .expect("try_acquire")
        .expect("acquire");
    client.release(&old).await.expect("release");
    let new = client
        .try_acquire(&req)
        .await
        .expect("try_acquire")
        .expect("acquire again");
    assert!(
        new.fence() > old.fence(),
        "the second holding reused a token"
    );

    let r = client.renew(&old).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "renew with the older fence must be refused: {r:?}"
    );
    let r = client.release(&old).await;
    assert!(
        r.is_ok() || r.as_ref().is_err_and(|e| e.is_lost()),
        "release with the older fence: {r:?}"
    );
    assert!(
        raw_try(&other, &name, Duration::from_secs(30))
            .await
            .is_none(),
        "the release of the older lease freed the newer holding"
    );
    let info = other.inspect(&name).await.expect("inspect").expect("held");
    if let Some(f) = info.fence {
        assert_eq!(f, new.fence(), "the newer holding was replaced");
    }
    client.release(&new).await.expect("release");
}

/// A lease is renewed and released through any client of the lock space
/// that granted it, and through no other: a client of another space (an
/// in-memory table here) refuses it with `ForeignLease` before any I/O,
/// this backend refuses that table's lease for the same name the same way,
/// the holder's lock stays as it was, and a second client of this backend
/// (same space, its own connections) renews and releases it.
pub(crate) async fn a_lease_is_used_only_in_its_lock_space(ctx: &Ctx<'_>) {
    let name = ctx.name("space");
    let holder = ctx.client().await;
    let other = ctx.client().await;
    let elsewhere = MemoryBackend::new();
    let lease = raw_try(&holder, &name, Duration::from_secs(30))
        .await
        .expect("acquire");
    assert!(
        holder.lock_space().is_some(),
        "the backend declares no lock space"
    );
    assert_eq!(
        lease.space(),
        holder.lock_space(),
        "the lease is not stamped with its client's lock space"
    );
    let theirs = elsewhere
        .try_acquire(
            &AcquireRequest::new(
                name.clone(),
                OwnerToken::random(),
                Duration::from_secs(30),
                Duration::ZERO,
            )
            .expect("valid request"),
        )
        .await
        .expect("try_acquire")
        .expect("free in its own table");
    let foreign = |what: &str, e: Option<LockError>| match e {
        Some(LockError::ForeignLease { name: n }) => assert_eq!(n, name.as_str(), "{what}"),
        e => panic!("{what}: {e:?}, not ForeignLease"),
    };
    foreign(
        "release of another space's lease",
        holder.release(&theirs).await.err(),
    );
    foreign(
        "renew of another space's lease",
        holder.renew(&theirs).await.err(),
    );
    let mut batch = holder.renew_many(&[theirs.clone(), lease.clone()]).await;
    assert!(
        batch.pop().expect("two answers").is_ok(),
        "our own lease in the batch"
    );
    foreign(
        "renew_many of another space's lease",
        batch.pop().and_then(Result::err),
    );
    foreign(
        "release in another space",
        elsewhere.release(&lease).await.err(),
    );
    foreign(
        "renew in another space",
        elsewhere.renew(&lease).await.err(),
    );
    let info = holder
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("still held");
    if let Some(f) = info.fence {
        assert_eq!(f, lease.fence(), "the holder's lock moved");
    }
    // Another client of this backend is in the same space: the check lets
    // the lease through and the server judges it (a backend that ties a
    // holding to its client's session, etcd's or ZooKeeper's, may answer
    // `Lost` where another client would succeed).
    let not_refused = |what: &str, e: Option<&LockError>| {
        assert!(
            !matches!(e, Some(LockError::ForeignLease { .. })),
            "{what} through another client of the same space: {e:?}"
        );
    };
    not_refused("renew", other.renew(&lease).await.as_ref().err());
    let released = other.release(&lease).await;
    not_refused("release", released.as_ref().err());
    if released.is_err() {
        holder
            .release(&lease)
            .await
            .expect("release through its own client");
    }
    elsewhere
        .release(&theirs)
        .await
        .expect("release in its own table");
}
