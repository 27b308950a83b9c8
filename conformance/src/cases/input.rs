use std::time::Duration;

use lock_core::{AcquireRequest, LockError, LockName, Locker, OwnerToken};

use crate::counting::Counting;
use crate::fixture::Ctx;

/// Bad names, TTLs and waits get typed errors, and the backend is never
/// called for them.
pub(crate) async fn bad_input_is_refused_before_any_io(ctx: &Ctx<'_>) {
    let counted = Counting::new(ctx.client().await);
    let locker = Locker::from_arc(counted.clone());
    let ok = ctx.name("input");
    let too_long = "n".repeat(LockName::MAX_LEN + 1);

    for bad in ["", "a\0b", too_long.as_str()] {
        let r = locker.lock(bad).acquire().await;
        assert!(
            matches!(r, Err(LockError::InvalidName { .. })),
            "name {bad:?}: {r:?}"
        );
        let r = locker.lock(bad).try_acquire().await;
        assert!(
            matches!(r, Err(LockError::InvalidName { .. })),
            "name {bad:?}: {r:?}"
        );
        let r = locker.inspect(bad).await;
        assert!(
            matches!(r, Err(LockError::InvalidName { .. })),
            "inspect {bad:?}: {r:?}"
        );
        let r = locker.with_lock(bad, |_| async {}).await;
        assert!(
            matches!(r, Err(LockError::InvalidName { .. })),
            "with_lock {bad:?}: {r:?}"
        );
    }
    for ttl in [
        Duration::ZERO,
        Duration::MAX,
        lock_core::MAX_TTL + Duration::from_secs(1),
    ] {
        let r = locker.lock(ok.as_str()).ttl(ttl).acquire().await;
        assert!(
            matches!(r, Err(LockError::InvalidTtl { .. })),
            "ttl {ttl:?}: {r:?}"
        );
        let r = AcquireRequest::new(ok.clone(), OwnerToken::random(), ttl, Duration::ZERO);
        assert!(
            matches!(r, Err(LockError::InvalidTtl { .. })),
            "request ttl {ttl:?}"
        );
        assert!(matches!(
            locker.clone().with_default_ttl(ttl),
            Err(LockError::InvalidTtl { .. })
        ));
    }
    for wait in [Duration::MAX, lock_core::MAX_WAIT + Duration::from_secs(1)] {
        let r = locker.lock(ok.as_str()).wait(wait).acquire().await;
        assert!(
            matches!(r, Err(LockError::InvalidWait { .. })),
            "wait {wait:?}: {r:?}"
        );
        let r = AcquireRequest::new(
            ok.clone(),
            OwnerToken::random(),
            Duration::from_secs(1),
            wait,
        );
        assert!(
            matches!(r, Err(LockError::InvalidWait { .. })),
            "request wait {wait:?}"
        );
    }
    assert_eq!(counted.calls(), 0, "bad input reached the backend");

    // Errors read well: they say what was wrong.
    let e = locker.lock("").acquire().await.expect_err("empty name");
    assert!(e.to_string().contains("empty"), "{e}");
    // And the valid request still works after all that.
    let g = locker
        .lock(ok.as_str())
        .acquire()
        .await
        .expect("valid acquire");
    g.release().await.expect("release");
}
