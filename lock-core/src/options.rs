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

/// One `HOST[:PORT]` of a comma-separated server list, as `host:port` with
/// `default_port` filled in. IPv6 addresses go in brackets (`[::1]:2181`).
/// The error says what is wrong with `s`.
///
/// ```
/// use lock_core::options::host_port;
/// assert_eq!(host_port("n1", 2181), Ok("n1:2181".to_string()));
/// assert_eq!(host_port("[::1]:7", 2181), Ok("[::1]:7".to_string()));
/// assert!(host_port("n1:0", 2181).is_err());
/// ```
pub fn host_port(s: &str, default_port: u16) -> Result<String, String> {
    if s.is_empty() {
        return Err("a server is empty (expected HOST[:PORT], comma-separated)".into());
    }
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("`{s}`: an IPv6 address needs a closing `]`"))?;
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(format!("`{s}` is not a host name or address"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("`{s}`: expected `:PORT` after `]`"))?,
            ),
        };
        (format!("[{addr}]"), port)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    if host.is_empty()
        || !host.starts_with('[')
            && !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(format!("`{s}` is not a host name or address"));
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(format!("`{s}`: `{p}` is not a port number")),
        },
    };
    Ok(format!("{host}:{port}"))
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

    #[test]
    fn host_ports() {
        assert_eq!(host_port("a", 1).unwrap(), "a:1");
        assert_eq!(host_port("a.b-c_d:99", 1).unwrap(), "a.b-c_d:99");
        assert_eq!(host_port("[::1]", 5).unwrap(), "[::1]:5");
        assert_eq!(host_port("[fe80::1]:6", 5).unwrap(), "[fe80::1]:6");
        for bad in [
            "", ":1", "a:0", "a:99999", "a:x", "a b", "[::1", "[]", "[::1]x", "[x y]", "a:1:2",
        ] {
            assert!(host_port(bad, 1).is_err(), "{bad}");
        }
    }
}
