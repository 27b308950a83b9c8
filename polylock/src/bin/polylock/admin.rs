//! `status`, `list` and `release --force`.

use polylock::{HolderInfo, LockError, LockName, Locker};

use crate::duration::{show, show_time};
use crate::say::say;
use crate::{exit, Failure};

/// For the commands that only print: a closed stdout (`polylock list |
/// head -1`) ends the process quietly by SIGPIPE, as it ends other Unix
/// tools, instead of a panic in `println!` (the Rust runtime ignores
/// SIGPIPE). They hold no lock, so there is nothing to give back.
#[allow(unsafe_code)]
pub(crate) fn quiet_on_closed_stdout() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: restores the default disposition; no handler code is
    // installed, so nothing runs in signal context.
    if let Err(e) = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
        tracing::debug!(error = %e, "polylock: could not restore SIGPIPE");
    }
}

pub(crate) async fn status(locker: &Locker, name: &str) -> Result<u8, Failure> {
    let name = LockName::new(name)?;
    let backend = locker.backend();
    let (info, waiters) = tokio::join!(backend.inspect(&name), backend.waiters(&name));
    let code = match info? {
        None => {
            println!("{}: free", shown(name.as_str()));
            exit::FREE
        }
        Some(info) => {
            println!("{}: {}", shown(name.as_str()), holder(&info));
            print_holder(&info, "  ");
            0
        }
    };
    print_queue(waiters?, &backend.wake_mode(), "  ");
    Ok(code)
}

/// `list [PREFIX]`: one line per held lock.
pub(crate) async fn list(locker: &Locker, prefix: &str, limit: usize) -> Result<u8, Failure> {
    let backend = locker.backend();
    let locks = match backend.list(prefix, limit).await {
        Err(LockError::Unsupported { backend, .. }) => {
            return Err(Failure::new(
                exit::USAGE,
                format!(
                    "the {backend} backend cannot enumerate its locks (`polylock status NAME` \
                     shows one lock)"
                ),
            ))
        }
        other => other?,
    };
    for (name, info) in &locks {
        let fence = info.fence.map_or("?".to_string(), |f| f.to_string());
        let left = info.expires_in.map_or("?".to_string(), show);
        let who = info.meta.as_ref().map_or(String::new(), |m| {
            format!("  pid {} on {}", m.pid, shown(&m.host))
        });
        println!(
            "{}  {}  fence {fence}  expires in {left}{who}",
            shown(name.as_str()),
            shown(&owner_prefix(&info.owner)),
        );
    }
    // The backend lists at most MAX_LIST, whatever --limit says.
    let shown_at_most = limit.min(polylock::MAX_LIST);
    if locks.len() == shown_at_most {
        let more = if shown_at_most < limit {
            format!("at most {} can be listed", polylock::MAX_LIST)
        } else {
            "--limit raises it".to_string()
        };
        say!("polylock: showing the first {shown_at_most} locks ({more})");
    }
    Ok(if locks.is_empty() { exit::FREE } else { 0 })
}

fn holder(info: &HolderInfo) -> String {
    format!("held by {}", shown(&owner_prefix(&info.owner)))
}

fn print_holder(info: &HolderInfo, indent: &str) {
    let fence = info.fence.map_or("unknown".to_string(), |f| f.to_string());
    let left = info.expires_in.map_or("unknown".to_string(), show);
    println!("{indent}fencing token: {fence}");
    println!("{indent}expires in:    {left}");
    if let Some(m) = &info.meta {
        println!("{indent}host:          {}", shown(&m.host));
        println!("{indent}pid:           {}", m.pid);
        println!("{indent}command:       {}", shown(&m.command));
        println!("{indent}since:         {}", show_time(m.since));
    }
}

/// Who waits, where the backend can count them, and how they are woken.
fn print_queue(waiters: Option<usize>, wake_mode: &str, indent: &str) {
    if let Some(n) = waiters {
        let s = if n == 1 { "" } else { "s" };
        println!("{indent}waiting:       {n} client{s}");
    }
    println!("{indent}wake-up:       {}", shown(wake_mode));
}

/// `status` of a migration lock: both sides, whatever the URL's phase, so
/// an operator sees who holds the legacy lock (a legacy-only or a `both`
/// client) and who holds the target lock. Exit 1 only when both are free.
pub(crate) async fn status_migrate(url: &str, name: &str) -> Result<u8, Failure> {
    let name = LockName::new(name)?;
    let config = polylock::MigrateConfig::parse(url)?;
    crate::refuse_in_process_urls(url)?;
    let m = polylock::connect_migrate_config(&config).await?;
    let sides = m.inspect_sides(&name).await?;
    let (legacy_waiters, target_waiters) =
        tokio::join!(m.legacy().waiters(&name), m.target().waiters(&name));
    let queues = [
        (legacy_waiters?, m.legacy().wake_mode()),
        (target_waiters?, m.target().wake_mode()),
    ];
    println!(
        "{}: migration lock (this URL's phase: {})",
        shown(name.as_str()),
        config.phase()
    );
    for ((side, url, info), (waiters, wake_mode)) in [
        ("legacy", config.legacy_url(), &sides.legacy),
        ("target", config.target_url(), &sides.target),
    ]
    .into_iter()
    .zip(queues)
    {
        let url = polylock::redact_url(url);
        match info {
            None => println!("  {side} ({}): free", shown(&url)),
            Some(info) => {
                println!("  {side} ({}): {}", shown(&url), holder(info));
                print_holder(info, "    ");
            }
        }
        print_queue(waiters, &wake_mode, "    ");
    }
    // Holder identities are each backend's own (a Redis value, an etcd key,
    // a ZooKeeper node), so the two sides are matched by the holder's
    // description instead: a `both` client stores the same one on both.
    let meta = |side: &Option<HolderInfo>| side.as_ref().and_then(|h| h.meta.clone());
    match (&sides.legacy, &sides.target) {
        (Some(_), None) => println!(
            "  legacy side only: a legacy-only client holds it{} (or a `both` client between \
             its two steps, for milliseconds)",
            meta(&sides.legacy).map_or(String::new(), |m| format!(
                " (pid {} on {})",
                m.pid,
                shown(&m.host)
            ))
        ),
        (Some(_), Some(_)) => match (meta(&sides.legacy), meta(&sides.target)) {
            (Some(l), Some(t)) if l == t => println!(
                "  both sides held by one `both` client (pid {} on {})",
                t.pid,
                shown(&t.host)
            ),
            (Some(l), Some(t)) => println!(
                "  WARNING: two clients hold the two sides (legacy: pid {} on {}; target: pid {} \
                 on {}): a legacy-only and a `target` client, which do not exclude each other \
                 (every service must be in `both` before any moves to `target`), unless the \
                 legacy holder is a `both` client waiting for the target: that one lets go of \
                 the legacy lock within half its TTL, so the same legacy fencing token a TTL \
                 later rules it out",
                l.pid,
                shown(&l.host),
                t.pid,
                shown(&t.host)
            ),
            _ => {}
        },
        _ => {}
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
        say!(
            "polylock: removed {}. If its holder is still running, it no longer has \
             mutual exclusion; its fencing token is now stale.",
            shown(name.as_str())
        );
    } else {
        say!(
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
