//! The cases. Each is a plain async fn over a [`Ctx`]; [`all`] lists them
//! with the guarantee each one needs.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lock_core::{
    AcquireRequest, Guarantees, Lease, LockBackend, LockName, OwnerToken, WaitMechanism,
};

use crate::fixture::Ctx;

mod declared;
mod exclusion;
mod fencing;
mod input;
mod lease;
mod ownership;
mod reentrancy;
mod waiting;
mod watchdog;

/// One conformance case.
pub struct Case {
    /// `module::function`, used as the test name.
    pub name: &'static str,
    /// Whether the case applies to a backend with these guarantees.
    pub applies: fn(&Guarantees) -> bool,
    /// The case itself; panics on failure.
    pub run: for<'a> fn(&'a Ctx<'a>) -> BoxFuture<'a, ()>,
    /// The case disturbs every client of the fixture (it restarts the
    /// server), so no other case of that fixture may run at the same time.
    pub exclusive: bool,
}

fn always(_: &Guarantees) -> bool {
    true
}

macro_rules! case {
    ($f:path) => {
        case!($f, always)
    };
    ($f:path, $applies:expr) => {
        Case {
            name: stringify!($f),
            applies: $applies,
            run: |ctx| Box::pin($f(ctx)),
            exclusive: false,
        }
    };
    (exclusive $f:path, $applies:expr) => {
        Case {
            exclusive: true,
            ..case!($f, $applies)
        }
    };
}

/// Every case, in a stable order.
pub fn all() -> Vec<Case> {
    vec![
        case!(exclusion::mutual_exclusion),
        case!(exclusion::try_acquire_on_held_lock_does_not_wait),
        case!(exclusion::distinct_names_do_not_collide),
        case!(exclusion::waiters_acquire_in_fifo_order, |g| g.fair_fifo),
        case!(exclusion::next_grant_comes_after_the_old_holders_deadline),
        case!(waiting::acquire_waits_until_holder_releases),
        case!(waiting::acquire_times_out_at_the_deadline),
        case!(waiting::cancelled_waiter_leaves_nothing_behind),
        case!(waiting::acquire_without_a_wait_waits_for_the_holder),
        case!(waiting::calls_answer_in_time_when_the_service_is_cut_off),
        case!(waiting::acquisitions_on_a_slow_link_answer_within_one_op_timeout),
        case!(waiting::wake_up_hands_off_below_the_polling_floor, |g| {
            g.wait != WaitMechanism::Poll
        }),
        case!(ownership::forged_or_stale_release_is_refused),
        case!(ownership::release_is_idempotent),
        case!(ownership::release_after_an_overlap_reports_lost),
        case!(ownership::same_owner_with_an_older_fence_is_refused),
        case!(ownership::a_lease_is_used_only_in_its_lock_space),
        case!(lease::renew_extends_past_the_original_ttl),
        case!(lease::renew_after_expiry_is_lost_and_does_not_resurrect),
        case!(lease::abandoned_lease_expires_after_ttl_and_not_before),
        case!(lease::deadline_is_counted_from_the_send),
        case!(lease::renew_many_answers_each_lease_in_order),
        case!(watchdog::watchdog_keeps_lock_and_stops_after_release),
        case!(watchdog::lost_fires_when_lock_removed_behind_holders_back),
        case!(watchdog::guard_is_renewed_after_its_locker_is_dropped),
        case!(watchdog::many_guards_of_one_client_are_all_kept),
        case!(watchdog::cancelled_release_signals_at_once),
        case!(fencing::tokens_strictly_increase_over_successive_holders),
        case!(input::bad_input_is_refused_before_any_io),
        case!(reentrancy::reentrant_owner_counts_holds),
        case!(reentrancy::reentry_after_loss_takes_a_new_lease),
        case!(reentrancy::reacquiring_after_a_dropped_guard_is_a_lease_of_its_own),
        case!(declared::granted_ttl_follows_the_declared_minimum_and_step),
        case!(declared::force_release_does_what_is_declared),
        case!(declared::holder_meta_is_kept_where_declared),
        case!(declared::list_shows_the_held_locks_under_a_prefix),
        case!(declared::waiters_are_counted_where_declared),
        // Alone on its fixture: the restart would fail a neighbour's calls.
        case!(exclusive declared::held_lock_survives_a_server_restart, |g| g
            .survives_restart),
    ]
}

/// One raw attempt through the backend, with no guard and no watchdog.
async fn raw_try(client: &Arc<dyn LockBackend>, name: &LockName, ttl: Duration) -> Option<Lease> {
    let req = AcquireRequest::new(name.clone(), OwnerToken::random(), ttl, Duration::ZERO)
        .expect("valid request");
    client.try_acquire(&req).await.expect("try_acquire")
}

/// Polls (raw) until `name` can be taken, returning how long that took, or
/// `None` if it stayed held for `limit`.
async fn time_until_free(
    client: &Arc<dyn LockBackend>,
    name: &LockName,
    limit: Duration,
) -> Option<(Duration, Lease)> {
    let start = tokio::time::Instant::now();
    while start.elapsed() < limit {
        if let Some(lease) = raw_try(client, name, Duration::from_secs(30)).await {
            return Some((start.elapsed(), lease));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
