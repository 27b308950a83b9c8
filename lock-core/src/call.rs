//! One deadline for all the requests of one call.
//!
//! A backend call answers within one `op_timeout` (see "Answering in time"
//! on [`LockBackend`](crate::LockBackend)), also when it makes several
//! requests in a row: a write and then the read that explains its outcome,
//! a wait for another caller's turn and then its own request. Giving each
//! request an `op_timeout` of its own would let a slow service stretch the
//! call to several. So a call sets its deadline once with [`within`], and
//! every request inside takes its own from [`request_deadline`], which is
//! never later than the call's.
//!
//! The deadline lives in the task (a tokio task-local), so helpers need no
//! extra parameter. A task spawned inside a call does not see it: carry it
//! over with [`current`] and [`until`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::time::Duration;
//! use lock_core::call;
//! use tokio::time::Instant;
//!
//! let op_timeout = Duration::from_secs(5);
//! let start = Instant::now();
//! call::within(op_timeout, async {
//!     tokio::time::sleep(Duration::from_secs(3)).await; // a first request
//!     // The second request gets what is left of the call's 5 s, not 5 s.
//!     assert_eq!(call::request_deadline(op_timeout), start + op_timeout);
//! })
//! .await;
//! // Outside a call, a request gets its full limit.
//! assert_eq!(call::request_deadline(op_timeout), Instant::now() + op_timeout);
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

tokio::task_local! {
    static DEADLINE: Instant;
}

/// `limit` from now, saturating far in the future instead of overflowing.
fn after(limit: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(limit)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}

/// Runs `f` as one call that must answer within `limit` from now (or by the
/// enclosing call's deadline, when that is sooner).
///
/// # Cancel safety
/// As cancel safe as `f`.
pub async fn within<F: Future>(limit: Duration, f: F) -> F::Output {
    let mine = after(limit);
    let deadline = current().map_or(mine, |outer| outer.min(mine));
    DEADLINE.scope(deadline, f).await
}

/// Runs `f` under `deadline`, taken with [`current`] elsewhere (in the task
/// that spawned this one); `None` runs it under no call deadline.
///
/// # Cancel safety
/// As cancel safe as `f`.
pub async fn until<F: Future>(deadline: Option<Instant>, f: F) -> F::Output {
    match deadline {
        Some(d) => DEADLINE.scope(d, f).await,
        None => f.await,
    }
}

/// The deadline of the call this task is in, if any.
pub fn current() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// The deadline of a request that may take `limit` on its own: `limit`
/// from now, or the call's deadline when that is sooner.
pub fn request_deadline(limit: Duration) -> Instant {
    let own = after(limit);
    current().map_or(own, |call| call.min(own))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_inner_call_keeps_the_sooner_deadline() {
        let start = Instant::now();
        within(Duration::from_secs(2), async {
            within(Duration::from_secs(10), async {
                assert_eq!(current(), Some(start + Duration::from_secs(2)));
            })
            .await;
            within(Duration::from_secs(1), async {
                assert_eq!(current(), Some(start + Duration::from_secs(1)));
            })
            .await;
        })
        .await;
        assert_eq!(current(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_spawned_task_gets_the_deadline_carried_over() {
        let start = Instant::now();
        let seen = within(Duration::from_secs(2), async {
            let carried = current();
            tokio::spawn(until(carried, async { current() }))
                .await
                .unwrap()
        })
        .await;
        assert_eq!(seen, Some(start + Duration::from_secs(2)));
        assert_eq!(tokio::spawn(async { current() }).await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_huge_limit_does_not_overflow() {
        within(Duration::MAX, async {
            assert!(request_deadline(Duration::MAX) > Instant::now());
            assert_eq!(
                request_deadline(Duration::from_secs(1)),
                Instant::now() + Duration::from_secs(1)
            );
        })
        .await;
    }
}
