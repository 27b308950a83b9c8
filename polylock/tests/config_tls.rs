//! A config file's `[tls] ca` for PostgreSQL makes the driver verify the
//! server against it: a server whose certificate another CA signed, or one
//! without TLS, is refused, where the driver's own default mode would take
//! the CA file, check nothing and fall back to plain text.

use std::time::Duration;

use polylock::Config;
use testkit::PostgresServer;

fn config(url: &str, ca: &std::path::Path) -> Config {
    let text = format!(
        "url = \"{url}\"\nttl = \"5s\"\n[tls]\nca = \"{}\"\n",
        ca.display()
    );
    Config::from_toml(&text, "polylock.toml", |_| None).expect("a valid config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_files_ca_is_checked_against_the_server() {
    let (tls, plain) = tokio::task::spawn_blocking(|| {
        (
            PostgresServer::start_with_tls().expect("start PostgreSQL with TLS"),
            PostgresServer::start().expect("start PostgreSQL"),
        )
    })
    .await
    .unwrap();
    let ca = tls.tls_ca().expect("a TLS server has a CA");
    let other = tempfile::tempdir().unwrap();
    let other_ca = testkit::make_certs(other.path(), None)
        .expect("another CA")
        .ca;

    // The right CA: verified and used.
    let c = config(&tls.url(), ca);
    assert!(
        c.url().replace("%2D", "-").contains("sslmode=verify-full"),
        "{}",
        c.redacted_url()
    );
    let locker = c.connect().await.expect("connect with the server's CA");
    let guard = locker
        .lock("config-tls")
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acquire over TLS");
    guard.release().await.expect("release");

    // Another CA, or no TLS at all: refused, never plain text.
    for (what, url, ca) in [
        (
            "a certificate another CA signed",
            tls.url(),
            other_ca.as_path(),
        ),
        ("a server without TLS", plain.url(), ca),
    ] {
        let r = config(&url, ca).connect().await;
        let e = match r {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => e,
        };
        assert!(!e.to_string().contains(tls.password()), "{e}");
    }

    // A mode the URL sets itself is kept.
    let c = config(&format!("{}?sslmode=require", tls.url()), &other_ca);
    assert!(
        !c.url().replace("%2D", "-").contains("verify-full"),
        "{}",
        c.redacted_url()
    );
    c.connect().await.expect("sslmode=require checks no CA");
}
