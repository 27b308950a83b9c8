//! The claims check: each backend's declared guarantees against what the
//! runs observed. A contradicted claim is an error in the output and makes
//! `polylock-compare` exit non-zero.

use std::time::Duration;

use lock_core::{FencingGuarantee, Guarantees};

use super::scenario::{Kind, Observation, Scenario};

/// One claim compared with one observation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The backend.
    pub backend: &'static str,
    /// The scenario id.
    pub scenario: &'static str,
    /// The claim, in words.
    pub claim: String,
    /// Whether the observation confirms it.
    pub ok: bool,
    /// Whether the run could judge it: a claim the fault did not exercise
    /// (a restart that outlasted the lease) is listed, neither confirmed
    /// nor counted as contradicted.
    pub judged: bool,
    /// What was observed.
    pub detail: String,
}

/// How late a crashed holder's lock may come free past its TTL and still
/// count as "at the TTL" on a loaded two-core machine.
fn expiry_slack(ttl: Duration) -> Duration {
    ttl.max(Duration::from_secs(5))
}

/// Whether the holder kept its lock through the fault: no lost signal, and
/// its release afterwards succeeded.
fn kept_lock(obs: &Observation) -> bool {
    obs.fault_to_lost_ms.is_none() && obs.release.as_deref() == Some("ok")
}

fn kept_detail(obs: &Observation) -> String {
    format!(
        "lost signal {}, release reported {}",
        obs.fault_to_lost_ms
            .map_or_else(|| "never".to_owned(), |t| format!("after {t} ms")),
        obs.release.as_deref().unwrap_or("nothing"),
    )
}

fn grant_detail(obs: &Observation) -> String {
    obs.fault_to_grant_ms.map_or_else(
        || "no next grant".to_owned(),
        |t| format!("next grant {t} ms after the fault"),
    )
}

/// What `a`'s lease has left, at the least, when its last renewal before
/// a fault was answered: its trusted time less the watchdog's renewal
/// period (a third of the TTL, or half the trusted time when that is
/// shorter: `Lease::renewal_due`). `ttl` stands in for what the
/// observation lacks.
fn lease_left_after_renewal(obs: &Observation, ttl: Duration) -> Duration {
    let ttl = obs.granted_ttl_ms.map_or(ttl, Duration::from_millis);
    let trusted = obs.trusted_ms.map_or(ttl, Duration::from_millis).min(ttl);
    trusted.saturating_sub((ttl / 3).min(trusted / 2))
}

/// How far ahead of the end of `a`'s lease `b` may be granted and still
/// count as on time: the register stamps a renewal's report on arrival
/// (milliseconds after the client measured it), and a lock service's clock
/// may run up to the declared 1% drift fast.
const EARLY_SLACK_MS: i64 = 50;

/// `b` was not let in before `a`'s lease (as its last request allowed)
/// could have run out; no grant, or a release first, is not early either.
fn not_early(obs: &Observation) -> bool {
    let slack = EARLY_SLACK_MS.max(obs.granted_ttl_ms.map_or(0, |t| (t / 100) as i64));
    obs.early_expiry_ms.map_or(true, |e| e <= slack)
}

fn early_detail(obs: &Observation) -> String {
    match obs.early_expiry_ms {
        Some(e) if e > 0 => format!("b granted {e} ms before a's lease end"),
        Some(e) => format!("b granted {} ms after a's lease end", -e),
        None => "b not granted while a held".into(),
    }
}

/// The checks of one observation. `ttl` is the TTL the clients asked for.
pub fn check(
    backend: &'static str,
    g: &Guarantees,
    scenario: &Scenario,
    obs: &Observation,
    ttl: Duration,
) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut unjudged: Vec<&str> = Vec::new();
    let mut push = |claim: String, ok: bool, detail: String| {
        checks.push(Check {
            backend,
            scenario: scenario.id,
            claim,
            ok,
            judged: true,
            detail,
        })
    };
    let fencing_holds = match g.fencing {
        FencingGuarantee::Strict => true,
        _ => !scenario.may_lose_data(g),
    };
    if fencing_holds {
        push(
            "fencing: no stale write accepted, tokens strictly increasing".into(),
            obs.stale_accepted == 0 && obs.token_order_violations == 0,
            format!(
                "{} stale accepted, {} token-order violations",
                obs.stale_accepted, obs.token_order_violations
            ),
        );
    }
    if obs.lost_before_release {
        push(
            "release after lost() reports Lost".into(),
            obs.release.as_deref() == Some("lost"),
            format!(
                "release reported {}",
                obs.release.as_deref().unwrap_or("nothing")
            ),
        );
    }
    match scenario.kind {
        Kind::ClientPause => {
            // Both claims are about a lock that changed hands during the
            // pause. When `b` got it only after `a` resumed (an embedded
            // database whose file lock `a` was stopped holding, mid
            // statement, blocks everyone), the pause exercised neither.
            let handed_over = obs.fault_end_to_grant_ms.is_some_and(|d| d < 0);
            let why = if handed_over {
                ""
            } else {
                "; not judged: the lock did not change hands during the pause"
            };
            push(
                "fencing stops the paused holder's late write".into(),
                obs.stale_rejected >= 1,
                format!("{} stale writes rejected{why}", obs.stale_rejected),
            );
            push(
                "release reports a lease lost during the pause".into(),
                obs.release.as_deref() == Some("lost"),
                format!(
                    "release reported {}{why}",
                    obs.release.as_deref().unwrap_or("nothing")
                ),
            );
            push(
                "a paused holder's lease is not expired early".into(),
                not_early(obs),
                early_detail(obs),
            );
            if !handed_over {
                unjudged.push("fencing stops the paused holder's late write");
                unjudged.push("release reports a lease lost during the pause");
            }
            // No grant to `b` while `a` held: nothing was let in, early or
            // not.
            if obs.early_expiry_ms.is_none() {
                unjudged.push("a paused holder's lease is not expired early");
            }
        }
        Kind::ClientKill => {
            push(
                "a killed holder's lease is not expired early".into(),
                not_early(obs),
                early_detail(obs),
            );
            if obs.early_expiry_ms.is_none() {
                unjudged.push("a killed holder's lease is not expired early");
            }
            let limit = ttl + expiry_slack(ttl);
            push(
                format!(
                    "a killed holder's lock comes free by its TTL ({} ms, + {} ms slack)",
                    ttl.as_millis(),
                    expiry_slack(ttl).as_millis()
                ),
                obs.fault_to_grant_ms
                    .is_some_and(|t| u128::from(t) <= limit.as_millis()),
                grant_detail(obs),
            );
        }
        Kind::ServerRestart | Kind::MajorityRestart if g.survives_restart => {
            push(
                "survives server restart: no overlapping holders".into(),
                obs.overlaps == 0,
                format!("{} overlaps", obs.overlaps),
            );
            // A server down for longer than the lease has left, at worst,
            // after the holder's last renewal may outlast the lease on any
            // backend: the claim is about the data, which only a shorter
            // restart can show.
            let down = obs.fault_end_ms.saturating_sub(obs.fault_start_ms);
            let left = lease_left_after_renewal(obs, ttl);
            let judged = u128::from(down) < left.as_millis();
            push(
                "survives server restart: the holder keeps its lock".into(),
                kept_lock(obs),
                format!(
                    "server down {down} ms; {}{}",
                    kept_detail(obs),
                    if judged {
                        ""
                    } else {
                        "; not judged: the restart outlasted what the lease has left after a renewal"
                    }
                ),
            );
            if !judged {
                unjudged.push("survives server restart: the holder keeps its lock");
            }
            push(
                "survives server restart: the lock is granted again".into(),
                obs.fault_to_grant_ms.is_some(),
                grant_detail(obs),
            );
        }
        Kind::ServerRestart | Kind::MajorityRestart => {}
        Kind::MinorityLoss => {
            push(
                "losing a minority of the servers lets no second holder in".into(),
                obs.overlaps == 0,
                format!("{} overlaps", obs.overlaps),
            );
            // The leader goes first where the group names one: a failover.
            if g.survives_failover {
                push(
                    "survives failover: the holder keeps its lock".into(),
                    kept_lock(obs),
                    kept_detail(obs),
                );
            }
        }
        Kind::ServerPause => {
            push(
                "a paused server lets no second holder in while the first believes it holds".into(),
                obs.overlaps == 0,
                format!("{} overlaps", obs.overlaps),
            );
        }
        Kind::Blackhole | Kind::Latency => {
            push(
                "the holder is told by its local deadline, before anyone else is let in".into(),
                obs.overlaps == 0,
                format!("{} overlaps", obs.overlaps),
            );
            let slack = (ttl / 4).max(Duration::from_millis(500));
            push(
                format!(
                    "lost() fires at the local deadline at the latest (+ {} ms slack)",
                    slack.as_millis()
                ),
                // Under latency alone the renewals may keep up: no signal
                // is then fine; a silent link must end in one.
                obs.lost_vs_deadline_ms
                    .map_or(scenario.kind == Kind::Latency, |d| {
                        i128::from(d) <= i128::try_from(slack.as_millis()).unwrap_or(i128::MAX)
                    }),
                obs.lost_vs_deadline_ms.map_or_else(
                    || "no lost signal".to_owned(),
                    |d| format!("lost() {d:+} ms against the deadline"),
                ),
            );
        }
        Kind::Reset => {
            push(
                "a reset connection lets no second holder in while the first believes it holds"
                    .into(),
                obs.overlaps == 0,
                format!("{} overlaps", obs.overlaps),
            );
        }
        // Where a wall clock judges expiry, the declared table names a
        // forward step as what expires leases early: only fencing is
        // claimed, and checked above. A monotonic lease timer must not
        // notice the step at all.
        Kind::ClockStep if !g.expiry_clock.is_wall_clock() => {
            push(
                "a wall-clock step lets no second holder in (expiry on a monotonic timer)".into(),
                obs.overlaps == 0 && obs.overlaps_after_lost == 0,
                format!(
                    "{} overlaps, {} after the lost signal",
                    obs.overlaps, obs.overlaps_after_lost
                ),
            );
        }
        Kind::ClockStep => {}
        Kind::FollowerLoss => {
            push(
                "losing a follower lets no second holder in".into(),
                obs.overlaps == 0,
                format!("{} overlaps", obs.overlaps),
            );
            if g.survives_failover {
                push(
                    "survives failover: the holder keeps its lock when a follower goes".into(),
                    kept_lock(obs),
                    kept_detail(obs),
                );
            }
        }
        Kind::FenceEvicted => {
            // Checked whatever the fencing check above skipped: the
            // counter is reseeded from the server's clock, so the next
            // token is still the highest.
            push(
                "a deleted fencing counter restarts above every token issued".into(),
                obs.grants >= 2 && obs.token_order_violations == 0 && obs.stale_accepted == 0,
                format!(
                    "{} grants, {} token-order violations, {} stale accepted",
                    obs.grants, obs.token_order_violations, obs.stale_accepted
                ),
            );
        }
        Kind::Failover if g.survives_failover => {
            push(
                "survives failover: no overlapping holders".into(),
                obs.overlaps == 0,
                format!("{} overlaps", obs.overlaps),
            );
            push(
                "survives failover: the holder keeps its lock".into(),
                kept_lock(obs),
                kept_detail(obs),
            );
        }
        // Declared not to survive (asynchronous replication loses what the
        // replica had not received): the cell shows what happened.
        Kind::Failover => {}
        Kind::ForcedRelease => {
            push(
                "after a forced release the old holder's writes are fenced off".into(),
                obs.stale_accepted == 0,
                format!(
                    "{} stale accepted, {} rejected{}",
                    obs.stale_accepted,
                    obs.stale_rejected,
                    if obs.stale_rejected + obs.stale_accepted == 0 {
                        "; not judged: the old holder wrote nothing after the next grant"
                    } else {
                        ""
                    }
                ),
            );
            // Only a late write of the old holder shows the fence at work.
            if obs.stale_rejected + obs.stale_accepted == 0 {
                unjudged.push("after a forced release the old holder's writes are fenced off");
            }
        }
    }
    for c in &mut checks {
        if unjudged.contains(&c.claim.as_str()) {
            c.judged = false;
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::scenario::SCENARIOS;

    fn strict() -> Guarantees {
        let mut g = Guarantees::new("x");
        g.fencing = FencingGuarantee::Strict;
        g.survives_restart = true;
        g
    }

    #[test]
    fn a_stale_write_accepted_contradicts_strict_fencing_in_every_scenario() {
        let obs = Observation {
            stale_accepted: 1,
            ..Observation::default()
        };
        for s in &SCENARIOS {
            let checks = check("x", &strict(), s, &obs, Duration::from_secs(2));
            assert!(
                checks
                    .iter()
                    .any(|c| !c.ok && c.claim.starts_with("fencing")),
                "{}: {checks:?}",
                s.id
            );
        }
    }

    #[test]
    fn an_overlap_after_a_wall_clock_step_contradicts_a_monotonic_lease_timer_only() {
        let step = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::ClockStep)
            .unwrap();
        let obs = Observation {
            overlaps: 1,
            ..Observation::default()
        };
        let mut g = strict();
        g.expiry_clock = lock_core::ExpiryClock::Consensus;
        let checks = check("x", &g, step, &obs, Duration::from_secs(2));
        assert!(
            checks
                .iter()
                .any(|c| !c.ok && c.judged && c.claim.starts_with("a wall-clock step")),
            "{checks:?}"
        );
        // Where the server's wall clock judges expiry, the step is declared
        // to let the next holder in: only fencing is claimed.
        g.expiry_clock = lock_core::ExpiryClock::Server;
        let checks = check("x", &g, step, &obs, Duration::from_secs(2));
        assert!(checks.iter().all(|c| c.ok), "{checks:?}");
    }

    #[test]
    fn an_overlap_when_a_follower_dies_contradicts_the_group() {
        let loss = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::FollowerLoss)
            .unwrap();
        let obs = Observation {
            overlaps: 1,
            ..Observation::default()
        };
        let checks = check("x", &strict(), loss, &obs, Duration::from_secs(2));
        assert!(
            checks.iter().any(|c| !c.ok && c.claim.contains("follower")),
            "{checks:?}"
        );
    }

    #[test]
    fn fencing_unless_data_loss_is_not_checked_across_a_restart_that_loses_data() {
        let mut g = Guarantees::new("x");
        g.fencing = FencingGuarantee::UnlessDataLoss("restart");
        let obs = Observation {
            stale_accepted: 1,
            token_order_violations: 1,
            ..Observation::default()
        };
        let restart = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::ServerRestart)
            .unwrap();
        assert!(check("x", &g, restart, &obs, Duration::from_secs(2))
            .iter()
            .all(|c| c.ok));
        // A failover to an asynchronous replica is such a loss too.
        let failover = SCENARIOS.iter().find(|s| s.kind == Kind::Failover).unwrap();
        assert!(check("x", &g, failover, &obs, Duration::from_secs(2))
            .iter()
            .all(|c| c.ok));
        let pause = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::ClientPause)
            .unwrap();
        assert!(check("x", &g, pause, &obs, Duration::from_secs(2))
            .iter()
            .any(|c| !c.ok));
    }

    #[test]
    fn a_token_repeated_after_the_counter_was_deleted_contradicts_the_reseed() {
        let mut g = Guarantees::new("x");
        g.fencing = FencingGuarantee::UnlessDataLoss("eviction");
        let evicted = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::FenceEvicted)
            .unwrap();
        let repeated = Observation {
            grants: 2,
            token_order_violations: 1,
            ..Observation::default()
        };
        let checks = check("x", &g, evicted, &repeated, Duration::from_secs(2));
        assert!(
            checks
                .iter()
                .any(|c| !c.ok && c.claim.contains("deleted fencing counter")),
            "{checks:?}"
        );
        let reseeded = Observation {
            grants: 2,
            ..Observation::default()
        };
        assert!(check("x", &g, evicted, &reseeded, Duration::from_secs(2))
            .iter()
            .all(|c| c.ok));
    }

    #[test]
    fn a_release_error_after_the_lost_signal_contradicts_the_release_contract() {
        let blackhole = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::Blackhole)
            .unwrap();
        let obs = Observation {
            lost_before_release: true,
            release: Some("error".into()),
            lost_vs_deadline_ms: Some(0),
            ..Observation::default()
        };
        let checks = check("x", &strict(), blackhole, &obs, Duration::from_secs(2));
        assert!(
            checks
                .iter()
                .any(|c| !c.ok && c.claim.starts_with("release after lost()")),
            "{checks:?}"
        );
    }

    #[test]
    fn a_holder_that_loses_its_lock_across_a_short_restart_contradicts_survival() {
        let restart = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::ServerRestart)
            .unwrap();
        let ttl = Duration::from_secs(10);
        let lost = |down_ms: u64| Observation {
            fault_start_ms: 100,
            fault_end_ms: 100 + down_ms,
            fault_to_lost_ms: Some(9_000),
            release: Some("lost".into()),
            lost_before_release: true,
            fault_to_grant_ms: Some(10_000),
            ..Observation::default()
        };
        let short = check("x", &strict(), restart, &lost(1_500), ttl);
        assert!(
            short
                .iter()
                .any(|c| c.judged && !c.ok && c.claim.contains("keeps its lock")),
            "{short:?}"
        );
        let long = check("x", &strict(), restart, &lost(9_000), ttl);
        let keeps = long
            .iter()
            .find(|c| c.claim.contains("keeps its lock"))
            .unwrap();
        assert!(!keeps.judged, "{keeps:?}");
    }

    #[test]
    fn no_grant_while_a_held_leaves_early_expiry_unjudged() {
        for kind in [Kind::ClientPause, Kind::ClientKill] {
            let scenario = SCENARIOS.iter().find(|s| s.kind == kind).unwrap();
            let quiet = Observation::default();
            let checks = check("x", &strict(), scenario, &quiet, Duration::from_secs(2));
            let early = checks
                .iter()
                .find(|c| c.claim.contains("not expired early"))
                .unwrap();
            assert!(!early.judged, "{kind:?}: {early:?}");
        }
    }

    #[test]
    fn a_restart_longer_than_a_lease_trusted_for_part_of_its_ttl_has_left_is_not_judged() {
        let restart = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::ServerRestart)
            .unwrap();
        let ttl = Duration::from_secs(10);
        // Trusted for 5 s of its 10 s (a ZooKeeper ensemble's follower lag
        // and drift): renewed every 2.5 s, so a restart of 3 s may outlast
        // it, where it would not outlast a lease trusted for its whole TTL.
        let lost = |trusted_ms: u64| Observation {
            fault_start_ms: 100,
            fault_end_ms: 3_100,
            fault_to_lost_ms: Some(2_500),
            release: Some("lost".into()),
            lost_before_release: true,
            fault_to_grant_ms: Some(10_000),
            granted_ttl_ms: Some(10_000),
            trusted_ms: Some(trusted_ms),
            ..Observation::default()
        };
        let keeps = |trusted_ms| {
            check("x", &strict(), restart, &lost(trusted_ms), ttl)
                .into_iter()
                .find(|c| c.claim.contains("keeps its lock"))
                .unwrap()
        };
        let lagged = keeps(5_000);
        assert!(!lagged.judged, "{lagged:?}");
        let whole = keeps(10_000);
        assert!(whole.judged && !whole.ok, "{whole:?}");
    }

    #[test]
    fn a_lock_freed_long_after_the_ttl_contradicts_expiry() {
        let kill = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::ClientKill)
            .unwrap();
        let late = Observation {
            fault_to_grant_ms: Some(60_000),
            ..Observation::default()
        };
        let on_time = Observation {
            fault_to_grant_ms: Some(2_100),
            ..Observation::default()
        };
        let ttl = Duration::from_secs(2);
        assert!(check("x", &strict(), kill, &late, ttl)
            .iter()
            .any(|c| !c.ok));
        assert!(check("x", &strict(), kill, &on_time, ttl)
            .iter()
            .all(|c| c.ok));
    }

    #[test]
    fn a_pause_the_lock_did_not_change_hands_in_is_not_judged() {
        let pause = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::ClientPause)
            .expect("the client-pause scenario");
        let quiet = Observation {
            release: Some("ok".into()),
            fault_end_to_grant_ms: Some(300),
            ..Observation::default()
        };
        let checks = check("x", &strict(), pause, &quiet, Duration::from_secs(2));
        let late_write = |c: &&Check| c.claim.starts_with("fencing stops");
        let c = checks
            .iter()
            .find(late_write)
            .expect("late-write claim listed");
        assert!(!c.judged && !c.ok, "{c:?}");
        assert!(checks.iter().all(|c| c.ok || !c.judged), "{checks:?}");

        let handed_over = Observation {
            fault_end_to_grant_ms: Some(-1500),
            ..quiet
        };
        let checks = check("x", &strict(), pause, &handed_over, Duration::from_secs(2));
        let c = checks
            .iter()
            .find(late_write)
            .expect("late-write claim listed");
        assert!(
            c.judged && !c.ok,
            "a hand-over without a rejected late write contradicts: {c:?}"
        );
    }

    #[test]
    fn a_holder_that_loses_its_lock_to_a_leader_loss_contradicts_a_declared_failover() {
        let minority = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::MinorityLoss)
            .unwrap();
        let lost = Observation {
            fault_to_lost_ms: Some(1_900),
            release: Some("lost".into()),
            lost_before_release: true,
            ..Observation::default()
        };
        let kept = Observation {
            release: Some("ok".into()),
            ..Observation::default()
        };
        let ttl = Duration::from_secs(2);
        let mut g = strict();
        g.survives_failover = true;
        let checks = check("x", &g, minority, &lost, ttl);
        assert!(
            checks
                .iter()
                .any(|c| c.judged && !c.ok && c.claim.starts_with("survives failover")),
            "{checks:?}"
        );
        assert!(check("x", &g, minority, &kept, ttl).iter().all(|c| c.ok));
        // Not declared: nothing claims the lock is kept.
        let checks = check("x", &strict(), minority, &lost, ttl);
        assert!(
            checks
                .iter()
                .all(|c| !c.claim.starts_with("survives failover")),
            "{checks:?}"
        );
    }

    #[test]
    fn a_forced_release_without_a_late_write_is_not_judged() {
        let forced = SCENARIOS
            .iter()
            .find(|s| s.kind == Kind::ForcedRelease)
            .unwrap();
        let fenced = |c: &&Check| c.claim.starts_with("after a forced release");
        let quiet = check(
            "x",
            &strict(),
            forced,
            &Observation::default(),
            Duration::from_secs(2),
        );
        assert!(!quiet.iter().find(fenced).unwrap().judged, "{quiet:?}");
        let rejected = Observation {
            stale_rejected: 1,
            ..Observation::default()
        };
        let seen = check("x", &strict(), forced, &rejected, Duration::from_secs(2));
        let c = seen.iter().find(fenced).unwrap();
        assert!(c.judged && c.ok, "{c:?}");
    }
}
