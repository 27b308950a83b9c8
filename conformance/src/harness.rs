//! Turns (backend x case) into test trials of one binary.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use futures::FutureExt;
use libtest_mimic::{Arguments, Failed, Trial};

use crate::backends::{registered, Registration};
use crate::cases::{all, Case};
use crate::fixture::{Ctx, Fixture};

/// The longest one case may run before it counts as hung.
const CASE_TIMEOUT: Duration = Duration::from_secs(240);

type Shared = Arc<OnceLock<Result<Arc<dyn Fixture>, String>>>;

/// Runs the suite with libtest-style arguments (filters, `--list`, ...).
pub fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for Registration {
        label,
        guarantees,
        setup,
    } in registered()
    {
        let shared: Shared = Arc::new(OnceLock::new());
        // Cases of one fixture run side by side, except an exclusive one
        // (a server restart), which runs alone.
        let turns = Arc::new(RwLock::new(()));
        let promised = guarantees();
        for Case {
            name,
            applies,
            run,
            exclusive,
        } in all()
        {
            if !applies(&promised) {
                continue;
            }
            let shared = Arc::clone(&shared);
            let turns = Arc::clone(&turns);
            let trial = Trial::test(format!("{label}::{name}"), move || {
                let fixture = shared
                    .get_or_init(setup)
                    .as_ref()
                    .map_err(|e| Failed::from(format!("{label}: fixture setup failed: {e}")))?;
                // A panicking case poisons nothing it shares: the lock
                // guards no data.
                let _alone = exclusive.then(|| turns.write().unwrap_or_else(|p| p.into_inner()));
                let _shared = (!exclusive).then(|| turns.read().unwrap_or_else(|p| p.into_inner()));
                run_case(fixture.as_ref(), name, run)
            });
            trials.push(trial);
        }
    }
    libtest_mimic::run(&args, trials).exit();
}

fn run_case(
    fixture: &dyn Fixture,
    name: &'static str,
    run: for<'a> fn(&'a Ctx<'a>) -> futures::future::BoxFuture<'a, ()>,
) -> Result<(), Failed> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failed::from(format!("tokio runtime: {e}")))?;
    let ctx = Ctx::new(fixture, name.rsplit("::").next().unwrap_or(name));
    let outcome = rt.block_on(async {
        let case = AssertUnwindSafe(run(&ctx)).catch_unwind();
        tokio::time::timeout(CASE_TIMEOUT, case).await
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(panic)) => Err(Failed::from(panic_message(&panic))),
        Err(_) => Err(Failed::from(format!(
            "case did not finish within {CASE_TIMEOUT:?}"
        ))),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "case panicked".into())
}

/// The outcome of one case: `Err` carries the failure message.
pub type CaseOutcome = (&'static str, Result<(), String>);

/// How many cases [`run_every_case`] runs at once: as many as the test
/// binary's own harness would on this machine (one per core), times two
/// since most cases mostly sleep. Running all thirty at once made a
/// composite backend's cold connections miss their TTLs on two cores.
fn parallel_cases() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) * 2
}

/// Runs every case that applies to `fixture`'s guarantees, each on a
/// runtime of its own, a few at a time (an exclusive case alone, as in
/// [`main`]), and returns every outcome in the suite's order. For testing
/// the suite itself (see [`crate::broken`]) and for fixtures built inside
/// a test (a migration lock over two spawned servers).
pub fn run_every_case(fixture: Arc<dyn Fixture>) -> Vec<CaseOutcome> {
    let promised = fixture.guarantees();
    let cases: Vec<Case> = all()
        .into_iter()
        .filter(|case| (case.applies)(&promised))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let turns = RwLock::new(());
    let outcomes: Vec<OnceLock<Result<(), String>>> =
        cases.iter().map(|_| OnceLock::new()).collect();
    std::thread::scope(|scope| {
        for _ in 0..parallel_cases().min(cases.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    let _alone = case
                        .exclusive
                        .then(|| turns.write().unwrap_or_else(|p| p.into_inner()));
                    let _shared =
                        (!case.exclusive).then(|| turns.read().unwrap_or_else(|p| p.into_inner()));
                    run_case(fixture.as_ref(), case.name, case.run).map_err(|f| {
                        f.message()
                            .map_or_else(|| "failed".to_string(), str::to_string)
                    })
                }))
                .unwrap_or_else(|_| Err("the case's thread panicked".into()));
                let _ = outcomes[i].set(outcome);
            });
        }
    });
    cases
        .iter()
        .zip(outcomes)
        .map(|(case, outcome)| {
            (
                case.name,
                outcome
                    .into_inner()
                    .unwrap_or_else(|| Err("the case did not run".into())),
            )
        })
        .collect()
}

/// Runs every case that applies to `fixture` ([`run_every_case`]) and
/// panics with every failure unless exactly `expected` cases ran and all
/// passed: the whole suite as one test of a fixture built inside a test.
/// The count is the caller's statement of what its fixture's guarantees
/// select, so a guarantee that quietly turns off (and with it the FIFO,
/// wake-up, restart or list cases) fails the test.
pub fn assert_every_case_passes(fixture: Arc<dyn Fixture>, expected: usize) {
    let outcomes = run_every_case(fixture);
    let names: Vec<&str> = outcomes.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        outcomes.len(),
        expected,
        "{} cases ran, {expected} expected: {names:?}",
        outcomes.len()
    );
    let failed: Vec<_> = outcomes
        .iter()
        .filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

/// Whether a failure message is the harness's own "case hung" verdict
/// rather than a failed assertion.
pub fn is_timeout(message: &str) -> bool {
    message.starts_with("case did not finish within")
}
