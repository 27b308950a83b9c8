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
