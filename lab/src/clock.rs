//! Calendar dates for the reports' time stamps: lock-core's one UTC
//! calendar ([`UtcTime`]) in the two forms the reports use.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use polylock::duration::UtcTime;

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_stamp(secs: u64) -> String {
    UtcTime::from_system_time(UNIX_EPOCH + Duration::from_secs(secs)).rfc3339()
}

/// Now, as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_minute_now() -> String {
    let t = UtcTime::from_system_time(SystemTime::now());
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps() {
        assert_eq!(utc_stamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_stamp(1_796_083_200 + 3723), "2026-12-01T01:02:03Z");
        assert!(utc_minute_now().ends_with(" UTC"));
    }
}
