//! `polylock run`: hold a lock for the lifetime of a child process; and
//! `polylock hold`: hold it until interrupted or stdin closes.

use std::ffi::OsString;
use std::io::{ErrorKind, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use polylock::{Guarantees, LockError, LockGuard, Locker};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::{sleep_until, timeout, Instant};

use crate::child::{self, Spawned};
use crate::duration::show;
use crate::say::say;
use crate::{exit, Failure};

/// Waits until no process of the command's group runs any more (its
/// leader has exited), killing the group at `kill_at`, or at once when the
/// lock is lost: then why. A signal that arrives meanwhile is forwarded to
/// the group; a second one (`forwarded`: one was before the drain) kills
/// it.
async fn drain(
    cmd: &Spawned,
    guard: &LockGuard,
    kill_at: Instant,
    signals: &mut Signals,
    mut forwarded: bool,
) -> Option<String> {
    while cmd.group_running() {
        tokio::select! {
            biased;
            _ = guard.lost() => {
                cmd.signal(Signal::SIGKILL);
                return Some("it ended while the command's group was stopping".into());
            }
            _ = sleep_until(kill_at) => {
                cmd.signal(Signal::SIGKILL);
                return None;
            }
            sig = signals.recv() => {
                if forwarded {
                    cmd.signal(Signal::SIGKILL);
                    return None;
                }
                cmd.signal(sig);
                forwarded = true;
            }
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    None
}

/// The shortest TTL `run` and `hold` accept. Below it the watchdog's
/// renewal (every third of the TTL, or sooner) and the stop before the deadline leave
/// no room for one slow round trip.
pub(crate) const MIN_TTL: Duration = Duration::from_secs(1);

/// How long the release at the end may take: polylock exits within about a
/// second of the command's end even when the lock service is gone (the lock
/// then expires at its TTL).
const RELEASE_BUDGET: Duration = Duration::from_millis(700);

/// What `run` and `hold` share.
pub(crate) struct LockArgs {
    pub(crate) name: String,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    /// Exit code when the lock is held elsewhere (flock's `-E`).
    pub(crate) conflict: u8,
    /// Who holds it, stored beside the lock for `status` (`None`: --no-meta).
    pub(crate) meta: Option<polylock::HolderMeta>,
}

/// SIGINT, SIGTERM and SIGHUP, listened to before anything is held so none
/// is lost.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// Starts listening to `kind`, the failure a [`Failure`] of its own.
fn listen(kind: SignalKind) -> Result<tokio::signal::unix::Signal, Failure> {
    signal(kind).map_err(|e| {
        Failure::new(
            exit::BACKEND,
            format!("cannot install signal handlers: {e}"),
        )
    })
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        Ok(Signals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The next of the three to arrive. Cancel safe (each `recv` is).
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// SIGCHLD, SIGTSTP and SIGCONT, for stopping and continuing the command
/// and polylock as one job (see the `child` module): listened to before the
/// command starts. Listening to SIGTSTP also means that polylock never
/// stops by it while the command runs on.
struct JobSignals {
    child: tokio::signal::unix::Signal,
    tstp: tokio::signal::unix::Signal,
    cont: tokio::signal::unix::Signal,
}

impl JobSignals {
    fn new() -> Result<Self, Failure> {
        Ok(JobSignals {
            child: listen(SignalKind::child())?,
            tstp: listen(SignalKind::from_raw(Signal::SIGTSTP as i32))?,
            cont: listen(SignalKind::from_raw(Signal::SIGCONT as i32))?,
        })
    }
}

/// Refuses a TTL the watchdog cannot keep: below [`MIN_TTL`] (checked
/// before connecting, with `backend` None) or below the backend's minimum;
/// and one above [`polylock::MAX_TTL`].
pub(crate) fn check_ttl(backend: Option<&Guarantees>, ttl: Duration) -> Result<(), Failure> {
    let backend_min = backend.map_or(Duration::ZERO, |g| g.min_ttl);
    let floor = MIN_TTL.max(backend_min);
    if ttl < floor {
        let why = match backend {
            Some(g) if g.min_ttl > MIN_TTL => {
                format!("{} cannot grant less than {}", g.backend, show(g.min_ttl))
            }
            _ => format!(
                "below {} the lock cannot be renewed and the command stopped before it expires",
                show(MIN_TTL)
            ),
        };
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "invalid TTL: --ttl {} is too short: the smallest TTL is {} ({why})",
                show(ttl),
                show(floor)
            ),
        ));
    }
    polylock::validate_ttl(ttl).map_err(|e| Failure::new(exit::USAGE, e.to_string()))
}

/// Refuses a wait above [`polylock::MAX_WAIT`], before connecting.
pub(crate) fn check_wait(wait: Duration) -> Result<(), Failure> {
    polylock::validate_wait(wait).map_err(|e| Failure::new(exit::USAGE, e.to_string()))
}

/// Takes the lock, or explains why not (exit `conflict` when held elsewhere).
/// `Ok(Err(code))`: a signal arrived while waiting.
async fn take(
    locker: &Locker,
    args: &LockArgs,
    signals: &mut Signals,
) -> Result<Result<LockGuard, u8>, Failure> {
    let mut builder = locker.lock(&args.name).ttl(args.ttl).wait(args.wait);
    if let Some(meta) = &args.meta {
        builder = builder.holder_meta(meta.clone());
    }
    let acquire = builder.acquire();
    tokio::select! {
        r = acquire => match r {
            Ok(g) => Ok(Ok(g)),
            Err(LockError::Timeout { .. }) => {
                let holder = match locker.inspect(&args.name).await {
                    Ok(Some(h)) => format!(" (held, fencing token {})", h.fence.map_or("?".into(), |f| f.to_string())),
                    _ => String::new(),
                };
                Err(Failure::new(
                    args.conflict,
                    format!("lock {:?} not taken within {}{holder}; command not run", args.name, show(args.wait)),
                ))
            }
            Err(e) => Err(e.into()),
        },
        sig = signals.recv() => Ok(Err(128 + sig as u8)),
    }
}

/// Releases at the end, within [`RELEASE_BUDGET`]. `Err(Lost)` passes
/// through, also when the loss was known here before the release (a lease
/// past its deadline) and the release then timed out or failed: the loss,
/// not the lock service's silence, is what the caller must hear.
async fn release(guard: LockGuard, ttl: Duration) -> Result<(), LockError> {
    if !guard.is_held() {
        let name = guard.name().to_string();
        // Only cleans up; bounded, since the answer is known already.
        let _ = timeout(RELEASE_BUDGET, guard.release()).await;
        return Err(LockError::Lost { name });
    }
    match timeout(RELEASE_BUDGET, guard.release()).await {
        Ok(Err(e)) if e.is_lost() => Err(e),
        Ok(Err(e)) => {
            say!(
                "polylock: warning: release failed, the lock expires in at most {}: {}",
                show(ttl),
                crate::one_line(&e.to_string())
            );
            Ok(())
        }
        Err(_) => {
            say!(
                "polylock: warning: the lock service did not answer the release within {}; \
                 the lock expires in at most {}",
                show(RELEASE_BUDGET),
                show(ttl)
            );
            Ok(())
        }
        Ok(Ok(())) => Ok(()),
    }
}

/// Why the lock went away, as far as this process can tell. The loss
/// reason lock-core logs (a `WARN` line) says more.
fn loss_cause(deadline: Instant, renewals_failing_since: Option<Instant>) -> String {
    let now = Instant::now();
    if now >= deadline {
        match renewals_failing_since {
            Some(since) => format!(
                "no renewal succeeded in the {} before the lease's deadline",
                show(now.saturating_duration_since(since))
            ),
            None => "the lease's deadline passed without a successful renewal (the lock service \
                     was unreachable or slow, or polylock was paused)"
                .to_string(),
        }
    } else {
        "the lock service refused the renewal: the lease is no longer ours (it expired there, \
         was removed with `release --force`, or was taken over)"
            .to_string()
    }
}

pub(crate) async fn run(
    locker: &Locker,
    args: &LockArgs,
    grace: Duration,
    command: &[OsString],
) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    check_ttl(Some(&locker.guarantees()), args.ttl)?;
    let guard = match take(locker, args, &mut signals).await? {
        Ok(g) => g,
        Err(code) => return Ok(code),
    };
    // Only now: while it waits for the lock, polylock stops on Ctrl-Z as
    // any program does (it holds nothing yet), and that stop request is
    // not left over for the job once the command runs.
    let mut job = JobSignals::new()?;
    let name = &args.name;
    // SIGTERM goes out no sooner than halfway from the missed renewal (the
    // watchdog's: a third of the TTL after the last one, or half the time
    // the lease is trusted when that comes first, as on a ZooKeeper
    // ensemble, whose deadlines lose the follower lag) to the deadline, and
    // never more than a third of the TTL before the deadline.
    let grace = {
        let lease = guard.lease();
        let room = lease
            .deadline()
            .saturating_duration_since(lease.renewal_due());
        grace.min(lease.ttl() / 3).min(room / 2)
    };

    let (program, argv) = command.split_first().expect("clap requires a command");
    let env = [
        ("POLYLOCK_FENCE", guard.fence().to_string()),
        ("POLYLOCK_NAME", name.clone()),
    ];
    let mut cmd: Spawned = match child::spawn(program, argv, &env) {
        Ok(c) => c,
        Err(e) => {
            let _ = release(guard, args.ttl).await;
            let what = program.to_string_lossy();
            // As a shell does: 127 only when there is no such program,
            // 126 when it cannot be run (no permission, not an executable
            // format, busy, no resources to start it).
            let code = match e.kind() {
                ErrorKind::NotFound => exit::CANNOT_EXEC,
                _ => exit::CANNOT_EXECUTE,
            };
            return Err(Failure::new(code, format!("cannot run {what}: {e}")));
        }
    };

    // Set once SIGTERM went out because renewals are failing: the deadline
    // SIGKILL is due at.
    let mut stopping: Option<(Instant, Instant)> = None;
    // Set once the lock is gone and the command was killed: why.
    let mut lost: Option<String> = None;
    // Set once the command was killed at the deadline SIGTERM gave it,
    // though a renewal had come through meanwhile.
    let mut killed = false;
    // Set once polylock forwarded a signal to the command's group.
    let mut forwarded = false;
    let status = loop {
        let lease = guard.lease();
        let deadline = lease.deadline();
        let term_at = deadline.checked_sub(grace).unwrap_or(deadline);
        let kill_at = stopping.map_or(deadline, |(_, d)| d);
        // Biased: a loss already known wins over a stop timer that came due
        // at the same moment (polylock resumed after a pause past the
        // deadline), so the cause printed is the loss.
        tokio::select! {
            biased;
            status = cmd.child.wait() => break status,
            _ = guard.lost(), if lost.is_none() => {
                // The lock is already gone: every moment the command runs
                // may overlap another holder, so no grace.
                cmd.signal(Signal::SIGKILL);
                let cause = loss_cause(deadline, stopping.map(|(since, _)| since));
                say!("polylock: lock {name:?} was lost: {cause}; killed the command");
                lost = Some(cause);
            }
            _ = job.cont.recv(), if lost.is_none() && cmd.suspended() => {
                // polylock's job was continued after a stop. Renewals
                // stopped with it: past the deadline the command must not
                // run again, whether or not the watchdog has said so yet.
                if Instant::now() < guard.lease().deadline() {
                    cmd.continue_job();
                } else {
                    cmd.signal(Signal::SIGKILL);
                    let cause = loss_cause(deadline, stopping.map(|(since, _)| since));
                    say!("polylock: lock {name:?} was lost: {cause}; killed the command");
                    lost = Some(cause);
                }
            }
            _ = job.child.recv() => {
                if let Some(sig) = cmd.stopped() {
                    tracing::debug!(signal = %sig, "polylock: the command was stopped");
                    cmd.stop_job(true, sig);
                }
            }
            _ = job.tstp.recv() => cmd.stop_job(false, Signal::SIGTSTP),
            _ = sleep_until(term_at), if stopping.is_none() && lost.is_none() => {
                // Woken at the stop time of the lease we read; a renewal
                // in between moved the deadline and the loop goes round.
                if guard.lease().deadline() == lease.deadline() {
                    // Signalled before the message: a blocked stderr (a full
                    // pipe, a paused terminal) must not hold the signal up.
                    cmd.signal(Signal::SIGTERM);
                    say!(
                        "polylock: lock {name:?}: renewals are failing; sent SIGTERM, \
                         SIGKILL in {} at the lease's deadline",
                        show(deadline.saturating_duration_since(Instant::now()))
                    );
                    // When the missed renewal was due.
                    let due = lease.renewal_due();
                    stopping = Some((due, deadline));
                }
            }
            _ = sleep_until(kill_at), if stopping.is_some() && lost.is_none() && !killed => {
                cmd.signal(Signal::SIGKILL);
                if guard.is_held() {
                    // A renewal came through after the SIGTERM: the lock
                    // is not lost, but the command was told to stop by
                    // then and did not.
                    say!(
                        "polylock: lock {name:?}: the command did not exit by the deadline \
                         SIGTERM gave it; killed it"
                    );
                    killed = true;
                } else {
                    let cause = loss_cause(deadline, stopping.map(|(since, _)| since));
                    say!("polylock: lock {name:?} was lost: {cause}; killed the command");
                    lost = Some(cause);
                }
            }
            sig = signals.recv() => {
                cmd.signal(sig);
                forwarded = true;
            }
        }
    };
    // The leader has exited; what it started in its group may not have.
    // Once the group was told to stop (renewals failing, or a signal
    // polylock forwarded), the lock stays held until the group is gone, and
    // the group is killed at the deadline, or at once if the lock is lost.
    // The shell gets the terminal back now, not after the drain.
    cmd.restore_terminal();
    if lost.is_none() && !killed && (stopping.is_some() || forwarded) {
        let kill_at = stopping.map_or_else(|| guard.lease().deadline(), |(_, d)| d);
        if let Some(cause) = drain(&cmd, &guard, kill_at, &mut signals, forwarded).await {
            say!("polylock: lock {name:?} was lost: {cause}; killed the command's group");
            lost = Some(cause);
        }
    }
    let status =
        status.map_err(|e| Failure::new(exit::BACKEND, format!("waiting for the command: {e}")))?;
    if let Some(cause) = lost {
        let _ = release(guard, args.ttl).await;
        return Err(Failure::new(
            exit::LOCK_LOST,
            format!("lock {name:?} lost while the command ran: {cause}"),
        ));
    }
    if stopping.is_some() {
        let _ = release(guard, args.ttl).await;
        return Err(Failure::new(
            exit::LOCK_LOST,
            format!(
                "lock {name:?}: the command was stopped because renewals failed \
                 (it exited with {})",
                code_of(status)
            ),
        ));
    }
    match release(guard, args.ttl).await {
        Ok(()) => Ok(code_of(status)),
        // The command finished, but the lock was gone before it did:
        // its work may have overlapped another holder's.
        Err(LockError::Lost { .. }) => Err(Failure::new(
            exit::LOCK_LOST,
            format!(
                "lock {name:?} was lost before the command finished: it was expired, removed \
                 or granted to another holder, so the work may have overlapped theirs"
            ),
        )),
        // The release failed (server unreachable): the lock expires at its
        // TTL; the command's result still stands.
        Err(e) => {
            say!(
                "polylock: warning: release failed, the lock expires in at most {}: {e}",
                show(args.ttl)
            );
            Ok(code_of(status))
        }
    }
}

/// `polylock hold`: take the lock, print its fencing token, keep it until a
/// signal arrives or stdin closes.
pub(crate) async fn hold(locker: &Locker, args: &LockArgs) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    check_ttl(Some(&locker.guarantees()), args.ttl)?;
    let guard = match take(locker, args, &mut signals).await? {
        Ok(g) => g,
        Err(code) => return Ok(code),
    };
    let mut out = std::io::stdout();
    // A closed stdout (the reader went away) is no reason to keep the lock.
    if writeln!(out, "{}", guard.fence())
        .and_then(|()| out.flush())
        .is_err()
    {
        let _ = release(guard, args.ttl).await;
        return Ok(exit::BACKEND);
    }
    let mut stdin = tokio::io::stdin();
    let stdin_closed = async {
        let mut buf = [0u8; 256];
        // Input is ignored; only its end matters.
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let name = &args.name;
    tokio::select! {
        _ = stdin_closed => {}
        _ = signals.recv() => {}
        _ = guard.lost() => {
            let cause = loss_cause(guard.lease().deadline(), None);
            let _ = release(guard, args.ttl).await;
            return Err(Failure::new(exit::LOCK_LOST, format!("lock {name:?} was lost: {cause}")));
        }
    }
    match release(guard, args.ttl).await {
        Ok(()) => Ok(0),
        Err(_) => Err(Failure::new(
            exit::LOCK_LOST,
            format!("lock {name:?} was lost before it was released"),
        )),
    }
}

fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        _ => 1,
    }
}
