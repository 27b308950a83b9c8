//! The one place a Redlock URL is parsed.
//!
//! ```text
//! redlock://[user][:password@]host:port,host:port,host:port[,...][/db][?options]
//! ```
//!
//! At least three hosts, each an independent Redis master (not replicas of
//! one another, not one cluster); every host gets the same credentials and
//! database. One server listed twice would count twice toward a majority,
//! so it is refused: the same address in any spelling when the URL is
//! parsed, two names of one server (its `run_id`) when the nodes connect. Options (query parameters, durations as everywhere in
//! polylock, see [`lock_core::duration`]; a bare number is milliseconds):
//! - `op_timeout=DURATION` (also `timeout=`): how long one node may take to answer one request
//!   before it counts as failed for that request; default 100ms. Keep it
//!   small against the TTL: a request waits for every node up to this long.
//! - `drift_factor=F` and `drift=DURATION`: the clock drift allowed for,
//!   `ttl x F + drift`, taken off every lease's validity; defaults 0.01 and
//!   2ms (the values of the Redlock description and node-redlock).
//! - `retry_delay=DURATION`: the longest pause between two attempts of a
//!   waiting acquire when no release message comes (a holder that expired,
//!   a foreign client's release); each pause is random (jittered), so that
//!   contending clients do not retry in lockstep; default 200ms.
//! - `prefix=TEXT`: prepended to the lock key, as for `redis://`.

use std::fmt;
use std::time::Duration;

use lock_core::url::LockUrl;
use lock_core::LockError;

use crate::config::{credentials, database, Node, RedisConfig, DEFAULT_PREFIX};

/// The default for `op_timeout=`.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);
/// The default for `drift_factor=`.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// The default for `drift=`.
pub const DEFAULT_DRIFT: Duration = Duration::from_millis(2);
/// The default for `retry_delay=`.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(200);
/// The fewest nodes a Redlock set may have: with fewer, one failure is
/// already a lost majority.
pub const MIN_NODES: usize = 3;

/// `host` as the server it names, for telling one node listed twice: host
/// names are case-insensitive and may end in the root's dot, and one
/// address has many spellings (`::1` and `0:0::1`, `::ffff:10.0.0.1` and
/// `10.0.0.1`). Names that resolve to one server are told apart when the
/// nodes connect (their `run_id`).
fn same_host(host: &str) -> String {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_canonical().to_string(),
        Err(_) => host.trim_end_matches('.').to_ascii_lowercase(),
    }
}

const OPTIONS: &str = "op_timeout, drift_factor, drift, retry_delay, prefix";

/// Old spellings, still read.
const ALIASES: &[(&str, &str)] = &[("timeout", "op_timeout")];

/// A parsed `redlock://` URL.
///
/// `Debug` and [`redacted_url`](RedlockConfig::redacted_url) show the URL with the password
/// replaced by `***`.
#[derive(Clone)]
pub struct RedlockConfig {
    pub(crate) nodes: Vec<RedisConfig>,
    pub(crate) timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) drift: Duration,
    pub(crate) retry_delay: Duration,
    redacted: String,
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("url", &self.redacted)
            .field("nodes", &self.nodes.len())
            .field("timeout", &self.timeout)
            .field("drift_factor", &self.drift_factor)
            .field("drift", &self.drift)
            .field("retry_delay", &self.retry_delay)
            .finish_non_exhaustive()
    }
}

impl RedlockConfig {
    /// Parses a `redlock://` URL. Every mistake, fewer than three hosts
    /// among them, is a [`LockError::Config`] naming it, raised before any
    /// I/O.
    ///
    /// ```
    /// use backend_redis::RedlockConfig;
    /// let c = RedlockConfig::parse("redlock://:pw@a:1,b:2,c:3?timeout=50ms").unwrap();
    /// assert_eq!(c.node_count(), 3);
    /// assert_eq!(c.quorum(), 2);
    /// assert!(!format!("{c:?}").contains("pw"));
    /// assert!(RedlockConfig::parse("redlock://a:1,b:2").is_err());
    /// ```
    pub fn parse(url: &str) -> Result<RedlockConfig, LockError> {
        let u = LockUrl::parse(url, "redlock://host:port,host:port,host:port")?;
        if u.scheme() != "redlock" {
            return Err(u.error(format_args!(
                "unknown scheme `{}`; expected redlock",
                u.scheme()
            )));
        }
        let (username, password) = credentials(&u);
        let mut nodes = Vec::new();
        let mut seen = Vec::new();
        for host in u.hosts() {
            let node = Node::from(host);
            let key = (same_host(&node.host), node.port);
            if seen.contains(&key) {
                return Err(u.error(format_args!(
                    "`{}:{}` is listed twice: Redlock needs independent nodes, and one node \
                     counted twice would make a minority look like a majority",
                    node.host, node.port
                )));
            }
            seen.push(key);
            nodes.push(node);
        }
        if nodes.len() < MIN_NODES {
            return Err(u.error(format_args!(
                "Redlock needs at least {MIN_NODES} independent nodes (an odd number, like 3 or \
                 5, is best); got {}",
                nodes.len()
            )));
        }
        let db = database(&u)?;

        let mut timeout = DEFAULT_NODE_TIMEOUT;
        let mut drift_factor = DEFAULT_DRIFT_FACTOR;
        let mut drift = DEFAULT_DRIFT;
        let mut retry_delay = DEFAULT_RETRY_DELAY;
        let mut prefix = DEFAULT_PREFIX.to_string();
        for (key, value) in u.options_with_aliases(ALIASES)? {
            match key {
                "op_timeout" => timeout = u.positive_duration(key, value)?,
                "drift" => drift = u.duration(key, value)?,
                "retry_delay" => retry_delay = u.positive_duration(key, value)?,
                "prefix" => prefix = value.to_string(),
                "drift_factor" => {
                    drift_factor = value
                        .parse::<f64>()
                        .ok()
                        .filter(|f| (0.0..0.5).contains(f))
                        .ok_or_else(|| {
                            u.option_error(
                                key,
                                format_args!(
                                    "drift_factor must be a number from 0 up to (not including) \
                                     0.5, like 0.01; got `{value}`"
                                ),
                            )
                        })?
                }
                other => return Err(u.unknown_option(other, OPTIONS)),
            }
        }
        let redacted = u.redacted().to_string();
        let nodes = nodes
            .into_iter()
            .map(|n| {
                RedisConfig::redlock_node(
                    n,
                    username.clone(),
                    password.clone(),
                    db,
                    prefix.clone(),
                    timeout,
                )
            })
            .collect();
        Ok(RedlockConfig {
            nodes,
            timeout,
            drift_factor,
            drift,
            retry_delay,
            redacted,
        })
    }

    /// The URL with the password redacted.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// How many nodes the set has.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// How many nodes must agree: a strict majority.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// How long one node may take to answer one request.
    pub fn node_timeout(&self) -> Duration {
        self.timeout
    }

    /// The clock drift allowed for a lease of `ttl`: `ttl x drift_factor +
    /// drift`.
    pub fn drift_for(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + self.drift
    }

    /// The longest pause between two attempts of a waiting acquire.
    pub fn retry_delay(&self) -> Duration {
        self.retry_delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match RedlockConfig::parse(url) {
            Err(LockError::Config(m)) => m,
            other => panic!("{url}: expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn parses_node_lists_and_options() {
        let c = RedlockConfig::parse(
            "redlock://u:p%40ss@a:1,b:2,c:3,d:4,e:5/2?timeout=30ms&drift_factor=0.02&drift=5ms&retry_delay=1s&prefix=x:",
        )
        .unwrap();
        assert_eq!((c.node_count(), c.quorum()), (5, 3));
        assert_eq!(c.timeout, Duration::from_millis(30));
        assert_eq!(
            c.drift_for(Duration::from_secs(1)),
            Duration::from_millis(25)
        );
        assert_eq!(c.retry_delay, Duration::from_secs(1));
        let n = &c.nodes[4];
        assert_eq!((n.nodes[0].host.as_str(), n.nodes[0].port), ("e", 5));
        assert_eq!((n.db, n.prefix.as_str()), (2, "x:"));
        assert_eq!(n.password.as_deref(), Some("p@ss"));
        assert_eq!(n.timeout, Duration::from_millis(30));
        let d = RedlockConfig::parse("redlock://a,b,[::1]:7").unwrap();
        // The defaults the module docs state.
        assert_eq!(d.timeout, Duration::from_millis(100));
        assert_eq!(d.drift_factor, 0.01);
        assert_eq!(d.drift, Duration::from_millis(2));
        assert_eq!(d.retry_delay, Duration::from_millis(200));
        assert_eq!(d.quorum(), 2);
        assert_eq!(d.timeout, DEFAULT_NODE_TIMEOUT);
        assert_eq!(d.nodes[0].nodes[0].port, 6379);
    }

    #[test]
    fn refuses_mistakes_before_any_io() {
        assert!(err("redlock://a:1").contains("at least 3"));
        assert!(err("redlock://a:1,b:2").contains("got 2"));
        assert!(err("redlock://a:1,b:2,a:1").contains("twice"));
        // One server under other spellings of its name or address.
        for same in [
            "redlock://cache,CACHE,other",
            "redlock://cache,cache.,other",
            "redlock://[::1]:7,[0:0::1]:7,b",
            "redlock://10.0.0.1,[::ffff:10.0.0.1],b",
        ] {
            assert!(err(same).contains("listed twice"), "{same}");
        }
        assert!(RedlockConfig::parse("redlock://a:1,a:2,a:3").is_ok());
        assert!(err("redlock://a:1,b:2,").contains("host is missing"));
        assert!(err("redis://a:1,b:2,c:3").contains("scheme"));
        assert!(err("redlock://a,b,c?drift_factor=0.7").contains("drift_factor"));
        assert!(err("redlock://a,b,c?drift_factor=x").contains("drift_factor"));
        assert!(err("redlock://a,b,c?timeout=0").contains("above zero"));
        assert!(err("redlock://a,b,c?format=redisson").contains("unknown option `format`"));
        assert!(err("redlock://a,b,c?timeout=1&timeout=2").contains("twice"));
        assert!(err("redlock://a,b,c?timeout=1&op_timeout=2").contains("twice"));
        let c = RedlockConfig::parse("redlock://a,b,c?op_timeout=0.5s").unwrap();
        assert_eq!(c.node_timeout(), Duration::from_millis(500));
        assert!(err("redlock://a,b,c/x").contains("database number"));
    }

    #[test]
    fn never_shows_the_password() {
        let m = err("redlock://u:hunter2@a,b?timeout=1");
        assert!(!m.contains("hunter2"), "{m}");
        let c = RedlockConfig::parse("redlock://u:hunter2@a,b,c").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!c.redacted_url().contains("hunter2"));
        assert!(!format!("{:?}", c.nodes[0]).contains("hunter2"));
    }
}
