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

/// The `at_ms` of the first event of `client` with `kind`.
fn first_at(events: &[Value], client: &str, kind: &str) -> Option<f64> {
    events
        .iter()
        .find(|e| e["client"] == client && e["kind"] == kind)
        .and_then(|e| e["at_ms"].as_f64())
}

#[test]
fn a_failover_without_wait_lets_a_second_holder_in_and_with_wait_does_not() {
    let out = tempfile::tempdir().expect("temp dir");
    let status = Command::new(env!("CARGO_BIN_EXE_polylock-compare"))
        .args([
            "--backends",
            "redis-replica,redis-replica-wait",
            "--scenarios",
            "failover,fence-evicted",
            "--out",
        ])
        .arg(out.path())
        .arg("--logs")
        .arg(out.path().join("logs"))
        .status()
        .expect("running polylock-compare");
    let md = std::fs::read_to_string(out.path().join("guarantees.md")).expect("guarantees.md");
    assert!(status.success(), "{status}; its page says:\n{md}");
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("guarantees.json")).expect("guarantees.json"),
    )
    .expect("valid JSON");
    let cell = |backend: &str, scenario: &str| -> Value {
        json["observations"]
            .as_array()
            .expect("observations")
            .iter()
            .find(|o| o["backend"] == backend && o["scenario"] == scenario)
            .unwrap_or_else(|| panic!("no {backend}/{scenario}"))
            .clone()
    };

    // Without WAIT the promoted replica never saw a's lock: b is granted
    // while a's lease is still running (before a's grant + TTL), whether or
    // not a's lost signal raced it. The fence still stops a's late write,
    // because both tokens come from a server clock.
    let plain = cell("redis-replica", "failover");
    assert_eq!(plain["status"], "observed", "{plain:#}");
    let events = plain["events"].as_array().expect("events");
    let a = first_at(events, "a", "grant").expect("a granted");
    let b = first_at(events, "b", "grant").expect("b granted on the promoted replica");
    let ttl_ms = plain["observation"]["granted_ttl_ms"]
        .as_f64()
        .expect("ttl");
    assert!(b < a + ttl_ms, "b at {b} ms, a's lease {a} + {ttl_ms} ms");
    assert_eq!(plain["observation"]["stale_accepted"], 0, "{plain:#}");

    // With WAIT a is granted only once the replica has the lock, so the
    // promoted replica keeps b out for as long as a's lease runs.
    let waited = cell("redis-replica-wait", "failover");
    assert_eq!(waited["status"], "observed", "{waited:#}");
    let o = &waited["observation"];
    assert_eq!(
        (&o["overlaps"], &o["overlaps_after_lost"]),
        (&0.into(), &0.into()),
        "{waited:#}"
    );
    let events = waited["events"].as_array().expect("events");
    let a = first_at(events, "a", "grant").expect("a granted after the link healed");
    let healed = events
        .iter()
        .find(|e| {
            e["client"] == "harness"
                && e["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("heal the replication link"))
        })
        .and_then(|e| e["at_ms"].as_f64())
        .expect("a's acquire waited for the cut replica");
    assert!(a > healed, "granted at {a} ms, link healed at {healed} ms");
    if let Some(b) = first_at(events, "b", "grant") {
        assert!(b >= a + ttl_ms, "b at {b} ms inside a's lease from {a} ms");
    }

    // The deleted counter is reseeded above every token issued.
    for backend in ["redis-replica", "redis-replica-wait"] {
        let evicted = cell(backend, "fence-evicted");
        let o = &evicted["observation"];
        assert_eq!(o["grants"], 2, "{evicted:#}");
        assert_eq!(o["token_order_violations"], 0, "{evicted:#}");
        assert_eq!(o["stale_accepted"], 0, "{evicted:#}");
    }
    assert_eq!(json["errors"], Value::Array(vec![]), "{:#}", json["errors"]);
}

#[test]
fn an_unknown_scenario_is_a_usage_error_before_any_server_starts() {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_polylock-compare"))
        .args(["--scenarios", "failover,nosuch", "--out"])
        .arg(out.path())
        .output()
        .expect("running polylock-compare");
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("unknown scenario \"nosuch\""), "{stderr}");
    assert!(!stderr.contains("starting"), "{stderr}");
}
