//! What a backend promises, as plain data.

use std::time::Duration;

/// Whose clock decides that a lease has expired, on which host, and so what
/// can make a lease end while its holder still believes it holds it.
///
/// The holder always ends its lease locally, on its own monotonic clock and
/// earlier than the TTL (see [`ClockPolicy`](crate::ClockPolicy)); what the
/// variant names is the OTHER clock, the one that lets the next holder in.
/// When that clock jumps forward, or runs faster than the holder's, the next
/// holder may be let in while the current one still believes it holds the
/// lock: fencing tokens are the defence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExpiryClock {
    /// The lock server's wall clock: Redis `PX`, PostgreSQL
    /// `clock_timestamp()`, MySQL/MariaDB `UTC_TIMESTAMP()`.
    Server,
    /// The wall clock of the host the client runs on: SQLite evaluates
    /// `julianday('now')` inside the client process, so every client judges
    /// expiry by its own machine's clock.
    ClientHost,
    /// The monotonic lease timer of a consensus group's leader (etcd).
    Consensus,
    /// This process's monotonic clock (the in-memory backend).
    Local,
}

impl ExpiryClock {
    /// Every variant, for tables and tests.
    pub const ALL: [ExpiryClock; 4] = [
        ExpiryClock::Server,
        ExpiryClock::ClientHost,
        ExpiryClock::Consensus,
        ExpiryClock::Local,
    ];

    /// The clock, in a few words (the "lease expiry judged by" column).
    pub fn judged_by(self) -> &'static str {
        match self {
            ExpiryClock::Server => "the lock server's wall clock",
            ExpiryClock::ClientHost => "the wall clock of the client's host",
            ExpiryClock::Consensus => "the consensus leader's monotonic lease timer",
            ExpiryClock::Local => "this process's monotonic clock",
        }
    }

    /// Whether a step of a wall clock (NTP, a manual change, a VM resume)
    /// moves expiries.
    pub fn is_wall_clock(self) -> bool {
        matches!(self, ExpiryClock::Server | ExpiryClock::ClientHost)
    }

    /// What makes leases expire early, while their holders still believe
    /// they hold them (and what only makes them expire late).
    pub fn broken_by(self) -> &'static str {
        match self {
            ExpiryClock::Server => {
                "a forward step of the server's wall clock expires leases early while \
                 their holders still believe they hold them; a backward step keeps them \
                 longer"
            }
            ExpiryClock::ClientHost => {
                "a forward step of the wall clock of the host the clients run on \
                 expires leases early while their holders still believe they hold them; a \
                 backward step keeps them longer"
            }
            ExpiryClock::Consensus => {
                "no wall-clock step; a leader whose monotonic clock runs fast expires \
                 leases early; a leader change restarts every lease's TTL (late, never \
                 early)"
            }
            ExpiryClock::Local => {
                "nothing outside this process: holders and expiry read one monotonic clock"
            }
        }
    }
}

/// How a waiter learns that a lock became free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitMechanism {
    /// An in-process notification.
    InProcess,
    /// A pub/sub message published at release.
    PubSub,
    /// A watch on the predecessor's key or node.
    Watch,
    /// Database notifications (PostgreSQL LISTEN/NOTIFY).
    Notify,
    /// Polling with jittered exponential backoff.
    Poll,
}

impl WaitMechanism {
    /// A few words for tables and `polylock status`.
    pub fn describe(self) -> &'static str {
        match self {
            WaitMechanism::InProcess => "in-process notification",
            WaitMechanism::PubSub => "pub/sub message",
            WaitMechanism::Watch => "watch on the predecessor",
            WaitMechanism::Notify => "LISTEN/NOTIFY",
            WaitMechanism::Poll => "polling with jittered backoff",
        }
    }
}

/// When fencing tokens strictly increase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencingGuarantee {
    /// Always, including across server restarts and failovers.
    Strict,
    /// As long as the server keeps its data; the string names the faults that
    /// can make tokens go backwards (restart without persistence, failover to
    /// a replica that missed a write).
    UnlessDataLoss(&'static str),
}

/// The promises a backend makes. The conformance suite selects cases by these
/// fields, the fault suite checks them, and the docs table is generated from
/// them.
///
/// The struct is `non_exhaustive`: build it with [`Guarantees::new`] and set
/// fields.
///
/// ```
/// use lock_core::{Guarantees, WaitMechanism};
/// let mut g = Guarantees::new("example");
/// g.wait = WaitMechanism::Poll;
/// assert!(!g.fair_fifo);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Guarantees {
    /// Backend name, as used in URLs and error messages.
    pub backend: &'static str,
    /// When fencing tokens strictly increase.
    pub fencing: FencingGuarantee,
    /// Waiters acquire in the order they started waiting.
    pub fair_fifo: bool,
    /// Whose clock expires leases.
    pub expiry_clock: ExpiryClock,
    /// A held lock is still held after the server restarts.
    pub survives_restart: bool,
    /// A held lock is still held after a failover to another node.
    pub survives_failover: bool,
    /// How waiters wake up.
    pub wait: WaitMechanism,
    /// The smallest TTL the backend can grant; shorter requests are rounded up.
    pub min_ttl: Duration,
    /// TTLs are rounded up to a multiple of this (etcd: one second).
    pub ttl_granularity: Duration,
    /// The backend can remove a lock it does not own (`force_release`).
    pub force_release: bool,
    /// The backend keeps [`AcquireRequest::meta`](crate::AcquireRequest)
    /// beside the lock and returns it from `inspect` and `list`.
    pub holder_meta: bool,
    /// The backend can enumerate held locks (`list`).
    pub list: bool,
    /// The backend can count a lock's waiters (`waiters`).
    pub counts_waiters: bool,
    /// [`renew_many`](crate::LockBackend::renew_many) renews the leases due
    /// together in one request (per server), so renewal traffic grows slower
    /// than the number of held locks.
    pub batch_renew: bool,
}

impl Guarantees {
    /// The weakest promises: a backend opts in to each stronger one.
    pub fn new(backend: &'static str) -> Self {
        Guarantees {
            backend,
            fencing: FencingGuarantee::UnlessDataLoss("unknown"),
            fair_fifo: false,
            expiry_clock: ExpiryClock::Server,
            survives_restart: false,
            survives_failover: false,
            wait: WaitMechanism::Poll,
            min_ttl: Duration::from_millis(1),
            ttl_granularity: Duration::from_millis(1),
            force_release: false,
            holder_meta: false,
            list: false,
            counts_waiters: false,
            batch_renew: false,
        }
    }

    /// The TTL this backend would grant for `requested`: at least `min_ttl`,
    /// rounded up to the granularity.
    pub fn effective_ttl(&self, requested: Duration) -> Duration {
        let t = requested.max(self.min_ttl);
        let g = self.ttl_granularity.as_nanos().max(1);
        let n = t.as_nanos().div_ceil(g) * g;
        Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
    }

    /// The TTL granted for `requested` ([`effective_ttl`](Self::effective_ttl)),
    /// and it as a whole number of `unit`, rounded up: what is sent to the
    /// server (`PX` milliseconds, etcd lease seconds, SQL timestamp units).
    /// The one place a backend turns a requested TTL into what it asks
    /// for, so what it grants is what it declares.
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut g = lock_core::Guarantees::new("example");
    /// g.min_ttl = Duration::from_secs(2);
    /// g.ttl_granularity = Duration::from_secs(1);
    /// let (ttl, secs) = g.granted_ttl(Duration::from_millis(2500), Duration::from_secs(1));
    /// assert_eq!((ttl, secs), (Duration::from_secs(3), 3));
    /// ```
    pub fn granted_ttl(&self, requested: Duration, unit: Duration) -> (Duration, u64) {
        let ttl = self.effective_ttl(requested);
        let units = ttl.as_nanos().div_ceil(unit.as_nanos().max(1));
        (ttl, u64::try_from(units).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_ttl_rounds_up() {
        let mut g = Guarantees::new("x");
        g.min_ttl = Duration::from_secs(2);
        g.ttl_granularity = Duration::from_secs(1);
        assert_eq!(
            g.effective_ttl(Duration::from_millis(10)),
            Duration::from_secs(2)
        );
        assert_eq!(
            g.effective_ttl(Duration::from_millis(2500)),
            Duration::from_secs(3)
        );
    }

    #[test]
    fn granted_ttl_counts_units_of_the_effective_ttl() {
        let g = Guarantees::new("x");
        let ms = Duration::from_millis(1);
        assert_eq!(g.granted_ttl(Duration::from_micros(1), ms), (ms, 1));
        assert_eq!(
            g.granted_ttl(Duration::from_micros(1500), ms),
            (Duration::from_millis(2), 2)
        );
        assert_eq!(g.granted_ttl(crate::MAX_TTL, ms).1, 365 * 24 * 3600 * 1000);
        let mut g = Guarantees::new("x");
        g.min_ttl = Duration::from_micros(1);
        g.ttl_granularity = Duration::from_micros(1);
        let us = Duration::from_micros(1);
        assert_eq!(g.granted_ttl(Duration::from_nanos(1500), us).1, 2);
        assert_eq!(g.granted_ttl(Duration::from_secs(1), us).1, 1_000_000);
    }

    #[test]
    fn each_expiry_clock_says_which_clock_and_what_breaks_it() {
        let mut seen = std::collections::HashSet::new();
        for c in ExpiryClock::ALL {
            assert!(seen.insert(c.judged_by()), "{c:?}: text shared");
            assert_eq!(
                c.is_wall_clock(),
                c.judged_by().contains("wall clock"),
                "{c:?}"
            );
            if c.is_wall_clock() {
                assert!(c.broken_by().contains("forward step"), "{c:?}");
                assert!(c.broken_by().contains("early"), "{c:?}");
            }
            // Both end up in Markdown table cells.
            assert!(!c.judged_by().contains('|') && !c.broken_by().contains('|'));
        }
    }
}
