//! Command-line options: tracing (no subcommand; `--interval` or `top` for the live view),
//! `advise`, `doctor`, `demo`, `serve`, `scan` and `recommend`.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

use crate::advice::Target;
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

    #[command(flatten)]
    pub run: RunArgs,
}

/// A tracing run and its output: the default command's options, and `top`'s.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub tracing: TracingArgs,

    /// Print NDJSON (one JSON object per line) instead of the text report.
    #[arg(long)]
    pub json: bool,

    /// Also write every record as NDJSON to FILE as it happens, whatever stdout shows, so that
    /// `throttle-tracer report FILE` can print the end report again later.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,

    /// Live view: refresh a table of the cgroups stopped in each interval (e.g. 1s) until
    /// Ctrl-C or --duration, then print the full summary. Redraws in place on a terminal (keys:
    /// arrows, PgUp/PgDn, Home/End select a row; s sorts by wall time, stops, p99 or name; /
    /// filters by path or name; Enter shows the selected row's histograms; p switches to the
    /// processes held; q quits), prints timestamped blocks when piped. `top` is the same with 1s.
    #[arg(long, value_name = "DURATION", value_parser = positive_duration, conflicts_with = "json")]
    pub interval: Option<Duration>,

    /// Hide stops shorter than this (e.g. 10ms) from the live view and the NDJSON stop lines;
    /// the summary at the end still counts every stop.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub min_stop: Option<Duration>,

    /// Stop after this long (e.g. 10s, 1m30s); default: until Ctrl-C or SIGTERM.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
}

/// What to trace and how: the options every tracing command shares (the default command, `top`,
/// `serve`).
#[derive(Debug, clap::Args)]
pub struct TracingArgs {
    /// Trace only this cgroup, as seen under the cgroup mount that holds the cpu controller
    /// (e.g. /system.slice/docker-abc.scope, or /demo), or the cgroups a glob matches (`*`, `?`
    /// and `[abc]` within one path component: '/system.slice/docker-*.scope'; new cgroups are
    /// matched when first seen). Repeatable, with --container and --pid: any of them selects.
    #[arg(long = "cgroup", value_name = "PATH|GLOB")]
    pub cgroups: Vec<String>,

    /// Trace only the container whose id starts with this (hex) prefix, in any runtime's layout
    /// (docker-<id>.scope, /docker/<id>, cri-containerd-<id>, crio-<id>, libpod-<id>).
    /// Repeatable.
    #[arg(long = "container", value_name = "ID")]
    pub containers: Vec<String>,

    /// Trace only the cgroup (in the cpu hierarchy) that process PID is in now. Repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// The throttling target the advice is for: the share of periods its recommended quota
    /// may stop (e.g. 1%, 0.1%, or 0.01).
    #[arg(long, value_name = "SHARE", default_value = "1%")]
    pub target: Target,

    #[command(flatten)]
    pub probes: ProbeArgs,
}

/// How stops are observed: also `demo`'s, which picks its own cgroup.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// How to observe stops; auto takes the first of fentry, kprobe, tracepoint that works and
    /// says why it passed over the others.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,

    /// Read kernel type information from this BTF file instead of /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE", default_value = "/sys/kernel/btf/vmlinux")]
    pub btf: PathBuf,

    /// Bytes of the ring buffer the kernel writes records to: a power of two from 4096 (one
    /// page). Records that find it full are lost, counted and reported, never silently.
    #[arg(long, value_name = "BYTES", default_value_t = RING_BUFFER_DEFAULT, value_parser = ring_buffer_size)]
    pub ring_buffer_size: u32,
}

/// `--ring-buffer-size` unless given: 1 MiB, hundreds of thousands of stops per second.
pub const RING_BUFFER_DEFAULT: u32 = 1 << 20;

/// The kernel's rule for a BPF ring buffer's size: a power of two, a multiple of the page.
fn ring_buffer_size(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n >= 4096 && n.is_power_of_two() => Ok(n),
        _ => Err("must be a power of two from 4096 to 2147483648 (e.g. 65536)".into()),
    }
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
    /// The live view: the tracing options with `--interval 1s` unless another is given.
    Top(RunArgs),
    /// Traces for --duration and prints only what to set: for each cgroup whose periods were
    /// measured (every backend, where the kernel lets it), its busy runs' demand and the quota, burst and period
    /// that fit them. It covers only what the trace saw.
    Advise(AdviseArgs),
    /// Lists every cgroup held by a CPU quota (its own or an ancestor's) with its effective
    /// limit and its cpu.stat counters, most throttled first: where to look, in one reading of
    /// the cgroup tree, without eBPF or privileges beyond reading it.
    Scan(ScanArgs),
    /// Reads what `serve` exported across a fleet from Prometheus over --window and prints
    /// one row per workload: the CPU limit to set so that at most the advice's target share
    /// of periods is stopped (the largest advice any replica had), with what it changes.
    Recommend(RecommendArgs),
    /// Prints the end report of a run recorded with --record FILE again, from the file alone:
    /// the summary, the histograms and the cpu.stat comparison, as the run printed them.
    Report {
        /// The file written by --record.
        file: PathBuf,
    },
    /// The demo's workload, run by `demo` itself inside the demo cgroup.
    #[command(hide = true)]
    DemoWorkload(DemoWorkloadArgs),
    /// `cargo xtask bench`'s ingest and memory figures: generated stop records through a
    /// tracing session's own decode and aggregate path.
    #[command(hide = true)]
    BenchFeed(BenchFeedArgs),
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// How long the workload runs and is traced.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub duration: Duration,

    #[command(flatten)]
    pub probes: ProbeArgs,
}

#[derive(Debug, clap::Args)]
pub struct AdviseArgs {
    /// How long to measure (e.g. 5m): long enough to hold the workload's busiest stretch.
    #[arg(long, value_parser = positive_duration, default_value = "30s")]
    pub duration: Duration,

    /// Print the `advice` NDJSON lines (one per cgroup) instead of the text.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub tracing: TracingArgs,
}

#[derive(Debug, clap::Args)]
pub struct ScanArgs {
    /// One JSON object per cgroup, one per line, instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Read the tree twice, this far apart (e.g. 10s), and show the deltas: what "now" is.
    /// Cgroups made or removed in between are listed as such, without figures.
    #[arg(long, value_name = "DURATION", value_parser = positive_duration)]
    pub interval: Option<Duration>,
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

    /// The rolling window each cgroup's advice covers (its periods' demand of the last
    /// DURATION, bounded in memory: docs/prometheus.md).
    #[arg(long, value_name = "DURATION", value_parser = positive_duration, default_value = "1h")]
    pub advice_window: Duration,

    /// How often each cgroup's advice is made again from its window.
    #[arg(long, value_name = "DURATION", value_parser = positive_duration, default_value = "1m")]
    pub advice_every: Duration,

    /// Export no demand and advice series (and keep no window): the stop series only.
    #[arg(long, conflicts_with_all = ["advice_window", "advice_every"])]
    pub no_advice: bool,

    /// Also write every record as NDJSON to FILE as it happens, so that `throttle-tracer report
    /// FILE` (or the file's `advice` lines, written at the end) can be read later.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,

    #[command(flatten)]
    pub tracing: TracingArgs,
}

/// A duration longer than zero.
fn positive_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be longer than 0 (e.g. 1s, 500ms)".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{e} (e.g. 1s, 500ms)")),
    }
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

#[derive(Debug, clap::Args)]
pub struct BenchFeedArgs {
    #[command(flatten)]
    pub probes: ProbeArgs,
    /// Distinct cgroups the generated stops belong to.
    #[arg(long, default_value_t = 1000)]
    pub cgroups: u64,
    /// Generated stops (a start and an end record each).
    #[arg(long, default_value_t = 1_000_000)]
    pub stops: u64,
    /// NDJSON lines on stdout for every record, as `--json` prints them.
    #[arg(long)]
    pub json: bool,
    /// The Prometheus exporter among the sinks; after feeding, time its text and protobuf
    /// encodings of every cgroup.
    #[arg(long)]
    pub exporter: bool,
    /// After feeding, wait until stdin closes (the bench reads the memory meanwhile).
    #[arg(long)]
    pub hold: bool,
}

/// `recommend`'s options.
#[derive(Debug, clap::Args)]
#[command(after_long_help = RECOMMEND_HELP)]
pub struct RecommendArgs {
    /// Prometheus' base URL, e.g. http://prometheus.monitoring:9090 (with the path prefix it
    /// serves under, if any). Plain HTTP only: no TLS, no authentication.
    #[arg(long, value_name = "URL")]
    pub prometheus: String,

    /// How far back to read the series (Prometheus' range, e.g. 7d, 24h).
    #[arg(long, value_parser = positive_duration, default_value = "7d")]
    pub window: Duration,

    /// The least measured time (the Σ of the periods `serve` measured, over the window and the
    /// workload's pods) a workload needs before it is advised; with less, it is listed as not
    /// advised, with how much it has.
    #[arg(long, value_name = "DURATION", value_parser = positive_duration, default_value = "1h")]
    pub min_data: Duration,

    /// What to print: a table, one JSON object per workload and line, or a `kubectl patch`
    /// document per Kubernetes workload.
    #[arg(long, value_enum, default_value = "table")]
    pub output: RecommendOutput,

    /// The same as --output json.
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RecommendOutput {
    Table,
    Json,
    Patch,
}

const RECOMMEND_HELP: &str = "\
Workloads: Kubernetes namespace/kind/name:container through kube-state-metrics' kube_pod_info,
kube_pod_owner and kube_pod_container_info, joined by pod uid and container id (a ReplicaSet's
pods are its Deployment's); elsewhere one row per cgroup path, its copies on every node together.
The advised limit is the largest throttle_tracer_advised_quota_seconds{fit=\"target\"} / period
any of its pods had in the window; DATA is the measured time behind it. BURST is n/a in
Kubernetes, which cannot set a CPU burst (elsewhere: cpu.max.burst, cpu.cfs_burst_us).
docs/prometheus.md, section \"Fleet-wide advice: recommend\", lists the queries and every column.";

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Options {
        Options::try_parse_from(std::iter::once("throttle-tracer").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn every_tracing_command_takes_the_same_selection() {
        let selection = [
            "--cgroup",
            "/kubepods.slice/*",
            "--container",
            "3f2a",
            "--pid",
            "1",
            "--backend",
            "tracepoint",
        ];
        let check = |t: &TracingArgs| {
            assert_eq!(t.cgroups, ["/kubepods.slice/*"]);
            assert_eq!(t.containers, ["3f2a"]);
            assert_eq!(t.pids, [1]);
            assert_eq!(t.probes.backend, BackendChoice::Tracepoint);
        };
        check(&parse(&selection).run.tracing);
        for command in ["top", "serve", "advise"] {
            let args: Vec<&str> = std::iter::once(command).chain(selection).collect();
            match parse(&args).command {
                Some(Command::Top(run)) => check(&run.tracing),
                Some(Command::Serve(serve)) => check(&serve.tracing),
                Some(Command::Advise(advise)) => check(&advise.tracing),
                other => panic!("{command}: {other:?}"),
            }
        }
    }
}
