//! polylock's own stderr. Its lines and log events go to a thread that
//! writes them, so that a stalled stderr (a full pipe whose reader hangs, a
//! terminal paused with Ctrl-S) never holds up the thread that must signal
//! the command at the lease's deadline, and a closed one (EPIPE) loses the
//! text, not the process (`eprintln!` panics on it).

use std::io::Write;
use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

enum Piece {
    Text(Vec<u8>),
    /// Answered once everything before it is written.
    Flush(Sender<()>),
}

/// The writer thread's queue; `None` if the thread could not be started
/// (then text is written where it is said).
fn queue() -> Option<&'static Sender<Piece>> {
    static QUEUE: OnceLock<Option<Sender<Piece>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = channel::<Piece>();
            std::thread::Builder::new()
                .name("polylock-stderr".into())
                .spawn(move || {
                    let mut err = std::io::stderr();
                    for piece in rx {
                        match piece {
                            Piece::Text(bytes) => {
                                let _ = err.write_all(&bytes);
                            }
                            Piece::Flush(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// Queues `bytes` for stderr.
pub(crate) fn write(bytes: Vec<u8>) {
    let unsent = match queue() {
        Some(q) => match q.send(Piece::Text(bytes)) {
            Ok(()) => return,
            Err(e) => match e.0 {
                Piece::Text(bytes) => bytes,
                Piece::Flush(_) => return,
            },
        },
        None => bytes,
    };
    let _ = std::io::stderr().write_all(&unsent);
}

/// Waits until everything queued so far is written: before polylock exits,
/// once the command is gone and the lock released.
pub(crate) fn flush() {
    let Some(q) = queue() else {
        return;
    };
    let (done, written) = channel();
    if q.send(Piece::Flush(done)).is_ok() {
        let _ = written.recv();
    }
}

/// `eprintln!` through the writer thread.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::write(format!("{}\n", format_args!($($arg)*)).into_bytes())
    };
}
pub(crate) use say;

/// A log event's text, queued as one piece when the event is written: the
/// writer `tracing_subscriber` is given.
#[derive(Default)]
pub(crate) struct Writer(Vec<u8>);

impl Write for Writer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            write(std::mem::take(&mut self.0));
        }
    }
}
