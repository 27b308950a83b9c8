//! The one place that maps a URL scheme to a backend.

use std::sync::Arc;

use lock_core::{redact_url, LockBackend, LockError};

use crate::BoxFuture;

type Connect = fn(String) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>>;

/// A URL scheme polylock knows, whether or not this build includes it.
struct Scheme {
    scheme: &'static str,
    /// The cargo feature that brings it in.
    feature: &'static str,
    connect: Option<Connect>,
}

/// A table entry: its connect function exists only when its cargo feature
/// is on; otherwise the entry stays, so errors can name the feature.
macro_rules! scheme {
    ($scheme:literal, $feature:literal, $connect:expr) => {
        Scheme {
            scheme: $scheme,
            feature: $feature,
            #[cfg(feature = $feature)]
            connect: Some($connect),
            #[cfg(not(feature = $feature))]
            connect: None,
        }
    };
    ($scheme:literal, $feature:literal) => {
        Scheme {
            scheme: $scheme,
            feature: $feature,
            connect: None,
        }
    };
}

/// Every scheme, compiled in or not, so an error can say which feature to
/// turn on.
const SCHEMES: &[Scheme] = &[
    scheme!("memory", "memory", connect_memory),
    scheme!("redis", "redis", connect_redis),
    scheme!("rediss", "redis", connect_redis),
    scheme!("redis+cluster", "redis", connect_redis),
    scheme!("redlock", "redis", connect_redlock),
    scheme!("etcd", "etcd", connect_etcd),
    scheme!("etcds", "etcd", connect_etcd),
    scheme!("zk", "zk", connect_zk),
    scheme!("sqlite", "sql", connect_sql),
    scheme!("postgres", "sql", connect_sql),
    scheme!("postgresql", "sql", connect_sql),
    scheme!("mysql", "sql", connect_sql),
    scheme!("mariadb", "sql", connect_sql),
];

/// `memory://NAME`: a process-wide in-memory table per NAME.
#[cfg(feature = "memory")]
fn connect_memory(url: String) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move { crate::memory::connect(&url) })
}

/// `sqlite://`, `postgres://`, `postgresql://`, `mysql://`, `mariadb://`:
/// one SQL client (its own pool); the URL's query carries the options.
#[cfg(feature = "sql")]
fn connect_sql(url: String) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move {
        let backend = backend_sql::SqlBackend::connect(&url).await?;
        Ok(Arc::new(backend) as Arc<dyn LockBackend>)
    })
}

/// `redis://`, `rediss://`, `redis+cluster://`: one Redis client (a
/// multiplexed connection, plus a pub/sub connection once something waits);
/// the URL's query carries the options.
#[cfg(feature = "redis")]
fn connect_redis(url: String) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move {
        let backend = backend_redis::RedisBackend::connect(&url).await?;
        Ok(Arc::new(backend) as Arc<dyn LockBackend>)
    })
}

/// `redlock://h1:p1,h2:p2,h3:p3,...`: Redlock over N >= 3 independent
/// Redis masters; see `backend_redis::RedlockConfig` for the options.
#[cfg(feature = "redis")]
fn connect_redlock(url: String) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move {
        let backend = backend_redis::RedlockBackend::connect(&url).await?;
        Ok(Arc::new(backend) as Arc<dyn LockBackend>)
    })
}

/// `etcd://` and `etcds://`: one etcd client (its own channel and
/// sessions); see `backend_etcd::EtcdConfig` for the URL's options.
#[cfg(feature = "etcd")]
fn connect_etcd(url: String) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move { backend_etcd::connect(&url).await })
}

/// `zk://`: one ZooKeeper client (one session per TTL); see
/// `backend_zk::ZkConfig` for the URL's options.
#[cfg(feature = "zk")]
fn connect_zk(url: String) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>> {
    Box::pin(async move { backend_zk::connect(&url).await })
}

/// The schemes this build can connect to.
pub fn available_schemes() -> Vec<&'static str> {
    SCHEMES
        .iter()
        .filter(|s| s.connect.is_some())
        .map(|s| s.scheme)
        .collect()
}

/// The scheme of `url`, lowercased; an error for a string with none.
fn scheme_of(url: &str) -> Result<String, LockError> {
    let end = url.find(':').filter(|&i| i > 0).ok_or_else(|| {
        LockError::Config(format!(
            "`{}` is not a lock URL: expected SCHEME://..., with SCHEME one of {}",
            redact_url(url),
            available_schemes().join(", ")
        ))
    })?;
    let scheme = &url[..end];
    if !scheme
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return Err(LockError::Config(format!(
            "`{}` is not a lock URL: the scheme has invalid characters",
            redact_url(url)
        )));
    }
    Ok(scheme.to_ascii_lowercase())
}

pub(crate) async fn connect_backend(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    resolve(SCHEMES, url).await
}

async fn resolve(table: &[Scheme], url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    let scheme = scheme_of(url)?;
    let available: Vec<_> = table
        .iter()
        .filter(|s| s.connect.is_some())
        .map(|s| s.scheme)
        .collect();
    let available = available.join(", ");
    match table.iter().find(|s| s.scheme == scheme) {
        Some(Scheme {
            connect: Some(connect),
            ..
        }) => connect(url.to_string()).await,
        Some(Scheme { feature, .. }) => Err(LockError::Config(format!(
            "the `{scheme}` scheme needs polylock built with the `{feature}` cargo feature; \
             this build has: {available}"
        ))),
        None => Err(LockError::Config(format!(
            "unknown lock URL scheme `{scheme}` in `{}`; this build has: {available}",
            redact_url(url)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scheme_whose_feature_is_off_names_the_feature_and_what_is_on() {
        let table = [
            Scheme {
                scheme: "memory",
                feature: "memory",
                connect: Some(|_| {
                    Box::pin(async {
                        Ok(Arc::new(lock_core::MemoryBackend::new()) as Arc<dyn LockBackend>)
                    })
                }),
            },
            Scheme {
                scheme: "redis",
                feature: "redis",
                connect: None,
            },
        ];
        let err = resolve(&table, "redis://:pw@localhost").await.unwrap_err();
        let LockError::Config(m) = err else {
            panic!("{err:?}")
        };
        assert!(
            m.contains("`redis` scheme needs polylock built with the `redis` cargo feature"),
            "{m}"
        );
        assert!(m.contains("this build has: memory"), "{m}");
        assert!(!m.contains("pw"), "{m}");
        assert!(
            resolve(&table, "MEMORY://").await.is_ok(),
            "schemes are case-insensitive"
        );
    }

    /// `redlock://` reaches the Redlock backend: its own configuration
    /// error (too few nodes), before any I/O.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn redlock_urls_reach_the_redlock_backend() {
        let err = connect_backend("redlock://127.0.0.1:1,127.0.0.1:2")
            .await
            .unwrap_err();
        let LockError::Config(m) = err else {
            panic!("{err:?}")
        };
        assert!(m.contains("at least 3 independent nodes"), "{m}");
    }

    #[cfg(feature = "zk")]
    #[tokio::test]
    async fn zk_urls_reach_the_zookeeper_backend() {
        // Connecting opens no session, so no server is needed.
        let b = connect_backend("zk://127.0.0.1:1/app?prefix=locks")
            .await
            .expect("zk:// connects");
        assert_eq!(b.guarantees().backend, "zookeeper");
        let err = connect_backend("zk://127.0.0.1:1?colour=blue")
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Config(_)), "{err:?}");
    }
}
