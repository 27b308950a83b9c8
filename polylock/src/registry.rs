//! The one list of backends: the URL schemes each serves, how to connect,
//! what it promises, and the cargo feature that builds it. The scheme
//! registry and the guarantees table are both read from it.

use std::sync::Arc;

use lock_core::{redact_url, Guarantees, LockBackend, LockError};

use crate::BoxFuture;

type Connect = fn(String) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>>;

/// One backend crate, built into this binary or not.
pub(crate) struct Entry {
    /// The cargo feature that brings it in.
    feature: &'static str,
    /// Its URL schemes: the crate's `URL_SCHEMES` (a test checks), written
    /// here too so an error can name the feature of a backend not built.
    schemes: &'static [&'static str],
    /// `None` when the feature is off.
    built: Option<Built>,
}

#[derive(Clone, Copy)]
struct Built {
    connect: Connect,
    /// One entry per kind the crate serves (SQL dialect, Redis algorithm).
    guarantees: fn() -> Vec<Guarantees>,
}

/// An entry whose `connect` and `guarantees` exist only when its cargo
/// feature is on; `$krate` exports `URL_SCHEMES` and `connect(url)`.
macro_rules! backend {
    ($feature:literal, [$($scheme:literal),+ $(,)?], $krate:path, $guarantees:expr) => {
        Entry {
            feature: $feature,
            schemes: &[$($scheme),+],
            #[cfg(feature = $feature)]
            built: Some(Built {
                connect: |url| Box::pin(async move {
                    use $krate as krate;
                    krate::connect(&url).await
                }),
                guarantees: $guarantees,
            }),
            #[cfg(not(feature = $feature))]
            built: None,
        }
    };
}

/// Every backend, in the order of the guarantees table.
pub(crate) const BACKENDS: &[Entry] = &[
    backend!("memory", ["memory"], crate::memory, || vec![
        crate::memory::guarantees()
    ]),
    backend!(
        "sql",
        ["sqlite", "postgres", "postgresql", "mysql", "mariadb"],
        backend_sql,
        || backend_sql::Dialect::ALL
            .map(backend_sql::guarantees)
            .to_vec()
    ),
    backend!(
        "redis",
        ["redis", "rediss", "redis+cluster", "redlock"],
        backend_redis,
        || backend_redis::Algorithm::ALL
            .map(backend_redis::guarantees)
            .to_vec()
    ),
    backend!("etcd", ["etcd", "etcds"], backend_etcd, || vec![
        backend_etcd::guarantees()
    ]),
    backend!("zk", ["zk"], backend_zk, || vec![backend_zk::guarantees()]),
];

/// What every backend built into this binary promises, in table order.
pub(crate) fn built_guarantees() -> Vec<Guarantees> {
    BACKENDS
        .iter()
        .filter_map(|e| e.built)
        .flat_map(|b| (b.guarantees)())
        .collect()
}

/// What the backend serving `url`'s scheme declares, one entry per kind it
/// serves (SQL dialect, Redis algorithm), read before connecting: empty
/// when this build has no such backend (connecting says why).
///
/// ```
/// let declared = polylock::declared_guarantees_of("memory://t").unwrap();
/// assert_eq!(declared[0].expiry_clock, polylock::ExpiryClock::Local);
/// assert!(polylock::declared_guarantees_of("nosuch://x").unwrap().is_empty());
/// ```
pub fn declared_guarantees_of(url: &str) -> Result<Vec<Guarantees>, LockError> {
    let scheme = scheme_of(url)?;
    Ok(BACKENDS
        .iter()
        .find(|e| e.schemes.contains(&scheme.as_str()))
        .and_then(|e| e.built)
        .map(|b| (b.guarantees)())
        .unwrap_or_default())
}

/// The schemes this build can connect to.
pub fn available_schemes() -> Vec<&'static str> {
    schemes_of(BACKENDS)
}

fn schemes_of(table: &[Entry]) -> Vec<&'static str> {
    table
        .iter()
        .filter(|e| e.built.is_some())
        .flat_map(|e| e.schemes.iter().copied())
        .collect()
}

/// The scheme of `url`, lowercased; an error for a string with none.
fn scheme_of(url: &str) -> Result<String, LockError> {
    if !url.contains(':') || url.starts_with(':') {
        return Err(LockError::Config(format!(
            "`{}` is not a lock URL: expected SCHEME://..., with SCHEME one of {}",
            redact_url(url),
            available_schemes().join(", ")
        )));
    }
    lock_core::url::scheme_of(url)
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| {
            LockError::Config(format!(
                "`{}` is not a lock URL: the scheme has invalid characters",
                redact_url(url)
            ))
        })
}

pub(crate) async fn connect_backend(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    resolve(BACKENDS, url).await
}

async fn resolve(table: &[Entry], url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    let scheme = scheme_of(url)?;
    let available = schemes_of(table).join(", ");
    match table.iter().find(|e| e.schemes.contains(&scheme.as_str())) {
        Some(Entry {
            built: Some(built), ..
        }) => (built.connect)(url.to_string()).await,
        Some(Entry { feature, .. }) => Err(LockError::Config(format!(
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
            Entry {
                feature: "memory",
                schemes: &["memory"],
                built: Some(Built {
                    connect: |_| {
                        Box::pin(async {
                            Ok(Arc::new(lock_core::MemoryBackend::new()) as Arc<dyn LockBackend>)
                        })
                    },
                    guarantees: Vec::new,
                }),
            },
            Entry {
                feature: "redis",
                schemes: &["redis"],
                built: None,
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

    /// Each entry names a cargo feature of this crate, and, when built,
    /// the schemes its crate serves: nothing is advertised that is not
    /// built, or built under another name.
    #[test]
    fn entries_match_their_features_and_crates() {
        let manifest = include_str!("../Cargo.toml");
        let features = &manifest[manifest.find("[features]").unwrap()..];
        let features = &features[..features[1..].find("\n[").unwrap()];
        for e in BACKENDS {
            assert!(
                features.contains(&format!("\n{} = ", e.feature)),
                "no cargo feature `{}`",
                e.feature
            );
        }
        let crate_schemes: &[(&str, &[&str])] = &[
            #[cfg(feature = "memory")]
            ("memory", crate::memory::URL_SCHEMES),
            #[cfg(feature = "sql")]
            ("sql", backend_sql::URL_SCHEMES),
            #[cfg(feature = "redis")]
            ("redis", backend_redis::URL_SCHEMES),
            #[cfg(feature = "etcd")]
            ("etcd", backend_etcd::URL_SCHEMES),
            #[cfg(feature = "zk")]
            ("zk", backend_zk::URL_SCHEMES),
        ];
        let built: Vec<_> = BACKENDS.iter().filter(|e| e.built.is_some()).collect();
        assert_eq!(built.len(), crate_schemes.len());
        for (feature, schemes) in crate_schemes {
            let e = BACKENDS.iter().find(|e| e.feature == *feature).unwrap();
            assert!(e.built.is_some(), "{feature}");
            assert_eq!(e.schemes, *schemes, "{feature}");
        }
        let mut all: Vec<_> = BACKENDS.iter().flat_map(|e| e.schemes).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a scheme is listed twice");
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
