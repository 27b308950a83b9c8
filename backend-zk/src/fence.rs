//! Writes that only happen while a lock is held.

use lock_core::{Lease, LockError};
use zookeeper_client::{CheckWriteError, CreateMode, Error};

use crate::backend::ZkBackend;
use crate::errors::{from_zk, timed};

/// Writes `data` to the node at `path` (created persistent, with the URL's
/// `acl`, if missing) in
/// ONE multi-op that first checks `lease`'s lock node still exists
/// unchanged: a holder whose lock was lost (expired, removed, its session
/// gone) cannot write, whatever it believes. `Err(Lost)` when the check
/// fails. `path` is an absolute path, used as given (no chroot added).
///
/// # Cancel safety
/// Cancel safe: the multi-op is applied whole or not at all.
pub async fn fenced_set_data(
    backend: &ZkBackend,
    lease: &Lease,
    path: &str,
    data: &[u8],
) -> Result<(), LockError> {
    let lost = || LockError::Lost {
        name: lease.name().to_string(),
    };
    let node = lease.backend_key().ok_or_else(lost)?;
    let s = backend.any_session().await?;
    let op = backend.config().op_timeout();
    for create in [false, true] {
        // Lock nodes are never written, so version 0 is "unchanged".
        let mut w = s
            .client
            .new_check_writer(node, Some(0))
            .map_err(|e| from_zk("fenced write", e))?;
        if create {
            let opts = CreateMode::Persistent.with_acls(backend.config().acls());
            w.add_create(path, data, &opts)
        } else {
            w.add_set_data(path, data, None)
        }
        .map_err(|e| from_zk("fenced write", e))?;
        match timed("fenced write", op, w.commit()).await? {
            Ok(_) => return Ok(()),
            Err(CheckWriteError::CheckFailed { .. }) => return Err(lost()),
            Err(CheckWriteError::OperationFailed {
                source: Error::NoNode,
                ..
            }) if !create => continue,
            // Created by someone else between our two tries: write again.
            Err(CheckWriteError::OperationFailed {
                source: Error::NodeExists,
                ..
            }) => return Box::pin(fenced_set_data(backend, lease, path, data)).await,
            Err(CheckWriteError::OperationFailed { source, .. })
            | Err(CheckWriteError::RequestFailed { source }) => {
                return Err(from_zk(&format!("fenced write to {path}"), source))
            }
        }
    }
    Err(lost())
}
