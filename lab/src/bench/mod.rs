//! `polylock bench`: what each backend costs, as ratios to the raw driver
//! measured in the same run (absolute times on a shared machine mean
//! little).
//!
//! For every backend: a server started by the test kit (or one given by
//! URL, [`Options::urls`]), then the
//! uncontended cycle next to the raw driver (and next to the backend called
//! without the lock layer, and the lock layer alone), many tasks on distinct names
//! through one client next to the raw driver, contention on one name (hold
//! 0 and 1 ms), and many locks held at once (renewal requests counted by
//! the server, client memory counted by the binary's allocator). [`run`]
//! measures; [`output`] writes the table, JSON, SVG charts and
//! docs/performance.md from the measurements alone.

mod load;
mod measure;
pub mod output;
mod stats;
mod target;

use std::time::Duration;

use serde::Serialize;

pub use load::MachineLoad;
pub use measure::{ClientCpu, Contention, Cycle, Handoff, Held, Parallel, RoundMeans, ServerCpu};
pub use stats::{Summary, CDF_POINTS};
pub use target::ALL as BACKENDS;

/// What to measure and how long.
#[derive(Clone, Debug)]
pub struct Options {
    /// Backends by name, from [`BACKENDS`], each on servers started here.
    pub backends: Vec<String>,
    /// Lock URLs of servers to measure instead of starting any (`--url`):
    /// when not empty, [`backends`](Self::backends) is not used. The bench
    /// writes there: lock names under `bench/`, the raw baseline's keys
    /// (`raw:*`, `raw-handoff`), a `raw_locks` table, a `/raw` node.
    pub urls: Vec<String>,
    /// How long each timed measurement runs.
    pub duration: Duration,
    /// Locks held at once in the large hold measurement (the small one
    /// holds a hundredth of it, at least 1).
    pub held_locks: usize,
    /// The TTL of the held locks; the server's requests are counted over
    /// one TTL.
    pub held_ttl: Duration,
    /// Tasks on distinct names through one client.
    pub tasks: usize,
    /// Workers on one name.
    pub workers: usize,
    /// The process's heap bytes in use now (a counting global allocator in
    /// the binary), for client memory per held lock.
    pub allocated: Option<fn() -> usize>,
    /// The command line that reproduces the run, for the report.
    pub command: String,
}

impl Options {
    /// The full run: 5 s per measurement, 10,000 held locks.
    pub fn full() -> Options {
        Options {
            backends: BACKENDS.iter().map(|s| s.to_string()).collect(),
            urls: Vec::new(),
            duration: Duration::from_secs(5),
            held_locks: 10_000,
            held_ttl: Duration::from_secs(15),
            tasks: 64,
            workers: 8,
            allocated: None,
            command: "polylock bench".into(),
        }
    }

    /// Short durations and fewer locks, for CI.
    pub fn quick() -> Options {
        Options {
            duration: Duration::from_millis(800),
            held_locks: 300,
            held_ttl: Duration::from_secs(3),
            ..Options::full()
        }
    }

    /// Checks the options before anything starts.
    pub fn validate(&self) -> Result<(), String> {
        for url in &self.urls {
            target::GivenUrl::parse(url)?;
        }
        if self.backends.is_empty() && self.urls.is_empty() {
            return Err("no backends to measure".into());
        }
        // Given URLs replace the started backends: their names do not
        // matter then.
        let started = if self.urls.is_empty() {
            &self.backends[..]
        } else {
            &[]
        };
        if let Some(b) = started.iter().find(|b| !BACKENDS.contains(&b.as_str())) {
            return Err(format!(
                "unknown backend `{b}` (known: {})",
                BACKENDS.join(", ")
            ));
        }
        if self.duration < Duration::from_millis(100) {
            return Err("--duration must be at least 100ms".into());
        }
        if self.held_locks == 0 || self.tasks == 0 || self.workers < 2 {
            return Err("held locks and tasks must be > 0, workers >= 2".into());
        }
        if self.held_ttl < Duration::from_secs(2) {
            return Err(
                "the held locks' TTL must be at least 2s (etcd grants whole seconds)".into(),
            );
        }
        Ok(())
    }
}

/// Everything one backend measured.
#[derive(Clone, Debug, Serialize)]
pub struct BackendReport {
    /// The backend's name.
    pub backend: String,
    /// The server's version as it reports it.
    pub server: String,
    /// The URL measured, password redacted, when the server was given
    /// (`--url`) rather than started by the test kit.
    pub connected: Option<String>,
    /// Uncontended acquire + release.
    pub cycle: Cycle,
    /// Tasks on distinct names through one client.
    pub parallel: Parallel,
    /// The hand-off between two clients.
    pub handoff: Handoff,
    /// Contention, hold 0 ms then 1 ms.
    pub contention: Vec<Contention>,
    /// Held locks, few then many.
    pub held: Vec<Held>,
    /// Whether the client declares batched renewals
    /// (`Guarantees::batch_renew`).
    pub batch_renew: bool,
    /// How loaded the machine was over the timed measurements (cycle, many
    /// tasks, hand-off, contention); `None` where the kernel's counters
    /// cannot be read.
    pub load: Option<MachineLoad>,
}

/// One run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// When, UTC.
    pub date: String,
    /// CPU, cores, memory, kernel.
    pub machine: String,
    /// The command that reproduces it.
    pub command: String,
    /// Seconds per timed measurement.
    pub duration_s: f64,
    /// Per backend, in the order measured.
    pub backends: Vec<BackendReport>,
}

/// Measures every backend of `opts`, with a progress line on stderr.
///
/// # Cancel safety
/// Not meant to be cancelled: dropping it stops the servers of the backend
/// being measured, mid-measurement.
pub async fn run(opts: &Options) -> Result<Report, String> {
    opts.validate()?;
    let mut out = Vec::new();
    let subjects = subjects(opts)?;
    let n = subjects.len();
    for (i, (name, given)) in subjects.into_iter().enumerate() {
        let step = |what: &str| progress(&format!("[{}/{n}] {name}: {what}", i + 1));
        let t = match given {
            None => {
                step("starting the server");
                target::Target::start(&name).await?
            }
            Some(given) => {
                step("connecting");
                target::Target::connect(given).await?
            }
        };
        let locker = polylock::connect(&t.url)
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        let server = match t.server_version().await {
            Ok(v) => v,
            Err(e) if t.connected.is_some() => format!("version not known ({e})"),
            Err(e) => return Err(e),
        };
        step("uncontended cycle vs raw");
        let cpu_before = load::CpuTimes::now();
        let cycle = measure::cycle(&t, &locker, opts.duration).await?;
        step(&format!("{} tasks on distinct names vs raw", opts.tasks));
        let parallel = measure::parallel(&t, &locker, opts.tasks, opts.duration).await?;
        step("hand-off between two clients");
        let handoff = measure::handoff(&t, opts.duration).await?;
        let mut contention = Vec::new();
        for hold in [0, 1] {
            step(&format!(
                "contention, {} workers, hold {hold} ms",
                opts.workers
            ));
            contention.push(
                measure::contention(&t, opts.workers, Duration::from_millis(hold), opts.duration)
                    .await?,
            );
        }
        // The held-lock phase mostly waits out a TTL: counted, it would
        // dilute the load of the timed measurements above.
        let load = cpu_before
            .zip(load::CpuTimes::now())
            .and_then(|(a, b)| a.until(b));
        let mut held = Vec::new();
        for locks in [(opts.held_locks / 100).max(1), opts.held_locks] {
            step(&format!("{locks} locks held"));
            held.push(measure::held(&t, locks, opts.held_ttl, opts.allocated).await?);
        }
        let batch_renew = locker.guarantees().batch_renew;
        drop(locker);
        out.push(BackendReport {
            backend: name,
            server,
            connected: t.connected.clone(),
            cycle,
            parallel,
            handoff,
            contention,
            held,
            batch_renew,
            load,
        });
    }
    progress("done");
    eprintln!();
    Ok(Report {
        date: output::utc_now(),
        machine: output::machine(),
        command: opts.command.clone(),
        duration_s: opts.duration.as_secs_f64(),
        backends: out,
    })
}

/// What to measure, in order: each row's name and, for a server given by
/// URL, the parsed URL. Rows of given servers are named after the backend
/// of the same shape (`redis`, `redis-fair`, `postgres`, ...), numbered
/// when one shape comes twice.
fn subjects(opts: &Options) -> Result<Vec<(String, Option<target::GivenUrl>)>, String> {
    if opts.urls.is_empty() {
        return Ok(opts.backends.iter().map(|b| (b.clone(), None)).collect());
    }
    let mut out: Vec<(String, Option<target::GivenUrl>)> = Vec::new();
    for url in &opts.urls {
        let given = target::GivenUrl::parse(url)?;
        let label = given.label;
        let same = out
            .iter()
            .filter(|(name, _)| name == label || name.starts_with(&format!("{label}#")))
            .count();
        let name = match same {
            0 => label.to_string(),
            k => format!("{label}#{}", k + 1),
        };
        out.push((name, Some(given)));
    }
    Ok(out)
}

fn progress(line: &str) {
    use std::io::Write;
    let mut e = std::io::stderr().lock();
    let _ = write!(e, "\r\x1b[2K{line}");
    let _ = e.flush();
}
