use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use crate::cases::{raw_try, time_until_free};
use crate::fixture::Ctx;

/// Renewing before expiry keeps the lock past the original TTL.
pub(crate) async fn renew_extends_past_the_original_ttl(ctx: &Ctx<'_>) {
    // A probe that a loaded machine delays past the renewed deadline proves
    // nothing either way; such a round is run again, and the case fails if
    // no round could be judged.
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        if renewal_outlives_the_original_ttl(ctx, round).await {
            return;
        }
    }
    panic!("in {ROUNDS} rounds no probe was answered within the renewed lease: nothing was judged");
}

/// One round of [`renew_extends_past_the_original_ttl`]: whether its probe
/// was answered in time to judge it.
async fn renewal_outlives_the_original_ttl(ctx: &Ctx<'_>, round: usize) -> bool {
    let name = ctx.name(&format!("renew-{round}"));
    let ttl = ctx.ttl(Duration::from_millis(800));
    let holder = ctx.client().await;
    let other = ctx.client().await;
    let lease = raw_try(&holder, &name, ttl).await.expect("acquire");
    let original_end = lease.sent_at() + ttl;
    // Halfway through the TTL, or three quarters through the time the
    // lease is trusted when that comes first (a backend that trusts a lease
    // for much less than its TTL: a ZooKeeper ensemble's follower lag).
    let trusted = lease.deadline() - lease.sent_at();
    let renew_after = (ttl / 2).min(trusted * 3 / 4);
    sleep_until(lease.sent_at() + renew_after).await;
    let renewed = holder.renew(&lease).await.expect("renew before expiry");
    assert!(
        renewed.deadline() > lease.deadline(),
        "renew did not move the deadline"
    );
    assert_eq!(
        renewed.fence(),
        lease.fence(),
        "renew changed the fencing token"
    );
    // Past the original TTL, but well within the renewed one; the probe is
    // judged by when it was sent and the inspect by when it was answered.
    sleep_until(original_end + (ttl / 5).min(renew_after / 2)).await;
    if let Some(taken) = raw_try(&other, &name, ttl).await {
        assert!(
            taken.sent_at() >= renewed.deadline(),
            "the lock expired at its original TTL despite the renew"
        );
        other.release(&taken).await.expect("release");
        return false;
    }
    let info = other.inspect(&name).await.expect("inspect");
    // Answered before the renewed TTL ran out counted from the renewal's
    // send (the server counts it from later), so read on the server before
    // the renewed lease could have expired there. Not the holder's
    // deadline, which may be far more careful than the server (a ZooKeeper
    // ensemble's follower lag).
    let judged = Instant::now() < renewed.sent_at() + renewed.ttl();
    if judged {
        let info = info.expect("held within the renewed TTL");
        if let Some(f) = info.fence {
            assert_eq!(f, lease.fence(), "the holder's fence after a renew");
        }
    }
    let released = holder.release(&renewed).await;
    // Answered after the renewed deadline, the lease may be gone by the
    // release: a loss is then no error.
    assert!(
        released.is_ok() || (!judged && released.as_ref().is_err_and(|e| e.is_lost())),
        "release of the renewed lease: {released:?}"
    );
    judged
}

/// A renew that comes after the lease expired fails with Lost and does not
/// bring the lock back.
pub(crate) async fn renew_after_expiry_is_lost_and_does_not_resurrect(ctx: &Ctx<'_>) {
    let name = ctx.name("late-renew");
    let ttl = ctx.ttl(Duration::from_millis(300));
    let holder = ctx.client().await;
    let other = ctx.client().await;
    let lease = raw_try(&holder, &name, ttl).await.expect("acquire");
    // Wait until the server has certainly expired it.
    let free = time_until_free(&other, &name, ttl * 2 + ctx.slack(ttl) * 4).await;
    let (_, next) = free.expect("the lease never expired");
    other.release(&next).await.expect("release");
    let r = holder.renew(&lease).await;
    assert!(r.as_ref().is_err_and(|e| e.is_lost()), "late renew: {r:?}");
    assert!(
        holder.inspect(&name).await.expect("inspect").is_none(),
        "a late renew resurrected the lock"
    );
    let again = raw_try(&other, &name, ttl)
        .await
        .expect("free after a late renew");
    other.release(&again).await.expect("release");
}

/// A lease that is never released nor renewed stays held until its local
/// deadline and becomes free soon after its TTL (tolerance: half the TTL,
/// at least 500 ms).
pub(crate) async fn abandoned_lease_expires_after_ttl_and_not_before(ctx: &Ctx<'_>) {
    let name = ctx.name("abandoned");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let holder = ctx.client().await;
    let other = ctx.client().await;
    let lease = raw_try(&holder, &name, ttl).await.expect("acquire");
    let granted_at = lease.sent_at();
    // Not before: probe right up to the holder's local deadline, the last
    // instant the holder may still act on the lock.
    let deadline = lease.deadline();
    loop {
        let probe_sent = Instant::now();
        if probe_sent >= deadline {
            break;
        }
        // Judged by when the winning request was sent (the lease's
        // `sent_at`), not when the probe began: a probe that starts before
        // the deadline but is slow to reach the server (a cold connection
        // on a loaded machine, a composite lock's first step) may win
        // after the deadline, rightly.
        if let Some(taken) = raw_try(&other, &name, ttl).await {
            assert!(
                taken.sent_at() >= deadline,
                "another client got the lock with a request sent {:?} after it was granted, \
                 before the holder's local deadline ({:?} after the grant) of a {ttl:?} TTL",
                taken.sent_at() - granted_at,
                deadline - granted_at
            );
            freed_soon_after_the_ttl(ctx, granted_at.elapsed(), ttl);
            other.release(&taken).await.expect("release");
            return;
        }
        sleep_until((probe_sent + ttl / 20).min(deadline)).await;
    }
    let (_, next) = time_until_free(&other, &name, ttl + ctx.slack(ttl) * 2)
        .await
        .expect("still held well after its TTL");
    freed_soon_after_the_ttl(ctx, granted_at.elapsed(), ttl);
    other.release(&next).await.expect("release");
}

fn freed_soon_after_the_ttl(ctx: &Ctx<'_>, freed_after: Duration, ttl: Duration) {
    assert!(
        freed_after <= ttl + ctx.slack(ttl),
        "freed {freed_after:?} after acquire: later than TTL {ttl:?} + tolerance"
    );
}

/// The local deadline is counted from when the request was sent, not when
/// the reply arrived: with every byte delayed (the test kit's proxy, where
/// the fixture has one), the deadline of an acquire and of a renew is no
/// later than `reply time - delay + ttl * (1 - drift) - margin`.
///
/// Where the fixture has no such proxy, the replies come undelayed and the
/// case checks only the drift margin: the in-memory backend (no wire),
/// SQLite (no wire either; backend-sql's
/// `sqlite_deadlines_are_counted_from_before_a_busy_wait` delays it by
/// holding the file's write lock instead) and Redis Cluster (its clients
/// learn node addresses from the cluster and would bypass a proxy; the
/// single-server Redis fixtures run the same code behind one).
pub(crate) async fn deadline_is_counted_from_the_send(ctx: &Ctx<'_>) {
    let name = ctx.name("send-time");
    // Long enough for a renew that opens a fresh connection through the
    // delayed proxy (a SQL pool's connection can still be on its way back
    // from the acquire): a dozen delayed round trips, about 3.6 s.
    let ttl = ctx.ttl(Duration::from_secs(10));
    let delay = Duration::from_millis(150);
    let delayed = ctx
        .fixture()
        .client_with_reply_delay(delay)
        .await
        .unwrap_or_else(|e| panic!("delayed client: {e}"));
    let (client, delay, _link) = match delayed {
        Some((client, link)) => (client, delay, Some(link)),
        None => (ctx.client().await, Duration::ZERO, None),
    };
    // Scheduling noise between the reply and this task seeing it.
    let noise = Duration::from_millis(10);

    let lease = raw_try(&client, &name, ttl).await.expect("acquire");
    let replied = Instant::now();
    let latest = lease.policy().deadline(replied - delay, lease.ttl()) + noise;
    assert!(
        lease.deadline() <= latest,
        "acquire: the deadline is {:?} later than one counted from the send \
         (reply delay {delay:?}): it was taken at receipt",
        lease.deadline() - latest + noise
    );

    let renewed = client.renew(&lease).await.expect("renew");
    let replied = Instant::now();
    let latest = renewed.policy().deadline(replied - delay, renewed.ttl()) + noise;
    assert!(
        renewed.deadline() <= latest,
        "renew: the deadline is {:?} later than one counted from the send \
         (reply delay {delay:?}): it was taken at receipt",
        renewed.deadline() - latest + noise
    );
    client.release(&renewed).await.expect("release");
}

/// `renew_many` answers each lease as `renew` would, in order: the live
/// ones are extended with their own TTL and fence, one taken over by
/// another client is `Lost` (and stays theirs), and the others are not
/// failed by it.
pub(crate) async fn renew_many_answers_each_lease_in_order(ctx: &Ctx<'_>) {
    let ttl = ctx.ttl(Duration::from_millis(1500));
    let holder = ctx.client().await;
    let other = ctx.client().await;
    assert!(holder.renew_many(&[]).await.is_empty(), "nothing to renew");
    let names = [
        ctx.name("batch-a"),
        ctx.name("batch-b"),
        ctx.name("batch-c"),
    ];
    let a = raw_try(&holder, &names[0], ttl).await.expect("acquire a");
    let b = raw_try(&holder, &names[1], ttl).await.expect("acquire b");
    let c = raw_try(&holder, &names[2], ttl * 2)
        .await
        .expect("acquire c");
    holder.release(&b).await.expect("release b");
    let theirs = raw_try(&other, &names[1], ttl).await.expect("b is free");
    let leases = [a.clone(), b, c.clone()];
    let answers = holder.renew_many(&leases).await;
    assert_eq!(answers.len(), 3, "one answer per lease: {answers:?}");
    for (old, answer) in [(&a, &answers[0]), (&c, &answers[2])] {
        let renewed = answer.as_ref().expect("a live lease is renewed");
        assert_eq!(renewed.name(), old.name(), "answers out of order");
        assert_eq!(renewed.fence(), old.fence(), "renew changed the fence");
        assert!(renewed.ttl() >= old.ttl(), "renewed with a shorter TTL");
        assert!(renewed.deadline() > old.deadline(), "deadline not moved");
    }
    assert!(
        answers[1].as_ref().is_err_and(|e| e.is_lost()),
        "a lease another client took over: {:?}",
        answers[1]
    );
    let info = other
        .inspect(&names[1])
        .await
        .expect("inspect")
        .expect("held");
    if let Some(f) = info.fence {
        assert_eq!(f, theirs.fence(), "b is still theirs");
    }
    other.release(&theirs).await.expect("release theirs");
    for answer in [&answers[0], &answers[2]] {
        let renewed = answer.as_ref().expect("renewed");
        holder
            .release(renewed)
            .await
            .expect("release a renewed lease");
    }
}
