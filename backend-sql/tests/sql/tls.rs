//! TLS to PostgreSQL through the driver's own options (`sslmode=`).

use std::time::Duration;

use backend_sql::SqlBackend;
use lock_core::{LockError, Locker};
use testkit::PostgresServer;

use crate::common::{pg, unique};

#[tokio::test]
async fn postgres_over_tls_when_required() {
    let server = tokio::task::spawn_blocking(PostgresServer::start_with_tls)
        .await
        .unwrap()
        .expect("start PostgreSQL with TLS");
    let url = format!("{}?sslmode=require&table={}", server.url(), unique("tls"));
    let backend = SqlBackend::connect(&url).await.expect("connect over TLS");
    let locker = Locker::new(backend);
    let guard = locker
        .lock("over-tls")
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acquire over TLS");
    assert!(guard.fence().get() >= 1);
    guard.release().await.expect("release over TLS");
}

#[tokio::test]
async fn required_tls_to_a_server_without_it_fails_clearly() {
    let plain = pg();
    let url = format!("{}?sslmode=require&table={}", plain.url(), unique("notls"));
    let err = SqlBackend::connect(&url)
        .await
        .expect_err("sslmode=require must not fall back to plain text");
    let msg = err.to_string();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(!msg.contains(plain.password()), "password leaked: {msg}");
    assert!(
        msg.contains("127.0.0.1"),
        "the error names the server: {msg}"
    );
}
