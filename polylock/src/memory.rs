//! `memory://NAME`: the in-process backend, one shared table per NAME.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use lock_core::{redact_url, LockBackend, LockError, MemoryBackend};

/// `memory://` and `memory://NAME` connect to a process-wide table per NAME
/// (the empty name is a table too), so two `connect` calls with the same URL
/// see each other's locks, as two clients of one server would.
pub(crate) fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    let rest = url
        .split_once("://")
        .map(|(_, r)| r)
        .or_else(|| url.strip_prefix("memory:"))
        .unwrap_or("");
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
