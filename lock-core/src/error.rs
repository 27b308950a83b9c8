//! The one error type of polylock.

use std::time::Duration;

/// A boxed error from a backend's driver. Driver types never appear in public
/// signatures: a backend wraps its driver error in this box, and callers who
/// need details walk [`std::error::Error::source`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with a lock.
///
/// Input errors ([`InvalidName`](LockError::InvalidName),
/// [`InvalidTtl`](LockError::InvalidTtl), [`InvalidWait`](LockError::InvalidWait),
/// [`Config`](LockError::Config), [`ForeignLease`](LockError::ForeignLease))
/// are raised before any I/O. Messages never
/// contain secrets: backends redact passwords before building a `Config` or
/// `Backend` error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock name is not acceptable (empty, contains NUL, too long).
    #[error("invalid lock name: {reason}")]
    InvalidName {
        /// Why the name was refused.
        reason: String,
    },
    /// The TTL is zero, too large, or not representable by the backend.
    #[error("invalid TTL {ttl:?}: {reason}")]
    InvalidTtl {
        /// The TTL that was asked for.
        ttl: Duration,
        /// Why it was refused.
        reason: String,
    },
    /// The wait is too large to turn into a deadline.
    #[error("invalid wait {wait:?}: {reason}")]
    InvalidWait {
        /// The wait that was asked for.
        wait: Duration,
        /// Why it was refused.
        reason: String,
    },
    /// A URL, option or setting is wrong. The message names what and why.
    #[error("configuration error: {0}")]
    Config(String),
    /// The lock could not be taken before the wait ran out.
    #[error("timed out after {waited:?} waiting for lock {name:?}")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lease is no longer ours: it expired, was released, or was taken
    /// over. The holder must stop acting on the lock's behalf.
    #[error("lock {name:?} was lost")]
    Lost {
        /// The lock name.
        name: String,
    },
    /// The caller does not hold the lock it tried to use (for example a
    /// lease presented by another owner).
    #[error("lock {name:?} is not held by this owner")]
    NotHeld {
        /// The lock name.
        name: String,
    },
    /// The lease was granted in another [`LockSpace`](crate::LockSpace)
    /// (another backend, wire format or namespace): renew and release it
    /// through a client of the space that granted it. Raised before any
    /// I/O; no lock is touched.
    #[error(
        "the lease of lock {name:?} was granted in another lock space (another backend, \
         wire format or namespace): renew or release it through a client of the space \
         that granted it"
    )]
    ForeignLease {
        /// The lock name.
        name: String,
    },
    /// The backend cannot do this operation.
    #[error("{backend} does not support {op}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The backend.
        backend: &'static str,
    },
    /// The lock service failed. `retryable` says whether the same request may
    /// succeed if tried again (a connection reset, a timeout, a busy
    /// database) or will fail the same way (a permission error, a WRONGTYPE).
    #[error("{backend} error{}: {source}", if *.retryable { " (retryable)" } else { "" })]
    Backend {
        /// The backend.
        backend: &'static str,
        /// Whether trying again may help.
        retryable: bool,
        /// The cause, with driver details; never contains secrets.
        #[source]
        source: BoxError,
    },
}

impl LockError {
    /// A backend error that may succeed if retried.
    pub fn transient(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Backend {
            backend,
            retryable: true,
            source: source.into(),
        }
    }

    /// A backend error that will not go away by retrying.
    pub fn permanent(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Backend {
            backend,
            retryable: false,
            source: source.into(),
        }
    }

    /// Whether the operation may succeed if tried again unchanged.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LockError::Backend {
                retryable: true,
                ..
            }
        )
    }

    /// Whether this error means the lease is gone for good ([`Lost`](LockError::Lost)
    /// or [`NotHeld`](LockError::NotHeld)).
    pub fn is_lost(&self) -> bool {
        matches!(self, LockError::Lost { .. } | LockError::NotHeld { .. })
    }
}

/// Shorthand for results in polylock.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_flag_shows_in_message_and_predicate() {
        let e = LockError::transient("redis", "connection reset");
        assert!(e.is_retryable());
        assert_eq!(e.to_string(), "redis error (retryable): connection reset");
        let e = LockError::permanent("redis", "WRONGTYPE");
        assert!(!e.is_retryable());
        assert_eq!(e.to_string(), "redis error: WRONGTYPE");
        assert!(LockError::Lost { name: "a".into() }.is_lost());
        assert!(!LockError::Config("x".into()).is_lost());
    }
}
