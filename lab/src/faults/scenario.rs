//! The scenarios: plain async functions over a [`Ctx`], each selected by
//! what the backend declares and what its fixture can do — never by its
//! name.
//!
//! Every scenario has the same cast: client `a` holds the lock when the
//! fault starts, client `b` is already waiting for it. The harness marks
//! the fault's start and end on the register's clock; [`analyse`] turns
//! the register's events into an [`Observation`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lock_core::{ExpiryClock, Guarantees};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use testkit::register::{report, Event, EventKind, Register};
use testkit::{Mode, Proxy};

use super::target::Target;

/// What kind of fault a scenario injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SIGSTOP the holder past its TTL, then SIGCONT (a long GC pause).
    ClientPause,
    /// SIGKILL the holder (a crash).
    ClientKill,
    /// SIGKILL every server process and start it again on its data.
    ServerRestart,
    /// SIGSTOP every server process past the TTL, then SIGCONT.
    ServerPause,
    /// An operator removes the lock behind its holder's back.
    ForcedRelease,
    /// The holder's connections go silent (no FIN, no RST) past the TTL.
    Blackhole,
    /// The holder's connections are reset (RST), then allowed again.
    Reset,
    /// Every byte to and from the holder is delayed by 40% of the TTL.
    Latency,
    /// A minority of the servers (the leader first where the fixture can
    /// tell) killed for twice the TTL, then restarted.
    MinorityLoss,
    /// One follower (a member that is not the leader, as the group names
    /// it) killed for twice the TTL, then restarted.
    FollowerLoss,
    /// A majority of the servers killed and restarted at once, on what
    /// they had persisted.
    MajorityRestart,
    /// The wall clock that judges expiry steps forward past the TTL: the
    /// clients' (SQLite) or, on a deployment started with its servers on a
    /// faked clock, the servers'.
    ClockStep,
    /// The lock's fencing counter deleted from the server while the lock
    /// is held (an eviction, an operator's cleanup).
    FenceEvicted,
    /// The replica stops receiving (its link cut) before the holder's acquire; the
    /// primary dies and the replica is promoted, the clients' address
    /// repointed at it.
    Failover,
}

/// One scenario of the suite.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Stable id (JSON key, file names).
    pub id: &'static str,
    /// Row title in the observed table.
    pub title: &'static str,
    /// Part of the quick subset (CI).
    pub quick: bool,
    /// The fault.
    pub kind: Kind,
}

/// Every scenario, in table order.
pub const SCENARIOS: [Scenario; 14] = [
    Scenario {
        id: "client-pause",
        title: "client paused past the TTL (SIGSTOP, GC pause)",
        quick: true,
        kind: Kind::ClientPause,
    },
    Scenario {
        id: "client-kill",
        title: "client killed (SIGKILL)",
        quick: true,
        kind: Kind::ClientKill,
    },
    Scenario {
        id: "server-restart",
        title: "server killed and restarted on its data (TTL 5 s, or the backend's shortest if longer)",
        quick: true,
        kind: Kind::ServerRestart,
    },
    Scenario {
        id: "server-pause",
        title: "server paused past the TTL (SIGSTOP)",
        quick: false,
        kind: Kind::ServerPause,
    },
    Scenario {
        id: "forced-release",
        title: "operator forced release",
        quick: false,
        kind: Kind::ForcedRelease,
    },
    Scenario {
        id: "blackhole",
        title: "holder's connection blackholed past the TTL",
        quick: false,
        kind: Kind::Blackhole,
    },
    Scenario {
        id: "reset",
        title: "holder's connection reset (RST)",
        quick: false,
        kind: Kind::Reset,
    },
    Scenario {
        id: "latency",
        title: "latency near the TTL on the holder's link (40% each way)",
        quick: false,
        kind: Kind::Latency,
    },
    Scenario {
        id: "minority-loss",
        title: "a minority of the servers killed (the leader first where the group names it), \
                restarted after 2 TTLs (TTL 5 s, or the backend's shortest if longer)",
        quick: false,
        kind: Kind::MinorityLoss,
    },
    Scenario {
        id: "follower-loss",
        title: "one follower killed (the group names its leader), restarted after 2 TTLs \
                (TTL 5 s, or the backend's shortest if longer)",
        quick: false,
        kind: Kind::FollowerLoss,
    },
    Scenario {
        id: "majority-restart",
        title: "a majority of the servers killed and restarted at once (TTL 5 s, or the backend's shortest if longer)",
        quick: false,
        kind: Kind::MajorityRestart,
    },
    Scenario {
        id: "clock-step",
        title: "the wall clock stepped forward past the TTL (the clients' for SQLite, the \
                server's elsewhere)",
        quick: false,
        kind: Kind::ClockStep,
    },
    Scenario {
        id: "fence-evicted",
        title: "the fencing counter deleted (evicted) while the lock is held",
        quick: false,
        kind: Kind::FenceEvicted,
    },
    // Last: it kills the primary, which no later scenario gets back.
    Scenario {
        id: "failover",
        title: "primary lost, replica that missed the acquire promoted",
        quick: false,
        kind: Kind::Failover,
    },
];

/// libfaketime, which steps the clock of the processes it is preloaded
/// into (Debian's `faketime` package).
const LIBFAKETIME: &str = testkit::LIBFAKETIME;

impl Scenario {
    /// `Err(why)` when the scenario cannot apply to `target`.
    pub fn applies(&self, target: &Target) -> Result<(), String> {
        match self.kind {
            Kind::ClientPause | Kind::ClientKill => Ok(()),
            Kind::ServerRestart | Kind::ServerPause if target.processes().is_empty() => {
                Err("no server: the database runs inside each client".into())
            }
            Kind::ServerRestart | Kind::ServerPause => Ok(()),
            Kind::ForcedRelease if !target.guarantees().force_release => {
                Err("the backend declares no force release".into())
            }
            Kind::ForcedRelease => Ok(()),
            Kind::Blackhole | Kind::Reset | Kind::Latency if target.addrs().is_empty() => {
                Err("no network between the client and the database".into())
            }
            Kind::Blackhole | Kind::Reset | Kind::Latency => Ok(()),
            Kind::MinorityLoss | Kind::MajorityRestart if target.processes().len() < 3 => {
                Err("fewer than three servers".into())
            }
            Kind::MinorityLoss | Kind::MajorityRestart => Ok(()),
            Kind::FollowerLoss if !target.names_its_leader() => {
                Err("not a group that names its leader".into())
            }
            Kind::FollowerLoss => Ok(()),
            Kind::FenceEvicted if target.fence_stores().is_empty() => {
                Err("the fencing counter is not a key that can be deleted or evicted".into())
            }
            Kind::FenceEvicted => Ok(()),
            Kind::Failover if target.replicated().is_none() => {
                Err("no replica to fail over to".into())
            }
            Kind::Failover => Ok(()),
            Kind::ClockStep if target.server_clock().is_some() => Ok(()),
            Kind::ClockStep => match target.guarantees().expiry_clock {
                // The clients' own clock: libfaketime steps it.
                ExpiryClock::ClientHost if Path::new(LIBFAKETIME).exists() => Ok(()),
                ExpiryClock::ClientHost => Err(format!("{LIBFAKETIME} is not installed")),
                _ => Err("the servers do not run on a faked clock".into()),
            },
        }
    }

    /// Whether the scenario runs on a deployment of its own, started for it
    /// with its servers on a faked wall clock: a step of the clock that
    /// judges expiry, where a server's clock judges it, or where a
    /// monotonic timer does and the step must be shown not to matter.
    pub fn wants_server_clock(&self, g: &Guarantees) -> bool {
        self.kind == Kind::ClockStep && g.expiry_clock != ExpiryClock::ClientHost
    }

    /// The TTL the clients ask for: the target's, except across a server
    /// restart or the loss of group members, which must fit in the lease
    /// for "survives restart" and "survives failover" to be testable on a
    /// loaded machine (crash recovery, or a group electing a new leader and
    /// its clients finding it, take seconds: with etcd's 2 s a leader loss
    /// can outlast the two thirds of the lease left after a renewal).
    pub fn ttl(&self, target: &Target) -> Duration {
        match self.kind {
            Kind::ServerRestart
            | Kind::MajorityRestart
            | Kind::MinorityLoss
            | Kind::FollowerLoss => target.guarantees().effective_ttl(Duration::from_secs(5)),
            _ => target.ttl(),
        }
    }

    /// Whether the fault may lose the lock service's data as the backend
    /// declares it (a restart or failover of a backend that does not
    /// survive one), so that fencing is only claimed "unless data is lost".
    pub fn may_lose_data(&self, g: &Guarantees) -> bool {
        match self.kind {
            Kind::ServerRestart | Kind::MajorityRestart => !g.survives_restart,
            // A backend that does not survive a failover (asynchronous
            // replication) loses what the replica had not received.
            Kind::Failover => !g.survives_failover,
            _ => false,
        }
    }
}

/// A client process and its id at the register.
#[derive(Debug)]
pub struct ClientProc {
    id: String,
    child: Child,
}

impl ClientProc {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX))
    }

    fn signal(&self, sig: Signal) -> Result<(), String> {
        kill(self.pid(), sig).map_err(|e| format!("{sig} to client {}: {e}", self.id))
    }
}

impl Drop for ClientProc {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped process.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How one scenario window went, on the register's clock.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// When the fault started.
    pub fault_start: Duration,
    /// When it ended (the same as the start for an instant fault).
    pub fault_end: Duration,
}

/// What a scenario sees: the backend, the register, and client processes.
pub struct Ctx<'a> {
    target: &'a Target,
    register: Register,
    exe: &'a Path,
    log_dir: &'a Path,
    scenario: &'static str,
    ttl: Duration,
    name: String,
    clients: Vec<ClientProc>,
    /// The holder's proxies (one per server), for the network faults.
    proxies: Vec<Proxy>,
    /// When set, clients start under libfaketime reading this file.
    clock_file: Option<PathBuf>,
}

/// Time allowed for a client process to start, connect and be granted a
/// free lock: generous for a loaded two-core machine.
const START_LIMIT: Duration = Duration::from_secs(60);

impl<'a> Ctx<'a> {
    /// A context with a fresh register and a lock name unique to this run.
    pub fn new(
        target: &'a Target,
        scenario: &Scenario,
        exe: &'a Path,
        log_dir: &'a Path,
    ) -> Result<Self, String> {
        let register = Register::start().map_err(|e| e.to_string())?;
        let run = std::process::id() ^ u32::from(register.addr().port());
        Ok(Ctx {
            target,
            register,
            exe,
            log_dir,
            scenario: scenario.id,
            ttl: scenario.ttl(target),
            name: format!("polylock-compare-{run:08x}/{}", scenario.id),
            clients: Vec::new(),
            proxies: Vec::new(),
            clock_file: None,
        })
    }

    /// The register.
    pub fn register(&self) -> &Register {
        &self.register
    }

    /// The TTL the clients ask for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Starts client `id`, which takes the lock `rounds` times and holds it
    /// for `hold` each time. Its stderr goes to a log in the run directory.
    pub fn spawn(&mut self, id: &str, hold: Duration, rounds: u32) -> Result<(), String> {
        let url = self.target.url().to_owned();
        self.spawn_with_url(id, hold, rounds, &url)
    }

    fn spawn_with_url(
        &mut self,
        id: &str,
        hold: Duration,
        rounds: u32,
        url: &str,
    ) -> Result<(), String> {
        let log_path = self.log_dir.join(format!(
            "{}-{}-{id}.log",
            self.target.label(),
            self.scenario
        ));
        let log = File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let mut cmd = Command::new(self.exe);
        if let Some(file) = &self.clock_file {
            cmd.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_NO_CACHE", "1")
                // Leases and tokio's timers run on the monotonic clock,
                // which a wall-clock step leaves alone.
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd
            .arg("client")
            .args(["--name", &self.name])
            .args(["--ttl", &format!("{}ms", self.ttl().as_millis())])
            .args(["--register", &self.register.addr().to_string()])
            .args(["--id", id])
            .args(["--hold", &format!("{}ms", hold.as_millis())])
            .args(["--rounds", &rounds.to_string()])
            // Not on the command line: the URL holds credentials, and
            // argv is public to every user of the machine.
            .env(URL_ENV, url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawning client {id}: {e}"))?;
        self.clients.push(ClientProc {
            id: id.to_owned(),
            child,
        });
        Ok(())
    }

    fn client(&self, id: &str) -> Result<&ClientProc, String> {
        self.clients
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| format!("no client {id}"))
    }

    /// SIGSTOP to client `id`.
    pub fn pause_client(&self, id: &str) -> Result<(), String> {
        self.client(id)?.signal(Signal::SIGSTOP)
    }

    /// SIGCONT to client `id`.
    pub fn resume_client(&self, id: &str) -> Result<(), String> {
        self.client(id)?.signal(Signal::SIGCONT)
    }

    /// SIGKILL to client `id`; the register learns its section ended.
    pub fn kill_client(&mut self, id: &str) -> Result<(), String> {
        let pos = self
            .clients
            .iter()
            .position(|c| c.id == id)
            .ok_or_else(|| format!("no client {id}"))?;
        let proc = self.clients.remove(pos);
        proc.signal(Signal::SIGKILL)?;
        // Dropping reaps it, so it is gone before the register hears.
        drop(proc);
        self.register.client_died(id);
        Ok(())
    }

    /// Waits until the register holds an event of `id` matching `pred`
    /// that arrived at or after `since`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads the register.
    pub async fn wait_for(
        &self,
        id: &str,
        since: Duration,
        limit: Duration,
        what: &str,
        pred: impl Fn(&EventKind) -> bool,
    ) -> Result<Duration, String> {
        let give_up = tokio::time::Instant::now() + limit;
        loop {
            if let Some(e) = self
                .register
                .events()
                .into_iter()
                .find(|e| e.client == id && e.at >= since && pred(&e.kind))
            {
                return Ok(e.at);
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(format!(
                    "{} {}: no {what} from {id} within {limit:?}",
                    self.target.label(),
                    self.scenario
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until client `id` reported its release (the end of a round).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`wait_for`](Ctx::wait_for).
    pub async fn wait_release(&self, id: &str, limit: Duration) -> Result<Duration, String> {
        self.wait_for(id, Duration::ZERO, limit, "RELEASE", |k| {
            matches!(k, EventKind::Release(_))
        })
        .await
    }

    /// Starts `a` holding for `hold`, waits until it is inside its critical
    /// section and has written once, then starts `b` waiting.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped call may leave clients running until the
    /// context is dropped.
    pub async fn holder_and_waiter(&mut self, hold: Duration) -> Result<(), String> {
        self.spawn("a", hold, 1)?;
        self.wait_waiter().await
    }

    /// [`holder_and_waiter`](Ctx::holder_and_waiter) with `a` connected
    /// through a proxy per server, for [`set_holder_link`](Ctx::set_holder_link).
    ///
    /// # Cancel safety
    /// As [`holder_and_waiter`](Ctx::holder_and_waiter).
    pub async fn proxied_holder_and_waiter(&mut self, hold: Duration) -> Result<(), String> {
        let mut pairs = Vec::new();
        for server in self.target.addrs() {
            let proxy = Proxy::start(server).map_err(|e| e.to_string())?;
            pairs.push((server, proxy.addr()));
            self.proxies.push(proxy);
        }
        let url = self.target.url_through(&pairs);
        self.spawn_with_url("a", hold, 1, &url)?;
        self.wait_waiter().await
    }

    /// Makes the clients started from now on read their wall clock through
    /// libfaketime, at no offset until [`step_clock`](Ctx::step_clock).
    pub fn fake_clock(&mut self) -> Result<(), String> {
        let file = self.log_dir.join(format!(
            "{}-{}-faketime",
            self.target.label(),
            self.scenario
        ));
        std::fs::write(&file, "+0\n").map_err(|e| format!("{}: {e}", file.display()))?;
        self.clock_file = Some(file);
        Ok(())
    }

    /// Steps the faked wall clock of the clients by `by` (forward).
    pub fn step_clock(&self, by: Duration) -> Result<(), String> {
        let file = self.clock_file.as_ref().ok_or("the clock is not faked")?;
        std::fs::write(file, format!("+{}\n", by.as_secs()))
            .map_err(|e| format!("{}: {e}", file.display()))
    }

    /// Sets what the holder's proxies do with its traffic.
    pub fn set_holder_link(&self, mode: Mode) {
        for p in &self.proxies {
            p.set_mode(mode);
        }
    }

    async fn wait_waiter(&mut self) -> Result<(), String> {
        self.wait_for("a", Duration::ZERO, START_LIMIT, "first WRITE", |k| {
            matches!(k, EventKind::Write { .. })
        })
        .await?;
        self.spawn("b", Duration::from_millis(200), 1)?;
        // b connects and starts waiting; the fault is meant for a held lock
        // with a queue behind it, not for a client still starting up.
        self.wait_for(
            "b",
            Duration::ZERO,
            START_LIMIT,
            "waiting note",
            |k| matches!(k, EventKind::Note(t) if t.starts_with("waiting")),
        )
        .await?;
        // Nor for a lock `a` already handed over while `b` started (a slow
        // machine): the run would test nothing, and pass.
        if let Some(e) =
            self.register.events().into_iter().find(|e| {
                e.client == "a" && matches!(e.kind, EventKind::Exit | EventKind::Release(_))
            })
        {
            return Err(format!(
                "{} {}: a left its critical section (at {:?}) before b was waiting; \
                 the fault would hit no holder",
                self.target.label(),
                self.scenario,
                e.at
            ));
        }
        Ok(())
    }

    fn servers(&self) -> Vec<&'a testkit::ServerProcess> {
        self.target.processes()
    }

    /// Kills `victims` for twice the TTL, then restarts them; the fault's
    /// marks name them.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped call may leave the victims down until the
    /// target is dropped.
    async fn lose_for_two_ttls(
        &self,
        victims: &[&'a testkit::ServerProcess],
        what: &str,
    ) -> Result<Window, String> {
        let ttl = self.ttl();
        let names: Vec<&str> = victims.iter().map(|s| s.name()).collect();
        let fault_start = self
            .register
            .mark(&format!("kill {what}: {}", names.join(", ")));
        let killed = victims
            .iter()
            .try_for_each(|s| s.kill().map_err(|e| e.to_string()));
        if killed.is_ok() {
            tokio::time::sleep(ttl * 2).await;
        }
        let restarted = restart_together(victims);
        let fault_end = self
            .register
            .mark(&format!("restarted: {}", names.join(", ")));
        killed?;
        restarted?;
        Ok(Window {
            fault_start,
            fault_end,
        })
    }
}

/// Restarts `servers` all at once (each on its own thread) and waits until
/// every one is ready: members of a group that lost its quorum only become
/// ready together.
fn restart_together(servers: &[&testkit::ServerProcess]) -> Result<(), String> {
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let handles: Vec<_> = servers
                .iter()
                .map(|s| scope.spawn(move || s.restart().map_err(|e| first_line(&e.to_string()))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("restart panicked".into())))
                .collect::<Result<Vec<()>, String>>()
                .map(drop)
        })
    })
}

/// A testkit error's first line: the rest is the server's log tail, which
/// the run directory keeps.
fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_owned()
}

/// The environment variable that hands the URL to a client process.
pub const URL_ENV: &str = "POLYLOCK_COMPARE_URL";

/// Runs `scenario` in `ctx` and returns its fault window.
///
/// # Cancel safety
/// Not cancel safe: a dropped run may leave a server paused or stopped;
/// drop the target afterwards.
pub async fn run(scenario: &Scenario, ctx: &mut Ctx<'_>) -> Result<Window, String> {
    let ttl = ctx.ttl();
    let recovery = ttl * 4 + Duration::from_secs(60);
    match scenario.kind {
        Kind::ClientPause => {
            // Held until the pause ends it (its lost signal after the
            // resume), however long `b` takes to start.
            ctx.holder_and_waiter(ttl * 30).await?;
            let fault_start = ctx.register.mark("pause a (SIGSTOP)");
            ctx.pause_client("a")?;
            // Keep a stopped until b has had its turn, and at least twice
            // the TTL, so the late write comes after the new holder's.
            let b_done = ctx.wait_release("b", recovery).await;
            let least = fault_start + ttl * 2;
            let now = ctx.register.now();
            if now < least {
                tokio::time::sleep(least - now).await;
            }
            let fault_end = ctx.register.mark("resume a (SIGCONT)");
            ctx.resume_client("a")?;
            b_done?;
            ctx.wait_release("a", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end,
            })
        }
        Kind::ClientKill => {
            ctx.holder_and_waiter(ttl * 30).await?;
            let fault_start = ctx.register.mark("kill a (SIGKILL)");
            ctx.kill_client("a")?;
            ctx.wait_release("b", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end: fault_start,
            })
        }
        Kind::ServerRestart => {
            ctx.holder_and_waiter(ttl * 3 / 2).await?;
            let fault_start = ctx.register.mark("kill the server (SIGKILL)");
            let restarted = restart_together(&ctx.servers());
            let fault_end = ctx.register.mark("server restarted and ready");
            restarted?;
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end,
            })
        }
        Kind::ServerPause => {
            ctx.holder_and_waiter(ttl * 4).await?;
            let fault_start = ctx.register.mark("pause the server (SIGSTOP)");
            let paused = ctx
                .servers()
                .iter()
                .try_for_each(|s| s.pause().map_err(|e| e.to_string()));
            if paused.is_ok() {
                tokio::time::sleep(ttl * 2).await;
            }
            let fault_end = ctx.register.mark("resume the server (SIGCONT)");
            let resumed = ctx
                .servers()
                .iter()
                .try_for_each(|s| s.resume().map_err(|e| e.to_string()));
            paused?;
            resumed?;
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end,
            })
        }
        Kind::Blackhole | Kind::Reset | Kind::Latency => {
            ctx.proxied_holder_and_waiter(ttl * 4).await?;
            let (mode, what, lasts) = match scenario.kind {
                Kind::Blackhole => (Mode::Blackhole, "blackhole a's link", ttl * 2),
                Kind::Reset => (
                    Mode::Reset,
                    "reset a's connections",
                    Duration::from_millis(300),
                ),
                _ => (Mode::Delay(ttl * 2 / 5), "delay a's link", ttl * 2),
            };
            let fault_start = ctx.register.mark(what);
            ctx.set_holder_link(mode);
            tokio::time::sleep(lasts).await;
            let fault_end = ctx.register.mark("a's link back to normal");
            ctx.set_holder_link(Mode::Pass);
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end,
            })
        }
        Kind::MinorityLoss => {
            ctx.holder_and_waiter(ttl * 4).await?;
            // Taken once: the order (leader first) changes once it is gone.
            let servers = ctx.servers();
            let n = servers.len();
            let leader = ctx.target.leader().map(|l| l.name().to_owned());
            let victims = &servers[..(n - 1) / 2];
            let what = match &leader {
                Some(l) if victims.iter().any(|v| v.name() == l) => {
                    "a minority of the servers, the leader first"
                }
                _ => "a minority of the servers",
            };
            let window = ctx.lose_for_two_ttls(victims, what).await?;
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(window)
        }
        Kind::FollowerLoss => {
            ctx.holder_and_waiter(ttl * 4).await?;
            let leader = ctx
                .target
                .leader()
                .ok_or("the group names no leader now")?
                .name()
                .to_owned();
            let follower = ctx
                .servers()
                .into_iter()
                .find(|s| s.name() != leader)
                .ok_or("no follower")?;
            let window = ctx
                .lose_for_two_ttls(&[follower], &format!("a follower (leader: {leader})"))
                .await?;
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(window)
        }
        Kind::MajorityRestart => {
            ctx.holder_and_waiter(ttl * 3 / 2).await?;
            // Taken once: the order (leader first) changes once it is gone.
            let servers = ctx.servers();
            let majority = &servers[..servers.len() / 2 + 1];
            let fault_start = ctx
                .register
                .mark("kill and restart a majority of the servers");
            // All killed first, then all started: a group whose members
            // come back one by one would keep a quorum alive.
            let killed = majority
                .iter()
                .try_for_each(|s| s.kill().map_err(|e| e.to_string()));
            let restarted = restart_together(majority);
            let fault_end = ctx.register.mark("the majority restarted");
            killed?;
            restarted?;
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end,
            })
        }
        Kind::ClockStep => {
            let server_clock = ctx.target.server_clock();
            if server_clock.is_none() {
                ctx.fake_clock()?;
            }
            ctx.holder_and_waiter(ttl * 3).await?;
            let by = ttl * 3 + Duration::from_secs(1);
            let fault_start = match server_clock {
                Some(clock) => {
                    let at = ctx.register.mark(&format!(
                        "step the server's wall clock forward {} s",
                        by.as_secs()
                    ));
                    clock.step(by).map_err(|e| e.to_string())?;
                    // Where the row's outcome would look the same had the
                    // step never reached the server, ask the server.
                    if let Some(lead) = ctx.target.server_clock_lead().await? {
                        ctx.register.mark(&format!(
                            "the server's wall clock reads {} s ahead",
                            lead.as_secs()
                        ));
                        if lead + Duration::from_secs(2) < by {
                            return Err(format!(
                                "the server's wall clock did not step: it reads {lead:?} \
                                 ahead of this machine's, {by:?} was asked"
                            ));
                        }
                    }
                    at
                }
                None => {
                    let at = ctx.register.mark(&format!(
                        "step the clients' wall clock forward {} s",
                        by.as_secs()
                    ));
                    ctx.step_clock(by)?;
                    at
                }
            };
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end: fault_start,
            })
        }
        Kind::FenceEvicted => {
            ctx.holder_and_waiter(ttl * 2).await?;
            let fault_start = ctx.register.mark("delete the lock's fencing counter");
            let name = ctx.name.clone();
            let target = ctx.target;
            let deleted = tokio::task::block_in_place(|| target.delete_fence_counters(&name))?;
            if deleted == 0 {
                return Err("no fencing counter found to delete".into());
            }
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end: fault_start,
            })
        }
        Kind::Failover => {
            let r = ctx.target.replicated().ok_or("no replica")?;
            ctx.register
                .mark("cut the replication link: the replica receives nothing more");
            r.cut_link();
            ctx.spawn("a", ttl * 4, 1)?;
            let write = |k: &EventKind| matches!(k, EventKind::Write { .. });
            // An acquire that waits for the replica cannot be acknowledged
            // now; one that does not is granted at once.
            let acked = ctx
                .wait_for("a", Duration::ZERO, ttl * 3, "first WRITE", write)
                .await;
            if acked.is_err() {
                ctx.register
                    .mark("a's acquire not acknowledged: heal the replication link");
                r.heal_link();
                ctx.wait_for("a", Duration::ZERO, START_LIMIT, "first WRITE", write)
                    .await?;
            }
            ctx.spawn("b", Duration::from_millis(200), 1)?;
            ctx.wait_for(
                "b",
                Duration::ZERO,
                START_LIMIT,
                "waiting note",
                |k| matches!(k, EventKind::Note(t) if t.starts_with("waiting")),
            )
            .await?;
            let fault_start = ctx
                .register
                .mark("kill the primary, promote the replica, point the clients at it");
            r.primary().kill().map_err(|e| e.to_string())?;
            tokio::task::block_in_place(|| r.fail_over())?;
            let fault_end = ctx.register.mark("replica promoted");
            ctx.wait_release("a", recovery).await?;
            // With WAIT, the promoted server has no replica left to
            // acknowledge b's acquire: b may never be granted, which is
            // what is recorded, not an error of the run.
            let _ = ctx.wait_release("b", ttl * 5).await;
            Ok(Window {
                fault_start,
                fault_end,
            })
        }
        Kind::ForcedRelease => {
            ctx.holder_and_waiter(ttl * 3).await?;
            let operator = polylock::connect_backend(ctx.target.url())
                .await
                .map_err(|e| format!("operator connect: {e}"))?;
            let name = lock_core::LockName::new(ctx.name.clone()).map_err(|e| e.to_string())?;
            let fault_start = ctx.register.mark("operator force_release");
            let removed = operator
                .force_release(&name)
                .await
                .map_err(|e| format!("force_release: {e}"))?;
            if !removed {
                return Err("force_release found no lock to remove".into());
            }
            ctx.wait_release("a", recovery).await?;
            ctx.wait_release("b", recovery).await?;
            Ok(Window {
                fault_start,
                fault_end: fault_start,
            })
        }
    }
}

/// What one scenario observed on one backend.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    /// Critical sections that overlapped while the earlier holder still
    /// believed it held the lock (no lost signal yet): mutual exclusion
    /// lost as the application sees it.
    pub overlaps: usize,
    /// Overlaps after the earlier holder's lost signal (it was told).
    pub overlaps_after_lost: usize,
    /// Writes the fence rejected.
    pub stale_rejected: usize,
    /// Stale writes the fence accepted (must be 0 where fencing holds).
    pub stale_accepted: usize,
    /// Writes accepted.
    pub writes_accepted: usize,
    /// Grants.
    pub grants: usize,
    /// Grants whose token was not above every earlier one.
    pub token_order_violations: usize,
    /// Fault start to `a`'s lost signal, milliseconds.
    pub fault_to_lost_ms: Option<u64>,
    /// `a`'s lost signal against its lease's local deadline, ms (positive:
    /// after it).
    pub lost_vs_deadline_ms: Option<i64>,
    /// Fault start to `b`'s grant, ms.
    pub fault_to_grant_ms: Option<u64>,
    /// Fault end to `b`'s grant, ms (negative: granted during the fault).
    pub fault_end_to_grant_ms: Option<i64>,
    /// What `a`'s release reported (`ok`, `lost`, `error`; none if killed).
    pub release: Option<String>,
    /// `a`'s lost signal fired before it released.
    pub lost_before_release: bool,
    /// The TTL `a` was granted, ms.
    pub granted_ttl_ms: Option<u64>,
    /// How long `a`'s lease was trusted from its request's send time, ms:
    /// its TTL less what the backend's clock policy takes off (drift,
    /// margin, a ZooKeeper ensemble's follower lag).
    pub trusted_ms: Option<u64>,
    /// How much earlier than `a`'s lease allowed the lock service let `b`
    /// in: `a`'s last grant or renewal request's send time + its TTL, minus
    /// `b`'s grant, ms (positive: the server expired `a`'s lease early;
    /// negative: on time, by that margin). `None` when `a` released first
    /// or `b` was never granted.
    pub early_expiry_ms: Option<i64>,
    /// The fault's start on the register's clock, ms.
    pub fault_start_ms: u64,
    /// The fault's end on the register's clock, ms.
    pub fault_end_ms: u64,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn signed_ms(a: Duration, b: Duration) -> i64 {
    let v = if a >= b {
        i128::try_from((a - b).as_millis()).unwrap_or(i128::MAX)
    } else {
        -i128::try_from((b - a).as_millis()).unwrap_or(i128::MAX)
    };
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn note_value<T: std::str::FromStr>(events: &[Event], id: &str, key: &str) -> Option<T> {
    events.iter().find_map(|e| match &e.kind {
        EventKind::Note(text) if e.client == id => text
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok()),
        _ => None,
    })
}

/// How long `a`'s first lease was trusted from its send time: the
/// `deadline_in_ms` and `sent_ago_ms` of its `granted` note, which the
/// client measured together.
fn trusted_ms(events: &[Event]) -> Option<u64> {
    let granted = events.iter().find_map(|e| match &e.kind {
        EventKind::Note(text) if e.client == "a" && text.starts_with("granted ") => Some(text),
        _ => None,
    })?;
    let value = |key: &str| {
        granted
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?
            .parse::<u64>()
            .ok()
    };
    Some(value("deadline_in_ms")? + value("sent_ago_ms")?)
}

/// `a`'s lease end by its last request sent before `b`'s grant at
/// `granted` (the `sent_ago_ms` of its `granted` and `renewed` notes, on the
/// register's clock) against that grant; `None` if `a` was handing the lock
/// over by then: it left its critical section (`EXIT`, sent before it
/// calls `release()`; its `RELEASE` is sent after `release()` returns, by
/// which time the server may have granted `b`).
fn early_expiry_ms(events: &[Event], granted: Duration) -> Option<i64> {
    let before = |e: &&Event| e.client == "a" && e.at <= granted;
    if events
        .iter()
        .filter(before)
        .any(|e| matches!(e.kind, EventKind::Exit | EventKind::Release(_)))
    {
        return None;
    }
    let ttl = Duration::from_millis(note_value(events, "a", "ttl_ms")?);
    let last_sent = events
        .iter()
        .filter(before)
        .filter_map(|e| match &e.kind {
            EventKind::Note(text) if text.starts_with("granted") || text.starts_with("renewed") => {
                let ago: u64 = text
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("sent_ago_ms="))?
                    .parse()
                    .ok()?;
                e.at.checked_sub(Duration::from_millis(ago))
            }
            _ => None,
        })
        .max()?;
    Some(signed_ms(last_sent + ttl, granted))
}

/// The observation over a scenario's events.
pub fn analyse(events: &[Event], window: Window) -> Observation {
    let r = report(events);
    let lost_before = |client: &str, at: Duration| {
        let entered = events
            .iter()
            .filter(|e| e.client == client && e.at <= at && matches!(e.kind, EventKind::Enter(_)))
            .map(|e| e.at)
            .next_back()
            .unwrap_or_default();
        events.iter().any(|e| {
            e.client == client && e.at >= entered && e.at <= at && e.kind == EventKind::Lost
        })
    };
    let told = r
        .overlaps
        .iter()
        .filter(|o| lost_before(&o.inside, o.at))
        .count();
    let first = |id: &str, pred: &dyn Fn(&EventKind) -> bool| {
        events
            .iter()
            .find(|e| e.client == id && e.at >= window.fault_start && pred(&e.kind))
            .map(|e| e.at)
    };
    let lost = first("a", &|k| *k == EventKind::Lost);
    let grant = first("b", &|k| matches!(k, EventKind::Grant(_)));
    let released = events
        .iter()
        .find(|e| e.client == "a" && matches!(e.kind, EventKind::Release(_)));
    let release = released.and_then(|e| match &e.kind {
        EventKind::Release(o) => Some(o.clone()),
        _ => None,
    });
    let lost_before_release = released.is_some_and(|r| {
        events
            .iter()
            .any(|e| e.client == "a" && e.kind == EventKind::Lost && e.at < r.at)
    });
    Observation {
        overlaps: r.overlaps.len() - told,
        overlaps_after_lost: told,
        stale_rejected: r.stale_rejected,
        stale_accepted: r.stale_accepted,
        writes_accepted: r.writes_accepted,
        grants: r.grants,
        token_order_violations: r.token_order_violations,
        fault_to_lost_ms: lost.map(|t| ms(t - window.fault_start)),
        lost_vs_deadline_ms: note_value(events, "a", "vs_deadline_ms"),
        fault_to_grant_ms: grant.map(|t| ms(t - window.fault_start)),
        fault_end_to_grant_ms: grant.map(|t| signed_ms(t, window.fault_end)),
        release,
        lost_before_release,
        granted_ttl_ms: note_value(events, "a", "ttl_ms"),
        trusted_ms: trusted_ms(events),
        early_expiry_ms: grant.and_then(|g| early_expiry_ms(events, g)),
        fault_start_ms: ms(window.fault_start),
        fault_end_ms: ms(window.fault_end),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(at_ms: u64, client: &str, kind: EventKind) -> Event {
        Event {
            at: Duration::from_millis(at_ms),
            client: client.to_owned(),
            kind,
        }
    }

    fn write(token: u64, accepted: bool) -> EventKind {
        EventKind::Write {
            token: Some(token),
            accepted,
        }
    }

    #[test]
    fn an_overlap_counts_against_the_lock_only_while_the_holder_believes() {
        let window = Window {
            fault_start: Duration::from_millis(100),
            fault_end: Duration::from_millis(3000),
        };
        // a is paused inside its section, b gets in, a's late write is
        // rejected, then a learns of the loss.
        let paused = [
            ev(0, "a", EventKind::Grant(Some(5))),
            ev(
                1,
                "a",
                EventKind::Note("granted ttl_ms=2000 deadline_in_ms=1900".into()),
            ),
            ev(2, "a", EventKind::Enter(Some(5))),
            ev(3, "a", write(5, true)),
            ev(2100, "b", EventKind::Grant(Some(6))),
            ev(2101, "b", EventKind::Enter(Some(6))),
            ev(2102, "b", write(6, true)),
            ev(2103, "b", EventKind::Exit),
            ev(3001, "a", write(5, false)),
            ev(3002, "a", EventKind::Lost),
            ev(
                3003,
                "a",
                EventKind::Note("lost vs_deadline_ms=1100".into()),
            ),
            ev(3004, "a", EventKind::Exit),
            ev(3005, "a", EventKind::Release("lost".into())),
        ];
        let o = analyse(&paused, window);
        assert_eq!((o.overlaps, o.overlaps_after_lost), (1, 0));
        assert_eq!((o.stale_rejected, o.stale_accepted), (1, 0));
        assert_eq!(o.fault_to_lost_ms, Some(2902));
        assert_eq!(o.lost_vs_deadline_ms, Some(1100));
        assert_eq!(o.fault_to_grant_ms, Some(2000));
        assert_eq!(o.fault_end_to_grant_ms, Some(-900));
        assert_eq!(o.release.as_deref(), Some("lost"));
        assert!(o.lost_before_release);
        assert_eq!(o.granted_ttl_ms, Some(2000));

        // The same overlap after a was told it lost the lock is the client's
        // business, not a loss of mutual exclusion by the lock service.
        let told: Vec<Event> = paused
            .iter()
            .cloned()
            .map(|mut e| {
                if e.kind == EventKind::Lost {
                    e.at = Duration::from_millis(2000);
                }
                e
            })
            .collect();
        let mut told = told;
        told.sort_by_key(|e| e.at);
        let o = analyse(&told, window);
        assert_eq!((o.overlaps, o.overlaps_after_lost), (0, 1));
    }

    #[test]
    fn an_early_expiry_is_measured_from_the_last_renewal_sent() {
        let window = Window {
            fault_start: Duration::from_millis(100),
            fault_end: Duration::from_millis(200),
        };
        let note = |at, text: &str| ev(at, "a", EventKind::Note(text.into()));
        let events = |b_at| {
            vec![
                ev(10, "a", EventKind::Grant(Some(1))),
                note(12, "granted ttl_ms=2000 deadline_in_ms=1950 sent_ago_ms=7"),
                // A renewal sent at 700 - 40 = 660 ms.
                note(700, "renewed sent_ago_ms=40"),
                ev(b_at, "b", EventKind::Grant(Some(2))),
            ]
        };
        // Trusted from the grant's note alone, not the renewal's.
        assert_eq!(analyse(&events(1000), window).trusted_ms, Some(1957));
        // b let in at 1000 ms: a's lease ran to 660 + 2000 = 2660 ms.
        assert_eq!(analyse(&events(1000), window).early_expiry_ms, Some(1660));
        // b let in at 3000 ms: on time, with 340 ms to spare.
        assert_eq!(analyse(&events(3000), window).early_expiry_ms, Some(-340));
        // A renewal reported after b's grant does not count.
        let mut late = events(1000);
        late.push(note(1500, "renewed sent_ago_ms=900"));
        assert_eq!(analyse(&late, window).early_expiry_ms, Some(1660));
        // a released first: a hand-over, not an expiry.
        let mut released = events(3000);
        released.insert(3, ev(900, "a", EventKind::Release("ok".into())));
        assert_eq!(analyse(&released, window).early_expiry_ms, None);
        // a left its section first and its release was on the way when b
        // was granted: a hand-over too.
        let mut exited = events(1000);
        exited.insert(3, ev(900, "a", EventKind::Exit));
        assert_eq!(analyse(&exited, window).early_expiry_ms, None);
    }
}
