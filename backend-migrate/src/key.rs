//! The composite lease's backend key: what release and renew need to
//! rebuild each side's lease (the legacy fence and both sides' own keys),
//! so the backend keeps no table of leases that could leak or be lost.
//!
//! Layout: `LEGACY_FENCE|L|T`, each of `L`, `T` being `-` (no key) or
//! `+LEN:KEY` (LEN in bytes), so a key may contain any character.

use lock_core::{FencingToken, Lease, LockError};

/// What the composite key records.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Parts<'a> {
    pub(crate) legacy_fence: FencingToken,
    pub(crate) legacy_key: Option<&'a str>,
    pub(crate) target_key: Option<&'a str>,
}

pub(crate) fn encode(legacy: &Lease, target: &Lease) -> String {
    let mut out = format!("{}|", legacy.fence());
    push(&mut out, legacy.backend_key());
    out.push('|');
    push(&mut out, target.backend_key());
    out
}

fn push(out: &mut String, key: Option<&str>) {
    match key {
        None => out.push('-'),
        Some(k) => {
            out.push_str(&format!("+{}:", k.len()));
            out.push_str(k);
        }
    }
}

pub(crate) fn decode(lease: &Lease) -> Result<Parts<'_>, LockError> {
    let not_ours = || LockError::NotHeld {
        name: lease.name().to_string(),
    };
    let key = lease.backend_key().ok_or_else(not_ours)?;
    let (fence, rest) = key.split_once('|').ok_or_else(not_ours)?;
    let legacy_fence = fence
        .parse::<u64>()
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(not_ours)?;
    let (legacy_key, rest) = take(rest).ok_or_else(not_ours)?;
    let rest = rest.strip_prefix('|').ok_or_else(not_ours)?;
    let (target_key, rest) = take(rest).ok_or_else(not_ours)?;
    if !rest.is_empty() {
        return Err(not_ours());
    }
    Ok(Parts {
        legacy_fence,
        legacy_key,
        target_key,
    })
}

fn take(s: &str) -> Option<(Option<&str>, &str)> {
    if let Some(rest) = s.strip_prefix('-') {
        return Some((None, rest));
    }
    let (len, rest) = s.strip_prefix('+')?.split_once(':')?;
    let len: usize = len.parse().ok()?;
    Some((Some(rest.get(..len)?), rest.get(len..)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::{ClockPolicy, LockName, OwnerToken};
    use std::time::Duration;
    use tokio::time::Instant;

    fn lease(fence: u64, key: Option<&str>) -> Lease {
        let l = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::random(),
            FencingToken::new(fence).unwrap(),
            Duration::from_secs(1),
            Instant::now(),
            ClockPolicy::default(),
        );
        match key {
            Some(k) => l.with_backend_key(k),
            None => l,
        }
    }

    #[test]
    fn round_trips_any_key() {
        for (lk, tk) in [
            (None, None),
            (Some("a|b+3:-"), None),
            (None, Some("locks/n/694d7a")),
            (Some(""), Some("é|x")),
        ] {
            let composite = lease(9, Some(&encode(&lease(7, lk), &lease(9, tk))));
            assert_eq!(
                decode(&composite).unwrap(),
                Parts {
                    legacy_fence: FencingToken::new(7).unwrap(),
                    legacy_key: lk,
                    target_key: tk
                }
            );
        }
    }

    #[test]
    fn a_foreign_lease_is_not_held() {
        for key in [
            None,
            Some("x"),
            Some("0|-|-"),
            Some("1|+9:ab|-"),
            Some("1|-|-x"),
        ] {
            assert!(matches!(
                decode(&lease(1, key)),
                Err(LockError::NotHeld { .. })
            ));
        }
    }
}
