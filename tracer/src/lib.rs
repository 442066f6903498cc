//! `throttle-tracer`: traces every CFS bandwidth stop and reports what the quota really did.
//! The program is [`main`]; the binary (main.rs) only calls it. It is a library so that the fuzz
//! targets (fuzz/, the `fuzzing` feature) can call the parsers through `fuzz`.
//!
//! Data flows one way: kernel probes (`probes`) → ring-buffer records (`records`) → per-cgroup
//! state (`aggregate`) → reports (`report`), with `btf`, `cgroups` and `cpustat` as inputs.
mod advice;
mod agent;
mod aggregate;
mod btf;
mod cgroups;
mod cli;
mod cpustat;
mod demo;
mod doctor;
mod error;
mod feed;
mod filter;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
mod names;
mod opening;
mod privileges;
mod probes;
#[cfg(test)]
mod readme;
mod recommend;
mod records;
mod replay;
mod report;
mod sampler;
mod scan;
mod schema;
mod serve;
mod sys;
mod terminal;
#[cfg(test)]
mod testing;
mod units;
mod wallclock;

use clap::Parser as _;

use error::{Exit, Failure, say};

/// The maps every record goes through, keyed by cgroup ids, cfs_rq addresses and pids: with
/// the standard library's SipHash, hashing was a tenth of the ingest path's time.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The program: runs the command and exits with its status. Errors leave through here alone,
/// as one `error:` line (and a `hint:`), never as a panic: not even with standard error closed.
pub fn main() {
    let code = match try_main() {
        Ok(()) => 0,
        Err(Exit::Failed(failure)) => {
            say!("{failure}");
            failure.exit_code()
        }
        Err(Exit::Status(code)) => code,
    };
    std::process::exit(code);
}

/// Parses the command line and runs the command.
fn try_main() -> Result<(), Exit> {
    let options = cli::Options::try_parse().map_err(|usage| {
        // Clap's own text: the usage error, or `--help` and `--version` on standard output.
        let _ = usage.print();
        Exit::Status(usage.exit_code())
    })?;
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    // The commands that need no async runtime start none.
    let command = match options.command {
        Some(cli::Command::Doctor { json }) => return doctor::run(json),
        Some(cli::Command::DemoWorkload(args)) => return demo::workload_main(args),
        Some(cli::Command::Report { file }) => return Ok(replay::run(&file)?),
        Some(cli::Command::Scan(args)) => return Ok(scan::run(&args)?),
        other => other,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            Failure::environment_without_hint(format!("cannot start the async runtime: {e}"))
        })?;
    let traced = match command {
        Some(cli::Command::Demo(args)) => return runtime.block_on(demo::run(args)),
        Some(cli::Command::Serve(args)) => runtime.block_on(serve::run(args)),
        Some(cli::Command::Advise(args)) => runtime.block_on(agent::advise(args)),
        Some(cli::Command::Recommend(args)) => runtime.block_on(recommend::run(args)),
        Some(cli::Command::BenchFeed(args)) => runtime.block_on(async { feed::run(&args) }),
        Some(cli::Command::Top(mut run)) => {
            run.interval
                .get_or_insert(std::time::Duration::from_secs(1));
            runtime.block_on(agent::run(run))
        }
        _ => runtime.block_on(agent::run(options.run)),
    };
    Ok(traced?)
}
