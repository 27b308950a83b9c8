//! A server given by URL (`polylock bench --url`) instead of started by
//! the test kit: the URL is checked by the backend's own parser (the same
//! errors as `polylock::connect`, before any I/O), and the raw driver
//! reaches the same server with the same credentials.

use lock_core::url::{scheme_of, LockUrl};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use super::{Reach, Res};

/// A parsed `--url`.
pub(crate) struct GivenUrl {
    /// The row's name in the report: the backend of the same shape the
    /// bench starts itself (`redis-fair` for `?fair=true`), so the same
    /// targets apply.
    pub(crate) label: &'static str,
    /// The URL as given, password included: for `polylock::connect` only.
    pub(crate) url: String,
    /// The URL with its password replaced.
    pub(crate) redacted: String,
    pub(crate) reach: Reach,
}

/// The schemes `--url` measures.
pub(crate) const SCHEMES: &str =
    "redis, rediss, redlock, etcd, postgres, postgresql, mysql, mariadb, zk";

impl GivenUrl {
    /// Parses `url` without connecting. Errors never contain the password.
    pub(crate) fn parse(url: &str) -> Res<GivenUrl> {
        let redacted = lock_core::redact_url(url);
        let scheme = scheme_of(url)
            .map(str::to_ascii_lowercase)
            .ok_or_else(|| format!("`{redacted}` is not a lock URL (no scheme)"))?;
        let config = |e: lock_core::LockError| e.to_string();
        let usage = format!("{scheme}://HOST:PORT");
        match scheme.as_str() {
            "redis" | "rediss" => {
                let c = backend_redis::RedisConfig::parse(url).map_err(config)?;
                let u = LockUrl::parse(url, &usage).map_err(config)?;
                if u.options().any(|(k, _)| k == "ca" || k == "tls_ca") {
                    return Err(format!(
                        "`{redacted}`: the bench's raw Redis client trusts the system's CA \
                         certificates only; give the URL without `ca=`"
                    ));
                }
                Ok(GivenUrl {
                    url: url.to_string(),
                    label: if c.fair() { "redis-fair" } else { "redis" },
                    redacted: c.redacted_url().to_string(),
                    reach: Reach::Redis(redis_nodes(&u, c.db(), c.is_tls())?),
                })
            }
            "redlock" => {
                let c = backend_redis::RedlockConfig::parse(url).map_err(config)?;
                let u = LockUrl::parse(url, &usage).map_err(config)?;
                let db = match u.path().trim_matches('/') {
                    "" => 0,
                    n => n
                        .parse()
                        .map_err(|_| format!("`{redacted}`: bad database `{n}`"))?,
                };
                Ok(GivenUrl {
                    url: url.to_string(),
                    label: "redlock",
                    redacted: c.redacted_url().to_string(),
                    reach: Reach::Redis(redis_nodes(&u, db, false)?),
                })
            }
            "etcd" => {
                let c = backend_etcd::EtcdConfig::parse(url).map_err(config)?;
                let u = LockUrl::parse(url, &usage).map_err(config)?;
                let credentials = c
                    .user()
                    .map(|user| (user.to_string(), u.password().unwrap_or("").to_string()));
                Ok(GivenUrl {
                    url: url.to_string(),
                    label: "etcd",
                    redacted: c.redacted_url().to_string(),
                    reach: Reach::Etcd {
                        endpoints: c
                            .endpoints()
                            .iter()
                            .map(|e| format!("http://{e}"))
                            .collect(),
                        credentials,
                        metrics: c.endpoints()[0].clone(),
                    },
                })
            }
            "postgres" | "postgresql" | "mysql" | "mariadb" => {
                let c = backend_sql::SqlConfig::parse(url).map_err(config)?;
                let driver = c.driver_url().to_string();
                let (label, reach) = match scheme.as_str() {
                    "mysql" => ("mysql", Reach::My(driver)),
                    "mariadb" => ("mariadb", Reach::My(driver)),
                    _ => ("postgres", Reach::Pg(driver)),
                };
                Ok(GivenUrl {
                    url: url.to_string(),
                    label,
                    redacted: c.redacted_url().to_string(),
                    reach,
                })
            }
            "zk" => {
                let c = backend_zk::ZkConfig::parse(url).map_err(config)?;
                if c.user().is_some() {
                    return Err(format!(
                        "`{redacted}`: the bench's raw ZooKeeper client does not authenticate; \
                         give a URL without credentials"
                    ));
                }
                Ok(GivenUrl {
                    url: url.to_string(),
                    label: "zk",
                    redacted: c.redacted_url().to_string(),
                    reach: Reach::Zk {
                        connect: format!("{}{}", c.servers().join(","), c.chroot()),
                        server: c.servers()[0].clone(),
                    },
                })
            }
            "sqlite" => Err(format!(
                "`{redacted}`: SQLite is embedded, there is no server to connect to; \
                 measure it with --backends sqlite"
            )),
            "etcds" | "redis+cluster" => Err(format!(
                "`{redacted}`: --url does not measure `{scheme}` (the raw baseline has no \
                 {} client); expected one of {SCHEMES}",
                if scheme == "etcds" {
                    "TLS etcd"
                } else {
                    "cluster"
                }
            )),
            other => Err(format!(
                "`{redacted}`: unknown scheme `{other}`; expected one of {SCHEMES}"
            )),
        }
    }
}

/// Each host of `u` as the raw Redis driver connects to it.
fn redis_nodes(u: &LockUrl, db: i64, tls: bool) -> Res<Vec<ConnectionInfo>> {
    u.hosts()
        .iter()
        .map(|h| {
            let port = h.port.unwrap_or(6379);
            let addr = if tls {
                ConnectionAddr::TcpTls {
                    host: h.host.clone(),
                    port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(h.host.clone(), port)
            };
            let mut settings = RedisConnectionInfo::default().set_db(db);
            if let Some(user) = u.username().filter(|s| !s.is_empty()) {
                settings = settings.set_username(user);
            }
            if let Some(password) = u.password().filter(|s| !s.is_empty()) {
                settings = settings.set_password(password);
            }
            Ok(addr
                .into_connection_info()
                .map_err(|e| e.to_string())?
                .set_redis_settings(settings))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(url: &str) -> String {
        match GivenUrl::parse(url) {
            Ok(g) => panic!("{url} parsed as {}", g.label),
            Err(e) => e,
        }
    }

    #[test]
    fn each_scheme_gets_the_row_of_the_backend_of_its_shape() {
        for (url, label) in [
            ("redis://127.0.0.1:6379/0", "redis"),
            ("redis://127.0.0.1/0?fair=true", "redis-fair"),
            ("redlock://a:1,b:2,c:3", "redlock"),
            ("etcd://127.0.0.1:2379", "etcd"),
            ("postgres://u@db/app", "postgres"),
            ("mariadb://u@db/app", "mariadb"),
            ("mysql://u@db/app", "mysql"),
            ("zk://127.0.0.1:2181/chroot", "zk"),
        ] {
            let g = GivenUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(g.label, label, "{url}");
        }
    }

    #[test]
    fn the_raw_driver_reaches_the_same_server_with_the_same_credentials() {
        let g = GivenUrl::parse("redis://app:s3cret@10.0.0.7:7001/3").unwrap();
        let Reach::Redis(nodes) = &g.reach else {
            panic!("not redis");
        };
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].addr().to_string(), "10.0.0.7:7001");
        assert_eq!(nodes[0].redis_settings().db(), 3);
        assert_eq!(nodes[0].redis_settings().username(), Some("app"));
        assert_eq!(nodes[0].redis_settings().password(), Some("s3cret"));

        let g = GivenUrl::parse("redlock://:pw@a:1,b:2,c:3").unwrap();
        let Reach::Redis(nodes) = &g.reach else {
            panic!("not redis");
        };
        assert_eq!(nodes.len(), 3);
        assert!(nodes
            .iter()
            .all(|n| n.redis_settings().password() == Some("pw")));

        let g = GivenUrl::parse("mariadb://u:pw@db:3307/app?table=locks").unwrap();
        let Reach::My(driver) = &g.reach else {
            panic!("not mysql");
        };
        assert_eq!(
            driver, "mysql://u:pw@db:3307/app",
            "polylock's options stay out"
        );

        let g = GivenUrl::parse("etcd://root:pw@h1:2379,h2:2379").unwrap();
        let Reach::Etcd {
            endpoints,
            credentials,
            metrics,
        } = &g.reach
        else {
            panic!("not etcd");
        };
        assert_eq!(endpoints, &["http://h1:2379", "http://h2:2379"]);
        assert_eq!(credentials.as_ref().map(|c| c.1.as_str()), Some("pw"));
        assert_eq!(metrics, "h1:2379");

        let g = GivenUrl::parse("zk://h1:2181,h2:2181/app").unwrap();
        let Reach::Zk { connect, server } = &g.reach else {
            panic!("not zk");
        };
        assert_eq!(connect, "h1:2181,h2:2181/app");
        assert_eq!(server, "h1:2181");
    }

    #[test]
    fn the_password_stays_out_of_the_name_and_every_error() {
        let g = GivenUrl::parse("redis://:s3cret@127.0.0.1:6379/0").unwrap();
        assert!(!g.redacted.contains("s3cret"), "{}", g.redacted);
        for bad in [
            "redis://:s3cret@127.0.0.1:6379/0?fair=maybe",
            "postgres://u:s3cret@db/app?pool_size=zero",
            "sqlite:///tmp/locks.db",
            "ftp://u:s3cret@host/",
            "etcds://u:s3cret@host:2379",
            "redis+cluster://:s3cret@a:1,b:2",
            "zk://u:s3cret@host:2181",
        ] {
            let e = parse_err(bad);
            assert!(!e.contains("s3cret"), "{bad}: {e}");
            assert!(!e.is_empty());
        }
    }

    #[test]
    fn embedded_and_unknown_schemes_say_what_to_do_instead() {
        assert!(parse_err("sqlite:///tmp/x.db").contains("--backends sqlite"));
        let e = parse_err("memcached://h:11211");
        assert!(
            e.contains("unknown scheme `memcached`") && e.contains("redlock"),
            "{e}"
        );
        assert!(parse_err("no-scheme-here").contains("no scheme"));
        // The backend would trust this CA; the raw client could not.
        let e = parse_err("rediss://:s3cret@h:6380/0?ca=/etc/redis/ca.pem");
        assert!(e.contains("without `ca=`") && !e.contains("s3cret"), "{e}");
    }
}
