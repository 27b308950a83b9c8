//! docs/guarantees.md, the README's operations table and the hand-typed
//! guarantee tables of docs/sql.md and docs/migration.md hold exactly what
//! the backends declare.

#[cfg(all(
    feature = "memory",
    feature = "sql",
    feature = "redis",
    feature = "etcd"
))]
#[test]
fn the_docs_table_is_what_the_backends_declare() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/guarantees.md"
    ))
    .expect("docs/guarantees.md");
    let table = polylock::guarantees_table();
    assert!(
        doc.contains(&table),
        "docs/guarantees.md is out of date; regenerate the table with \
         `cargo run -p polylock -- guarantees`:\n{table}"
    );
}

#[cfg(all(
    feature = "memory",
    feature = "sql",
    feature = "redis",
    feature = "etcd",
    feature = "zk"
))]
#[test]
fn the_readme_operations_table_is_what_the_backends_declare() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let table = polylock::operations_table();
    assert!(
        readme.contains(&table),
        "README.md's operations table is out of date; it should be:\n{table}"
    );
}

#[test]
fn every_compiled_backend_declares_its_guarantees_once() {
    let all = polylock::declared_guarantees();
    assert!(all.iter().any(|g| g.backend == "memory"));
    let mut names: Vec<_> = all.iter().map(|g| g.backend).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), all.len(), "a backend is listed twice");
    for g in &all {
        assert!(!g.min_ttl.is_zero(), "{}: a zero minimum TTL", g.backend);
        assert!(
            g.effective_ttl(g.min_ttl) == g.min_ttl,
            "{}: min TTL off its own step",
            g.backend
        );
    }
}

/// docs/sql.md, with every run of whitespace made one space (the prose is
/// wrapped at any word).
#[cfg(feature = "sql")]
fn sql_doc() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/sql.md"))
        .expect("docs/sql.md");
    doc.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(feature = "sql")]
#[test]
fn docs_sql_states_the_expiry_clock_each_sql_backend_declares() {
    let declared = |name: &str| {
        polylock::declared_guarantees()
            .into_iter()
            .find(|g| g.backend == name)
            .unwrap_or_else(|| panic!("{name} is not declared"))
            .expiry_clock
    };
    let (sqlite, postgres, mysql) = (declared("sqlite"), declared("postgres"), declared("mysql"));
    assert_eq!(
        sqlite,
        polylock::ExpiryClock::ClientHost,
        "SQLite runs in the client"
    );
    let doc = sql_doc();
    // The guarantees table's row, column by column: SQLite, PostgreSQL, MySQL.
    let row = format!(
        "| expiry clock | {} | {} | {} |",
        sqlite.judged_by(),
        postgres.judged_by(),
        mysql.judged_by()
    );
    assert!(doc.contains(&row), "docs/sql.md lacks the row\n{row}");
    for clock in [sqlite, postgres, mysql] {
        assert!(
            doc.contains(clock.broken_by()),
            "docs/sql.md does not say what breaks {clock:?}: {}",
            clock.broken_by()
        );
    }
}

/// The cells of the markdown table in `doc` whose header row starts with
/// `header`: one entry per row, its label and its cells after the label.
#[cfg(feature = "sql")]
fn hand_table(doc: &str, header: &str) -> Vec<(String, Vec<String>)> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_owned())
            .collect()
    };
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table headed {header:?}");
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let mut c = cells(l);
            let label = c.remove(0);
            (label, c)
        })
        .collect()
}

#[cfg(feature = "sql")]
fn declared(name: &str) -> lock_core::Guarantees {
    polylock::declared_guarantees()
        .into_iter()
        .find(|g| g.backend == name)
        .unwrap_or_else(|| panic!("{name} is not declared"))
}

/// A duration as the hand tables write it: `2 s`, `1 ms`, `1 µs`.
#[cfg(feature = "sql")]
fn spaced(d: std::time::Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{} µs", d.as_micros())
    }
}

#[cfg(feature = "sql")]
fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// docs/sql.md's Guarantees table, typed by hand, says what the three SQL
/// backends declare.
#[cfg(feature = "sql")]
#[test]
fn docs_sql_guarantees_table_is_what_the_backends_declare() {
    use lock_core::{FencingGuarantee, WaitMechanism};
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/sql.md"))
        .expect("docs/sql.md");
    let table = hand_table(&doc, "| | SQLite | PostgreSQL | MySQL/MariaDB |");
    for (i, backend) in ["sqlite", "postgres", "mysql"].into_iter().enumerate() {
        let g = declared(backend);
        for (label, cells) in &table {
            let cell = cells[i].as_str();
            let ok = match label.as_str() {
                "fencing" => (cell == "strict") == (g.fencing == FencingGuarantee::Strict),
                "survives a server restart" => cell.starts_with(yes(g.survives_restart)),
                "survives failover" => cell == yes(g.survives_failover),
                "wait" => {
                    cell == match g.wait {
                        WaitMechanism::Poll => "poll",
                        WaitMechanism::Notify => "LISTEN/NOTIFY",
                        other => panic!("{backend}: {other:?}"),
                    }
                }
                "fair FIFO" => cell == yes(g.fair_fifo),
                "force release" => cell == yes(g.force_release),
                "TTL granularity" => cell == spaced(g.ttl_granularity),
                "expiry clock" => continue,
                other => panic!("docs/sql.md: an unchecked row {other:?}"),
            };
            assert!(ok, "docs/sql.md, {backend}, {label}: {cell:?} but {g:?}");
        }
    }
}

/// docs/migration.md's table of what each target changes, typed by hand,
/// says what the targets declare.
#[cfg(all(feature = "sql", feature = "etcd", feature = "zk"))]
#[test]
fn docs_migration_targets_table_is_what_the_backends_declare() {
    use lock_core::{FencingGuarantee, WaitMechanism};
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/migration.md"))
        .expect("docs/migration.md");
    let table = hand_table(&doc, "| | etcd | ZooKeeper |");
    let backends = ["etcd", "zookeeper", "postgres", "mysql", "sqlite"];
    for (i, backend) in backends.into_iter().enumerate() {
        let g = declared(backend);
        for (label, cells) in &table {
            let cell = cells[i].as_str();
            let ok = match label.as_str() {
                "TTL: smallest / step" => cell.starts_with(&format!(
                    "{} / {}",
                    spaced(g.min_ttl),
                    spaced(g.ttl_granularity)
                )),
                "FIFO waiters" => cell == yes(g.fair_fifo),
                "fencing tokens" => {
                    (cell == "strictly increasing") == (g.fencing == FencingGuarantee::Strict)
                }
                "survives restart / failover" => {
                    cell == format!("{} / {}", yes(g.survives_restart), yes(g.survives_failover))
                }
                "waiters wake by" => {
                    cell == match g.wait {
                        WaitMechanism::Poll => "polling",
                        WaitMechanism::Notify => "LISTEN/NOTIFY",
                        WaitMechanism::Watch => "watch",
                        other => panic!("{backend}: {other:?}"),
                    }
                }
                "expiry judged by" => continue,
                other => panic!("docs/migration.md: an unchecked row {other:?}"),
            };
            assert!(
                ok,
                "docs/migration.md, {backend}, {label}: {cell:?} but {g:?}"
            );
        }
    }
}
