//! Starting the command so that it cannot outlive polylock, and signalling it.
//!
//! The command runs in a process group of its own. That is what makes every
//! signal reach it exactly once: a signal sent to polylock's group (a shell's
//! `kill -INT -PGID`, a supervisor stopping the job) reaches only polylock,
//! which forwards one copy to the command's group. When polylock runs in the
//! foreground of a terminal, the terminal is handed to the command's group
//! (as a shell does for a job), so a Ctrl-C goes to the command directly and
//! polylock, which no longer gets it, forwards nothing: still one copy. The
//! command can read the terminal as if it had been started by the shell.
//!
//! Job control follows from that: a Ctrl-Z stops the command's group, which
//! the shell does not see, since its job is polylock. So polylock stops its
//! own group the same way (the shell then reports the job stopped), and
//! when the job is continued (`fg`, `bg`) it continues the command, in the
//! foreground handing it the terminal again. While polylock is stopped it
//! renews nothing: a stop longer than the lease loses the lock, and the
//! command is then killed instead of continued.
//!
//! The command gets a parent-death signal (SIGKILL) set between fork and
//! exec, so it dies when polylock dies, even of SIGKILL. Linux sends it when
//! the *thread* that forked exits: the command is spawned from the future
//! that `main` drives with `block_on`, so the forking thread is the main
//! thread, which lives as long as polylock.

use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;

use nix::sys::signal::{killpg, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgrp, getpid, getppid, tcgetpgrp, tcsetpgrp, Pid};
use tokio::process::{Child, Command};

/// The running command.
pub(crate) struct Spawned {
    pub(crate) child: Child,
    /// The command's process group (its pid: it leads the group).
    group: Pid,
    /// Set when the terminal was handed to the command's group and must be
    /// taken back when it ends.
    terminal: bool,
}

/// Starts `program args` in its own process group, with `env` added, dying
/// with polylock.
pub(crate) fn spawn(
    program: &OsString,
    args: &[OsString],
    env: &[(&str, String)],
) -> io::Result<Spawned> {
    // The parent-death signal is tied to the forking thread (see above).
    debug_assert_eq!(std::thread::current().name(), Some("main"));
    let stdin = io::stdin();
    // Only a foreground polylock may give the terminal away; in the
    // background (or with no terminal) the command stays a background job,
    // as polylock itself was.
    let terminal = tcgetpgrp(stdin.as_fd()).is_ok_and(|fg| fg == getpgrp());
    let mut cmd = Command::new(program);
    cmd.args(args).process_group(0).kill_on_drop(false);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let parent = getpid();
    die_with_parent(&mut cmd, parent, terminal.then_some(stdin));
    let child = cmd.spawn().inspect_err(|_| {
        // The child may have taken the terminal before its exec failed:
        // its group is gone, and the terminal must not stay with it.
        if terminal {
            take_terminal_back();
        }
    })?;
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| io::Error::other("the command exited before it could be tracked"))?;
    Ok(Spawned {
        child,
        group: Pid::from_raw(pid),
        terminal,
    })
}

/// Registers the code that runs in the child between fork and exec: the
/// parent-death signal and, for a foreground polylock, the terminal handover.
///
/// `tokio::process::Command::pre_exec` is `unsafe` because the closure runs
/// in a forked copy of a multi-threaded process, where only async-signal-safe
/// calls are allowed.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command, parent: Pid, terminal: Option<io::Stdin>) {
    // SAFETY: the closure only makes system calls that are async-signal-safe
    // (prctl, getppid, pthread_sigmask, tcsetpgrp, getpid): it does not
    // allocate, take locks or touch state shared with other threads. The
    // values it uses (`parent`, the `Stdin` handle, whose buffer was set up
    // by `io::stdin()` before the fork) were created before the fork and are
    // only read.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // polylock may have died between fork and prctl: then the
            // signal will never come, so give up now.
            if getppid() != parent {
                return Err(io::Error::other("polylock exited"));
            }
            if let Some(stdin) = &terminal {
                // We are in a background group now: taking the terminal
                // raises SIGTTOU unless it is blocked.
                let mut ttou = SigSet::empty();
                ttou.add(Signal::SIGTTOU);
                let old = ttou.thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
                let taken = tcsetpgrp(stdin.as_fd(), getpid());
                old.thread_set_mask()?;
                taken?;
            }
            Ok(())
        });
    }
}

impl Spawned {
    /// Sends `sig` to the command's whole process group. Only call while
    /// the command has not been reaped (its group id cannot be reused yet).
    pub(crate) fn signal(&self, sig: Signal) {
        // ESRCH: everything in the group already exited; harmless.
        if let Err(e) = killpg(self.group, sig) {
            tracing::debug!(signal = %sig, error = %e, "polylock: signalling the command failed");
        }
    }

    /// Whether a process of the command's group still runs (not a zombie):
    /// its leader may have exited while processes it started go on. Read
    /// from /proc rather than by `kill(-group, 0)`, which also counts the
    /// zombies a container's init may never reap.
    pub(crate) fn group_running(&self) -> bool {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return false;
        };
        dir.filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(is_pid))
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .any(|stat| runs_in_group(&stat, self.group.as_raw()))
    }

    /// Takes the terminal back after the command ended, so the shell and
    /// polylock's own messages are in the foreground again.
    pub(crate) fn restore_terminal(&mut self) {
        if std::mem::take(&mut self.terminal) {
            take_terminal_back();
        }
    }

    /// The signal that stopped the command (its group's leader), when it
    /// was stopped since the last call: Ctrl-Z, a background read of the
    /// terminal, SIGSTOP. Never reaps: an exit stays for `child.wait()`.
    pub(crate) fn stopped(&self) -> Option<Signal> {
        match waitid(
            Id::Pid(self.group),
            WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG,
        ) {
            Ok(WaitStatus::Stopped(_, sig)) => Some(sig),
            _ => None,
        }
    }

    /// Stops polylock's own job as the command was stopped (SIGSTOP as
    /// SIGTSTP), after taking the terminal back, so the shell that started
    /// polylock sees its job stopped. Without a controlling terminal on
    /// stdin there is no job control to follow (the stop was someone's
    /// SIGSTOP to the command): then nothing is done.
    pub(crate) fn stop_job(&mut self, sig: Signal) {
        if tcgetpgrp(io::stdin().as_fd()).is_err() {
            return;
        }
        self.restore_terminal();
        let sig = if sig == Signal::SIGSTOP {
            Signal::SIGTSTP
        } else {
            sig
        };
        // The kernel discards it when polylock's group is orphaned (no
        // shell above it could continue it): polylock then runs on.
        if let Err(e) = killpg(getpgrp(), sig) {
            tracing::debug!(error = %e, "polylock: stopping its own job failed");
        }
    }

    /// Continues the command after polylock's job was continued; in the
    /// foreground (`fg`), it gets the terminal back first.
    pub(crate) fn continue_job(&mut self) {
        let stdin = io::stdin();
        if tcgetpgrp(stdin.as_fd()).is_ok_and(|fg| fg == getpgrp()) {
            match set_foreground(self.group) {
                Ok(()) => self.terminal = true,
                Err(e) => {
                    tracing::debug!(error = %e, "polylock: handing the terminal over failed");
                }
            }
        }
        self.signal(Signal::SIGCONT);
    }
}

/// Makes polylock's own group the terminal's foreground group again.
fn take_terminal_back() {
    if let Err(e) = set_foreground(getpgrp()) {
        tracing::debug!(error = %e, "polylock: taking the terminal back failed");
    }
}

/// Makes `group` the foreground group of the terminal on stdin. SIGTTOU is
/// blocked for the call: polylock may be a background group by then.
fn set_foreground(group: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let old = ttou.thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
    let set = tcsetpgrp(io::stdin().as_fd(), group);
    let _ = old.thread_set_mask();
    set
}

fn is_pid(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
}

/// Whether the `/proc/PID/stat` line `stat` is of a live (not zombie)
/// process in process group `group`. The command name, in parentheses,
/// may hold spaces and parentheses: the fields are read after the last
/// `)` (state, parent, process group).
fn runs_in_group(stat: &str, group: i32) -> bool {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let (Some(state), Some(_parent), Some(pgrp)) = (fields.next(), fields.next(), fields.next())
    else {
        return false;
    };
    state != "Z" && state != "X" && pgrp.parse() == Ok(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        assert!(runs_in_group("42 (sh) S 1 42 42 0 -1", 42));
        assert!(runs_in_group("43 (a ) b) R 42 42 42 0", 42));
        assert!(!runs_in_group("44 (sleep) Z 1 42 42 0", 42));
        assert!(!runs_in_group("45 (sleep) S 1 7 7 0", 42));
        assert!(!runs_in_group("garbage", 42));
    }
}
