//! What polylock writes as the data of its lock nodes.
//!
//! The data is the owner token (32 lowercase hex digits), followed, when
//! the lock was taken with a holder description, by a newline and the one
//! line [`HolderMeta::encode`] makes. Curator's `InterProcessMutex` writes
//! the client's IP address there and never reads any node's data, so the
//! data is free for polylock to use; it also tells polylock's holders from
//! Curator's in `list`.

use std::str::FromStr;

use lock_core::{HolderMeta, OwnerToken};

/// The node data for `owner`, with `meta` when given.
pub(crate) fn node_data(owner: OwnerToken, meta: Option<&HolderMeta>) -> String {
    match meta {
        Some(m) => format!("{owner}\n{}", m.encode()),
        None => owner.to_string(),
    }
}

/// Node data polylock wrote: its owner and holder description. `None` for
/// anything else (a Curator client's address, another tool's data).
pub(crate) fn parse_node_data(data: &[u8]) -> Option<(OwnerToken, Option<HolderMeta>)> {
    let text = std::str::from_utf8(data).ok()?;
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
    fn data_round_trips_and_curators_is_not_ours() {
        let owner = OwnerToken::from_u128(0xfeed_0000_0000_0000_0000_0000_0000_beef);
        let meta = HolderMeta::new("h", 7, "job\nx", UNIX_EPOCH + Duration::from_secs(1));
        let plain = node_data(owner, None);
        assert_eq!(plain, "feed000000000000000000000000beef");
        assert_eq!(parse_node_data(plain.as_bytes()), Some((owner, None)));
        let described = node_data(owner, Some(&meta));
        assert_eq!(described.matches('\n').count(), 1, "{described:?}");
        assert_eq!(
            parse_node_data(described.as_bytes()),
            Some((owner, Some(meta)))
        );
        let damaged = format!("{owner}\nnot a description");
        assert_eq!(parse_node_data(damaged.as_bytes()), Some((owner, None)));
        for foreign in [
            &b"127.0.1.1"[..],
            b"",
            b"FEED000000000000000000000000BEEF",
            b"\xff",
        ] {
            assert_eq!(parse_node_data(foreign), None, "{foreign:?}");
        }
    }
}
