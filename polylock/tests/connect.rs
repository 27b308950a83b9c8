//! `connect(url)`: one registry maps schemes to backends.

use polylock::{available_schemes, connect, LockError};

#[tokio::test]
async fn memory_urls_share_a_table_per_name() {
    let a = connect("memory://shared").await.unwrap();
    let b = connect("memory://shared").await.unwrap();
    let c = connect("memory://other").await.unwrap();
    let g = a.lock("job").acquire().await.unwrap();
    assert!(
        b.lock("job").try_acquire().await.unwrap().is_none(),
        "same URL, same table"
    );
    let other = c
        .lock("job")
        .try_acquire()
        .await
        .unwrap()
        .expect("another table");
    other.release().await.unwrap();
    g.release().await.unwrap();
    assert!(available_schemes().contains(&"memory"));
}

/// The scheme is case-insensitive in every spelling, with or without `//`:
/// `Memory:jobs` is the table `jobs`, not the empty name's.
#[tokio::test]
async fn memory_urls_name_their_table_whatever_the_scheme_case() {
    let held = connect("memory:jobs-case")
        .await
        .unwrap()
        .lock("job")
        .acquire()
        .await
        .unwrap();
    for url in [
        "Memory:jobs-case",
        "MEMORY://jobs-case",
        "memory://jobs-case",
    ] {
        let other = connect(url).await.unwrap();
        assert!(
            other.lock("job").try_acquire().await.unwrap().is_none(),
            "{url}: not the table memory:jobs-case"
        );
    }
    let elsewhere = connect("Memory:other-case").await.unwrap();
    let g = elsewhere
        .lock("job")
        .try_acquire()
        .await
        .unwrap()
        .expect("Memory:other-case is another table");
    assert!(
        connect("Memory:third-case")
            .await
            .unwrap()
            .lock("job")
            .try_acquire()
            .await
            .unwrap()
            .is_some(),
        "Memory:third-case shares a table with Memory:other-case"
    );
    g.release().await.unwrap();
    held.release().await.unwrap();
}

fn config_message(r: Result<polylock::Locker, LockError>) -> String {
    match r {
        Err(LockError::Config(m)) => m,
        other => panic!("expected a Config error, got {other:?}"),
    }
}

#[tokio::test]
async fn unknown_scheme_names_the_available_ones() {
    let m = config_message(connect("nosuch://host").await);
    assert!(m.contains("unknown lock URL scheme `nosuch`"), "{m}");
    for s in available_schemes() {
        assert!(m.contains(s), "{m} should list {s}");
    }
}

#[tokio::test]
async fn not_a_url_is_a_config_error() {
    for bad in ["", "just-a-name", "://x", "re dis://x"] {
        let m = config_message(connect(bad).await);
        assert!(m.contains("not a lock URL"), "{bad:?}: {m}");
    }
}

#[tokio::test]
async fn errors_never_show_passwords() {
    let m = config_message(connect("nosuch://user:hunter2@host/db").await);
    assert!(!m.contains("hunter2"), "{m}");
    assert!(m.contains("user:***@host"), "{m}");
    let m = config_message(connect("memory://x?password=hunter2").await);
    assert!(!m.contains("hunter2"), "{m}");
}

#[tokio::test]
async fn the_one_liner_guard_is_renewed_without_its_locker() {
    use std::time::Duration;
    let guard = connect("memory://one-liner")
        .await
        .unwrap()
        .lock("job")
        .ttl(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(guard.is_held(), "the guard was not renewed");
    let other = connect("memory://one-liner").await.unwrap();
    assert!(other.lock("job").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
}

#[tokio::test]
async fn unencoded_delimiters_in_passwords_never_show() {
    for url in [
        "nosuch://:ab#c@h",
        "nosuch://u:p#w@h",
        "nosuch://u:pa/ss@h/db",
        "nosuch://u:p?x=y@h",
    ] {
        let m = config_message(connect(url).await);
        for secret in ["ab#c", "p#w", "pa/ss", "p?x=y"] {
            assert!(!m.contains(secret), "{url}: {m}");
        }
    }
}
