//! Bad input against a real redis-server: wrong URLs, a database that does
//! not exist, refused credentials, keys of another type. Each is a clear
//! error, and nobody else's data is touched.

mod common;

use std::time::Duration;

use backend_redis::RedisBackend;
use common::{acquire_free, backend, name, raw, req, server, server_and_clients, wait_req};
use lock_core::{LockBackend, LockError};
use redis::AsyncCommands;
use tokio::time::Instant;

fn config_error(r: Result<RedisBackend, LockError>) -> String {
    match r {
        Err(LockError::Config(m)) => m,
        other => panic!("expected a Config error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_urls_fail_before_any_io() {
    for (url, says) in [
        ("redis://127.0.0.1:1/abc", "database number"),
        ("redis://127.0.0.1:1?format=xml", "plain or redisson"),
        ("redis://127.0.0.1:1?colour=red", "unknown option `colour`"),
        ("redis://127.0.0.1:99999", "port"),
        ("redis:/127.0.0.1", "expected redis://"),
        ("redis+cluster://127.0.0.1:1,127.0.0.1:2/3", "database 0"),
    ] {
        // Port 1 has no server: a Config error proves nothing was dialled.
        let m = config_error(RedisBackend::connect(url).await);
        assert!(m.contains(says), "{url}: {m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_a_retryable_error_promptly() {
    let port = testkit::free_port();
    let started = Instant::now();
    let e = RedisBackend::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect_err("nothing listens there");
    assert!(e.is_retryable(), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_does_not_exist_is_a_clear_error() {
    let srv = server();
    let started = Instant::now();
    let m = config_error(RedisBackend::connect(&format!("{}/99", srv.url())).await);
    assert!(m.contains("no database 99"), "{m}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Database 15 exists on a default server, and is separate from 0.
    let fifteen = backend(&format!("{}/15", srv.url())).await;
    let zero = backend(&format!("{}/0", srv.url())).await;
    let n = name("input/db");
    let lease = fifteen
        .try_acquire(&req(&n, Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(lease.is_some());
    assert!(zero.inspect(&n).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_a_clear_error_without_the_password() {
    // Set the password at run time: the test kit's readiness probe takes
    // `-NOAUTH` for "not ready" (`--requirepass` on the command line would
    // make start-up time out).
    let srv = server();
    let mut admin = raw(&srv.url()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("right-horse-battery")
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = |pw: &str| format!("redis://:{pw}@127.0.0.1:{}/0", srv.port());
    let m = config_error(RedisBackend::connect(&url("wrong-staple-1234")).await);
    assert!(m.contains("refused the credentials"), "{m}");
    assert!(!m.contains("wrong-staple-1234"), "{m}");
    let m =
        config_error(RedisBackend::connect(&format!("redis://127.0.0.1:{}/0", srv.port())).await);
    assert!(m.contains("refused the credentials"), "{m}");

    let good = RedisBackend::connect(&url("right-horse-battery"))
        .await
        .unwrap();
    let dbg = format!("{good:?} {:?}", good.config());
    assert!(!dbg.contains("right-horse-battery"), "{dbg}");
    assert!(dbg.contains("***"), "{dbg}");
    let n = name("input/auth");
    let lease = acquire_free(&good, &n, Duration::from_secs(5)).await;
    good.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_lock_on_a_key_of_another_type() {
    let (_srv, ours, mut r) = server_and_clients("").await;
    let n = name("input/wrongtype");
    let key = ours.keys(&n).unwrap().lock;
    let _: () = r.hset(&key, "their", "data").await.unwrap();

    let e = ours
        .try_acquire(&req(&n, Duration::from_secs(5)))
        .await
        .expect_err("a hash is not a plain lock");
    assert!(!e.is_retryable(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("WRONGTYPE") && text.contains("hash"),
        "{text}"
    );
    // A waiting acquire does not wait on it either.
    let started = Instant::now();
    let e = ours
        .acquire(&wait_req(
            &n,
            Duration::from_secs(5),
            Duration::from_secs(10),
        ))
        .await
        .expect_err("waiting on a hash");
    assert!(e.to_string().contains("WRONGTYPE"));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(ours.inspect(&n).await.is_err());
    let data: Vec<(String, String)> = r.hgetall(&key).await.unwrap();
    assert_eq!(data, vec![("their".to_string(), "data".to_string())]);
    let ttl: i64 = r.ttl(&key).await.unwrap();
    assert_eq!(ttl, -1, "their key got an expiry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_lock_on_a_key_of_another_type() {
    let (_srv, ours, mut r) = server_and_clients("?format=redisson").await;
    let n = name("input-wrongtype");
    let _: () = r.set("input-wrongtype", "their value").await.unwrap();
    let lease = ours
        .try_acquire(&req(&n, Duration::from_secs(5)))
        .await
        .expect_err("a string is not a Redisson lock");
    assert!(!lease.is_retryable());
    assert!(lease.to_string().contains("WRONGTYPE"), "{lease}");
    let v: String = r.get("input-wrongtype").await.unwrap();
    assert_eq!(v, "their value");
    let ttl: i64 = r.ttl("input-wrongtype").await.unwrap();
    assert_eq!(ttl, -1);
    // The fencing counter was not bumped by the failed attempt.
    let token: Option<u64> = r
        .get("redisson_lock_token:{input-wrongtype}")
        .await
        .unwrap();
    assert_eq!(token, None);
}
