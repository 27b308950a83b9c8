//! polylock's measuring tools, run against real servers started by the test
//! kit: the fault suite behind `polylock compare` and the benchmarks behind
//! `polylock bench`. They live apart from the `polylock` crate so that a lock
//! client never links the test kit; `polylock compare` and `polylock bench`
//! run this crate's `polylock-compare` and `polylock-bench` binaries.

pub mod bench;
pub mod clock;
pub mod faults;

use std::time::Duration;

/// Parses a positive duration argument in the grammar the `polylock`
/// command uses (`lock_core::duration`; a bare number is seconds), for
/// clap's `value_parser`.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    let d =
        lock_core::duration::parse(s, lock_core::duration::BareNumber::Secs).map_err(
            |e| match e {
                lock_core::LockError::Config(m) => m,
                other => other.to_string(),
            },
        )?;
    if d.is_zero() {
        return Err(format!("`{s}` must be above zero"));
    }
    Ok(d)
}
