//! `polylock-compare` (also `polylock compare`): runs the fault suite
//! against every backend and writes docs/guarantees.md, docs/guarantees.json
//! and docs/timelines/*.svg from what it observed. Exits 1 when a declared
//! claim is contradicted or a scenario could not complete, 2 on bad usage.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use polylock_lab::faults::{client, output, run, scenario::URL_ENV};

/// Measure what each lock backend really guarantees: the same faults
/// against every backend, with real servers, then the observed table.
#[derive(Debug, Parser)]
#[command(name = "polylock-compare", args_conflicts_with_subcommands = true)]
struct Cli {
    /// Backends to run, comma-separated (default: all): sqlite, postgres,
    /// mysql, redis, redis-aof, redis-replica, redis-replica-wait, redlock,
    /// etcd, etcd-cluster, zookeeper, zookeeper-ensemble. `--quick` alone
    /// leaves out redis-aof, the replicated Redis and the three-member
    /// groups.
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// Only the quick subset (client pause, client kill, server restart).
    #[arg(long)]
    quick: bool,
    /// Scenario ids to run, comma-separated (default: all), e.g.
    /// `failover,fence-evicted`.
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// Where guarantees.md, guarantees.json and timelines/ are written.
    #[arg(long, default_value = "docs")]
    out: PathBuf,
    /// Where the client processes' logs go (default: a new directory under
    /// the system's temp dir, kept after the run).
    #[arg(long)]
    logs: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// One lock client process of the suite (started by the harness).
    #[command(hide = true)]
    Client {
        /// The lock service URL (from the environment: it holds secrets).
        #[arg(long, env = URL_ENV, hide_env_values = true)]
        url: String,
        /// The lock name.
        #[arg(long)]
        name: String,
        /// The TTL to ask for.
        #[arg(long, value_parser = duration)]
        ttl: Duration,
        /// The fenced register's address.
        #[arg(long)]
        register: SocketAddr,
        /// This client's id at the register.
        #[arg(long)]
        id: String,
        /// How long each critical section lasts.
        #[arg(long, value_parser = duration, default_value = "100ms")]
        hold: Duration,
        /// How many times to take the lock.
        #[arg(long, default_value_t = 1)]
        rounds: u32,
    },
}

fn duration(s: &str) -> Result<Duration, String> {
    polylock_lab::duration_arg(s)
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("polylock-compare: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Cmd::Client {
        url,
        name,
        ttl,
        register,
        id,
        hold,
        rounds,
    }) = cli.command
    {
        let spec = client::ClientSpec {
            url,
            name,
            ttl,
            register,
            id,
            hold,
            rounds,
        };
        return match rt.block_on(client::run(spec)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("polylock-compare client: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Err(e) = run::select_backends(&cli.backends, cli.quick)
        .and_then(|_| run::select_scenarios(&cli.scenarios, cli.quick))
    {
        eprintln!("polylock-compare: {e}");
        return ExitCode::from(2);
    }
    let client_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("polylock-compare: cannot find my own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let logs = match cli.logs {
        Some(dir) => std::fs::create_dir_all(&dir).map(|()| dir),
        // Kept after the run: the client logs explain a failed scenario.
        None => tempfile::Builder::new()
            .prefix("polylock-compare-")
            .tempdir()
            .map(tempfile::TempDir::keep),
    };
    let logs = match logs {
        Ok(d) => d,
        Err(e) => {
            eprintln!("polylock-compare: log directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = run::Config {
        backends: cli.backends,
        quick: cli.quick,
        scenarios: cli.scenarios,
        client_exe,
        log_dir: logs,
    };
    let report = match rt.block_on(run::run(&config)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("polylock-compare: {e}");
            return ExitCode::FAILURE;
        }
    };
    match output::write_all(&report, &cli.out) {
        Ok(files) => {
            for f in files {
                eprintln!("polylock-compare: wrote {}", f.display());
            }
        }
        Err(e) => {
            eprintln!("polylock-compare: {e}");
            return ExitCode::FAILURE;
        }
    }
    let errors = report.errors();
    eprintln!(
        "polylock-compare: {} scenario runs in {:.0} s, client logs in {}",
        report.cells.len(),
        report.elapsed.as_secs_f64(),
        config.log_dir.display()
    );
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        for e in &errors {
            eprintln!("polylock-compare: ERROR: {e}");
        }
        ExitCode::FAILURE
    }
}
