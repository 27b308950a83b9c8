//! `status` and `release --force`.

use polylock::{LockName, Locker};

use crate::duration::show;
use crate::{exit, Failure};

pub(crate) async fn status(locker: &Locker, name: &str) -> Result<u8, Failure> {
    let name = LockName::new(name)?;
    match locker.backend().inspect(&name).await? {
        None => {
            println!("{name}: free");
            Ok(exit::FREE)
        }
        Some(info) => {
            let fence = info.fence.map_or("unknown".to_string(), |f| f.to_string());
            let left = info.expires_in.map_or("unknown".to_string(), show);
            println!("{name}: held by {}", owner_prefix(&info.owner));
            println!("  fencing token: {fence}");
            println!("  expires in:    {left}");
            Ok(0)
        }
    }
}

pub(crate) async fn force_release(locker: &Locker, name: &str) -> Result<u8, Failure> {
    let name = LockName::new(name)?;
    if locker.backend().force_release(&name).await? {
        eprintln!(
            "polylock: removed {name}. If its holder is still running, it no longer has \
             mutual exclusion; its fencing token is now stale."
        );
    } else {
        eprintln!("polylock: {name} was not held; nothing removed");
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
