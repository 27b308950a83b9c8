//! The migration lock's URL: `migrate+LEGACY?to=TARGET&phase=PHASE`.

use std::fmt;

use lock_core::url::LockUrl;
use lock_core::{redact_url, LockError};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::URL_PREFIX;

/// Which of the two locks a service takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The legacy lock only: the start of a migration and the end of a
    /// roll-back.
    Legacy,
    /// The legacy lock, then the target lock; excludes legacy-only and
    /// target-only services alike.
    Both,
    /// The target lock only: the end of a migration.
    Target,
}

impl Phase {
    /// The phase as written in URLs and config files.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Legacy => "legacy",
            Phase::Both => "both",
            Phase::Target => "target",
        }
    }

    /// `legacy`, `both` or `target`.
    pub fn parse(s: &str) -> Result<Phase, String> {
        match s {
            "legacy" => Ok(Phase::Legacy),
            "both" => Ok(Phase::Both),
            "target" => Ok(Phase::Target),
            other => Err(format!(
                "the phase is legacy, both or target, not `{}`",
                other.escape_debug()
            )),
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const USAGE: &str = "migrate+LEGACY_URL?to=PERCENT_ENCODED_TARGET_URL&phase=legacy|both|target";

/// What a `to=` value must encode: everything but unreserved characters, so
/// the target's own `?`, `&`, `=`, `@` and `%` survive the outer query.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A parsed migration lock URL: the legacy URL, the target URL and the
/// phase. Both URLs hold credentials, so `Debug` and
/// [`redacted_url`](MigrateConfig::redacted_url) show them redacted.
///
/// ```
/// use backend_migrate::{MigrateConfig, Phase};
/// let c = MigrateConfig::parse(
///     "migrate+redis://:s3cret@cache/0?format=plain&to=postgres%3A%2F%2Fapp%3Ahunter2%40db%2Flocks&phase=both",
/// ).unwrap();
/// assert_eq!(c.legacy_url(), "redis://:s3cret@cache/0?format=plain");
/// assert_eq!(c.target_url(), "postgres://app:hunter2@db/locks");
/// assert_eq!(c.phase(), Phase::Both);
/// let shown = format!("{} {c:?}", c.redacted_url());
/// assert!(!shown.contains("s3cret") && !shown.contains("hunter2"));
/// ```
#[derive(Clone)]
pub struct MigrateConfig {
    legacy: String,
    target: String,
    phase: Phase,
    redacted: String,
}

impl fmt::Debug for MigrateConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrateConfig")
            .field("url", &self.redacted)
            .finish_non_exhaustive()
    }
}

impl MigrateConfig {
    /// Parses `migrate+LEGACY_URL?...&to=TARGET&phase=PHASE`, before any
    /// I/O. `to` is required and is percent-decoded once (encode it, e.g.
    /// with [`MigrateConfig::to_url`]); `phase` defaults to `both`, the one
    /// phase that excludes every other service. Every other option stays
    /// with the legacy URL. Errors are [`LockError::Config`] and never show
    /// a password of either URL.
    pub fn parse(url: &str) -> Result<MigrateConfig, LockError> {
        if !crate::is_migrate_url(url) {
            return Err(LockError::Config(format!(
                "`{}` is not a migration lock URL: expected {USAGE}",
                redact_url(url)
            )));
        }
        let inner = &url[URL_PREFIX.len()..];
        // The query starts at the first `?` after the scheme: LockUrl refuses
        // an unencoded `?` in credentials, so none comes earlier.
        let after_scheme = inner.find("://").map_or(0, |i| i + 3);
        let (head, query) = match inner[after_scheme..].find('?') {
            Some(i) => inner.split_at(after_scheme + i),
            None => (inner, ""),
        };
        let query = query.strip_prefix('?').unwrap_or(query);
        let mut kept = Vec::new();
        let mut to = None;
        let mut phase = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "to" | "phase" => {
                    let slot = if key == "to" { &mut to } else { &mut phase };
                    if slot.replace(value).is_some() {
                        return Err(outer_error(
                            head,
                            &kept,
                            format_args!("option `{key}` is given twice"),
                        ));
                    }
                }
                _ => kept.push(pair),
            }
        }
        let legacy = if kept.is_empty() {
            head.to_string()
        } else {
            format!("{head}?{}", kept.join("&"))
        };
        let Some(to) = to else {
            return Err(outer_error(
                head,
                &kept,
                format_args!("the target is missing: expected {USAGE}"),
            ));
        };
        if to.contains('?') {
            // The target's own options would end at the first `&`, and the
            // rest would silently go to the legacy URL (a `prefix=` there
            // moves the legacy keys away from the legacy-only clients').
            return Err(outer_error(
                head,
                &kept,
                "option `to`: the target URL has options of its own, so it must be \
                 percent-encoded (`?` as %3F, `&` as %26, `=` as %3D; \
                 MigrateConfig::to_url does it)",
            ));
        }
        let target = percent_encoding::percent_decode_str(to)
            .decode_utf8()
            .map_err(|_| {
                outer_error(
                    head,
                    &kept,
                    "option `to`: the target URL is not valid percent-encoded UTF-8",
                )
            })?
            .into_owned();
        let phase = match phase {
            None => Phase::Both,
            Some(p) => Phase::parse(p).map_err(|e| outer_error(head, &kept, e))?,
        };
        Self::new(legacy, target, phase)
    }

    /// A configuration from its parts (the `[migrate]` section of a config
    /// file), checked like [`parse`](MigrateConfig::parse): both URLs must
    /// be lock URLs (`SCHEME://...`) and neither may itself be a migration
    /// lock.
    pub fn new(
        legacy: impl Into<String>,
        target: impl Into<String>,
        phase: Phase,
    ) -> Result<MigrateConfig, LockError> {
        let (legacy, target) = (legacy.into(), target.into());
        let redacted = format!(
            "{URL_PREFIX}{}{}to={}&phase={phase}",
            redact_url(&legacy),
            if legacy.contains('?') { "&" } else { "?" },
            redact_url(&target)
        );
        let bad = |why: String| LockError::Config(format!("`{redacted}`: {why}"));
        for (side, u) in [("legacy", &legacy), ("target", &target)] {
            if crate::is_migrate_url(u) {
                return Err(bad(format!(
                    "the {side} URL is itself a migration lock; migrate one step at a time"
                )));
            }
            // The shared parts (scheme, hosts, credentials) are checked now;
            // each backend checks its own options when it connects. No host
            // is fine here: a Unix socket (`postgres:///db?host=/run/...`)
            // or a file (`sqlite:///abs.db`, `sqlite:rel.db`) has none.
            let parsed = if u.contains("://") {
                LockUrl::parse_optional_host(u, "SCHEME://HOST...")
            } else {
                LockUrl::parse_file(u, "SCHEME:PATH")
            };
            parsed.map_err(|e| bad(format!("the {side} URL: {}", strip_config(e))))?;
        }
        if legacy == target {
            return Err(bad(
                "the legacy and target URLs are the same: the two locks would be one".into(),
            ));
        }
        Ok(MigrateConfig {
            legacy,
            target,
            phase,
            redacted,
        })
    }

    /// The legacy backend's URL (with its credentials: do not log it).
    pub fn legacy_url(&self) -> &str {
        &self.legacy
    }

    /// The target backend's URL (with its credentials: do not log it).
    pub fn target_url(&self) -> &str {
        &self.target
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The same migration in another phase (the next step of a move or a
    /// roll-back).
    pub fn with_phase(&self, phase: Phase) -> MigrateConfig {
        let mut c = self.clone();
        c.phase = phase;
        c.redacted = format!(
            "{}phase={phase}",
            c.redacted
                .rsplit_once("phase=")
                .map_or("", |(head, _)| head)
        );
        c
    }

    /// The URL with both URLs' passwords replaced, for messages and logs.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// The `migrate+` URL of this configuration, the target percent-encoded.
    /// It holds both URLs' credentials: do not log it.
    pub fn to_url(&self) -> String {
        format!(
            "{URL_PREFIX}{}{}to={}&phase={}",
            self.legacy,
            if self.legacy.contains('?') { "&" } else { "?" },
            utf8_percent_encode(&self.target, COMPONENT),
            self.phase
        )
    }
}

/// A Config error about the outer URL, shown without the target (whose
/// credentials are percent-encoded there, out of `redact_url`'s sight).
fn outer_error(head: &str, kept: &[&str], why: impl fmt::Display) -> LockError {
    let shown = if kept.is_empty() {
        format!("{URL_PREFIX}{head}")
    } else {
        format!("{URL_PREFIX}{head}?{}", kept.join("&"))
    };
    LockError::Config(format!("`{}`: {why}", redact_url(&shown)))
}

/// The message of a Config error, without its `configuration error: `.
fn strip_config(e: LockError) -> String {
    match e {
        LockError::Config(m) => m,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match MigrateConfig::parse(url) {
            Err(LockError::Config(m)) => m,
            other => panic!("{url}: expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn splits_legacy_target_and_phase() {
        let c = MigrateConfig::parse(
            "MIGRATE+redis://h:1/0?format=redisson&to=etcd%3A%2F%2Fe%3A2%3Fprefix%3Dx%26op_timeout%3D1s&phase=target",
        )
        .unwrap();
        assert_eq!(c.legacy_url(), "redis://h:1/0?format=redisson");
        assert_eq!(c.target_url(), "etcd://e:2?prefix=x&op_timeout=1s");
        assert_eq!(c.phase(), Phase::Target);
        // The default phase is the one that excludes everybody.
        let c = MigrateConfig::parse("migrate+redis://h?to=sqlite%3A%2F%2Fa.db").unwrap();
        assert_eq!((c.legacy_url(), c.phase()), ("redis://h", Phase::Both)); // Sides without a host: a file, a Unix socket.
        for target in [
            "sqlite:///var/lib/locks.db",
            "sqlite:locks.db",
            "postgres:///locks?host=/run/postgresql",
        ] {
            let c = MigrateConfig::new("redis://h", target, Phase::Both)
                .unwrap_or_else(|e| panic!("{target}: {e}"));
            let back = MigrateConfig::parse(&c.to_url()).unwrap();
            assert_eq!(back.target_url(), target);
            let c = MigrateConfig::new(target, "redis://h", Phase::Both)
                .unwrap_or_else(|e| panic!("legacy {target}: {e}"));
            let back = MigrateConfig::parse(&c.to_url()).unwrap();
            assert_eq!(back.legacy_url(), target);
        }
    }

    #[test]
    fn to_url_round_trips() {
        let c = MigrateConfig::new(
            "redis://:p%40ss@h/1?prefix=a",
            "postgres://u:x&y=z@db/l?sslmode=disable",
            Phase::Both,
        )
        .unwrap();
        let back = MigrateConfig::parse(&c.to_url()).unwrap();
        assert_eq!(back.legacy_url(), c.legacy_url());
        assert_eq!(back.target_url(), c.target_url());
        assert_eq!(back.phase(), Phase::Both);
        let next = back.with_phase(Phase::Target);
        assert!(next.redacted_url().ends_with("phase=target"), "{next:?}");
        assert_eq!(next.phase(), Phase::Target);
    }

    #[test]
    fn bad_urls_are_config_errors_without_secrets() {
        let target = "postgres%3A%2F%2Fapp%3Ahunter2%40db%2Fx";
        for (url, says) in [
            ("redis://h?to=sqlite%3A%2F%2Fa", "not a migration lock URL"),
            ("migrate+redis://:s3cret@h", "the target is missing"),
            (
                &format!("migrate+redis://:s3cret@h?to={target}&to={target}"),
                "`to` is given twice",
            ),
            (
                &format!("migrate+redis://:s3cret@h?to={target}&phase=all"),
                "legacy, both or target, not `all`",
            ),
            (
                &format!("migrate+redis://:s3cret@h?phase=both&phase=target&to={target}"),
                "`phase` is given twice",
            ),
            (
                "migrate+redis://:s3cret@h?to=%ff",
                "not valid percent-encoded",
            ),
            (
                "migrate+redis://:s3cret@h?to=migrate%2Bredis%3A%2F%2Fx%3Fto%3Dy",
                "itself a migration lock",
            ),
            (
                &format!("migrate+redis://:s3cret@h:0?to={target}"),
                "the legacy URL",
            ),
            ("migrate+redis://:s3cret@h?to=nourl", "the target URL"),
            (
                "migrate+redis://:s3cret@h?to=etcd://e:2379?op_timeout=1s&prefix=/app/",
                "must be percent-encoded",
            ),
            (
                "migrate+redis://:s3cret@h?to=redis%3A%2F%2F%3As3cret%40h",
                "are the same",
            ),
        ] {
            let m = err(url);
            assert!(m.contains(says), "{url}: {m}");
            assert!(!m.contains("s3cret") && !m.contains("hunter2"), "{m}");
        }
    }
}
