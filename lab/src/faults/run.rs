//! One run of the suite: every selected scenario against every selected
//! backend, then the claims check.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lock_core::Guarantees;
use testkit::register::Event;

use super::claims::{self, Check};
use super::scenario::{self, analyse, Ctx, Observation, Scenario, Window, SCENARIOS};
use super::target::{Target, LABELS, NOT_QUICK};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Backend labels (see [`LABELS`]); empty means all.
    pub backends: Vec<String>,
    /// Only the quick subset of scenarios.
    pub quick: bool,
    /// Scenario ids (see [`SCENARIOS`]); empty means all.
    pub scenarios: Vec<String>,
    /// The program the client processes run (`polylock-compare` itself).
    pub client_exe: PathBuf,
    /// Where client logs go.
    pub log_dir: PathBuf,
}

/// The result of one scenario on one backend.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// The scenario cannot apply, and why.
    NotApplicable(String),
    /// The harness could not finish the scenario (a timeout, a server that
    /// did not come back): an error of the run.
    Failed(String),
    /// What was observed.
    Observed(Box<Observation>, Window),
}

/// One cell of the observed table.
#[derive(Clone, Debug)]
pub struct Cell {
    /// The backend.
    pub backend: &'static str,
    /// The scenario.
    pub scenario: Scenario,
    /// What happened.
    pub outcome: Outcome,
    /// The register's events (empty unless observed).
    pub events: Vec<Event>,
    /// The claims checked against it.
    pub checks: Vec<Check>,
    /// Wall time the scenario took.
    pub elapsed: Duration,
    /// The server it ran on, when that was a deployment of its own (its
    /// servers on a faked clock) rather than the column's.
    pub deployment: Option<String>,
}

/// A backend as it took part in the run.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    /// Its label.
    pub label: &'static str,
    /// Server version banner.
    pub server_version: String,
    /// What it declares.
    pub guarantees: Guarantees,
    /// The TTL the clients asked for.
    pub ttl: Duration,
}

/// Everything one run produced.
#[derive(Clone, Debug)]
pub struct Report {
    /// Quick subset only.
    pub quick: bool,
    /// Backends in column order.
    pub backends: Vec<BackendInfo>,
    /// Scenarios in row order.
    pub scenarios: Vec<Scenario>,
    /// One per backend and scenario.
    pub cells: Vec<Cell>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl Report {
    /// The cell of `backend` and `scenario`.
    pub fn cell(&self, backend: &str, scenario: &str) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.backend == backend && c.scenario.id == scenario)
    }

    /// Contradicted claims and scenarios that failed to run.
    pub fn errors(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in &self.cells {
            if let Outcome::Failed(why) = &c.outcome {
                out.push(format!(
                    "{} / {}: did not complete: {why}",
                    c.backend, c.scenario.id
                ));
            }
            for k in c.checks.iter().filter(|k| k.judged && !k.ok) {
                out.push(format!(
                    "{} / {}: claim contradicted: {} ({})",
                    k.backend, k.scenario, k.claim, k.detail
                ));
            }
        }
        out
    }
}

/// The labels `requested` names, checked, in table order; all when empty.
/// With `quick` and nothing requested, the deployments in [`NOT_QUICK`]
/// are left out.
pub fn select_backends(requested: &[String], quick: bool) -> Result<Vec<&'static str>, String> {
    for r in requested {
        if !LABELS.contains(&r.as_str()) {
            return Err(format!(
                "unknown backend {r:?}: choose from {}",
                LABELS.join(", ")
            ));
        }
    }
    Ok(LABELS
        .iter()
        .copied()
        .filter(|l| match requested.is_empty() {
            true => !(quick && NOT_QUICK.contains(l)),
            false => requested.iter().any(|r| r == l),
        })
        .collect())
}

/// The scenarios `requested` names, checked, in table order; all (or the
/// quick subset) when empty.
pub fn select_scenarios(requested: &[String], quick: bool) -> Result<Vec<Scenario>, String> {
    for r in requested {
        if !SCENARIOS.iter().any(|s| s.id == r) {
            let ids: Vec<&str> = SCENARIOS.iter().map(|s| s.id).collect();
            return Err(format!(
                "unknown scenario {r:?}: choose from {}",
                ids.join(", ")
            ));
        }
    }
    Ok(SCENARIOS
        .iter()
        .copied()
        .filter(|s| s.quick || !quick)
        .filter(|s| requested.is_empty() || requested.iter().any(|r| r == s.id))
        .collect())
}

/// Runs the suite, printing one progress line per scenario on stderr.
///
/// # Cancel safety
/// Not cancel safe: servers and clients are killed when dropped, but a
/// dropped run writes no report.
pub async fn run(config: &Config) -> Result<Report, String> {
    let started = Instant::now();
    let labels = select_backends(&config.backends, config.quick)?;
    let scenarios = select_scenarios(&config.scenarios, config.quick)?;
    let total = labels.len() * scenarios.len();
    let mut done = 0;
    let mut report = Report {
        quick: config.quick,
        backends: Vec::new(),
        scenarios: scenarios.clone(),
        cells: Vec::new(),
        elapsed: Duration::ZERO,
    };
    for label in labels {
        eprintln!("polylock-compare: starting {label}");
        let target = match tokio::task::spawn_blocking(move || Target::start(label)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(format!("{label}: could not start: {e}")),
            Err(e) => return Err(format!("{label}: start-up panicked: {e}")),
        };
        report.backends.push(BackendInfo {
            label,
            server_version: target.server_version().to_owned(),
            guarantees: target.guarantees().clone(),
            ttl: target.ttl(),
        });
        for s in &scenarios {
            done += 1;
            let t0 = Instant::now();
            let cell = run_cell(&target, s, config).await;
            let summary = match &cell.outcome {
                Outcome::NotApplicable(why) => format!("n/a ({why})"),
                Outcome::Failed(why) => format!("FAILED: {why}"),
                Outcome::Observed(o, _) => format!(
                    "overlaps {}, stale rejected {}, stale accepted {}, token-order violations {}{}",
                    o.overlaps,
                    o.stale_rejected,
                    o.stale_accepted,
                    o.token_order_violations,
                    if cell.checks.iter().all(|c| c.ok || !c.judged) {
                        ""
                    } else {
                        ", CLAIM CONTRADICTED"
                    }
                ),
            };
            eprintln!(
                "[{done}/{total}] {label} · {}: {summary} ({:.1} s)",
                s.title,
                t0.elapsed().as_secs_f64()
            );
            report.cells.push(cell);
        }
        // Servers are killed here, off the async threads.
        let _ = tokio::task::spawn_blocking(move || drop(target)).await;
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// A generous bound on one scenario, so a wedged server cannot hang the run.
const SCENARIO_LIMIT: Duration = Duration::from_secs(240);

/// One cell: on `target`, or on a deployment of its own where the scenario
/// wants the servers on a faked clock.
///
/// # Cancel safety
/// Not cancel safe, as [`run`].
async fn run_cell(target: &Target, s: &Scenario, config: &Config) -> Cell {
    let t0 = Instant::now();
    let mut cell = Cell {
        backend: target.label(),
        scenario: *s,
        outcome: Outcome::NotApplicable(String::new()),
        events: Vec::new(),
        checks: Vec::new(),
        elapsed: Duration::ZERO,
        deployment: None,
    };
    let own = if s.wants_server_clock(target.guarantees()) {
        if let Err(why) = Target::server_clock_support(target.label()) {
            cell.outcome = Outcome::NotApplicable(why);
            return cell;
        }
        let label = target.label();
        match tokio::task::spawn_blocking(move || Target::start_with_server_clock(label)).await {
            Ok(Ok(t)) => Some(t),
            Ok(Err(e)) => {
                cell.outcome = Outcome::Failed(format!(
                    "could not start {label} on a faked clock: {}",
                    e.lines().next().unwrap_or_default()
                ));
                cell.elapsed = t0.elapsed();
                return cell;
            }
            Err(e) => {
                cell.outcome = Outcome::Failed(format!("start-up panicked: {e}"));
                return cell;
            }
        }
    } else {
        None
    };
    cell.deployment = own.as_ref().map(|t| t.server_version().to_owned());
    run_on(own.as_ref().unwrap_or(target), s, config, &mut cell).await;
    if let Some(own) = own {
        // Servers are killed here, off the async threads.
        let _ = tokio::task::spawn_blocking(move || drop(own)).await;
    }
    cell.elapsed = t0.elapsed();
    cell
}

/// Runs `s` on `target` and fills `cell`'s outcome, events and checks.
///
/// # Cancel safety
/// Not cancel safe, as [`run`]: the clients are killed when dropped, but
/// the cell is left half filled.
async fn run_on(target: &Target, s: &Scenario, config: &Config, cell: &mut Cell) {
    if let Err(why) = s.applies(target) {
        cell.outcome = Outcome::NotApplicable(why);
        return;
    }
    let mut ctx = match Ctx::new(target, s, &config.client_exe, &config.log_dir) {
        Ok(c) => c,
        Err(e) => {
            cell.outcome = Outcome::Failed(e);
            return;
        }
    };
    let result = tokio::time::timeout(SCENARIO_LIMIT, scenario::run(s, &mut ctx))
        .await
        .unwrap_or_else(|_| Err(format!("no result within {SCENARIO_LIMIT:?}")));
    cell.events = ctx.register().events();
    // Stops the clients (and, for a scenario cut short, a paused server).
    drop(ctx);
    for p in target.processes() {
        if p.is_paused() {
            let _ = p.resume();
        }
    }
    cell.outcome = match result {
        Ok(window) => {
            let obs = analyse(&cell.events, window);
            cell.checks =
                claims::check(target.label(), target.guarantees(), s, &obs, s.ttl(target));
            Outcome::Observed(Box::new(obs), window)
        }
        Err(e) => Outcome::Failed(format!("{e}{}", log_hint(&config.log_dir))),
    };
}

fn log_hint(dir: &Path) -> String {
    format!(" (client logs in {})", dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_are_selected_by_id_in_table_order_and_unknown_ids_are_refused() {
        let picked = select_scenarios(&["failover".into(), "client-pause".into()], false).unwrap();
        let ids: Vec<&str> = picked.iter().map(|s| s.id).collect();
        assert_eq!(ids, ["client-pause", "failover"]);
        // --quick still leaves out what is not quick.
        let quick = select_scenarios(&["failover".into(), "client-pause".into()], true).unwrap();
        assert_eq!(quick.len(), 1);
        assert_eq!(select_scenarios(&[], true).unwrap().len(), 3);
        let e = select_scenarios(&["nosuch".into()], false).unwrap_err();
        assert!(e.contains("unknown scenario \"nosuch\""), "{e}");
    }

    /// What makes `polylock-compare` exit 1: a judged claim contradicted,
    /// or a scenario that did not complete; a claim the run could not
    /// judge does not.
    #[test]
    fn errors_are_the_contradicted_judged_claims_and_the_failed_runs() {
        let scenario = SCENARIOS[0];
        let check = |ok: bool, judged: bool| Check {
            backend: "x",
            scenario: scenario.id,
            claim: format!("claim ok={ok} judged={judged}"),
            ok,
            judged,
            detail: String::new(),
        };
        let cell = |outcome: Outcome, checks: Vec<Check>| Cell {
            backend: "x",
            scenario,
            outcome,
            events: Vec::new(),
            checks,
            elapsed: Duration::ZERO,
            deployment: None,
        };
        let report = |cells: Vec<Cell>| Report {
            quick: true,
            backends: Vec::new(),
            scenarios: vec![scenario],
            cells,
            elapsed: Duration::ZERO,
        };
        let fine = report(vec![cell(
            Outcome::NotApplicable("n/a".into()),
            vec![check(true, true), check(false, false)],
        )]);
        assert!(fine.errors().is_empty(), "{:?}", fine.errors());
        let contradicted = report(vec![cell(
            Outcome::NotApplicable("n/a".into()),
            vec![check(true, true), check(false, true)],
        )]);
        let e = contradicted.errors();
        assert!(
            e.len() == 1 && e[0].contains("claim contradicted: claim ok=false judged=true"),
            "{e:?}"
        );
        let failed = report(vec![cell(Outcome::Failed("timed out".into()), Vec::new())]);
        let e = failed.errors();
        assert!(
            e.len() == 1 && e[0].contains("did not complete: timed out"),
            "{e:?}"
        );
    }
}
