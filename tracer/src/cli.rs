//! Command-line options.
use std::{path::PathBuf, time::Duration};

use clap::Parser;

use crate::probes::Backend;

/// Traces every CFS bandwidth (CPU quota) stop on this machine, per CPU and per cgroup, until
/// Ctrl-C or --duration, then reports real stop lengths next to what cpu.stat says.
#[derive(Debug, Parser)]
#[command(name = "throttle-tracer", version)]
pub struct Options {
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

    /// How to observe stops.
    #[arg(long, value_enum, default_value = "kprobe")]
    pub backend: Backend,

    /// Read kernel type information from this BTF file instead of /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE", default_value = "/sys/kernel/btf/vmlinux")]
    pub btf: PathBuf,
}
