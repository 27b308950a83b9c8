//! How loaded the machine was while a backend was measured, from the
//! kernel's CPU counters (`/proc/stat`).
//!
//! The bench's ratios hold up on a busy machine only as far as the load hit
//! both sides alike; a run during which the host took a good share of the
//! CPU away (steal) or other work kept the cores busy moves absolute times
//! and widens every ±. The report states both shares per backend, so a
//! reader can tell a quiet run from a starved one instead of guessing.

use serde::Serialize;

/// The machine's CPU over one backend's measurements, all cores together.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MachineLoad {
    /// Share of the time the cores were busy running anything (this bench,
    /// its servers, other work): user, nice, system, irq and softirq time.
    pub busy: f64,
    /// Share the hypervisor gave to other guests while this one wanted to
    /// run (steal time).
    pub stolen: f64,
}

/// The kernel's cumulative CPU counters at one moment, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CpuTimes {
    busy: u64,
    steal: u64,
    total: u64,
}

impl CpuTimes {
    /// Now; `None` where `/proc/stat` cannot be read (not Linux).
    pub(crate) fn now() -> Option<CpuTimes> {
        parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The load between `self` and `later`; `None` if no tick passed.
    pub(crate) fn until(self, later: CpuTimes) -> Option<MachineLoad> {
        let total = later.total.checked_sub(self.total)?;
        if total == 0 {
            return None;
        }
        let share = |a: u64, b: u64| b.saturating_sub(a) as f64 / total as f64;
        Some(MachineLoad {
            busy: share(self.busy, later.busy),
            stolen: share(self.steal, later.steal),
        })
    }
}

/// The all-cores `cpu` line: user nice system idle iowait irq softirq steal
/// (guest time is already counted in user and nice, so it is left out).
fn parse(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = v.try_into().ok()?;
    let busy = user + nice + system + irq + softirq;
    Some(CpuTimes {
        busy,
        steal,
        total: busy + idle + iowait + steal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_all_cores_line_gives_busy_and_stolen_shares() {
        let before =
            parse("cpu  100 0 50 800 10 5 5 30 0 0\ncpu0 50 0 25 400 5 2 3 15 0 0\nintr 1\n")
                .unwrap();
        // 200 ticks later: 60 busy (40 user, 10 system, 5 irq, 5 softirq),
        // 20 stolen, 110 idle, 10 iowait.
        let after = parse("cpu  140 0 60 910 20 10 10 50 0 0\n").unwrap();
        let load = before.until(after).unwrap();
        assert_eq!(load.busy, 60.0 / 200.0);
        assert_eq!(load.stolen, 20.0 / 200.0);
    }

    #[test]
    fn no_tick_or_a_garbled_line_gives_nothing() {
        let t = parse("cpu  1 2 3 4 5 6 7 8 0 0\n").unwrap();
        assert_eq!(t.until(t), None);
        assert_eq!(parse("cpu  1 2 three 4 5 6 7 8\n"), None);
        assert_eq!(parse("cpu  1 2 3\n"), None);
        assert_eq!(parse("intr 5\n"), None);
    }
}
