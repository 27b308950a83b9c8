//! ZooKeeper errors → [`LockError`]. The driver's error type stays here.

use std::future::Future;
use std::time::Duration;

use lock_core::LockError;
use zookeeper_client::Error;

/// The backend's name in errors and guarantees.
pub(crate) const BACKEND: &str = "zookeeper";

/// Whether the same request may succeed later: the connection or the
/// session is being re-established, or the server is busy.
pub(crate) fn retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::ConnectionLoss
            | Error::Timeout
            | Error::Throttled
            | Error::SessionMoved
            | Error::SessionExpired
            | Error::NoHosts
            | Error::ClientClosed
            | Error::NotReadOnly
            // The driver reports socket errors (a reset connection) this way.
            | Error::Custom(_)
    )
}

/// Whether a write that failed this way may still have been applied: the
/// request left, and the connection broke before its reply came back.
pub(crate) fn outcome_unknown(e: &Error) -> bool {
    matches!(
        e,
        Error::ConnectionLoss | Error::Timeout | Error::Custom(_) | Error::UnexpectedError(_)
    )
}

/// The driver error as a [`LockError::Backend`], with what was being done.
pub(crate) fn from_zk(what: &str, e: Error) -> LockError {
    let msg = match e {
        Error::NoAuth => format!(
            "{what}: not authorized: the node's ACL does not grant this client's credentials"
        ),
        Error::AuthFailed => format!("{what}: the server refused the credentials"),
        _ => format!("{what}: {e}"),
    };
    if retryable(&e) {
        LockError::transient(BACKEND, msg)
    } else {
        LockError::permanent(BACKEND, msg)
    }
}

/// `e` again, for each lease of a batch that one failed request answered
/// (errors are not `Clone`; this backend's carry their message only).
pub(crate) fn again(e: &LockError) -> LockError {
    match e {
        LockError::Backend {
            retryable, source, ..
        } => {
            let msg = source.to_string();
            if *retryable {
                LockError::transient(BACKEND, msg)
            } else {
                LockError::permanent(BACKEND, msg)
            }
        }
        other => LockError::permanent(BACKEND, other.to_string()),
    }
}

/// Runs one request with the client's `op_timeout` (or what is left of the
/// call's, see [`lock_core::call`]): a server that does not answer gives a
/// retryable error instead of a hang.
pub(crate) async fn timed<T, E>(
    what: &str,
    limit: Duration,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, LockError> {
    tokio::time::timeout_at(lock_core::call::request_deadline(limit), fut)
        .await
        .map_err(|_| LockError::transient(BACKEND, format!("{what}: no answer within {limit:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_trouble_is_retryable_and_refusals_are_not() {
        assert!(from_zk("create", Error::ConnectionLoss).is_retryable());
        assert!(from_zk("create", Error::SessionExpired).is_retryable());
        assert!(!from_zk("create", Error::NoAuth).is_retryable());
        assert!(!from_zk("create", Error::InvalidAcl).is_retryable());
        assert!(outcome_unknown(&Error::ConnectionLoss));
        assert!(!outcome_unknown(&Error::NodeExists));
        let m = from_zk("create /x", Error::NoAuth).to_string();
        assert!(m.contains("zookeeper") && m.contains("create /x"), "{m}");
        assert!(m.contains("not authorized"), "{m}");
        for e in [
            from_zk("renew", Error::ConnectionLoss),
            from_zk("renew", Error::NoAuth),
        ] {
            let copy = again(&e);
            assert_eq!(copy.to_string(), e.to_string());
            assert_eq!(copy.is_retryable(), e.is_retryable());
        }
    }
}
