//! The promises of every backend in this build, as one table.

use std::time::Duration;

use lock_core::{FencingGuarantee, Guarantees};

/// What each backend compiled into this build declares it guarantees, in a
/// stable order (that of the backend list in the registry). These are the
/// claims the conformance suite selects cases by (and the fault suite is
/// there to check).
pub fn declared_guarantees() -> Vec<Guarantees> {
    crate::registry::built_guarantees()
}

/// [`declared_guarantees`] as a Markdown table (what `polylock guarantees`
/// prints and docs/guarantees.md holds).
pub fn guarantees_table() -> String {
    let mut out = String::from(
        "| backend | fencing tokens | FIFO waiters | lease expiry judged by | what expires leases early | survives server restart | survives failover | waiters wake by | smallest TTL / step | force release |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for g in declared_guarantees() {
        let fencing = match g.fencing {
            FencingGuarantee::Strict => "strictly increasing".to_string(),
            FencingGuarantee::UnlessDataLoss(why) => {
                format!("increasing unless data is lost: {why}")
            }
            _ => "see backend docs".to_string(),
        };
        let wait = g.wait.describe();
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |\n",
            g.backend,
            fencing.replace('|', "\\|"),
            yes(g.fair_fifo),
            g.expiry_clock.judged_by(),
            g.expiry_clock.broken_by(),
            yes(g.survives_restart),
            yes(g.survives_failover),
            wait,
            human(g.min_ttl),
            human(g.ttl_granularity),
            yes(g.force_release),
        );
    }
    out
}

/// What each backend of this build can tell an operator, as a Markdown
/// table (in the README): holder metadata (`inspect`/`status`), `list`, and
/// the waiter count. The conformance suite checks each "yes".
pub fn operations_table() -> String {
    let mut out = String::from(
        "| backend | who holds it (host, pid, command, since) | list held locks | count waiters | force release | batched renewals |\n\
         |---|---|---|---|---|---|\n",
    );
    for g in declared_guarantees() {
        out += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            g.backend,
            yes(g.holder_meta),
            yes(g.list),
            yes(g.counts_waiters),
            yes(g.force_release),
            yes(g.batch_renew),
        );
    }
    out
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn human(d: Duration) -> String {
    if d >= Duration::from_secs(1) && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d >= Duration::from_millis(1) && d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}µs", d.as_micros())
    }
}
