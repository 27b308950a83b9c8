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
