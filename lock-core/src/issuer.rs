//! Which client issued a lease: a lease is renewed and released through
//! the client that acquired it (or a clone of it), never another.
//!
//! Why: a lease names a lock and an owner, not the service it was taken
//! on. Handed to another client (another server, another backend, a
//! migration lock's side), the request would go out with an owner token
//! that may be the caller's own on that service too (an explicit
//! [`Owner`](crate::Owner)), and could renew or release a different
//! holding there. Each client stamps the leases it grants and refuses
//! anyone else's with [`LockError::ForeignLease`] before any I/O.
//!
//! A lease built by hand ([`Lease::new`]) carries no stamp and is judged by
//! the service alone, as before: tools that rebuild a lease (a migration
//! lock's sides, a forged lease in a test of the server's checks) keep
//! working.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::LockError;
use crate::lease::Lease;

/// The identity of one backend client, shared by its clones; unique within
/// the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Issuer(u64);

impl Default for Issuer {
    fn default() -> Self {
        Issuer::new()
    }
}

impl Issuer {
    /// A new identity, never handed out before in this process.
    pub fn new() -> Issuer {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Issuer(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Stamps the lease of an acquire's result as this client's.
    pub fn stamp(
        &self,
        acquired: Result<Option<Lease>, LockError>,
    ) -> Result<Option<Lease>, LockError> {
        acquired.map(|l| l.map(|l| l.issued_by(*self)))
    }

    /// Refuses a lease another client issued, before any I/O.
    pub fn check(&self, lease: &Lease) -> Result<(), LockError> {
        match lease.issuer() {
            Some(other) if other != *self => Err(LockError::ForeignLease {
                name: lease.name().to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Whether any of `leases` was issued by another client (a batch with
    /// one is then renewed lease by lease, so that each is judged alone).
    pub fn any_foreign(&self, leases: &[Lease]) -> bool {
        leases.iter().any(|l| self.check(l).is_err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClockPolicy, FencingToken, LockName, OwnerToken};
    use std::time::Duration;
    use tokio::time::Instant;

    fn lease() -> Lease {
        Lease::new(
            LockName::new("a").unwrap(),
            OwnerToken::random(),
            FencingToken::new(1).unwrap(),
            Duration::from_secs(1),
            Instant::now(),
            ClockPolicy::default(),
        )
    }

    #[test]
    fn a_stamped_lease_is_refused_by_other_issuers_only() {
        let (mine, theirs) = (Issuer::new(), Issuer::new());
        assert_ne!(mine, theirs);
        let stamped = mine.stamp(Ok(Some(lease()))).unwrap().unwrap();
        assert!(mine.check(&stamped).is_ok());
        let renewed = stamped.renewed(Duration::from_secs(2), Instant::now());
        assert!(mine.check(&renewed).is_ok(), "a renewal keeps the stamp");
        let e = theirs.check(&renewed).unwrap_err();
        assert!(matches!(e, LockError::ForeignLease { .. }), "{e}");
        assert!(!e.is_lost() && !e.is_retryable());
        assert!(theirs.any_foreign(&[lease(), renewed]));
        assert!(!mine.any_foreign(&[lease(), stamped]));
        // Built by hand: judged by the service alone.
        assert!(theirs.check(&lease()).is_ok());
    }
}
