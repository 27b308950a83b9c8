//! `status` and `release --force`.

use polylock::{HolderInfo, LockName, Locker};

use crate::duration::show;
use crate::{exit, Failure};

pub(crate) async fn status(locker: &Locker, name: &str) -> Result<u8, Failure> {
    let name = LockName::new(name)?;
    match locker.backend().inspect(&name).await? {
        None => {
            println!("{}: free", shown(name.as_str()));
            Ok(exit::FREE)
        }
        Some(info) => {
            println!("{}: {}", shown(name.as_str()), holder(&info));
            print_holder(&info, "  ");
            Ok(0)
        }
    }
}

fn holder(info: &HolderInfo) -> String {
    format!("held by {}", shown(&owner_prefix(&info.owner)))
}

fn print_holder(info: &HolderInfo, indent: &str) {
    let fence = info.fence.map_or("unknown".to_string(), |f| f.to_string());
    let left = info.expires_in.map_or("unknown".to_string(), show);
    println!("{indent}fencing token: {fence}");
    println!("{indent}expires in:    {left}");
}

/// `status` of a migration lock: both sides, whatever the URL's phase, so
/// an operator sees who holds the legacy lock (a legacy-only or a `both`
/// client) and who holds the target lock. Exit 1 only when both are free.
pub(crate) async fn status_migrate(url: &str, name: &str) -> Result<u8, Failure> {
    let name = LockName::new(name)?;
    let config = polylock::MigrateConfig::parse(url)?;
    let m = polylock::connect_migrate_config(&config).await?;
    let sides = m.inspect_sides(&name).await?;
    println!(
        "{}: migration lock (this URL's phase: {})",
        shown(name.as_str()),
        config.phase()
    );
    for (side, url, info) in [
        ("legacy", config.legacy_url(), &sides.legacy),
        ("target", config.target_url(), &sides.target),
    ] {
        let url = polylock::redact_url(url);
        match info {
            None => println!("  {side} ({}): free", shown(&url)),
            Some(info) => {
                println!("  {side} ({}): {}", shown(&url), holder(info));
                print_holder(info, "    ");
            }
        }
    }
    // Holder identities are each backend's own (a Redis value, an etcd key,
    // a ZooKeeper node), so the two sides cannot be matched by owner; what
    // the operator needs is whether the legacy side is held alone.
    if sides.legacy.is_some() && sides.target.is_none() {
        println!(
            "  legacy side only: a legacy-only client holds it (or a `both` client between \
             its two steps, for milliseconds)"
        );
    }
    Ok(if sides.legacy.is_none() && sides.target.is_none() {
        exit::FREE
    } else {
        0
    })
}

/// `s` safe to print on a terminal: control characters (newlines, ANSI
/// escapes) are shown as Rust escapes, and a backslash as `\\` so the result
/// is unambiguous. A lock name or a foreign holder's value is untrusted.
pub(crate) fn shown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' || c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

pub(crate) async fn force_release(locker: &Locker, name: &str) -> Result<u8, Failure> {
    let name = LockName::new(name)?;
    if locker.backend().force_release(&name).await? {
        eprintln!(
            "polylock: removed {}. If its holder is still running, it no longer has \
             mutual exclusion; its fencing token is now stale.",
            shown(name.as_str())
        );
    } else {
        eprintln!(
            "polylock: {} was not held; nothing removed",
            shown(name.as_str())
        );
    }
    Ok(0)
}

/// The first 8 characters of a holder's identity. The whole owner token is
/// a capability (it releases and renews the lock), so, as in `Debug`, only
/// enough to tell holders apart is shown.
fn owner_prefix(owner: &str) -> String {
    let mut shown: String = owner.chars().take(8).collect();
    if shown.len() < owner.len() {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(shown("a\nb\u{1b}[31m\\c"), "a\\nb\\u{1b}[31m\\\\c");
        assert_eq!(shown("plain-name.é"), "plain-name.é");
    }
}
