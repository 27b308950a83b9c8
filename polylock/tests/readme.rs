//! The README's examples work as written: its sample config file is read
//! and its URL is accepted by the backend it names, without a connection.

const README: &str = include_str!("../../README.md");

/// The README's fenced blocks of language `lang`.
fn blocks(lang: &str) -> Vec<String> {
    let fence = format!("```{lang}");
    let mut out = Vec::new();
    let mut lines = README.lines();
    while let Some(line) = lines.next() {
        if line.trim() == fence {
            let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            out.push(body.join("\n"));
        }
    }
    out
}

#[test]
fn the_sample_config_file_is_accepted_by_its_backend() {
    let samples: Vec<String> = blocks("toml")
        .into_iter()
        .filter(|b| b.contains("[credentials]"))
        .collect();
    assert_eq!(
        samples.len(),
        1,
        "the README's sample config file: {samples:?}"
    );
    let config = polylock::Config::from_toml(&samples[0], "README.md", |name| {
        (name == "REDIS_PASSWORD").then(|| "s3cret".to_owned())
    })
    .unwrap_or_else(|e| panic!("README.md's config file: {e}"));
    // Every option the file turns into a URL option is one the Redis
    // backend takes (a CA, for one, only with `rediss://`).
    backend_redis::RedisConfig::parse(config.url())
        .unwrap_or_else(|e| panic!("README.md's config file, as a Redis URL: {e}"));
}
