//! Leases and their local deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::LockError;
use crate::name::LockName;
use crate::space::LockSpace;
use crate::token::{FencingToken, OwnerToken};

/// How pessimistic the client is about its own clock when computing a lease's
/// local deadline.
///
/// `deadline = sent_at + ttl * (1 - drift) - margin`, where `sent_at` is the
/// monotonic instant the acquire or renew request was sent. Measuring from the
/// send (not the reply) means network and server delay only ever make the
/// deadline earlier than the server's expiry, never later.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockPolicy {
    /// Fraction of the TTL assumed lost to clock-rate differences (0.01 = 1%).
    pub drift: f64,
    /// A fixed safety margin subtracted on top.
    pub margin: Duration,
}

impl Default for ClockPolicy {
    fn default() -> Self {
        ClockPolicy {
            drift: 0.01,
            margin: Duration::from_millis(2),
        }
    }
}

impl ClockPolicy {
    /// Refuses a drift that is not a number from 0 up to (not including) 1,
    /// and a margin above [`MAX_TTL`](crate::MAX_TTL): either would leave no
    /// lease any time the holder can trust.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::ClockPolicy;
    /// assert!(ClockPolicy::default().validate().is_ok());
    /// let nan = ClockPolicy { drift: f64::NAN, margin: Duration::ZERO };
    /// assert!(nan.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), LockError> {
        if !(0.0..1.0).contains(&self.drift) {
            return Err(LockError::Config(format!(
                "clock policy: drift {} is not a fraction from 0 up to 1 (0.01 is 1%)",
                self.drift
            )));
        }
        if self.margin > crate::MAX_TTL {
            return Err(LockError::Config(format!(
                "clock policy: margin {:?} is above the longest TTL, {:?}",
                self.margin,
                crate::MAX_TTL
            )));
        }
        Ok(())
    }

    /// How long after its request was sent a lease of `ttl` can be trusted:
    /// `ttl * (1 - drift) - margin`, zero when the margin eats it all (and
    /// for a drift [`validate`](ClockPolicy::validate) refuses).
    pub fn trusted(&self, ttl: Duration) -> Duration {
        if !(0.0..1.0).contains(&self.drift) {
            return Duration::ZERO;
        }
        // Capped at the longest TTL first: `Duration::MAX * 1.0` does not
        // fit a Duration and `mul_f64` would panic (a drift of zero, a TTL
        // from a public field). Trusting less never costs safety.
        ttl.min(crate::MAX_TTL)
            .mul_f64(1.0 - self.drift)
            .saturating_sub(self.margin)
    }

    /// The local deadline of a lease of `ttl` whose request was sent at
    /// `sent_at`. Never later than `sent_at + ttl`; `sent_at` itself when the
    /// margin eats the whole TTL.
    pub fn deadline(&self, sent_at: Instant, ttl: Duration) -> Instant {
        later(sent_at, self.trusted(ttl))
    }

    /// Refuses a TTL this policy leaves no renewal room in: a lease must be
    /// trusted past a third of its TTL, the watchdog's usual renewal time;
    /// one trusted for less would be renewed at half that time, over and
    /// over, its TTL mostly unused. Checked by the acquire methods before
    /// any I/O.
    pub fn check_ttl(&self, ttl: Duration) -> Result<(), LockError> {
        let trusted = self.trusted(ttl);
        if trusted <= ttl / 3 {
            return Err(LockError::InvalidTtl {
                ttl,
                reason: format!(
                    "with a clock drift of {} and a margin of {:?}, a lease of it is \
                     trusted for {trusted:?}, not past a third of it, when it is renewed: \
                     use a longer TTL",
                    self.drift, self.margin
                ),
            });
        }
        Ok(())
    }
}

/// `at + by`, or about a year after `at` when that does not fit in an
/// `Instant`: durations reach here from public fields (a request's TTL and
/// wait, a backoff), which must never make time arithmetic panic.
pub(crate) fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .or_else(|| at.checked_add(crate::MAX_WAIT))
        .unwrap_or(at)
}

/// One holder's claim on a lock, as a backend granted it.
///
/// A lease is a plain value: holding one does not keep the lock. Past
/// [`deadline`](Lease::deadline) the holder must assume the lock is gone,
/// whatever the server thinks.
#[derive(Clone)]
pub struct Lease {
    name: LockName,
    owner: OwnerToken,
    fence: FencingToken,
    ttl: Duration,
    renewal_ttl: Duration,
    sent_at: Instant,
    deadline: Instant,
    policy: ClockPolicy,
    key: Option<Arc<str>>,
    revoked: Option<CancellationToken>,
    space: Option<LockSpace>,
}

/// The backend key is shown with any owner token in it (32 hex digits, as
/// a Redlock value carries it) cut to its prefix, as `OwnerToken`'s own
/// Debug does: the full token is what releases the lock.
impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .field("renewal_ttl", &self.renewal_ttl)
            .field("sent_at", &self.sent_at)
            .field("deadline", &self.deadline)
            .field("policy", &self.policy)
            .field("key", &self.key.as_deref().map(without_tokens))
            .field("revoked", &self.revoked)
            .field("space", &self.space)
            .finish()
    }
}

/// `key` with every run of 32 or more hex digits cut to its first 8.
fn without_tokens(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 32 {
            out.push_str(&run[..8]);
            out.push('…');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in key.chars() {
        if c.is_ascii_hexdigit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

impl Lease {
    /// A lease granted for `ttl` (as the server granted it, which may differ
    /// from what was asked) on a request sent at `sent_at`.
    pub fn new(
        name: LockName,
        owner: OwnerToken,
        fence: FencingToken,
        ttl: Duration,
        sent_at: Instant,
        policy: ClockPolicy,
    ) -> Self {
        Lease {
            deadline: policy.deadline(sent_at, ttl),
            name,
            owner,
            fence,
            ttl,
            renewal_ttl: ttl,
            sent_at,
            policy,
            key: None,
            revoked: None,
            space: None,
        }
    }

    /// Attaches the backend's own handle for this lease (an etcd key, a
    /// ZooKeeper node path, a Redisson hash field), so renew and release find
    /// exactly what acquire created.
    pub fn with_backend_key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the TTL renewals ask for when the server granted the lease for
    /// less than the holder asked: a fair-mode Redis hand-off grants a
    /// short claim window, so that a waiter that died after its last
    /// attempt holds the lock for that window rather than a whole TTL, and
    /// the first renewal (the watchdog's, at a third of the granted TTL)
    /// extends it to the TTL asked for. Without it, renewals ask for
    /// [`ttl`](Lease::ttl).
    pub fn with_renewal_ttl(mut self, ttl: Duration) -> Self {
        self.renewal_ttl = ttl;
        self
    }

    /// Marks the lease as granted in `space`, whose clients alone renew and
    /// release it ([`LockSpace`]). Backends call it through
    /// [`LockSpace::stamp`].
    pub fn in_space(mut self, space: LockSpace) -> Self {
        self.space = Some(space);
        self
    }

    /// The lock space that granted this lease, if it said ([`in_space`](Lease::in_space)).
    pub fn space(&self) -> Option<LockSpace> {
        self.space
    }

    /// Attaches a signal the backend fires when it learns, on its own, that
    /// this lease is gone: an etcd session that closed or whose keepalive
    /// answered TTL 0, a ZooKeeper session that expired. The guard's
    /// `lost()` completes and `is_held()` turns false at once, instead of at
    /// the next renewal, and the watchdog sends no renewal after it. The
    /// loss is logged and counted (`polylock_lost_total`) when the first of
    /// these sees it, at the latest at the lease's next renewal time.
    /// Renewed leases keep the signal.
    pub fn with_revocation(mut self, revoked: CancellationToken) -> Self {
        self.revoked = Some(revoked);
        self
    }

    /// The signal set by [`with_revocation`](Lease::with_revocation), if any.
    pub fn revocation(&self) -> Option<&CancellationToken> {
        self.revoked.as_ref()
    }

    /// Whether the backend has revoked this lease (see
    /// [`with_revocation`](Lease::with_revocation)).
    pub fn is_revoked(&self) -> bool {
        self.revoked
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// The same lease extended by a renew request sent at `sent_at` that the
    /// server granted for `ttl`. Name, owner, fence, key and the TTL that
    /// renewals ask for are unchanged.
    pub fn renewed(&self, ttl: Duration, sent_at: Instant) -> Self {
        Lease {
            ttl,
            sent_at,
            deadline: self.policy.deadline(sent_at, ttl),
            ..self.clone()
        }
    }

    /// The same lease, its deadline moved up to `deadline` when that is
    /// sooner. For a lease that must not be trusted longer than another
    /// one: a migration lock's lease, held on two backends, is trusted no
    /// longer than either side's; a backend renewing a lease that arrived
    /// with a laxer clock policy than it granted under. A later
    /// [`renewed`](Lease::renewed) computes its deadline afresh.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{ClockPolicy, FencingToken, Lease, LockName, OwnerToken};
    /// let now = tokio::time::Instant::now();
    /// let lease = Lease::new(LockName::new("n").unwrap(), OwnerToken::random(),
    ///     FencingToken::new(1).unwrap(), Duration::from_secs(30), now, ClockPolicy::default());
    /// let sooner = now + Duration::from_secs(5);
    /// assert_eq!(lease.clone().with_deadline_no_later_than(sooner).deadline(), sooner);
    /// let later = now + Duration::from_secs(60);
    /// assert_eq!(lease.clone().with_deadline_no_later_than(later).deadline(), lease.deadline());
    /// ```
    pub fn with_deadline_no_later_than(mut self, deadline: Instant) -> Self {
        self.deadline = self.deadline.min(deadline);
        self
    }

    /// When the watchdog renews this lease: a third of its TTL after its
    /// request was sent, or half the time the lease is trusted when that
    /// comes first (a backend whose deadlines lose more than the clock
    /// policy's usual margin, as a ZooKeeper ensemble's follower lag), so
    /// that a failed renewal always has as long again for its retries.
    pub fn renewal_due(&self) -> Instant {
        let trusted = self.deadline.saturating_duration_since(self.sent_at);
        later(self.sent_at, (self.ttl / 3).min(trusted / 2))
    }

    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.name
    }
    /// The owner token the lock is held under.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }
    /// The fencing token of this holding.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }
    /// The TTL the server granted on the last acquire or renew.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
    /// The TTL a renewal of this lease asks the server for: the TTL the
    /// acquire asked for (as the backend grants it), which is
    /// [`ttl`](Lease::ttl) unless the server granted this lease for less
    /// (see [`with_renewal_ttl`](Lease::with_renewal_ttl)).
    pub fn renewal_ttl(&self) -> Duration {
        self.renewal_ttl
    }
    /// When the last acquire or renew request was sent (monotonic clock).
    pub fn sent_at(&self) -> Instant {
        self.sent_at
    }
    /// After this instant the holder must assume the lock is gone.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
    /// The clock policy the deadline was computed with.
    pub fn policy(&self) -> ClockPolicy {
        self.policy
    }
    /// The backend's own handle for this lease, if it set one.
    pub fn backend_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    /// Whether the local deadline has passed.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_measured_from_send_and_shrunk() {
        let now = Instant::now();
        let p = ClockPolicy {
            drift: 0.1,
            margin: Duration::from_millis(10),
        };
        let d = p.deadline(now, Duration::from_secs(1));
        assert_eq!(d - now, Duration::from_millis(890));
        // A margin larger than the TTL gives a lease that is already over.
        assert_eq!(p.deadline(now, Duration::from_millis(5)), now);
    }

    #[test]
    fn debug_cuts_owner_tokens_in_the_backend_key() {
        let owner = OwnerToken::random();
        let value = format!("{owner}.0123abcd");
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            owner,
            FencingToken::new(1).unwrap(),
            Duration::from_secs(1),
            Instant::now(),
            ClockPolicy::default(),
        )
        .with_backend_key(value.as_str());
        let shown = format!("{lease:?}");
        assert!(!shown.contains(&owner.to_string()), "{shown}");
        assert!(
            shown.contains(&format!("{}….0123abcd", &value[..8])),
            "{shown}"
        );
        // Shorter hex runs (an etcd lease id) are shown as they are.
        assert_eq!(
            without_tokens("/p/n/694d8b2c9f3a1e22"),
            "/p/n/694d8b2c9f3a1e22"
        );
    }

    #[test]
    fn renewed_keeps_identity() {
        let now = Instant::now();
        let l = Lease::new(
            LockName::new("a").unwrap(),
            OwnerToken::random(),
            FencingToken::new(3).unwrap(),
            Duration::from_secs(1),
            now,
            ClockPolicy::default(),
        )
        .with_backend_key("k");
        assert_eq!(l.renewal_ttl(), l.ttl());
        let l = l.with_renewal_ttl(Duration::from_secs(2));
        let later = now + Duration::from_millis(500);
        let r = l.renewed(Duration::from_secs(2), later);
        assert_eq!(r.renewal_ttl(), Duration::from_secs(2));
        let r = r.renewed(Duration::from_millis(700), later);
        assert_eq!(
            (r.ttl(), r.renewal_ttl()),
            (Duration::from_millis(700), Duration::from_secs(2)),
            "a renewal granted short still asks for the TTL asked next time"
        );
        let r = l.renewed(Duration::from_secs(2), later);
        assert_eq!(r.fence(), l.fence());
        assert_eq!(r.owner(), l.owner());
        assert_eq!(r.backend_key(), Some("k"));
        assert!(r.deadline() > l.deadline());
    }
}
