//! Lock URL → client options. The only place etcd URLs are parsed.
//!
//! ```text
//! etcd://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]...][/][?OPTION=VALUE&...]
//! etcds://...                      (TLS; the same as ?tls=true)
//! ```
//!
//! - Several endpoints are separated by commas; the client balances
//!   requests over them and keeps working while a majority of the cluster
//!   is up. The port defaults to 2379. IPv6 addresses go in brackets
//!   (`[::1]:2379`).
//! - `USER:PASSWORD` authenticates with etcd's user/password auth; both
//!   are percent-decoded (`%40` for `@`, `%3A` for `:`). The password never
//!   shows in `Debug`, in errors or in logs.
//!
//! | option            | default | meaning |
//! |-------------------|---------|---------|
//! | `prefix`          | empty   | prepended to every lock's key prefix (see below) |
//! | `tls`             | `false` (`true` for `etcds://`) | connect with TLS, trusting the system roots |
//! | `ca`              | none    | a PEM file of extra trusted CA certificates (implies TLS) |
//! | `connect_timeout` | 5s      | time to reach the cluster at connect and on reconnects |
//! | `op_timeout`      | 5s      | time for one request, then a retryable error |
//!
//! Durations follow [`lock_core::duration`]: `250ms`, `1.5s`, `2m`, `1h`,
//! `1m30s`; a bare number is milliseconds.
//!
//! # Key layout
//!
//! Lock `NAME` lives under the key prefix `{prefix}NAME/`, and each
//! client's claim on it is the key `{prefix}NAME/{lease id in lowercase
//! hex}`: the layout of etcd's `clientv3/concurrency` Mutex. With the
//! default empty prefix, `etcdctl lock NAME` and Go services using
//! `concurrency.NewMutex(session, "NAME")` contend for the same lock as
//! polylock's `NAME`; with `?prefix=app/`, they must use `app/NAME`. The
//! prefix is used as given (add the trailing `/` yourself if you want one)
//! and must be valid UTF-8 without NUL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::url::LockUrl;
use lock_core::LockError;

/// The port used when an endpoint names none.
pub const DEFAULT_PORT: u16 = 2379;
/// The default of `connect_timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default of `op_timeout`.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of one etcd client, parsed from a lock URL.
///
/// `Debug` and [`redacted_url`](EtcdConfig::redacted_url) show the URL with
/// its password replaced by `***`.
///
/// ```
/// use std::time::Duration;
/// use backend_etcd::EtcdConfig;
/// let c = EtcdConfig::parse("etcd://app:hunter2@n1:2379,n2,[::1]:2380?prefix=locks/&op_timeout=2s").unwrap();
/// assert_eq!(c.endpoints(), ["n1:2379", "n2:2379", "[::1]:2380"]);
/// assert_eq!(c.prefix(), "locks/");
/// assert_eq!(c.user(), Some("app"));
/// assert_eq!(c.op_timeout(), Duration::from_secs(2));
/// assert!(!c.tls());
/// assert!(!format!("{c:?}").contains("hunter2"));
/// assert!(EtcdConfig::parse("etcd://h?colour=blue").is_err());
/// ```
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) prefix: String,
    pub(crate) tls: bool,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
    /// The URL as given, with the password blanked: for messages.
    redacted: String,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("url", &self.redacted)
            .field("endpoints", &self.endpoints)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("tls", &self.tls)
            .field("ca", &self.ca)
            .field("connect_timeout", &self.connect_timeout)
            .field("op_timeout", &self.op_timeout)
            .finish()
    }
}

impl EtcdConfig {
    /// Parses an `etcd://` or `etcds://` URL. Every mistake is a
    /// [`LockError::Config`] naming the (redacted) URL and what is wrong,
    /// raised before any I/O.
    pub fn parse(url: &str) -> Result<Self, LockError> {
        let u = LockUrl::parse(url, "etcd://HOST[:PORT][,HOST[:PORT]...]")?;
        let tls = match u.scheme() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(u.error(format_args!(
                    "the scheme must be etcd or etcds, not `{other}`"
                )))
            }
        };
        if !u.path().trim_end_matches('/').is_empty() {
            return Err(u.error("a path has no meaning here; use ?prefix= to place the lock keys"));
        }
        let (user, password) = match (u.username(), u.password()) {
            (None, _) => (None, None),
            (Some(""), _) => return Err(u.error("the user name is empty")),
            (Some(_), None) => {
                return Err(u.error("etcd auth needs a password: etcd://USER:PASSWORD@HOST"))
            }
            (Some(user), Some(pass)) => (Some(user.to_string()), Some(pass.to_string())),
        };
        let endpoints = u
            .hosts()
            .iter()
            .map(|h| h.endpoint(DEFAULT_PORT))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| u.error(e))?;

        let mut prefix = String::new();
        let mut ca = None;
        let mut tls_asked = None;
        let mut connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        let mut op_timeout = DEFAULT_OP_TIMEOUT;
        for (key, value) in u.options() {
            match key {
                "prefix" => {
                    if value.contains('\0') {
                        return Err(u.option_error(key, "the prefix contains a NUL character"));
                    }
                    prefix = value.to_string();
                }
                "tls" => {
                    tls_asked = Some(match value {
                        "true" | "1" | "yes" | "on" => true,
                        "false" | "0" | "no" | "off" => false,
                        other => {
                            return Err(
                                u.option_error(key, format_args!("`{other}` is not true or false"))
                            )
                        }
                    });
                }
                "ca" => {
                    if value.is_empty() {
                        return Err(u.option_error(key, "needs the path of a PEM file"));
                    }
                    ca = Some(PathBuf::from(value));
                }
                "connect_timeout" => connect_timeout = u.positive_duration(key, value)?,
                "op_timeout" => op_timeout = u.positive_duration(key, value)?,
                other => {
                    return Err(
                        u.unknown_option(other, "prefix, tls, ca, connect_timeout, op_timeout")
                    )
                }
            }
        }
        // A CA file means TLS, whatever the scheme; `tls=false` beside it
        // would send the password in clear text while the URL looks
        // secured, so the two together are refused.
        let tls = match (tls_asked, &ca) {
            (Some(false), Some(_)) => {
                return Err(u.error("ca= is for TLS, and tls=false turns TLS off: drop one of them"))
            }
            (_, Some(_)) => true,
            (Some(asked), None) => asked,
            (None, None) => tls,
        };
        let redacted = u.redacted().to_string();
        Ok(EtcdConfig {
            endpoints,
            user,
            password,
            prefix,
            tls,
            ca,
            connect_timeout,
            op_timeout,
            redacted,
        })
    }

    /// The endpoints, as `host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The user name, if the URL has credentials.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The string prepended to every lock's key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the client connects with TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// Time allowed to reach the cluster.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Time allowed for one request.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// The endpoints as URLs for the gRPC channel.
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match EtcdConfig::parse(url) {
            Err(LockError::Config(m)) => m,
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn endpoints_and_defaults() {
        let c = EtcdConfig::parse("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.endpoints(), ["127.0.0.1:2379"]);
        assert_eq!(c.prefix(), "");
        assert!(!c.tls());
        assert_eq!(c.user(), None);
        assert_eq!(c.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(c.endpoint_urls(), ["http://127.0.0.1:2379"]);
        let c = EtcdConfig::parse("etcd://a,b:1,[::1]/").unwrap();
        assert_eq!(c.endpoints(), ["a:2379", "b:1", "[::1]:2379"]);
        let c = EtcdConfig::parse("ETCDS://h").unwrap();
        assert!(c.tls());
        assert_eq!(c.endpoint_urls(), ["https://h:2379"]);
        assert!(EtcdConfig::parse("etcd://h?tls=true").unwrap().tls());
        assert!(!EtcdConfig::parse("etcds://h?tls=false").unwrap().tls());
        assert!(EtcdConfig::parse("etcd://h?ca=/x.pem").unwrap().tls());
        // The defaults the module docs state.
        assert_eq!(c.connect_timeout(), Duration::from_secs(5));
        assert_eq!(c.op_timeout, Duration::from_secs(5));
    }

    #[test]
    fn credentials_are_decoded_and_hidden() {
        let c = EtcdConfig::parse("etcd://us%40er:p%40ss:w@rd@h:1").unwrap();
        assert_eq!(c.user(), Some("us@er"));
        assert_eq!(c.password.as_deref(), Some("p@ss:w@rd"));
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("p@ss") && !dbg.contains("p%40ss"), "{dbg}");
        assert!(!c.redacted_url().contains("p%40ss"));
        // Errors never show the password either.
        let m = err("etcd://u:secret@h?bogus=1");
        assert!(!m.contains("secret"), "{m}");
        assert!(err("etcd://u@h").contains("needs a password"));
        assert!(err("etcd://:pw@h").contains("user name is empty"));
    }

    #[test]
    fn prefix_is_percent_decoded() {
        let c = EtcdConfig::parse("etcd://h?prefix=app%2Flocks%2F").unwrap();
        assert_eq!(c.prefix(), "app/locks/");
        let c = EtcdConfig::parse("etcd://h?prefix=%C3%A9/").unwrap();
        assert_eq!(c.prefix(), "é/");
        assert!(err("etcd://h?prefix=%00").contains("NUL"));
    }

    #[test]
    fn mistakes_are_named() {
        assert!(err("redis://h").contains("scheme must be etcd"));
        assert!(err("etcd:/h").contains("expected etcd://"));
        assert!(err("etcd://").contains("endpoint is empty"));
        assert!(err("etcd://a,,b").contains("endpoint is empty"));
        assert!(err("etcd://h:0").contains("not a port"));
        assert!(err("etcd://h:99999").contains("not a port"));
        assert!(err("etcd://h:x").contains("not a port"));
        assert!(err("etcd://h/path").contains("?prefix="));
        assert!(err("etcd://h#frag").contains("fragment"));
        assert!(err("etcd://[::1").contains("closing"));
        assert!(err("etcd://h?tls=maybe").contains("not true or false"));
        // Whatever the order: no plain text with a CA given.
        for url in [
            "etcd://h?ca=/ca.pem&tls=false",
            "etcd://h?tls=false&ca=/ca.pem",
        ] {
            assert!(err(url).contains("drop one of them"), "{url}");
        }
        assert!(err("etcd://h?op_timeout=0").contains("above zero"));
        assert!(err("etcd://h?op_timeout=2d").contains("unknown unit"));
        assert!(err("etcd://h?prefix=a&prefix=b").contains("twice"));
        assert!(err("etcd://h?colour=blue").contains("unknown option `colour`"));
        assert!(err("etcd://h o").contains("not a host"));
    }

    #[test]
    fn durations() {
        let c = EtcdConfig::parse("etcd://h?connect_timeout=250ms&op_timeout=3").unwrap();
        assert_eq!(c.connect_timeout(), Duration::from_millis(250));
        assert_eq!(c.op_timeout(), Duration::from_millis(3));
    }
}
