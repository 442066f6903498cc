//! `throttle-tracer`: traces every CFS bandwidth stop and reports what the quota really did.
//!
//! Data flows one way: kernel probes (`probes`) → ring-buffer records (`records`) → per-cgroup
//! state (`aggregate`) → reports (`report`), with `btf`, `cgroups` and `cpustat` as inputs.
mod agent;
mod aggregate;
mod btf;
mod cgroups;
mod cli;
mod cpustat;
mod doctor;
mod error;
mod probes;
mod records;
mod report;

use clap::Parser as _;

fn main() {
    let options = cli::Options::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    if let Some(cli::Command::Doctor { json }) = options.command {
        std::process::exit(doctor::run(json));
    }
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
    if let Err(failure) = runtime.block_on(agent::run(options)) {
        eprintln!("{failure}");
        std::process::exit(failure.exit_code());
    }
}
