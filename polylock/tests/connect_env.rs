//! `polylock::connect_from_env()`: POLYLOCK_URL or POLYLOCK_CONFIG. One test
//! in its own binary, since it sets process-wide environment variables.

use std::time::Duration;

use polylock::LockError;

#[tokio::test(flavor = "current_thread")]
async fn connect_from_env_reads_the_url_or_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    std::env::remove_var("POLYLOCK_URL");
    std::env::remove_var("POLYLOCK_CONFIG");
    let e = polylock::connect_from_env().await.unwrap_err();
    assert!(
        matches!(&e, LockError::Config(m) if m.contains("POLYLOCK_URL") && m.contains("POLYLOCK_CONFIG")),
        "{e:?}"
    );

    let db = dir.path().join("env.db");
    std::env::set_var("POLYLOCK_URL", format!("sqlite://{}", db.display()));
    let locker = polylock::connect_from_env().await.unwrap();
    let g = locker.lock("job").acquire().await.unwrap();
    assert_eq!(g.fence().get(), 1);
    g.release().await.unwrap();

    let file = dir.path().join("polylock.toml");
    std::fs::write(
        &file,
        format!("url = \"sqlite://{}\"\nttl = \"9s\"\n", db.display()),
    )
    .unwrap();
    std::env::set_var("POLYLOCK_CONFIG", &file);
    let e = polylock::connect_from_env().await.unwrap_err();
    assert!(
        matches!(&e, LockError::Config(m) if m.contains("both")),
        "{e:?}"
    );
    std::env::remove_var("POLYLOCK_URL");
    let config = polylock::Config::from_env().unwrap();
    assert_eq!(config.ttl(), Some(Duration::from_secs(9)));
    let locker = polylock::connect_from_env().await.unwrap();
    let g = locker.lock("job").acquire().await.unwrap();
    assert_eq!(g.fence().get(), 2, "the same lock table as through the URL");
    g.release().await.unwrap();
}
