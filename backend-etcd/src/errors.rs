//! etcd-client errors → [`LockError`], with `retryable` set by what the
//! failure means.
//!
//! Retryable: the transport broke or timed out, or the cluster is between
//! leaders (`Unavailable`: "no leader", "leader changed", "request timed
//! out"), overloaded (`ResourceExhausted`: "too many requests") or aborted
//! the request. Not retryable: bad credentials, missing permissions,
//! untrusted TLS certificates, invalid arguments, compacted revisions —
//! asking again gets the same answer. etcd-client's types stay behind the
//! boxed source.

use std::fmt;
use std::time::Duration;

use lock_core::LockError;
use tonic::Code;

/// The backend name in errors, guarantees and URLs.
pub(crate) const BACKEND: &str = "etcd";

/// One failed etcd request: what polylock was doing, and the cause.
#[derive(Debug)]
struct Failure {
    what: String,
    detail: String,
    source: Option<etcd_client::Error>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.detail)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Maps an etcd-client error met while doing `what`.
pub(crate) fn from_etcd(what: impl Into<String>, e: etcd_client::Error) -> LockError {
    let (retryable, detail) = classify(&e);
    let failure = Failure {
        what: what.into(),
        detail,
        source: Some(e),
    };
    if retryable {
        LockError::transient(BACKEND, failure)
    } else {
        LockError::permanent(BACKEND, failure)
    }
}

/// A request that got no answer within `after`: retryable.
pub(crate) fn timed_out(what: impl Into<String>, after: Duration) -> LockError {
    LockError::transient(
        BACKEND,
        Failure {
            what: what.into(),
            detail: format!("no answer within {after:?}"),
            source: None,
        },
    )
}

/// A reply that polylock cannot make sense of (a foreign key in the way,
/// a missing header): not retryable.
pub(crate) fn unexpected(what: impl Into<String>, detail: impl Into<String>) -> LockError {
    LockError::permanent(
        BACKEND,
        Failure {
            what: what.into(),
            detail: detail.into(),
            source: None,
        },
    )
}

/// Whether the error says the lease does not exist (any more): revoked,
/// expired, or never granted.
pub(crate) fn is_lease_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        etcd_client::Error::GRpcStatus(s) => s.code() == Code::NotFound,
        _ => false,
    }
}

/// Whether a mapped error says the lease does not exist, e.g. a create
/// attached to a session lease that etcd already expired.
pub(crate) fn lease_gone(e: &LockError) -> bool {
    let LockError::Backend { source, .. } = e else {
        return false;
    };
    source
        .downcast_ref::<Failure>()
        .and_then(|f| f.source.as_ref())
        .is_some_and(is_lease_gone)
}

/// Whether the error is a bad user name or password, for a clear message.
pub(crate) fn is_auth_failure(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied)
                || s.code() == Code::InvalidArgument && s.message().contains("authentication")
        }
        _ => false,
    }
}

/// Whether trying the same request again may succeed.
pub(crate) fn retryable(e: &etcd_client::Error) -> bool {
    classify(e).0
}

/// Whether etcd refused the request's auth token as older than its last
/// user or role change (JWT tokens carry the auth store's revision). The
/// request was not applied; etcd-client renews only expired tokens, so the
/// client must log in again before sending it again.
pub(crate) fn stale_token(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == Code::InvalidArgument && s.message().contains("revision of auth store is old"))
}

/// Whether the request provably never reached a member: connecting
/// failed (refused, unreachable, timed out). Safe to send again even if it
/// is not idempotent.
pub(crate) fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            let m = s.message().to_ascii_lowercase();
            // Words of a failed connect only: "connect" alone would also
            // match "connection reset" or "error reading a body from
            // connection", where the request may well have been applied.
            s.code() == Code::Unavailable
                && [
                    "trying to connect",
                    "tcp connect",
                    "connection refused",
                    "dns error",
                    "tcp open",
                ]
                .iter()
                .any(|w| m.contains(w))
        }
        _ => false,
    }
}

/// (retryable, a short message). The message is the gRPC code and etcd's
/// own text, without tonic's metadata dump.
fn classify(e: &etcd_client::Error) -> (bool, String) {
    use etcd_client::Error as E;
    match e {
        // A TLS certificate the client does not trust (or that does not
        // match the host) stays untrusted: a configuration problem.
        E::GRpcStatus(s) if s.message().contains("certificate") => {
            (false, format!("{:?}: {}", s.code(), s.message()))
        }
        E::GRpcStatus(s) => {
            let retryable = matches!(
                s.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::ResourceExhausted
                    | Code::Unknown
                    | Code::Internal
                    | Code::Cancelled
            );
            let msg = if s.message().is_empty() {
                format!("{:?}", s.code())
            } else {
                format!("{:?}: {}", s.code(), s.message())
            };
            (retryable, msg)
        }
        E::TransportError(_) | E::IoError(_) | E::LeaseKeepAliveError(_) | E::WatchError(_) => {
            (true, e.to_string())
        }
        // Endpoint bookkeeping and anything internal to the client: a retry
        // goes through the same code with the same input.
        _ => (false, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, msg: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg))
    }

    #[test]
    fn retryable_by_meaning() {
        for (code, msg) in [
            (Code::Unavailable, "etcdserver: leader changed"),
            (Code::Unavailable, "etcdserver: no leader"),
            (Code::Unavailable, "etcdserver: request timed out"),
            (Code::ResourceExhausted, "etcdserver: too many requests"),
            (Code::DeadlineExceeded, "context deadline exceeded"),
        ] {
            let e = from_etcd("acquire", status(code, msg));
            assert!(e.is_retryable(), "{e}");
            assert!(e.to_string().contains(msg), "{e}");
        }
        for (code, msg) in [
            (Code::PermissionDenied, "etcdserver: permission denied"),
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
        ] {
            let e = from_etcd("acquire", status(code, msg));
            assert!(!e.is_retryable(), "{e}");
        }
        assert!(timed_out("renew", Duration::from_secs(1)).is_retryable());
        assert!(!unexpected("acquire", "odd").is_retryable());
        let e = from_etcd(
            "connect",
            status(Code::Unavailable, "invalid peer certificate: UnknownIssuer"),
        );
        assert!(!e.is_retryable(), "{e}");
        let e = from_etcd("x", etcd_client::Error::InvalidArgs("bad".into()));
        assert!(!e.is_retryable());
    }

    #[test]
    fn lease_gone_and_auth() {
        assert!(is_lease_gone(&etcd_client::Error::LeaseKeepAliveError(
            "lease not found".into()
        )));
        assert!(is_lease_gone(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
        assert!(!is_lease_gone(&status(Code::Unavailable, "x")));
        let mapped = from_etcd(
            "creating the lock key",
            status(Code::NotFound, "etcdserver: requested lease not found"),
        );
        assert!(lease_gone(&mapped));
        assert!(!lease_gone(&timed_out("x", Duration::from_secs(1))));
        assert!(is_auth_failure(&status(
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password"
        )));
        assert!(is_auth_failure(&status(Code::PermissionDenied, "x")));
        assert!(!is_auth_failure(&status(Code::Unavailable, "x")));
        assert!(not_sent(&status(Code::Unavailable, "tcp connect error")));
        assert!(!not_sent(&status(
            Code::Unavailable,
            "etcdserver: leader changed"
        )));
        assert!(!not_sent(&status(Code::Unknown, "transport error")));
        assert!(not_sent(&status(
            Code::Unavailable,
            "error trying to connect: Connection refused (os error 111)"
        )));
        // The request may have been applied before the connection broke.
        for applied_maybe in [
            "error reading a body from connection: connection reset",
            "connection error",
            "connection closed before message completed",
        ] {
            assert!(
                !not_sent(&status(Code::Unavailable, applied_maybe)),
                "{applied_maybe}"
            );
        }
    }
}
