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
//! tokens or credentials.

use std::time::Duration;

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
