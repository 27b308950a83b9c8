//! Configuration by file or environment, so a service changes lock backend
//! without changing code: `POLYLOCK_URL=etcd://...` or
//! `POLYLOCK_CONFIG=/etc/app/polylock.toml`.
//!
//! ```toml
//! url = "redis://cache:6379/0"    # or a [migrate] section
//! ttl = "30s"                     # default lease length
//! wait = "10s"                    # default wait for acquire()
//! watchdog = true                 # renew while a guard lives (Config::lock)
//! key_prefix = "billing/"         # redis, etcd, zk: the `prefix=` URL option
//!
//! [retry]                         # pacing of polls and retries while waiting
//! initial = "10ms"                # first pause, doubling (jittered) ...
//! max = "500ms"                   # ... up to this
//!
//! [credentials]
//! user = "app"
//! password_env = "REDIS_PASSWORD" # the variable's NAME; its value is never shown
//!
//! [tls]                           # files; redis: ca; etcd: ca;
//! ca = "/etc/ssl/locks-ca.pem"    # postgres, mysql/mariadb: ca, cert, key
//!                                 # (a ca there also sets the verifying mode)
//!
//! # Instead of `url`: a migration lock (see docs/migration.md).
//! [migrate]
//! legacy = "redis://cache:6379/0"
//! target = "etcd://etcd-1:2379,etcd-2:2379"
//! phase = "both"
//! legacy_password_env = "REDIS_PASSWORD"
//! target_password_env = "ETCD_PASSWORD"
//! ```
//!
//! Every error is a [`LockError::Config`] naming the file and the key, raised
//! before any I/O; no message, `Debug` or `Display` shows a password.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use lock_core::url::LockUrl;
use lock_core::wait::Backoff;
use lock_core::{redact_url, LockBuilder, LockError, Locker};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use toml_edit::{Document, Item, Table, Value};

/// The environment variable holding a lock URL.
pub const URL_ENV: &str = "POLYLOCK_URL";
/// The environment variable holding the path of a config file.
pub const CONFIG_ENV: &str = "POLYLOCK_CONFIG";

/// A lock service and the defaults to use it with, from a config file or a
/// URL.
#[derive(Clone)]
pub struct Config {
    /// With credentials filled in: never shown.
    url: String,
    redacted: String,
    source: String,
    ttl: Option<Duration>,
    wait: Option<Duration>,
    watchdog: bool,
    retry: Option<Backoff>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.redacted)
            .field("source", &self.source)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("watchdog", &self.watchdog)
            .field("retry", &self.retry)
            .finish()
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {})", self.redacted, self.source)
    }
}

impl Config {
    /// A configuration that is just a URL, with the backends' defaults.
    pub fn from_url(url: impl Into<String>) -> Config {
        let url = url.into();
        Config {
            redacted: redact_url(&url),
            url,
            source: "a URL".into(),
            ttl: None,
            wait: None,
            watchdog: true,
            retry: None,
        }
    }

    /// Reads the TOML file at `path` (see the module docs for its keys).
    /// Credentials come from the environment variables it names.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, LockError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            LockError::Config(format!(
                "{}: cannot read the config file: {e}",
                path.display()
            ))
        })?;
        Self::from_toml(&text, &path.display().to_string(), |name| {
            std::env::var(name).ok()
        })
    }

    /// `POLYLOCK_CONFIG` (a file) or `POLYLOCK_URL` (a URL); an error if
    /// neither or both are set.
    pub fn from_env() -> Result<Config, LockError> {
        let file = std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty());
        let url = std::env::var(URL_ENV).ok().filter(|v| !v.is_empty());
        match (file, url) {
            (Some(_), Some(_)) => Err(LockError::Config(format!(
                "both {URL_ENV} and {CONFIG_ENV} are set; set one of them"
            ))),
            (Some(file), None) => Self::from_file(file),
            (None, Some(url)) => {
                let mut c = Config::from_url(url);
                c.source = URL_ENV.into();
                Ok(c)
            }
            (None, None) => Err(LockError::Config(format!(
                "no lock service configured: set {URL_ENV} (a lock URL) or {CONFIG_ENV} (a \
                 config file)"
            ))),
        }
    }

    /// Parses TOML `text` read from `source` (a file name, for messages),
    /// looking environment variables up with `env`.
    pub fn from_toml(
        text: &str,
        source: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, LockError> {
        let at = |key: &str, why: &dyn fmt::Display| {
            LockError::Config(format!("{source}: key `{key}`: {why}"))
        };
        let doc: Document = text.parse().map_err(|e: toml_edit::TomlError| {
            // The message only: toml_edit's own rendering quotes the line,
            // which may hold a password typed inline.
            let (line, col) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
            LockError::Config(format!(
                "{source}: invalid TOML at line {line}, column {col}: {}",
                e.message().trim()
            ))
        })?;
        let root = doc.as_table();
        check_keys(
            root,
            "",
            &[
                "url",
                "ttl",
                "wait",
                "watchdog",
                "key_prefix",
                "retry",
                "credentials",
                "tls",
                "migrate",
            ],
            &at,
        )?;
        let ttl = duration(root, "ttl", true, &at)?;
        if let Some(ttl) = ttl {
            lock_core::validate_ttl(ttl).map_err(|e| at("ttl", &e))?;
        }
        // A wait of zero is one attempt.
        let wait = duration(root, "wait", false, &at)?;
        if let Some(wait) = wait {
            lock_core::validate_wait(wait).map_err(|e| at("wait", &e))?;
        }
        let watchdog = match root.get("watchdog") {
            None => true,
            Some(item) => item
                .as_bool()
                .ok_or_else(|| at("watchdog", &"expected true or false"))?,
        };
        let retry = retry(root, &at)?;
        let (url, redacted) = match (root.get("url"), root.get("migrate")) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "migrate",
                    &"give either `url` or a [migrate] section, not both",
                ))
            }
            (None, None) => return Err(at("url", &"missing (or give a [migrate] section)")),
            (None, Some(m)) => {
                for k in ["credentials", "tls", "key_prefix"] {
                    if root.contains_key(k) {
                        return Err(at(
                            k,
                            &"not used with [migrate]: put it in the legacy and target URLs \
                              (credentials: legacy_password_env, target_password_env)",
                        ));
                    }
                }
                let m = m
                    .as_table()
                    .ok_or_else(|| at("migrate", &"expected a table"))?;
                migrate(m, &env, &at)?
            }
            (Some(u), None) => {
                let url = u
                    .as_str()
                    .ok_or_else(|| at("url", &"expected a string"))?
                    .to_string();
                let url = with_credentials(root.get("credentials"), url, "credentials", &env, &at)?;
                let url = with_options(root, url, &at)?;
                let redacted = redact_url(&url);
                (url, redacted)
            }
        };
        Ok(Config {
            url,
            redacted,
            source: source.to_string(),
            ttl,
            wait,
            watchdog,
            retry,
        })
    }

    /// The lock URL with its passwords replaced, for messages.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// The URL with credentials (do not log it): what `connect` uses.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The default TTL, when configured.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The default wait, when configured.
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// The pacing of polls and retries while waiting, when configured
    /// ([`Locker::with_retry`]).
    pub fn retry(&self) -> Option<Backoff> {
        self.retry
    }

    /// Whether guards are renewed while they live (default true).
    pub fn watchdog(&self) -> bool {
        self.watchdog
    }

    /// Connects and applies the TTL, wait and retry defaults.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped connect leaves no lock behind.
    pub async fn connect(&self) -> Result<Locker, LockError> {
        let mut locker = crate::connect(&self.url).await?;
        if let Some(ttl) = self.ttl {
            locker = locker.with_default_ttl(ttl)?;
        }
        if let Some(wait) = self.wait {
            locker = locker.with_default_wait(wait)?;
        }
        if let Some(retry) = self.retry {
            locker = locker.with_retry(retry);
        }
        Ok(locker)
    }

    /// `locker.lock(name)` with this configuration's watchdog setting.
    pub fn lock(&self, locker: &Locker, name: impl AsRef<str>) -> LockBuilder {
        locker.lock(name).auto_renew(self.watchdog)
    }
}

/// Connects to what the environment names: `POLYLOCK_CONFIG` (a TOML file)
/// or `POLYLOCK_URL` (a lock URL). See [`Config`].
///
/// # Cancel safety
/// Cancel safe: a dropped connect leaves no lock behind.
pub async fn connect_from_env() -> Result<Locker, LockError> {
    Config::from_env()?.connect().await
}

type At<'a> = dyn Fn(&str, &dyn fmt::Display) -> LockError + 'a;

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

fn check_keys(table: &Table, prefix: &str, known: &[&str], at: &At<'_>) -> Result<(), LockError> {
    for (key, _) in table.iter() {
        if !known.contains(&key) {
            return Err(at(
                &format!("{prefix}{key}"),
                &format_args!("unknown key; the keys here are {}", known.join(", ")),
            ));
        }
    }
    Ok(())
}

/// The `[retry]` table: `initial` and `max`, both required.
fn retry(root: &Table, at: &At<'_>) -> Result<Option<Backoff>, LockError> {
    let Some(item) = root.get("retry") else {
        return Ok(None);
    };
    let t = item
        .as_table()
        .ok_or_else(|| at("retry", &"expected a table with `initial` and `max`"))?;
    check_keys(t, "retry.", &["initial", "max"], at)?;
    let at_retry = |key: &str, why: &dyn fmt::Display| at(&format!("retry.{key}"), why);
    let initial =
        duration(t, "initial", true, &at_retry)?.ok_or_else(|| at_retry("initial", &"missing"))?;
    let max = duration(t, "max", true, &at_retry)?.ok_or_else(|| at_retry("max", &"missing"))?;
    Backoff::new(initial, max)
        .map(Some)
        .map_err(|e| at("retry", &strip(e)))
}

fn duration(
    t: &Table,
    key: &str,
    positive: bool,
    at: &At<'_>,
) -> Result<Option<Duration>, LockError> {
    let Some(item) = t.get(key) else {
        return Ok(None);
    };
    let s = item.as_str().ok_or_else(|| {
        at(
            key,
            &"expected a duration string such as \"30s\" or \"1500ms\"",
        )
    })?;
    // A bare number is seconds, as on the command line that reads this file.
    let d = lock_core::duration::parse(s, lock_core::duration::BareNumber::Secs).map_err(|e| {
        let why = match e {
            LockError::Config(m) => m,
            other => other.to_string(),
        };
        at(key, &why)
    })?;
    if positive && d.is_zero() {
        return Err(at(key, &"must be above zero"));
    }
    Ok(Some(d))
}

fn string<'a>(
    t: &'a Table,
    key: &str,
    shown: &str,
    at: &At<'_>,
) -> Result<Option<&'a str>, LockError> {
    match t.get(key) {
        None => Ok(None),
        Some(Item::Value(Value::String(s))) => Ok(Some(s.value())),
        Some(_) => Err(at(shown, &"expected a string")),
    }
}

/// `url` with the user and the password of the variable `password_env`
/// names; the variable's value never reaches a message.
fn with_credentials(
    section: Option<&Item>,
    url: String,
    name: &str,
    env: &dyn Fn(&str) -> Option<String>,
    at: &At<'_>,
) -> Result<String, LockError> {
    let Some(section) = section else {
        return Ok(url);
    };
    let t = section
        .as_table()
        .ok_or_else(|| at(name, &"expected a table"))?;
    check_keys(t, &format!("{name}."), &["user", "password_env"], at)?;
    let user = string(t, "user", &format!("{name}.user"), at)?;
    let var = string(t, "password_env", &format!("{name}.password_env"), at)?;
    credentials(url, user, var, &format!("{name}.password_env"), env, at)
}

fn credentials(
    url: String,
    user: Option<&str>,
    var: Option<&str>,
    key: &str,
    env: &dyn Fn(&str) -> Option<String>,
    at: &At<'_>,
) -> Result<String, LockError> {
    if user.is_none() && var.is_none() {
        return Ok(url);
    }
    let parsed = LockUrl::parse(&url, "SCHEME://HOST...").map_err(|e| at("url", &strip(e)))?;
    if parsed.username().is_some() {
        return Err(at(
            key,
            &"the URL has credentials already; give them in one place",
        ));
    }
    let password = match var {
        None => None,
        Some(var) => Some(env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
            at(
                key,
                &format_args!("the environment variable `{var}` is not set (or empty)"),
            )
        })?),
    };
    let enc = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    let userinfo = match password {
        Some(p) => format!("{}:{}@", enc(user.unwrap_or("")), enc(&p)),
        None => format!("{}@", enc(user.unwrap_or(""))),
    };
    let (scheme, rest) = url.split_once("://").expect("LockUrl checked the ://");
    Ok(format!("{scheme}://{userinfo}{rest}"))
}

/// Whether URL option `given` is `option` under another of the names the
/// SQL drivers accept for it (sqlx reads `sslmode` and `ssl-mode` alike,
/// and several names for each TLS file); the later of two would win.
fn same_driver_option(given: &str, option: &str) -> bool {
    const SPELLINGS: &[&[&str]] = &[
        &["sslmode", "ssl-mode"],
        &["sslrootcert", "ssl-root-cert", "ssl-ca", "sslca"],
        &["sslcert", "ssl-cert"],
        &["sslkey", "ssl-key"],
    ];
    given == option
        || SPELLINGS
            .iter()
            .any(|names| names.contains(&given) && names.contains(&option))
}

/// Appends the URL options `key_prefix` and `[tls]` stand for, under each
/// backend's own option names.
fn with_options(root: &Table, url: String, at: &At<'_>) -> Result<String, LockError> {
    if !root.contains_key("key_prefix") && !root.contains_key("tls") {
        // Nothing to add; SQLite paths (`sqlite:///abs/file.db`) are not
        // host lists, so the URL is left to its backend.
        return Ok(url);
    }
    let parsed = LockUrl::parse(&url, "SCHEME://HOST...").map_err(|e| at("url", &strip(e)))?;
    let scheme = parsed.scheme().to_string();
    let mut options: Vec<(&str, String, String)> = Vec::new();
    if let Some(prefix) = string(root, "key_prefix", "key_prefix", at)? {
        match scheme.as_str() {
            "redis" | "rediss" | "redis+cluster" | "redlock" | "etcd" | "etcds" | "zk" => {
                options.push(("key_prefix", "prefix".into(), prefix.to_string()))
            }
            other => {
                return Err(at(
                    "key_prefix",
                    &format_args!("the {other} backend has no key prefix"),
                ))
            }
        }
    }
    if let Some(tls) = root.get("tls") {
        let t = tls
            .as_table()
            .ok_or_else(|| at("tls", &"expected a table"))?;
        check_keys(t, "tls.", &["ca", "cert", "key"], at)?;
        for (file, shown) in [("ca", "tls.ca"), ("cert", "tls.cert"), ("key", "tls.key")] {
            let Some(path) = string(t, file, shown, at)? else {
                continue;
            };
            let option = match (scheme.as_str(), file) {
                ("redis" | "rediss" | "redis+cluster", "ca") => "tls_ca",
                ("etcd" | "etcds", "ca") => "ca",
                ("postgres" | "postgresql", "ca") => "sslrootcert",
                ("postgres" | "postgresql", "cert") => "sslcert",
                ("postgres" | "postgresql", "key") => "sslkey",
                ("mysql" | "mariadb", "ca") => "ssl-ca",
                ("mysql" | "mariadb", "cert") => "ssl-cert",
                ("mysql" | "mariadb", "key") => "ssl-key",
                (other, _) => {
                    return Err(at(
                        shown,
                        &format_args!("the {other} backend does not take a TLS {file} file"),
                    ))
                }
            };
            options.push((shown, option.into(), path.to_string()));
        }
        // The SQL drivers take a CA file without checking anything against
        // it unless the TLS mode says so (their default falls back to
        // plain text): a CA given here means "verify the server", so the
        // mode that does is added, unless the URL chose one itself.
        let verify = match scheme.as_str() {
            "postgres" | "postgresql" => Some(("sslmode", "verify-full")),
            "mysql" | "mariadb" => Some(("ssl-mode", "VERIFY_IDENTITY")),
            _ => None,
        };
        if let Some((mode, value)) = verify {
            let has_ca = options.iter().any(|(shown, _, _)| *shown == "tls.ca");
            if has_ca && !parsed.options().any(|(k, _)| same_driver_option(k, mode)) {
                options.push(("tls.ca", mode.into(), value.into()));
            }
        }
    }
    let mut url = url;
    for (shown, option, value) in options {
        if parsed
            .options()
            .any(|(k, _)| same_driver_option(k, &option))
        {
            return Err(at(
                shown,
                &format_args!("the URL sets `{option}=` already; give it in one place"),
            ));
        }
        let sep = if url.contains('?') { '&' } else { '?' };
        url = format!(
            "{url}{sep}{option}={}",
            utf8_percent_encode(&value, NON_ALPHANUMERIC)
        );
    }
    Ok(url)
}

#[cfg(feature = "migrate")]
fn migrate(
    m: &Table,
    env: &dyn Fn(&str) -> Option<String>,
    at: &At<'_>,
) -> Result<(String, String), LockError> {
    check_keys(
        m,
        "migrate.",
        &[
            "legacy",
            "target",
            "phase",
            "legacy_password_env",
            "target_password_env",
        ],
        at,
    )?;
    let side = |key: &str| -> Result<String, LockError> {
        let shown = format!("migrate.{key}");
        let url = string(m, key, &shown, at)?
            .ok_or_else(|| at(&shown, &"missing"))?
            .to_string();
        let var_key = format!("migrate.{key}_password_env");
        let var = string(m, &format!("{key}_password_env"), &var_key, at)?;
        credentials(url, None, var, &var_key, env, at)
    };
    let legacy = side("legacy")?;
    let target = side("target")?;
    let phase = match string(m, "phase", "migrate.phase", at)? {
        None => backend_migrate::Phase::Both,
        Some(p) => backend_migrate::Phase::parse(p).map_err(|e| at("migrate.phase", &e))?,
    };
    let c = backend_migrate::MigrateConfig::new(legacy, target, phase)
        .map_err(|e| at("migrate", &strip(e)))?;
    Ok((c.to_url(), c.redacted_url().to_string()))
}

#[cfg(not(feature = "migrate"))]
fn migrate(
    _: &Table,
    _: &dyn Fn(&str) -> Option<String>,
    at: &At<'_>,
) -> Result<(String, String), LockError> {
    Err(at(
        "migrate",
        &"this build has no migration lock (cargo feature `migrate`)",
    ))
}

fn strip(e: LockError) -> String {
    match e {
        LockError::Config(m) => m,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "REDIS_PASSWORD" => Some("hunter2/@x".into()),
            "ETCD_PASSWORD" => Some("s3cret".into()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<Config, LockError> {
        Config::from_toml(text, "/etc/app/polylock.toml", env)
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Err(LockError::Config(m)) => m,
            other => panic!("expected a Config error, got {other:?}"),
        }
    }

    fn no_secret(s: &str) {
        for secret in ["hunter2", "s3cret", "inline-pw"] {
            assert!(!s.contains(secret), "{s}");
        }
    }

    #[test]
    fn a_full_file() {
        let c = parse(
            r#"
url = "redis://cache:6379/0"
ttl = "20s"
wait = "1500ms"
watchdog = false
key_prefix = "billing/"
[credentials]
user = "app"
password_env = "REDIS_PASSWORD"
[tls]
ca = "/etc/ssl/ca.pem"
"#,
        )
        .unwrap();
        assert_eq!(c.ttl(), Some(Duration::from_secs(20)));
        assert_eq!(c.wait(), Some(Duration::from_millis(1500)));
        assert!(!c.watchdog());
        assert_eq!(
            c.url(),
            "redis://app:hunter2%2F%40x@cache:6379/0?prefix=billing%2F&tls_ca=%2Fetc%2Fssl%2Fca%2Epem"
        );
        let u = LockUrl::parse(c.url(), "x").unwrap();
        assert_eq!(u.password(), Some("hunter2/@x"));
        no_secret(&format!("{c} {c:?} {}", c.redacted_url()));
        assert!(format!("{c}").contains("/etc/app/polylock.toml"));
    }

    #[test]
    fn a_sql_ca_turns_on_the_verifying_mode_unless_the_url_sets_one() {
        let with_ca = |url: &str| {
            parse(&format!("url = \"{url}\"\n[tls]\nca = \"/ca.pem\""))
                .map(|c| c.url().replace("%2D", "-").replace("%5F", "_"))
        };
        let u = with_ca("postgres://u@db/app").unwrap();
        assert!(
            u.contains("sslrootcert=%2Fca%2Epem") && u.contains("sslmode=verify-full"),
            "{u}"
        );
        let u = with_ca("postgres://u@db/app?sslmode=verify-ca").unwrap();
        assert!(
            u.contains("sslmode=verify-ca") && !u.contains("verify-full"),
            "{u}"
        );
        for scheme in ["mysql", "mariadb"] {
            let u = with_ca(&format!("{scheme}://u@db/app")).unwrap();
            assert!(
                u.contains("ssl-ca=") && u.contains("ssl-mode=VERIFY_IDENTITY"),
                "{u}"
            );
            let u = with_ca(&format!("{scheme}://u@db/app?ssl-mode=REQUIRED")).unwrap();
            assert!(!u.contains("VERIFY_IDENTITY"), "{u}");
        }
        // The mode or the CA under the drivers' other spellings counts too.
        let u = with_ca("mysql://u@db/app?sslmode=VERIFY_CA").unwrap();
        assert!(!u.contains("VERIFY_IDENTITY"), "{u}");
        let u = with_ca("postgres://u@db/app?ssl-mode=require").unwrap();
        assert!(!u.contains("verify-full"), "{u}");
        let e = with_ca("postgres://u@db/app?ssl-ca=/other.pem").unwrap_err();
        assert!(e.to_string().contains("give it in one place"), "{e}");
        // A cert alone (client authentication) leaves the mode alone.
        let c = parse("url = \"postgres://u@db/app\"\n[tls]\ncert = \"/c.pem\"").unwrap();
        assert!(!c.url().contains("sslmode"), "{}", c.url());
    }

    #[test]
    fn key_prefix_reaches_redlock_too() {
        let c = parse("url = \"redlock://a,b,c\"\nkey_prefix = \"app:\"").unwrap();
        assert_eq!(c.url(), "redlock://a,b,c?prefix=app%3A");
    }

    #[test]
    fn retry_pacing() {
        let c = parse("url = \"redis://h\"\n[retry]\ninitial = \"10ms\"\nmax = \"0.5s\"").unwrap();
        assert_eq!(
            c.retry(),
            Some(Backoff::new(Duration::from_millis(10), Duration::from_millis(500)).unwrap())
        );
        assert_eq!(parse("url = \"redis://h\"").unwrap().retry(), None);
        for (text, says) in [
            ("[retry]\ninitial = \"10ms\"", "key `retry.max`: missing"),
            ("[retry]\nmax = \"1s\"", "key `retry.initial`: missing"),
            (
                "[retry]\ninitial = \"0s\"\nmax = \"1s\"",
                "key `retry.initial`: must be above zero",
            ),
            (
                "[retry]\ninitial = \"2s\"\nmax = \"1s\"",
                "key `retry`: retry: the longest pause",
            ),
            (
                "[retry]\ninitial = \"1s\"\nmax = \"2m\"",
                "above the maximum",
            ),
            (
                "[retry]\ninitial = \"1s\"\nmax = \"2s\"\njitter = 1",
                "key `retry.jitter`: unknown key",
            ),
            ("retry = \"1s\"", "key `retry`: expected a table"),
        ] {
            let m = err(&format!("url = \"redis://h\"\n{text}"));
            assert!(m.contains(says), "{text:?}: {m}");
        }
    }

    #[test]
    fn errors_name_the_file_and_the_key_and_hide_secrets() {
        for (text, says) in [
            ("url = ", "/etc/app/polylock.toml: invalid TOML at line 1"),
            (
                "url = \"redis://:inline-pw@h\nttl = 1",
                "invalid TOML at line 1",
            ),
            ("ttl = \"5s\"", "key `url`: missing"),
            ("url = 5", "key `url`: expected a string"),
            ("url = \"redis://h\"\nttl = \"0s\"", "key `ttl`"),
            (
                "url = \"redis://h\"\nttl = \"9000h\"",
                "key `ttl`: invalid TTL",
            ),
            (
                "url = \"redis://h\"\nwait = \"9000h\"",
                "key `wait`: invalid wait",
            ),
            (
                "url = \"redis://h\"\nttl = 30",
                "key `ttl`: expected a duration",
            ),
            ("url = \"redis://h\"\nwatchdog = \"yes\"", "key `watchdog`"),
            (
                "url = \"redis://h\"\ncolour = 1",
                "key `colour`: unknown key",
            ),
            (
                "url = \"redis://h\"\n[credentials]\npassword_env = \"NOPE\"",
                "key `credentials.password_env`: the environment variable `NOPE` is not set",
            ),
            (
                "url = \"redis://u:inline-pw@h\"\n[credentials]\npassword_env = \"REDIS_PASSWORD\"",
                "credentials already",
            ),
            (
                "url = \"redis://h\"\n[credentials]\npasword_env = \"X\"",
                "key `credentials.pasword_env`: unknown key",
            ),
            (
                "url = \"sqlite://a.db\"\nkey_prefix = \"x\"",
                "key `key_prefix`: the sqlite backend has no key prefix",
            ),
            (
                "url = \"zk://h\"\n[tls]\nca = \"/ca.pem\"",
                "key `tls.ca`: the zk backend does not take a TLS ca file",
            ),
            (
                "url = \"redis://h?prefix=a\"\nkey_prefix = \"b\"",
                "key `key_prefix`: the URL sets `prefix=` already",
            ),
        ] {
            let m = err(text);
            assert!(m.contains(says), "{text:?}: {m}");
            assert!(m.starts_with("/etc/app/polylock.toml: "), "{m}");
            no_secret(&m);
        }
    }

    #[cfg(feature = "migrate")]
    #[test]
    fn migrate_section_errors_name_the_key() {
        for (text, says) in [
            (
                "url = \"redis://h\"\n[migrate]\nlegacy = \"redis://h\"",
                "key `migrate`: give either",
            ),
            (
                "[migrate]\nlegacy = \"redis://h\"",
                "key `migrate.target`: missing",
            ),
            (
                "[migrate]\nlegacy = \"redis://h\"\ntarget = \"etcd://e\"\nphase = \"half\"",
                "key `migrate.phase`",
            ),
            (
                "[migrate]\nlegacy = \"redis://h\"\ntarget = \"etcd://e\"\ntarget_password_env = \"NOPE\"",
                "key `migrate.target_password_env`: the environment variable `NOPE`",
            ),
            (
                "key_prefix = \"a\"\n[migrate]\nlegacy = \"redis://h\"\ntarget = \"etcd://e\"",
                "key `key_prefix`: not used with [migrate]",
            ),
        ] {
            let m = err(text);
            assert!(m.contains(says), "{text:?}: {m}");
            no_secret(&m);
        }
    }

    #[cfg(feature = "migrate")]
    #[test]
    fn a_migrate_section_is_the_migration_lock() {
        let c = parse(
            r#"
[migrate]
legacy = "redis://cache:6379"
target = "etcd://etcd:2379"
phase = "target"
legacy_password_env = "REDIS_PASSWORD"
target_password_env = "ETCD_PASSWORD"
"#,
        )
        .unwrap();
        let m = backend_migrate::MigrateConfig::parse(c.url()).unwrap();
        assert_eq!(m.phase(), backend_migrate::Phase::Target);
        assert_eq!(
            LockUrl::parse(m.legacy_url(), "x").unwrap().password(),
            Some("hunter2/@x")
        );
        assert_eq!(
            LockUrl::parse(m.target_url(), "x").unwrap().password(),
            Some("s3cret")
        );
        no_secret(&format!("{c} {c:?}"));
    }

    #[test]
    fn a_bare_url_keeps_the_defaults() {
        let c = Config::from_url("redis://:inline-pw@h");
        assert_eq!((c.ttl(), c.wait(), c.watchdog()), (None, None, true));
        no_secret(&format!("{c} {c:?}"));
    }

    #[test]
    fn a_migration_url_hides_both_passwords() {
        let c = Config::from_url(
            "migrate+redis://:inline-pw@h/0?to=etcd%3A%2F%2Fu%3As3cret%40e%3A2379&phase=both",
        );
        let shown = format!("{c} {c:?}");
        no_secret(&shown);
        assert!(shown.contains("etcd://u:***@e:2379"), "{shown}");
    }
}
