//! `polylock`: a distributed flock(1), plus status and an operator's release.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};
use polylock::{Config, ExpiryClock, LockError, Locker};

mod admin;
mod child;
mod duration;
mod exit;
mod external;
mod run;
mod say;
use say::say;

/// Where locks live when neither --url nor POLYLOCK_URL says: a SQLite file
/// in the current directory, so the command works with nothing configured.
const DEFAULT_URL: &str = "sqlite://polylock.db";

/// How long the runtime may take to finish background work at exit; with
/// the release's own budget, polylock exits within about a second of the
/// command's end even when the lock service is gone.
const SHUTDOWN_BUDGET: Duration = Duration::from_millis(200);

#[derive(Parser, Debug)]
#[command(
    name = "polylock",
    version,
    about = "Distributed locks from the command line: run a command while holding a lock.",
    after_help = concat!("Examples:
  polylock run nightly-report -- ./report.sh
      Run report.sh only if no other machine is running it; wait up to 10s.
  polylock run -n --ttl 1m backup -- rsync -a /data backup:/data
      Skip this run (exit 75) if a backup is already running.
  polylock run deploy -c 'make build && make deploy'
      Run a shell command line under the lock.
  POLYLOCK_URL=redis://cache:6379 polylock run deploy -- make deploy
      Use Redis instead of the SQLite file in the current directory.
  polylock status nightly-report
      Show who holds the lock, its fencing token and time left.

The lock URL comes from --url, else $POLYLOCK_URL, else ", "sqlite://polylock.db", " (a file
in the current directory). The command sees the fencing token in $POLYLOCK_FENCE and the
lock name in $POLYLOCK_NAME. Logs go to stderr: -v for debug, -vv for trace, or RUST_LOG
(e.g. RUST_LOG=lock_core=trace,backend_redis=debug).

", include_str!("exit_help.txt"))
)]
struct Cli {
    /// Lock service URL (the schemes of this build are listed here at run time).
    #[arg(long, global = true, env = "POLYLOCK_URL", hide_env_values = true)]
    url: Option<String>,
    /// A polylock config file (TOML: url or [migrate], ttl, wait, credentials by
    /// environment variable name, TLS files); instead of --url.
    #[arg(
        long,
        global = true,
        env = "POLYLOCK_CONFIG",
        value_name = "FILE",
        conflicts_with = "url"
    )]
    config: Option<std::path::PathBuf>,
    /// More logging on stderr: -v debug, -vv trace (RUST_LOG overrides).
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// The flags `run` and `hold` share with flock(1).
#[derive(clap::Args, Debug)]
struct LockFlags {
    /// Lock name.
    name: String,
    /// Lease length (at least 1s); renewed every third of it, or sooner where the
    /// backend trusts a lease for less (ZooKeeper ensembles) [default: the config
    /// file's ttl, else 30s].
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true)]
    ttl: Option<Duration>,
    /// How long to wait for another holder to release [default: the config file's
    /// wait, else 10s].
    #[arg(short, long, value_parser = duration::parse, allow_hyphen_values = true)]
    wait: Option<Duration>,
    /// Do not wait: fail at once if the lock is held (same as --wait 0).
    #[arg(short, long, conflicts_with = "wait")]
    nonblock: bool,
    /// Exit code when the lock is held elsewhere (after -n or --wait).
    #[arg(short = 'E', long, default_value_t = exit::LOCK_TIMEOUT, value_name = "CODE")]
    conflict_exit_code: u8,
    /// Do not store this host's name, polylock's pid, the command line and the start
    /// time beside the lock (stored by default, for `status`; anyone who can read
    /// the lock service can read them).
    #[arg(long)]
    no_meta: bool,
}

impl LockFlags {
    /// The TTL: the flag, else the config file's, else 30s.
    fn ttl(&self, config: &Config) -> Duration {
        self.ttl.or(config.ttl()).unwrap_or(Duration::from_secs(30))
    }

    /// Refuses a TTL or wait out of range, before connecting.
    fn check(&self, config: &Config) -> Result<(), Failure> {
        run::check_ttl(None, self.ttl(config))?;
        run::check_wait(self.args(config, "").wait)
    }

    /// `command`: what `status` shows as the holder's command line.
    fn args(&self, config: &Config, command: &str) -> run::LockArgs {
        run::LockArgs {
            meta: (!self.no_meta).then(|| polylock::HolderMeta::of_this_process(command)),
            name: self.name.clone(),
            ttl: self.ttl(config),
            wait: if self.nonblock {
                Duration::ZERO
            } else {
                self.wait
                    .or(config.wait())
                    .unwrap_or(Duration::from_secs(10))
            },
            conflict: self.conflict_exit_code,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Take the lock, run COMMAND while keeping the lock renewed, release it when COMMAND exits.
    #[command(after_help = concat!("Examples:
  polylock run nightly-report -- ./report.sh --full
  polylock run -n backup -- rsync -a /data backup:/data
  polylock run -w 1m -E 0 cleanup -c 'find /tmp -mtime +7 -delete'

COMMAND runs in its own process group and dies with polylock (even if polylock is
killed). SIGINT, SIGTERM and SIGHUP reach it once. If renewals fail, it gets SIGTERM
early enough that SIGTERM + --grace ends at the lease's deadline, and SIGKILL at the
deadline; if the lock is found lost, it is killed at once.

", include_str!("exit_help.txt")))]
    Run {
        #[command(flatten)]
        lock: LockFlags,
        /// After renewals start failing, time between SIGTERM and SIGKILL of COMMAND
        /// (at most a third of the TTL, and half the time from the missed renewal to
        /// the deadline).
        #[arg(long, default_value = "10s", value_parser = duration::parse, allow_hyphen_values = true)]
        grace: Duration,
        /// Run this shell command line with `sh -c` instead of COMMAND.
        #[arg(
            short = 'c',
            long = "command",
            value_name = "SHELL_COMMAND",
            conflicts_with = "command"
        )]
        shell: Option<String>,
        /// The command and its arguments, after `--`.
        #[arg(required_unless_present = "shell", last = true, num_args = 1..)]
        command: Vec<OsString>,
    },
    /// Take the lock, print its fencing token, hold it until interrupted or stdin closes.
    #[command(after_help = concat!("Examples:
  polylock hold maintenance
      Hold the lock (renewed) until Ctrl-C; the first line printed is the fencing token.
  some-producer | polylock hold deploy
      Hold it until the producer closes the pipe (stdin reaches its end).

", include_str!("exit_help.txt")))]
    Hold {
        #[command(flatten)]
        lock: LockFlags,
    },
    /// Show who holds a lock (token, time left, host, pid, command), who waits (exit 1 if free).
    #[command(after_help = "Examples:
  polylock status nightly-report
  polylock --url redis://cache:6379 status deploy

For a migration lock (--url migrate+LEGACY_URL?to=TARGET_URL&phase=...), both sides are
shown: who holds the legacy lock and who holds the target lock.")]
    Status {
        /// Lock name.
        name: String,
    },
    /// List the held locks whose names start with PREFIX (exit 1 if none).
    #[command(after_help = "Examples:
  polylock list
  polylock --url etcd://10.0.0.5:2379 list reports/

One line per lock: name, a prefix of the holder's token, fencing token, time left, and the
holder's pid and host when it stored them (polylock run and hold do, unless --no-meta).
Backends that cannot enumerate their locks say so (exit 64). On Redis only locks polylock
took are listed: a foreign client's key looks like any other key.")]
    List {
        /// Name prefix (default: every lock).
        #[arg(default_value = "")]
        prefix: String,
        /// At most this many locks.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Print what each backend in this build guarantees, as a Markdown table.
    Guarantees,
    /// UNSAFE: remove a lock whoever holds it. A live holder keeps running
    /// without knowing; only for holders you know are dead.
    #[command(after_help = "Examples:
  polylock status nightly-report            # check who holds it first
  polylock release --force nightly-report")]
    Release {
        /// Lock name.
        name: String,
        /// Required: confirms you accept breaking mutual exclusion.
        #[arg(long)]
        force: bool,
    },
    /// Run the fault suite and write the observed guarantee table (runs polylock-compare).
    #[command(disable_help_flag = true)]
    Compare {
        /// Arguments for polylock-compare (`polylock compare --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Measure each backend against its raw server round trip (runs polylock-bench).
    #[command(disable_help_flag = true)]
    Bench {
        /// Arguments for polylock-bench (`polylock bench --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
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

/// `text` on one line: drivers' multi-line messages (a server's banner, a
/// protocol dump) become `; `-separated parts.
pub(crate) fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The CLI definition, with the `--url` help listing this build's schemes.
fn command() -> clap::Command {
    let schemes = polylock::available_schemes()
        .iter()
        .map(|s| format!("{s}://"))
        .collect::<Vec<_>>()
        .join(", ");
    Cli::command().mut_arg("url", |a| {
        a.help(format!(
            "Lock service URL; this build knows {schemes}, and migrate+URL?to=TARGET_URL&phase=both \
             for a migration lock [default: {DEFAULT_URL}]"
        ))
    })
}

/// Parses the arguments; on error, the exit code to return after the
/// message was printed.
fn parse() -> Result<Cli, ExitCode> {
    let parsed = command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    parsed.map_err(|e| {
        if e.kind() == ErrorKind::UnknownArgument {
            if let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) {
                if !arg.starts_with('-') {
                    // `polylock run foo echo hi`: the command must follow `--`.
                    say!(
                        "error: unexpected argument '{arg}': put the command after `--`, \
                         e.g. polylock run NAME -- {arg} ...\n\nFor more information, try '--help'."
                    );
                    return ExitCode::from(exit::USAGE);
                }
            }
        }
        // --help and --version print to stdout and succeed; anything else
        // is a usage error with the documented exit code.
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(exit::USAGE)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Logs to stderr: RUST_LOG when set, else warnings (which include why a
/// lock was lost), debug with -v, trace with -vv.
fn init_logging(verbose: u8) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let level = match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    let ours = || {
        Targets::new()
            .with_target("polylock", level)
            .with_target("lock_core", level)
            .with_target("backend_sql", level)
            .with_target("backend_redis", level)
            .with_target("backend_etcd", level)
            .with_target("backend_zk", level)
            .with_target("backend_migrate", level)
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => spec.parse::<Targets>().unwrap_or_else(|e| {
            say!("polylock: warning: ignoring RUST_LOG ({e})");
            ours()
        }),
        _ => ours(),
    };
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(say::Writer::default))
        .with(filter)
        .try_init();
}

fn main() -> ExitCode {
    let code = run_polylock();
    // What polylock said is on stderr before it exits (the command is gone
    // and the lock released by now).
    say::flush();
    code
}

fn run_polylock() -> ExitCode {
    // `compare` and `bench` hand every argument after them to their own
    // programs untouched: parsed here, their `--url`, `--config` and `-v`
    // would be taken for polylock's global flags (a bench's `--url` lost,
    // two of them refused).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(tool @ ("compare" | "bench")) = argv.get(1).and_then(|a| a.to_str()) {
        let f = external::exec(tool, &argv[2..]);
        say!("polylock: {}", one_line(&f.message));
        return ExitCode::from(f.code);
    }
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    init_logging(cli.verbose);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("polylock: cannot start the async runtime: {e}");
            return ExitCode::from(exit::BACKEND);
        }
    };
    // `block_on` polls `dispatch` on this (the main) thread, so the command
    // is forked from a thread that lives as long as polylock: its
    // parent-death signal fires only when polylock dies (see child.rs).
    let outcome = rt.block_on(dispatch(cli));
    // Releases handed off by guards get a moment; a gone server must not
    // keep polylock alive after the command ended.
    rt.shutdown_timeout(SHUTDOWN_BUDGET);
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            say!("polylock: {}", one_line(&f.message));
            ExitCode::from(f.code)
        }
    }
}

/// Connects, and refuses a backend whose locks live inside this process
/// (see [`refuse_in_process`]): before any I/O when its URL's scheme says
/// so (a migration lock's side included), else once connected.
async fn connect(config: &Config) -> Result<Locker, Failure> {
    refuse_in_process_urls(config.url())?;
    let locker = config.connect().await.map_err(|e| {
        let code = if matches!(e, LockError::Config(_)) {
            exit::USAGE
        } else {
            exit::BACKEND
        };
        Failure::new(code, format!("cannot connect to the lock service: {e}"))
    })?;
    refuse_in_process(&locker.guarantees())?;
    Ok(locker)
}

/// Refuses a backend whose locks live inside this process: it cannot lock
/// anything across processes, so every `polylock` would see its own, empty,
/// lock table.
fn refuse_in_process(g: &polylock::Guarantees) -> Result<(), Failure> {
    if g.expiry_clock == ExpiryClock::Local {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "the {} backend keeps its locks inside one process: another polylock (or any \
                 other process) cannot see them, so it cannot lock anything across processes; \
                 use e.g. sqlite://FILE for a lock on this machine",
                g.backend
            ),
        ));
    }
    Ok(())
}

/// [`refuse_in_process`] for a URL whose backend declares only in-process
/// locks, and for either side of a migration lock's URL, whatever its
/// phase: a side no other process sees is no step of a migration. A URL
/// that does not parse is left to connecting, which says why.
pub(crate) fn refuse_in_process_urls(url: &str) -> Result<(), Failure> {
    let urls = match polylock::MigrateConfig::parse(url) {
        Ok(m) => vec![m.legacy_url().to_string(), m.target_url().to_string()],
        Err(_) => vec![url.to_string()],
    };
    for url in urls {
        let declared = polylock::declared_guarantees_of(&url).unwrap_or_default();
        if let Some(g) = declared.first() {
            if declared
                .iter()
                .all(|g| g.expiry_clock == ExpiryClock::Local)
            {
                refuse_in_process(g)?;
            }
        }
    }
    Ok(())
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let config = match (&cli.config, cli.url) {
        (Some(file), _) => Config::from_file(file)?,
        (None, url) => Config::from_url(url.unwrap_or_else(|| DEFAULT_URL.to_string())),
    };
    let url = config.url().to_string();
    match cli.command {
        Command::Compare { args } => Err(external::exec("compare", &args)),
        Command::Bench { args } => Err(external::exec("bench", &args)),
        Command::Run {
            lock,
            grace,
            shell,
            command,
        } => {
            let command = match shell {
                Some(line) => vec!["sh".into(), "-c".into(), line.into()],
                None => command,
            };
            lock.check(&config)?;
            let locker = connect(&config).await?;
            let line = command
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ");
            run::run(&locker, &lock.args(&config, &line), grace, &command).await
        }
        Command::Hold { lock } => {
            lock.check(&config)?;
            let args = lock.args(&config, "polylock hold");
            run::hold(&connect(&config).await?, &args).await
        }
        Command::Guarantees => {
            admin::quiet_on_closed_stdout();
            print!("{}", polylock::guarantees_table());
            Ok(0)
        }
        Command::Status { name } if polylock::MigrateConfig::parse(&url).is_ok() => {
            admin::quiet_on_closed_stdout();
            admin::status_migrate(&url, &name).await
        }
        Command::Status { name } => {
            admin::quiet_on_closed_stdout();
            admin::status(&connect(&config).await?, &name).await
        }
        Command::List { prefix, limit } => {
            admin::quiet_on_closed_stdout();
            admin::list(&connect(&config).await?, &prefix, limit).await
        }
        Command::Release { name, force } => {
            if !force {
                return Err(Failure::new(
                    exit::USAGE,
                    "refusing to release without --force: removing a lock someone holds \
                     breaks mutual exclusion; use it only when the holder is dead",
                ));
            }
            admin::force_release(&connect(&config).await?, &name).await
        }
    }
}
