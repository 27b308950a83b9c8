use std::time::Duration;

use lock_core::Owner;

use crate::cases::raw_try;
use crate::fixture::Ctx;

/// One owner taking the same lock twice gets a second hold on the same
/// lease; the lock is released on the server only with the last hold.
/// Without the owner, the same locker is refused like anyone else.
pub(crate) async fn reentrant_owner_counts_holds(ctx: &Ctx<'_>) {
    let name = ctx.name("reentrant");
    let locker = ctx.locker().await;
    let other = ctx.client().await;
    let owner = Owner::new();

    let first = locker
        .lock(name.as_str())
        .owner(&owner)
        .acquire()
        .await
        .expect("first hold");
    let second = locker
        .lock(name.as_str())
        .owner(&owner)
        .acquire()
        .await
        .expect("second hold");
    assert_eq!(
        first.fence(),
        second.fence(),
        "a reentrant hold must share the lease"
    );
    assert_eq!(first.holds(), 2);
    assert!(
        locker
            .lock(name.as_str())
            .try_acquire()
            .await
            .expect("try")
            .is_none(),
        "a different (anonymous) owner was let in"
    );
    let stranger = Owner::new();
    assert!(locker
        .lock(name.as_str())
        .owner(&stranger)
        .try_acquire()
        .await
        .expect("try")
        .is_none());

    first.release().await.expect("release one hold");
    assert_eq!(second.holds(), 1);
    assert!(second.is_held());
    assert!(
        raw_try(&other, &name, std::time::Duration::from_secs(5))
            .await
            .is_none(),
        "released with a hold left"
    );

    let third = locker
        .lock(name.as_str())
        .owner(&owner)
        .try_acquire()
        .await
        .expect("try")
        .expect("third hold");
    assert_eq!(third.holds(), 2);
    drop(third);
    second.release().await.expect("release last hold");
    assert!(
        other.inspect(&name).await.expect("inspect").is_none(),
        "still held after the last release"
    );

    // After the last release, the owner takes a fresh lease with a new token.
    let again = locker
        .lock(name.as_str())
        .owner(&owner)
        .acquire()
        .await
        .expect("fresh lease");
    assert_eq!(again.holds(), 1);
    again.release().await.expect("release");
}

/// Re-entry after loss: once an owner's lease is lost, taking the lock
/// again as that owner is a new acquisition (refused while someone else
/// holds it), never one more hold on the dead lease; the old hold's
/// release reports the loss.
pub(crate) async fn reentry_after_loss_takes_a_new_lease(ctx: &Ctx<'_>) {
    let name = ctx.name("reenter-lost");
    let ttl = ctx.ttl(Duration::from_millis(900));
    let locker = ctx.locker().await;
    let other = ctx.client().await;
    let owner = Owner::new();
    let first = locker
        .lock(name.as_str())
        .owner(&owner)
        .ttl(ttl)
        .acquire()
        .await
        .expect("first hold");
    ctx.fixture()
        .remove_behind_back(&name)
        .await
        .expect("remove behind back");
    tokio::time::timeout(ttl + ctx.slack(ttl), first.lost())
        .await
        .expect("lost() after the removal");
    let taken = raw_try(&other, &name, Duration::from_secs(30))
        .await
        .expect("free after the removal");
    let again = locker
        .lock(name.as_str())
        .owner(&owner)
        .ttl(ttl)
        .try_acquire()
        .await
        .expect("try_acquire");
    assert!(
        again.is_none(),
        "re-entry after loss added a hold to the lost lease while another client holds the lock"
    );
    other.release(&taken).await.expect("release");
    let fresh = locker
        .lock(name.as_str())
        .owner(&owner)
        .ttl(ttl)
        .try_acquire()
        .await
        .expect("try_acquire")
        .expect("free again");
    assert_eq!(
        fresh.holds(),
        1,
        "the new lease shares holds with the lost one"
    );
    assert!(fresh.fence() > taken.fence());
    let r = first.release().await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "the lost hold's release must report Lost: {r:?}"
    );
    assert!(fresh.is_held(), "releasing the lost hold ended the new one");
    assert!(
        raw_try(&other, &name, Duration::from_secs(30))
            .await
            .is_none(),
        "releasing the lost hold freed the new lease"
    );
    fresh.release().await.expect("release");
}

/// An owner drops its guard (the release goes to the background) and takes
/// the lock again at once: the old hold's release must not take the lock
/// from under the new guard. Taking over the old grant (the same owner
/// token is on the lock) and then letting the background release delete
/// it would let another client in while that guard holds. (A backend that
/// counts holds per owner, as Redisson's format does, may give the new
/// guard one more hold on the old lease: the release then only takes that
/// one back.)
pub(crate) async fn reacquiring_after_a_dropped_guard_is_a_lease_of_its_own(ctx: &Ctx<'_>) {
    let name = ctx.name("drop-reacquire");
    let locker = ctx.locker().await;
    let other = ctx.client().await;
    let owner = Owner::new();
    let mut guard = locker
        .lock(name.as_str())
        .owner(&owner)
        .acquire()
        .await
        .expect("first hold");
    for round in 0..10 {
        drop(guard);
        guard = locker
            .lock(name.as_str())
            .owner(&owner)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .expect("taken again");
        // Time for the dropped guard's release to have run.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(guard.is_held(), "round {round}");
        assert!(
            raw_try(&other, &name, Duration::from_secs(30))
                .await
                .is_none(),
            "round {round}: another client took the lock the new guard holds"
        );
    }
    guard.release().await.expect("release");
}
