//! Lock names → ZooKeeper paths, and the names of lock nodes.
//!
//! # Name mapping
//! Lock `NAME` is the directory `{chroot}/{prefix}/{NAME}`, so a Java service
//! using `new InterProcessMutex(client, "/{prefix}/{NAME}")` shares the lock.
//! ZooKeeper refuses empty path segments, the segments `.` and `..`, and
//! some code points (U+0001–U+001F, U+007F–U+009F, U+D800–U+F8FF,
//! U+FFF0–U+FFFF, and every code point above U+FFFF, which Java sees as
//! surrogates); NUL never reaches here ([`LockName`] refuses it). So:
//! - `%` becomes `%25` and every refused code point becomes the `%XX`
//!   escapes of its UTF-8 bytes; a segment `.` becomes `%2E` and `..`
//!   becomes `%2E%2E`. A name made only of such segments keeps its `/`
//!   as path separators (`reports/nightly` → `.../reports/nightly`).
//! - A name with an empty segment (`/a`, `a/`, `a//b`) becomes ONE segment
//!   in which `/` is escaped as `%2F` too.
//! - A segment after the first that Curator and polylock would take for a
//!   lock node (`lock-` and ten or more digits at its end, as in
//!   `jobs/lock-0000000001`) has its last digit escaped (`%31`): its
//!   directory sits among the lock nodes of the name before it, which would
//!   otherwise count it as a contender that never leaves.
//!
//! Percent-decoding the result gives the name back in both cases, so two
//! names never share a directory.
//!
//! Curator does not skip directories among a lock's nodes: it sorts the
//! children by the text after their last `lock-` (the whole name when
//! there is none) and waits on the one just before its own. A nested
//! name's directory whose text sorts before the ten-digit sequences (one
//! that starts below `0`, as `%`, `-` and `.` do, an escaped segment
//! above included, or a short run of zeros) stands before every Curator
//! contender and never goes: Curator clients then wait forever on the
//! name above it. polylock's contenders count only lock nodes, so this
//! touches Curator alone. Share a lock with Curator only on a name with
//! no polylock names nested under it.
//!
//! # Lock nodes
//! A contender's node is `_c_{uuid}-lock-{sequence}`: Apache Curator's
//! `InterProcessMutex` in protected mode. The uuid (random per attempt)
//! finds our node again when the reply to its create was lost; the
//! ten-digit sequence the server appends orders the queue.

use std::fmt::Write;

use lock_core::LockName;

/// What Curator's `InterProcessMutex` puts between the protection and the
/// sequence.
pub(crate) const LOCK_NAME: &str = "lock-";
/// Curator's protected-mode marker.
const PROTECTED: &str = "_c_";

/// ZooKeeper checks paths as Java strings, in UTF-16 units: a code point
/// above U+FFFF is a surrogate pair there, inside the refused
/// U+D800–U+F8FF, so it is refused too.
fn refused(c: char) -> bool {
    matches!(c, '\u{1}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..)
}

fn escape_into(out: &mut String, s: &str, slash: bool) {
    let plain = |c: char| !(c == '%' || refused(c) || (slash && c == '/'));
    if s.chars().all(plain) {
        // The usual name: nothing to escape, one copy.
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        if c == '%' || refused(c) || (slash && c == '/') {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                // Writing to a String cannot fail.
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

/// The path segments (relative, no leading `/`) of `name`'s directory.
pub(crate) fn name_path(name: &LockName) -> String {
    let name = name.as_str();
    let mut out = String::with_capacity(name.len());
    if name.split('/').any(str::is_empty) {
        escape_into(&mut out, name, true);
        return out;
    }
    for (i, seg) in name.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        match seg {
            "." => out.push_str("%2E"),
            ".." => out.push_str("%2E%2E"),
            _ if i > 0 && sequence_of(seg).is_some() => {
                // The last character is an ASCII digit: escaped, no digit
                // run ends the segment any more.
                let (head, last) = seg.split_at(seg.len() - 1);
                escape_into(&mut out, head, false);
                let _ = write!(out, "%{:02X}", last.as_bytes()[0]);
            }
            _ => escape_into(&mut out, seg, false),
        }
    }
    out
}

/// The lock name whose directory is `rel` (relative to the prefix root),
/// if `rel` is exactly what [`name_path`] makes of a name: a directory some
/// other client named differently (`a%zz`, `a/%41`) is not a polylock lock.
pub(crate) fn name_of_path(rel: &str) -> Option<LockName> {
    let decoded = percent_encoding::percent_decode_str(rel)
        .decode_utf8()
        .ok()?;
    let name = LockName::new(decoded.as_ref()).ok()?;
    (name_path(&name) == rel).then_some(name)
}

/// Whether a directory whose name (decoded) is `name` may hold, itself or
/// below it, the lock of a name starting with `prefix`.
pub(crate) fn may_lead_to(name: &str, prefix: &str) -> bool {
    name.starts_with(prefix)
        || prefix
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Refuses what ZooKeeper refuses in one path segment (for URL pieces,
/// which are not escaped: they name paths other clients use as given).
pub(crate) fn validate_segment(seg: &str) -> Result<(), String> {
    if seg.is_empty() {
        return Err("a path segment is empty".into());
    }
    if seg == "." || seg == ".." {
        return Err(format!("`{seg}` is not allowed as a path segment"));
    }
    if let Some(c) = seg.chars().find(|&c| c == '\0' || refused(c)) {
        return Err(format!("the character {c:?} is not allowed in a path"));
    }
    Ok(())
}

/// The create path for a contender with `uuid`: the server appends the
/// sequence.
pub(crate) fn node_prefix(dir: &str, uuid: &str) -> String {
    let mut p = String::with_capacity(dir.len() + uuid.len() + 20 + SEQUENCE_DIGITS);
    for piece in [dir, "/", PROTECTED, uuid, "-", LOCK_NAME] {
        p.push_str(piece);
    }
    p
}

/// The digits ZooKeeper appends to a sequential node's name while its
/// counter fits in 32 bits (a 64-bit one gets nineteen).
const SEQUENCE_DIGITS: usize = 10;

/// The node the server created for `prefix` with sequence `seq`: the name
/// `CreateSequence` prints, built without the formatting machinery (this
/// runs once per acquisition).
pub(crate) fn node_path(prefix: &str, seq: i64) -> String {
    let width = if seq <= i64::from(i32::MAX) {
        SEQUENCE_DIGITS
    } else {
        19
    };
    let Ok(mut n) = u64::try_from(seq) else {
        // A negative counter (a 32-bit one that wrapped): rare enough for
        // the general path, which pads after the sign as the server does.
        return format!("{prefix}{seq:0width$}");
    };
    let mut digits = [b'0'; 20];
    let mut at = digits.len();
    while n > 0 {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    let start = at.min(digits.len() - width);
    let mut p = String::with_capacity(prefix.len() + digits.len() - start);
    p.push_str(prefix);
    // ASCII digits only.
    p.push_str(std::str::from_utf8(&digits[start..]).unwrap_or_default());
    p
}

/// A child of a lock directory that is a contender: its sequence number.
/// Curator sorts by what follows `lock-`, so any node with it counts (a
/// node of a Curator client without protection too).
pub(crate) fn sequence_of(child: &str) -> Option<i64> {
    // Most segments of lock names end in a letter: answered without
    // setting up a substring search.
    if !child.as_bytes().last().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let i = child.rfind(LOCK_NAME)?;
    let digits = &child[i + LOCK_NAME.len()..];
    if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The contenders among `children`, lowest sequence first.
pub(crate) fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut q: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|c| sequence_of(&c).map(|s| (s, c)))
        .collect();
    q.sort();
    q
}

/// Whether `child` was created by the attempt that used `uuid`.
pub(crate) fn is_ours(child: &str, uuid: &str) -> bool {
    child
        .strip_prefix(PROTECTED)
        .and_then(|r| r.strip_prefix(uuid))
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|r| r.starts_with(LOCK_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;
    use percent_encoding::percent_decode_str;

    fn p(s: &str) -> String {
        name_path(&LockName::new(s).unwrap())
    }

    #[test]
    fn node_path_is_the_name_the_server_gives() {
        for seq in [0, 7, 42, 999_999_999, 1_000_000_000, i64::from(i32::MAX)] {
            assert_eq!(node_path("/d/p-", seq), format!("/d/p-{seq:010}"));
        }
        for seq in [i64::from(i32::MAX) + 1, i64::MAX] {
            assert_eq!(node_path("/d/p-", seq), format!("/d/p-{seq:019}"));
        }
        assert_eq!(node_path("/d/p-", -1), "/d/p--000000001");
        let seq = sequence_of(&node_path("/d/_c_u-lock-", 42)).unwrap();
        assert_eq!(seq, 42);
    }

    #[test]
    fn plain_names_keep_their_slashes() {
        assert_eq!(p("job"), "job");
        assert_eq!(p("reports/nightly"), "reports/nightly");
        assert_eq!(p("ünï/ключ"), "ünï/ключ");
    }

    #[test]
    fn what_zookeeper_refuses_is_escaped() {
        assert_eq!(p("."), "%2E");
        assert_eq!(p("a/../b"), "a/%2E%2E/b");
        assert_eq!(p("100%"), "100%25");
        assert_eq!(p("tab\there"), "tab%09here");
        assert_eq!(p("/a"), "%2Fa");
        assert_eq!(p("a//b"), "a%2F%2Fb");
        assert_eq!(p("a/"), "a%2F");
        assert_eq!(p("\u{e000}"), "%EE%80%80");
        assert_eq!(p("🔒"), "%F0%9F%94%92");
        for n in [
            ".",
            "a/../b",
            "/a",
            "a//b",
            "x\u{7f}y",
            "\u{fff0}",
            "zookeeper",
        ] {
            for seg in p(n).split('/') {
                validate_segment(seg).unwrap_or_else(|e| panic!("{n:?}: {e}"));
            }
        }
    }

    #[test]
    fn the_mapping_decodes_back_so_names_never_collide() {
        let names = [
            "a", "a/b", "a%2Fb", "a%252Fb", "/a", "%2Fa", ".", "%2E", "..", "a//b", "a/%2F/b",
            "a/", "a%2F", "\t", "%09",
        ];
        let mut seen = std::collections::HashMap::new();
        for n in names {
            let path = p(n);
            let back = percent_decode_str(&path).decode_utf8().unwrap();
            assert_eq!(back, n, "{path}");
            if let Some(other) = seen.insert(path.clone(), n) {
                panic!("{n:?} and {other:?} both map to {path}");
            }
        }
    }

    #[test]
    fn a_name_below_another_never_looks_like_its_lock_node() {
        assert_eq!(p("a/lock-0000000000"), "a/lock-000000000%30");
        assert_eq!(p("a/_c_x-lock-0000000042"), "a/_c_x-lock-000000004%32");
        assert_eq!(p("a/lock-lock-0000000001/b"), "a/lock-lock-000000000%31/b");
        // The first segment sits in the prefix root, which is no lock.
        assert_eq!(p("lock-0000000000"), "lock-0000000000");
        assert_eq!(p("a/lock-000000000"), "a/lock-000000000", "nine digits");
        for n in ["a/lock-0000000000", "a/x-lock-12345678901/c"] {
            for seg in p(n).split('/') {
                assert_eq!(sequence_of(seg), None, "{n}: {seg}");
            }
        }
    }

    #[test]
    fn paths_map_back_to_exactly_their_names() {
        for n in [
            "a",
            "a/b",
            "/a",
            "a//b",
            "a/",
            ".",
            "a/../b",
            "100%",
            "tab\there",
            "🔒",
            "a/lock-0000000000",
            "b x/ü",
        ] {
            let name = LockName::new(n).unwrap();
            assert_eq!(name_of_path(&name_path(&name)), Some(name), "{n:?}");
        }
        // Paths no name maps to (another client's directories).
        for rel in ["a%zz", "a/%41", "a%2Fb/c", "a/lock-0000000000", "%00"] {
            assert_eq!(name_of_path(rel), None, "{rel:?}");
        }
    }

    #[test]
    fn the_walk_goes_only_where_a_prefix_can_lead() {
        assert!(may_lead_to("jobs", ""));
        assert!(may_lead_to("jobs", "jo"));
        assert!(may_lead_to("jobs", "jobs/ni"));
        assert!(may_lead_to("jobs/nightly", "jobs/ni"));
        assert!(!may_lead_to("jobs", "jobsx"));
        assert!(!may_lead_to("jobs/a", "jobs/ni"));
        assert!(!may_lead_to("job", "jobs/ni"));
    }

    #[test]
    fn node_names_are_curators() {
        let dir = "/polylock/job";
        let u = "0f8e2a54-5d0b-4c44-9a55-3a7d3a0e0b2a";
        let prefix = node_prefix(dir, u);
        assert_eq!(prefix, format!("{dir}/_c_{u}-lock-"));
        let child = format!("_c_{u}-lock-0000000042");
        assert_eq!(sequence_of(&child), Some(42));
        assert!(is_ours(&child, u));
        assert!(!is_ours(&child, "0f8e2a54"));
        assert_eq!(sequence_of("lock-0000000007"), Some(7));
        assert_eq!(sequence_of("_c_x-lock-12"), None);
        assert_eq!(sequence_of("subdir"), None);
        let q = queue(vec![
            "_c_b-lock-0000000010".into(),
            "child".into(),
            "_c_a-lock-0000000002".into(),
        ]);
        assert_eq!(
            q.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            [2, 10],
            "sorted by sequence, others left out"
        );
    }
}
