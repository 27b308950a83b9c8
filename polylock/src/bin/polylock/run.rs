//! `polylock run`: hold a lock for the lifetime of a child process.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use polylock::{LockError, Locker};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::duration::show;
use crate::{exit, Failure};

pub(crate) async fn run(
    locker: &Locker,
    name: &str,
    ttl: Duration,
    wait: Duration,
    grace: Duration,
    command: &[OsString],
) -> Result<u8, Failure> {
    // Listen before anything can be held, so a Ctrl-C during the wait or
    // right after the child starts is never lost.
    let mut sigint = signal(SignalKind::interrupt()).map_err(signal_failure)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(signal_failure)?;

    let acquire = locker.lock(name).ttl(ttl).wait(wait).acquire();
    let guard = tokio::select! {
        r = acquire => match r {
            Ok(g) => g,
            Err(LockError::Timeout { .. }) => {
                let holder = match locker.inspect(name).await {
                    Ok(Some(h)) => format!(" (held, fencing token {})", h.fence.map_or("?".into(), |f| f.to_string())),
                    _ => String::new(),
                };
                return Err(Failure::new(
                    exit::LOCK_TIMEOUT,
                    format!("lock {name:?} not taken within {}{holder}; command not run", show(wait)),
                ));
            }
            Err(e) => return Err(e.into()),
        },
        _ = sigint.recv() => return Ok(130),
        _ = sigterm.recv() => return Ok(143),
    };

    let (program, args) = command.split_first().expect("clap requires a command");
    let mut child = match Command::new(program)
        .args(args)
        .env("POLYLOCK_FENCE", guard.fence().to_string())
        .env("POLYLOCK_NAME", name)
        .kill_on_drop(false)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            let what = program.to_string_lossy();
            let code = match e.kind() {
                ErrorKind::NotFound => exit::CANNOT_EXEC,
                ErrorKind::PermissionDenied => 126,
                _ => exit::CANNOT_EXEC,
            };
            return Err(Failure::new(code, format!("cannot run {what}: {e}")));
        }
    };

    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| Failure::new(exit::BACKEND, format!("waiting for the command: {e}")))?;
                return match guard.release().await {
                    Ok(()) => Ok(code_of(status)),
                    // The command finished, but the lock was gone before it did:
                    // its work may have overlapped another holder's.
                    Err(LockError::Lost { .. }) => Err(Failure::new(
                        exit::LOCK_LOST,
                        format!("lock {name:?} was lost before the command finished: it was expired, removed or granted to another holder, so the work may have overlapped theirs"),
                    )),
                    // The release failed (server unreachable): the lock expires
                    // at its TTL; the command's result still stands.
                    Err(e) => {
                        eprintln!("polylock: warning: release failed, the lock expires in at most {}: {e}", show(ttl));
                        Ok(code_of(status))
                    }
                };
            }
            _ = guard.lost() => {
                eprintln!("polylock: lock {name:?} was lost; stopping the command");
                terminate(&mut child, grace).await;
                let _ = guard.release().await;
                return Err(Failure::new(exit::LOCK_LOST, format!("lock {name:?} lost while the command ran")));
            }
            _ = sigint.recv() => forward(&child, Signal::SIGINT),
            _ = sigterm.recv() => forward(&child, Signal::SIGTERM),
        }
    }
}

/// SIGTERM, then SIGKILL once `grace` has passed.
async fn terminate(child: &mut Child, grace: Duration) {
    forward(child, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

fn forward(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // The child may have exited in between; ESRCH is harmless.
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        _ => 1,
    }
}

fn signal_failure(e: std::io::Error) -> Failure {
    Failure::new(
        exit::BACKEND,
        format!("cannot install signal handlers: {e}"),
    )
}
