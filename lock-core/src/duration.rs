//! The one duration grammar, read the same way by lock URL options
//! (`?op_timeout=1.5s`) and the `polylock` command line (`--ttl 2m`).
//!
//! A duration is one or more `NUMBER UNIT` parts, added up: `250ms`, `2s`,
//! `1.5s`, `0.25s`, `1m30s`, `2h`. Units: `ms`, `s`, `m`, `h`, and `us`
//! (also `µs`) and `min` (= `m`). A number is digits, optionally with a
//! fraction (`1.5`); digits finer than a nanosecond are dropped.
//!
//! A bare number (no unit) keeps the meaning each place gave it before
//! there was one grammar, passed as [`BareNumber`]: **milliseconds in URL
//! options** (`?op_timeout=250` is 250 ms) and **seconds on the command
//! line** (`--ttl 30` is 30 s). Write the unit to be unambiguous.
//!
//! ```
//! use std::time::Duration;
//! use lock_core::duration::{parse, BareNumber};
//! assert_eq!(parse("1.5s", BareNumber::Millis)?, Duration::from_millis(1500));
//! assert_eq!(parse("1m30s", BareNumber::Millis)?, Duration::from_secs(90));
//! assert_eq!(parse("2h", BareNumber::Secs)?, Duration::from_secs(7200));
//! assert_eq!(parse("30", BareNumber::Millis)?, Duration::from_millis(30));
//! assert_eq!(parse("30", BareNumber::Secs)?, Duration::from_secs(30));
//! assert!(parse("-1s", BareNumber::Secs).is_err());
//! # Ok::<(), lock_core::LockError>(())
//! ```

use std::time::Duration;

use crate::error::LockError;

/// What a number without a unit means where it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BareNumber {
    /// Milliseconds: lock URL options.
    Millis,
    /// Seconds: the command line.
    Secs,
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Digits of a fraction kept: finer than a nanosecond even for hours.
const MAX_FRACTION_DIGITS: usize = 15;

/// Parses `s` (surrounding spaces ignored). Every error is a
/// [`LockError::Config`] whose message quotes `s` and says what is
/// accepted.
pub fn parse(s: &str, bare: BareNumber) -> Result<Duration, LockError> {
    let t = s.trim();
    let bad = || {
        LockError::Config(format!(
            "`{t}` is not a duration: use e.g. 250ms, 1.5s, 2m, 1h or 1m30s"
        ))
    };
    if t.is_empty() {
        return Err(bad());
    }
    let is_number = |c: char| c.is_ascii_digit() || c == '.';
    if t.chars().all(is_number) {
        let unit = match bare {
            BareNumber::Millis => NANOS_PER_SEC / 1000,
            BareNumber::Secs => NANOS_PER_SEC,
        };
        return to_duration(nanos(t, unit).ok_or_else(bad)?).ok_or_else(bad);
    }
    let mut total: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !is_number(c)).unwrap_or(rest.len());
        if end == 0 {
            return Err(bad());
        }
        let number = &rest[..end];
        rest = rest[end..].trim_start();
        let end = rest
            .find(|c: char| is_number(c) || c.is_whitespace())
            .unwrap_or(rest.len());
        let unit = match &rest[..end] {
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => NANOS_PER_SEC,
            "m" | "min" => 60 * NANOS_PER_SEC,
            "h" => 3600 * NANOS_PER_SEC,
            "" => {
                return Err(LockError::Config(format!(
                    "`{t}`: `{number}` needs a unit (ms, s, m, h)"
                )))
            }
            other => {
                return Err(LockError::Config(format!(
                    "unknown unit `{other}` in `{t}` (use ms, s, m, h; or us)"
                )))
            }
        };
        rest = rest[end..].trim_start();
        total = total
            .checked_add(nanos(number, unit).ok_or_else(bad)?)
            .ok_or_else(bad)?;
    }
    to_duration(total).ok_or_else(bad)
}

/// `number` (`12`, `1.5`) times `unit` nanoseconds; `None` if malformed or
/// absurdly long.
fn nanos(number: &str, unit: u128) -> Option<u128> {
    let (int, frac) = match number.split_once('.') {
        Some((i, f)) if !i.is_empty() && !f.is_empty() && !f.contains('.') => (i, f),
        Some(_) => return None,
        None => (number, ""),
    };
    // 30 digits of hours still fit in u128 nanoseconds; to_duration refuses
    // what does not fit a Duration.
    if int.len() > 30 {
        return None;
    }
    let whole = int.parse::<u128>().ok()?.checked_mul(unit)?;
    let frac = &frac[..frac.len().min(MAX_FRACTION_DIGITS)];
    let part = if frac.is_empty() {
        0
    } else {
        frac.parse::<u128>().ok()? * unit / 10u128.pow(frac.len() as u32)
    };
    whole.checked_add(part)
}

fn to_duration(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, (nanos % NANOS_PER_SEC) as u32))
}

/// `d` in the grammar [`parse`] reads, exactly: `1h2m3.5s`, `250ms`,
/// `1.5us`, `0s`. `parse(&format(d), _) == Ok(d)` for every `d`.
pub fn format(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        let n = d.subsec_nanos();
        return if n >= 1_000_000 {
            with_fraction(u64::from(n / 1_000_000), n % 1_000_000, 6, "ms")
        } else {
            with_fraction(u64::from(n / 1_000), n % 1_000, 3, "us")
        };
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
    if s > 0 || d.subsec_nanos() > 0 {
        out += &with_fraction(s, d.subsec_nanos(), 9, "s");
    }
    out
}

/// `whole.frac` with `digits` fraction digits, trailing zeros trimmed.
fn with_fraction(whole: u64, frac: u32, digits: usize, unit: &str) -> String {
    if frac == 0 {
        return format!("{whole}{unit}");
    }
    let f = format!("{frac:0digits$}");
    format!("{whole}.{}{unit}", f.trim_end_matches('0'))
}

/// A wall-clock instant as a UTC calendar date and time, to the second,
/// for people: `status` shows when a holder took its lock, reports stamp
/// their runs. Displayed as `2026-12-01 15:04:05 UTC`.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use lock_core::duration::UtcTime;
/// let t = UtcTime::from_system_time(UNIX_EPOCH + Duration::from_secs(951_827_696));
/// assert_eq!(t.to_string(), "2000-02-29 12:34:56 UTC");
/// assert_eq!(t.rfc3339(), "2000-02-29T12:34:56Z");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct UtcTime {
    /// The year.
    pub year: i64,
    /// 1 to 12.
    pub month: u32,
    /// 1 to 31.
    pub day: u32,
    /// 0 to 23.
    pub hour: u32,
    /// 0 to 59.
    pub minute: u32,
    /// 0 to 59 (no leap seconds: Unix time has none).
    pub second: u32,
}

impl UtcTime {
    /// `t` in UTC; an instant before 1970 counts back from the epoch.
    pub fn from_system_time(t: std::time::SystemTime) -> Self {
        let secs = match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        };
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        // rem is in 0..86_400, so these fit.
        let rem = rem as u32;
        UtcTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }

    /// `2026-12-01T15:04:05Z`, for machine-read files.
    pub fn rfc3339(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

impl std::fmt::Display for UtcTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// Year, month, day of the `days`-th day after 1970-01-01 in the proleptic
/// Gregorian calendar: 400-year eras of 146,097 days, with years counted
/// from March so that the leap day ends the year.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    // d is in 1..=31 and m in 1..=12.
    (y, m as u32, d as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_dates() {
        let at = |s: i64| {
            let t = if s >= 0 {
                std::time::UNIX_EPOCH + Duration::from_secs(s as u64)
            } else {
                std::time::UNIX_EPOCH - Duration::from_secs((-s) as u64)
            };
            UtcTime::from_system_time(t).to_string()
        };
        assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(at(1_704_067_200), "2024-01-01 00:00:00 UTC");
        assert_eq!(at(1_796_083_200), "2026-12-01 00:00:00 UTC");
        assert_eq!(at(951_782_400 - 1), "2000-02-28 23:59:59 UTC");
        assert_eq!(at(-1), "1969-12-31 23:59:59 UTC");
    }
    use proptest::prelude::*;

    fn ms(s: &str) -> Result<Duration, LockError> {
        parse(s, BareNumber::Millis)
    }

    #[test]
    fn units_fractions_and_sums() {
        let cases = [
            ("250ms", Duration::from_millis(250)),
            ("2s", Duration::from_secs(2)),
            ("500us", Duration::from_micros(500)),
            ("500µs", Duration::from_micros(500)),
            ("1m", Duration::from_secs(60)),
            ("1min", Duration::from_secs(60)),
            ("2h", Duration::from_secs(7200)),
            ("1.5s", Duration::from_millis(1500)),
            ("0.25s", Duration::from_millis(250)),
            ("1.5h", Duration::from_secs(5400)),
            ("0.5ms", Duration::from_micros(500)),
            ("1m30s", Duration::from_secs(90)),
            ("1h 2m 3.5s", Duration::from_millis(3_723_500)),
            (" 2 s ", Duration::from_secs(2)),
            ("1.0000000001s", Duration::from_secs(1)),
        ];
        for (s, d) in cases {
            assert_eq!(ms(s).unwrap(), d, "{s}");
            assert_eq!(parse(s, BareNumber::Secs).unwrap(), d, "{s}");
        }
    }

    #[test]
    fn a_bare_number_keeps_each_places_meaning() {
        assert_eq!(ms("40").unwrap(), Duration::from_millis(40));
        assert_eq!(ms("1.5").unwrap(), Duration::from_micros(1500));
        assert_eq!(
            parse("30", BareNumber::Secs).unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            parse("0.5", BareNumber::Secs).unwrap(),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn refusals_are_config_errors_that_say_why() {
        for bad in [
            "",
            "ms",
            "s",
            "-1s",
            "1.s",
            ".5s",
            "1.2.3s",
            "1m30",
            "10x",
            "2d",
            "99999999999999999999h",
            "1e3ms",
        ] {
            match ms(bad) {
                Err(LockError::Config(m)) => assert!(m.contains(bad.trim()), "{bad}: {m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let Err(LockError::Config(m)) = ms("2d") else {
            panic!()
        };
        assert!(m.contains("unknown unit `d`"), "{m}");
        let Err(LockError::Config(m)) = ms("soon") else {
            panic!()
        };
        assert!(
            m.contains("not a duration") || m.contains("unknown unit"),
            "{m}"
        );
    }

    #[test]
    fn format_examples() {
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(format(Duration::from_millis(250)), "250ms");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(format(Duration::from_nanos(1500)), "1.5us");
        assert_eq!(format(Duration::from_secs(3600)), "1h");
    }

    proptest! {
        #[test]
        fn format_round_trips(secs in 0u64..10_000_000_000, nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            prop_assert_eq!(parse(&format(d), BareNumber::Millis).unwrap(), d);
            prop_assert_eq!(parse(&format(d), BareNumber::Secs).unwrap(), d);
        }

        #[test]
        fn whole_units_read_as_written(n in 0u64..1_000_000) {
            prop_assert_eq!(ms(&format!("{n}ms")).unwrap(), Duration::from_millis(n));
            prop_assert_eq!(ms(&format!("{n}s")).unwrap(), Duration::from_secs(n));
            prop_assert_eq!(ms(&format!("{n}h")).unwrap(), Duration::from_secs(n * 3600));
        }
    }
}
