//! Starting the command so that it cannot outlive polylock, and signalling it.
//!
//! The command runs in a process group of its own. That is what makes every
//! signal reach it exactly once: a signal sent to polylock's group (a shell's
//! `kill -INT -PGID`, a supervisor stopping the job) reaches only polylock,
//! which forwards one copy to the command's group. When polylock runs in the
//! foreground of its controlling terminal with no peer in its process group
//! (its own ancestors, a script waiting for it, do not count), the
//! terminal is handed to the command's group (as a shell does for a job), so
//! a Ctrl-C goes to the command directly and polylock, which no longer gets
//! it, forwards nothing: still one copy. The command can read the terminal as
//! if it had been started by the shell. With other processes in polylock's
//! group (a pipeline: `polylock run x -- make | less`) the terminal stays
//! with that group: handing it away would make them a background group,
//! stopped when they touch the terminal, and polylock with them.
//!
//! Job control follows from that. The shell's job is polylock's group, so
//! the job must stop and continue as a whole:
//! - a terminal's stop of the command's group (Ctrl-Z while it owns the
//!   terminal, a background read or write of the terminal) stops polylock
//!   too, once it took the terminal back, and the rest of polylock's group
//!   (a script waiting for it), so the shell reports the job stopped;
//! - a SIGTSTP to polylock (Ctrl-Z while its group owns the terminal, a
//!   `kill -TSTP`) stops the command's group before polylock stops;
//! - when polylock is continued (`fg`, `bg`) it continues the command, in
//!   the foreground handing it the terminal again.
//!
//! A stopped polylock renews nothing: after a stop longer than the lease
//! the command is killed instead of continued. Never does polylock stop
//! while the command runs. A SIGSTOP of the command alone (a debugger,
//! `cpulimit`) is not job control: polylock keeps renewing, and whoever
//! stopped the command continues it. Without a controlling terminal, or in
//! a process group no shell can continue (an orphaned one, as under
//! `ssh host polylock ...`), polylock does not stop: a Ctrl-Z of the command
//! is undone at once, as the kernel discards one for such a group. SIGTTOU
//! is ignored in polylock, so its own messages and terminal hand-overs
//! never stop it (the command gets the default back).
//!
//! The command gets a parent-death signal (SIGKILL) set between fork and
//! exec, so it dies when polylock dies, even of SIGKILL. Linux sends it when
//! the *thread* that forked exits: the command is spawned from the future
//! that `main` drives with `block_on`, so the forking thread is the main
//! thread, which lives as long as polylock.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgrp, getpid, getppid, getsid, tcgetpgrp, tcsetpgrp, Pid};
use tokio::process::{Child, Command};

/// The running command.
pub(crate) struct Spawned {
    pub(crate) child: Child,
    /// The command's process group (its pid: it leads the group).
    group: Pid,
    /// polylock's controlling terminal (`/dev/tty`), if it has one.
    tty: Option<File>,
    /// Whether the terminal may be handed to the command: no peer shares
    /// polylock's process group.
    may_hand: bool,
    /// Set while the command's group owns the terminal (handed by
    /// polylock), which must be taken back when it ends or stops.
    terminal: bool,
    /// Set while polylock stopped itself with the job; cleared when the
    /// job is continued.
    suspended: bool,
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
    ignore_ttou();
    // No terminal when there is no controlling one (ENXIO).
    let tty = File::options().read(true).write(true).open("/dev/tty").ok();
    let may_hand = !peers_in_group();
    // Only a foreground polylock may give the terminal away; in the
    // background (or with no terminal) the command stays a background job,
    // as polylock itself was.
    let terminal = may_hand && tty.as_ref().is_some_and(is_foreground);
    let mut cmd = Command::new(program);
    cmd.args(args).process_group(0).kill_on_drop(false);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let parent = getpid();
    let handover = tty.as_ref().filter(|_| terminal).map(AsRawFd::as_raw_fd);
    die_with_parent(&mut cmd, parent, handover);
    let child = cmd.spawn().inspect_err(|_| {
        // The child may have taken the terminal before its exec failed:
        // its group is gone, and the terminal must not stay with it.
        if let (true, Some(tty)) = (terminal, &tty) {
            take_terminal_back(tty);
        }
    })?;
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| io::Error::other("the command exited before it could be tracked"))?;
    Ok(Spawned {
        child,
        group: Pid::from_raw(pid),
        tty,
        may_hand,
        terminal,
        suspended: false,
    })
}

/// Ignores SIGTTOU in polylock (see the module docs); the command gets the
/// default back between fork and exec.
#[allow(unsafe_code)]
fn ignore_ttou() {
    // SAFETY: sets a disposition, no handler code runs; polylock installs
    // no SIGTTOU handler of its own that this could replace.
    if let Err(e) = unsafe { nix::sys::signal::signal(Signal::SIGTTOU, SigHandler::SigIgn) } {
        tracing::debug!(error = %e, "polylock: ignoring SIGTTOU failed");
    }
}

/// Registers the code that runs in the child between fork and exec: the
/// parent-death signal, for a foreground polylock the terminal handover
/// (`tty`, polylock's controlling terminal), and SIGTTOU's default back.
///
/// `tokio::process::Command::pre_exec` is `unsafe` because the closure runs
/// in a forked copy of a multi-threaded process, where only async-signal-safe
/// calls are allowed.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command, parent: Pid, tty: Option<RawFd>) {
    // SAFETY: the closure only makes system calls that are async-signal-safe
    // (prctl, getppid, pthread_sigmask, tcsetpgrp, getpid, sigaction): it
    // does not allocate (its errors are plain errnos), take locks or touch
    // state shared with other threads. The values it uses (`parent`, the
    // terminal's descriptor, open until the spawn returns) were made before
    // the fork and are only read.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // polylock may have died between fork and prctl: then the
            // signal will never come, so give up now.
            if getppid() != parent {
                return Err(Errno::ESRCH.into());
            }
            if let Some(fd) = tty {
                // We are in a background group now: taking the terminal
                // raises SIGTTOU unless it is blocked (or ignored).
                let mut ttou = SigSet::empty();
                ttou.add(Signal::SIGTTOU);
                let old = ttou.thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
                let taken = tcsetpgrp(BorrowedFd::borrow_raw(fd), getpid());
                old.thread_set_mask()?;
                taken?;
            }
            nix::sys::signal::signal(Signal::SIGTTOU, SigHandler::SigDfl)?;
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
        processes().any(|p| p.pgrp == self.group.as_raw())
    }

    /// Takes the terminal back after the command ended or stopped, so the
    /// shell and polylock's own messages are in the foreground again.
    pub(crate) fn restore_terminal(&mut self) {
        if std::mem::take(&mut self.terminal) {
            if let Some(tty) = &self.tty {
                take_terminal_back(tty);
            }
        }
    }

    /// The signal that stopped the command (its group's leader), when it
    /// was stopped since the last call. Never reaps: an exit stays for
    /// `child.wait()`.
    pub(crate) fn stopped(&self) -> Option<Signal> {
        match waitid(
            Id::Pid(self.group),
            WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG,
        ) {
            Ok(WaitStatus::Stopped(_, sig)) => Some(sig),
            _ => None,
        }
    }

    /// Stops the whole job (see the module docs): after the command was
    /// stopped by `sig` (`by_command`), or polylock got a SIGTSTP. Returns
    /// once polylock has been continued, or at once when it does not stop
    /// (no terminal, a process group no shell can continue, a SIGSTOP of
    /// the command alone).
    pub(crate) fn stop_job(&mut self, by_command: bool, sig: Signal) {
        let job_control = matches!(sig, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU);
        if !job_control || self.tty.is_none() {
            return;
        }
        if own_group_orphaned() {
            if by_command && sig == Signal::SIGTSTP {
                self.signal(Signal::SIGCONT);
            }
            return;
        }
        if !by_command {
            // Uncatchable: the command must not run on while polylock stops.
            self.signal(Signal::SIGSTOP);
        }
        self.restore_terminal();
        self.suspended = true;
        // The rest of polylock's group (a script waiting for it, a
        // pipeline's peers) stops as the shell's job: one by one, since a
        // SIGTSTP to polylock itself would come back as a stop request.
        let (me, group) = (getpid().as_raw(), getpgrp().as_raw());
        for p in processes().filter(|p| p.pgrp == group && p.pid != me) {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGTSTP);
        }
        // SIGTSTP is polylock's own to handle (it got here so), so stop
        // with SIGSTOP; the shell sees the job stopped all the same.
        if let Err(e) = kill(getpid(), Signal::SIGSTOP) {
            tracing::debug!(error = %e, "polylock: stopping itself failed");
            self.suspended = false;
        }
    }

    /// Whether polylock stopped itself with the job and has not been told
    /// yet that the job continues.
    pub(crate) fn suspended(&self) -> bool {
        self.suspended
    }

    /// Continues the command after polylock's job was continued; in the
    /// foreground (`fg`), it gets the terminal back first.
    pub(crate) fn continue_job(&mut self) {
        self.suspended = false;
        if let (true, Some(tty)) = (self.may_hand, &self.tty) {
            if is_foreground(tty) {
                match set_foreground(tty, self.group) {
                    Ok(()) => self.terminal = true,
                    Err(e) => {
                        tracing::debug!(error = %e, "polylock: handing the terminal over failed");
                    }
                }
            }
        }
        self.signal(Signal::SIGCONT);
    }
}

/// Whether polylock's group is the foreground group of `tty`.
fn is_foreground(tty: &File) -> bool {
    tcgetpgrp(tty.as_fd()).is_ok_and(|fg| fg == getpgrp())
}

/// Makes polylock's own group the terminal's foreground group again.
fn take_terminal_back(tty: &File) {
    if let Err(e) = set_foreground(tty, getpgrp()) {
        tracing::debug!(error = %e, "polylock: taking the terminal back failed");
    }
}

/// Makes `group` the foreground group of `tty`. SIGTTOU is blocked for the
/// call: polylock may be a background group by then.
fn set_foreground(tty: &File, group: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let old = ttou.thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
    let set = tcsetpgrp(tty.as_fd(), group);
    let _ = old.thread_set_mask();
    set
}

/// Whether a live process of polylock's process group is neither polylock
/// nor one of its ancestors: a pipeline's other member, which handing the
/// terminal away would turn into a background group.
fn peers_in_group() -> bool {
    let (me, group) = (getpid().as_raw(), getpgrp().as_raw());
    let all: Vec<Proc> = processes().collect();
    let mut ancestors = vec![me];
    let mut at = me;
    while let Some(parent) = all.iter().find(|p| p.pid == at).map(|p| p.ppid) {
        if parent <= 1 || ancestors.contains(&parent) {
            break;
        }
        ancestors.push(parent);
        at = parent;
    }
    all.iter()
        .any(|p| p.pgrp == group && !ancestors.contains(&p.pid))
}

/// Whether polylock's process group is orphaned: no member has a parent in
/// another group of the same session, so no job-control shell can continue
/// it once stopped (the kernel discards a terminal's stop for such a group).
fn own_group_orphaned() -> bool {
    let group = getpgrp().as_raw();
    let Ok(session) = getsid(None).map(Pid::as_raw) else {
        return true;
    };
    let all: Vec<Proc> = processes().collect();
    !all.iter().filter(|p| p.pgrp == group).any(|member| {
        all.iter()
            .find(|p| p.pid == member.ppid)
            .is_some_and(|parent| parent.pgrp != group && parent.session == session)
    })
}

/// A live process as `/proc/PID/stat` shows it.
#[derive(Debug, PartialEq, Eq)]
struct Proc {
    pid: i32,
    ppid: i32,
    pgrp: i32,
    session: i32,
}

/// Every live (not zombie) process /proc shows. Zombies do not count: a
/// container's init may never reap them.
fn processes() -> impl Iterator<Item = Proc> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(is_pid))
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| parse_stat(&stat))
}

fn is_pid(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
}

/// The `/proc/PID/stat` line `stat` of a live (not zombie) process. The
/// command name, in parentheses, may hold spaces and parentheses: the fields
/// are read after the last `)` (state, parent, process group, session).
fn parse_stat(stat: &str) -> Option<Proc> {
    let (pid, rest) = stat.split_once(' ')?;
    let (_, rest) = stat.rsplit_once(')').filter(|_| !rest.is_empty())?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let mut number = || fields.next()?.parse::<i32>().ok();
    let (ppid, pgrp, session) = (number()?, number()?, number()?);
    (state != "Z" && state != "X").then_some(Proc {
        pid: pid.parse().ok()?,
        ppid,
        pgrp,
        session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        let p = |pid, ppid, pgrp, session| Proc {
            pid,
            ppid,
            pgrp,
            session,
        };
        assert_eq!(parse_stat("42 (sh) S 1 42 40 0 -1"), Some(p(42, 1, 42, 40)));
        assert_eq!(
            parse_stat("43 (a ) b) R 42 42 41 0"),
            Some(p(43, 42, 42, 41))
        );
        assert_eq!(parse_stat("44 (sleep) Z 1 42 42 0"), None);
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("45 (x) S 1"), None);
    }

    #[test]
    fn this_process_is_seen_with_its_group_and_session() {
        let me = processes()
            .find(|p| p.pid == getpid().as_raw())
            .expect("this process in /proc");
        assert_eq!(me.pgrp, getpgrp().as_raw());
        assert_eq!(Some(me.session), getsid(None).ok().map(Pid::as_raw));
    }
}
