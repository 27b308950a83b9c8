//! `polylock-bench --quick` on three backends into a temp dir: the files
//! appear and the numbers are sane.

use std::process::Command;

use serde_json::Value;

/// One bench run at a time: two at once on a small machine would share its
/// cores, and each run's figures are judged as if alone.
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_run() -> std::sync::MutexGuard<'static, ()> {
    ONE_RUN.lock().unwrap_or_else(|p| p.into_inner())
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number: {cur}"))
}

#[test]
fn quick_run_writes_the_report_with_sane_numbers() {
    let _alone = one_run();
    let out = tempfile::tempdir().unwrap();
    let backends = ["sqlite", "redis", "etcd"];
    let run = Command::new(env!("CARGO_BIN_EXE_polylock-bench"))
        .args(["--quick", "--backends", &backends.join(","), "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "bench failed: {}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    for b in backends {
        assert!(stdout.contains(b), "the table lists {b}:\n{stdout}");
    }

    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("performance.json")).unwrap(),
    )
    .unwrap();
    let md = std::fs::read_to_string(out.path().join("performance.md")).unwrap();
    let report = &json["report"];
    let measured = report["backends"].as_array().unwrap();
    assert_eq!(measured.len(), backends.len());
    for (b, want) in measured.iter().zip(backends) {
        assert_eq!(b["backend"], want);
        assert!(!b["server"].as_str().unwrap().is_empty());
        for side in ["polylock", "raw"] {
            assert!(
                num(b, &["cycle", side, "count"]) > 0.0,
                "{want} {side} cycles"
            );
            assert!(num(b, &["cycle", side, "p50_us"]) > 0.0);
            assert!(num(b, &["cycle", side, "p99_us"]) >= num(b, &["cycle", side, "p50_us"]));
        }
        assert!(num(b, &["cycle", "ratio"]) > 0.0, "{want} cycle ratio");
        // The gap's parts: the backend called directly, the lock layer over
        // the in-memory backend (no I/O: far below any round trip), and the
        // server's CPU where the server reports it (Redis only).
        assert!(
            num(b, &["cycle", "backend_per_s"]) > 0.0,
            "{want} direct cycles"
        );
        let layer = num(b, &["cycle", "layer_us"]);
        assert!(
            layer > 0.0 && layer < num(b, &["cycle", "round_trip", "p50_us"]),
            "{want}: lock layer {layer} µs a cycle"
        );
        for side in ["polylock", "raw", "backend"] {
            let rounds = b["cycle"]["round_means_us"][side].as_array().unwrap();
            assert_eq!(rounds.len(), 9, "{want} {side}: one mean per round");
            assert!(rounds.iter().all(|m| m.as_f64().unwrap() > 0.0));
        }
        // The server's CPU per cycle, where the server reports it (Redis
        // only), in both measurements. Scripts that do nothing cost the
        // server something, and less than polylock's, which do the lock's
        // work as well.
        for part in ["cycle", "parallel"] {
            let server = &b[part]["server"];
            if want != "redis" {
                assert!(
                    server.is_null(),
                    "{want} {part}: no server CPU counter: {server}"
                );
                continue;
            }
            let ours = num(server, &["polylock_us_per_cycle"]);
            assert!(
                ours > num(server, &["raw_us_per_cycle"]),
                "{want} {part}: scripts cost more server CPU than SET + DEL: {server}"
            );
            let empty = num(server, &["empty_scripts_us_per_cycle"]);
            assert!(
                empty > 0.0 && empty < ours,
                "{want} {part}: empty scripts' server CPU: {server}"
            );
        }
        // Raw with the checks a lock cannot do without, where the service
        // makes them costlier requests (etcd only), in both measurements.
        for part in ["cycle", "parallel"] {
            let checked = &b[part]["checked_raw_per_s"];
            if want == "etcd" {
                assert!(
                    checked.as_f64().is_some_and(|c| c > 0.0),
                    "{want} {part}: checked raw cycles/s: {checked}"
                );
            } else {
                assert!(checked.is_null(), "{want} {part}: {checked}");
            }
        }
        assert!(num(b, &["parallel", "ratio"]) > 0.0, "{want} 64-task ratio");
        assert!(
            num(b, &["parallel", "backend_per_s"]) > 0.0,
            "{want}: 64 tasks on the backend trait"
        );
        // The client's CPU per cycle: every side does work in this process.
        for side in ["polylock", "backend", "raw"] {
            let us = num(
                b,
                &["parallel", "client_cpu", &format!("{side}_us_per_cycle")],
            );
            assert!(
                us > 0.0 && us < 1e6,
                "{want}: client CPU {us} µs per {side} cycle"
            );
        }
        // Each side's per-round times, which the verdict's ± comes from.
        for side in ["polylock", "backend", "raw"] {
            let means = b["parallel"]["round_means_us"][side]
                .as_array()
                .unwrap_or_else(|| panic!("{want}: no {side} round means"));
            assert_eq!(means.len(), 6, "{want}: {side} round means");
            assert!(
                means.iter().all(|m| m.as_f64().is_some_and(|us| us > 0.0)),
                "{want}: {side} round means {means:?}"
            );
        }
        // Two clients, one queued: every round is a hand-off.
        let rounds = num(b, &["handoff", "rounds"]);
        assert!(rounds >= 20.0, "{want}: hand-off rounds");
        assert_eq!(num(b, &["handoff", "handoff", "count"]), rounds, "{want}");
        assert!(num(b, &["handoff", "handoff", "p50_us"]) > 0.0, "{want}");
        // The raw hand-off floor, in blocks between polylock's rounds,
        // wherever waiters are woken by the service (SQLite polls).
        let raw = &b["handoff"]["raw"];
        if want == "sqlite" {
            assert!(raw.is_null(), "{want}: no raw hand-off: {raw}");
        } else {
            assert_eq!(num(raw, &["count"]), rounds, "{want}: raw hand-offs");
            assert!(num(raw, &["p50_us"]) > 0.0, "{want}: {raw}");
        }
        // The machine's load over this backend: the bench itself kept a
        // core busy part of the time, and no share exceeds the whole.
        let busy = num(b, &["load", "busy"]);
        let stolen = num(b, &["load", "stolen"]);
        assert!(
            busy > 0.0 && busy + stolen <= 1.0,
            "{want}: load {}",
            b["load"]
        );
        assert!(stolen >= 0.0, "{want}");
        assert!(
            md.contains(&format!("  - {want}: busy {:.0}%, stolen", busy * 100.0)),
            "{want}: performance.md states the load"
        );
        let contention = b["contention"].as_array().unwrap();
        assert_eq!(contention.len(), 2, "hold 0 and 1 ms");
        for c in contention {
            assert!(num(c, &["acquisitions_per_s"]) > 0.0, "{want}: {c}");
            assert!(num(c, &["wait", "count"]) > 0.0);
            if want == "etcd" {
                // A FIFO queue: every release hands the lock to a waiter.
                assert!(
                    num(c, &["handoff", "count"]) > 0.0,
                    "{want}: hand-offs seen"
                );
            }
            let hold_us = num(c, &["hold_ms"]) * 1000.0;
            assert!(
                num(c, &["hold_actual_us"]) >= hold_us,
                "{want}: held at least the hold"
            );
            let share = num(c, &["releaser_reacquired"]);
            assert!((0.0..=1.0).contains(&share));
        }
        let held = b["held"].as_array().unwrap();
        assert_eq!(held.len(), 2);
        for h in held {
            assert_eq!(h["all_held"], true, "{want}: {h}");
            assert!(num(h, &["client_bytes_per_lock"]) > 0.0, "{want}: {h}");
            if want == "sqlite" {
                assert!(h["server_requests_per_s"].is_null(), "no server to count");
            } else {
                assert!(num(h, &["server_requests_per_s"]) > 0.0, "{want}: {h}");
            }
            // Only Redis times its scripts (a script blocks the server).
            if want == "redis" {
                assert!(num(h, &["server_us_per_request"]) > 0.0, "{want}: {h}");
            } else {
                assert!(h["server_us_per_request"].is_null(), "{want}: {h}");
            }
        }
    }
    // The many-lock run renews more than the few-lock one: the counters
    // really see the renewals.
    let redis = &measured[1]["held"];
    assert!(
        num(&redis[1], &["server_requests_per_s"]) > num(&redis[0], &["server_requests_per_s"])
    );

    let targets = json["targets"].as_array().unwrap();
    assert!(targets.iter().any(|t| t["target"]
        .as_str()
        .unwrap()
        .contains("etcd, 8 workers: hold 0 ms")));

    for chart in ["latency.svg", "wait.svg"] {
        let svg = std::fs::read_to_string(out.path().join("perf").join(chart)).unwrap();
        assert!(svg.starts_with("<svg"), "{chart}");
        assert!(
            svg.matches("<polyline").count() >= backends.len() * 2,
            "{chart}"
        );
        assert!(svg.trim_end().ends_with("</svg>"));
    }
    for needle in [
        "Machine:",
        "Date:",
        "Command: `polylock bench --quick --backends sqlite,redis,etcd`",
        "Redis ",
        "etcd 3.",
        "SQLite ",
        "## Targets",
        "## Hand-off between two clients",
        "perf/latency.svg",
        "perf/wait.svg",
    ] {
        assert!(md.contains(needle), "performance.md lacks {needle:?}");
    }
}

/// Runs the bench binary with `args`, output into a temp dir.
fn bench(args: &[&str]) -> (std::process::Output, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_polylock-bench"))
        .args(args)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    (run, out)
}

#[test]
fn a_server_given_by_url_is_measured_and_its_password_stays_out_of_the_report() {
    let _alone = one_run();
    // A server that wants a password, as a shared deployment would.
    let server = testkit::RedisServer::start().expect("redis-server");
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret-pw")
        .exec(&mut admin)
        .unwrap();
    let url = format!("redis://:s3cret-pw@127.0.0.1:{}/0", server.port());
    let (run, out) = bench(&["--quick", "--url", &url]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "bench failed: {stderr}\n{stdout}");
    let md = std::fs::read_to_string(out.path().join("performance.md")).unwrap();
    let json = std::fs::read_to_string(out.path().join("performance.json")).unwrap();
    for (what, text) in [
        ("stdout", &*stdout),
        ("stderr", &*stderr),
        ("performance.md", &md),
        ("performance.json", &json),
    ] {
        assert!(!text.contains("s3cret-pw"), "{what} holds the password");
    }
    let json: Value = serde_json::from_str(&json).unwrap();
    let measured = json["report"]["backends"].as_array().unwrap();
    assert_eq!(measured.len(), 1);
    let b = &measured[0];
    assert_eq!(
        b["backend"], "redis",
        "named after the backend of its shape"
    );
    let connected = b["connected"].as_str().expect("the given URL is reported");
    assert!(
        connected.contains(&format!("127.0.0.1:{}", server.port())),
        "{connected}"
    );
    assert!(b["server"].as_str().unwrap().starts_with("Redis "));
    // The raw driver reached the same server with the same password: its
    // cycles ran, and the server's own counters (INFO over the
    // authenticated connection) saw the renewals of the held locks.
    assert!(num(b, &["cycle", "raw", "count"]) > 0.0);
    assert!(num(b, &["cycle", "ratio"]) > 0.0);
    assert!(num(b, &["handoff", "raw", "count"]) > 0.0);
    let held = b["held"].as_array().unwrap();
    assert!(
        num(&held[1], &["server_requests_per_s"]) > 0.0,
        "{}",
        held[1]
    );
    assert!(md.contains("- Servers (given by `--url`, not started by the bench):"));
    assert!(md.contains("  - redis: Redis "));
    assert!(
        md.contains("- Command: `polylock bench --quick --url redis://"),
        "the command that reproduces it, password redacted"
    );
}

#[test]
fn a_bad_url_is_refused_before_anything_starts() {
    for (args, says) in [
        (
            &["--url", "sqlite:///tmp/locks.db"][..],
            "--backends sqlite",
        ),
        (&["--url", "memcached://:pw@h:11211"][..], "unknown scheme"),
        (&["--url", "redis://h:6379/0?fair=maybe"][..], "fair"),
        (
            &["--url", "redis://h:6379/0", "--backends", "redis"][..],
            "cannot be used with",
        ),
    ] {
        let (run, _out) = bench(args);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains(":pw@"), "{args:?}: {stderr}");
    }
}
