//! The suite catches broken backends: every deliberately flawed variant of
//! the reference backend fails at least one case that the unflawed
//! reference passes, by a failed assertion (a hung case does not count).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use conformance::broken::{BrokenFixture, Flaw};
use conformance::harness::{is_timeout, run_every_case};

/// The cases the unflawed reference backend fails (none once the contract
/// is kept), so that a flaw is not credited with someone else's failure.
fn reference_failures() -> &'static BTreeSet<&'static str> {
    static FAILURES: OnceLock<BTreeSet<&'static str>> = OnceLock::new();
    FAILURES.get_or_init(|| {
        run_every_case(BrokenFixture::reference())
            .into_iter()
            .filter(|(_, r)| r.is_err())
            .map(|(name, _)| name)
            .collect()
    })
}

fn caught(flaw: Flaw) {
    let outcomes = run_every_case(BrokenFixture::new(flaw));
    let reference = reference_failures();
    let mut caught_by = Vec::new();
    for (name, r) in &outcomes {
        if let Err(message) = r {
            eprintln!("{flaw:?} fails {name}: {message}");
            if !is_timeout(message) && !reference.contains(name) {
                caught_by.push(*name);
            }
        }
    }
    eprintln!("{flaw:?} is caught by {caught_by:?}");
    assert!(
        !caught_by.is_empty(),
        "the suite does not catch {flaw:?}: {} cases ran, none that the reference passes \
         failed by an assertion (the reference fails {reference:?})",
        outcomes.len()
    );
}

#[test]
fn no_owner_check_is_caught() {
    caught(Flaw::NoOwnerCheck);
}

#[test]
fn early_expiry_is_caught() {
    caught(Flaw::ExpiresEarly);
}

#[test]
fn deadline_at_receipt_is_caught() {
    caught(Flaw::DeadlineAtReceipt);
}

#[test]
fn missing_wake_up_is_caught() {
    caught(Flaw::NoWakeUp);
}

#[test]
fn fence_reuse_is_caught() {
    caught(Flaw::FenceReuse);
}

#[test]
fn release_that_ignores_loss_is_caught() {
    caught(Flaw::ReleaseIgnoresLoss);
}

/// A case that restarts the server runs alone on its fixture: beside it, a
/// neighbour's calls would fail under the neighbour's name.
#[test]
fn the_restart_case_runs_alone() {
    let all = conformance::cases::all();
    let restart = all
        .iter()
        .find(|c| c.name.ends_with("held_lock_survives_a_server_restart"))
        .expect("the restart case is registered");
    assert!(restart.exclusive, "{} shares its fixture", restart.name);
}
