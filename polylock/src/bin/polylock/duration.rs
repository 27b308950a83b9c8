//! Durations on the command line: polylock's one grammar
//! ([`polylock::duration`]: `500ms`, `1.5s`, `2m`, `1h`, `1m30s`), with a
//! bare number in seconds (`--ttl 30` is 30 s), as it always was here.

use std::time::Duration;

use polylock::duration::BareNumber;
use polylock::LockError;

/// Parses `s`; the error says what is accepted.
pub(crate) fn parse(s: &str) -> Result<Duration, String> {
    polylock::duration::parse(s, BareNumber::Secs).map_err(|e| match e {
        LockError::Config(why) => why,
        other => other.to_string(),
    })
}

/// `Duration` as people write it: `1m30s`, `250ms`.
pub(crate) fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if m > 0 {
        out += &format!("{m}m");
    }
    if s > 0 || out.is_empty() {
        out += &format!("{s}s");
    }
    out
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
    }
}
