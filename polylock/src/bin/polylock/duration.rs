//! Durations on the command line: polylock's one grammar
//! ([`polylock::duration`]: `500ms`, `1.5s`, `2m`, `1h`, `1m30s`), with a
//! bare number in seconds (`--ttl 30` is 30 s), as it always was here.

use std::time::{Duration, SystemTime};

use polylock::duration::{BareNumber, UtcTime};
use polylock::LockError;

/// Parses `s`; the error says what is accepted.
pub(crate) fn parse(s: &str) -> Result<Duration, String> {
    polylock::duration::parse(s, BareNumber::Secs).map_err(|e| match e {
        LockError::Config(why) => why,
        other => other.to_string(),
    })
}

/// `Duration` as people read it, in the same grammar: whole seconds from a
/// second up (`1m30s`), whole milliseconds below (`250ms`).
pub(crate) fn show(d: Duration) -> String {
    let shown = if d < Duration::from_secs(1) {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(0))
    } else {
        Duration::from_secs(d.as_secs())
    };
    polylock::duration::format(shown)
}

/// `t` as a UTC date and time to the second (`2026-12-01 15:04:05 UTC`),
/// and how long ago that was by this host's clock.
pub(crate) fn show_time(t: SystemTime) -> String {
    let when = UtcTime::from_system_time(t);
    match SystemTime::now().duration_since(t) {
        Ok(ago) => format!("{when} ({} ago)", show(ago)),
        Err(_) => format!("{when} (in the future by this host's clock)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_shows() {
        assert_eq!(parse("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("0.25s").unwrap(), Duration::from_millis(250));
        for bad in ["", "s", "10x", "-1s", "99999999999999999999h"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(show(Duration::from_secs(90)), "1m30s");
        assert_eq!(show(Duration::from_millis(250)), "250ms");
        assert_eq!(show(Duration::from_millis(29_999)), "29s");
        assert_eq!(show(Duration::ZERO), "0s");
    }

    #[test]
    fn shows_utc_dates() {
        let at = |s: u64| show_time(std::time::UNIX_EPOCH + Duration::from_secs(s));
        assert!(at(0).starts_with("1970-01-01 00:00:00 UTC"), "{}", at(0));
        // 2000-02-29 (a leap day in a year divisible by 400), 12:34:56.
        assert!(
            at(951_827_696).starts_with("2000-02-29 12:34:56 UTC"),
            "{}",
            at(951_827_696)
        );
        // 2026-12-01 00:00:00.
        assert!(
            at(1_796_083_200).starts_with("2026-12-01 00:00:00 UTC"),
            "{}",
            at(1_796_083_200)
        );
        assert!(at(1_796_083_200).ends_with(" ago)"));
        let later = SystemTime::now() + Duration::from_secs(3600);
        assert!(show_time(later).contains("in the future"));
    }
}
