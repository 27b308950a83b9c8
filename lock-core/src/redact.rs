//! Keeping credentials out of messages.

/// `url` with any password replaced by `***`, for logs, errors and `Debug`.
/// Works on malformed URLs too (it never fails), since those are exactly
/// the ones that end up in error messages.
///
/// Everything between `://` and the last `@` is taken as credentials, and
/// everything after the user name's `:` in it is hidden: a password typed
/// without percent-encoding may contain `/`, `?`, `#`, `@`, `:` or `[`, so
/// no earlier delimiter can be trusted to end it. A URL whose path or query
/// contains an `@` is therefore redacted too much, never too little.
///
/// ```
/// use lock_core::redact_url;
/// assert_eq!(redact_url("postgres://app:hunter2@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact_url("redis://:hunter2@cache"), "redis://:***@cache");
/// assert_eq!(redact_url("postgres://u:pa/ss@h/db"), "postgres://u:***@h/db");
/// assert_eq!(redact_url("sqlite://locks.db"), "sqlite://locks.db");
/// ```
///
/// A URL without `://` (`redis:/u:pw@h`, a typo) still has its credentials
/// hidden: everything from the first `:` to the last `@`. And a query value
/// that is itself a URL with credentials, percent-encoded (a migration
/// lock's `to=`), is shown decoded and redacted.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return redact_query(&redact_schemeless(url));
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let Some(at) = rest.rfind('@') else {
        return redact_query(url);
    };
    let userinfo = &rest[..at];
    let user = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        None => userinfo.to_string(),
    };
    redact_query(&format!("{}{}{}", &url[..rest_start], user, &rest[at..]))
}

/// A malformed URL without `://`: the first `:` may end the scheme or the
/// user name, so everything from it to the last `@` is hidden (too much
/// rather than too little).
fn redact_schemeless(url: &str) -> String {
    match (url.find(':'), url.rfind('@')) {
        (Some(colon), Some(at)) if colon < at => {
            format!("{}:***{}", &url[..colon], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// Blanks query parameters that carry secrets (`password=`, `token=`, ...),
/// and redacts a value that is a percent-encoded URL with credentials.
fn redact_query(url: &str) -> String {
    let Some(q) = url.find('?') else {
        return url.to_string();
    };
    let (head, query) = url.split_at(q + 1);
    let parts: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            // Judged by the name the URL parser reads (`pass%77ord` is
            // `password` to it), shown as written.
            Some((k, _))
                if is_secret_key(&percent_encoding::percent_decode_str(k).decode_utf8_lossy()) =>
            {
                format!("{k}=***")
            }
            Some((k, v)) => match nested_url(v) {
                Some(inner) => format!("{k}={inner}"),
                None => kv.to_string(),
            },
            _ => kv.to_string(),
        })
        .collect();
    format!("{head}{}", parts.join("&"))
}

/// `value` decoded and redacted, when it percent-decodes to a URL that holds
/// credentials; `None` for any other value, shown as given.
fn nested_url(value: &str) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
    if !decoded.contains("://") || !decoded.contains('@') {
        return None;
    }
    Some(redact_url(&decoded))
}

fn is_secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "pass",
        "token",
        "secret",
        "sslpassword",
        "auth",
    ]
    .iter()
    .any(|s| k == *s || k.ends_with(&format!("_{s}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_userinfo_and_query() {
        assert_eq!(redact_url("mysql://u:p@ss@h/db"), "mysql://u:***@h/db");
        assert_eq!(
            redact_url("etcd://h:2379?password=x&user=u"),
            "etcd://h:2379?password=***&user=u"
        );
        // The URL parser decodes option names, so `pass%77ord` is a
        // password to it: hidden just the same.
        assert_eq!(
            redact_url("postgres://app@db/x?pass%77ord=hunter2&Token=t"),
            "postgres://app@db/x?pass%77ord=***&Token=***"
        );
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("redis://user@h"), "redis://user@h");
    }

    #[test]
    fn passwords_with_delimiters_are_redacted() {
        assert_eq!(redact_url("redis://:ab#c@h"), "redis://:***@h");
        assert_eq!(redact_url("etcd://u:p#w@h"), "etcd://u:***@h");
        assert_eq!(
            redact_url("postgres://u:pa/ss@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(
            redact_url("mysql://u:a?b=c@h:3306/db?ssl-mode=REQUIRED"),
            "mysql://u:***@h:3306/db?ssl-mode=REQUIRED"
        );
    }

    #[test]
    fn urls_without_a_scheme_separator_hide_their_credentials() {
        assert_eq!(redact_url("redis:/app:pw@h"), "redis:***@h");
        assert_eq!(redact_url("redis//u:pw@h/0"), "redis//u:***@h/0");
        assert_eq!(redact_url("sqlite::memory:"), "sqlite::memory:");
        assert_eq!(redact_url("sqlite:a.db?x=1"), "sqlite:a.db?x=1");
    }

    #[test]
    fn a_percent_encoded_url_in_the_query_is_redacted() {
        let shown = redact_url(
            "migrate+redis://:s3cret@cache/0?to=etcd%3A%2F%2Fu%3Ahunter2%40e%3A2379&phase=both",
        );
        assert_eq!(
            shown,
            "migrate+redis://:***@cache/0?to=etcd://u:***@e:2379&phase=both"
        );
        // Not a URL, or one without credentials: shown as given.
        assert_eq!(
            redact_url("redis://h?to=etcd%3A%2F%2Fe&name=a%40b"),
            "redis://h?to=etcd%3A%2F%2Fe&name=a%40b"
        );
    }

    /// Every character a password may carry unencoded, delimiters included.
    const PASSWORD: &str = "[A-Za-z0-9/?#@:%\\[\\]&=+;,!$'()* ~.-]{1,24}";

    proptest::proptest! {
        #[test]
        fn any_password_is_redacted(
            scheme in "(redis|rediss|etcd|postgres|mysql|mariadb)",
            user in "[a-z0-9_]{0,8}",
            password in PASSWORD,
            hosts in "[a-z0-9.-]{1,12}(:[0-9]{1,5})?(,[a-z0-9.-]{1,12}(:[0-9]{1,5})?){0,2}",
            path in "(/[a-z0-9_]{0,8})?",
            query in "(\\?[a-z]{1,3}=[a-z0-9]{0,8})?",
        ) {
            let url = format!("{scheme}://{user}:{password}@{hosts}{path}{query}");
            let shown = redact_url(&url);
            proptest::prop_assert_eq!(
                shown,
                format!("{scheme}://{user}:***@{hosts}{path}{query}")
            );
        }

        #[test]
        fn a_password_never_shows_whatever_follows_the_host(
            password in "[A-Z/?#@:%\\[\\]]{0,6}SECRET[A-Z/?#@:%\\[\\]]{0,6}",
            rest in "[a-z0-9/?#@=&:]{0,20}",
        ) {
            let url = format!("postgres://app:{password}@db{rest}");
            let shown = redact_url(&url);
            proptest::prop_assert!(!shown.contains("SECRET"), "{} -> {}", url, shown);
        }
    }
}
