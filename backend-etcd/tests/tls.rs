//! `etcds://` against an etcd serving TLS with a test CA (the test kit's
//! `make_certs`; the test kit starts plain-text etcd only).

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use backend_etcd::EtcdBackend;
use common::name;
use lock_core::Locker;
use tokio::time::{sleep, Instant};

/// Kills the etcd it started.
struct Etcd(Child);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_tls_etcd(dir: &Path, certs: &testkit::TestCerts) -> (Etcd, u16) {
    let (client, peer) = (testkit::free_port(), testkit::free_port());
    let client_url = format!("https://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .current_dir(dir)
        .args(["--name", "tls", "--data-dir", "data"])
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("tls={peer_url}")])
        .arg("--cert-file")
        .arg(&certs.cert)
        .arg("--key-file")
        .arg(&certs.key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcd");
    (Etcd(child), client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = testkit::make_certs(dir.path(), None).expect("test certificates");
    let (_etcd, port) = start_tls_etcd(dir.path(), &certs);
    let ca = certs.ca;
    let url = format!(
        "etcds://127.0.0.1:{port}?ca={}&connect_timeout=2s",
        ca.display()
    );

    // Ready when a TLS client gets through.
    let started = Instant::now();
    let backend = loop {
        match EtcdBackend::connect(&url).await {
            Ok(b) => break b,
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("TLS etcd never answered: {e}"),
        }
    };
    assert!(backend.config().tls());
    let locker = Locker::new(backend);
    let g = locker.lock(name("tls")).acquire().await.unwrap();
    g.release().await.unwrap();

    // Without the CA the server's certificate is not trusted: an error, in time.
    let started = Instant::now();
    let e = EtcdBackend::connect(&format!("etcds://127.0.0.1:{port}?connect_timeout=2s"))
        .await
        .expect_err("untrusted certificate");
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Plain text to a TLS port fails too.
    let started = Instant::now();
    let e = EtcdBackend::connect(&format!("etcd://127.0.0.1:{port}?connect_timeout=2s"))
        .await
        .expect_err("plain text to a TLS port");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(started.elapsed() < Duration::from_secs(4));
    // A missing CA file is a configuration error, before any I/O.
    let e = EtcdBackend::connect("etcds://127.0.0.1:1?ca=/nonexistent/ca.pem")
        .await
        .expect_err("no CA file");
    assert!(matches!(e, lock_core::LockError::Config(_)), "{e}");
}
