//! `polylock --config FILE` / `POLYLOCK_CONFIG`, and `polylock status` on a
//! migration lock, end to end as processes.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn polylock(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_polylock"));
    c.current_dir(dir)
        .env_remove("POLYLOCK_URL")
        .env_remove("POLYLOCK_CONFIG");
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn out(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn polylock")
}

#[test]
fn the_cli_reads_the_config_file_by_flag_and_by_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("polylock.toml");
    std::fs::write(
        &file,
        "url = \"sqlite://from-config.db\"\nttl = \"7s\"\nwait = \"0s\"\n",
    )
    .unwrap();
    let o = out(polylock(dir.path()).arg("--config").arg(&file).args([
        "run",
        "job",
        "--",
        "sh",
        "-c",
        "echo fence=$POLYLOCK_FENCE",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "fence=1");
    assert!(dir.path().join("from-config.db").exists());
    // The same file through POLYLOCK_CONFIG: the same lock table.
    let o = out(polylock(dir.path()).env("POLYLOCK_CONFIG", &file).args([
        "run",
        "job",
        "--",
        "sh",
        "-c",
        "echo fence=$POLYLOCK_FENCE",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "fence=2");
    assert!(
        !dir.path().join("polylock.db").exists(),
        "the default was used"
    );
    // --url and --config together are refused.
    let o = out(polylock(dir.path()).arg("--config").arg(&file).args([
        "--url",
        "sqlite://x.db",
        "status",
        "job",
    ]));
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    // So are POLYLOCK_URL and POLYLOCK_CONFIG together.
    let o = out(polylock(dir.path())
        .env("POLYLOCK_CONFIG", &file)
        .env("POLYLOCK_URL", "sqlite://x.db")
        .args(["status", "job"]));
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
}

#[test]
fn help_names_the_migration_lock_and_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let o = out(polylock(dir.path()).arg("--help"));
    let s = text(&o.stdout);
    assert!(s.contains("migrate+URL?to=TARGET_URL&phase=both"), "{s}");
    assert!(s.contains("--config <FILE>"), "{s}");
}

#[test]
fn a_bad_config_file_is_a_usage_error_naming_file_and_key_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    for (content, says) in [
        (
            "url = \"redis://127.0.0.1:1\"\n[credentials]\npassword_env = \"POLYLOCK_TEST_UNSET_PW\"\n",
            "key `credentials.password_env`: the environment variable `POLYLOCK_TEST_UNSET_PW` is not set",
        ),
        ("url = \"redis://:hunter2@h\n", "invalid TOML at line 1"),
        ("url = \"sqlite://a.db\"\nttl = \"soon\"\n", "key `ttl`"),
    ] {
        std::fs::write(&file, content).unwrap();
        let o = out(polylock(dir.path())
            .arg("--config")
            .arg(&file)
            .args(["status", "job"]));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{err}");
        assert!(err.contains(&file.display().to_string()), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
    // The password's value from the environment never shows either, even
    // when connecting fails.
    std::fs::write(
        &file,
        "url = \"redis://127.0.0.1:1\"\n[credentials]\npassword_env = \"POLYLOCK_TEST_PW\"\n",
    )
    .unwrap();
    let o = out(polylock(dir.path())
        .env("POLYLOCK_TEST_PW", "hunter2")
        .arg("--config")
        .arg(&file)
        .args(["run", "-n", "job", "--", "true"]));
    let err = text(&o.stderr);
    assert_ne!(o.status.code(), Some(0));
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn status_of_a_migration_lock_shows_both_sides() {
    let redis = testkit::RedisServer::start().unwrap();
    let etcd = testkit::EtcdServer::start().unwrap();
    let config = polylock::MigrateConfig::new(
        redis.url(),
        format!("etcd://{}", etcd.addr()),
        polylock::Phase::Both,
    )
    .unwrap();
    let url = config.to_url();
    let dir = tempfile::tempdir().unwrap();
    let status = |name: &str| out(polylock(dir.path()).args(["--url", &url, "status", name]));
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Free on both sides: exit 1.
    let o = status("report");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let s = text(&o.stdout);
    assert!(s.contains("legacy (redis://127.0.0.1:"), "{s}");
    assert!(s.contains("): free"), "{s}");

    // A legacy-only client holds it: only the legacy side is held.
    let legacy = rt.block_on(polylock::connect(&redis.url())).unwrap();
    let described = |command: &str| {
        polylock::HolderMeta::new("host-a", 4242, command, std::time::SystemTime::now())
    };
    let g = rt
        .block_on(
            legacy
                .lock("report")
                .ttl(Duration::from_secs(30))
                .holder_meta(described("legacy-service"))
                .acquire(),
        )
        .unwrap();
    let s = text(&status("report").stdout);
    let lines: Vec<_> = s.lines().collect();
    assert!(
        lines[1].starts_with("  legacy (redis://") && lines[1].contains("held by"),
        "{s}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("  target (etcd://") && l.ends_with("free")),
        "{s}"
    );
    assert!(
        s.contains("legacy side only: a legacy-only client holds it (pid 4242 on host-a)"),
        "{s}"
    );
    assert!(s.contains("command:       legacy-service"), "{s}");
    // Meanwhile a `target` client holds the target lock: two clients, a
    // mixed fleet, named as such.
    let target = rt
        .block_on(polylock::connect(&format!("etcd://{}", etcd.addr())))
        .unwrap();
    let t = rt
        .block_on(
            target
                .lock("report")
                .ttl(Duration::from_secs(30))
                .holder_meta(polylock::HolderMeta::new(
                    "host-b",
                    7,
                    "target-service",
                    std::time::SystemTime::now(),
                ))
                .acquire(),
        )
        .unwrap();
    let s = text(&status("report").stdout);
    assert!(
        s.contains(
            "WARNING: two clients hold the two sides (legacy: pid 4242 on host-a; target: pid 7 on host-b)"
        ),
        "{s}"
    );
    // The same picture as a `both` client waiting for the target, which
    // holds the legacy lock meanwhile: the message says how to tell.
    assert!(
        s.contains("unless the legacy holder is a `both` client waiting for the target"),
        "{s}"
    );
    rt.block_on(t.release()).unwrap();
    rt.block_on(g.release()).unwrap();

    // A `both` client: both sides held, the target's fence shown.
    let both = rt.block_on(polylock::connect(&url)).unwrap();
    let g = rt
        .block_on(
            both.lock("report")
                .ttl(Duration::from_secs(30))
                .holder_meta(described("both-service"))
                .acquire(),
        )
        .unwrap();
    let o = status("report");
    assert_eq!(o.status.code(), Some(0));
    let s = text(&o.stdout);
    assert!(
        s.starts_with("report: migration lock (this URL's phase: both)"),
        "{s}"
    );
    let target_at = s.find("  target (etcd://").expect(&s);
    assert!(s[..target_at].contains("held by"), "{s}");
    assert!(!s.contains("legacy side only"), "{s}");
    assert!(
        s.contains("both sides held by one `both` client (pid 4242 on host-a)"),
        "{s}"
    );
    assert!(
        s[target_at..].contains(&format!("fencing token: {}", g.fence())),
        "{s}"
    );
    rt.block_on(g.release()).unwrap();
}
