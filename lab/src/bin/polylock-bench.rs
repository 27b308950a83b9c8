//! `polylock-bench` (run as `polylock bench`): starts each backend's server
//! through the test kit (or connects to servers given with `--url`) and
//! measures it next to its raw driver; prints a table and writes
//! docs/performance.{md,json} and docs/perf/*.svg.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::Parser;
use polylock_lab::bench::{self, output, Options};

/// Counts the heap bytes in use, for client memory per held lock.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

// The one unsafe item: a global allocator must implement an unsafe trait.
// It only forwards to the system allocator and keeps a count.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds alloc's contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn in_use() -> usize {
    IN_USE.load(Ordering::Relaxed)
}

/// Measures polylock's backends against real servers started here.
#[derive(Parser, Debug)]
#[command(name = "polylock bench", version)]
struct Args {
    /// Backends to measure, comma separated (default: all).
    #[arg(long, value_delimiter = ',')]
    backends: Option<Vec<String>>,
    /// Measure the server of this lock URL instead of starting one
    /// (repeatable; e.g. redis://:PASSWORD@cache:6379/0, postgres://u@db/app).
    /// The bench writes there: locks under `bench/`, raw keys `raw:*`, a
    /// `raw_locks` table, a `/raw` node.
    #[arg(long = "url", value_name = "URL", conflicts_with = "backends")]
    urls: Vec<String>,
    /// How long each timed measurement runs (e.g. 5s, 800ms).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Short durations and fewer held locks (CI).
    #[arg(long)]
    quick: bool,
    /// Where performance.md, performance.json and perf/*.svg go.
    #[arg(long, default_value = "docs")]
    out: PathBuf,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    polylock_lab::duration_arg(s)
}

/// The command that reproduces this run, for the report: the arguments
/// without `--out` (where the files went does not change the figures), and
/// every `--url` with its password redacted (the report is meant to be
/// committed and shared).
fn command_line(mut args: impl Iterator<Item = String>) -> String {
    let mut words = vec!["polylock bench".to_string()];
    while let Some(a) = args.next() {
        if a == "--out" {
            args.next();
        } else if a == "--url" {
            words.push(a);
            words.extend(args.next().map(|url| lock_core::redact_url(&url)));
        } else if let Some(url) = a.strip_prefix("--url=") {
            words.push(format!("--url={}", lock_core::redact_url(url)));
        } else if !a.starts_with("--out=") {
            words.push(a);
        }
    }
    words.join(" ")
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut opts = if args.quick {
        Options::quick()
    } else {
        Options::full()
    };
    if let Some(b) = args.backends {
        opts.backends = b;
    }
    opts.urls = args.urls;
    if let Some(d) = args.duration {
        opts.duration = d;
    }
    opts.allocated = Some(in_use);
    opts.command = command_line(std::env::args().skip(1));
    if let Err(e) = opts.validate() {
        eprintln!("polylock bench: {e}");
        return std::process::ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("polylock bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let report = match rt.block_on(bench::run(&opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("\npolylock bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    print!("{}", output::table(&report));
    if let Err(e) = output::write_all(&report, &args.out) {
        eprintln!("polylock bench: {e}");
        return std::process::ExitCode::FAILURE;
    }
    eprintln!(
        "wrote {}/performance.md, performance.json, perf/*.svg",
        args.out.display()
    );
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::command_line;

    fn line(args: &[&str]) -> String {
        command_line(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn the_reported_command_drops_the_output_dir() {
        assert_eq!(
            line(&[
                "--duration",
                "3s",
                "--out",
                "/tmp/x",
                "--out=/tmp/y",
                "--quick"
            ]),
            "polylock bench --duration 3s --quick"
        );
    }

    #[test]
    fn the_reported_command_never_holds_a_password() {
        let reported = line(&[
            "--url",
            "redis://:s3cret@cache:6379/0",
            "--url=postgres://app:s3cret@db/app",
        ]);
        assert!(!reported.contains("s3cret"), "{reported}");
        assert!(
            reported.contains("--url redis://") && reported.contains("@cache:6379/0"),
            "{reported}"
        );
        assert!(reported.contains("--url=postgres://app:"), "{reported}");
    }
}
