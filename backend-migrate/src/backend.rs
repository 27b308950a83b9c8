//! The migration lock over two backends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    AcquireRequest, ClockPolicy, ExpiryClock, Guarantees, HolderInfo, Lease, LockBackend,
    LockError, LockName, LockSpace, WaitMechanism,
};
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

use crate::config::Phase;
use crate::key;

/// The backend name in errors and guarantee tables.
const BACKEND: &str = "migrate";

/// A lock taken on a legacy and a target backend according to a [`Phase`]
/// (see the crate docs for how a fleet moves through the phases).
///
/// In [`Phase::Both`] the lease's fencing token is the target's; its TTL
/// and local deadline are the shorter of the two sides', so the holder
/// stops before either lock may expire.
///
/// # Answering in time
/// In [`Phase::Both`] a call is a few steps on two services one after the
/// other (the legacy lock, the target lock, giving back a side taken), so
/// it answers within a few of the sides' `op_timeout`s, not one: a side that
/// stops answering costs one `op_timeout` per step. An acquire also makes
/// one attempt past its wait when the legacy lease ran out while the target
/// was being taken (a fresh client's first connection), so that a slow
/// set-up does not turn a free lock into a refusal.
#[derive(Debug)]
pub struct MigrateBackend {
    legacy: Arc<dyn LockBackend>,
    target: Arc<dyn LockBackend>,
    phase: Phase,
    guarantees: Guarantees,
    /// Whether the target has answered once (its connection is set up).
    target_warm: AtomicBool,
    /// The lock space of the composite leases of `both`, made of the two
    /// sides' (`None` when a side stamps nothing: the sides then judge
    /// their own halves); in the other phases a side stamps and checks its
    /// own.
    space: Option<LockSpace>,
}

/// Who holds a name on each side of a migration lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sides {
    /// The legacy lock's holder (any client of the legacy fleet).
    pub legacy: Option<HolderInfo>,
    /// The target lock's holder.
    pub target: Option<HolderInfo>,
}

/// What a migration lock promises in `phase`, from the two sides' promises.
///
/// In [`Phase::Legacy`] and [`Phase::Target`] only one lock is taken, so
/// its promises are the lock's (under the name `migrate`). In
/// [`Phase::Both`] a holding lasts only while both locks do, so each field
/// is the weaker of the two: either side's clock, restart or failover can
/// end it, either side's coarser TTL rounding applies, and force release
/// needs both. Two exceptions:
/// - fencing is the target's alone, because the tokens are the target's;
/// - waiters are never served in FIFO order, even over two fair
///   backends: a `both` waiter queues on the legacy lock while `target`
///   services queue on the target lock only, so no one queue orders them.
pub fn guarantees(legacy: &Guarantees, target: &Guarantees, phase: Phase) -> Guarantees {
    let one = |g: &Guarantees| {
        let mut g = g.clone();
        g.backend = BACKEND;
        g
    };
    match phase {
        Phase::Legacy => one(legacy),
        Phase::Target => one(target),
        Phase::Both => {
            let mut g = Guarantees::new(BACKEND);
            g.fencing = target.fencing;
            g.fair_fifo = false;
            g.expiry_clock = weaker_clock(legacy.expiry_clock, target.expiry_clock);
            g.survives_restart = legacy.survives_restart && target.survives_restart;
            g.survives_failover = legacy.survives_failover && target.survives_failover;
            g.wait = if legacy.wait == target.wait {
                legacy.wait
            } else if legacy.wait == WaitMechanism::Poll || target.wait == WaitMechanism::Poll {
                WaitMechanism::Poll
            } else {
                // A `both` waiter waits on the legacy lock first.
                legacy.wait
            };
            g.min_ttl = legacy.min_ttl.max(target.min_ttl);
            g.ttl_granularity = legacy.ttl_granularity.max(target.ttl_granularity);
            g.force_release = legacy.force_release && target.force_release;
            // `inspect` answers with the target's holder when there is one.
            g.holder_meta = target.holder_meta;
            g.list = legacy.list && target.list;
            g.counts_waiters = legacy.counts_waiters && target.counts_waiters;
            g
        }
    }
}

/// The clock that more easily ends a lease early: any wall clock before a
/// monotonic one, and the clients' hosts' clocks (many clocks) before one
/// server's.
fn weaker_clock(a: ExpiryClock, b: ExpiryClock) -> ExpiryClock {
    let rank = |c: ExpiryClock| match c {
        ExpiryClock::ClientHost => 0,
        ExpiryClock::Server => 1,
        ExpiryClock::Consensus => 2,
        _ => 3,
    };
    if rank(a) <= rank(b) {
        a
    } else {
        b
    }
}

impl MigrateBackend {
    /// A migration lock over `legacy` and `target` in `phase`.
    pub fn new(legacy: Arc<dyn LockBackend>, target: Arc<dyn LockBackend>, phase: Phase) -> Self {
        let guarantees = guarantees(&legacy.guarantees(), &target.guarantees(), phase);
        let space = legacy
            .lock_space()
            .zip(target.lock_space())
            .map(|(l, t)| LockSpace::both(l, t));
        MigrateBackend {
            legacy,
            target,
            phase,
            guarantees,
            target_warm: AtomicBool::new(false),
            space,
        }
    }

    /// The phase this client runs in.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The legacy backend.
    pub fn legacy(&self) -> &Arc<dyn LockBackend> {
        &self.legacy
    }

    /// The target backend.
    pub fn target(&self) -> &Arc<dyn LockBackend> {
        &self.target
    }

    /// Who holds `name` on each side, whatever this client's phase: the
    /// operator's view during a migration (`polylock status`). A legacy
    /// holder with no target holder is a legacy-only client (or a `both`
    /// client between its two steps).
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    pub async fn inspect_sides(&self, name: &LockName) -> Result<Sides, LockError> {
        let (legacy, target) =
            futures::future::join(self.legacy.inspect(name), self.target.inspect(name)).await;
        Ok(Sides {
            legacy: legacy?,
            target: target?,
        })
    }

    /// The side a single-lock phase uses.
    /// Stamps a composite lease of `both` with its lock space.
    fn stamp(
        &self,
        acquired: Result<Option<Lease>, LockError>,
    ) -> Result<Option<Lease>, LockError> {
        match self.space {
            Some(space) => space.stamp(acquired),
            None => acquired,
        }
    }

    /// Refuses a lease of another lock space than `both`'s, before any I/O.
    fn check(&self, lease: &Lease) -> Result<(), LockError> {
        self.space.map_or(Ok(()), |space| space.check(lease))
    }

    fn only(&self) -> Option<&Arc<dyn LockBackend>> {
        match self.phase {
            Phase::Legacy => Some(&self.legacy),
            Phase::Target => Some(&self.target),
            Phase::Both => None,
        }
    }

    /// Takes both locks, legacy first; `wait` false: one attempt each.
    async fn take_both(
        &self,
        req: &AcquireRequest,
        wait: bool,
    ) -> Result<Option<Lease>, LockError> {
        let deadline = req.wait_deadline();
        if !self.target_warm.swap(true, Ordering::Relaxed) {
            // A fresh client's first request sets up its connection (a pool,
            // a session), which can take long; done while holding the legacy
            // lock it would stretch the time the legacy lock is held alone
            // and the gap between the two sides' expiries. A failure here
            // shows again in the acquire itself.
            let _ = self.target.inspect(&req.name).await;
        }
        let mut retry = Duration::from_millis(5);
        // One more attempt than the wait allows when the legacy lease ran
        // out while the target was taken (a first connection is slow).
        let mut legacy_ran_out = false;
        loop {
            let mut side = req.clone();
            // Both sides are asked for what the coarser one grants, so the
            // holding lasts the TTL the guarantees declare.
            side.ttl = self.guarantees.effective_ttl(req.ttl);
            side.wait = deadline.saturating_duration_since(Instant::now());
            let legacy = if wait && !side.wait.is_zero() {
                self.legacy.acquire(&side).await?
            } else {
                self.legacy.try_acquire(&side).await?
            };
            let Some(legacy) = legacy else {
                return Ok(None);
            };
            // Released if this future is dropped before it returns both.
            let mut legacy = Taken::new(&self.legacy, legacy);
            // The legacy lease is not renewed while we wait for the target:
            // wait at most half of what is left of it.
            let now = Instant::now();
            side.wait = deadline
                .saturating_duration_since(now)
                .min(legacy.lease().deadline().saturating_duration_since(now) / 2);
            let target = if wait && !side.wait.is_zero() {
                self.target.acquire(&side).await
            } else {
                self.target.try_acquire(&side).await
            };
            match target {
                Ok(Some(target)) => {
                    let target = Taken::new(&self.target, target);
                    match self.refresh_legacy(&mut legacy).await {
                        Ok(()) => return Ok(Some(combine(legacy.keep(), target.keep()))),
                        Err(e) => {
                            target.release().await;
                            if !e.is_lost() {
                                return Err(e);
                            }
                            if !legacy_ran_out {
                                legacy_ran_out = true;
                                continue;
                            }
                        }
                    }
                }
                Ok(None) => legacy.release().await,
                Err(e) => {
                    legacy.release().await;
                    return Err(e);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if !wait || left.is_zero() {
                return Ok(None);
            }
            // Let the legacy fleet in between attempts; an owner-dependent
            // offset keeps waiters from retrying in lockstep.
            let offset = Duration::from_millis((req.owner.as_u128() % 20) as u64);
            sleep((retry + offset).min(left)).await;
            retry = (retry * 2).min(Duration::from_millis(200));
        }
    }

    /// The legacy lease, renewed if taking the target used up half of it
    /// (a slow first connection, a long wait): the composite deadline is
    /// measured from the legacy request, so it would otherwise be over
    /// before the holder starts. A renew never resurrects, so success means
    /// the legacy lock was ours throughout. On failure the legacy lock is
    /// released.
    async fn refresh_legacy(&self, legacy: &mut Taken) -> Result<(), LockError> {
        let left = legacy
            .lease()
            .deadline()
            .saturating_duration_since(Instant::now());
        if left > legacy.lease().ttl() / 2 {
            return Ok(());
        }
        match self.legacy.renew(legacy.lease()).await {
            Ok(renewed) => {
                legacy.replace(renewed);
                Ok(())
            }
            Err(e) => {
                legacy.release_now().await;
                Err(e)
            }
        }
    }

    /// The two sides' leases of a composite `lease`, as their backends
    /// granted them (fence, key) with the composite's TTL and send time.
    fn split(&self, lease: &Lease) -> Result<(Lease, Lease), LockError> {
        let parts = key::decode(lease)?;
        let side = |fence, key: Option<&str>| {
            let l = Lease::new(
                lease.name().clone(),
                lease.owner(),
                fence,
                lease.ttl(),
                lease.sent_at(),
                lease.policy(),
            )
            .with_renewal_ttl(lease.renewal_ttl());
            match key {
                Some(k) => l.with_backend_key(k),
                None => l,
            }
        };
        Ok((
            side(parts.legacy_fence, parts.legacy_key),
            side(lease.fence(), parts.target_key),
        ))
    }
}

/// One side's lease while `take_both` holds it and has not returned it:
/// released from a task if the acquire's future is dropped first (a
/// cancelled wait for the target), so the lock does not stay held by
/// nobody until its TTL.
struct Taken {
    side: Arc<dyn LockBackend>,
    lease: Option<Lease>,
}

impl Taken {
    fn new(side: &Arc<dyn LockBackend>, lease: Lease) -> Self {
        Taken {
            side: Arc::clone(side),
            lease: Some(lease),
        }
    }

    fn lease(&self) -> &Lease {
        self.lease.as_ref().expect("held until kept or released")
    }

    fn replace(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    /// Hands the lease to the caller.
    fn keep(mut self) -> Lease {
        self.lease.take().expect("held until kept or released")
    }

    /// Releases the lock now; dropped meanwhile, the drop releases it.
    async fn release_now(&mut self) {
        if let Some(lease) = &self.lease {
            release_quietly(&self.side, lease).await;
        }
        self.lease = None;
    }

    async fn release(mut self) {
        self.release_now().await;
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let (Some(lease), Ok(rt)) = (self.lease.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let side = Arc::clone(&self.side);
        rt.spawn(async move { release_quietly(&side, &lease).await });
    }
}

/// Releases one side after a failed or cancelled step; the lock then frees
/// at once instead of at its TTL. An error only delays that, so it is
/// logged.
async fn release_quietly(side: &Arc<dyn LockBackend>, lease: &Lease) {
    if let Err(e) = side.release(lease).await {
        tracing::debug!(
            backend = side.guarantees().backend,
            name = %lease.name(),
            error = %e,
            "migrate: releasing one side after a failed step"
        );
    }
}

/// The composite lease: the target's fence, the shorter TTL measured from
/// the earlier send, its deadline no later than either side's (a ZooKeeper
/// side's deadlines lose its follower lag), and a revocation that fires
/// when either side's does.
fn combine(legacy: Lease, target: Lease) -> Lease {
    let ttl = legacy.ttl().min(target.ttl());
    let sent_at = legacy.sent_at().min(target.sent_at());
    // The laxer of the sides' policies: the one the holder asked for (a
    // ZooKeeper side adds its lag to it). The split sides renew under it,
    // a ZooKeeper side capping by the policy it granted under, and each
    // composite deadline is capped by the sides' own.
    let (l, t) = (legacy.policy(), target.policy());
    let policy = ClockPolicy {
        drift: l.drift.min(t.drift),
        margin: l.margin.min(t.margin),
    };
    let lease = Lease::new(
        target.name().clone(),
        target.owner(),
        target.fence(),
        ttl,
        sent_at,
        policy,
    )
    .with_deadline_no_later_than(legacy.deadline().min(target.deadline()))
    // A side granted for less than asked (a fair-mode Redis hand-off's
    // claim window) still renews to the TTL asked.
    .with_renewal_ttl(legacy.renewal_ttl().min(target.renewal_ttl()))
    .with_backend_key(key::encode(&legacy, &target));
    let signals: Vec<CancellationToken> = [legacy.revocation(), target.revocation()]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    if signals.is_empty() {
        return lease;
    }
    let revoked = CancellationToken::new();
    let fire = revoked.clone();
    // Ends when either side is revoked or the composite lease is released
    // (release cancels `revoked`), so it never outlives the holding.
    tokio::spawn(async move {
        let either = futures::future::select_all(
            signals
                .iter()
                .map(|s| Box::pin(s.cancelled()))
                .collect::<Vec<_>>(),
        );
        tokio::select! {
            _ = either => fire.cancel(),
            _ = fire.cancelled() => {}
        }
    });
    lease.with_revocation(revoked)
}

#[async_trait]
impl LockBackend for MigrateBackend {
    /// In `both`: one attempt on the legacy lock, then one on the target
    /// lock; the legacy lock is released again when the target is busy or
    /// fails.
    ///
    /// # Cancel safety
    /// Not cancel safe, as any attempt is not: dropped during a side's
    /// attempt, that side's lock may stay taken by nobody until its TTL
    /// runs out. A lock already taken (the legacy one while the target is
    /// tried, both while the legacy one is refreshed) is released from a
    /// task when the future is dropped.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        match self.only() {
            Some(side) => side.try_acquire(req).await,
            None => self.stamp(self.take_both(req, false).await),
        }
    }

    /// In `both`: waits for the legacy lock with each side's own wake-up,
    /// then for the target lock for at most half of the legacy lease's
    /// remaining time (it is not renewed meanwhile); if the target stays
    /// busy, the legacy lock is released and both are tried again until
    /// `req.wait` runs out.
    ///
    /// # Cancel safety
    /// Not cancel safe. Dropped while it waits between attempts, nothing
    /// is left behind; dropped during an attempt on the legacy lock (each
    /// wait's first attempt runs inline, as in the legacy backend's own
    /// `acquire`), that lock may stay taken by nobody until its TTL runs
    /// out. A lock already taken (the legacy one while it waits for the
    /// target, both while the legacy one is refreshed) is released from a
    /// task when the future is dropped.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Lease>, LockError> {
        match self.only() {
            Some(side) => side.acquire(req).await,
            None => self.stamp(self.take_both(req, true).await),
        }
    }

    /// In `both`: renews both sides. If either side says the lease is lost,
    /// the result is `Err(Lost)`: loss of either lock is loss of the lock.
    /// The other side stays held (no longer renewed) until the holder
    /// releases the lease or it expires: the holder hears of the loss only
    /// now and may still be working, and that side is what keeps its own
    /// fleet out meanwhile.
    ///
    /// # Cancel safety
    /// Cancel safe: each side's renew is; the old lease's deadline, before
    /// both sides', stays valid either way.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        if let Some(side) = self.only() {
            return side.renew(lease).await;
        }
        self.check(lease)?;
        let (legacy, target) = self.split(lease)?;
        let (l, t) =
            futures::future::join(self.legacy.renew(&legacy), self.target.renew(&target)).await;
        let lost = |side: &str, e: &LockError| {
            tracing::warn!(name = %lease.name(), side, error = %e, "migrate: one side of the lock was lost");
        };
        match (l, t) {
            (Ok(l), Ok(t)) => Ok(lease
                .renewed(l.ttl().min(t.ttl()), lease_sent(&l, &t))
                .with_deadline_no_later_than(l.deadline().min(t.deadline()))),
            (l, t) => {
                let legacy_lost = matches!(&l, Err(e) if e.is_lost());
                let target_lost = matches!(&t, Err(e) if e.is_lost());
                if legacy_lost || target_lost {
                    if let Err(e) = &l {
                        lost("legacy", e);
                    }
                    if let Err(e) = &t {
                        lost("target", e);
                    }
                    if let Some(r) = lease.revocation() {
                        r.cancel();
                    }
                    return Err(LockError::Lost {
                        name: lease.name().to_string(),
                    });
                }
                // Retryable or not, the watchdog decides; the first error
                // says which side failed.
                Err(l.err().or(t.err()).expect("one side failed"))
            }
        }
    }

    /// In `both`: releases both locks at once (one round trip's time, which
    /// a caller with a short budget for its release, `polylock run` at
    /// exit, needs), the legacy one even when the target's release fails:
    /// the holder has stopped, so the legacy fleet may go on.
    /// `Err(Lost)` when either side reports it; otherwise the first error.
    ///
    /// # Cancel safety
    /// Cancel safe: each side's release is; a lock not released expires at
    /// its TTL.
    async fn release(&self, lease: &Lease) -> Result<(), LockError> {
        if let Some(side) = self.only() {
            return side.release(lease).await;
        }
        self.check(lease)?;
        let (legacy, target) = self.split(lease)?;
        // Stops the task watching the sides' revocation signals when this
        // release ends, also when it is dropped half-way.
        let _stop = lease.revocation().map(|r| r.clone().drop_guard());
        let (t, l) =
            futures::future::join(self.target.release(&target), self.legacy.release(&legacy)).await;
        match (t, l) {
            (Err(e), _) | (_, Err(e)) if e.is_lost() => Err(LockError::Lost {
                name: lease.name().to_string(),
            }),
            (Err(e), _) | (_, Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// In `both`: the target's holder when there is one (its fence is the
    /// lock's), else the legacy holder (a legacy-only client). See
    /// [`MigrateBackend::inspect_sides`] for both.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>, LockError> {
        if let Some(side) = self.only() {
            return side.inspect(name).await;
        }
        let sides = self.inspect_sides(name).await?;
        Ok(sides.target.or(sides.legacy))
    }

    /// In `both`: removes the lock on both sides (target first); whether
    /// either side had one.
    ///
    /// # Cancel safety
    /// Cancel safe: each side's removal either happened or did not.
    async fn force_release(&self, name: &LockName) -> Result<bool, LockError> {
        if let Some(side) = self.only() {
            return side.force_release(name).await;
        }
        if !self.guarantees.force_release {
            return Err(LockError::Unsupported {
                op: "force_release",
                backend: BACKEND,
            });
        }
        let t = self.target.force_release(name).await?;
        let l = self.legacy.force_release(name).await?;
        Ok(t || l)
    }

    /// In `both`: the locks held on either side, each with the target's
    /// holder where there is one (as `inspect`), so a legacy-only holder is
    /// listed too.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(LockName, HolderInfo)>, LockError> {
        if let Some(side) = self.only() {
            return side.list(prefix, limit).await;
        }
        let limit = lock_core::validate_list(prefix, limit)?;
        let (legacy, target) = futures::future::join(
            self.legacy.list(prefix, limit),
            self.target.list(prefix, limit),
        )
        .await;
        let mut merged: std::collections::BTreeMap<LockName, HolderInfo> =
            legacy?.into_iter().collect();
        merged.extend(target?);
        Ok(merged.into_iter().take(limit).collect())
    }

    /// In `both`: the waiters of both sides. A `both` waiter queues on the
    /// legacy lock, then on the target lock, so it is counted once.
    ///
    /// # Cancel safety
    /// Cancel safe: read only.
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>, LockError> {
        if let Some(side) = self.only() {
            return side.waiters(name).await;
        }
        let (legacy, target) =
            futures::future::join(self.legacy.waiters(name), self.target.waiters(name)).await;
        Ok(match (legacy?, target?) {
            (Some(l), Some(t)) => Some(l + t),
            _ => None,
        })
    }

    fn wake_mode(&self) -> String {
        match self.only() {
            Some(side) => side.wake_mode(),
            None => format!(
                "legacy: {}; target: {}",
                self.legacy.wake_mode(),
                self.target.wake_mode()
            ),
        }
    }

    /// In `both`, the space made of the two sides'; otherwise the side's.
    fn lock_space(&self) -> Option<LockSpace> {
        match self.only() {
            Some(side) => side.lock_space(),
            None => self.space,
        }
    }

    fn guarantees(&self) -> Guarantees {
        self.guarantees.clone()
    }
}

/// The earlier of the two renewals' send times.
fn lease_sent(l: &Lease, t: &Lease) -> Instant {
    l.sent_at().min(t.sent_at())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::{FencingGuarantee, MemoryBackend};

    #[test]
    fn both_is_the_weaker_side_per_field_with_the_targets_fencing() {
        let mut legacy = Guarantees::new("redis");
        legacy.fencing = FencingGuarantee::UnlessDataLoss("restart without persistence");
        legacy.expiry_clock = ExpiryClock::Server;
        legacy.survives_restart = true;
        legacy.wait = WaitMechanism::PubSub;
        legacy.force_release = true;
        let mut target = Guarantees::new("etcd");
        target.fencing = FencingGuarantee::Strict;
        target.fair_fifo = true;
        target.expiry_clock = ExpiryClock::Consensus;
        target.survives_restart = true;
        target.survives_failover = true;
        target.wait = WaitMechanism::Watch;
        target.min_ttl = Duration::from_secs(2);
        target.ttl_granularity = Duration::from_secs(1);
        target.force_release = true;
        let g = guarantees(&legacy, &target, Phase::Both);
        assert_eq!(g.backend, "migrate");
        assert_eq!(g.fencing, FencingGuarantee::Strict);
        assert!(!g.fair_fifo);
        assert_eq!(g.expiry_clock, ExpiryClock::Server);
        assert!(g.survives_restart && !g.survives_failover);
        assert_eq!(g.wait, WaitMechanism::PubSub);
        assert_eq!(g.min_ttl, Duration::from_secs(2));
        assert_eq!(g.ttl_granularity, Duration::from_secs(1));
        assert!(g.force_release);
        let t = guarantees(&legacy, &target, Phase::Target);
        assert!(t.fair_fifo && t.survives_failover && t.backend == "migrate");
        assert_eq!(
            guarantees(&legacy, &target, Phase::Legacy).wait,
            WaitMechanism::PubSub
        );
    }

    #[test]
    fn weaker_clock_prefers_wall_clocks() {
        use ExpiryClock::*;
        assert_eq!(weaker_clock(Consensus, ClientHost), ClientHost);
        assert_eq!(weaker_clock(Server, Consensus), Server);
        assert_eq!(weaker_clock(Local, Consensus), Consensus);
    }

    fn req(name: &str) -> AcquireRequest {
        AcquireRequest::new(
            LockName::new(name).unwrap(),
            lock_core::OwnerToken::random(),
            Duration::from_secs(5),
            Duration::ZERO,
        )
        .unwrap()
    }

    /// A side granted for less than it asked (a fair-mode Redis hand-off
    /// grants a claim window) renews to the TTL asked: the composite and
    /// the sides split from it for a renewal keep asking for it.
    #[test]
    fn a_side_granted_short_still_renews_to_the_ttl_asked() {
        let asked = Duration::from_secs(30);
        let now = tokio::time::Instant::now();
        let r = req("n");
        let legacy = r.lease(lock_core::FencingToken::new(4).unwrap(), asked, now);
        let target = r
            .lease(
                lock_core::FencingToken::new(9).unwrap(),
                Duration::from_secs(2),
                now,
            )
            .with_renewal_ttl(asked);
        let composite = combine(legacy, target);
        assert_eq!(composite.ttl(), Duration::from_secs(2));
        assert_eq!(composite.renewal_ttl(), asked);
        let m = MigrateBackend::new(
            Arc::new(MemoryBackend::new()),
            Arc::new(MemoryBackend::new()),
            Phase::Both,
        );
        let (l, t) = m.split(&composite).unwrap();
        assert_eq!((l.renewal_ttl(), t.renewal_ttl()), (asked, asked));
        assert_eq!(l.fence().get(), 4);
    }

    /// A side whose deadlines lose more (a ZooKeeper side's follower lag,
    /// on either side) keeps the composite deadline before its own; a side
    /// granted a short claim window (a fair-mode Redis hand-off) with such
    /// a side does not make the composite dead on arrival.
    #[test]
    fn the_composite_deadline_is_the_earlier_of_the_sides() {
        let now = tokio::time::Instant::now();
        let careful = ClockPolicy {
            drift: 0.21,
            margin: Duration::from_secs(12),
        };
        let lease = |fence, ttl, policy| {
            Lease::new(
                LockName::new("n").unwrap(),
                lock_core::OwnerToken::random(),
                lock_core::FencingToken::new(fence).unwrap(),
                ttl,
                now,
                policy,
            )
        };
        let long = Duration::from_secs(30);
        let window = Duration::from_secs(2);
        for (lt, lp, tt, tp) in [
            (long, careful, long, ClockPolicy::default()),
            (long, ClockPolicy::default(), long, careful),
            (long, careful, window, ClockPolicy::default()),
            (window, ClockPolicy::default(), long, careful),
        ] {
            let (legacy, target) = (lease(4, lt, lp), lease(9, tt, tp));
            let earliest = legacy.deadline().min(target.deadline());
            let composite = combine(legacy, target);
            assert_eq!(
                composite.deadline(),
                earliest,
                "{lt:?} {lp:?} / {tt:?} {tp:?}"
            );
            assert!(composite.deadline() > now, "dead on arrival");
        }
    }

    #[tokio::test]
    async fn a_busy_target_releases_the_legacy_lock() {
        let legacy = MemoryBackend::new();
        let target = MemoryBackend::new();
        let m = MigrateBackend::new(
            Arc::new(legacy.clone()),
            Arc::new(target.clone()),
            Phase::Both,
        );
        let held = target.try_acquire(&req("n")).await.unwrap().unwrap();
        assert!(m.try_acquire(&req("n")).await.unwrap().is_none());
        let name = LockName::new("n").unwrap();
        assert!(legacy.inspect(&name).await.unwrap().is_none());
        target.release(&held).await.unwrap();
        let l = m.try_acquire(&req("n")).await.unwrap().unwrap();
        assert_eq!(
            target.inspect(&name).await.unwrap().unwrap().fence,
            Some(l.fence()),
            "the fence is the target's"
        );
        m.release(&l).await.unwrap();
        let sides = m.inspect_sides(&name).await.unwrap();
        assert_eq!((sides.legacy, sides.target), (None, None));
    }
}
