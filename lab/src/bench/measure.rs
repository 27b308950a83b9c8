//! The measurements, each against one [`Target`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lock_core::Locker;
use serde::Serialize;
use tokio::time::{sleep, Instant};

use super::stats::Summary;
use super::target::Target;

type Res<T> = Result<T, String>;

fn lock_err(what: &str) -> impl Fn(lock_core::LockError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

const TTL: Duration = Duration::from_secs(30);

/// Uncontended acquire + release, polylock next to the raw driver, and
/// the gap between them taken apart in the same run.
#[derive(Clone, Debug, Serialize)]
pub struct Cycle {
    /// polylock's cycle latency.
    pub polylock: Summary,
    /// The raw driver's cycle latency.
    pub raw: Summary,
    /// polylock cycles per second.
    pub polylock_per_s: f64,
    /// Raw cycles per second.
    pub raw_per_s: f64,
    /// `polylock_per_s / raw_per_s`.
    pub ratio: f64,
    /// One minimal request (PING, SELECT 1, a get): the round trip.
    pub round_trip: Summary,
    /// The backend's own `try_acquire` + `release` (the `LockBackend` trait
    /// called directly: no `Locker`, guard or watchdog), cycles per second.
    /// `backend - raw` is what the backend's requests cost over the raw
    /// ones; `polylock - backend`, what the lock layer adds around them.
    pub backend_per_s: f64,
    /// The lock layer alone: a `Locker` cycle over the in-memory backend in
    /// this process, µs per cycle (no I/O at all).
    pub layer_us: f64,
    /// Where the server's command thread can be measured (Redis), its CPU
    /// per cycle, polylock's and raw.
    pub server: Option<ServerCpu>,
    /// Where a lock's owner-checked release is a costlier request than
    /// raw's bare delete (etcd: `Raw::checked_cycle`), raw's cycles per
    /// second with that check, from rounds between the others.
    pub checked_raw_per_s: Option<f64>,
    /// The mean cycle of each round, per side, in µs: how much the machine
    /// moved the figures between interleaved rounds.
    pub round_means_us: RoundMeans,
}

/// Mean µs per cycle of each round of `cycle` (this module), per side.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoundMeans {
    /// Through the `Locker`.
    pub polylock: Vec<f64>,
    /// The raw driver.
    pub raw: Vec<f64>,
    /// The backend trait called directly.
    pub backend: Vec<f64>,
}

impl RoundMeans {
    /// The standard error of `mean(a) - mean(b)` over the rounds, in µs.
    pub fn std_error_of_difference(a: &[f64], b: &[f64]) -> f64 {
        fn var_of_mean(v: &[f64]) -> f64 {
            if v.len() < 2 {
                return 0.0;
            }
            let n = v.len() as f64;
            let m = v.iter().sum::<f64>() / n;
            v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0) / n
        }
        (var_of_mean(a) + var_of_mean(b)).sqrt()
    }
}

/// The three sides of `cycle` (this module).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Polylock,
    Raw,
    Backend,
}

/// Interleaves short rounds of the three sides, so that load changes on
/// the shared machine hit all alike.
pub(crate) async fn cycle(t: &Target, locker: &Locker, d: Duration) -> Res<Cycle> {
    use Side::*;
    let rounds: usize = 9;
    let per = d / (2 * rounds as u32);
    let (mut mine, mut raw) = (Vec::new(), Vec::new());
    // Per side (polylock, raw, backend): wall time, cycles, server CPU µs.
    let mut spent = [(Duration::ZERO, 0u64, 0.0f64); 3];
    let mut server_measured = true;
    // Server CPU µs and cycles of the empty scripts (Redis).
    let mut empty = (0.0, 0u64);
    // Wall seconds and cycles of raw with a checked release (etcd).
    let mut checked = (0.0, 0u64);
    let mut means = [Vec::new(), Vec::new(), Vec::new()];
    // Warm-up: connections, sessions, prepared statements.
    for _ in 0..20 {
        one_cycle(locker, "bench/cycle").await?;
        t.raw.cycle("bench/cycle").await?;
        backend_cycle(locker, "bench/cycle").await?;
    }
    let orders = [
        [Polylock, Raw, Backend],
        [Raw, Backend, Polylock],
        [Backend, Polylock, Raw],
    ];
    for r in 0..rounds {
        for side in orders[r % 3] {
            let cpu_before = t.server_cpu_us().await?;
            let started = Instant::now();
            let mut n = 0u64;
            while started.elapsed() < per {
                let at = Instant::now();
                match side {
                    Polylock => {
                        one_cycle(locker, "bench/cycle").await?;
                        mine.push(at.elapsed());
                    }
                    Raw => {
                        t.raw.cycle("bench/cycle").await?;
                        raw.push(at.elapsed());
                    }
                    Backend => backend_cycle(locker, "bench/cycle").await?,
                }
                n += 1;
            }
            let i = side as usize;
            means[i].push(started.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64);
            spent[i].0 += started.elapsed();
            spent[i].1 += n;
            match (cpu_before, t.server_cpu_us().await?) {
                (Some(a), Some(b)) => spent[i].2 += b - a,
                _ => server_measured = false,
            }
        }
        empty_scripts_round(t, 1, per, &mut empty).await?;
        checked_raw_round(t, 1, per, &mut checked).await?;
    }
    let mut rt = Vec::new();
    let started = Instant::now();
    while started.elapsed() < per.max(Duration::from_millis(200)) {
        let at = Instant::now();
        t.raw.ping().await?;
        rt.push(at.elapsed());
    }
    let layer_us = lock_layer_us(per.max(Duration::from_millis(200))).await?;
    let rate = |(wall, n, _): (Duration, u64, f64)| n as f64 / wall.as_secs_f64();
    let cpu = |(_, n, us): (Duration, u64, f64)| us / n.max(1) as f64;
    let [p, r, b] = spent;
    let [polylock_means, raw_means, backend_means] = means;
    Ok(Cycle {
        polylock: Summary::of(&mine),
        raw: Summary::of(&raw),
        polylock_per_s: rate(p),
        raw_per_s: rate(r),
        ratio: rate(p) / rate(r),
        round_trip: Summary::of(&rt),
        backend_per_s: rate(b),
        layer_us,
        server: (server_measured && empty.1 > 0).then(|| ServerCpu {
            polylock_us_per_cycle: cpu(p),
            raw_us_per_cycle: cpu(r),
            polylock_busy: p.2 / 1e6 / p.0.as_secs_f64().max(f64::MIN_POSITIVE),
            empty_scripts_us_per_cycle: empty.0 / empty.1 as f64,
        }),
        checked_raw_per_s: checked_rate(checked),
        round_means_us: RoundMeans {
            polylock: polylock_means,
            raw: raw_means,
            backend: backend_means,
        },
    })
}

async fn one_cycle(locker: &Locker, name: &str) -> Res<()> {
    let g = locker
        .lock(name)
        .ttl(TTL)
        .try_acquire()
        .await
        .map_err(lock_err("acquire"))?
        .ok_or_else(|| format!("`{name}` is held by someone else"))?;
    g.release().await.map_err(lock_err("release"))
}

/// The request [`one_cycle`] makes, straight through the backend trait.
async fn backend_cycle(locker: &Locker, name: &str) -> Res<()> {
    let req = lock_core::AcquireRequest::new(
        lock_core::LockName::new(name).map_err(lock_err("name"))?,
        lock_core::OwnerToken::random(),
        TTL,
        Duration::ZERO,
    )
    .map_err(lock_err("request"))?;
    let backend = locker.backend();
    let lease = backend
        .try_acquire(&req)
        .await
        .map_err(lock_err("acquire"))?
        .ok_or_else(|| format!("`{name}` is held by someone else"))?;
    backend.release(&lease).await.map_err(lock_err("release"))
}

/// µs per `Locker` cycle over the in-memory backend, for `d`.
async fn lock_layer_us(d: Duration) -> Res<f64> {
    let locker = Locker::new(lock_core::MemoryBackend::new());
    for _ in 0..100 {
        one_cycle(&locker, "bench/layer").await?;
    }
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < d {
        one_cycle(&locker, "bench/layer").await?;
        n += 1;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64)
}

/// Many tasks on distinct names through one client.
#[derive(Clone, Debug, Serialize)]
pub struct Parallel {
    /// How many tasks.
    pub tasks: usize,
    /// polylock cycles per second, all tasks together.
    pub polylock_per_s: f64,
    /// The raw driver's cycles per second, same tasks, requests in flight
    /// together on one client (pipelined where the driver multiplexes).
    pub raw_per_s: f64,
    /// `polylock_per_s / raw_per_s`.
    pub ratio: f64,
    /// The same tasks calling the backend trait directly (no `Locker`,
    /// guard or watchdog), cycles per second.
    pub backend_per_s: f64,
    /// This process's CPU per cycle on each side: the client's cost of a
    /// cycle, which on a machine whose cores the server shares is taken
    /// from the server too.
    pub client_cpu: ClientCpu,
    /// Where the server's command thread can be measured (Redis: see
    /// `Target::server_cpu_us`), its CPU time per cycle.
    pub server: Option<ServerCpu>,
    /// As [`Cycle::checked_raw_per_s`], with the same tasks.
    pub checked_raw_per_s: Option<f64>,
    /// The wall time per cycle (all tasks together) of each round, per
    /// side, in µs: how much the machine moved the figures between
    /// interleaved rounds, so that a split of the gap can be told from noise.
    pub round_means_us: RoundMeans,
}

/// The bench process's CPU (user + system, every thread) per cycle during
/// the many-tasks rounds, in µs.
#[derive(Clone, Debug, Serialize)]
pub struct ClientCpu {
    /// Through the `Locker`.
    pub polylock_us_per_cycle: f64,
    /// The backend trait called directly.
    pub backend_us_per_cycle: f64,
    /// The raw driver.
    pub raw_us_per_cycle: f64,
}

/// The server's command thread during the many-tasks rounds.
#[derive(Clone, Debug, Serialize)]
pub struct ServerCpu {
    /// CPU µs per polylock cycle.
    pub polylock_us_per_cycle: f64,
    /// CPU µs per raw cycle.
    pub raw_us_per_cycle: f64,
    /// Share of the polylock rounds' time the thread was busy (summed over
    /// nodes for Redlock, so up to the node count).
    pub polylock_busy: f64,
    /// CPU µs per cycle of two scripts that do nothing, sent as polylock's
    /// are and by as many tasks (`Raw::empty_scripts_cycle`): the part of
    /// polylock's script time that is the server's cost of running a script
    /// at all.
    pub empty_scripts_us_per_cycle: f64,
}

/// A raw cycle that only some services have, run in turns of its own
/// between the other sides' rounds.
#[derive(Clone, Copy)]
enum ExtraTurn {
    /// `Raw::empty_scripts_cycle` (Redis).
    EmptyScripts,
    /// `Raw::checked_cycle` (etcd).
    Checked,
}

impl ExtraTurn {
    /// One cycle on `name`; `None` where the service has no such cycle.
    async fn cycle(self, raw: &super::target::Raw, name: &str) -> Res<Option<()>> {
        match self {
            ExtraTurn::EmptyScripts => raw.empty_scripts_cycle(name).await,
            ExtraTurn::Checked => raw.checked_cycle(name).await,
        }
    }

    /// One cycle before the timed part, which loads what it needs (a
    /// script) outside the measurement; false where the service has no
    /// such cycle.
    async fn ready(self, t: &Target) -> Res<bool> {
        Ok(self.cycle(&t.raw, "bench/extra").await?.is_some())
    }

    /// `tasks` tasks running this turn's cycle until `d` has passed: the
    /// cycles done. Call [`ready`](Self::ready) first.
    async fn run(self, t: &Target, tasks: usize, d: Duration) -> Res<u64> {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Instant::now() + d;
        let mut handles = Vec::new();
        for i in 0..tasks {
            let (done, raw) = (done.clone(), t.raw.clone());
            handles.push(tokio::spawn(async move {
                let name = format!("bench/extra/{i}");
                while Instant::now() < stop {
                    self.cycle(&raw, &name).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, String>(())
            }));
        }
        for h in handles {
            h.await.map_err(|e| e.to_string())??;
        }
        Ok(done.load(Ordering::Relaxed))
    }
}

/// One round of `tasks` tasks running `Raw::empty_scripts_cycle` for
/// `d`, taken between the other sides' rounds: the server's CPU µs and the
/// cycles, added to `sum`. Nothing where the server has no scripts or no
/// CPU counter.
async fn empty_scripts_round(
    t: &Target,
    tasks: usize,
    d: Duration,
    sum: &mut (f64, u64),
) -> Res<()> {
    let turn = ExtraTurn::EmptyScripts;
    if !turn.ready(t).await? {
        return Ok(());
    }
    let Some(before) = t.server_cpu_us().await? else {
        return Ok(());
    };
    let n = turn.run(t, tasks, d).await?;
    if let Some(after) = t.server_cpu_us().await? {
        sum.0 += after - before;
        sum.1 += n;
    }
    Ok(())
}

/// One round of `tasks` tasks running `Raw::checked_cycle` for `d`, taken
/// between the other sides' rounds: wall seconds and cycles, added to
/// `sum`. Nothing where raw's release needs no costlier check.
async fn checked_raw_round(t: &Target, tasks: usize, d: Duration, sum: &mut (f64, u64)) -> Res<()> {
    let turn = ExtraTurn::Checked;
    if !turn.ready(t).await? {
        return Ok(());
    }
    let started = Instant::now();
    let n = turn.run(t, tasks, d).await?;
    sum.0 += started.elapsed().as_secs_f64();
    sum.1 += n;
    Ok(())
}

/// Cycles per second of what [`checked_raw_round`] summed, if anything.
fn checked_rate((wall, n): (f64, u64)) -> Option<f64> {
    (n > 0).then(|| n as f64 / wall.max(f64::MIN_POSITIVE))
}

pub(crate) async fn parallel(
    t: &Target,
    locker: &Locker,
    tasks: usize,
    d: Duration,
) -> Res<Parallel> {
    use Side::*;
    // Six rounds (each order twice) give a spread to judge a split of the
    // gap by; a round shorter than 100 ms is mostly its ramp-up and drain.
    let rounds = 6;
    let per = (d / (3 * rounds as u32)).max(Duration::from_millis(100));
    // Per side (polylock, raw, backend): wall time, cycles, server CPU µs,
    // this process's CPU µs.
    let mut spent = [(0.0f64, 0u64, 0.0f64, 0.0f64); 3];
    let mut means = [Vec::new(), Vec::new(), Vec::new()];
    let mut server_measured = true;
    // Server CPU µs and cycles of the empty scripts (Redis).
    let mut empty = (0.0, 0u64);
    // Wall seconds and cycles of raw with a checked release (etcd).
    let mut checked = (0.0, 0u64);
    let orders = [
        [Polylock, Raw, Backend],
        [Raw, Backend, Polylock],
        [Backend, Polylock, Raw],
    ];
    for r in 0..rounds {
        for side in orders[r % 3] {
            let cpu_before = t.server_cpu_us().await?;
            let client_before = client_cpu_us()?;
            let done = Arc::new(AtomicU64::new(0));
            let stop = Instant::now() + per;
            let mut handles = Vec::new();
            for i in 0..tasks {
                let (done, locker, raw) = (done.clone(), locker.clone(), t.raw.clone());
                handles.push(tokio::spawn(async move {
                    let name = format!("bench/par/{i}");
                    while Instant::now() < stop {
                        match side {
                            Polylock => one_cycle(&locker, &name).await?,
                            Raw => raw.cycle(&name).await?,
                            Backend => backend_cycle(&locker, &name).await?,
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok::<_, String>(())
                }));
            }
            let started = Instant::now();
            for h in handles {
                h.await.map_err(|e| e.to_string())??;
            }
            let (wall, n) = (
                started.elapsed().as_secs_f64(),
                done.load(Ordering::Relaxed),
            );
            means[side as usize].push(wall * 1e6 / n.max(1) as f64);
            let m = &mut spent[side as usize];
            m.0 += wall;
            m.1 += n;
            m.3 += client_cpu_us()? - client_before;
            match (cpu_before, t.server_cpu_us().await?) {
                (Some(a), Some(b)) => m.2 += b - a,
                _ => server_measured = false,
            }
        }
        empty_scripts_round(t, tasks, per, &mut empty).await?;
        checked_raw_round(t, tasks, per, &mut checked).await?;
    }
    let rate = |(wall, n, _, _): (f64, u64, f64, f64)| n as f64 / wall.max(f64::MIN_POSITIVE);
    let per_cycle = |us: f64, n: u64| us / n.max(1) as f64;
    let [p, r, b] = spent;
    let [polylock_means, raw_means, backend_means] = means;
    Ok(Parallel {
        tasks,
        polylock_per_s: rate(p),
        raw_per_s: rate(r),
        ratio: rate(p) / rate(r),
        backend_per_s: rate(b),
        client_cpu: ClientCpu {
            polylock_us_per_cycle: per_cycle(p.3, p.1),
            backend_us_per_cycle: per_cycle(b.3, b.1),
            raw_us_per_cycle: per_cycle(r.3, r.1),
        },
        server: (server_measured && empty.1 > 0).then(|| ServerCpu {
            polylock_us_per_cycle: per_cycle(p.2, p.1),
            raw_us_per_cycle: per_cycle(r.2, r.1),
            polylock_busy: p.2 / 1e6 / p.0.max(f64::MIN_POSITIVE),
            empty_scripts_us_per_cycle: per_cycle(empty.0, empty.1),
        }),
        checked_raw_per_s: checked_rate(checked),
        round_means_us: RoundMeans {
            polylock: polylock_means,
            raw: raw_means,
            backend: backend_means,
        },
    })
}

/// CPU time this process has used so far (user + system, all threads), in
/// µs: the client's side of a measurement.
fn client_cpu_us() -> Res<f64> {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_SELF).map_err(|e| format!("getrusage: {e}"))?;
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
    Ok(us(u.user_time()) + us(u.system_time()))
}

/// The hand-off between two clients: one holds, the other waits queued,
/// the holder releases. Two clients and no other load, so that what it
/// measures is the lock's hand-off path (release, wake-up, grant), not the
/// scheduling of eight contending workers on a small machine (the
/// contention rounds report that one too).
#[derive(Clone, Debug, Serialize)]
pub struct Handoff {
    /// Rounds measured.
    pub rounds: usize,
    /// From the start of the holder's release to the waiter's acquire
    /// returning.
    pub handoff: Summary,
    /// A raw round trip (as in [`Cycle::round_trip`]) sent after the same
    /// idle time as the release: processes and threads that slept wake up
    /// on every hop of a hand-off, which the back-to-back round trip of a
    /// busy loop does not pay.
    pub idle_round_trip: Summary,
    /// The same hand-off through the raw driver, in rounds of the same
    /// shape: the floor the service and driver set (see
    /// `target/floor.rs`); none where waiters poll.
    pub raw: Option<Summary>,
    /// Rounds skipped because a request failed with a retryable error.
    pub transient_errors: u64,
}

/// How long the waiter is given to be queued before the holder releases:
/// a few round trips on every backend, even on a loaded machine.
pub(crate) const QUEUED: Duration = Duration::from_millis(20);

pub(crate) async fn handoff(t: &Target, d: Duration) -> Res<Handoff> {
    let holder = polylock::connect(&t.url)
        .await
        .map_err(lock_err("connect"))?;
    let waiter = polylock::connect(&t.url)
        .await
        .map_err(lock_err("connect"))?;
    let name = "bench/handoff";
    for _ in 0..5 {
        one_cycle(&holder, name).await?;
        one_cycle(&waiter, name).await?;
    }
    // A round lasts QUEUED and a little more.
    let rounds = ((d.as_millis() / (QUEUED.as_millis() + 5)) as usize).clamp(20, 200);
    let (mut samples, mut transient) = (Vec::with_capacity(rounds), 0);
    let mut idle = Vec::with_capacity(rounds);
    let block = (rounds / 4).max(1);
    let (mut raw, mut raw_done) = (Some(Vec::with_capacity(rounds)), 0);
    while samples.len() < rounds {
        sleep(QUEUED).await;
        let at = Instant::now();
        t.raw.ping().await?;
        idle.push(at.elapsed());
        let g = match holder.lock(name).ttl(TTL).try_acquire().await {
            Ok(Some(g)) => g,
            Ok(None) => return Err(format!("`{name}` is held by someone else")),
            Err(e) if e.is_retryable() => {
                transient += 1;
                continue;
            }
            Err(e) => return Err(lock_err("acquire")(e)),
        };
        let w = waiter.clone();
        let queued = tokio::spawn(async move {
            let got = w
                .lock(name)
                .ttl(TTL)
                .wait(Duration::from_secs(10))
                .acquire()
                .await;
            (Instant::now(), got)
        });
        sleep(QUEUED).await;
        let released = Instant::now();
        let gave_back = g.release().await;
        let (at, got) = queued.await.map_err(|e| e.to_string())?;
        let next = match got {
            Ok(next) => next,
            Err(e) if e.is_retryable() => {
                transient += 1;
                continue;
            }
            Err(e) => return Err(lock_err("acquire as the waiter")(e)),
        };
        match gave_back {
            Ok(()) => samples.push(at - released),
            Err(e) if e.is_retryable() => transient += 1,
            Err(e) => return Err(lock_err("release")(e)),
        }
        match next.release().await {
            Ok(()) => {}
            Err(e) if e.is_retryable() => transient += 1,
            Err(e) => return Err(lock_err("release as the waiter")(e)),
        }
        // The raw hand-off in blocks between polylock's, so that a change
        // of load hits both alike.
        if samples.len() % block == 0 && samples.len() > raw_done {
            raw_done = samples.len();
            if let Some(r) = raw.as_mut() {
                match t.raw_handoff(block).await? {
                    Some(more) => r.extend(more),
                    None => raw = None,
                }
            }
        }
    }
    if let Some(r) = raw.as_mut() {
        if r.len() < rounds {
            r.extend(t.raw_handoff(rounds - r.len()).await?.unwrap_or_default());
        }
    }
    Ok(Handoff {
        rounds,
        handoff: Summary::of(&samples),
        idle_round_trip: Summary::of(&idle),
        raw: raw.as_deref().map(Summary::of),
        transient_errors: transient,
    })
}

/// Workers contending for one name.
#[derive(Clone, Debug, Serialize)]
pub struct Contention {
    /// How many workers, each with its own client.
    pub workers: usize,
    /// How long each holds the lock, in milliseconds.
    pub hold_ms: u64,
    /// The mean hold actually spent, in microseconds.
    pub hold_actual_us: f64,
    /// Acquisitions per second, all workers together.
    pub acquisitions_per_s: f64,
    /// From the start of a release to the next holder's acquire returning,
    /// when the next holder is another worker.
    pub handoff: Summary,
    /// From a worker asking to the worker holding.
    pub wait: Summary,
    /// Share of acquisitions that went to the worker that released last.
    pub releaser_reacquired: f64,
    /// Acquires or releases that failed with a retryable error (timeouts
    /// on a loaded machine); the worker went on.
    pub transient_errors: u64,
}

pub(crate) async fn contention(
    t: &Target,
    workers: usize,
    hold: Duration,
    d: Duration,
) -> Res<Contention> {
    let mut lockers = Vec::new();
    for _ in 0..workers {
        lockers.push(
            polylock::connect(&t.url)
                .await
                .map_err(lock_err("connect"))?,
        );
    }
    let name = format!("bench/contended/{}", hold.as_millis());
    let last: Arc<Mutex<Option<(usize, Instant)>>> = Arc::new(Mutex::new(None));
    let samples = Arc::new(Mutex::new((
        Vec::new(),
        Vec::new(),
        0u64,
        0u64,
        Duration::ZERO,
        0u64,
    )));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let started = Instant::now();
    for (me, locker) in lockers.into_iter().enumerate() {
        let (last, samples, stop, name) =
            (last.clone(), samples.clone(), stop.clone(), name.clone());
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let g = match locker
                    .lock(&name)
                    .ttl(TTL)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                {
                    Ok(g) => g,
                    // A loaded shared machine makes requests time out now
                    // and then: counted and reported, not fatal.
                    Err(e) if e.is_retryable() => {
                        samples.lock().unwrap().5 += 1;
                        continue;
                    }
                    Err(e) => return Err(lock_err("acquire under contention")(e)),
                };
                let got = Instant::now();
                let prev = *last.lock().unwrap();
                {
                    let mut s = samples.lock().unwrap();
                    s.1.push(got - asked);
                    s.2 += 1;
                    match prev {
                        Some((w, _)) if w == me => s.3 += 1,
                        Some((_, at)) => s.0.push(got - at),
                        None => {}
                    }
                }
                // Busy for the hold, yielding: tokio's timer rounds a
                // 1 ms sleep up to the next millisecond tick (1-2 ms),
                // which would measure the timer instead of the lock.
                let held_at = Instant::now();
                while held_at.elapsed() < hold {
                    tokio::task::yield_now().await;
                }
                samples.lock().unwrap().4 += held_at.elapsed();
                *last.lock().unwrap() = Some((me, Instant::now()));
                match g.release().await {
                    Ok(()) => {}
                    Err(e) if e.is_retryable() => samples.lock().unwrap().5 += 1,
                    Err(e) => return Err(lock_err("release")(e)),
                }
            }
            Ok::<_, String>(())
        }));
    }
    sleep(d).await;
    stop.store(true, Ordering::Relaxed);
    let counted_until = Instant::now();
    let taken = {
        let s = samples.lock().unwrap();
        s.2
    };
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    let s = samples.lock().unwrap();
    Ok(Contention {
        workers,
        hold_ms: hold.as_millis() as u64,
        hold_actual_us: if s.2 == 0 {
            0.0
        } else {
            s.4.as_secs_f64() * 1e6 / s.2 as f64
        },
        acquisitions_per_s: taken as f64 / (counted_until - started).as_secs_f64(),
        handoff: Summary::of(&s.0),
        wait: Summary::of(&s.1),
        releaser_reacquired: if s.2 == 0 {
            0.0
        } else {
            s.3 as f64 / s.2 as f64
        },
        transient_errors: s.5,
    })
}

/// Many locks held at once by one client.
#[derive(Clone, Debug, Serialize)]
pub struct Held {
    /// How many locks.
    pub locks: usize,
    /// The TTL they were taken with, in seconds.
    pub ttl_s: f64,
    /// Requests per second the server counted while they were held (its
    /// own counters: Redis INFO commandstats, etcd /metrics, pg_stat_database,
    /// MariaDB's Questions, ZooKeeper's mntr); `None` without a server.
    pub server_requests_per_s: Option<f64>,
    /// How long one of those requests held the server, in µs on average
    /// (Redis: its scripts' time by `INFO commandstats`, which a script
    /// blocks the server for); `None` for the other servers.
    pub server_us_per_request: Option<f64>,
    /// Client heap bytes per held lock (the bench binary's counting
    /// allocator); `None` when the binary counts nothing.
    pub client_bytes_per_lock: Option<f64>,
    /// Whether every lock was still held at the end.
    pub all_held: bool,
    /// Why a server given by `--url` did not let its request counter be
    /// read (ZooKeeper without `mntr` allowed, etcd without `/metrics` on
    /// its client port); `None` when it was read or there is no server.
    pub counters_unread: Option<String>,
}

/// The heap's size once it stops shrinking: what earlier phases dropped
/// (their clients, tasks and buffers) is freed in the background, and a
/// baseline taken meanwhile would count those frees against what comes
/// next. Gives up waiting after two seconds.
async fn settled(allocated: fn() -> usize) -> usize {
    let mut last = allocated();
    for _ in 0..20 {
        sleep(Duration::from_millis(100)).await;
        let now = allocated();
        if now >= last {
            return now;
        }
        last = now;
    }
    last
}

pub(crate) async fn held(
    t: &Target,
    locks: usize,
    ttl: Duration,
    allocated: Option<fn() -> usize>,
) -> Res<Held> {
    let locker = polylock::connect(&t.url)
        .await
        .map_err(lock_err("connect"))?;
    // Settle the connection before the baseline.
    one_cycle(&locker, "bench/held/warm").await?;
    let before = match allocated {
        Some(f) => Some(settled(f).await),
        None => None,
    };
    let guards: Vec<_> = futures::stream::iter(0..locks)
        .map(|i| {
            let locker = locker.clone();
            async move {
                locker
                    .lock(format!("bench/held/{locks}/{i}"))
                    .ttl(ttl)
                    .acquire()
                    .await
                    .map_err(lock_err("acquire a held lock"))
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Res<_>>()?;
    let bytes = match (before, allocated) {
        // Below the baseline: something else freed memory meanwhile, and
        // the difference says nothing about the locks.
        (Some(b), Some(f)) => f().checked_sub(b).map(|grown| grown as f64 / locks as f64),
        _ => None,
    };
    // Let the renewals of the acquisition burst spread out, then count
    // over one full TTL (three renewal periods).
    sleep(ttl / 3).await;
    let mut counters_unread = None;
    let mut requests_now = async || match t.server_requests().await {
        Ok(n) => Ok(n),
        // A server the bench did not start may keep its counters to
        // itself: the figure is missing, the run goes on.
        Err(e) if t.connected.is_some() => {
            counters_unread = Some(e);
            Ok(None)
        }
        Err(e) => Err(e),
    };
    let (c0, us0) = (requests_now().await?, t.server_script_us().await?);
    let at = Instant::now();
    sleep(ttl).await;
    let (c1, us1) = (requests_now().await?, t.server_script_us().await?);
    let secs = at.elapsed().as_secs_f64();
    let requests = match (c0, c1) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let rate = requests.map(|n| n as f64 / secs);
    let us_per_request = match (requests, us0, us1) {
        (Some(n), Some(a), Some(b)) if n > 0 => Some(b.saturating_sub(a) as f64 / n as f64),
        _ => None,
    };
    let held_to_the_end = guards.iter().all(|g| g.is_held());
    // A lock the watchdog could not keep is a result (reported as not all
    // held), not a failure of the run: its release says Lost.
    let released = futures::stream::iter(guards)
        .map(|g| async move {
            match g.release().await {
                Ok(()) => Ok(true),
                Err(lock_core::LockError::Lost { .. }) => Ok(false),
                Err(e) => Err(lock_err("release a held lock")(e)),
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Res<Vec<bool>>>()?;
    let all_held = held_to_the_end && released.iter().all(|&r| r);
    Ok(Held {
        locks,
        ttl_s: ttl.as_secs_f64(),
        server_requests_per_s: rate,
        server_us_per_request: us_per_request,
        client_bytes_per_lock: bytes,
        all_held,
        counters_unread,
    })
}

#[cfg(test)]
mod tests {
    use super::RoundMeans;

    #[test]
    fn the_standard_error_of_a_difference_adds_both_sides_variances() {
        // Each side: sample variance 2.5 over 5 rounds, so 0.5 for its mean.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [11.0, 12.0, 13.0, 14.0, 15.0];
        let se = RoundMeans::std_error_of_difference(&a, &b);
        assert!((se - 1.0).abs() < 1e-12, "{se}");
        // Rounds that all agree leave no noise; a single round says nothing.
        assert_eq!(
            RoundMeans::std_error_of_difference(&[3.0; 4], &[7.0; 4]),
            0.0
        );
        assert_eq!(RoundMeans::std_error_of_difference(&[3.0], &[7.0]), 0.0);
    }
}
