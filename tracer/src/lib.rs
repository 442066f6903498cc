//! `throttle-tracer`: traces every CFS bandwidth stop and reports what the quota really did.
//! The program is [`main`]; the binary (main.rs) only calls it. It is a library so that the fuzz
//! targets (fuzz/, the `fuzzing` feature) can call the parsers through `fuzz`.
//!
//! Data flows one way: kernel probes (`probes`) → ring-buffer records (`records`) → per-cgroup
//! state (`aggregate`) → reports (`report`), with `btf`, `cgroups` and `cpustat` as inputs.
use std::io::Write as _;

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
mod wallclock;

use clap::Parser as _;

/// The maps every record goes through, keyed by cgroup ids, cfs_rq addresses and pids: with
/// the standard library's SipHash, hashing was a tenth of the ingest path's time.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The program: parses the command line, runs the command and exits with its status.
pub fn main() {
    let options = cli::Options::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    let command = match options.command {
        Some(cli::Command::Doctor { json }) => std::process::exit(doctor::run(json)),
        Some(cli::Command::DemoWorkload(args)) => std::process::exit(demo::workload_main(args)),
        Some(cli::Command::Report { file }) => std::process::exit(replay::main(&file)),
        Some(cli::Command::Scan(args)) => std::process::exit(scan::main(&args)),
        other => other,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = match command {
        Some(cli::Command::Demo(args)) => runtime.block_on(demo::run(args)),
        Some(cli::Command::Serve(args)) => runtime.block_on(serve::run(args)).map(|()| 0),
        Some(cli::Command::Advise(args)) => runtime.block_on(agent::advise(args)).map(|()| 0),
        Some(cli::Command::BenchFeed(args)) => {
            runtime.block_on(async { feed::run(&args) }).map(|()| 0)
        }
        Some(cli::Command::Top(mut run)) => {
            run.interval
                .get_or_insert(std::time::Duration::from_secs(1));
            runtime.block_on(agent::run(run)).map(|()| 0)
        }
        _ => runtime.block_on(agent::run(options.run)).map(|()| 0),
    };
    match result {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        Err(failure) => {
            // Not eprintln!, which panics (exit 101) when standard error is a closed pipe
            // (`2>&1 | head -1`): the exit status is the one thing left to say then.
            let _ = writeln!(std::io::stderr(), "{failure}");
            std::process::exit(failure.exit_code());
        }
    }
}
