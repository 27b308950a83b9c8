//! Everything `polylock bench` writes, built from a [`Report`] alone: the
//! terminal table, docs/performance.json, the SVG charts and
//! docs/performance.md with the issue's targets judged against the numbers.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::{BackendReport, Contention, Held, MachineLoad, Report, Summary};

/// One target of issue #17, judged on a run.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// The target as the issue states it.
    pub target: String,
    /// The measured value(s).
    pub measured: String,
    /// Met, not met, or not measured in this run (`None`).
    pub met: Option<bool>,
    /// Why, when not met.
    pub note: String,
}

fn ms(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn find<'a>(r: &'a Report, name: &str) -> Option<&'a BackendReport> {
    r.backends.iter().find(|b| b.backend == name)
}

/// Raw's rate with the checks a lock cannot do without, where the service
/// makes them costlier requests (etcd), next to raw's and polylock's: the
/// part of the gap that is the checks', which no client can save.
fn checked_raw(checked: Option<f64>, raw_per_s: f64, polylock_per_s: f64) -> String {
    checked.map_or_else(String::new, |c| {
        format!(
            "; raw with the checks a lock cannot do without (its create also counts the \
             name's queue, whether it is first; its release is a transaction that deletes the key \
             only at the create revision the acquire made, where raw sends a bare delete, and \
             etcd runs any transaction that writes on a slower path than a plain delete) ran \
             {c:.0} cycles/s in the same run, {:.2} of raw: polylock is {:.2} of that",
            c / raw_per_s.max(f64::MIN_POSITIVE),
            polylock_per_s / c.max(f64::MIN_POSITIVE)
        )
    })
}

/// Why the many-tasks rate misses raw's, from the same run: the gap in
/// time per cycle (all tasks together) split into the backend's own
/// requests and the lock layer around them, this process's CPU per cycle
/// on each side, and the server's where it is measured.
fn parallel_gap(p: &super::Parallel) -> String {
    let us = |rate: f64| 1e6 / rate.max(f64::MIN_POSITIVE);
    let gap = us(p.polylock_per_s) - us(p.raw_per_s);
    let backend = us(p.backend_per_s) - us(p.raw_per_s);
    let layer = us(p.polylock_per_s) - us(p.backend_per_s);
    let c = &p.client_cpu;
    let m = &p.round_means_us;
    let se = super::measure::RoundMeans::std_error_of_difference;
    let mut why = format!(
        "{:.1} ± {:.1} µs more per cycle than raw ({:.0} vs {:.0} cycles/s): the backend's own \
         requests (the trait called directly, {:.0} cycles/s) {backend:+.1} ± {:.1} µs, the lock \
         layer {layer:+.1} ± {:.1} µs (± is one standard error over the {} interleaved rounds: a \
         part within about two of them is the machine's noise, not a cost); this process's CPU \
         per cycle: polylock {:.1} µs, backend alone {:.1} µs, raw {:.1} µs (client and server \
         share the machine's cores, so client CPU is taken from the server too)",
        gap,
        se(&m.polylock, &m.raw),
        p.polylock_per_s,
        p.raw_per_s,
        p.backend_per_s,
        se(&m.backend, &m.raw),
        se(&m.polylock, &m.backend),
        m.polylock.len(),
        c.polylock_us_per_cycle,
        c.backend_us_per_cycle,
        c.raw_us_per_cycle,
    );
    if let Some(sc) = &p.server {
        why.push_str(&format!(
            "; server CPU per cycle: {:.1} µs for polylock's two scripts (owner, fence and TTL \
             checks, holder metadata, release notice), of which {:.1} µs is what two scripts that \
             do nothing cost when sent the same way (running a script at all, which no slimmer \
             script saves), vs {:.1} µs for raw SET NX PX + DEL; the server's command thread busy \
             {:.0}% of the polylock rounds{}",
            sc.polylock_us_per_cycle,
            sc.empty_scripts_us_per_cycle,
            sc.raw_us_per_cycle,
            sc.polylock_busy * 100.0,
            if sc.polylock_busy >= 0.8 {
                // The server's CPU per cycle bounds the rate it allows.
                format!(
                    ": it, not the client, sets the rate, and at the empty scripts' CPU it would \
                     allow at most {:.2} of raw's rate",
                    sc.raw_us_per_cycle / sc.empty_scripts_us_per_cycle.max(f64::MIN_POSITIVE)
                )
            } else {
                String::new()
            }
        ));
    }
    why.push_str(&checked_raw(
        p.checked_raw_per_s,
        p.raw_per_s,
        p.polylock_per_s,
    ));
    why
}

/// The fair mode's rate taken apart with the same run's figures. One
/// worker holds at a time, so each acquisition costs the hold plus the time
/// from that hold's end to the next one's start (release, grant, wake-up);
/// the target's rate leaves a budget for the latter, compared here with the
/// hand-off measured in the same rounds and with the service's own floor
/// (the raw hand-off between two clients).
fn fair_gap(c: &Contention, raw_handoff: Option<&Summary>) -> String {
    let per_acq = 1e6 / c.acquisitions_per_s.max(f64::MIN_POSITIVE);
    let between = per_acq - c.hold_actual_us;
    let budget = 1e6 / 850.0 - c.hold_actual_us;
    let mut why = format!(
        "each acquisition took {per_acq:.0} µs: the hold ({:.0} µs) and {between:.0} µs from one \
         hold's end to the next's start (the releaser re-acquired {:.0}%, so nearly every \
         acquisition is a hand-off to the queue's head: the release script, which grants the \
         lock to the head and publishes on its own channel, then the head's wake-up; hand-off \
         p50 {}, p99 {}); 850 acq/s leaves {budget:.0} µs for that",
        c.hold_actual_us,
        c.releaser_reacquired * 100.0,
        ms(c.handoff.p50_us),
        ms(c.handoff.p99_us),
    );
    if let Some(raw) = raw_handoff {
        why.push_str(&format!(
            ", and the same hand-off through the raw driver (DEL + PUBLISH, then the \
             subscriber's SET NX PX, between two idle clients) took {} p50 in this run",
            ms(raw.p50_us)
        ));
    }
    why
}

/// The uncontended gap taken apart with the same run's figures: the
/// backend's own requests (trait called directly) against raw, the server's
/// share of that where it is measured, and the lock layer around them.
fn cycle_gap(c: &super::Cycle) -> String {
    let mean = |per_s: f64| 1e6 / per_s.max(f64::MIN_POSITIVE);
    let (ours, raw, direct) = (
        mean(c.polylock_per_s),
        mean(c.raw_per_s),
        mean(c.backend_per_s),
    );
    let server = c.server.as_ref().map_or_else(String::new, |s| {
        format!(
            ", of which the server's CPU {:.1} µs (polylock's scripts: {:.1} µs a cycle, two scripts \
             that do nothing, sent the same way: {:.1} µs, raw SET NX PX + DEL: {:.1} µs)",
            s.polylock_us_per_cycle - s.raw_us_per_cycle,
            s.polylock_us_per_cycle,
            s.empty_scripts_us_per_cycle,
            s.raw_us_per_cycle
        )
    });
    let m = &c.round_means_us;
    let se = super::measure::RoundMeans::std_error_of_difference;
    let checked = checked_raw(c.checked_raw_per_s, c.raw_per_s, c.polylock_per_s);
    format!(
        "a cycle took {:.0} ± {:.0} µs more than raw ({:.0} vs {:.0} µs): the backend's own requests, \
         called without the lock layer, {:+.0} ± {:.0} µs{server}; the lock layer (Locker, guard, \
         watchdog) {:+.0} ± {:.0} µs (alone, over the in-memory backend: {:.1} µs a cycle; ± is one \
         standard error over the {} interleaved rounds: a part within about two of them is the \
         machine's noise, not a cost){checked}",
        ours - raw,
        se(&m.polylock, &m.raw),
        ours,
        raw,
        direct - raw,
        se(&m.backend, &m.raw),
        ours - direct,
        se(&m.polylock, &m.backend),
        c.layer_us,
        m.polylock.len()
    )
}

/// The issue's targets against `r`.
pub fn verdicts(r: &Report) -> Vec<Verdict> {
    let mut v = Vec::new();
    let verdict = |target: &str, measured: String, met: Option<bool>, note: &str| Verdict {
        target: target.into(),
        measured,
        met,
        note: note.into(),
    };
    for b in &r.backends {
        let ok = b.cycle.ratio >= 0.95;
        v.push(verdict(
            &format!("{}: uncontended cycle >= 0.95 of raw", b.backend),
            format!("{:.2}", b.cycle.ratio),
            Some(ok),
            &if ok {
                String::new()
            } else {
                cycle_gap(&b.cycle)
            },
        ));
    }
    for b in &r.backends {
        let ok = b.parallel.ratio >= 0.9;
        let why = if ok {
            String::new()
        } else {
            parallel_gap(&b.parallel)
        };
        v.push(verdict(
            &format!(
                "{}: {} tasks >= 0.9 of raw pipelined",
                b.backend, b.parallel.tasks
            ),
            format!("{:.2}", b.parallel.ratio),
            Some(ok),
            &why,
        ));
    }
    if let Some(c) =
        find(r, "redis-fair").and_then(|b| b.contention.iter().find(|c| c.hold_ms == 1))
    {
        let ok =
            c.acquisitions_per_s >= 850.0 && c.wait.p99_us < 20_000.0 && c.wait.max_us < 50_000.0;
        v.push(verdict(
            "redis fair mode (?fair=true), 8 workers, hold 1 ms: >= 850 acq/s, wait p99 < 20 ms, max < 50 ms",
            format!(
                "{:.0} acq/s, p99 {}, max {}",
                c.acquisitions_per_s,
                ms(c.wait.p99_us),
                ms(c.wait.max_us)
            ),
            Some(ok),
            &if ok {
                String::new()
            } else {
                let b = find(r, "redis-fair");
                fair_gap(c, b.and_then(|b| b.handoff.raw.as_ref())) + &load_note(b.and_then(|b| b.load))
            },
        ));
    }
    let redis = find(r, "redis");
    if let Some(c) = redis.and_then(|b| b.contention.iter().find(|c| c.hold_ms == 1)) {
        let ok = c.acquisitions_per_s >= 715.0 && c.wait.p99_us < 50_000.0;
        v.push(verdict(
            "redis default mode, 8 workers, hold 1 ms: >= 715 acq/s (the issue's figure) and wait p99 < 50 ms",
            format!("{:.0} acq/s, p99 {}", c.acquisitions_per_s, ms(c.wait.p99_us)),
            Some(ok),
            &if ok {
                String::new()
            } else {
                format!(
                    "waiters race on each pub/sub wake-up and the releaser often wins (it \
                     re-acquired {:.0}%); a FIFO hand-off is the fair mode's job{}",
                    c.releaser_reacquired * 100.0,
                    load_note(redis.and_then(|b| b.load))
                )
            },
        ));
    }
    if let Some(b) = find(r, "etcd") {
        let rate = |h| {
            b.contention
                .iter()
                .find(|c| c.hold_ms == h)
                .map_or(0.0, |c| c.acquisitions_per_s)
        };
        let ok = rate(0) >= rate(1);
        let hold = |h| b.contention.iter().find(|c| c.hold_ms == h);
        v.push(verdict(
            "etcd, 8 workers: hold 0 ms at least as fast as hold 1 ms",
            format!("{:.0} vs {:.0} acq/s", rate(0), rate(1)),
            Some(ok),
            &match (ok, hold(0), hold(1)) {
                (false, Some(h0), Some(h1)) => etcd_hold_gap(h0, h1) + &load_note(b.load),
                _ => String::new(),
            },
        ));
    }
    for name in ["redis", "etcd", "postgres", "zk"] {
        let Some(b) = find(r, name) else { continue };
        let rtt = b.cycle.round_trip.p50_us;
        let trips = b.handoff.handoff.p50_us / rtt;
        // The same hand-off among eight contending workers, for comparison:
        // on a small machine it adds their scheduling to the path.
        let crowded = b
            .contention
            .iter()
            .find(|c| c.hold_ms == 1)
            .map_or(String::new(), |c| {
                format!(
                    "; among {} workers: {} = {:.1}",
                    c.workers,
                    ms(c.handoff.p50_us),
                    c.handoff.p50_us / rtt
                )
            });
        v.push(verdict(
            &format!("{name}: hand-off median < 3 back-to-back round trips"),
            format!(
                "two clients: {} = {trips:.1} round trips of {}{crowded}",
                ms(b.handoff.handoff.p50_us),
                ms(rtt)
            ),
            Some(trips < 3.0),
            &if trips < 3.0 {
                String::new()
            } else {
                let floor = b.handoff.raw.as_ref().map_or(String::new(), |raw| {
                    let raw_trips = raw.p50_us / rtt;
                    format!(
                        "; the same hand-off through the raw driver, no lock layer, took {} = \
                         {raw_trips:.1} back-to-back round trips{}, and polylock's is {:.2} of it",
                        ms(raw.p50_us),
                        if raw_trips >= 3.0 {
                            " (the service's own floor misses the target on this machine)"
                        } else {
                            ""
                        },
                        b.handoff.handoff.p50_us / raw.p50_us
                    )
                });
                format!(
                    "a hand-off is release + wake-up + acquire, and every hop starts in a process \
                     that was idle: a raw round trip sent after the same idle time took {} here, \
                     so the hand-off is {:.1} of those{floor}",
                    ms(b.handoff.idle_round_trip.p50_us),
                    b.handoff.handoff.p50_us / b.handoff.idle_round_trip.p50_us
                )
            },
        ));
    }
    for b in &r.backends {
        let (Some(small), Some(large)) = (b.held.first(), b.held.last()) else {
            continue;
        };
        match (small.server_requests_per_s, large.server_requests_per_s) {
            (Some(a), Some(z)) if a > 0.0 && large.locks > small.locks => {
                let exp = (z / a).ln() / (large.locks as f64 / small.locks as f64).ln();
                let ok = exp < 0.9;
                v.push(verdict(
                    &format!("{}: renewal requests grow sub-linearly with held locks", b.backend),
                    format!(
                        "{:.1}/s at {} locks, {:.1}/s at {} (growth exponent {exp:.2})",
                        a, small.locks, z, large.locks
                    ),
                    Some(ok),
                    &if ok {
                        String::new()
                    } else if b.batch_renew {
                        // What a script run costs the server is measured;
                        // how many leases each run carried is not (the
                        // server counts runs, not leases), so only its
                        // ceiling is stated.
                        let blocked = large.server_us_per_request.map_or(String::new(), |us| {
                            format!(
                                "; each script run here held the server {us:.0} µs on average \
                                 (INFO commandstats) for at most {} leases, so one run per {} \
                                 would hold it up to about {:.0} µs",
                                backend_redis::RENEW_CHUNK,
                                2 * backend_redis::RENEW_CHUNK,
                                2.0 * us
                            )
                        });
                        format!(
                            "renewals are batched: the watchdog hands at most {} due leases to one \
                             call, and Redis runs one script per {} of them, as a script blocks the \
                             server while it runs{blocked}; at {} locks, {z:.1} script runs/s \
                             (counted on every node the client renews on). Past a full batch per \
                             wake-up the requests grow with the locks by design",
                            lock_core::MAX_RENEW_BATCH,
                            backend_redis::RENEW_CHUNK,
                            large.locks,
                        )
                    } else {
                        "this backend renews every held lock by its own request (it does not declare \
                         batch_renew)"
                            .to_string()
                    },
                ));
            }
            _ => v.push(verdict(
                &format!(
                    "{}: renewal requests grow sub-linearly with held locks",
                    b.backend
                ),
                "no server counters".into(),
                None,
                &no_counters(large),
            )),
        }
        if let Some(bytes) = large.client_bytes_per_lock {
            let ok = bytes < 2048.0;
            v.push(verdict(
                &format!("{}: client memory < 2 KiB per held lock", b.backend),
                format!("{bytes:.0} bytes at {} locks", large.locks),
                Some(ok),
                if ok { "" } else { "not profiled in this run" },
            ));
        }
    }
    v
}

/// Why held locks have no server request rate: no server (SQLite), or a
/// server given by `--url` that kept its counter to itself.
fn no_counters(h: &Held) -> String {
    match &h.counters_unread {
        None => "embedded database: there is no server to count requests".into(),
        Some(why) => format!("the given server's request counter could not be read: {why}"),
    }
}

/// The terminal table.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<9} {:>9} {:>9} {:>9} {:>6} {:>8} {:>6} | {:>8} {:>9} {:>9} {:>9} {:>6} | {:>8} {:>9} {:>9} {:>6} | {:>10} {:>9}",
        "backend", "cycle p50", "p99", "cycles/s", "ratio", "64 tasks", "ratio",
        "h0 acq/s", "h1 acq/s", "handoff50", "wait p99", "reacq",
        "h1 max", "h0 p99", "h0 max", "rt p50",
        "renew/s", "B/lock"
    );
    for b in &r.backends {
        let h0 = b.contention.iter().find(|c| c.hold_ms == 0);
        let h1 = b.contention.iter().find(|c| c.hold_ms == 1);
        let large = b.held.last();
        let _ = writeln!(
            s,
            "{:<9} {:>9} {:>9} {:>9.0} {:>6.2} {:>8.0} {:>6.2} | {:>8.0} {:>9.0} {:>9} {:>9} {:>5.0}% | {:>8} {:>9} {:>9} {:>6} | {:>10} {:>9}",
            b.backend,
            ms(b.cycle.polylock.p50_us),
            ms(b.cycle.polylock.p99_us),
            b.cycle.polylock_per_s,
            b.cycle.ratio,
            b.parallel.polylock_per_s,
            b.parallel.ratio,
            h0.map_or(0.0, |c| c.acquisitions_per_s),
            h1.map_or(0.0, |c| c.acquisitions_per_s),
            h1.map_or("-".into(), |c| ms(c.handoff.p50_us)),
            h1.map_or("-".into(), |c| ms(c.wait.p99_us)),
            h1.map_or(0.0, |c| c.releaser_reacquired * 100.0),
            h1.map_or("-".into(), |c| ms(c.wait.max_us)),
            h0.map_or("-".into(), |c| ms(c.wait.p99_us)),
            h0.map_or("-".into(), |c| ms(c.wait.max_us)),
            ms(b.cycle.round_trip.p50_us),
            large
                .and_then(|h| h.server_requests_per_s)
                .map_or("n/a".into(), |x| format!("{x:.1}")),
            large
                .and_then(|h| h.client_bytes_per_lock)
                .map_or("n/a".into(), |x| format!("{x:.0}")),
        );
    }
    s
}

const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
];

/// A distribution chart: share of samples at or below a latency (log
/// scale), one line per series; `dashed` series share their colour with the
/// solid one of the same index.
pub fn cdf_svg(title: &str, series: &[(String, &Summary, usize, bool)]) -> String {
    let (w, h, l, rgt, top, bot) = (760.0, 420.0, 60.0, 180.0, 40.0, 50.0);
    let pts: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.cdf.iter().map(|p| p.0))
        .filter(|x| *x > 0.0)
        .collect();
    let lo = pts.iter().copied().fold(f64::INFINITY, f64::min).max(1.0);
    let hi = pts.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    let (lo, hi) = (lo.log10().floor(), hi.log10().ceil());
    let x = |us: f64| l + (us.max(1.0).log10() - lo) / (hi - lo) * (w - l - rgt);
    let y = |q: f64| top + (1.0 - q) * (h - top - bot);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="14" text-anchor="middle">{}</text>"#,
        (w - rgt + l) / 2.0,
        escape(title)
    );
    for e in lo as i32..=hi as i32 {
        let us = 10f64.powi(e);
        let px = x(us);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{}" stroke="#ddd"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
            h - bot,
            h - bot + 16.0,
            ms(us)
        );
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0] {
        let py = y(q);
        let _ = writeln!(
            s,
            r##"<line x1="{l}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            w - rgt,
            l - 6.0,
            py + 4.0,
            if q == 0.99 {
                "p99".to_string()
            } else {
                format!("{:.0}%", q * 100.0)
            }
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">latency (log scale)</text>"#,
        (w - rgt + l) / 2.0,
        h - 10.0
    );
    for (i, (label, sum, color, dashed)) in series.iter().enumerate() {
        let c = COLORS[color % COLORS.len()];
        let dash = if *dashed {
            r#" stroke-dasharray="5,4""#
        } else {
            ""
        };
        let mut path = String::new();
        let mut prev_q = 0.0;
        for (us, q) in &sum.cdf {
            // A step line: the share jumps at each sample.
            let _ = write!(
                path,
                "{:.1},{:.1} {:.1},{:.1} ",
                x(*us),
                y(prev_q),
                x(*us),
                y(*q)
            );
            prev_q = *q;
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="1.6"{dash} points="{path}"/>"#
        );
        let ly = top + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly:.1}" x2="{}" y2="{ly:.1}" stroke="{c}" stroke-width="2"{dash}/><text x="{}" y="{:.1}">{}</text>"#,
            w - rgt + 10.0,
            w - rgt + 34.0,
            w - rgt + 40.0,
            ly + 4.0,
            escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The two charts: (file name, SVG).
pub fn charts(r: &Report) -> Vec<(&'static str, String)> {
    let mut lat = Vec::new();
    let mut wait = Vec::new();
    for (i, b) in r.backends.iter().enumerate() {
        lat.push((b.backend.clone(), &b.cycle.polylock, i, false));
        lat.push((format!("{} raw", b.backend), &b.cycle.raw, i, true));
        for c in &b.contention {
            wait.push((
                format!("{} hold {} ms", b.backend, c.hold_ms),
                &c.wait,
                i,
                c.hold_ms == 0,
            ));
        }
    }
    vec![
        (
            "latency.svg",
            cdf_svg(
                "Uncontended acquire + release: polylock (solid) vs raw driver (dashed)",
                &lat,
            ),
        ),
        (
            "wait.svg",
            cdf_svg(
                "Acquire wait, 8 workers on one name: hold 1 ms (solid), hold 0 ms (dashed)",
                &wait,
            ),
        ),
    ]
}

/// docs/performance.md.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Performance\n");
    let _ = writeln!(
        s,
        "<!-- Generated by `polylock bench` from docs/performance.json; do not edit by hand. -->\n"
    );
    let _ = writeln!(
        s,
        "Every figure below comes from one run on one machine; the ratios compare polylock with \
         the raw driver doing the same round trips in the same run, because absolute times on a \
         shared machine mean little.\n"
    );
    let _ = writeln!(s, "- Date: {}", r.date);
    let _ = writeln!(s, "- Machine: {}", r.machine);
    let _ = writeln!(s, "- Command: `{}`", r.command);
    let _ = writeln!(s, "- Each timed measurement: {:.1} s", r.duration_s);
    let given = r.backends.iter().any(|b| b.connected.is_some());
    if given {
        let _ = writeln!(s, "- Servers (given by `--url`, not started by the bench):");
    } else {
        let _ = writeln!(s, "- Servers (started by the test kit on loopback):");
    }
    for b in &r.backends {
        let _ = match &b.connected {
            Some(url) => writeln!(s, "  - {}: {} at `{url}`", b.backend, b.server),
            None => writeln!(s, "  - {}: {}", b.backend, b.server),
        };
    }
    let _ = writeln!(
        s,
        "- The machine's CPU during each backend's timed measurements (all cores; busy is this \
         bench, {}anything else; stolen is time the host gave to other guests):",
        if given { "" } else { "its server and " }
    );
    for b in &r.backends {
        let _ = match b.load {
            Some(l) => writeln!(
                s,
                "  - {}: busy {:.0}%, stolen {:.1}%",
                b.backend,
                l.busy * 100.0,
                l.stolen * 100.0
            ),
            None => writeln!(s, "  - {}: not known (no /proc/stat)", b.backend),
        };
    }
    let _ = writeln!(s, "\n## Uncontended cycle and many tasks\n");
    let _ = writeln!(
        s,
        "| backend | p50 | p99 | cycles/s | raw cycles/s | ratio | backend alone cycles/s | lock layer alone | round trip p50 | {} tasks/s | raw pipelined | ratio | backend alone | client CPU per cycle (polylock / raw) |",
        r.backends.first().map_or(64, |b| b.parallel.tasks)
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for b in &r.backends {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.1} µs | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.1} / {:.1} µs |",
            b.backend,
            ms(b.cycle.polylock.p50_us),
            ms(b.cycle.polylock.p99_us),
            b.cycle.polylock_per_s,
            b.cycle.raw_per_s,
            b.cycle.ratio,
            b.cycle.backend_per_s,
            b.cycle.layer_us,
            ms(b.cycle.round_trip.p50_us),
            b.parallel.polylock_per_s,
            b.parallel.raw_per_s,
            b.parallel.ratio,
            b.parallel.backend_per_s,
            b.parallel.client_cpu.polylock_us_per_cycle,
            b.parallel.client_cpu.raw_us_per_cycle
        );
    }
    let _ = writeln!(
        s,
        "\n*Backend alone*: the same acquire and release through the backend trait called \
         directly (no `Locker`, guard or watchdog), interleaved with the other two in the same \
         rounds; *lock layer alone*: a `Locker` cycle over the in-memory backend in the same \
         process. Where the ratio misses its target, the targets table below takes the gap \
         apart with these figures.\n"
    );
    let _ = writeln!(s, "![cycle latency](perf/latency.svg)\n");
    let _ = writeln!(s, "## Hand-off between two clients\n");
    let _ = writeln!(
        s,
        "One client holds, a second waits queued for {} ms, the holder releases: from the start \
         of the release to the waiter's acquire returning, in round trips of the same run: the \
         back-to-back round trip of the uncontended cycle, and a raw round trip sent after the \
         same idle time. *Raw hand-off*: the same hand-off through the raw driver, no lock layer \
         (Redis `DEL` + `PUBLISH`, then the subscriber's `SET NX PX`; etcd and ZooKeeper a delete \
         seen by the next in line's watch; PostgreSQL a release with `pg_notify`, then the \
         listener's acquire), in blocks between polylock's rounds: the floor the service sets. \
         None is measured where waiters poll (SQLite, MariaDB) nor for Redlock.\n",
        super::measure::QUEUED.as_millis()
    );
    let _ = writeln!(
        s,
        "| backend | rounds | p50 | p99 | round trip p50 | p50 in round trips | idle round trip p50 | p50 in idle round trips | raw hand-off p50 | raw in round trips | polylock / raw | transient errors |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for b in &r.backends {
        let h = &b.handoff;
        let rtt = b.cycle.round_trip.p50_us;
        let (raw, raw_trips, over_raw) = h.raw.as_ref().map_or(
            ("n/a".to_string(), "-".to_string(), "-".to_string()),
            |raw| {
                (
                    ms(raw.p50_us),
                    format!("{:.1}", raw.p50_us / rtt),
                    format!("{:.2}", h.handoff.p50_us / raw.p50_us),
                )
            },
        );
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.1} | {} | {:.1} | {raw} | {raw_trips} | {over_raw} | {} |",
            b.backend,
            h.rounds,
            ms(h.handoff.p50_us),
            ms(h.handoff.p99_us),
            ms(b.cycle.round_trip.p50_us),
            h.handoff.p50_us / b.cycle.round_trip.p50_us,
            ms(h.idle_round_trip.p50_us),
            h.handoff.p50_us / h.idle_round_trip.p50_us,
            h.transient_errors
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "## Contention\n");
    let _ = writeln!(
        s,
        "| backend | hold | actual hold | acq/s | hand-off p50 | hand-off p99 | wait p99 | wait max | releaser re-acquired | transient errors |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for b in &r.backends {
        for c in &b.contention {
            let _ = writeln!(
                s,
                "| {} | {} ms | {} | {:.0} | {} | {} | {} | {} | {:.0}% | {} |",
                b.backend,
                c.hold_ms,
                ms(c.hold_actual_us),
                c.acquisitions_per_s,
                ms(c.handoff.p50_us),
                ms(c.handoff.p99_us),
                ms(c.wait.p99_us),
                ms(c.wait.max_us),
                c.releaser_reacquired * 100.0,
                c.transient_errors
            );
        }
    }
    let _ = writeln!(s, "\n![acquire wait under contention](perf/wait.svg)\n");
    let _ = writeln!(s, "## Held locks\n");
    let _ = writeln!(
        s,
        "| backend | locks | TTL | server requests/s | client bytes per lock | all still held |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for b in &r.backends {
        for h in &b.held {
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} s | {} | {} | {} |",
                b.backend,
                h.locks,
                h.ttl_s,
                h.server_requests_per_s
                    .map_or("n/a (no server)".into(), |x| format!("{x:.1}")),
                h.client_bytes_per_lock
                    .map_or("n/a".into(), |x| format!("{x:.0}")),
                h.all_held
            );
        }
    }
    let _ = writeln!(s, "\n## Targets (issue #17)\n");
    let _ = writeln!(s, "| target | measured | verdict | why not met |");
    let _ = writeln!(s, "|---|---|---|---|");
    for v in verdicts(r) {
        let verdict = match v.met {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "not measured",
        };
        let _ = writeln!(
            s,
            "| {} | {} | {verdict} | {} |",
            v.target, v.measured, v.note
        );
    }
    let _ = writeln!(s, "\n## How it measures\n");
    let _ = writeln!(
        s,
        "- Raw baselines use the backend's own driver with the fewest round trips a lock cycle \
         needs and no lock layer: Redis `SET NX PX` + `DEL` (on all three nodes at once for \
         Redlock); etcd a put-if-absent transaction with a lease + a delete; SQL one upsert + one \
         update on a table of the same shape, pool without a ping per statement; ZooKeeper an \
         ephemeral sequential create + the children list + a delete (a node cannot know it is \
         the lowest without the list, and a multi cannot mix reads and writes). The round trip is one minimal request (`PING`, \
         `SELECT 1`, a get, an exists).\n\
         - Cycle: polylock's guard API (`try_acquire` + `release`), the raw cycle and the same \
         requests through the backend trait called directly take turns in nine short rounds (each \
         side first in a third of them) so load changes hit all alike; the rounds' spread gives \
         the standard errors of the targets table.\n\
         - Many tasks: that many tasks, each on its own name, share one client (one `Locker`, one \
         raw connection or pool); polylock, raw and the backend trait called directly take turns \
         in six rounds each (at least 100 ms long; the rounds' spread gives the standard errors \
         of the targets table), and the bench process's CPU time (user + system, `getrusage`) is \
         read around every round: the client's CPU per cycle. To see where a cycle's \
         instructions go, `lab/examples/cycles.rs` runs a fixed number of the same cycles \
         (polylock or the backend trait alone) under `valgrind --tool=callgrind`, whose counts \
         do not move with the machine's load.\n\
         - Server CPU (Redis): the command thread's CPU time (`INFO cpu`) is read around every \
         round of both measurements, and each round also has a turn of two scripts that do \
         nothing (`return 0`), sent as polylock's are, with the same keys and as many \
         arguments: what running a script at all costs the server.\n\
         - Checked raw (etcd): each round of both measurements also has a turn of raw with the \
         checks a lock cannot do without, in the same two round trips: the create also counts \
         the name's queue, and the release is a transaction comparing the key's create \
         revision instead of a bare delete (etcd runs any transaction that writes on a slower \
         path than a plain delete).\n\
         - Contention: each worker has its own client and loops acquire (wait) → hold → release. \
         Hand-off: from the start of a release to another worker's acquire returning. Wait: from \
         asking to holding. The hold is busy (yielding) rather than a timer sleep, \
         which tokio rounds up to the next millisecond.\n\
         - Held locks: one client holds them with automatic renewal; the server's own request \
         counter (Redis script calls from `INFO commandstats` summed over nodes, etcd \
         `grpc_server_msg_received_total`, PostgreSQL write transactions (the transaction id counter), MariaDB \
         `Questions`, ZooKeeper `zk_packets_received`) is read over one TTL. Client bytes per lock \
         come from the bench binary's counting global allocator. Sub-linear: the growth exponent \
         log(rate ratio)/log(lock ratio) below 0.9."
    );
    s
}

/// Writes performance.json, performance.md and perf/*.svg under `dir`.
pub fn write_all(r: &Report, dir: &Path) -> Result<(), String> {
    fn io(what: &Path) -> impl Fn(std::io::Error) -> String + '_ {
        move |e| format!("writing {}: {e}", what.display())
    }
    std::fs::create_dir_all(dir.join("perf")).map_err(io(dir))?;
    let json = serde_json::json!({ "report": r, "targets": verdicts(r) });
    let path = dir.join("performance.json");
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&path, text + "\n").map_err(io(&path))?;
    for (name, svg) in charts(r) {
        let path = dir.join("perf").join(name);
        std::fs::write(&path, svg).map_err(io(&path))?;
    }
    let path = dir.join("performance.md");
    std::fs::write(&path, markdown(r)).map_err(io(&path))?;
    Ok(())
}

/// Now, as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    crate::clock::utc_minute_now()
}

/// CPU model, cores, memory and kernel, from /proc.
pub fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo");
    let model = cpu
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split(':').nth(1))
        })
        .map_or("unknown CPU".to_string(), |m| m.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let kernel = read("/proc/sys/kernel/osrelease");
    format!(
        "{model}, {cores} cores available to the bench (shared with other work), {:.1} GiB RAM, Linux {}",
        mem_kb as f64 / 1_048_576.0,
        kernel.trim()
    )
}

/// The machine's load over one backend's timed measurements, appended to
/// the reasons of the verdicts that load moves most (contention): a target
/// missed while the host took the CPU away reads differently.
fn load_note(load: Option<MachineLoad>) -> String {
    match load {
        Some(l) => format!(
            "; during this backend's timed measurements the cores were {:.0}% busy and the host \
             took {:.1}% of the CPU for other guests",
            l.busy * 100.0,
            l.stolen * 100.0
        ),
        None => String::new(),
    }
}

/// The two etcd contention runs' hand-offs side by side, for a hold-0 run
/// slower than the hold-1 one: whether the whole distribution moved (load)
/// or a tail did (a wake-up that came late, as the watch that started at a
/// past revision once did, queue.rs) shows in p50 against p99 and max.
fn etcd_hold_gap(h0: &Contention, h1: &Contention) -> String {
    format!(
        "hand-off between workers with hold 0 ms: p50 {}, p99 {}, max {}; with hold 1 ms: p50 {}, \
         p99 {}, max {}",
        ms(h0.handoff.p50_us),
        ms(h0.handoff.p99_us),
        ms(h0.handoff.max_us),
        ms(h1.handoff.p50_us),
        ms(h1.handoff.p99_us),
        ms(h1.handoff.max_us)
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A summary of these times in µs.
    fn us(v: &[u64]) -> Summary {
        Summary::of(
            &v.iter()
                .map(|&u| Duration::from_micros(u))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn missing_request_counters_say_why() {
        let mut h = Held {
            locks: 100,
            ttl_s: 15.0,
            server_requests_per_s: None,
            server_us_per_request: None,
            client_bytes_per_lock: Some(600.0),
            all_held: true,
            counters_unread: None,
        };
        assert!(no_counters(&h).starts_with("embedded database"));
        h.counters_unread = Some("127.0.0.1:2181: connection reset".into());
        assert_eq!(
            no_counters(&h),
            "the given server's request counter could not be read: 127.0.0.1:2181: connection reset"
        );
    }

    #[test]
    fn the_fair_verdict_splits_each_acquisition_into_hold_and_hand_off() {
        let c = super::super::Contention {
            workers: 8,
            hold_ms: 1,
            hold_actual_us: 1000.0,
            acquisitions_per_s: 800.0,
            handoff: us(&[200, 210, 900]),
            wait: us(&[5000]),
            releaser_reacquired: 0.0,
            transient_errors: 0,
        };
        let why = fair_gap(&c, Some(&us(&[150])));
        assert!(why.contains("each acquisition took 1250 µs"), "{why}");
        assert!(why.contains("and 250 µs from one hold's end"), "{why}");
        assert!(why.contains("850 acq/s leaves 176 µs"), "{why}");
        assert!(why.contains("hand-off p50 210 µs, p99 900 µs"), "{why}");
        assert!(why.contains("took 150 µs p50 in this run"), "{why}");
        assert!(!fair_gap(&c, None).contains("raw driver"));
    }

    #[test]
    fn a_slower_etcd_hold_0_is_explained_by_both_runs_hand_offs_and_the_machine_load() {
        let run = |hold_ms, handoff: &[u64]| Contention {
            workers: 8,
            hold_ms,
            hold_actual_us: hold_ms as f64 * 1000.0,
            acquisitions_per_s: 200.0,
            handoff: us(handoff),
            wait: us(&[5000]),
            releaser_reacquired: 0.0,
            transient_errors: 0,
        };
        let why = etcd_hold_gap(&run(0, &[1500, 1600, 95_000]), &run(1, &[2000, 2100, 9000]));
        assert!(
            why.contains("hold 0 ms: p50 1.6 ms, p99 95.0 ms, max 95.0 ms"),
            "{why}"
        );
        assert!(
            why.contains("hold 1 ms: p50 2.1 ms, p99 9.0 ms, max 9.0 ms"),
            "{why}"
        );
        assert_eq!(load_note(None), "");
        let load = load_note(Some(MachineLoad {
            busy: 0.42,
            stolen: 0.193,
        }));
        assert!(
            load.contains("the cores were 42% busy and the host took 19.3% of the CPU"),
            "{load}"
        );
    }

    #[test]
    fn the_many_tasks_verdict_gives_each_part_of_the_gap_its_standard_error() {
        use super::super::measure::{ClientCpu, RoundMeans};
        // Per-round µs per cycle: raw steady at 100, the backend 110 ± 1,
        // polylock swinging 100..140 around 120.
        let p = super::super::Parallel {
            tasks: 64,
            polylock_per_s: 1e6 / 120.0,
            raw_per_s: 1e6 / 100.0,
            ratio: 100.0 / 120.0,
            backend_per_s: 1e6 / 110.0,
            client_cpu: ClientCpu {
                polylock_us_per_cycle: 60.0,
                backend_us_per_cycle: 55.0,
                raw_us_per_cycle: 50.0,
            },
            server: None,
            checked_raw_per_s: None,
            round_means_us: RoundMeans {
                polylock: vec![100.0, 140.0, 100.0, 140.0],
                raw: vec![100.0; 4],
                backend: vec![109.0, 111.0, 109.0, 111.0],
            },
        };
        let why = parallel_gap(&p);
        // The polylock rounds' sample sd is 23.1, over 4 rounds 11.5.
        assert!(
            why.contains("20.0 ± 11.5 µs more per cycle than raw"),
            "{why}"
        );
        assert!(
            why.contains("+10.0 ± 0.6 µs, the lock layer +10.0 ± 11.6 µs"),
            "{why}"
        );
        assert!(why.contains("over the 4 interleaved rounds"), "{why}");
        assert!(!why.contains("checked"), "{why}");
        // Where raw with a checked release was measured (etcd), the gap is
        // also set against it.
        let checked = super::super::Parallel {
            checked_raw_per_s: Some(1e6 / 115.0),
            ..p
        };
        let why = parallel_gap(&checked);
        assert!(
            why.contains(
                "ran 8696 cycles/s in the same run, 0.87 of raw: polylock is 0.96 of that"
            ),
            "{why}"
        );
    }
}
