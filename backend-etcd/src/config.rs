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
//! Durations are `250ms`, `2s`, `1m`, `500us`, or a bare number of
//! milliseconds.
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

use lock_core::options::positive_duration;
use lock_core::{redact_url, LockError};
use percent_encoding::percent_decode_str;

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
        let redacted = redact_url(url);
        let bad = |why: String| LockError::Config(format!("`{redacted}`: {why}"));

        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected etcd://HOST[:PORT][,HOST[:PORT]...]".into()))?;
        let mut tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(bad(format!(
                    "the scheme must be etcd or etcds, not `{other}`"
                )))
            }
        };
        if rest.contains('#') {
            return Err(bad("a fragment (#...) has no meaning here".into()));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let authority = match before_query.find('/') {
            Some(slash) => {
                if !before_query[slash..].trim_end_matches('/').is_empty() {
                    return Err(bad(
                        "a path has no meaning here; use ?prefix= to place the lock keys".into(),
                    ));
                }
                &before_query[..slash]
            }
            None => before_query,
        };
        // Credentials end at the last '@': a password may itself contain '@'.
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (u, p) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let u = decode(u).map_err(|e| bad(format!("the user name {e}")))?;
                if u.is_empty() {
                    return Err(bad("the user name is empty".into()));
                }
                let p = match p {
                    Some(p) => decode(p).map_err(|e| bad(format!("the password {e}")))?,
                    None => {
                        return Err(bad(
                            "etcd auth needs a password: etcd://USER:PASSWORD@HOST".into()
                        ))
                    }
                };
                (Some(u), Some(p))
            }
        };
        let endpoints = hosts
            .split(',')
            .map(parse_endpoint)
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;

        let mut prefix = String::new();
        let mut ca = None;
        let mut connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        let mut op_timeout = DEFAULT_OP_TIMEOUT;
        let mut seen = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(value).map_err(|e| bad(format!("option `{key}` {e}")))?;
            if seen.contains(&key) {
                return Err(bad(format!("option `{key}` is given twice")));
            }
            seen.push(key);
            let opt = |why: String| bad(format!("option `{key}`: {why}"));
            match key {
                "prefix" => {
                    if value.contains('\0') {
                        return Err(opt("the prefix contains a NUL character".into()));
                    }
                    prefix = value;
                }
                "tls" => {
                    tls = match value.as_str() {
                        "true" | "1" | "yes" | "on" => true,
                        "false" | "0" | "no" | "off" => false,
                        other => return Err(opt(format!("`{other}` is not true or false"))),
                    }
                }
                "ca" => {
                    if value.is_empty() {
                        return Err(opt("needs the path of a PEM file".into()));
                    }
                    ca = Some(PathBuf::from(value));
                    tls = true;
                }
                "connect_timeout" => connect_timeout = positive_duration(&value).map_err(opt)?,
                "op_timeout" => op_timeout = positive_duration(&value).map_err(opt)?,
                other => {
                    return Err(bad(format!(
                        "unknown option `{other}` (known: prefix, tls, ca, connect_timeout, \
                         op_timeout)"
                    )))
                }
            }
        }
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

/// `host[:port]` or `[v6]:port`, with the default port filled in.
fn parse_endpoint(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("an endpoint is empty (expected HOST[:PORT], comma-separated)".into());
    }
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("`{s}`: an IPv6 address needs a closing `]`"))?;
        if addr.is_empty() {
            return Err(format!("`{s}`: empty IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("`{s}`: expected `:PORT` after `]`"))?,
            ),
        };
        (format!("[{addr}]"), port)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    if host.is_empty()
        || !host.starts_with('[')
            && !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(format!("`{s}` is not a host name or address"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(format!("`{s}`: `{p}` is not a port number")),
        },
    };
    Ok(format!("{host}:{port}"))
}

fn decode(s: &str) -> Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| "is not valid UTF-8 once percent-decoded".to_string())
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
        assert!(err("etcd://h?op_timeout=0").contains("above zero"));
        assert!(err("etcd://h?op_timeout=2h").contains("unknown unit"));
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
