//! Lock URL → client options. The only place ZooKeeper URLs are parsed.
//!
//! ```text
//! zk://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/CHROOT][?OPTION=VALUE&...]
//! ```
//!
//! - `USER:PASSWORD` (percent-encoded) authenticates every session of the
//!   client with ZooKeeper's `digest` scheme (`addauth digest USER:PASSWORD`).
//!   The password never appears in messages or `Debug` output. ZooKeeper
//!   accepts any digest credentials: wrong ones are a different identity,
//!   refused (a permanent "not authorized" error) by the nodes whose ACL
//!   names the right one.
//! - Several servers are separated by commas; the client moves to another
//!   one when its server goes away, keeping its session. The port defaults
//!   to 2181. IPv6 addresses go in brackets (`[::1]:2181`).
//! - `/CHROOT` is put in front of every path this client uses (created as
//!   needed), as a Java client's chroot does.
//!
//! | option            | default    | meaning |
//! |-------------------|------------|---------|
//! | `prefix`          | `polylock` | the parent path of every lock: lock `NAME` is `/{prefix}/{NAME}` |
//! | `session_timeout` | none       | one session of this timeout for every lock, whatever TTL is asked (see below) |
//! | `op_timeout`      | 5s         | time for one request, then a retryable error |
//! | `acl`             | `open`     | the ACL of every node this client creates: see [`ZkAcl`] |
//! | `idle_timeout`    | 30s        | a session with no lock, no waiter and no request for this long is closed |
//! | `follower_lag`    | 12s with several servers, else 0 | how much longer than the leader a cut-off follower may keep a session alive: taken off every lease's deadline (see below) |
//!
//! Durations follow [`lock_core::duration`]: `250ms`, `1.5s`, `2m`, `1h`,
//! `1m30s`; a bare number is milliseconds.
//!
//! # TTL and sessions
//! A lock lives as long as the session that created its node. Without
//! `session_timeout`, a client opens one session per distinct TTL asked
//! for and the server's negotiated timeout is the lease's TTL. With
//! `session_timeout`, every lock uses that one session and the TTL asked for
//! is ignored: the lease reports what the server negotiated.
//!
//! # Ensembles: `follower_lag`
//! A renewal is a read, which the server the client is connected to
//! answers by itself. A follower cut off from its leader keeps answering
//! for `syncLimit` ticks before it gives the leader up, while the leader,
//! which has not heard of the session since the cut, expires it one
//! session timeout after its last news of the session (which a client
//! idle between renewals sends only every fifth of the timeout, with its
//! pings), and another client may take the lock. A deadline counted from
//! such an answer would be late by up to about `(syncLimit + 1) ×
//! tickTime` plus a fifth of the TTL. `follower_lag` is the first part:
//! with it, every deadline this client computes loses the lag and a fifth
//! of the TTL ([`crate::clock_for`]: [`lock_core::ClockPolicy`]'s margin
//! and drift grow by them), and the shortest TTL grows with them (a TTL
//! must still be trusted past a third of it: [`crate::min_ttl_for`];
//! shorter ones are raised to it, as ZooKeeper's own minimum is).
//!
//! Set it from the ensemble's `zoo.cfg`: `(syncLimit + 1) × tickTime`. A
//! URL naming several servers defaults to [`DEFAULT_FOLLOWER_LAG`], the
//! bound of ZooKeeper's sample configuration (`tickTime=2000`,
//! `syncLimit=5`); one naming a single server defaults to zero, right for
//! a standalone server. A single address in front of an ensemble (a load
//! balancer, a Kubernetes service) or one of its members needs it set:
//! without it, the client's first session reads the server's membership
//! (`/zookeeper/config`) and, finding several servers, refuses every call
//! with a [`LockError::Config`] that says so (`follower_lag=0` accepts the
//! follower reads knowingly).

use std::fmt;
use std::time::Duration;

use lock_core::url::LockUrl;
use lock_core::LockError;
use percent_encoding::percent_decode_str;
use zookeeper_client::{Acl, Acls, Permission};

use crate::path::validate_segment;

/// The port used when a server names none.
pub const DEFAULT_PORT: u16 = 2181;
/// The default of `op_timeout`.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);
/// The default of `prefix`.
pub const DEFAULT_PREFIX: &str = "polylock";
/// The default of `follower_lag` for a URL naming several servers:
/// `(syncLimit + 1) × tickTime` with ZooKeeper's sample configuration
/// (`tickTime=2000`, `syncLimit=5`).
pub const DEFAULT_FOLLOWER_LAG: Duration = Duration::from_secs(12);

/// Options of one ZooKeeper client, parsed from a lock URL.
///
/// ```
/// use std::time::Duration;
/// use backend_zk::ZkConfig;
/// let c = ZkConfig::parse("zk://n1:2181,n2,[::1]:2182/app?prefix=locks&session_timeout=4s").unwrap();
/// assert_eq!(c.servers(), ["n1:2181", "n2:2181", "[::1]:2182"]);
/// assert_eq!(c.chroot(), "/app");
/// assert_eq!(c.prefix(), "locks");
/// assert_eq!(c.session_timeout(), Some(Duration::from_secs(4)));
/// assert!(ZkConfig::parse("zk://h?colour=blue").is_err());
/// ```
#[derive(Clone)]
pub struct ZkConfig {
    pub(crate) auth: Option<Digest>,
    pub(crate) acl: ZkAcl,
    pub(crate) idle_timeout: Duration,
    pub(crate) servers: Vec<String>,
    pub(crate) chroot: String,
    pub(crate) prefix: String,
    pub(crate) session_timeout: Option<Duration>,
    pub(crate) op_timeout: Duration,
    pub(crate) follower_lag: Duration,
    /// One server named and no `follower_lag`: the first session checks
    /// that the server is not an ensemble member.
    pub(crate) check_membership: bool,
    redacted: String,
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("url", &self.redacted)
            .field("servers", &self.servers)
            .field("chroot", &self.chroot)
            .field("prefix", &self.prefix)
            .field("session_timeout", &self.session_timeout)
            .field("op_timeout", &self.op_timeout)
            .field("user", &self.auth.as_ref().map(|d| &d.user))
            .field("acl", &self.acl)
            .field("idle_timeout", &self.idle_timeout)
            .field("follower_lag", &self.follower_lag)
            .finish()
    }
}

impl ZkConfig {
    /// Parses a `zk://` URL. Every mistake is a [`LockError::Config`] naming
    /// the (redacted) URL and what is wrong, raised before any I/O.
    pub fn parse(url: &str) -> Result<Self, LockError> {
        let u = LockUrl::parse(url, "zk://HOST[:PORT][,HOST[:PORT]...]")?;
        if u.scheme() != "zk" {
            return Err(u.error(format_args!("the scheme must be zk, not `{}`", u.scheme())));
        }
        let auth = match (u.username(), u.password()) {
            (None, _) => None,
            (Some(""), _) => return Err(u.error("the user name is empty")),
            (Some(user), _) if user.contains(':') => {
                return Err(u.error("the user name holds `:`, which digest auth cannot carry"))
            }
            (Some(_), None) => {
                return Err(u.error("digest auth needs USER:PASSWORD, the password is missing"))
            }
            (Some(user), Some(password)) => Some(Digest {
                user: user.to_string(),
                password: password.to_string(),
            }),
        };
        let bad = |why: String| u.error(why);
        let servers = u
            .hosts()
            .iter()
            .map(|h| h.endpoint(DEFAULT_PORT))
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        let chroot = u.path();
        let chroot = chroot.trim_end_matches('/');
        let chroot = if chroot.is_empty() {
            String::new()
        } else {
            let decoded = decode(chroot).map_err(|e| bad(format!("the chroot {e}")))?;
            for seg in decoded[1..].split('/') {
                validate_segment(seg).map_err(|e| bad(format!("the chroot: {e}")))?;
            }
            decoded
        };

        let mut prefix = DEFAULT_PREFIX.to_string();
        let mut session_timeout = None;
        let mut op_timeout = DEFAULT_OP_TIMEOUT;
        let mut acl = ZkAcl::Open;
        let mut idle_timeout = DEFAULT_IDLE_TIMEOUT;
        let mut follower_lag = None;
        for (key, value) in u.options() {
            let opt = |why: String| u.option_error(key, why);
            match key {
                "prefix" => {
                    let p = value.trim_matches('/');
                    if p.is_empty() {
                        return Err(opt("the prefix is empty".into()));
                    }
                    for seg in p.split('/') {
                        validate_segment(seg).map_err(opt)?;
                    }
                    if chroot.is_empty() && p.split('/').next() == Some("zookeeper") {
                        return Err(opt("/zookeeper is reserved by the server".into()));
                    }
                    prefix = p.to_string();
                }
                "session_timeout" => session_timeout = Some(u.positive_duration(key, value)?),
                "op_timeout" => op_timeout = u.positive_duration(key, value)?,
                "idle_timeout" => idle_timeout = u.positive_duration(key, value)?,
                "follower_lag" => follower_lag = Some(u.duration(key, value)?),
                "acl" => {
                    acl = match value {
                        "open" => ZkAcl::Open,
                        "creator" => ZkAcl::Creator,
                        "read" => ZkAcl::Read,
                        _ => return Err(opt("expected open, creator or read".into())),
                    }
                }
                other => {
                    return Err(u.unknown_option(
                        other,
                        "prefix, session_timeout, op_timeout, acl, idle_timeout, follower_lag",
                    ))
                }
            }
        }
        if acl != ZkAcl::Open && auth.is_none() {
            // ZooKeeper refuses an `auth` ACL from a session with no
            // identity (InvalidACL): say so before connecting.
            return Err(u.option_error(
                "acl",
                "needs credentials in the URL (zk://USER:PASSWORD@HOST...)",
            ));
        }
        let check_membership = follower_lag.is_none() && servers.len() == 1;
        let follower_lag = follower_lag.unwrap_or(if servers.len() > 1 {
            DEFAULT_FOLLOWER_LAG
        } else {
            Duration::ZERO
        });
        let redacted = u.redacted().to_string();
        Ok(ZkConfig {
            auth,
            acl,
            idle_timeout,
            servers,
            chroot,
            prefix,
            session_timeout,
            op_timeout,
            follower_lag,
            check_membership,
            redacted,
        })
    }

    /// The URL with any secret blanked, for messages.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }
    /// `host:port` of every server, ports filled in.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }
    /// The chroot (`""` for none, else `/a/b`).
    pub fn chroot(&self) -> &str {
        &self.chroot
    }
    /// The parent path of every lock, below the chroot, without slashes
    /// around it.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The fixed session timeout, if the URL set one.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.session_timeout
    }
    /// The time one request may take.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }
    /// The digest user name, if the URL has credentials (the password is
    /// not readable back).
    pub fn user(&self) -> Option<&str> {
        self.auth.as_ref().map(|d| d.user.as_str())
    }
    /// The ACL of the nodes this client creates.
    pub fn acl(&self) -> ZkAcl {
        self.acl
    }
    /// How long a session may sit unused before it is closed.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }
    /// How much later than the leader's expiry of a session a follower's
    /// answer can make a deadline: taken off every lease's deadline (see
    /// the module docs).
    pub fn follower_lag(&self) -> Duration {
        self.follower_lag
    }
    /// The ACL of the nodes this client creates, for the client library.
    pub(crate) fn acls(&self) -> Acls<'static> {
        // Creator all, world read: the Read variant's list.
        static CREATOR_ALL_ANYONE_READ: [Acl; 2] = [
            Acl::new_const(Permission::ALL, "auth", ""),
            Acl::new_const(Permission::READ, "world", "anyone"),
        ];
        match self.acl {
            ZkAcl::Open => Acls::anyone_all(),
            ZkAcl::Creator => Acls::creator_all(),
            ZkAcl::Read => Acls::new(&CREATOR_ALL_ANYONE_READ),
        }
    }
    /// The connect string for the client library (servers only: the chroot
    /// is applied by this crate, which creates it when missing).
    pub(crate) fn connect_string(&self) -> String {
        self.servers.join(",")
    }
}

/// The default of `idle_timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Digest credentials. No `Debug`: the password must not be printable.
#[derive(Clone)]
pub(crate) struct Digest {
    pub(crate) user: String,
    password: String,
}

impl Digest {
    /// The `digest` scheme's auth data, `user:password`.
    pub(crate) fn auth_data(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }
}

/// The ACL put on every node a client creates: lock nodes, the lock's
/// directory and any missing parent (as Curator's `ACLProvider` does).
///
/// ZooKeeper checks a delete against the parent's ACL, so it is the
/// directory's ACL that keeps a foreign client from deleting a lock node;
/// a directory (or prefix) created earlier by someone else keeps the ACL it
/// was given then. Give each identity a prefix or chroot of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkAcl {
    /// `acl=open`: `world:anyone:cdrwa`, anyone may do anything.
    Open,
    /// `acl=creator`: `auth::cdrwa`, only the identity of the URL's
    /// credentials may read, queue, or delete.
    Creator,
    /// `acl=read`: the creator's identity has every right, anyone else may
    /// read (so `inspect` works without credentials) but not queue or
    /// delete.
    Read,
}

fn decode(s: &str) -> Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| "is not valid UTF-8 once percent-decoded".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match ZkConfig::parse(url) {
            Err(LockError::Config(m)) => m,
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn servers_and_defaults() {
        let c = ZkConfig::parse("zk://127.0.0.1:2181").unwrap();
        assert_eq!(c.servers(), ["127.0.0.1:2181"]);
        assert_eq!(c.chroot(), "");
        assert_eq!(c.prefix(), DEFAULT_PREFIX);
        assert_eq!(c.session_timeout(), None);
        assert_eq!(c.op_timeout(), DEFAULT_OP_TIMEOUT);
        // The numbers the module docs state.
        assert_eq!(c.prefix(), "polylock");
        assert_eq!(c.op_timeout(), Duration::from_secs(5));
        assert_eq!(c.idle_timeout(), Duration::from_secs(30));
        assert_eq!(c.follower_lag(), Duration::ZERO);
        let c = ZkConfig::parse("ZK://a,b:1,[::1]/").unwrap();
        assert_eq!(c.follower_lag(), Duration::from_secs(12));
        assert_eq!(c.servers(), ["a:2181", "b:1", "[::1]:2181"]);
        assert_eq!(c.connect_string(), "a:2181,b:1,[::1]:2181");
        let c = ZkConfig::parse("zk://h/a/b/?prefix=/x/y/&op_timeout=250ms").unwrap();
        assert_eq!(c.chroot(), "/a/b");
        assert_eq!(c.prefix(), "x/y");
        assert_eq!(c.op_timeout(), Duration::from_millis(250));
    }

    #[test]
    fn mistakes_are_named() {
        assert!(err("redis://h").contains("scheme must be zk"));
        assert!(err("zk:/h").contains("expected zk://"));
        assert!(err("zk://").contains("server is empty"));
        assert!(err("zk://a,,b").contains("server is empty"));
        assert!(err("zk://h:0").contains("not a port"));
        assert!(err("zk://h:99999").contains("not a port"));
        assert!(err("zk://h#x").contains("fragment"));
        assert!(err("zk://[::1").contains("closing"));
        assert!(err("zk://h o").contains("not a host"));
        assert!(err("zk://h:1:2").contains("not a port"));
        assert!(err("zk://h//a").contains("chroot"));
        assert!(err("zk://h/a/../b").contains("chroot"));
        assert!(err("zk://h?prefix=").contains("empty"));
        assert!(err("zk://h?prefix=a//b").contains("empty"));
        assert!(err("zk://h?prefix=zookeeper").contains("reserved"));
        assert!(err("zk://h?prefix=a&prefix=b").contains("twice"));
        assert!(err("zk://h?session_timeout=0").contains("above zero"));
        assert!(err("zk://h?colour=blue").contains("unknown option `colour`"));
        assert!(err("zk://h?acl=world").contains("expected open, creator or read"));
        assert!(err("zk://h?acl=creator").contains("needs credentials"));
        assert!(err("zk://h?acl=read").contains("needs credentials"));
        assert!(err("zk://h?idle_timeout=0").contains("above zero"));
        assert!(err("zk://h?follower_lag=25h").contains("longer than a day"));
        assert!(err("zk://h?follower_lag=soon").contains("follower_lag"));
        assert!(err("zk://u@h").contains("password is missing"));
        assert!(err("zk://:secret@h").contains("user name is empty"));
        assert!(!err("zk://:secret@h").contains("secret"));
        assert!(!err("zk://u:secret@h?colour=blue").contains("secret"));
        assert!(!err("zk://u:secret@h?acl=x").contains("secret"));
    }

    #[test]
    fn follower_lag_defaults_by_the_number_of_servers() {
        let lag = |url| ZkConfig::parse(url).unwrap().follower_lag();
        assert_eq!(lag("zk://h"), Duration::ZERO);
        assert_eq!(lag("zk://a,b,c"), DEFAULT_FOLLOWER_LAG);
        assert_eq!(lag("zk://a,b,c?follower_lag=3s"), Duration::from_secs(3));
        assert_eq!(lag("zk://a,b?follower_lag=0"), Duration::ZERO);
        assert_eq!(lag("zk://lb?follower_lag=12s"), Duration::from_secs(12));
    }

    #[test]
    fn credentials_and_acls() {
        let c = ZkConfig::parse("zk://al%40ice:p%3Ass@h?acl=creator&idle_timeout=2s").unwrap();
        assert_eq!(c.user(), Some("al@ice"));
        assert_eq!(c.auth.as_ref().unwrap().auth_data(), b"al@ice:p:ss");
        assert_eq!(c.acl(), ZkAcl::Creator);
        assert_eq!(c.idle_timeout(), Duration::from_secs(2));
        assert_eq!(
            ZkConfig::parse("zk://u:pw@h?acl=read").unwrap().acl(),
            ZkAcl::Read
        );
        let c = ZkConfig::parse("zk://h").unwrap();
        assert_eq!((c.user(), c.acl()), (None, ZkAcl::Open));
        assert_eq!(c.idle_timeout(), DEFAULT_IDLE_TIMEOUT);
        let c = ZkConfig::parse("zk://alice:s3cr3t@h?acl=open").unwrap();
        for shown in [format!("{c:?}"), c.redacted_url().to_string()] {
            assert!(!shown.contains("s3cr3t"), "{shown}");
        }
        assert!(format!("{c:?}").contains("alice"));
    }
}
