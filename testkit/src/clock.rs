//! A wall clock that tests can step: libfaketime preloaded into a server,
//! reading its offset from a file on every clock call.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::process::require_file;

/// Where Debian's `faketime` package puts the library.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The wall-clock offset of the processes started with it, stepped at run
/// time with [`step`](Self::step).
///
/// The processes read it through libfaketime (`LD_PRELOAD`,
/// `FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`: the file is read again
/// on every clock call, so a step takes effect at once). Only the wall clock
/// moves (`FAKETIME_DONT_FAKE_MONOTONIC=1`), as when NTP or an operator
/// steps a host's clock: monotonic timers are left alone, and the JVM needs
/// it to run at all.
///
/// It cannot reach a program that reads the clock without libc (a Go
/// binary such as etcd uses the vDSO and system calls directly).
#[derive(Debug)]
pub struct FakeClock {
    dir: TempDir,
    file: PathBuf,
    offset: Mutex<Duration>,
}

impl FakeClock {
    /// A clock at offset zero. Fails with [`Error::MissingBinary`] when
    /// libfaketime is not installed.
    pub fn new() -> Result<FakeClock> {
        require_file(Path::new(LIBFAKETIME), "faketime")?;
        let dir = tempfile::Builder::new()
            .prefix("testkit-clock-")
            .tempdir()
            .map_err(|e| Error::io("creating a temp dir for the faked clock", e))?;
        // Servers that drop root (PostgreSQL) must read the file too.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io("making the faked clock's dir readable", e))?;
        let clock = FakeClock {
            file: dir.path().join("offset"),
            dir,
            offset: Mutex::new(Duration::ZERO),
        };
        clock.write(Duration::ZERO)?;
        Ok(clock)
    }

    /// Moves the wall clock of every process started with this clock
    /// forward by `by` (whole seconds; a fraction is dropped), on top of
    /// earlier steps.
    pub fn step(&self, by: Duration) -> Result<()> {
        let mut offset = self.offset.lock().unwrap_or_else(|e| e.into_inner());
        let next = *offset + Duration::from_secs(by.as_secs());
        self.write(next)?;
        *offset = next;
        Ok(())
    }

    /// The total offset stepped so far.
    pub fn offset(&self) -> Duration {
        *self.offset.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file libfaketime reads.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The environment that puts a process on this clock.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        [
            ("LD_PRELOAD", OsString::from(LIBFAKETIME)),
            (
                "FAKETIME_TIMESTAMP_FILE",
                self.file.clone().into_os_string(),
            ),
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (OsString::from(k), v))
        .collect()
    }

    fn write(&self, offset: Duration) -> Result<()> {
        // Renamed into place: a reader never sees a half-written file,
        // which it would take for offset zero.
        let tmp = self.dir.path().join("offset.tmp");
        std::fs::write(&tmp, format!("+{}\n", offset.as_secs()))
            .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)))
            .and_then(|()| std::fs::rename(&tmp, &self.file))
            .map_err(|e| Error::io("writing the faked clock's offset", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_add_up_in_the_file_libfaketime_reads() {
        let Ok(clock) = FakeClock::new() else {
            panic!("{LIBFAKETIME} missing: run scripts/install-deps.sh");
        };
        assert_eq!(std::fs::read_to_string(clock.file()).unwrap(), "+0\n");
        clock.step(Duration::from_secs(7)).unwrap();
        clock.step(Duration::from_millis(3500)).unwrap();
        assert_eq!(clock.offset(), Duration::from_secs(10));
        assert_eq!(std::fs::read_to_string(clock.file()).unwrap(), "+10\n");
        let env = clock.env();
        assert!(env
            .iter()
            .any(|(k, v)| k == "FAKETIME_TIMESTAMP_FILE" && v == clock.file().as_os_str()));
    }
}
