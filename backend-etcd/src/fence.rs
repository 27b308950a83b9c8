//! Fenced writes for data kept in etcd itself.
//!
//! A lock holder that was frozen (GC pause, SIGSTOP, a slow disk) past its
//! lease may wake up and write after another client took the lock. For
//! data in etcd, the lock and the data share one consensus log, so the
//! check can be exact: [`fenced_put`] is one transaction that writes only
//! if the holder's claim key still exists with the create revision the
//! lease carries as its fencing token. Once the claim is gone (released,
//! expired, deleted by an operator), every fenced write of that holding is
//! refused, in the same order every member applies.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lock_core::{Lease, LockError};

use crate::backend::EtcdBackend;
use crate::conn::Retry;

/// Writes `value` at `key` only while `lease` still holds its lock: an etcd
/// transaction comparing the claim key's create revision with the lease's
/// fencing token. `Err(Lost)` when the lock is no longer held by this
/// lease; nothing was written then.
///
/// `key` is used as given: the client's `?prefix=` applies to lock keys
/// only.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::Locker;
/// use backend_etcd::{fenced_put, EtcdBackend};
/// let etcd = EtcdBackend::connect("etcd://127.0.0.1:2379").await?;
/// let locker = Locker::new(etcd.clone());
/// let guard = locker.lock("config-writer").acquire().await?;
/// fenced_put(&etcd, &guard.lease(), "app/config", "v2").await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Cancel safe: the write happened, under the check, or not at all.
pub async fn fenced_put(
    backend: &EtcdBackend,
    lease: &Lease,
    key: impl Into<Vec<u8>>,
    value: impl Into<Vec<u8>>,
) -> Result<(), LockError> {
    let lost = || LockError::Lost {
        name: lease.name().to_string(),
    };
    let Some(lock_key) = lease.backend_key() else {
        return Err(lost());
    };
    let rev = i64::try_from(lease.fence().get()).map_err(|_| lost())?;
    let txn = Txn::new()
        .when(vec![Compare::create_revision(
            lock_key,
            CompareOp::Equal,
            rev,
        )])
        .and_then(vec![TxnOp::put(key, value, None)]);
    let r = backend
        .conn()
        .txn("fenced write", Retry::NotSent, txn)
        .await?;
    if r.succeeded() {
        Ok(())
    } else {
        Err(lost())
    }
}
