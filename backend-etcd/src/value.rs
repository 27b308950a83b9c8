//! What polylock writes as the value of its claim keys.
//!
//! The value is the owner token (32 lowercase hex digits), followed, when
//! the lock was taken with a holder description, by a newline and the one
//! line [`HolderMeta::encode`] makes. etcd's Go Mutex (and so `etcdctl
//! lock`) writes an empty value and never reads any, so the value is free
//! for polylock to use; it also tells polylock's claims from foreign ones
//! in `list`.

use std::str::FromStr;

use lock_core::{HolderMeta, OwnerToken};

/// The claim value for `owner`, with `meta` when given.
pub(crate) fn claim_value(owner: OwnerToken, meta: Option<&HolderMeta>) -> String {
    match meta {
        Some(m) => format!("{owner}\n{}", m.encode()),
        None => owner.to_string(),
    }
}

/// A claim value polylock wrote: its owner and holder description. `None`
/// for a foreign value (empty for Go's Mutex, anything else for other
/// clients using the same layout).
pub(crate) fn parse_claim_value(value: &[u8]) -> Option<(OwnerToken, Option<HolderMeta>)> {
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn values_round_trip_and_foreign_ones_are_not_ours() {
        let owner = OwnerToken::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let meta = HolderMeta::new("h", 7, "job a\nb", UNIX_EPOCH + Duration::from_secs(1));
        let plain = claim_value(owner, None);
        assert_eq!(plain, "0123456789abcdef0123456789abcdef");
        assert_eq!(parse_claim_value(plain.as_bytes()), Some((owner, None)));
        let described = claim_value(owner, Some(&meta));
        assert_eq!(described.matches('\n').count(), 1, "{described:?}");
        assert_eq!(
            parse_claim_value(described.as_bytes()),
            Some((owner, Some(meta)))
        );
        // Damaged metadata leaves the claim ours, without a description.
        let damaged = format!("{owner}\nsomething else");
        assert_eq!(parse_claim_value(damaged.as_bytes()), Some((owner, None)));
        for foreign in [
            &b""[..],
            b"leader-1",
            b"0123456789ABCDEF0123456789ABCDEF",
            b"0123456789abcdef0123456789abcde",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_claim_value(foreign), None, "{foreign:?}");
        }
    }
}
