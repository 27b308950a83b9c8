//! Cases that check the declared [`Guarantees`](lock_core::Guarantees)
//! fields no other case exercises: every field either selects a case or is
//! checked by one here (the clocks and failover are the fault suite's).

use std::time::Duration;

use lock_core::{FencingGuarantee, LockError};
use tokio::time::Instant;

use crate::cases::raw_try;
use crate::fixture::Ctx;

/// The TTL a lease reports is what the backend declares it grants: at least
/// `min_ttl`, rounded up to `ttl_granularity`.
pub(crate) async fn granted_ttl_follows_the_declared_minimum_and_step(ctx: &Ctx<'_>) {
    let g = ctx.guarantees().clone();
    let client = ctx.client().await;
    let mut asked = vec![Duration::from_millis(1500)];
    if g.min_ttl > Duration::from_millis(1) {
        asked.push(g.min_ttl / 2);
    }
    if g.ttl_granularity > Duration::from_millis(1) {
        asked.push(g.min_ttl + g.ttl_granularity / 2);
    }
    for (i, ttl) in asked.into_iter().enumerate() {
        let name = ctx.name(&format!("ttl-{i}"));
        let lease = raw_try(&client, &name, ttl).await.expect("acquire");
        assert_eq!(
            lease.ttl(),
            g.effective_ttl(ttl),
            "asked for {ttl:?}: the lease says {:?}, the declared minimum {:?} and step {:?} say {:?}",
            lease.ttl(),
            g.min_ttl,
            g.ttl_granularity,
            g.effective_ttl(ttl)
        );
        client.release(&lease).await.expect("release");
    }
}

/// `force_release` works when declared (it removes a live holder's lock,
/// reports whether there was one, and the holder's renew then fails), and
/// is `Unsupported` when not.
pub(crate) async fn force_release_does_what_is_declared(ctx: &Ctx<'_>) {
    let name = ctx.name("force");
    let holder = ctx.client().await;
    let operator = ctx.client().await;
    let lease = raw_try(&holder, &name, Duration::from_secs(30))
        .await
        .expect("acquire");
    let r = operator.force_release(&name).await;
    if !ctx.guarantees().force_release {
        assert!(
            matches!(r, Err(LockError::Unsupported { .. })),
            "force_release is not declared, yet it answered {r:?}"
        );
        holder.release(&lease).await.expect("release");
        return;
    }
    assert!(matches!(r, Ok(true)), "force_release of a held lock: {r:?}");
    assert!(
        operator.inspect(&name).await.expect("inspect").is_none(),
        "still held after force_release"
    );
    let again = operator.force_release(&name).await;
    assert!(
        matches!(again, Ok(false)),
        "force_release of a free lock: {again:?}"
    );
    let r = holder.renew(&lease).await;
    assert!(
        r.as_ref().is_err_and(|e| e.is_lost()),
        "renew after force_release: {r:?}"
    );
    let next = raw_try(&operator, &name, Duration::from_secs(30))
        .await
        .expect("free after force_release");
    assert!(
        next.fence() > lease.fence(),
        "force_release reset the fence"
    );
    operator.release(&next).await.expect("release");
}

/// A backend that declares `survives_restart` keeps a held lock through a
/// restart of its server (the test kit's restart: same port, same data):
/// a fresh client sees the same holder and cannot take it, the holder's own
/// client recovers and renews and releases. Where fencing is declared
/// `Strict`, the next token after the restart is still higher.
pub(crate) async fn held_lock_survives_a_server_restart(ctx: &Ctx<'_>) {
    let name = ctx.name("restart");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let holder = ctx.client().await;
    let lease = raw_try(&holder, &name, ttl).await.expect("acquire");
    let restarted = ctx
        .fixture()
        .restart_server()
        .await
        .unwrap_or_else(|e| panic!("restart: {e}"));
    assert!(
        restarted,
        "{} declares survives_restart, but its fixture cannot restart the server: \
         the claim would go unchecked",
        ctx.guarantees().backend
    );
    let fresh = ctx.client().await;
    assert!(
        raw_try(&fresh, &name, ttl).await.is_none(),
        "the lock was free after the restart"
    );
    let info = fresh
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held after the restart");
    if let Some(f) = info.fence {
        assert_eq!(f, lease.fence(), "another holder after the restart");
    }
    // The holder's connections were cut: it may need a few tries.
    let give_up = Instant::now() + Duration::from_secs(20);
    let renewed = loop {
        match holder.renew(&lease).await {
            Ok(renewed) => break renewed,
            Err(e) if e.is_retryable() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the holder could not renew after the restart: {e}"),
        }
    };
    holder.release(&renewed).await.expect("release");
    let next = raw_try(&fresh, &name, ttl)
        .await
        .expect("free after release");
    if ctx.guarantees().fencing == FencingGuarantee::Strict {
        assert!(
            next.fence() > lease.fence(),
            "fencing is declared Strict, but after a restart the token went from {:?} to {:?}",
            lease.fence(),
            next.fence()
        );
    }
    fresh.release(&next).await.expect("release");
}
