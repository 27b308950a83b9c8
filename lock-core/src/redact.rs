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
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return redact_query(url);
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

/// Blanks query parameters that carry secrets (`password=`, `token=`, ...).
fn redact_query(url: &str) -> String {
    let Some(q) = url.find('?') else {
        return url.to_string();
    };
    let (head, query) = url.split_at(q + 1);
    let parts: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if is_secret_key(k) => format!("{k}=***"),
            _ => kv.to_string(),
        })
        .collect();
    format!("{head}{}", parts.join("&"))
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
