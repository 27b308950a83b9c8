//! Option values in lock URLs, parsed the same way by every backend, so
//! `?op_timeout=250ms` means one thing whatever the scheme.

use std::time::Duration;

/// The longest duration an option may hold.
const MAX_OPTION: Duration = Duration::from_secs(24 * 3600);

/// `250ms`, `2s`, `1m`, `500us`, or a bare number of milliseconds; at most a
/// day. The error says what is accepted.
///
/// ```
/// use std::time::Duration;
/// use lock_core::options::parse_duration;
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("40"), Ok(Duration::from_millis(40)));
/// assert!(parse_duration("1h").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (try 250ms, 2s, 1m)"))?;
    let d = match unit.trim() {
        "" | "ms" => Duration::from_millis(n),
        "us" | "µs" => Duration::from_micros(n),
        "s" => Duration::from_secs(n),
        "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{s}` (use us, ms, s, m)"
            ))
        }
    };
    if d > MAX_OPTION {
        return Err(format!("`{s}` is longer than a day"));
    }
    Ok(d)
}

/// [`parse_duration`], refusing zero (timeouts and intervals).
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("must be above zero".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500us").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        for bad in ["1h", "-1s", "", "ms", "1.5s", "99999m"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(positive_duration("0").is_err());
        assert_eq!(positive_duration("3"), Ok(Duration::from_millis(3)));
    }
}
