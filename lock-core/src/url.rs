//! The parts every lock URL shares, parsed in one place: scheme,
//! credentials, host list, path and `?key=value` options. Each backend
//! keeps only what is its own (which schemes, default port, what the path
//! means, which options).
//!
//! Errors are [`LockError::Config`] naming the URL with its password
//! redacted, raised before any I/O.

use std::time::Duration;

use crate::duration::{self, BareNumber};
use crate::error::LockError;
use crate::redact::redact_url;

/// The longest duration a URL option may hold.
const MAX_OPTION: Duration = Duration::from_secs(24 * 3600);

/// One `host[:port]` of a host list; IPv6 addresses in brackets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlHost {
    /// The host name or address, without brackets.
    pub host: String,
    /// The port, when given.
    pub port: Option<u16>,
}

impl UrlHost {
    /// `host:port` (an IPv6 address in brackets) with `default_port` filled
    /// in, for services whose endpoints are plain host names or addresses
    /// (letters, digits, `-`, `.`, `_`; IPv6 hex digits, `:` and `.`).
    pub fn endpoint(&self, default_port: u16) -> Result<String, String> {
        let v6 = self.host.contains(':');
        let valid = if v6 {
            self.host
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        } else {
            self.host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        };
        if !valid {
            return Err(format!("`{}` is not a host name or address", self.host));
        }
        let port = self.port.unwrap_or(default_port);
        Ok(if v6 {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        })
    }
}

/// A lock URL split into its shared parts.
///
/// ```
/// use lock_core::url::LockUrl;
/// let u = LockUrl::parse("redis://:p%40ss@[::1]:7000,b/2?timeout=1s", "redis://HOST").unwrap();
/// assert_eq!(u.scheme(), "redis");
/// assert_eq!(u.password(), Some("p@ss"));
/// assert_eq!(u.hosts()[0].host, "::1");
/// assert_eq!(u.hosts()[0].port, Some(7000));
/// assert_eq!(u.hosts()[1].port, None);
/// assert_eq!(u.path(), "/2");
/// assert!(!format!("{}", u.redacted()).contains("p%40ss"));
/// ```
#[derive(Clone)]
pub struct LockUrl {
    scheme: String,
    username: Option<String>,
    password: Option<String>,
    hosts: Vec<UrlHost>,
    path: String,
    options: Vec<(String, String)>,
    /// The query as given, pair by pair with each decoded key, so the
    /// options a backend does not own reach its driver byte for byte.
    raw_options: Vec<(String, String)>,
    /// Everything before the `?`, secrets included: see
    /// [`LockUrl::driver_url`].
    secret_base: String,
    redacted: String,
    /// An `@` after the host with no user info before it: the path and the
    /// query may be the rest of a password cut by an unencoded `/` or `?`,
    /// so errors quote nothing of them (see [`LockUrl::error`]).
    cut_password: bool,
}

/// Where the server of a URL is named.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Authority {
    /// `scheme://HOSTS...`: at least one host.
    Required,
    /// `scheme://HOSTS...` or `scheme:///...` (the server named by an
    /// option, e.g. PostgreSQL's `?host=/run/postgresql`).
    Optional,
    /// `scheme:PATH` or `scheme://PATH`: no server, a local file.
    None,
}

impl std::fmt::Debug for LockUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockUrl")
            .field("url", &self.redacted)
            .finish_non_exhaustive()
    }
}

impl LockUrl {
    /// Splits `url`. Refuses a missing `://` (saying "expected `usage`",
    /// e.g. `etcd://HOST[:PORT]`), a fragment, credentials that are not
    /// valid percent-encoded UTF-8, an empty host, a bad port, and an
    /// option given twice.
    pub fn parse(url: &str, usage: &str) -> Result<LockUrl, LockError> {
        LockUrl::split(url, usage, Authority::Required)
    }

    /// As [`parse`](LockUrl::parse), but an empty authority
    /// (`postgres:///db?host=/run/postgresql`) gives an empty host list.
    pub fn parse_optional_host(url: &str, usage: &str) -> Result<LockUrl, LockError> {
        LockUrl::split(url, usage, Authority::Optional)
    }

    /// A URL naming a local file, `scheme:PATH` or `scheme://PATH` (so
    /// `sqlite:///abs.db`, `sqlite://rel.db`, `sqlite:rel.db`, and
    /// `sqlite::memory:`, whose path is `:memory:`): no credentials, no
    /// hosts; [`path`](LockUrl::path) is the percent-decoded rest up to `?`.
    ///
    /// ```
    /// use lock_core::url::LockUrl;
    /// let u = LockUrl::parse_file("sqlite:///tmp/a%20b.db?table=t", "sqlite://PATH").unwrap();
    /// assert_eq!(u.path(), "/tmp/a b.db");
    /// assert_eq!(LockUrl::parse_file("sqlite::memory:", "sqlite://PATH").unwrap().path(), ":memory:");
    /// assert!(LockUrl::parse_file("sqlite:x.db?a=1&a=2", "sqlite://PATH").is_err());
    /// ```
    pub fn parse_file(url: &str, usage: &str) -> Result<LockUrl, LockError> {
        LockUrl::split(url, usage, Authority::None)
    }

    fn split(url: &str, usage: &str, authority_kind: Authority) -> Result<LockUrl, LockError> {
        let redacted = redact_url(url);
        let bad = |why: String| LockError::Config(format!("`{redacted}`: {why}"));
        let (scheme, rest) = if authority_kind == Authority::None {
            url.split_once(':')
                .filter(|(s, _)| !s.is_empty())
                .map(|(s, r)| (s, r.strip_prefix("//").unwrap_or(r)))
        } else {
            url.split_once("://")
        }
        .ok_or_else(|| bad(format!("expected {usage}")))?;
        if rest.contains('#') {
            return Err(bad("URL fragments (`#...`) are not supported".into()));
        }
        let secret_base = url[..url.find('?').unwrap_or(url.len())].to_string();
        if authority_kind == Authority::None {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            let path = decode(path)
                .ok_or_else(|| bad("the path is not valid percent-encoded UTF-8".into()))?;
            let (options, raw_options) = split_query(query).map_err(bad)?;
            return Ok(LockUrl {
                scheme: scheme.to_ascii_lowercase(),
                username: None,
                password: None,
                hosts: Vec::new(),
                path,
                options,
                raw_options,
                secret_base,
                redacted,
                cut_password: false,
            });
        }
        // As in every URL: the authority ends at the first '/' or '?', and
        // the credentials at the last '@' inside it, so a password may hold
        // '@' and ':' unencoded (but '/', '?' and '#' must be encoded; the
        // redacted message never shows them either way).
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, q),
            None => (tail, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = decode(user).ok_or_else(|| {
                    bad("the user name is not valid percent-encoded UTF-8".into())
                })?;
                // Never echo the password, not even in part.
                let pass = match pass {
                    Some(p) => Some(decode(p).ok_or_else(|| {
                        bad("the password is not valid percent-encoded UTF-8".into())
                    })?),
                    None => None,
                };
                (Some(user), pass)
            }
        };
        let hosts = if hosts.is_empty() && authority_kind == Authority::Optional {
            Vec::new()
        } else {
            hosts
                .split(',')
                .map(parse_host)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|why| {
                    // An '@' past the authority: a password with an
                    // unencoded '/' or '?' was cut there, and the "host"
                    // holds part of it, so it is not quoted.
                    if tail.contains('@') {
                        bad(
                            "the part before the host is not valid: a password containing \
                             `/`, `?` or `#` must percent-encode them (`%2F`, `%3F`, `%23`)"
                                .into(),
                        )
                    } else {
                        bad(why)
                    }
                })?
        };
        let (options, raw_options) = split_query(query).map_err(bad)?;
        Ok(LockUrl {
            scheme: scheme.to_ascii_lowercase(),
            username,
            password,
            hosts,
            path: path.to_string(),
            options,
            raw_options,
            secret_base,
            redacted,
            cut_password: userinfo.is_none() && tail.contains('@'),
        })
    }

    /// The scheme, lower-cased.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }
    /// The user name as given (decoded); `Some("")` for `:pw@host`.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }
    /// The password (decoded), if a `:` followed the user name.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
    /// The host list, in order.
    pub fn hosts(&self) -> &[UrlHost] {
        &self.hosts
    }
    /// Everything from the first `/` after the hosts up to `?`; `""` when
    /// there is none.
    pub fn path(&self) -> &str {
        &self.path
    }
    /// The URL with its password replaced, for messages and `Debug`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
    /// The options in the order given.
    pub fn options(&self) -> impl Iterator<Item = (&str, &str)> {
        self.options.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The options in the order given, each alias (`(alias, name)` pairs)
    /// read as its option's name, so old spellings keep working; one option
    /// under two spellings is an option given twice.
    ///
    /// ```
    /// use lock_core::url::LockUrl;
    /// let u = LockUrl::parse("redis://h?timeout=1s", "redis://").unwrap();
    /// let o = u.options_with_aliases(&[("timeout", "op_timeout")]).unwrap();
    /// assert_eq!(o, vec![("op_timeout", "1s")]);
    /// let u = LockUrl::parse("redis://h?timeout=1s&op_timeout=2s", "redis://").unwrap();
    /// assert!(u.options_with_aliases(&[("timeout", "op_timeout")]).is_err());
    /// ```
    pub fn options_with_aliases<'a>(
        &'a self,
        aliases: &[(&str, &'a str)],
    ) -> Result<Vec<(&'a str, &'a str)>, LockError> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for (key, value) in self.options() {
            let name = aliases
                .iter()
                .find(|(alias, _)| *alias == key)
                .map_or(key, |(_, name)| *name);
            if out.iter().any(|(k, _)| *k == name) {
                return Err(self.error(format_args!("option `{name}` is given twice")));
            }
            out.push((name, value));
        }
        Ok(out)
    }

    /// The URL as given, password included, keeping only the options for
    /// which `keep(name)` is true, each exactly as written: for handing the
    /// driver's own options (`sslmode=...`) to the driver. Never log it.
    pub fn driver_url(&self, mut keep: impl FnMut(&str) -> bool) -> String {
        let kept: Vec<&str> = self
            .raw_options
            .iter()
            .filter(|(key, _)| keep(key))
            .map(|(_, raw)| raw.as_str())
            .collect();
        if kept.is_empty() {
            self.secret_base.clone()
        } else {
            format!("{}?{}", self.secret_base, kept.join("&"))
        }
    }

    /// A [`LockError::Config`] about this URL. Where an `@` follows the
    /// host with no user info before it, the reason is not given: it could
    /// quote a path or an option that is the rest of a password cut by an
    /// unencoded `/` or `?` (`redis://u:1234?hunter2@cache` reads as host
    /// `u`, port 1234 and an option `hunter2@cache`).
    pub fn error(&self, why: impl std::fmt::Display) -> LockError {
        if self.cut_password {
            return LockError::Config(format!(
                "`{}`: refused, and the reason is not shown: an `@` after the host with no \
                 user name before it may be the rest of a password containing `/`, `?` or \
                 `#`, which must be percent-encoded (`%2F`, `%3F`, `%23`); write an `@` in \
                 a path or an option as `%40` to see the reason",
                self.redacted
            ));
        }
        LockError::Config(format!("`{}`: {why}", self.redacted))
    }

    /// An error naming `option` and what is wrong with its value.
    pub fn option_error(&self, option: &str, why: impl std::fmt::Display) -> LockError {
        self.error(format_args!("option `{option}`: {why}"))
    }

    /// The error for an option no backend knows, listing the known ones.
    pub fn unknown_option(&self, option: &str, known: &str) -> LockError {
        self.error(format_args!(
            "unknown option `{option}`; the options are {known}"
        ))
    }

    /// The value of duration `option`, read by the one grammar
    /// ([`duration::parse`]) with a bare number in milliseconds; at most a
    /// day.
    pub fn duration(&self, option: &str, value: &str) -> Result<Duration, LockError> {
        let d = duration::parse(value, BareNumber::Millis).map_err(|e| match e {
            LockError::Config(why) => self.option_error(option, why),
            other => other,
        })?;
        if d > MAX_OPTION {
            return Err(self.option_error(
                option,
                format_args!("`{}` is longer than a day", value.trim()),
            ));
        }
        Ok(d)
    }

    /// As [`duration`](LockUrl::duration), refusing zero (timeouts and
    /// intervals).
    pub fn positive_duration(&self, option: &str, value: &str) -> Result<Duration, LockError> {
        let d = self.duration(option, value)?;
        if d.is_zero() {
            return Err(self.option_error(option, "must be above zero"));
        }
        Ok(d)
    }
}

/// The scheme of `url` as written (before the first `:`), if it has one;
/// for picking the parser before parsing.
///
/// ```
/// assert_eq!(lock_core::url::scheme_of("Redis://h"), Some("Redis"));
/// assert_eq!(lock_core::url::scheme_of("sqlite::memory:"), Some("sqlite"));
/// assert_eq!(lock_core::url::scheme_of("/tmp/x"), None);
/// ```
pub fn scheme_of(url: &str) -> Option<&str> {
    let end = url.find(':').filter(|&i| i > 0)?;
    let scheme = &url[..end];
    scheme
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        .then_some(scheme)
}

/// The decoded options, and each raw pair with its decoded key.
/// Percent-decoding only (RFC 3986): a `+` in a value is a `+`.
#[allow(clippy::type_complexity)]
fn split_query(query: &str) -> Result<(Vec<(String, String)>, Vec<(String, String)>), String> {
    let mut options: Vec<(String, String)> = Vec::new();
    let mut raw = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key =
            decode(key).ok_or("an option name is not valid percent-encoded UTF-8".to_string())?;
        let value = decode(value).ok_or_else(|| {
            format!("option `{key}`: the value is not valid percent-encoded UTF-8")
        })?;
        if options.iter().any(|(k, _)| *k == key) {
            return Err(format!("option `{key}` is given twice"));
        }
        raw.push((key.clone(), pair.to_string()));
        options.push((key, value));
    }
    Ok((options, raw))
}

/// Percent-decodes `s` as UTF-8.
fn decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

fn parse_host(host: &str) -> Result<UrlHost, String> {
    if host.is_empty() {
        return Err(
            "a host is missing: a server is empty (an endpoint is empty; expected HOST[:PORT], \
             comma-separated)"
                .into(),
        );
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("`{host}`: unclosed IPv6 bracket: needs a closing `]`"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("`{host}`: expected :PORT after the IPv6 address"))?,
            ),
        };
        (addr.to_string(), port)
    } else {
        // An IPv6 address needs brackets, so the first ':' starts the port.
        match host.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (host.to_string(), None),
        }
    };
    if name.is_empty() {
        return Err(format!("`{host}`: the host name is empty"));
    }
    if name.contains(['/', ' ', '@']) {
        return Err(format!("`{host}` is not a host name or address"));
    }
    let port = port
        .map(|p| {
            p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| {
                format!("`{host}`: `{p}` is not a port number (the port must be 1 to 65535)")
            })
        })
        .transpose()?;
    Ok(UrlHost { host: name, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match LockUrl::parse(url, "SCHEME://HOST") {
            Err(LockError::Config(m)) => m,
            other => panic!("{url}: expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn splits_the_shared_parts() {
        let u = LockUrl::parse(
            "Etcd://user:p%2Fw@h1:2379,[fe80::1]:1/x/y?a=1&b=2%20s",
            "etcd://",
        )
        .unwrap();
        assert_eq!(u.scheme(), "etcd");
        assert_eq!((u.username(), u.password()), (Some("user"), Some("p/w")));
        assert_eq!(
            u.hosts(),
            &[
                UrlHost {
                    host: "h1".into(),
                    port: Some(2379)
                },
                UrlHost {
                    host: "fe80::1".into(),
                    port: Some(1)
                },
            ]
        );
        assert_eq!(u.path(), "/x/y");
        assert_eq!(
            u.options().collect::<Vec<_>>(),
            vec![("a", "1"), ("b", "2 s")]
        );
    }

    #[test]
    fn passwords_keep_at_and_colon_and_never_show() {
        for pw in ["a@b", "x:y", "p%2Fw", "q%3Fr", "h%23s"] {
            let u =
                LockUrl::parse(&format!("redis://u:{pw}@host:1/0?timeout=1s"), "redis://").unwrap();
            assert_eq!(u.password(), decode(pw).as_deref());
            assert_eq!(u.hosts()[0].host, "host");
            assert_eq!(u.path(), "/0");
            assert!(!u.redacted().contains(pw), "{}", u.redacted());
        }
        // Unencoded '/', '?', '#' end the authority: refused, and the
        // message still hides the password.
        for pw in ["pa/ss", "q?r", "ab#c"] {
            let m = err(&format!("redis://u:{pw}@host:1/0"));
            assert!(!m.contains(pw), "{m}");
        }
        // Not even the part before the cut, which the split takes for a
        // host and a port.
        for url in ["redis://app:S3cr3t/x@cache", "redis://app:S3cr3t?x@cache/0"] {
            let m = err(url);
            assert!(!m.contains("S3cr3t"), "{m}");
            assert!(m.contains("percent-encode"), "{m}");
        }
        // A cut whose head reads as HOST:PORT parses; what follows is a
        // path or an option, and no error about it quotes it.
        let u = LockUrl::parse("redis://u:1234?hunter2@cache", "redis://").unwrap();
        for m in [
            u.unknown_option("hunter2@cache", "format").to_string(),
            u.duration("hunter2@cache", "x").unwrap_err().to_string(),
            u.error("bad path /hunter2@cache").to_string(),
        ] {
            assert!(!m.contains("hunter2"), "{m}");
            assert!(m.contains("%3F") && m.contains("%40"), "{m}");
        }
        // An `@` behind user info is a value like any other.
        let u = LockUrl::parse("redis://u:pw@cache?prefix=a@b", "redis://").unwrap();
        assert!(u
            .unknown_option("x", "y")
            .to_string()
            .contains("unknown option `x`"));
    }

    /// One host of a URL as a service endpoint, or why not.
    fn host_port(s: &str, default_port: u16) -> Result<String, String> {
        let u = LockUrl::parse(&format!("x://{s}"), "x://").map_err(|e| e.to_string())?;
        u.hosts()[0].endpoint(default_port)
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

    #[test]
    fn endpoints_are_plain_hosts_with_a_port() {
        let u = LockUrl::parse("etcd://a.b-c_1,[::1]:7,h:9", "etcd://").unwrap();
        let e: Vec<_> = u.hosts().iter().map(|h| h.endpoint(2379)).collect();
        assert_eq!(
            e,
            vec![
                Ok("a.b-c_1:2379".to_string()),
                Ok("[::1]:7".to_string()),
                Ok("h:9".to_string())
            ]
        );
        let u = LockUrl::parse("etcd://h%21x", "etcd://").unwrap();
        assert!(u.hosts()[0].endpoint(1).is_err());
    }

    #[test]
    fn files_and_hostless_urls() {
        for (url, path) in [
            ("sqlite:///abs/x%20y.db", "/abs/x y.db"),
            ("sqlite://rel.db", "rel.db"),
            ("SQLite:rel.db?a=1", "rel.db"),
            ("sqlite::memory:", ":memory:"),
            ("sqlite:", ""),
        ] {
            let u = LockUrl::parse_file(url, "sqlite://PATH").unwrap();
            assert_eq!((u.scheme(), u.path()), ("sqlite", path), "{url}");
            assert!(u.hosts().is_empty());
        }
        assert!(LockUrl::parse_file(":x", "sqlite://PATH").is_err());
        assert!(LockUrl::parse_file("sqlite:x?t=1&t=2", "sqlite://PATH").is_err());
        let u = LockUrl::parse_optional_host("postgres:///db?host=/run/pg", "pg://").unwrap();
        assert!(u.hosts().is_empty());
        assert_eq!(u.path(), "/db");
        assert!(LockUrl::parse("postgres:///db", "pg://").is_err());
    }

    #[test]
    fn the_driver_gets_its_options_as_written() {
        let u = LockUrl::parse(
            "mysql://u:p%40w@h/db?table=t&ssl-mode=a+b%20c&max_poll=1s&x",
            "mysql://",
        )
        .unwrap();
        let ours = ["table", "max_poll"];
        assert_eq!(
            u.driver_url(|k| !ours.contains(&k)),
            "mysql://u:p%40w@h/db?ssl-mode=a+b%20c&x"
        );
        assert_eq!(u.driver_url(|_| false), "mysql://u:p%40w@h/db");
        assert!(!format!("{u:?}").contains("p%40w"));
    }

    #[test]
    fn duration_options() {
        let u = LockUrl::parse("x://h?t=1", "x://").unwrap();
        let ok = |v: &str| u.duration("t", v).unwrap();
        let err = |v: &str| match u.positive_duration("t", v) {
            Err(LockError::Config(m)) => m,
            other => panic!("{v}: {other:?}"),
        };
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("40"), Duration::from_millis(40));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("24h"), Duration::from_secs(86400));
        assert!(err("24h1ms").contains("longer than a day"));
        assert!(err("99999m").contains("longer than a day"));
        assert!(err("0").contains("above zero"));
        assert!(err("2d").contains("option `t`: unknown unit"));
        assert!(err("-1s").contains("`x://h?t=1`: option `t`"));
    }

    #[test]
    fn refuses_what_no_backend_accepts() {
        assert!(err("redis:/h").contains("SCHEME://"));
        assert!(err("redis://h#frag").contains("fragments"));
        assert!(err("redis://h?x=1&x=2").contains("given twice"));
        assert!(err("redis://h:0").contains("port"));
        assert!(err("redis://h:70000").contains("port"));
        assert!(err("redis://[::1").contains("bracket"));
        assert!(err("redis://a,,b").contains("missing"));
        assert!(err("zk://h:1:2").contains("not a port"));
        assert!(err("redis://u:%ff@h").contains("password"));
        assert!(!err("redis://u:s3cr%ff@h").contains("s3cr"));
    }
}
