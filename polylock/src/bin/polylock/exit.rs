//! The exit codes of `polylock`, documented in `--help`.

/// The lock could not be taken within `--wait`; the command did not run
/// (the default of `-E/--conflict-exit-code`).
pub(crate) const LOCK_TIMEOUT: u8 = 75;
/// The lock was lost while the command ran; the command was terminated.
pub(crate) const LOCK_LOST: u8 = 76;
/// The lock service could not be reached or failed.
pub(crate) const BACKEND: u8 = 69;
/// Bad arguments, URL, name or duration.
pub(crate) const USAGE: u8 = 64;
/// The command could not be executed (no permission, not an executable
/// format, no resources to start it).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command could not be started (not found).
pub(crate) const CANNOT_EXEC: u8 = 127;
/// `status`: the lock is free.
pub(crate) const FREE: u8 = 1;
// The exit-code table shown by `--help` is exit_help.txt (clap's help
// needs a literal, so it is included there with `include_str!`).
