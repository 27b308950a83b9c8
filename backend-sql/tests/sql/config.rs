//! Bad configuration fails before any I/O; an unreachable or refusing
//! database gives a clear error that never shows the password.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use backend_sql::{SqlBackend, SqlError};
use lock_core::LockError;

use crate::common;

const SECRET: &str = "Sup3r-s3cret-pw";

fn connect_error(r: Result<SqlBackend, LockError>) -> LockError {
    match r {
        Ok(b) => panic!("expected an error, connected: {b:?}"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn in_memory_sqlite_is_refused_with_a_config_error() {
    for url in [
        "sqlite::memory:",
        "sqlite://:memory:",
        "sqlite://x.db?mode=memory",
    ] {
        let e = connect_error(SqlBackend::connect(url).await);
        assert!(matches!(e, LockError::Config(_)), "{url}: {e:?}");
        assert!(
            e.to_string().contains("cannot lock across processes"),
            "{e}"
        );
    }
}

/// A listener nobody should connect to: bad URLs must fail before I/O.
#[tokio::test]
async fn bad_urls_fail_before_any_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let cases = [
        format!("postgres://u:{SECRET}@127.0.0.1:{port}/db?table=Bad-Name"),
        format!("postgres://u:{SECRET}@127.0.0.1:{port}/db?table=x;drop"),
        format!("mysql://u:{SECRET}@127.0.0.1:{port}/db?max_poll=soon"),
        format!("mariadb://u:{SECRET}@127.0.0.1:{port}/db?pool_size=0"),
        format!(
            "mysql://u:{SECRET}@127.0.0.1:{port}/db?fence_table={}",
            "x".repeat(60)
        ),
        format!("oracle://u:{SECRET}@127.0.0.1:{port}/db"),
        "sqlite:///tmp/x.db?table=1st".to_string(),
        "sqlite:///tmp/x.db?unknown=1".to_string(),
    ];
    for url in &cases {
        let e = connect_error(SqlBackend::connect(url).await);
        assert!(matches!(e, LockError::Config(_)), "{url}: {e:?}");
        let text = format!("{e} {e:?}");
        assert!(!text.contains(SECRET), "{url}: password in {text}");
    }
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("a bad URL opened a connection: {other:?}"),
    }
}

#[tokio::test]
async fn unreachable_database_names_host_and_port_and_hides_the_password() {
    for scheme in ["postgres", "postgresql", "mysql", "mariadb"] {
        let port = testkit::free_port();
        let url = format!("{scheme}://app:{SECRET}@127.0.0.1:{port}/db");
        let started = Instant::now();
        let e = connect_error(SqlBackend::connect(&url).await);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{scheme}: took {:?}",
            started.elapsed()
        );
        let text = format!("{e} | {e:?}");
        assert!(
            text.contains(&format!("127.0.0.1:{port}")),
            "{scheme}: {text}"
        );
        assert!(text.contains("cannot connect"), "{scheme}: {text}");
        assert!(!text.contains(SECRET), "{scheme}: password in {text}");
        assert!(e.is_retryable(), "{scheme}: refused is worth retrying: {e}");
    }
}

#[tokio::test]
async fn wrong_password_is_permanent_and_not_shown() {
    let (pg_port, maria_port) =
        tokio::task::spawn_blocking(|| (common::pg().port(), common::maria().port()))
            .await
            .unwrap();
    for (scheme, port) in [("postgres", pg_port), ("mysql", maria_port)] {
        let url = format!("{scheme}://polylock:{SECRET}@127.0.0.1:{port}/polylock");
        let e = connect_error(SqlBackend::connect(&url).await);
        let text = format!("{e} | {e:?}");
        assert!(!text.contains(SECRET), "{scheme}: password in {text}");
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        assert!(
            !e.is_retryable(),
            "{scheme}: a bad password will not get better: {e}"
        );
        // The database's own code travels in the error's source.
        let LockError::Backend { source, .. } = &e else {
            panic!("{e:?}")
        };
        let sql = source
            .downcast_ref::<SqlError>()
            .expect("an SqlError source");
        assert!(sql.code().is_some(), "{scheme}: no error code in {sql:?}");
    }
}

#[tokio::test]
async fn sqlite_in_a_missing_directory_names_the_file() {
    let e = connect_error(SqlBackend::connect("sqlite:///nonexistent-dir/sub/locks.db").await);
    assert!(
        e.to_string().contains("/nonexistent-dir/sub/locks.db"),
        "{e}"
    );
}

#[tokio::test]
async fn debug_output_hides_the_password() {
    let db = tokio::task::spawn_blocking(common::postgres).await.unwrap();
    let client = db.client().await;
    let shown = format!("{client:?} {:?}", client.config());
    assert!(!shown.contains(common::pg().password()), "{shown}");
    assert!(shown.contains("***"), "{shown}");
}
