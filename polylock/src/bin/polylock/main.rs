//! `polylock`: a distributed flock(1), plus status and an operator's release.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use polylock::{LockError, Locker};

mod admin;
mod duration;
mod exit;
mod run;

/// Where locks live when neither --url nor POLYLOCK_URL says: a SQLite file
/// in the current directory, so the command works with nothing configured.
const DEFAULT_URL: &str = "sqlite://polylock.db";

#[derive(Parser, Debug)]
#[command(
    name = "polylock",
    version,
    about = "Distributed locks from the command line: run a command while holding a lock.",
    after_help = concat!("Examples:
  polylock run nightly-report -- ./report.sh
      Run report.sh only if no other machine is running it; wait up to 10s.
  polylock run --wait 0 --ttl 1m backup -- rsync -a /data backup:/data
      Skip this run (exit 75) if a backup is already running.
  POLYLOCK_URL=redis://cache:6379 polylock run deploy -- make deploy
      Use Redis instead of the SQLite file in the current directory.
  polylock status nightly-report
      Show who holds the lock, its fencing token and time left.

The lock URL comes from --url, else $POLYLOCK_URL, else ", "sqlite://polylock.db", " (a file
in the current directory). The command sees the fencing token in $POLYLOCK_FENCE.
")
)]
struct Cli {
    /// Lock service URL (memory://, sqlite://FILE, postgres://..., mysql://..., redis://...).
    #[arg(long, global = true, env = "POLYLOCK_URL", hide_env_values = true)]
    url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Take the lock, run COMMAND while keeping the lock renewed, release it when COMMAND exits.
    #[command(after_help = exit::HELP)]
    Run {
        /// Lock name.
        name: String,
        /// Lease length; renewed every third of it while COMMAND runs.
        #[arg(long, default_value = "30s", value_parser = duration::parse)]
        ttl: Duration,
        /// How long to wait for another holder to release (0: do not wait).
        #[arg(long, default_value = "10s", value_parser = duration::parse)]
        wait: Duration,
        /// After the lock is lost, time between SIGTERM and SIGKILL of COMMAND.
        #[arg(long, default_value = "10s", value_parser = duration::parse)]
        grace: Duration,
        /// The command and its arguments.
        #[arg(required = true, last = true, num_args = 1..)]
        command: Vec<OsString>,
    },
    /// Show who holds a lock, its fencing token and time left (exit 1 if free).
    Status {
        /// Lock name.
        name: String,
    },
    /// Print what each backend in this build guarantees, as a Markdown table.
    Guarantees,
    /// UNSAFE: remove a lock whoever holds it. A live holder keeps running
    /// without knowing; only for holders you know are dead.
    Release {
        /// Lock name.
        name: String,
        /// Required: confirms you accept breaking mutual exclusion.
        #[arg(long)]
        force: bool,
    },
}

/// A failure with the exit code it maps to; printed as one line.
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        let code = match e {
            LockError::InvalidName { .. }
            | LockError::InvalidTtl { .. }
            | LockError::InvalidWait { .. }
            | LockError::Config(_) => exit::USAGE,
            LockError::Timeout { .. } => exit::LOCK_TIMEOUT,
            LockError::Lost { .. } => exit::LOCK_LOST,
            _ => exit::BACKEND,
        };
        Failure::new(code, e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; anything else
            // is a usage error with the documented exit code.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("polylock: cannot start the async runtime: {e}");
            return ExitCode::from(exit::BACKEND);
        }
    };
    let outcome = rt.block_on(dispatch(cli));
    // Background releases handed off by guards get a moment to finish.
    rt.shutdown_timeout(Duration::from_secs(2));
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("polylock: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let url = cli.url.unwrap_or_else(|| DEFAULT_URL.to_string());
    let connect = || async {
        polylock::connect(&url).await.map_err(|e| {
            let code = if matches!(e, LockError::Config(_)) {
                exit::USAGE
            } else {
                exit::BACKEND
            };
            Failure::new(code, format!("cannot connect to the lock service: {e}"))
        })
    };
    match cli.command {
        Command::Run {
            name,
            ttl,
            wait,
            grace,
            command,
        } => {
            let locker: Locker = connect().await?;
            run::run(&locker, &name, ttl, wait, grace, &command).await
        }
        Command::Guarantees => {
            print!("{}", polylock::guarantees_table());
            Ok(0)
        }
        Command::Status { name } => admin::status(&connect().await?, &name).await,
        Command::Release { name, force } => {
            if !force {
                return Err(Failure::new(
                    exit::USAGE,
                    "refusing to release without --force: removing a lock someone holds \
                     breaks mutual exclusion; use it only when the holder is dead",
                ));
            }
            admin::force_release(&connect().await?, &name).await
        }
    }
}
