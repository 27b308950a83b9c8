//! `rediss://`: TLS to a real redis-server, with a CA made for the test.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use backend_redis::RedisBackend;
use common::{acquire_free, name, release_and_time_handoff, spawn_waiter_that_releases};
use lock_core::{LockBackend, Locker};
use testkit::RedisServer;

/// A CA and a server certificate for 127.0.0.1, made with the openssl CLI.
fn make_certs(dir: &Path) {
    let run = |args: &[&str]| {
        let out = testkit::run_with_timeout(
            Command::new("openssl").args(args).current_dir(dir),
            Duration::from_secs(30),
        )
        .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=polylock test CA",
        "-days",
        "2",
    ]);
    run(&ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&csr);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let p = |f: &str| dir.path().join(f).to_string_lossy().into_owned();
    let tls_port = testkit::free_port().to_string();
    // The plain port stays open for the test kit's readiness probe; the
    // backend only uses the TLS one.
    let srv = RedisServer::start_with_args(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &p("server.crt"),
        "--tls-key-file",
        &p("server.key"),
        "--tls-ca-cert-file",
        &p("ca.crt"),
        "--tls-auth-clients",
        "no",
    ])
    .unwrap();
    let _ = &srv;
    let url = format!("rediss://127.0.0.1:{tls_port}/0?tls_ca={}", p("ca.crt"));
    let backend = RedisBackend::connect(&url).await.unwrap();
    assert!(backend.config().is_tls());
    let n = name("tls/lock");
    let lease = acquire_free(&backend, &n, Duration::from_secs(5)).await;
    assert_eq!(
        backend.inspect(&n).await.unwrap().unwrap().fence,
        Some(lease.fence())
    );
    backend.release(&lease).await.unwrap();

    // Waiting works over TLS too: the pub/sub connection uses it as well.
    let holder = Locker::new(backend.clone());
    let waiter = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let g = holder.lock("tls/wait").acquire().await.unwrap();
    let task = spawn_waiter_that_releases(waiter, "tls/wait", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let handoff = release_and_time_handoff(g, task).await;
    // The fallback poll would take 250-500 ms here.
    assert!(handoff < Duration::from_millis(200), "{handoff:?}");

    // Without our CA the server's certificate is refused, and the error says so.
    let e = RedisBackend::connect(&format!("rediss://127.0.0.1:{tls_port}/0"))
        .await
        .expect_err("an unknown CA must be refused");
    assert!(matches!(e, lock_core::LockError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("certificate was refused"), "{e}");
    // A tls_ca file that does not exist is a configuration error.
    let e = RedisBackend::connect(&format!(
        "rediss://127.0.0.1:{tls_port}/0?tls_ca=/nonexistent/ca.pem"
    ))
    .await
    .expect_err("missing CA file");
    assert!(matches!(e, lock_core::LockError::Config(_)), "{e:?}");
}
