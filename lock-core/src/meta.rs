//! Who took a lock: host, process, command and start time, kept beside the
//! lock where the backend can, so an operator can tell a live holder from a
//! dead one before a forced release.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::str::FromStr;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

use crate::token::OwnerToken;

/// A holder's description, stored next to the lock at acquire time.
///
/// Every backend stores it as the one line [`HolderMeta::encode`] makes, so
/// the format lives here only. The fields are bounded (host
/// [`HolderMeta::MAX_HOST`] bytes, command [`HolderMeta::MAX_COMMAND`]
/// bytes, cut on a character boundary) so a long command line cannot blow
/// up a row or a key.
///
/// The command line is readable by anyone who can read the lock service:
/// do not lock with secrets on the command line, or leave the metadata out
/// (it is opt-in: [`crate::LockBuilder::holder_meta`]).
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use lock_core::HolderMeta;
/// let m = HolderMeta::new("web-3", 4242, "backup --full", UNIX_EPOCH + Duration::from_secs(1_700_000_000));
/// let line = m.encode();
/// assert!(!line.contains('\n'));
/// assert_eq!(HolderMeta::decode(&line), Some(m));
/// assert_eq!(HolderMeta::decode("not metadata"), None);
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderMeta {
    /// The holder's host name.
    pub host: String,
    /// The holder's process id on that host.
    pub pid: u32,
    /// What the holder runs (for `polylock run`, the command line).
    pub command: String,
    /// When the holder took the lock, by the holder's wall clock
    /// (millisecond precision).
    pub since: SystemTime,
}

/// Everything that is not a plain printable ASCII character, and the
/// separators of the line format, is percent-encoded.
const FIELD: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'=').add(b'"').add(b'\'');

/// The version marker the line starts with; a stored value without it is
/// not ours (or from a future format) and is ignored, not misread.
const MAGIC: &str = "polylock-meta/1";

impl HolderMeta {
    /// The longest host name kept, in bytes.
    pub const MAX_HOST: usize = 255;
    /// The longest command line kept, in bytes.
    pub const MAX_COMMAND: usize = 256;
    /// The longest line [`encode`](Self::encode) makes: every byte of a
    /// field may be percent-encoded (three bytes), plus the field names.
    pub const MAX_ENCODED: usize = 3 * (Self::MAX_HOST + Self::MAX_COMMAND) + 80;

    /// A description; `host` and `command` are cut to their maximum length.
    pub fn new(
        host: impl Into<String>,
        pid: u32,
        command: impl Into<String>,
        since: SystemTime,
    ) -> Self {
        let since_ms = since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        HolderMeta {
            host: cut(host.into(), Self::MAX_HOST),
            pid,
            command: cut(command.into(), Self::MAX_COMMAND),
            since: UNIX_EPOCH + Duration::from_millis(since_ms),
        }
    }

    /// This process: its host name, its pid, `command`, and now.
    pub fn of_this_process(command: impl Into<String>) -> Self {
        HolderMeta::new(host_name(), std::process::id(), command, SystemTime::now())
    }

    /// Milliseconds since the Unix epoch of [`since`](Self::since).
    pub fn since_unix_ms(&self) -> u64 {
        self.since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// The one-line form every backend stores: printable ASCII, no spaces
    /// inside fields, at most [`MAX_ENCODED`](Self::MAX_ENCODED) bytes.
    pub fn encode(&self) -> String {
        format!(
            "{MAGIC} host={} pid={} since={} cmd={}",
            utf8_percent_encode(&self.host, FIELD),
            self.pid,
            self.since_unix_ms(),
            utf8_percent_encode(&self.command, FIELD),
        )
    }

    /// Reads a line made by [`encode`](Self::encode); `None` for anything
    /// else (a foreign value, a damaged or oversized line), so a backend can
    /// hand whatever it finds beside the lock to this without checking.
    pub fn decode(line: &str) -> Option<Self> {
        if line.len() > Self::MAX_ENCODED {
            return None;
        }
        let mut parts = line.split(' ');
        if parts.next()? != MAGIC {
            return None;
        }
        let (mut host, mut pid, mut since, mut cmd) = (None, None, None, None);
        for part in parts {
            let (key, value) = part.split_once('=')?;
            let slot = match key {
                "host" => &mut host,
                "pid" => &mut pid,
                "since" => &mut since,
                "cmd" => &mut cmd,
                // Fields a later version adds are skipped.
                _ => continue,
            };
            if slot.replace(value).is_some() {
                return None;
            }
        }
        let text = |v: &str| {
            percent_decode_str(v)
                .decode_utf8()
                .ok()
                .map(|s| s.into_owned())
        };
        Some(HolderMeta::new(
            text(host?)?,
            pid?.parse().ok()?,
            text(cmd?)?,
            UNIX_EPOCH + Duration::from_millis(since?.parse().ok()?),
        ))
    }
}

/// The value a backend stores for a holder where one value must carry both
/// the owner and its description (an etcd claim key, a ZooKeeper lock
/// node): the owner token (32 lowercase hex digits), then, when there is a
/// description, a newline and [`HolderMeta::encode`]'s line.
///
/// ```
/// use lock_core::{owner_value, parse_owner_value, HolderMeta, OwnerToken};
/// let owner = OwnerToken::random();
/// let meta = HolderMeta::of_this_process("job");
/// let v = owner_value(owner, Some(&meta));
/// assert_eq!(parse_owner_value(v.as_bytes()), Some((owner, Some(meta))));
/// assert_eq!(parse_owner_value(b"10.0.0.7"), None);
/// ```
pub fn owner_value(owner: OwnerToken, meta: Option<&HolderMeta>) -> String {
    match meta {
        Some(m) => format!("{owner}\n{}", m.encode()),
        None => owner.to_string(),
    }
}

/// A value [`owner_value`] made: its owner and description (`None` when
/// the description is missing or damaged). `None` for any other value (a
/// foreign client's: empty for etcd's Go Mutex, an address for Curator).
pub fn parse_owner_value(value: &[u8]) -> Option<(OwnerToken, Option<HolderMeta>)> {
    let text = std::str::from_utf8(value).ok()?;
    let (owner, meta) = match text.split_once('\n') {
        Some((owner, line)) => (owner, Some(line)),
        None => (text, None),
    };
    // Only the form Display gives: an uppercase token is not ours.
    if owner.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let owner = OwnerToken::from_str(owner).ok()?;
    Some((owner, meta.and_then(HolderMeta::decode)))
}

impl fmt::Debug for HolderMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The command line may carry arguments the operator would rather not
        // see in every log line; Debug shows its program only.
        let program = self.command.split_whitespace().next().unwrap_or("");
        f.debug_struct("HolderMeta")
            .field("host", &self.host)
            .field("pid", &self.pid)
            .field("program", &program)
            .field("since_unix_ms", &self.since_unix_ms())
            .finish()
    }
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The kernel's host name; `HOSTNAME` or "unknown" where there is no /proc.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_fields_round_trip(host in "\\PC{0,300}", pid: u32, cmd in "\\PC{0,300}", ms in 0u64..4_000_000_000_000) {
            let m = HolderMeta::new(host, pid, cmd, UNIX_EPOCH + Duration::from_millis(ms));
            let line = m.encode();
            prop_assert!(line.len() <= HolderMeta::MAX_ENCODED);
            prop_assert!(line.bytes().all(|b| (0x21..0x7f).contains(&b) || b == b' '));
            prop_assert_eq!(HolderMeta::decode(&line), Some(m));
        }
    }

    #[test]
    fn long_fields_are_cut_on_a_character_boundary() {
        let m = HolderMeta::new("h".repeat(400), 1, "é".repeat(200), UNIX_EPOCH);
        assert_eq!(m.host.len(), HolderMeta::MAX_HOST);
        assert_eq!(m.command.len(), HolderMeta::MAX_COMMAND);
        assert!(m.command.chars().all(|c| c == 'é'));
    }

    #[test]
    fn foreign_and_damaged_values_are_not_metadata() {
        for line in [
            "",
            "a1b2c3-uuid",
            "polylock-meta/1",
            "polylock-meta/1 host=a pid=x since=1 cmd=b",
            "polylock-meta/1 host=a pid=1 since=1 cmd=b host=c",
            "polylock-meta/2 host=a pid=1 since=1 cmd=b",
            "polylock-meta/1 host=%ff pid=1 since=1 cmd=b",
        ] {
            assert_eq!(HolderMeta::decode(line), None, "{line:?}");
        }
        let later = "polylock-meta/1 host=a pid=1 since=1 cmd=b tty=pts%2F1";
        assert_eq!(HolderMeta::decode(later).map(|m| m.pid), Some(1));
    }

    #[test]
    fn debug_shows_the_program_not_its_arguments() {
        let m = HolderMeta::new("h", 1, "mysql -psecret db", UNIX_EPOCH);
        let shown = format!("{m:?}");
        assert!(shown.contains("mysql"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn owner_values_round_trip_and_foreign_ones_are_not_ours() {
        let owner = OwnerToken::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let meta = HolderMeta::new("h", 7, "job a\nb", UNIX_EPOCH + Duration::from_secs(1));
        let plain = owner_value(owner, None);
        assert_eq!(plain, "0123456789abcdef0123456789abcdef");
        assert_eq!(parse_owner_value(plain.as_bytes()), Some((owner, None)));
        let described = owner_value(owner, Some(&meta));
        assert_eq!(described.matches('\n').count(), 1, "{described:?}");
        assert_eq!(
            parse_owner_value(described.as_bytes()),
            Some((owner, Some(meta)))
        );
        // Damaged metadata leaves the value ours, without a description.
        let damaged = format!("{owner}\nsomething else");
        assert_eq!(parse_owner_value(damaged.as_bytes()), Some((owner, None)));
        for foreign in [
            &b""[..],
            b"leader-1",
            b"127.0.1.1",
            b"0123456789ABCDEF0123456789ABCDEF",
            b"0123456789abcdef0123456789abcde",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_owner_value(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn this_process_is_described() {
        let m = HolderMeta::of_this_process("x");
        assert_eq!(m.pid, std::process::id());
        assert!(!m.host.is_empty());
    }
}
