//! `list`: exact, case-sensitive prefixes in byte order on every database.

use std::time::Duration;

use backend_sql::SqlBackend;
use lock_core::{LockBackend, LockError};
use tokio::time::sleep;

use crate::common::{self, try_once, unique};

/// The names `client` lists under `prefix`, without the test's own
/// prefix `p` and its slash.
async fn listed(client: &SqlBackend, p: &str, prefix: String) -> Vec<String> {
    client
        .list(&prefix, 100)
        .await
        .unwrap_or_else(|e| panic!("list {prefix:?}: {e}"))
        .into_iter()
        .map(|(n, _)| {
            let n = n.as_str();
            // A name outside the prefix shows as it is, and fails the test.
            n.strip_prefix(&format!("{p}/")).unwrap_or(n).to_string()
        })
        .collect()
}

/// LIKE's wildcards and escape character in a prefix match only
/// themselves, case matters, and the order is the byte order of UTF-8
/// (which Rust's `str` order is), whatever the database's collation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_match_exactly_and_names_come_in_byte_order() {
    for db in common::all().await {
        let d = db.dialect;
        let client = db.client().await;
        // `unique` puts a `_` in the prefix: a wildcard if left unescaped.
        let p = unique("list");
        let decoy = p.replacen('_', "X", 1);
        let suffixes = [
            "A", "a%", "a_b", "axb", "a\\b", "!x", "!!", "z", "é", "ü", "a b", "Z/y",
        ];
        let mut leases = Vec::new();
        for s in suffixes {
            leases.push(
                try_once(&client, &format!("{p}/{s}"), Duration::from_secs(60))
                    .await
                    .unwrap_or_else(|| panic!("{d:?}: {s} is free")),
            );
        }
        leases.push(
            try_once(&client, &format!("{decoy}/a"), Duration::from_secs(60))
                .await
                .expect("free"),
        );
        let mut all: Vec<&str> = suffixes.to_vec();
        all.sort();
        assert_eq!(
            listed(&client, &p, format!("{p}/")).await,
            all,
            "{d:?}: everything"
        );
        assert_eq!(
            listed(&client, &p, p.clone()).await,
            all,
            "{d:?}: the decoy is not listed"
        );
        assert_eq!(
            listed(&client, &p, format!("{p}/a_")).await,
            ["a_b"],
            "{d:?}: `_`"
        );
        assert_eq!(
            listed(&client, &p, format!("{p}/a%")).await,
            ["a%"],
            "{d:?}: `%`"
        );
        assert_eq!(
            listed(&client, &p, format!("{p}/!")).await,
            ["!!", "!x"],
            "{d:?}: `!`"
        );
        assert_eq!(
            listed(&client, &p, format!("{p}/a\\")).await,
            ["a\\b"],
            "{d:?}: `\\`"
        );
        assert_eq!(
            listed(&client, &p, format!("{p}/a")).await,
            ["a b", "a%", "a\\b", "a_b", "axb"],
            "{d:?}: lower case only, in byte order"
        );
        assert_eq!(
            listed(&client, &p, format!("{p}/Z")).await,
            ["Z/y"],
            "{d:?}: upper case only"
        );
        assert_eq!(
            listed(&client, &p, format!("{p}/\u{e9}")).await,
            ["é"],
            "{d:?}: non-ASCII"
        );
        assert!(
            listed(&client, &p, format!("{p}/ab")).await.is_empty(),
            "{d:?}"
        );
        assert!(
            client.list(&p, 0).await.unwrap().is_empty(),
            "{d:?}: limit 0"
        );
        for l in &leases {
            client.release(l).await.unwrap();
        }
        assert!(
            listed(&client, &p, format!("{p}/")).await.is_empty(),
            "{d:?}: released"
        );
    }
}

/// An expired lock is not listed (the database's clock judges), and a
/// bad prefix is refused before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_locks_are_not_listed_and_bad_prefixes_are_refused() {
    for db in common::all().await {
        let d = db.dialect;
        let client = db.client().await;
        let p = unique("expiry");
        let short = try_once(&client, &format!("{p}/short"), Duration::from_millis(200))
            .await
            .expect("free");
        let long = try_once(&client, &format!("{p}/long"), Duration::from_secs(60))
            .await
            .expect("free");
        sleep(Duration::from_millis(1200)).await;
        let listed = client.list(&p, 10).await.unwrap();
        let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [long.name().as_str()], "{d:?}");
        let left = listed[0].1.expires_in.expect("time left");
        assert!(
            left > Duration::from_secs(30) && left <= Duration::from_secs(60),
            "{d:?}: {left:?}"
        );
        assert_eq!(listed[0].1.fence, Some(long.fence()), "{d:?}");
        client.release(&long).await.unwrap();
        // Expired and not taken since: releasing is fine.
        client.release(&short).await.unwrap();
    }
    // Refused by lock-core's check, as on every backend.
    let db = common::sqlite();
    let client = db.client().await;
    let long = "x".repeat(lock_core::LockName::MAX_LEN + 1);
    for bad in ["a\0b", long.as_str()] {
        let r = client.list(bad, 10).await;
        assert!(matches!(r, Err(LockError::InvalidName { .. })), "{r:?}");
    }
}
