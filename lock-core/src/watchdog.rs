//! The watchdog: renews a held lease at a third of its TTL.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep_until, timeout_at, Instant};
use tracing::Instrument;

use crate::held::Held;
use crate::observe;

/// Starts the watchdog of `held` on the current runtime.
///
/// It renews at `sent_at + ttl/3` of the current lease. A failed renew is
/// retried with backoff until the lease's local deadline; then, or at once
/// when the backend says the lease is no longer ours, it marks the lease
/// lost. It exits on release, on drop of the last guard (both cancel
/// `held.stop` and abort the task) and on loss, so it never outlives the
/// guards.
pub(crate) fn spawn(held: &Arc<Held>) {
    let task = tokio::spawn(run(Arc::clone(held)));
    held.set_watchdog(task.abort_handle());
}

async fn run(held: Arc<Held>) {
    loop {
        let lease = held.current();
        let renew_at = lease.sent_at() + lease.ttl() / 3;
        tokio::select! {
            _ = held.stop.cancelled() => return,
            _ = sleep_until(renew_at) => {}
        }
        let mut pause = (lease.ttl() / 20).clamp(Duration::from_millis(5), Duration::from_secs(1));
        loop {
            let deadline = lease.deadline();
            let attempt = tokio::select! {
                _ = held.stop.cancelled() => return,
                r = timeout_at(deadline, held.backend.renew(&lease)).instrument(tracing::debug_span!(
                    "polylock.renew",
                    backend = held.backend_name,
                    name = %lease.name(),
                    fence = lease.fence().get(),
                )) => r,
            };
            match attempt {
                Ok(Ok(renewed)) => {
                    tracing::trace!(
                        backend = held.backend_name,
                        name = %renewed.name(),
                        fence = renewed.fence().get(),
                        "polylock: renewed"
                    );
                    held.lease.send_replace(renewed);
                    break;
                }
                Ok(Err(e)) if e.is_lost() => {
                    held.mark_lost("the backend reports the lease is no longer ours");
                    return;
                }
                Ok(Err(e)) => {
                    observe::renew_failed(held.backend_name);
                    tracing::debug!(
                        backend = held.backend_name,
                        name = %lease.name(),
                        error = %e,
                        "polylock: renew failed; retrying until the deadline"
                    );
                    let now = Instant::now();
                    if now >= deadline {
                        held.mark_lost("renewal kept failing until the deadline");
                        return;
                    }
                    tokio::select! {
                        _ = held.stop.cancelled() => return,
                        _ = sleep_until(deadline.min(now + pause)) => {}
                    }
                    pause = (pause * 2)
                        .min(lease.ttl() / 6)
                        .max(Duration::from_millis(5));
                }
                Err(_elapsed) => {
                    observe::renew_failed(held.backend_name);
                    held.mark_lost("no renewal answered before the deadline");
                    return;
                }
            }
        }
    }
}
