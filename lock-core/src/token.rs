//! Owner tokens and fencing tokens.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use crate::error::LockError;

/// A fencing token: a number, never 0, that strictly increases for successive
/// holders of one lock name.
///
/// Hand it to every system the critical section writes to, and have that
/// system reject a write carrying a token lower than the highest it has seen:
/// then a holder that was paused past its lease (GC, swap, SIGSTOP) cannot
/// corrupt data after someone else took the lock.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct FencingToken(NonZeroU64);

impl FencingToken {
    /// A token from a raw value; `None` for 0, which is never a valid token.
    pub const fn new(value: u64) -> Option<Self> {
        match NonZeroU64::new(value) {
            Some(v) => Some(FencingToken(v)),
            None => None,
        }
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl TryFrom<u64> for FencingToken {
    type Error = LockError;
    fn try_from(v: u64) -> Result<Self, LockError> {
        FencingToken::new(v).ok_or_else(|| LockError::Config("fencing token 0 is invalid".into()))
    }
}

/// Identifies one holder: 128 random bits, shown as 32 lowercase hex digits.
///
/// Every compare-and-delete and compare-and-extend checks it, so a holder can
/// only ever release or renew its own lease. `Debug` shows only a prefix: the
/// full token is a capability to release the lock.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh random token from the operating system's CSPRNG-seeded generator.
    pub fn random() -> Self {
        OwnerToken(rand::random::<u128>())
    }

    /// The raw bits.
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// A token from raw bits (for tests and tools that read tokens back).
    pub const fn from_u128(v: u128) -> Self {
        OwnerToken(v)
    }
}

impl fmt::Display for OwnerToken {
    /// 32 lowercase hex digits, written in one piece: every acquire,
    /// renew and release sends the token as text, and `{:032x}` (padding,
    /// a digit at a time) was a visible share of a cycle's client
    /// instructions (callgrind, 64 tasks on PostgreSQL).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, d) in out.iter_mut().enumerate() {
            *d = DIGITS[((self.0 >> (124 - 4 * i)) & 0xf) as usize];
        }
        // Only ASCII hex digits were written.
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({:08x}…)", (self.0 >> 96) as u32)
    }
}

impl FromStr for OwnerToken {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, LockError> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(LockError::Config(
                "an owner token is 32 hexadecimal digits".into(),
            ));
        }
        u128::from_str_radix(s, 16)
            .map(OwnerToken)
            .map_err(|_| LockError::Config("an owner token is 32 hexadecimal digits".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_token_never_zero() {
        assert!(FencingToken::new(0).is_none());
        assert_eq!(FencingToken::new(7).unwrap().get(), 7);
        assert!(FencingToken::try_from(0).is_err());
    }

    #[test]
    fn owner_token_round_trips_and_hides_in_debug() {
        let t = OwnerToken::random();
        let s = t.to_string();
        assert_eq!(s.len(), 32);
        assert_eq!(s.parse::<OwnerToken>().unwrap(), t);
        let dbg = format!("{t:?}");
        assert!(!dbg.contains(&s), "Debug must not show the full token");
        assert_ne!(OwnerToken::random(), OwnerToken::random());
        assert!("xyz".parse::<OwnerToken>().is_err());
    }

    #[test]
    fn owner_token_text_is_the_zero_padded_lowercase_hex_of_its_bits() {
        for v in [
            0,
            1,
            0xabc,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            assert_eq!(OwnerToken::from_u128(v).to_string(), format!("{v:032x}"));
        }
    }
}
