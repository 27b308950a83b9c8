//! Metrics and tracing, emitted once here for every backend.
//!
//! Metric names (through the `metrics` facade; install any recorder):
//! - `polylock_acquire_seconds` (histogram; labels `backend`, `outcome` =
//!   `acquired` | `busy` | `timeout` | `error`): time spent in acquire,
//!   including the wait.
//! - `polylock_wait_seconds` (histogram; `backend`): time from the first
//!   attempt to the lock, for acquisitions that had to wait.
//! - `polylock_renew_failures_total` (counter; `backend`): failed renew
//!   attempts (each retry counts).
//! - `polylock_lost_total` (counter; `backend`): leases lost while held.
//! - `polylock_released_total` (counter; `backend`): network releases.
//!
//! Spans carry the backend, the lock name and the fencing token; never owner
//! tokens or credentials. They exist only when a tracing subscriber would
//! record them ([`span!`]): a disabled span is not free, least of all when
//! tracing's `log` feature is on (sqlx turns it on for the whole build),
//! where it asks the `log` crate at every poll of the future it wraps.

use std::time::Duration;

use metrics::{Key, Label, Metadata};

/// `tracing::span!` when a subscriber would record a span of this level
/// here, `Span::none()` otherwise. Measured with callgrind on 64 tasks of
/// PostgreSQL lock cycles and no subscriber: the disabled spans of one
/// acquire and release cost about 700 instructions (the `log` checks at
/// every poll, recording the fields, dropping), a tenth of the 7,400 the
/// lock layer then added to the backend's own requests.
macro_rules! span {
    ($level:ident, $($rest:tt)+) => {
        if tracing::span_enabled!(tracing::Level::$level) {
            tracing::span!(tracing::Level::$level, $($rest)+)
        } else {
            tracing::Span::none()
        }
    };
}
pub(crate) use span;

/// How an acquire ended, for the `outcome` label.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Acquired = 0,
    Busy = 1,
    Timeout = 2,
    Error = 3,
}

/// Where the metrics say they come from (the macros' default).
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One backend's metric keys, built once per [`Locker`](crate::Locker)
/// rather than at every acquire and release as the `metrics` macros would:
/// a key with labels is a vector to allocate and a hash to compute, about
/// 500 instructions of every lock cycle (callgrind). Registering still goes
/// to whatever recorder is installed at that moment, local ones included.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Indexed by [`Outcome`].
    acquire: [Key; 4],
    wait: Key,
    renew_failures: Key,
    lost: Key,
    released: Key,
}

impl Metrics {
    pub(crate) fn new(backend: &'static str) -> Self {
        let key = |name: &'static str, outcome: Option<&'static str>| {
            let mut labels = vec![Label::from_static_parts("backend", backend)];
            labels.extend(outcome.map(|o| Label::from_static_parts("outcome", o)));
            Key::from_parts(name, labels)
        };
        let acquire = |outcome| key("polylock_acquire_seconds", Some(outcome));
        Metrics {
            acquire: [
                acquire("acquired"),
                acquire("busy"),
                acquire("timeout"),
                acquire("error"),
            ],
            wait: key("polylock_wait_seconds", None),
            renew_failures: key("polylock_renew_failures_total", None),
            lost: key("polylock_lost_total", None),
            released: key("polylock_released_total", None),
        }
    }

    pub(crate) fn acquire_done(&self, outcome: Outcome, elapsed: Duration, waited: bool) {
        let secs = elapsed.as_secs_f64();
        metrics::with_recorder(|r| {
            r.register_histogram(&self.acquire[outcome as usize], &METADATA)
                .record(secs);
            if waited && matches!(outcome, Outcome::Acquired) {
                r.register_histogram(&self.wait, &METADATA).record(secs);
            }
        });
    }

    pub(crate) fn renew_failed(&self) {
        count(&self.renew_failures);
    }

    pub(crate) fn lost(&self) {
        count(&self.lost);
    }

    pub(crate) fn released(&self) {
        count(&self.released);
    }
}

fn count(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_span_exists_only_when_a_subscriber_records_its_level() {
        // No subscriber in this thread (and no global one in this binary).
        assert!(span!(INFO, "polylock.test").is_none());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let info = span!(INFO, "polylock.test", name = "n");
            assert!(!info.is_none() && !info.is_disabled());
            assert!(span!(DEBUG, "polylock.test").is_none());
        });
    }
}
