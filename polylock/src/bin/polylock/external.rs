//! `polylock compare` and `polylock bench`: tools that live in their own
//! binaries (`polylock-compare`, `polylock-bench`) because they start real
//! servers through the test kit, which a lock client has no business linking.
//! Like git and cargo, `polylock X` runs `polylock-X` with the remaining
//! arguments, found next to this executable first, then on PATH.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use crate::{exit, Failure};

/// Where `polylock-<tool>` is: beside this executable (a `cargo build` or
/// `cargo install` puts them together), else the first match on PATH.
pub(crate) fn find(tool: &str) -> Option<PathBuf> {
    let file = format!("polylock-{tool}");
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(&file)));
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|dir| dir.join(&file))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    beside.into_iter().chain(on_path).find(|p| p.is_file())
}

/// Replaces this process with `polylock-<tool> ARGS...`; returns only on failure.
pub(crate) fn exec(tool: &str, args: &[OsString]) -> Failure {
    let Some(path) = find(tool) else {
        return Failure::new(
            exit::CANNOT_EXEC,
            format!(
                "`polylock {tool}` runs the polylock-{tool} binary, which is not installed \
                 beside polylock nor on PATH; build it with `cargo build --release -p \
                 polylock-lab` (from a polylock checkout), or run `cargo run --release -p \
                 polylock-lab --bin polylock-{tool} -- ...`"
            ),
        );
    };
    let err = std::process::Command::new(&path)
        .arg0(OsStr::new(&format!("polylock-{tool}")))
        .args(args)
        .exec();
    Failure::new(
        exit::CANNOT_EXECUTE,
        format!("cannot run {}: {err}", path.display()),
    )
}
