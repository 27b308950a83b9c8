//! Example services on polylock. `nightly-worker` (src/bin/nightly_worker.rs)
//! is the "only one worker runs the nightly job" service: it runs unchanged
//! on every backend, chosen by `POLYLOCK_URL` (or `POLYLOCK_CONFIG`) alone;
//! tests/nightly_worker.rs runs it against each one.
//!
//! [`FencedStore`] is the store it writes its result to: a write carries
//! the fencing token and a write with a lower token than one already stored
//! never becomes the result.

use std::fs;
use std::io::ErrorKind;
use std::path::PathBuf;

/// A directory that keeps results by fencing token: `put` creates
/// `TOKEN.result` (zero-padded, so names sort by token) and the result is
/// the file with the highest token. A writer whose token is lower than one
/// already stored is refused and its file removed, so a worker that was
/// paused past its lease cannot replace a newer worker's result.
#[derive(Debug, Clone)]
pub struct FencedStore {
    dir: PathBuf,
}

/// What [`FencedStore::put`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Put {
    /// The result is stored and is the newest.
    Accepted,
    /// A result with a higher (or the same) token is there: this one is stale.
    Stale {
        /// The highest token stored.
        newest: u64,
    },
}

impl FencedStore {
    /// A store in `dir` (created if missing).
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<FencedStore> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(FencedStore { dir })
    }

    fn tokens(&self) -> std::io::Result<Vec<u64>> {
        let mut tokens = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            if let Some(t) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".result"))
                .and_then(|n| n.parse().ok())
            {
                tokens.push(t);
            }
        }
        tokens.sort_unstable();
        Ok(tokens)
    }

    /// Stores `result` under `token` unless a token at least as high is
    /// stored already. Checked again after the write, so of two racing
    /// writers the lower token always loses.
    pub fn put(&self, token: u64, result: &str) -> std::io::Result<Put> {
        if let Some(&newest) = self.tokens()?.last().filter(|&&t| t >= token) {
            return Ok(Put::Stale { newest });
        }
        let path = self.dir.join(format!("{token:020}.result"));
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => std::io::Write::write_all(&mut f, result.as_bytes())?,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                return Ok(Put::Stale { newest: token })
            }
            Err(e) => return Err(e),
        }
        match self.tokens()?.last() {
            Some(&newest) if newest > token => {
                fs::remove_file(&path)?;
                Ok(Put::Stale { newest })
            }
            _ => Ok(Put::Accepted),
        }
    }

    /// The newest result and its token.
    pub fn newest(&self) -> std::io::Result<Option<(u64, String)>> {
        match self.tokens()?.last() {
            None => Ok(None),
            Some(&t) => Ok(Some((
                t,
                fs::read_to_string(self.dir.join(format!("{t:020}.result")))?,
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_token_never_becomes_the_result() {
        let dir = tempfile::tempdir().unwrap();
        let s = FencedStore::open(dir.path()).unwrap();
        assert_eq!(s.put(5, "five").unwrap(), Put::Accepted);
        assert_eq!(s.put(3, "three").unwrap(), Put::Stale { newest: 5 });
        assert_eq!(s.put(5, "again").unwrap(), Put::Stale { newest: 5 });
        assert_eq!(s.put(9, "nine").unwrap(), Put::Accepted);
        assert_eq!(s.newest().unwrap(), Some((9, "nine".into())));
    }
}
