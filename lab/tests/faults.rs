//! The fault suite's quick subset over every backend with a server or a
//! file (memory is in-process and excluded), as CI runs it: the claims
//! check must pass and the three kinds of output must be written.

use std::process::Command;

use serde_json::Value;

#[test]
fn the_quick_subset_confirms_every_claim_and_writes_the_docs() {
    let out = tempfile::tempdir().expect("temp dir");
    let status = Command::new(env!("CARGO_BIN_EXE_polylock-compare"))
        .args(["--quick", "--out"])
        .arg(out.path())
        .arg("--logs")
        .arg(out.path().join("logs"))
        .status()
        .expect("running polylock-compare");
    let md = std::fs::read_to_string(out.path().join("guarantees.md")).expect("guarantees.md");
    assert!(
        status.success(),
        "polylock-compare --quick failed ({status}); its page says:\n{md}"
    );
    let declared = polylock::guarantees_table();
    assert!(
        md.contains(&declared),
        "the declared table must be exactly what `polylock guarantees` prints"
    );
    // Every backend of the build, the in-process one included, even though
    // the fault suite cannot run it.
    assert!(declared.contains("\n| memory |"), "{declared}");
    assert!(md.contains("## Observed") && md.contains("All "), "{md}");

    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("guarantees.json")).expect("guarantees.json"),
    )
    .expect("valid JSON");
    assert_eq!(json["errors"], Value::Array(vec![]), "{:#}", json["errors"]);
    assert!(json["generated_at"]
        .as_str()
        .is_some_and(|s| s.ends_with('Z')));
    let backends = json["backends"].as_array().expect("backends");
    let labels: Vec<&str> = backends
        .iter()
        .map(|b| b["backend"].as_str().expect("label"))
        .collect();
    assert_eq!(
        labels,
        [
            "sqlite",
            "postgres",
            "mysql",
            "redis",
            "redlock",
            "etcd",
            "zookeeper"
        ]
    );
    for b in backends {
        assert!(
            !b["server_version"].as_str().unwrap_or("").is_empty(),
            "{b:#}"
        );
    }
    let observations = json["observations"].as_array().expect("observations");
    assert_eq!(
        observations.len(),
        labels.len() * 3,
        "3 quick scenarios each"
    );
    for o in observations {
        let status = o["status"].as_str().expect("status");
        assert!(
            status == "observed" || status == "not applicable",
            "{}/{}: {status}: {}",
            o["backend"],
            o["scenario"],
            o["reason"]
        );
        if o["scenario"] == "client-pause" {
            // Every backend here issues fencing tokens: the paused holder's
            // late write is stopped, and none is let through.
            let obs = &o["observation"];
            assert_eq!(obs["stale_accepted"], 0, "{o:#}");
            assert!(obs["stale_rejected"].as_u64() >= Some(1), "{obs:#}");
            let svg = out.path().join(format!(
                "timelines/{}-client-pause.svg",
                o["backend"].as_str().expect("backend")
            ));
            let svg = std::fs::read_to_string(&svg).expect("a timeline per backend");
            assert!(svg.starts_with("<svg") && svg.contains("REJECTED"), "{svg}");
        }
    }
}

#[test]
fn an_unknown_backend_is_a_usage_error_before_any_server_starts() {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_polylock-compare"))
        .args(["--backends", "redis,nosuch", "--out"])
        .arg(out.path())
        .output()
        .expect("running polylock-compare");
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("unknown backend \"nosuch\""), "{stderr}");
    assert!(!stderr.contains("starting"), "{stderr}");
    assert!(!out.path().join("guarantees.md").exists());
}
