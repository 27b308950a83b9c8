//! The exit codes of `polylock`, documented in `--help`.

/// The lock could not be taken within `--wait`; the command did not run.
pub(crate) const LOCK_TIMEOUT: u8 = 75;
/// The lock was lost while the command ran (the command was terminated), or
/// the final release found it lost.
pub(crate) const LOCK_LOST: u8 = 76;
/// The lock service could not be reached or failed.
pub(crate) const BACKEND: u8 = 69;
/// Bad arguments, URL, name or duration.
pub(crate) const USAGE: u8 = 64;
/// The command could not be started (not found, not executable).
pub(crate) const CANNOT_EXEC: u8 = 127;
/// `status`: the lock is free.
pub(crate) const FREE: u8 = 1;

/// The text shown at the end of `--help`.
pub(crate) const HELP: &str = "\
Exit codes of `run`:
  the command's own exit code (128+N if it died of signal N)
  75  the lock was not taken within --wait; the command did not run
  76  the lock was lost while the command ran: it was sent SIGTERM, then SIGKILL;
      or the release found it lost after the command ended (its work may have
      overlapped another holder's)
  69  the lock service could not be reached
  64  bad arguments (name, duration, URL)
  127 the command could not be started
`status` exits 0 when the lock is held and 1 when it is free.";
