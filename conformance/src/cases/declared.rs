//! Cases that check the declared [`Guarantees`](lock_core::Guarantees)
//! fields no other case exercises: every field either selects a case or is
//! checked by one here (the clocks and failover are the fault suite's).

use std::time::{Duration, UNIX_EPOCH};

use lock_core::{AcquireRequest, FencingGuarantee, HolderMeta, LockError, LockName, OwnerToken};
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

/// A lock taken with a holder description gives it back to another client
/// (`inspect`, and `list` where declared) when `holder_meta` is declared,
/// and a backend that does not declare it makes none up.
pub(crate) async fn holder_meta_is_kept_where_declared(ctx: &Ctx<'_>) {
    let name = ctx.name("meta");
    let holder = ctx.client().await;
    let operator = ctx.client().await;
    let meta = HolderMeta::new(
        "host-ä.example",
        4242,
        "nightly --full 'a b' %x",
        UNIX_EPOCH + Duration::from_millis(1_780_000_000_123),
    );
    let req = AcquireRequest::new(
        name.clone(),
        OwnerToken::random(),
        ctx.ttl(Duration::from_secs(30)),
        Duration::ZERO,
    )
    .expect("valid request")
    .with_meta(meta.clone());
    let lease = holder
        .try_acquire(&req)
        .await
        .expect("try_acquire")
        .expect("free");
    let seen = operator
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    let want = ctx.guarantees().holder_meta.then(|| meta.clone());
    assert_eq!(seen.meta, want, "inspect's holder metadata");
    if ctx.guarantees().list {
        let listed = operator
            .list(name.as_str(), 10)
            .await
            .expect("list")
            .into_iter()
            .find(|(n, _)| *n == name)
            .expect("the held lock is listed");
        assert_eq!(listed.1.meta, want, "list's holder metadata");
    }
    holder.release(&lease).await.expect("release");
    // A later holder without a description leaves none of the old one.
    let plain = raw_try(&holder, &name, Duration::from_secs(30))
        .await
        .expect("free after release");
    let seen = operator
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(
        seen.meta, None,
        "the previous holder's metadata outlived it"
    );
    holder.release(&plain).await.expect("release");
}

/// `list` returns exactly the held locks under a prefix, in name order,
/// with the holders `inspect` reports, honours the limit, drops released
/// locks, and refuses a bad prefix before any I/O; `Unsupported` where it
/// is not declared.
pub(crate) async fn list_shows_the_held_locks_under_a_prefix(ctx: &Ctx<'_>) {
    let client = ctx.client().await;
    let other = ctx.client().await;
    let prefix = format!("{}/", ctx.name("list").as_str());
    // Byte order; `_` and `%` are SQL LIKE wildcards, `A`/`a` catch a
    // case-insensitive match.
    let names: Vec<LockName> = ["A", "a", "a_b", "axb", "b x", "c/d", "ü"]
        .iter()
        .map(|s| LockName::new(format!("{prefix}{s}")).expect("valid"))
        .collect();
    let outside = ctx.name("lis");
    if !ctx.guarantees().list {
        let r = client.list(&prefix, 10).await;
        assert!(
            matches!(r, Err(LockError::Unsupported { .. })),
            "list is not declared, yet it answered {r:?}"
        );
        return;
    }
    let mut leases = Vec::new();
    for name in names.iter().chain([&outside]) {
        leases.push(
            raw_try(&client, name, Duration::from_secs(30))
                .await
                .expect("acquire"),
        );
    }
    let listed = other.list(&prefix, 100).await.expect("list");
    let got: Vec<&LockName> = listed.iter().map(|(n, _)| n).collect();
    assert_eq!(got, names.iter().collect::<Vec<_>>(), "listed names");
    for (name, holder) in &listed {
        let seen = other.inspect(name).await.expect("inspect").expect("held");
        assert_eq!(
            holder.owner, seen.owner,
            "{name}: list and inspect disagree"
        );
        assert_eq!(
            holder.fence, seen.fence,
            "{name}: list and inspect disagree"
        );
    }
    let two = other.list(&prefix, 2).await.expect("list with a limit");
    assert_eq!(
        two.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        names[..2].iter().collect::<Vec<_>>(),
        "the limit keeps the first names"
    );
    for (sub, want) in [("a_", &["a_b"][..]), ("a%", &[][..]), ("A", &["A"][..])] {
        let got = other
            .list(&format!("{prefix}{sub}"), 100)
            .await
            .expect("list");
        let got: Vec<String> = got
            .iter()
            .map(|(n, _)| n.as_str()[prefix.len()..].to_string())
            .collect();
        assert_eq!(
            got, want,
            "the prefix {sub:?} matches exactly, case and all"
        );
    }
    client.release(&leases[0]).await.expect("release");
    let after = other.list(&prefix, 100).await.expect("list");
    assert_eq!(
        after.len(),
        names.len() - 1,
        "a released lock is still listed"
    );
    assert!(after.iter().all(|(n, _)| *n != names[0]));
    let bad = other.list("a\0b", 10).await;
    assert!(
        matches!(bad, Err(LockError::InvalidName { .. })),
        "a NUL in the prefix: {bad:?}"
    );
    for lease in &leases[1..] {
        client.release(lease).await.expect("release");
    }
}

/// Where `counts_waiters` is declared, two clients waiting on a held lock
/// are counted, and the count falls to zero once both were served; a
/// backend that does not declare it says `None`.
pub(crate) async fn waiters_are_counted_where_declared(ctx: &Ctx<'_>) {
    let name = ctx.name("waiters");
    let holder = ctx.client().await;
    let operator = ctx.client().await;
    if !ctx.guarantees().counts_waiters {
        let r = operator.waiters(&name).await;
        assert!(matches!(r, Ok(None)), "not declared, yet it answered {r:?}");
        return;
    }
    let lease = raw_try(&holder, &name, Duration::from_secs(30))
        .await
        .expect("acquire");
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let client = ctx.client().await;
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let req = AcquireRequest::new(
                name,
                OwnerToken::random(),
                Duration::from_secs(30),
                Duration::from_secs(20),
            )
            .expect("valid request");
            let lease = client
                .acquire(&req)
                .await
                .expect("acquire")
                .expect("served");
            client.release(&lease).await.expect("release");
        }));
    }
    let start = Instant::now();
    loop {
        let n = operator.waiters(&name).await.expect("waiters");
        if n == Some(2) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "two clients wait, the backend counts {n:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release(&lease).await.expect("release");
    for t in tasks {
        t.await.expect("waiter");
    }
    let start = Instant::now();
    loop {
        let n = operator.waiters(&name).await.expect("waiters");
        if n == Some(0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "both waiters were served, the backend still counts {n:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
