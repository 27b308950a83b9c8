//! The two wire formats: where a lock lives (keys, channel), who it belongs
//! to (the stored holder identity), and the scripts that act on it.

use std::fmt::Write as _;
use std::sync::LazyLock;

use lock_core::{LockError, LockName, OwnerToken};
use redis::Script;

use crate::config::Format;

/// The Redis keys and channel of one lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockKeys {
    /// The lock itself: a string (`plain`) or a hash (`redisson`).
    pub lock: String,
    /// The fencing counter, bumped by every acquisition and never reset.
    pub fence: String,
    /// The channel a release is published on.
    pub channel: String,
}

/// The scripts of one format. Each is hashed once ([`Script`] keeps the
/// SHA-1), sent with EVALSHA, and loaded again by the driver on NOSCRIPT
/// (after a server restart or `SCRIPT FLUSH`).
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) renew: Script,
    pub(crate) inspect: Script,
}

static PLAIN: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(include_str!("../scripts/plain_acquire.lua")),
    release: Script::new(include_str!("../scripts/plain_release.lua")),
    renew: Script::new(include_str!("../scripts/plain_renew.lua")),
    inspect: Script::new(include_str!("../scripts/plain_inspect.lua")),
});

static REDISSON: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(include_str!("../scripts/redisson_acquire.lua")),
    release: Script::new(include_str!("../scripts/redisson_release.lua")),
    renew: Script::new(include_str!("../scripts/redisson_renew.lua")),
    inspect: Script::new(include_str!("../scripts/redisson_inspect.lua")),
});

pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/force_release.lua")));

/// Every script, for loading them all once at connect time.
pub(crate) fn all_scripts() -> Vec<&'static Script> {
    let mut v = vec![&*FORCE_RELEASE];
    for s in [&*PLAIN, &*REDISSON] {
        v.extend([&s.acquire, &s.release, &s.renew, &s.inspect]);
    }
    v
}

/// The message Redisson publishes at unlock (its `UNLOCK_MESSAGE`, the
/// number 0); the plain format publishes the same.
pub(crate) const RELEASE_MESSAGE: &str = "0";

/// Maps names to keys for one format and prefix.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) format: Format,
    pub(crate) prefix: String,
    pub(crate) cluster: bool,
}

impl Layout {
    pub(crate) fn scripts(&self) -> &'static Scripts {
        match self.format {
            Format::Plain => &PLAIN,
            Format::Redisson => &REDISSON,
        }
    }

    /// The keys and channel of `name`.
    ///
    /// `plain`: `PREFIX{NAME}`, `PREFIX{NAME}:fence`, `PREFIX{NAME}:released`
    /// with NAME escaped so that it contains no braces: the braces we add
    /// are then the first pair in the key, Redis Cluster hashes only what is
    /// between them, and the three always share a slot whatever the name.
    ///
    /// `redisson`: `NAME`, `redisson_lock_token:{NAME}`,
    /// `redisson_lock__channel:{NAME}`, exactly as Redisson names them. A
    /// name containing braces breaks Redisson's own co-location on a
    /// cluster; there such a name is refused before any I/O rather than
    /// failing with CROSSSLOT.
    pub(crate) fn keys(&self, name: &LockName) -> Result<LockKeys, LockError> {
        match self.format {
            Format::Plain => {
                let lock = format!("{}{{{}}}", self.prefix, escape(name.as_str()));
                Ok(LockKeys {
                    fence: format!("{lock}:fence"),
                    channel: format!("{lock}:released"),
                    lock,
                })
            }
            Format::Redisson => {
                let n = name.as_str();
                let keys = LockKeys {
                    lock: n.to_string(),
                    fence: format!("redisson_lock_token:{{{n}}}"),
                    channel: format!("redisson_lock__channel:{{{n}}}"),
                };
                if self.cluster && slot(&keys.lock) != slot(&keys.fence) {
                    return Err(LockError::InvalidName {
                        reason: format!(
                            "{n:?} cannot be used with format=redisson on Redis Cluster: \
                             with braces in it, Redisson's key layout puts the lock and its \
                             fencing counter in different hash slots (use format=plain, \
                             which escapes braces)"
                        ),
                    });
                }
                Ok(keys)
            }
        }
    }

    /// What the lock stores as its holder for `owner`: the token itself
    /// (`plain`) or a Redisson hash field (`redisson`).
    pub(crate) fn holder(&self, owner: OwnerToken) -> String {
        match self.format {
            Format::Plain => owner.to_string(),
            Format::Redisson => redisson_field(owner),
        }
    }

    /// Whether a stored holder looks like one polylock writes (so that the
    /// fencing counter is its token).
    pub(crate) fn looks_like_ours(&self, holder: &str) -> bool {
        match self.format {
            Format::Plain => holder.parse::<OwnerToken>().is_ok(),
            Format::Redisson => holder.split_once(':').is_some_and(|(uuid, thread)| {
                uuid.len() == 36 && thread.bytes().all(|b| b.is_ascii_digit()) && !thread.is_empty()
            }),
        }
    }
}

/// The Redisson hash field polylock stores for `owner`: the 128-bit token
/// written as a UUID (`8-4-4-4-12` hex digits), a colon, and this process's
/// id in the place of Redisson's thread id, so an operator reading the hash
/// sees which process holds the lock.
///
/// The field is derived from the owner token on every call (never taken
/// from a lease), so a lease presented with another owner's token can never
/// address this owner's hold.
///
/// ```
/// use lock_core::OwnerToken;
/// let f = backend_redis::redisson_field(OwnerToken::from_u128(0x0123456789abcdef0123456789abcdef));
/// assert_eq!(f, format!("01234567-89ab-cdef-0123-456789abcdef:{}", std::process::id()));
/// ```
pub fn redisson_field(owner: OwnerToken) -> String {
    let hex = owner.to_string();
    format!(
        "{}-{}-{}-{}-{}:{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32],
        std::process::id()
    )
}

/// `%` → `%25`, `{` → `%7B`, `}` → `%7D`; everything else as is. Injective,
/// and the result has no braces.
fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' | '{' | '}' => {
                let _ = write!(out, "%{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// The Redis Cluster hash slot of `key`.
pub(crate) fn slot(key: &str) -> redis::cluster_routing::Slot {
    redis::cluster_routing::Slot::for_key(key.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(format: Format, cluster: bool) -> Layout {
        Layout {
            format,
            prefix: "polylock:".into(),
            cluster,
        }
    }

    #[test]
    fn plain_keys_share_a_slot_whatever_the_name() {
        let l = layout(Format::Plain, true);
        for n in [
            "job",
            "a{b}c",
            "}{",
            "{",
            "}",
            "{}",
            "x%7By",
            "ключ🔒",
            "a:b",
        ] {
            let k = l.keys(&LockName::new(n).unwrap()).unwrap();
            assert_eq!(slot(&k.lock), slot(&k.fence), "{n}");
            assert_eq!(slot(&k.lock), slot(&k.channel), "{n}");
        }
        let k = l.keys(&LockName::new("reports/nightly").unwrap()).unwrap();
        assert_eq!(k.lock, "polylock:{reports/nightly}");
        assert_eq!(k.fence, "polylock:{reports/nightly}:fence");
        assert_eq!(k.channel, "polylock:{reports/nightly}:released");
    }

    #[test]
    fn escaping_is_injective() {
        let l = layout(Format::Plain, false);
        let key = |n: &str| l.keys(&LockName::new(n).unwrap()).unwrap().lock;
        assert_ne!(key("a{b"), key("a%7Bb"));
        assert_ne!(key("a%2Fb"), key("a/b"));
        assert_eq!(key("a{b}"), "polylock:{a%7Bb%7D}");
    }

    #[test]
    fn redisson_keys_are_redissons() {
        let l = layout(Format::Redisson, false);
        let k = l.keys(&LockName::new("orders").unwrap()).unwrap();
        assert_eq!(k.lock, "orders");
        assert_eq!(k.fence, "redisson_lock_token:{orders}");
        assert_eq!(k.channel, "redisson_lock__channel:{orders}");
        // Braces are fine on a single server, refused on a cluster.
        assert!(l.keys(&LockName::new("a{b}c").unwrap()).is_ok());
        let c = layout(Format::Redisson, true);
        assert!(c.keys(&LockName::new("orders").unwrap()).is_ok());
        assert!(matches!(
            c.keys(&LockName::new("a{b}c").unwrap()),
            Err(LockError::InvalidName { .. })
        ));
    }

    #[test]
    fn holders() {
        let t = OwnerToken::random();
        let plain = layout(Format::Plain, false);
        assert!(plain.looks_like_ours(&plain.holder(t)));
        assert!(!plain.looks_like_ours("some-other-client"));
        let r = layout(Format::Redisson, false);
        assert!(r.looks_like_ours(&r.holder(t)));
        assert!(!r.looks_like_ours("nope"));
    }
}
