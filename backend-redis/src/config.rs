//! The one place a Redis lock URL is parsed.
//!
//! ```text
//! redis://[user][:password@]host[:port][/db][?options]
//! rediss://[user][:password@]host[:port][/db][?options]        (TLS)
//! redis+cluster://[user][:password@]host:port,host:port,...[?options]
//! ```
//!
//! Options (query parameters):
//! - `format=plain|redisson`: the wire format (see [`Format`]); default `plain`.
//! - `prefix=TEXT`: prepended to the lock key of the `plain` format; none by
//!   default, so the key is the lock name itself, as other clients use it.
//!   Not allowed with `format=redisson`, whose keys are the lock name.
//! - `wait_replicas=N&wait_timeout=DURATION`: after each acquire, `WAIT N MS`; an
//!   acquire that fewer than N replicas acknowledged in time is undone and
//!   reported as a retryable error. Off by default.
//! - `op_timeout=DURATION` (also `timeout=`): how long one command may go
//!   unanswered before the connection is considered dead and replaced;
//!   default 2s.
//!
//! Durations follow [`lock_core::duration`]: `250ms`, `1.5s`, `2m`, `1h`,
//! `1m30s`; a bare number is milliseconds.
//! - `fair=true|false`: fair mode (`plain` format only), default `false`:
//!   waiters queue on the server in arrival order and the releaser wakes
//!   the oldest one alone; see [`RedisConfig::fair`].
//! - `ca=PATH` (also `tls_ca=`; `rediss://` only): a PEM file of the CA certificates to
//!   trust instead of the system's.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::url::{LockUrl, UrlHost};
use lock_core::LockError;

/// How a lock is stored in Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Format {
    /// A string key whose value is the owner token: the layout of redis-py's
    /// `Lock`, redsync and node-redlock, so a `SET key value NX PX` lock taken
    /// by any of them excludes ours and ours excludes theirs.
    ///
    /// The lock key is `NAME` itself (`PREFIX NAME` with `prefix=`), the key
    /// those clients use for a lock of that name. What polylock keeps beside
    /// it lives in the `__polylock__:` namespace, in the lock key's Redis
    /// Cluster slot (whatever braces the name has): the hash
    /// `__polylock__:{TAG}[:KEY]` (fields `fence`, the fencing counter, and
    /// `owner`, the token of the last polylock grant) and the release
    /// channel `__polylock__:released:{TAG}[:KEY]`; see
    /// [`RedisBackend::keys`](crate::RedisBackend::keys).
    #[default]
    Plain,
    /// Redisson's `RLock` layout: a hash at key NAME whose field
    /// `UUID:THREAD` holds the hold count, an expiry on the hash, the
    /// message `0` on channel `redisson_lock__channel:{NAME}` at unlock, and
    /// the fencing counter `redisson_lock_token:{NAME}`. Holds are counted on
    /// the server, as Redisson does.
    Redisson,
}

impl Format {
    /// The name used in URLs.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Plain => "plain",
            Format::Redisson => "redisson",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which lock algorithm a URL selects: its scheme says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Algorithm {
    /// One lock key on one server or one cluster shard: `redis://`,
    /// `rediss://`, `redis+cluster://` ([`RedisBackend`](crate::RedisBackend)).
    SingleInstance,
    /// A majority of independent servers: `redlock://`
    /// ([`RedlockBackend`](crate::RedlockBackend)).
    Redlock,
}

impl Algorithm {
    /// Both, for tables and tests.
    pub const ALL: [Algorithm; 2] = [Algorithm::SingleInstance, Algorithm::Redlock];

    /// The algorithm of a URL scheme of [`URL_SCHEMES`](crate::URL_SCHEMES)
    /// (case-insensitive).
    pub fn of_scheme(scheme: &str) -> Option<Algorithm> {
        match scheme.to_ascii_lowercase().as_str() {
            "redis" | "rediss" | "redis+cluster" => Some(Algorithm::SingleInstance),
            "redlock" => Some(Algorithm::Redlock),
            _ => None,
        }
    }
}

/// The default key prefix of the `plain` format: none, so that the lock
/// key is the lock name, as redis-py, redsync and node-redlock have it.
pub const DEFAULT_PREFIX: &str = "";

/// The default for `op_timeout=`.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);

/// The default for `wait_timeout=`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(100);

/// One server address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// A parsed Redis lock URL.
///
/// `Debug` and [`redacted_url`](RedisConfig::redacted_url) show the URL with the password
/// replaced by `***`; the password itself is never printed.
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) nodes: Vec<Node>,
    pub(crate) cluster: bool,
    pub(crate) tls: bool,
    pub(crate) tls_ca: Option<PathBuf>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
    pub(crate) format: Format,
    pub(crate) prefix: String,
    pub(crate) wait_replicas: Option<u32>,
    pub(crate) wait_timeout: Duration,
    pub(crate) timeout: Duration,
    pub(crate) fair: bool,
    redacted: String,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted)
            .field("format", &self.format)
            .field("prefix", &self.prefix)
            .field("db", &self.db)
            .field("cluster", &self.cluster)
            .field("tls", &self.tls)
            .field("wait_replicas", &self.wait_replicas)
            .field("timeout", &self.timeout)
            .field("fair", &self.fair)
            .finish_non_exhaustive()
    }
}

const OPTIONS: &str = "format, prefix, wait_replicas, wait_timeout, op_timeout, fair, ca";

/// Old spellings, still read.
const ALIASES: &[(&str, &str)] = &[("timeout", "op_timeout"), ("tls_ca", "ca")];

impl RedisConfig {
    /// Parses a `redis://`, `rediss://` or `redis+cluster://` URL. Every
    /// mistake is a [`LockError::Config`] naming it, raised before any I/O.
    ///
    /// ```
    /// use backend_redis::{Format, RedisConfig};
    /// let c = RedisConfig::parse("redis://:s3cret@cache:6380/2?format=redisson").unwrap();
    /// assert_eq!(c.format(), Format::Redisson);
    /// assert_eq!(c.db(), 2);
    /// assert!(!format!("{c:?}").contains("s3cret"));
    /// assert!(RedisConfig::parse("redis://cache/x").is_err());
    /// ```
    pub fn parse(url: &str) -> Result<RedisConfig, LockError> {
        let u = LockUrl::parse(url, "redis://, rediss:// or redis+cluster://")?;
        let (cluster, tls) = match u.scheme() {
            "redis" => (false, false),
            "rediss" => (false, true),
            "redis+cluster" => (true, false),
            other => {
                return Err(u.error(format_args!(
                    "unknown scheme `{other}`; expected redis, rediss or redis+cluster"
                )))
            }
        };
        let (username, password) = credentials(&u);
        let nodes: Vec<Node> = u.hosts().iter().map(Node::from).collect();
        if !cluster && nodes.len() > 1 {
            return Err(u.error(
                "several hosts need the redis+cluster:// scheme (one cluster) or redlock:// (independent nodes)",
            ));
        }
        let db = database(&u)?;
        if cluster && db != 0 {
            return Err(u.error("Redis Cluster has only database 0"));
        }

        let mut cfg = RedisConfig {
            nodes,
            cluster,
            tls,
            tls_ca: None,
            username,
            password,
            db,
            format: Format::Plain,
            prefix: DEFAULT_PREFIX.to_string(),
            wait_replicas: None,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            timeout: DEFAULT_OP_TIMEOUT,
            fair: false,
            redacted: u.redacted().to_string(),
        };
        let mut prefix_given = false;
        let mut wait_timeout_given = false;
        for (key, value) in u.options_with_aliases(ALIASES)? {
            match key {
                "format" => {
                    cfg.format = match value {
                        "plain" => Format::Plain,
                        "redisson" => Format::Redisson,
                        other => {
                            return Err(u.option_error(
                                key,
                                format_args!("format must be plain or redisson, not `{other}`"),
                            ))
                        }
                    }
                }
                "prefix" => {
                    cfg.prefix = value.to_string();
                    prefix_given = true;
                }
                "wait_replicas" => {
                    let n: u32 = value.parse().map_err(|_| {
                        u.option_error(key, format_args!("a whole number, not `{value}`"))
                    })?;
                    cfg.wait_replicas = (n > 0).then_some(n);
                }
                "wait_timeout" => {
                    cfg.wait_timeout = u.positive_duration(key, value)?;
                    wait_timeout_given = true;
                }
                "op_timeout" => cfg.timeout = u.positive_duration(key, value)?,
                "fair" => {
                    cfg.fair = match value {
                        "true" => true,
                        "false" => false,
                        other => {
                            return Err(u.option_error(
                                key,
                                format_args!("fair must be true or false, not `{other}`"),
                            ))
                        }
                    }
                }
                "ca" => {
                    if !tls {
                        return Err(u.error("ca (tls_ca) needs the rediss:// scheme"));
                    }
                    cfg.tls_ca = Some(PathBuf::from(value));
                }
                other => return Err(u.unknown_option(other, OPTIONS)),
            }
        }
        if cfg.format == Format::Redisson && prefix_given {
            return Err(u.error(
                "prefix does not apply to format=redisson: Redisson's keys are the lock name itself",
            ));
        }
        if cfg.format == Format::Redisson && cfg.fair {
            return Err(u.error(
                "fair=true needs format=plain: Redisson clients do not know polylock's queue of waiters",
            ));
        }
        if wait_timeout_given && cfg.wait_replicas.is_none() {
            return Err(u.error("wait_timeout needs wait_replicas"));
        }
        Ok(cfg)
    }

    /// A single-server, `plain`-format configuration for one node of a
    /// Redlock set: the set's credentials, database, prefix and per-node
    /// timeout, so each node is spoken to exactly as `redis://` would.
    pub(crate) fn redlock_node(
        node: Node,
        username: Option<String>,
        password: Option<String>,
        db: i64,
        prefix: String,
        timeout: Duration,
    ) -> RedisConfig {
        let redacted = if node.host.contains(':') {
            format!("redis://[{}]:{}/{db}", node.host, node.port)
        } else {
            format!("redis://{}:{}/{db}", node.host, node.port)
        };
        RedisConfig {
            nodes: vec![node],
            cluster: false,
            tls: false,
            tls_ca: None,
            username,
            password,
            db,
            format: Format::Plain,
            prefix,
            wait_replicas: None,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            timeout,
            fair: false,
            redacted,
        }
    }

    /// The URL with the password redacted.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// Whether waiters are served in arrival order (`?fair=true`).
    ///
    /// Each waiter of a lock joins a queue on the server (a sorted set
    /// beside the lock's bookkeeping, in its cluster slot) with a deadline
    /// that each of its attempts pushes on; an attempt is granted only when
    /// the lock is free and no older live waiter is queued, in one script.
    /// The releaser grants the lock to the oldest live waiter and tells it
    /// alone, on that waiter's own channel (a waiter not heard from for a
    /// second is only woken to try). Such a grant is for a claim window of
    /// 2 s (or the TTL, if shorter), which the new holder's first renewal
    /// extends to its TTL: a waiter that crashed just after its last
    /// attempt leaves the lock to nobody for that window, not a whole TTL.
    /// A waiter that crashed leaves the queue at its deadline (twice the
    /// operation timeout, at least 2 s), a cancelled one at once (best
    /// effort). `try_acquire` never jumps the queue.
    ///
    /// Fairness holds among polylock clients in fair mode on the same
    /// lock: foreign clients (redis-py, redsync, ...) and polylock clients
    /// without `fair=true` do not know the queue and take a free lock when
    /// they see one; a foreign holder is waited for as without fair mode.
    pub fn fair(&self) -> bool {
        self.fair
    }

    /// The wire format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The key prefix of the `plain` format (unused by `redisson`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The database number (always 0 on a cluster).
    pub fn db(&self) -> i64 {
        self.db
    }

    /// Whether this is a Redis Cluster URL.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// Replicas that must acknowledge an acquire (`WAIT`), if any.
    pub fn wait_replicas(&self) -> Option<u32> {
        self.wait_replicas
    }

    /// How long an acquire waits for the replicas.
    pub fn wait_timeout(&self) -> Duration {
        self.wait_timeout
    }

    /// How long one command may go unanswered.
    pub fn op_timeout(&self) -> Duration {
        self.timeout
    }

    /// Removes every occurrence of the password from `text`, for messages
    /// built from driver errors (which should not contain it, but a message
    /// is no place to find out).
    pub(crate) fn scrub(&self, text: String) -> String {
        match &self.password {
            Some(p) if p.len() >= 3 => text.replace(p.as_str(), "***"),
            _ => text,
        }
    }
}

/// The user name and password of a Redis URL: an empty user name (as in
/// `redis://:pw@host`, password-only AUTH) or password means none.
pub(crate) fn credentials(u: &LockUrl) -> (Option<String>, Option<String>) {
    let user = u.username().filter(|s| !s.is_empty()).map(str::to_string);
    let pass = u.password().filter(|s| !s.is_empty()).map(str::to_string);
    (user, pass)
}

/// The database number a Redis URL's path names (`/2`); 0 without one.
pub(crate) fn database(u: &LockUrl) -> Result<i64, LockError> {
    let p = u.path().trim_end_matches('/');
    if p.is_empty() {
        return Ok(0);
    }
    let digits = &p[1..];
    match digits.parse::<i64>() {
        Ok(n) if n >= 0 && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        // An '@' in the path: a password with an unencoded '/' was cut
        // there, and the path holds its tail, so it is not quoted.
        _ if p.contains('@') => Err(u.error(
            "the path must be a database number, like /0; a password containing `/` must \
             percent-encode it (`%2F`)",
        )),
        _ => Err(u.error(format_args!(
            "the path must be a database number, like /0; got `{p}`"
        ))),
    }
}

impl From<&UrlHost> for Node {
    fn from(h: &UrlHost) -> Node {
        Node {
            host: h.host.clone(),
            port: h.port.unwrap_or(6379),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match RedisConfig::parse(url) {
            Err(LockError::Config(m)) => m,
            other => panic!("{url}: expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn parses_single_node_urls() {
        let c = RedisConfig::parse("redis://127.0.0.1:7000").unwrap();
        assert_eq!(
            c.nodes,
            vec![Node {
                host: "127.0.0.1".into(),
                port: 7000
            }]
        );
        assert_eq!(
            (c.db, c.format, c.prefix.as_str()),
            (0, Format::Plain, DEFAULT_PREFIX)
        );
        assert!(!c.cluster && !c.tls);
        // The defaults the module docs state.
        assert_eq!(c.op_timeout(), Duration::from_secs(2));
        assert_eq!(c.wait_replicas, None);
        assert!(!c.fair());
        assert_eq!(DEFAULT_PREFIX, "");
        let c = RedisConfig::parse("redis://app:p%40ss@cache/3").unwrap();
        assert_eq!(c.username.as_deref(), Some("app"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!((c.nodes[0].port, c.db), (6379, 3));
        let c = RedisConfig::parse("rediss://[::1]:6390/?prefix=x:&timeout=50").unwrap();
        assert!(c.tls);
        assert_eq!(c.nodes[0].host, "::1");
        assert_eq!(
            (c.prefix.as_str(), c.timeout),
            ("x:", Duration::from_millis(50))
        );
        let c = RedisConfig::parse("redis://h?wait_replicas=1&wait_timeout=250").unwrap();
        assert_eq!(c.wait_replicas, Some(1));
        assert_eq!(c.wait_timeout, Duration::from_millis(250));
    }

    #[test]
    fn parses_cluster_urls() {
        let c = RedisConfig::parse("redis+cluster://:pw@a:1,b:2,c:3?format=redisson").unwrap();
        assert!(c.cluster);
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.format, Format::Redisson);
        assert!(err("redis+cluster://a:1,b:2/1").contains("database 0"));
        assert!(err("redis://a:1,b:2").contains("redis+cluster"));
    }

    #[test]
    fn refuses_mistakes_with_clear_messages() {
        assert!(err("redis://h/x").contains("database number"));
        assert!(err("redis://h/-1").contains("database number"));
        // A password with an unencoded '/' whose head looks like a port:
        // the "path" is the password's tail, never shown.
        let m = err("redis://user:6379/s3cret@host");
        assert!(m.contains("%2F") && !m.contains("s3cret"), "{m}");
        assert!(err("redis://h:99999").contains("port"));
        assert!(err("redis://h:0").contains("port"));
        assert!(err("redis://h?format=json").contains("plain or redisson"));
        assert!(err("redis://h?formt=plain").contains("unknown option `formt`"));
        assert!(err("redis://h?format=redisson&prefix=a").contains("redisson"));
        assert!(err("redis://h?fair=yes").contains("true or false"));
        assert!(err("redis://h?format=redisson&fair=true").contains("format=plain"));
        assert!(RedisConfig::parse("redis://h?fair=true").unwrap().fair());
        assert!(!RedisConfig::parse("redis://h?fair=false").unwrap().fair());
        assert!(!RedisConfig::parse("redis://h").unwrap().fair());
        assert!(RedisConfig::parse("redis+cluster://a:1,b:2?fair=true")
            .unwrap()
            .fair());
        assert!(err("redis://h?wait_timeout=5").contains("wait_replicas"));
        assert!(err("redis://h?timeout=0").contains("above zero"));
        assert!(err("redis://h?timeout=2d").contains("unknown unit"));
        assert!(err("redis://h?tls_ca=/x").contains("rediss"));
        assert!(err("redis://h?timeout=1&timeout=2").contains("twice"));
        assert!(err("http://h").contains("unknown scheme"));
        assert!(err("redis://h#insecure").contains("fragment"));
        assert!(err("redis://").contains("host"));
    }

    #[test]
    fn option_names_shared_with_other_backends_and_old_spellings() {
        let c = RedisConfig::parse("rediss://h?op_timeout=1.5s&ca=/etc/ca.pem").unwrap();
        assert_eq!(c.op_timeout(), Duration::from_millis(1500));
        assert_eq!(
            c.tls_ca.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        let c = RedisConfig::parse("rediss://h?timeout=40&tls_ca=/x").unwrap();
        assert_eq!(c.op_timeout(), Duration::from_millis(40));
        assert_eq!(c.tls_ca.as_deref(), Some(std::path::Path::new("/x")));
        assert!(err("redis://h?timeout=1s&op_timeout=2s").contains("given twice"));
        assert!(err("rediss://h?tls_ca=/x&ca=/y").contains("given twice"));
        assert!(err("redis://h?ca=/x").contains("rediss"));
    }

    #[test]
    fn never_shows_the_password() {
        let url = "redis://u:hunter2@h:1/0?timeout=oops";
        let m = err(url);
        assert!(!m.contains("hunter2"), "{m}");
        let c = RedisConfig::parse("redis://u:hunter2@h:1/0").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!c.redacted_url().contains("hunter2"));
        assert_eq!(c.scrub("auth hunter2 failed".into()), "auth *** failed");
    }
}
