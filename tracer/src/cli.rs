//! Command-line options: tracing (no subcommand), `doctor`, `demo` and `serve`.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

use crate::probes::BackendChoice;

/// Traces every CFS bandwidth (CPU quota) stop on this machine, per CPU and per cgroup, until
/// Ctrl-C or --duration, then reports real stop lengths next to what cpu.stat says.
#[derive(Debug, Parser)]
#[command(
    name = "throttle-tracer",
    version,
    args_conflicts_with_subcommands = true
)]
pub struct Options {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Print NDJSON (one JSON object per line) instead of the text report.
    #[arg(long)]
    pub json: bool,

    /// Trace only this cgroup, as seen under the cgroup mount that holds the cpu controller
    /// (e.g. /system.slice/docker-abc.scope, or /demo). Repeatable.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,

    /// Stop after this long (e.g. 10s, 1m30s); default: until Ctrl-C or SIGTERM.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,

    /// How to observe stops; auto takes the first of fentry, kprobe, tracepoint that works and
    /// says why it passed over the others.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,

    /// Read kernel type information from this BTF file instead of /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE", default_value = "/sys/kernel/btf/vmlinux")]
    pub btf: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Checks what this machine allows (BTF, cgroups, privileges, and each backend, by really
    /// attaching it for a moment) and says which backend tracing would use. Exits 0 when at
    /// least one backend works, 1 otherwise.
    Doctor {
        /// Print one JSON object instead of the text.
        #[arg(long)]
        json: bool,
    },
    /// Shows the problem on this machine in about 15 seconds, with no set-up: makes a
    /// temporary cgroup with a quota of half a CPU, runs bursty requests in it (0.2 CPU on
    /// average), traces it, explains the stops next to cpu.stat, and removes everything.
    Demo(DemoArgs),
    /// Traces like the default command and serves the per-cgroup stop histograms and counters,
    /// with each cgroup's own cpu.stat counters beside them, for Prometheus at /metrics.
    Serve(ServeArgs),
    /// The demo's workload, run by `demo` itself inside the demo cgroup.
    #[command(hide = true)]
    DemoWorkload(DemoWorkloadArgs),
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// How long the workload runs and is traced.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub duration: Duration,

    /// How to observe stops (as for tracing).
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,

    /// Read kernel type information from this BTF file instead of /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE", default_value = "/sys/kernel/btf/vmlinux")]
    pub btf: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Where to serve /metrics. Loopback only unless an address is given (in a pod:
    /// 0.0.0.0:9464).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,

    /// The most cgroups with series of their own; stops of further cgroups are left out and
    /// counted in throttle_tracer_cgroups_dropped_total{reason="limit"}.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub max_cgroups: usize,

    /// How long a removed cgroup's series stay before they are dropped (and counted in
    /// throttle_tracer_cgroups_dropped_total{reason="gone"}).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    pub gone_after: Duration,

    /// Trace only this cgroup (as for tracing). Repeatable.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,

    /// How to observe stops (as for tracing).
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,

    /// Read kernel type information from this BTF file instead of /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE", default_value = "/sys/kernel/btf/vmlinux")]
    pub btf: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct DemoWorkloadArgs {
    /// The demo cgroup's `cgroup.procs`, which the workload moves itself into first.
    #[arg(long, value_name = "FILE")]
    pub procs: PathBuf,
    /// The demo's pid: the workload exits if it is gone.
    #[arg(long)]
    pub parent: u32,
    /// How long bursts keep arriving.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Duration,
}
