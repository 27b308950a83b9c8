//! `memory://NAME`: the in-process backend, one shared table per NAME.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use lock_core::{redact_url, LockBackend, LockError, MemoryBackend};

/// The URL schemes of the in-process backend (read by the registry's test,
/// as every backend crate's `URL_SCHEMES` is).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const URL_SCHEMES: &[&str] = &["memory"];

/// What the in-process backend promises.
pub(crate) fn guarantees() -> lock_core::Guarantees {
    MemoryBackend::new().guarantees()
}

/// `memory://` and `memory://NAME` connect to a process-wide table per NAME
/// (the empty name is a table too), so two `connect` calls with the same URL
/// see each other's locks, as two clients of one server would.
///
/// # Cancel safety
/// Cancel safe: it does no I/O.
pub(crate) async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    // After the scheme, whatever its case (the registry matched it so),
    // with or without `//`.
    let rest = url.split_once(':').map_or("", |(_, r)| r);
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    if rest.contains(['?', '#', '@']) {
        return Err(LockError::Config(format!(
            "`{}`: memory:// takes only a table name, no options",
            redact_url(url)
        )));
    }
    static TABLES: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
    let mut tables = TABLES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let backend = tables
        .entry(rest.trim_end_matches('/').to_string())
        .or_default();
    Ok(Arc::new(backend.clone()))
}
