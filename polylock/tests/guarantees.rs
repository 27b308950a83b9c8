//! docs/guarantees.md holds exactly what the backends declare.

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
