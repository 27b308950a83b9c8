//! Keeping credentials out of messages.

/// `url` with any password replaced by `***`, for logs, errors and `Debug`.
/// Works on malformed URLs too (it never fails), since those are exactly
/// the ones that end up in error messages.
///
/// ```
/// use lock_core::redact_url;
/// assert_eq!(redact_url("postgres://app:hunter2@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact_url("redis://:hunter2@cache"), "redis://:***@cache");
/// assert_eq!(redact_url("sqlite://locks.db"), "sqlite://locks.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    // The authority ends at the first '/', '?' or '#'; credentials end at the
    // last '@' inside it (a password may itself contain '@').
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..auth_end];
    let Some(at) = authority.rfind('@') else {
        return redact_query(url);
    };
    let userinfo = &authority[..at];
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
}
