//! Leases and their local deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::name::LockName;
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
    /// The local deadline of a lease of `ttl` whose request was sent at
    /// `sent_at`. Never later than `sent_at + ttl`; `sent_at` itself when the
    /// margin eats the whole TTL.
    pub fn deadline(&self, sent_at: Instant, ttl: Duration) -> Instant {
        let drift = self.drift.clamp(0.0, 1.0);
        let trusted = ttl.mul_f64(1.0 - drift).saturating_sub(self.margin);
        sent_at.checked_add(trusted).unwrap_or(sent_at)
    }
}

/// One holder's claim on a lock, as a backend granted it.
///
/// A lease is a plain value: holding one does not keep the lock. Past
/// [`deadline`](Lease::deadline) the holder must assume the lock is gone,
/// whatever the server thinks.
#[derive(Clone, Debug)]
pub struct Lease {
    name: LockName,
    owner: OwnerToken,
    fence: FencingToken,
    ttl: Duration,
    sent_at: Instant,
    deadline: Instant,
    policy: ClockPolicy,
    key: Option<Arc<str>>,
    revoked: Option<CancellationToken>,
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
            sent_at,
            policy,
            key: None,
            revoked: None,
        }
    }

    /// Attaches the backend's own handle for this lease (an etcd key, a
    /// ZooKeeper node path, a Redisson hash field), so renew and release find
    /// exactly what acquire created.
    pub fn with_backend_key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.key = Some(key.into());
        self
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
    /// server granted for `ttl`. Name, owner, fence and key are unchanged.
    pub fn renewed(&self, ttl: Duration, sent_at: Instant) -> Self {
        Lease {
            ttl,
            sent_at,
            deadline: self.policy.deadline(sent_at, ttl),
            ..self.clone()
        }
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
        let later = now + Duration::from_millis(500);
        let r = l.renewed(Duration::from_secs(2), later);
        assert_eq!(r.fence(), l.fence());
        assert_eq!(r.owner(), l.owner());
        assert_eq!(r.backend_key(), Some("k"));
        assert!(r.deadline() > l.deadline());
    }
}
