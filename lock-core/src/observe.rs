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
    Acquired,
    Busy,
    Timeout,
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

pub(crate) fn acquire_done(
    backend: &'static str,
    outcome: Outcome,
    elapsed: Duration,
    waited: bool,
) {
    metrics::histogram!("polylock_acquire_seconds", "backend" => backend, "outcome" => outcome.label())
        .record(elapsed.as_secs_f64());
    if waited && matches!(outcome, Outcome::Acquired) {
        metrics::histogram!("polylock_wait_seconds", "backend" => backend)
            .record(elapsed.as_secs_f64());
    }
}

pub(crate) fn renew_failed(backend: &'static str) {
    metrics::counter!("polylock_renew_failures_total", "backend" => backend).increment(1);
}

pub(crate) fn lost(backend: &'static str) {
    metrics::counter!("polylock_lost_total", "backend" => backend).increment(1);
}

pub(crate) fn released(backend: &'static str) {
    metrics::counter!("polylock_released_total", "backend" => backend).increment(1);
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
