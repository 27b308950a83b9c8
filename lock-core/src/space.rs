//! Which lock space a lease belongs to: a lease is renewed and released
//! only by a client of the space that granted it.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::LockError;
use crate::lease::Lease;

/// One lock space. Cheap to copy and compare.
///
/// Why: a lease names a lock and an owner, not where it was taken. Handed
/// to a client of another backend, another wire format or another
/// namespace (a SQL lease to a Redis client, a Redlock lease to a client of
/// one of its nodes, a migration lock's composite lease to one of its
/// sides), the request would go out under an owner token that may be the
/// caller's own there too (an explicit [`Owner`](crate::Owner)), and could
/// renew or release a different holding, or answer "released" for a lock
/// it never saw while the real one stays held. Each backend stamps the
/// leases it grants with its space and refuses another space's with
/// [`LockError::ForeignLease`] before any I/O.
///
/// A space is the backend kind, its wire format and its namespace (key
/// prefix and database, table, root path), not the servers: every client of
/// one service shares it whatever address it dialled, so a lease may be
/// renewed or released through any of them (a clone, a second process's
/// client, a new client after a restart). Two servers with the same
/// namespace are one space here; between them the server's own owner and
/// fence checks refuse what is not theirs.
///
/// A lease built by hand ([`Lease::new`]) carries no space and is judged by
/// the server alone, as before: tools that rebuild a lease (a migration
/// lock's sides, a forged lease in a test of the server's checks) keep
/// working.
///
/// ```
/// use lock_core::LockSpace;
/// let a = LockSpace::named(&["redis", "plain", "db0", "locks:"]);
/// assert_eq!(a, LockSpace::named(&["redis", "plain", "db0", "locks:"]));
/// assert_ne!(a, LockSpace::named(&["redis", "plain", "db1", "locks:"]));
/// assert_ne!(LockSpace::unique(), LockSpace::unique());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockSpace(u64);

/// Set on [`LockSpace::unique`] values and cleared on named ones, so that
/// the two can never meet.
const UNIQUE: u64 = 1 << 63;

impl LockSpace {
    /// A space of its own, equal to no other in this process: an in-memory
    /// lock table.
    pub fn unique() -> LockSpace {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        LockSpace(UNIQUE | NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The space `parts` name: the backend kind first, then what tells its
    /// namespaces apart. Equal parts give an equal space within the process
    /// (the value is not meant to be stored).
    pub fn named(parts: &[&str]) -> LockSpace {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        parts.len().hash(&mut h);
        for p in parts {
            p.hash(&mut h);
        }
        LockSpace(h.finish() & !UNIQUE)
    }

    /// The space of a lock held in `a` and `b` at once (a migration lock
    /// over two backends), distinct from either.
    pub fn both(a: LockSpace, b: LockSpace) -> LockSpace {
        LockSpace::named(&["both", &a.0.to_string(), &b.0.to_string()])
    }

    /// Stamps the lease of an acquire's result as granted in this space.
    pub fn stamp(
        &self,
        acquired: Result<Option<Lease>, LockError>,
    ) -> Result<Option<Lease>, LockError> {
        acquired.map(|l| l.map(|l| l.in_space(*self)))
    }

    /// Refuses a lease of another space, before any I/O.
    pub fn check(&self, lease: &Lease) -> Result<(), LockError> {
        match lease.space() {
            Some(other) if other != *self => Err(LockError::ForeignLease {
                name: lease.name().to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Whether any of `leases` belongs to another space (a batch with one
    /// is then renewed lease by lease, so that each is judged alone).
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
    fn a_stamped_lease_is_refused_by_other_spaces_only() {
        let mine = LockSpace::named(&["sql", "postgres", "locks"]);
        let also_mine = LockSpace::named(&["sql", "postgres", "locks"]);
        let theirs = LockSpace::named(&["sql", "postgres", "other_locks"]);
        assert_ne!(mine, theirs);
        let stamped = mine.stamp(Ok(Some(lease()))).unwrap().unwrap();
        assert!(
            also_mine.check(&stamped).is_ok(),
            "same space, other client"
        );
        let renewed = stamped.renewed(Duration::from_secs(2), Instant::now());
        assert!(mine.check(&renewed).is_ok(), "a renewal keeps the stamp");
        let e = theirs.check(&renewed).unwrap_err();
        assert!(matches!(e, LockError::ForeignLease { .. }), "{e}");
        assert!(!e.is_lost() && !e.is_retryable());
        assert!(theirs.any_foreign(&[lease(), renewed]));
        assert!(!mine.any_foreign(&[lease(), stamped]));
        // Built by hand: judged by the server alone.
        assert!(theirs.check(&lease()).is_ok());
    }

    #[test]
    fn parts_are_not_run_together_and_unique_spaces_meet_no_named_one() {
        assert_ne!(
            LockSpace::named(&["ab", "c"]),
            LockSpace::named(&["a", "bc"])
        );
        assert_ne!(LockSpace::named(&["a"]), LockSpace::named(&["a", ""]));
        let (a, b) = (LockSpace::named(&["x"]), LockSpace::named(&["y"]));
        assert_ne!(LockSpace::both(a, b), LockSpace::both(b, a));
        assert_ne!(LockSpace::both(a, b), a);
        let u = LockSpace::unique();
        assert_ne!(u.0 & UNIQUE, 0);
        assert_eq!(LockSpace::named(&["x"]).0 & UNIQUE, 0);
    }
}
