//! Driver errors → [`LockError`], with the retryable flag decided once here.

use std::time::Duration;

use lock_core::LockError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::config::RedisConfig;

/// The backend name in errors and guarantees.
pub(crate) const BACKEND: &str = "redis";

/// A Redis failure, as text: the driver's error type stays out of our
/// public API, and the text has been scrubbed of the password.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RedisFailure(pub(crate) String);

/// Why one command failed: the server or driver said so, or it went
/// unanswered for too long.
#[derive(Debug)]
pub(crate) enum Fail {
    Redis(RedisError),
    Timeout(Duration),
}

impl From<RedisError> for Fail {
    fn from(e: RedisError) -> Self {
        Fail::Redis(e)
    }
}

/// Whether sending the same request again may succeed.
///
/// Retryable: the connection (I/O errors, resets, refusals, timeouts) and
/// the server's transient states — a script running too long (`BUSY`),
/// loading its data set (`LOADING`), cluster slots moving or the cluster
/// being down (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`), a
/// failover that demoted the node we write to (`READONLY`).
///
/// Not retryable: everything that will fail the same way — a key of the
/// wrong type (`WRONGTYPE`), authentication and permissions (`NOAUTH`,
/// `WRONGPASS`, `NOPERM`), a bad database index, a malformed reply.
pub(crate) fn is_retryable(e: &RedisError) -> bool {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    match e.kind() {
        ErrorKind::Server(kind) => matches!(
            kind,
            ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::ReadOnly
        ),
        ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Extension => matches!(e.code(), Some("BUSY")),
        _ => false,
    }
}

/// `fail` while doing `what` → a [`LockError::Backend`] with the right
/// retryable flag and a message that names the operation and never the
/// password.
pub(crate) fn to_lock_error(cfg: &RedisConfig, what: &str, fail: Fail) -> LockError {
    FailText::new(cfg, &fail).error(what)
}

/// A failure's scrubbed message and retryability, kept apart from the
/// failure itself so that one failed request can become the error of each
/// lease it carried (a batch renew).
pub(crate) struct FailText {
    retryable: bool,
    text: String,
}

impl FailText {
    pub(crate) fn new(cfg: &RedisConfig, fail: &Fail) -> Self {
        match fail {
            Fail::Timeout(after) => FailText {
                retryable: true,
                text: cfg.scrub(format!(
                    "no reply from {} within {after:?}; the connection is being replaced",
                    cfg.redacted_url()
                )),
            },
            Fail::Redis(e) => {
                let hint = match e.code() {
                    Some("WRONGTYPE") => " (the key exists but is not a lock of this format; it was left untouched)",
                    Some("NOAUTH") | Some("WRONGPASS") => " (check the user name and password in the URL)",
                    Some("NOPERM") => " (the user lacks an ACL permission this backend needs: EVALSHA, SCRIPT, PUBLISH, SUBSCRIBE and the lock keys)",
                    _ => "",
                };
                FailText {
                    retryable: is_retryable(e),
                    text: cfg.scrub(format!("{e}{hint}")),
                }
            }
        }
    }

    /// The error of `what` failing this way.
    pub(crate) fn error(&self, what: &str) -> LockError {
        let failure = RedisFailure(format!("{what}: {}", self.text));
        if self.retryable {
            LockError::transient(BACKEND, failure)
        } else {
            LockError::permanent(BACKEND, failure)
        }
    }
}

/// A failure to connect → the error a caller of `connect` sees: a clear
/// [`LockError::Config`] for what only the URL can fix (database index,
/// credentials, TLS files), a [`LockError::Backend`] otherwise.
pub(crate) fn connect_error(cfg: &RedisConfig, fail: Fail) -> LockError {
    if let Fail::Redis(e) = &fail {
        let text = e.to_string();
        if text.contains("DB index is out of range") {
            return LockError::Config(format!(
                "`{}`: the server has no database {} (it has fewer; see its `databases` setting)",
                cfg.redacted_url(),
                cfg.db()
            ));
        }
        let auth = matches!(e.kind(), ErrorKind::AuthenticationFailed)
            || matches!(e.code(), Some("NOAUTH") | Some("WRONGPASS"));
        if auth {
            return LockError::Config(cfg.scrub(format!(
                "`{}`: the server refused the credentials: {e}",
                cfg.redacted_url()
            )));
        }
        if text.contains("invalid peer certificate") {
            // Retrying will not make the server's certificate trusted.
            return LockError::Config(cfg.scrub(format!(
                "`{}`: the server's TLS certificate was refused ({e}); pass the CA that \
                 signed it with tls_ca=PATH, and check that it names the host in the URL",
                cfg.redacted_url()
            )));
        }
        if matches!(e.kind(), ErrorKind::InvalidClientConfig) {
            return LockError::Config(cfg.scrub(format!("`{}`: {e}", cfg.redacted_url())));
        }
    }
    to_lock_error(cfg, &format!("connecting to {}", cfg.redacted_url()), fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(is_retryable(&io));
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(is_retryable(&timeout));
        let client = RedisError::from((ErrorKind::Client, "bad"));
        assert!(!is_retryable(&client));
        let cfg = RedisConfig::parse("redis://u:sekrit@h").unwrap();
        let e = to_lock_error(&cfg, "acquire", Fail::Timeout(Duration::from_secs(1)));
        assert!(e.is_retryable());
        assert!(!e.to_string().contains("sekrit"), "{e}");
    }
}
