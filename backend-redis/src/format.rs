//! The two wire formats: where a lock lives (keys, channel), who it belongs
//! to (the stored holder identity), and the scripts that act on it.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use lock_core::{LockError, LockName, OwnerToken};
use redis::cluster_routing::Slot;
use redis::Script;

use crate::config::Format;

/// The Redis keys and channel of one lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockKeys {
    /// The lock itself: a string (`plain`) or a hash (`redisson`).
    pub lock: String,
    /// Where the fencing counter lives, bumped by every acquisition and
    /// never reset: in the `plain` format a hash whose field `fence` is the
    /// counter and `owner` the token of the last polylock grant; in the
    /// `redisson` format Redisson's string counter.
    pub fence: String,
    /// The channel a release is published on.
    pub channel: String,
    /// polylock's own bookkeeping hash, where the `owner` field names the
    /// holder of the last polylock grant and `meta` describes it
    /// ([`lock_core::HolderMeta`]): in the `plain` format the same hash as
    /// [`fence`](Self::fence); in the `redisson` format
    /// `__polylock__:redisson:{TAG}[:NAME]`, beside Redisson's own keys,
    /// which it leaves exactly as Redisson writes them.
    pub bookkeeping: String,
    /// Fair mode (`?fair=true`, `plain` format only): the queue of waiters,
    /// a sorted set of waiter ids by arrival, `__polylock__:queue:{TAG}[:KEY]`.
    pub queue: String,
    /// Fair mode: each queued waiter's deadline (server milliseconds), a
    /// sorted set `__polylock__:queue-deadlines:{TAG}[:KEY]`; an entry
    /// past it is dropped by the next script that reads the queue.
    pub queue_deadlines: String,
    /// Fair mode: what a release needs to hand the lock straight to each
    /// queued waiter (its TTL, owner token and holder description, and when
    /// it last asked), a hash `__polylock__:queue-waiters:{TAG}[:KEY]`.
    pub queue_waiters: String,
    /// Fair mode: a waiter with id `ID` is woken on the channel
    /// `wake_prefix` + `ID`, which only it subscribes to.
    pub wake_prefix: String,
}

/// The scripts of one format. Each is hashed once ([`Script`] keeps the
/// SHA-1), sent with EVALSHA, and loaded again by the driver on NOSCRIPT
/// (after a server restart or `SCRIPT FLUSH`).
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) renew: Script,
    /// Renews a batch of leases in one run (`renew_many.lua`) on a single
    /// server, where a script may touch any key.
    pub(crate) renew_many: Script,
    /// The same on a cluster node: the flag lets it read the keys of every
    /// slot the node serves, though only the first lease's key is declared
    /// (the one that routes the call); a key of a slot served elsewhere
    /// makes that lease's answer -2, and it is renewed on its own.
    pub(crate) renew_many_cluster: Script,
    pub(crate) inspect: Script,
}

/// Declares a script allowed to touch keys of several slots (Redis 7
/// script flags); an older server refuses it, and the batch then falls back
/// to one renew per lease.
macro_rules! cross_slot {
    ($($body:expr),+) => {
        concat!("#!lua flags=allow-cross-slot-keys\n", $($body),+)
    };
}

static PLAIN: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(concat!(
        include_str!("../scripts/fence_seed.lua"),
        include_str!("../scripts/plain_grant.lua"),
        include_str!("../scripts/plain_acquire.lua")
    )),
    release: Script::new(concat!(
        include_str!("../scripts/counter_fn.lua"),
        include_str!("../scripts/plain_release_fn.lua"),
        include_str!("../scripts/plain_release.lua")
    )),
    renew: Script::new(concat!(
        include_str!("../scripts/counter_fn.lua"),
        include_str!("../scripts/plain_renew_fn.lua"),
        include_str!("../scripts/plain_renew.lua")
    )),
    renew_many: Script::new(concat!(
        include_str!("../scripts/counter_fn.lua"),
        include_str!("../scripts/plain_renew_fn.lua"),
        include_str!("../scripts/renew_many.lua")
    )),
    renew_many_cluster: Script::new(cross_slot!(
        include_str!("../scripts/counter_fn.lua"),
        include_str!("../scripts/plain_renew_fn.lua"),
        include_str!("../scripts/renew_many.lua")
    )),
    inspect: Script::new(include_str!("../scripts/plain_inspect.lua")),
});

static REDISSON: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(concat!(
        include_str!("../scripts/fence_seed.lua"),
        include_str!("../scripts/redisson_extend_fn.lua"),
        include_str!("../scripts/redisson_acquire.lua")
    )),
    release: Script::new(concat!(
        include_str!("../scripts/redisson_extend_fn.lua"),
        include_str!("../scripts/redisson_release.lua")
    )),
    renew: Script::new(concat!(
        include_str!("../scripts/redisson_extend_fn.lua"),
        include_str!("../scripts/redisson_renew_fn.lua"),
        include_str!("../scripts/redisson_renew.lua")
    )),
    renew_many: Script::new(concat!(
        include_str!("../scripts/redisson_extend_fn.lua"),
        include_str!("../scripts/redisson_renew_fn.lua"),
        include_str!("../scripts/renew_many.lua")
    )),
    renew_many_cluster: Script::new(cross_slot!(
        include_str!("../scripts/redisson_extend_fn.lua"),
        include_str!("../scripts/redisson_renew_fn.lua"),
        include_str!("../scripts/renew_many.lua")
    )),
    inspect: Script::new(include_str!("../scripts/redisson_inspect.lua")),
});

/// The scripts of the fair mode (`plain` format, `?fair=true`): the
/// queue's pieces in `fair_queue.lua`, shared with the plain format's grant
/// and release.
pub(crate) struct FairScripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) leave: Script,
    pub(crate) waiters: Script,
}

pub(crate) static FAIR: LazyLock<FairScripts> = LazyLock::new(|| FairScripts {
    acquire: Script::new(concat!(
        include_str!("../scripts/fence_seed.lua"),
        include_str!("../scripts/plain_grant.lua"),
        include_str!("../scripts/fair_queue.lua"),
        include_str!("../scripts/fair_acquire.lua")
    )),
    release: Script::new(concat!(
        include_str!("../scripts/counter_fn.lua"),
        include_str!("../scripts/plain_release_fn.lua"),
        include_str!("../scripts/fence_seed.lua"),
        include_str!("../scripts/plain_grant.lua"),
        include_str!("../scripts/fair_queue.lua"),
        include_str!("../scripts/fair_release.lua")
    )),
    leave: Script::new(concat!(
        include_str!("../scripts/fence_seed.lua"),
        include_str!("../scripts/plain_grant.lua"),
        include_str!("../scripts/fair_queue.lua"),
        include_str!("../scripts/fair_leave.lua")
    )),
    waiters: Script::new(concat!(
        include_str!("../scripts/fence_seed.lua"),
        include_str!("../scripts/plain_grant.lua"),
        include_str!("../scripts/fair_queue.lua"),
        include_str!("../scripts/fair_waiters.lua")
    )),
});

pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/force_release.lua")));

/// Every script, for loading them all once at connect time.
pub(crate) fn all_scripts() -> Vec<&'static Script> {
    let mut v = vec![&*FORCE_RELEASE];
    for s in [&*PLAIN, &*REDISSON] {
        // Not the cluster batch: a server older than Redis 7 refuses its
        // flags, and that must not fail the connect (the batch falls back).
        v.extend([&s.acquire, &s.release, &s.renew, &s.renew_many, &s.inspect]);
    }
    v.extend([&FAIR.acquire, &FAIR.release, &FAIR.leave, &FAIR.waiters]);
    v
}

/// The message Redisson publishes at unlock (its `UNLOCK_MESSAGE`, the
/// number 0); the plain format publishes the same.
pub(crate) const RELEASE_MESSAGE: &str = "0";

/// The namespace of every key and channel polylock keeps beside a
/// `plain`-format lock. No other client writes keys that begin with it, and
/// lock keys that would begin with it are refused, so our bookkeeping can
/// never collide with a lock or a foreign client's data.
pub(crate) const AUX: &str = "__polylock__:";

/// Where the `redisson` format's bookkeeping hashes start, inside [`AUX`].
const REDISSON_BOOK: &str = "__polylock__:redisson:";

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
    /// `plain`: the lock is `PREFIX NAME` (no prefix by default), exactly
    /// the key redis-py's `Lock(NAME)`, redsync, node-redlock and `SET NAME
    /// token NX PX` scripts use. Beside it, in the [`AUX`] namespace, a hash
    /// `__polylock__:{TAG}[:KEY]` (fields `fence`: the fencing counter,
    /// `owner`: the token of the last polylock grant) and the release
    /// channel `__polylock__:released:{TAG}[:KEY]`. `TAG` is chosen so that
    /// the braces we add are the key's hash tag and hash to the lock key's
    /// own Redis Cluster slot (see [`cluster_tag`]); the lock key follows
    /// whenever `TAG` is not the key itself, so two locks never share
    /// bookkeeping.
    ///
    /// `redisson`: `NAME`, `redisson_lock_token:{NAME}`,
    /// `redisson_lock__channel:{NAME}`, exactly as Redisson names them. A
    /// name containing braces breaks Redisson's own co-location on a
    /// cluster; there such a name is refused before any I/O rather than
    /// failing with CROSSSLOT.
    pub(crate) fn keys(&self, name: &LockName) -> Result<LockKeys, LockError> {
        self.key_set(name).map(|k| k.all())
    }

    /// The keys of `name` as [`Keys`], which builds each one only when an
    /// operation asks for it; fails as [`keys`](Self::keys) does.
    pub(crate) fn key_set(&self, name: &LockName) -> Result<Keys, LockError> {
        let lock = match self.format {
            Format::Plain => join(&[&self.prefix, name.as_str()]),
            Format::Redisson => name.as_str().to_string(),
        };
        if lock.starts_with(AUX) {
            return Err(aux_refused(&lock));
        }
        let keys = Keys {
            format: self.format,
            beside: beside(&lock),
            lock,
        };
        if self.format == Format::Redisson
            && self.cluster
            && slot(&keys.lock) != slot(&keys.fence())
        {
            return Err(LockError::InvalidName {
                reason: format!(
                    "{:?} cannot be used with format=redisson on Redis Cluster: \
                     with braces in it, Redisson's key layout puts the lock and its \
                     fencing counter in different hash slots (use format=plain, \
                     whose bookkeeping keys follow the lock's slot)",
                    keys.lock
                ),
            });
        }
        Ok(keys)
    }

    /// The `SCAN MATCH` pattern of this format's bookkeeping hashes.
    pub(crate) fn bookkeeping_pattern(&self) -> String {
        match self.format {
            Format::Plain => format!("{AUX}{{*"),
            Format::Redisson => format!("{REDISSON_BOOK}{{*"),
        }
    }

    /// The lock whose bookkeeping hash is `key`, if `key` is one of this
    /// layout's (format and prefix): the exact name, recovered from the key
    /// (`{TAG}` then `:KEY`, or `{KEY}` alone; a tag never contains `}`, so
    /// the split is unambiguous) and checked by mapping it back.
    pub(crate) fn name_of_bookkeeping(&self, key: &str) -> Option<LockName> {
        let rest = match self.format {
            Format::Plain => key.strip_prefix(AUX)?,
            Format::Redisson => key.strip_prefix(REDISSON_BOOK)?,
        };
        let (tag, after) = rest.strip_prefix('{')?.split_once('}')?;
        let lock_key = if after.is_empty() {
            tag
        } else {
            after.strip_prefix(':')?
        };
        let name = match self.format {
            Format::Plain => lock_key.strip_prefix(self.prefix.as_str())?,
            Format::Redisson => lock_key,
        };
        let name = LockName::new(name).ok()?;
        (self.key_set(&name).ok()?.bookkeeping() == key).then_some(name)
    }

    /// What the lock stores as its holder for `owner`: the token itself
    /// (`plain`) or a Redisson hash field (`redisson`).
    pub(crate) fn holder(&self, owner: OwnerToken) -> String {
        match self.format {
            Format::Plain => owner.to_string(),
            Format::Redisson => redisson_field(owner),
        }
    }

    /// Whether a stored Redisson holder looks like one polylock writes (so
    /// that the fencing counter is its token). The `plain` format knows its
    /// own holders exactly (the `owner` field beside the counter).
    pub(crate) fn looks_like_ours(&self, holder: &str) -> bool {
        holder.split_once(':').is_some_and(|(uuid, thread)| {
            uuid.len() == 36 && thread.bytes().all(|b| b.is_ascii_digit()) && !thread.is_empty()
        })
    }
}

/// The keys and channels of one lock, each built when asked for.
///
/// Outside fair mode an operation needs two to four of the eight (a
/// plain-format acquire only the lock and its fencing counter, a renewal
/// batch the same two per lease), and every operation builds its keys
/// anew: building all of them each time was a sixth of the client's
/// instructions per acquire + release (callgrind, 64 tasks on distinct
/// names). Each method returns what the same field of [`LockKeys`] holds.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    format: Format,
    /// [`LockKeys::lock`].
    pub(crate) lock: String,
    /// `{TAG}` or `{TAG}:KEY` (see [`beside`]).
    beside: String,
}

impl Keys {
    /// The namespace of this format's own keys beside the lock.
    fn aux(&self) -> &'static str {
        match self.format {
            Format::Plain => AUX,
            Format::Redisson => REDISSON_BOOK,
        }
    }

    /// [`LockKeys::fence`].
    pub(crate) fn fence(&self) -> String {
        match self.format {
            Format::Plain => join(&[AUX, &self.beside]),
            Format::Redisson => join(&["redisson_lock_token:{", &self.lock, "}"]),
        }
    }

    /// [`LockKeys::channel`].
    pub(crate) fn channel(&self) -> String {
        match self.format {
            Format::Plain => join(&[AUX, "released:", &self.beside]),
            Format::Redisson => join(&["redisson_lock__channel:{", &self.lock, "}"]),
        }
    }

    /// [`LockKeys::bookkeeping`].
    pub(crate) fn bookkeeping(&self) -> String {
        join(&[self.aux(), &self.beside])
    }

    /// [`LockKeys::queue`].
    pub(crate) fn queue(&self) -> String {
        join(&[self.aux(), "queue:", &self.beside])
    }

    /// [`LockKeys::queue_deadlines`].
    pub(crate) fn queue_deadlines(&self) -> String {
        join(&[self.aux(), "queue-deadlines:", &self.beside])
    }

    /// [`LockKeys::queue_waiters`].
    pub(crate) fn queue_waiters(&self) -> String {
        join(&[self.aux(), "queue-waiters:", &self.beside])
    }

    /// [`LockKeys::wake_prefix`].
    pub(crate) fn wake_prefix(&self) -> String {
        join(&[self.aux(), "wake:", &self.beside, ":"])
    }

    /// All of them.
    pub(crate) fn all(&self) -> LockKeys {
        LockKeys {
            lock: self.lock.clone(),
            fence: self.fence(),
            channel: self.channel(),
            bookkeeping: self.bookkeeping(),
            queue: self.queue(),
            queue_deadlines: self.queue_deadlines(),
            queue_waiters: self.queue_waiters(),
            wake_prefix: self.wake_prefix(),
        }
    }
}

/// `{TAG}` or `{TAG}:KEY`: what follows a namespace to make a key in
/// `key`'s cluster slot that no other lock key maps to.
fn beside(key: &str) -> String {
    let tag = cluster_tag(key);
    if tag == key {
        join(&["{", &tag, "}"])
    } else {
        join(&["{", &tag, "}:", key])
    }
}

/// `parts` end to end, in one allocation of the exact size. Every lock
/// operation builds its keys anew, and through `format!` (which grows its
/// buffer as it goes) that was a third of the client's instructions per
/// acquire + release (callgrind, 64 tasks on distinct names).
fn join(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

fn aux_refused(key: &str) -> LockError {
    LockError::InvalidName {
        reason: format!(
            "{key:?} begins with {AUX:?}, the namespace polylock keeps its fencing counters, \
             bookkeeping and channels in"
        ),
    }
}

/// The hash tag Redis Cluster would use for `key`, by its rules: the bytes
/// between the first `{` and the first `}` after it, if there are any.
fn own_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    let tag = &key[open + 1..open + 1 + close];
    (!tag.is_empty()).then_some(tag)
}

/// A text that, written as `{TAG}` at the start of a key's braces, puts
/// that key in `key`'s cluster slot:
/// - `key`'s own hash tag, if it has one (its slot is that tag's);
/// - else `key` itself when it has no `}` (its slot is the whole key's,
///   and `{key}` closes at our brace);
/// - else (`a}b{`, `{}x`: a `}` would end our tag early) a short tag
///   found to hash to the same slot ([`tag_of_slot`]).
///
/// The result never contains `}`, so the braces around it are the first
/// pair in the key we build.
pub(crate) fn cluster_tag(key: &str) -> std::borrow::Cow<'_, str> {
    if let Some(tag) = own_tag(key) {
        return tag.into();
    }
    if !key.contains('}') {
        return key.into();
    }
    tag_of_slot(slot(key)).into()
}

/// A short tag (decimal digits) in `slot`, searched once per slot and
/// remembered: about 16 000 hashes of a few bytes the first time.
fn tag_of_slot(slot: Slot) -> String {
    static FOUND: LazyLock<Mutex<HashMap<Slot, String>>> =
        LazyLock::new(|| Mutex::new(HashMap::new()));
    let mut found = FOUND.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(tag) = found.get(&slot) {
        return tag.clone();
    }
    // Every slot is reached well before a few million candidates
    // (coupon collector over 16 384 slots); the bound only guards the loop.
    let tag = (0u64..u64::MAX)
        .map(|i| i.to_string())
        .find(|t| Slot::for_key(t.as_bytes()) == slot)
        .expect("CRC16 reaches every slot");
    found.insert(slot, tag.clone());
    tag
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

/// The Redis Cluster hash slot of `key`.
pub(crate) fn slot(key: &str) -> Slot {
    Slot::for_key(key.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(format: Format, cluster: bool, prefix: &str) -> Layout {
        Layout {
            format,
            prefix: prefix.into(),
            cluster,
        }
    }

    #[test]
    fn plain_lock_key_is_the_name_and_bookkeeping_shares_its_slot() {
        let l = layout(Format::Plain, true, "");
        let long = format!("{{x}}{}", "}{".repeat(50));
        for n in [
            "job",
            "a{b}c",
            "}{",
            "{",
            "}",
            "{}",
            "{}x",
            "a}b{",
            "x%7By",
            "ключ🔒",
            "a:b",
            "{user1}.lock",
            long.as_str(),
        ] {
            let k = l.keys(&LockName::new(n).unwrap()).unwrap();
            assert_eq!(k.lock, n, "the lock key is the name itself");
            assert_eq!(slot(&k.lock), slot(&k.fence), "{n}");
            assert_eq!(slot(&k.lock), slot(&k.channel), "{n}");
            assert_eq!(slot(&k.lock), slot(&k.queue), "{n}");
            assert_eq!(slot(&k.lock), slot(&k.queue_deadlines), "{n}");
            assert_eq!(slot(&k.lock), slot(&k.queue_waiters), "{n}");
            assert!(k.fence.starts_with(AUX) && k.channel.starts_with(AUX));
        }
        let k = l.keys(&LockName::new("reports/nightly").unwrap()).unwrap();
        assert_eq!(k.lock, "reports/nightly");
        assert_eq!(k.fence, "__polylock__:{reports/nightly}");
        assert_eq!(k.channel, "__polylock__:released:{reports/nightly}");
        assert_eq!(k.bookkeeping, k.fence);
        // The fair mode's keys are shared by every client version on the
        // lock: pinned, byte for byte.
        assert_eq!(k.queue, "__polylock__:queue:{reports/nightly}");
        assert_eq!(
            k.queue_deadlines,
            "__polylock__:queue-deadlines:{reports/nightly}"
        );
        assert_eq!(
            k.queue_waiters,
            "__polylock__:queue-waiters:{reports/nightly}"
        );
        assert_eq!(k.wake_prefix, "__polylock__:wake:{reports/nightly}:");
        // A name's own tag is kept, and the full key follows it.
        let k = l.keys(&LockName::new("{user1}.lock").unwrap()).unwrap();
        assert_eq!(k.fence, "__polylock__:{user1}:{user1}.lock");
        assert_eq!(k.wake_prefix, "__polylock__:wake:{user1}:{user1}.lock:");
        // A prefix only when asked for.
        let p = layout(Format::Plain, false, "app:");
        let k = p.keys(&LockName::new("job").unwrap()).unwrap();
        assert_eq!(k.lock, "app:job");
        assert_eq!(k.fence, "__polylock__:{app:job}");
    }

    #[test]
    fn bookkeeping_keys_are_distinct_per_lock() {
        let l = layout(Format::Plain, false, "");
        let names = [
            "a", "{a}", "{a}x", "a}:a", "{}a", "a}b{", "}", "{", "x}", "{a}:{a}",
        ];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            let k = l.keys(&LockName::new(n).unwrap()).unwrap();
            assert!(seen.insert(k.fence.clone()), "{n}: {}", k.fence);
            assert!(seen.insert(k.channel.clone()), "{n}: {}", k.channel);
            assert!(seen.insert(k.queue.clone()), "{n}: {}", k.queue);
            assert!(seen.insert(k.queue_deadlines.clone()), "{n}");
            assert!(seen.insert(k.queue_waiters.clone()), "{n}");
        }
    }

    #[test]
    fn the_aux_namespace_is_refused_as_a_lock_key() {
        let l = layout(Format::Plain, false, "");
        let e = l.keys(&LockName::new("__polylock__:{job}").unwrap());
        assert!(matches!(e, Err(LockError::InvalidName { .. })), "{e:?}");
        let p = layout(Format::Plain, false, "__polylock__:");
        assert!(p.keys(&LockName::new("job").unwrap()).is_err());
        // Nor as a Redisson lock, whose bookkeeping lives there too.
        let r = layout(Format::Redisson, false, "");
        let e = r.keys(&LockName::new("__polylock__:redisson:{job}").unwrap());
        assert!(matches!(e, Err(LockError::InvalidName { .. })), "{e:?}");
    }

    #[test]
    fn fallback_tags_hash_to_the_slot_and_are_remembered() {
        for key in ["a}b{", "{}x", "}", "}}{{", "{}"] {
            let tag = cluster_tag(key);
            assert!(!tag.contains('}'));
            assert_eq!(slot(&format!("{{{tag}}}")), slot(key), "{key}");
            assert_eq!(cluster_tag(key), tag);
        }
    }

    #[test]
    fn redisson_keys_are_redissons() {
        let l = layout(Format::Redisson, false, "");
        let k = l.keys(&LockName::new("orders").unwrap()).unwrap();
        assert_eq!(k.lock, "orders");
        assert_eq!(k.fence, "redisson_lock_token:{orders}");
        assert_eq!(k.channel, "redisson_lock__channel:{orders}");
        assert_eq!(k.bookkeeping, "__polylock__:redisson:{orders}");
        // Braces are fine on a single server, refused on a cluster.
        assert!(l.keys(&LockName::new("a{b}c").unwrap()).is_ok());
        let c = layout(Format::Redisson, true, "");
        assert!(c.keys(&LockName::new("orders").unwrap()).is_ok());
        assert!(matches!(
            c.keys(&LockName::new("a{b}c").unwrap()),
            Err(LockError::InvalidName { .. })
        ));
    }

    #[test]
    fn names_come_back_from_their_bookkeeping_keys() {
        let long = format!("{{x}}{}", "}{".repeat(50));
        let names = [
            "job",
            "a{b}c",
            "}{",
            "{",
            "}",
            "{}",
            "{}x",
            "a}b{",
            "a:b",
            "{u}:{u}",
            "ключ🔒",
            "b x",
            "c/d",
            long.as_str(),
        ];
        for (format, prefix) in [
            (Format::Plain, ""),
            (Format::Plain, "app:"),
            (Format::Plain, "{p}"),
            (Format::Redisson, ""),
        ] {
            let l = layout(format, false, prefix);
            for n in names {
                let name = LockName::new(n).unwrap();
                let k = l.keys(&name).unwrap();
                assert_eq!(
                    l.name_of_bookkeeping(&k.bookkeeping),
                    Some(name),
                    "{format:?} {prefix:?} {n:?}"
                );
                let pattern = l.bookkeeping_pattern();
                assert!(k.bookkeeping.starts_with(pattern.trim_end_matches('*')));
            }
        }
        let plain = layout(Format::Plain, false, "");
        let redisson = layout(Format::Redisson, false, "");
        let other = layout(Format::Plain, false, "app:");
        let job = LockName::new("job").unwrap();
        // Each layout knows only its own keys.
        assert_eq!(
            redisson.name_of_bookkeeping(&plain.keys(&job).unwrap().bookkeeping),
            None
        );
        assert_eq!(
            plain.name_of_bookkeeping(&redisson.keys(&job).unwrap().bookkeeping),
            None
        );
        assert_eq!(
            other.name_of_bookkeeping(&plain.keys(&job).unwrap().bookkeeping),
            None
        );
        for junk in [
            "__polylock__:{",
            "__polylock__:{a}b",
            "__polylock__:{a}:b",
            "x",
            "__polylock__:released:{a}",
        ] {
            assert_eq!(plain.name_of_bookkeeping(junk), None, "{junk}");
        }
    }

    #[test]
    fn redisson_holders() {
        let t = OwnerToken::random();
        let r = layout(Format::Redisson, false, "");
        assert!(r.looks_like_ours(&r.holder(t)));
        assert!(!r.looks_like_ours("nope"));
    }
}
