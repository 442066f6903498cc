//! `cargo xtask bench`: what throttle-tracer costs on this host, side by side with bpftrace
//! and the floor, in one run and one table (printed, and written to target/bench/bench.json).
//!
//! Every figure has its unit, its number of runs, min / median / max, and its ratio to a
//! reference measured in the same run: the ratios, not the absolute figures, carry over from
//! one machine to another. The sections:
//! - [`kernel`]: ns per invocation of each tracepoint-backend program (the kernel's BPF
//!   run-time statistics) next to an empty program on the same hook and bpftrace's check;
//! - [`slowdown`]: `perf bench sched pipe` and `sched messaging` without / with the tracer /
//!   with bpftrace, alternated;
//! - [`startup`]: exec → NDJSON `start` line per backend vs bpftrace's, and where it goes;
//! - [`vm_startup`]: the same in the vm-test kernels' guests, where kprobe and fentry exist;
//! - [`ingest`]: records/s through the real decode and aggregate path, and memory;
//! - [`sustained`]: real cgroups throttling every few ms, with the losses counted.
//!
//! The kprobe and fentry backends' kernel cost is measured in the vm-test guests instead
//! ([`vm_cost`]): this host has no kprobes and refuses fentry.
//!
//! The measuring holds /tmp/tt-host.lock, the lock the host tests take, so that no other
//! session's test runs meanwhile. Figures only: nothing here asserts a timing. Needs root.
mod bpf;
mod ingest;
mod kernel;
mod loads;
pub(crate) mod procs;
mod slowdown;
pub mod startup;
mod sustained;
mod table;
pub mod vm_cost;
pub mod vm_startup;

use crate::binaries::{self, Binaries};
use crate::{cmd, paths, setup};
use anyhow::{Context as _, Result, bail};
use aya_obj::generated::bpf_prog_type;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
use table::{Row, Table};

#[derive(clap::Args)]
pub struct Args {
    /// A few seconds of each measurement, for CI: that every figure can still be taken.
    #[arg(long)]
    smoke: bool,
    /// Runs of each repeated measurement (default: 10; 1 with --smoke).
    #[arg(long)]
    runs: Option<usize>,
    /// Measure this throttle-tracer binary instead of the one just built (to compare builds).
    #[arg(long, value_name = "PATH")]
    tracer: Option<PathBuf>,
    /// Only these sections (kernel, slowdown, startup, ingest, sustained, vm-startup), for
    /// working on one.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// vm-startup's kernel series, repeatable: 5.10, 6.1, 6.12, 7 (default: all of them).
    #[arg(long = "kernel", value_name = "SERIES")]
    kernels: Vec<String>,
}

/// What every section needs.
pub struct Bench {
    pub tracer: PathBuf,
    pub workload: PathBuf,
    pub smoke: bool,
    pub runs: usize,
    /// vm-startup's kernel series (empty: every kernel of the VM matrix).
    pub kernels: Vec<String>,
}

/// A bpftrace one-liner the bench compares with, and the programs it loads: bpftrace prints
/// "Attaching" before it loads them, and is ready once they are all loaded.
pub struct Check {
    /// The tracer backend whose peer it is: it attaches as that backend does.
    pub backend: &'static str,
    pub script: &'static str,
    pub program_type: bpf_prog_type,
    /// What its programs attach to, for the table.
    pub hook: &'static str,
    /// How many programs it loads (one per probe).
    pub programs: usize,
}

/// bpftrace's one-line version of the detection on sched_switch: is the task switched out
/// on a throttled cfs_rq; a count per task group.
pub const BPFTRACE_CHECK: Check = Check {
    backend: "tracepoint",
    script: "tracepoint:sched:sched_switch { $rq = curtask->se.cfs_rq; \
             if ($rq->throttled) { @[$rq->tg] = count(); } }",
    program_type: bpf_prog_type::BPF_PROG_TYPE_TRACEPOINT,
    hook: "sched_switch",
    programs: 1,
};

/// The kprobe backend's peer: a throttle's length per task group, from kprobes on the two
/// functions every kprobe-traced stop begins and ends in.
pub const BPFTRACE_KPROBE_CHECK: Check = Check {
    backend: "kprobe",
    script: "kprobe:throttle_cfs_rq { @start[arg0] = nsecs; } \
             kprobe:unthrottle_cfs_rq /@start[arg0]/ { \
             @[((struct cfs_rq *)arg0)->tg] = hist(nsecs - @start[arg0]); delete(@start[arg0]); }",
    program_type: bpf_prog_type::BPF_PROG_TYPE_KPROBE,
    hook: "throttle_cfs_rq, unthrottle_cfs_rq",
    programs: 2,
};

/// The fentry backend's peer: the same as [`BPFTRACE_KPROBE_CHECK`] with bpftrace's kfunc
/// (fentry) probes, which read the functions' typed arguments from BTF.
pub const BPFTRACE_KFUNC_CHECK: Check = Check {
    backend: "fentry",
    script: "kfunc:throttle_cfs_rq { @start[args->cfs_rq] = nsecs; } \
             kfunc:unthrottle_cfs_rq /@start[args->cfs_rq]/ { \
             @[args->cfs_rq->tg] = hist(nsecs - @start[args->cfs_rq]); delete(@start[args->cfs_rq]); }",
    program_type: bpf_prog_type::BPF_PROG_TYPE_TRACING,
    hook: "throttle_cfs_rq, unthrottle_cfs_rq",
    programs: 2,
};

impl Check {
    /// bpftrace's probe type (`kprobe`, `kfunc`, `tracepoint`).
    pub fn probe(&self) -> &'static str {
        self.script.split(':').next().unwrap_or("")
    }
}

/// The check that attaches as `backend` does.
pub fn check_for(backend: &str) -> Option<&'static Check> {
    [
        &BPFTRACE_CHECK,
        &BPFTRACE_KPROBE_CHECK,
        &BPFTRACE_KFUNC_CHECK,
    ]
    .into_iter()
    .find(|c| c.backend == backend)
}

const LOCK: &str = "/tmp/tt-host.lock";

pub fn run(args: &Args) -> Result<()> {
    let runs = args.runs.unwrap_or(if args.smoke { 1 } else { 10 });
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    // QEMU and busybox for vm-startup, which --smoke leaves out.
    if args.smoke {
        setup::run(&[setup::Part::Build, setup::Part::Bench])?;
    } else {
        setup::run(&[setup::Part::Build, setup::Part::Bench, setup::Part::Vm])?;
    }
    let mut binaries = binaries::build()?;
    if let Some(tracer) = &args.tracer {
        binaries.tracer.clone_from(tracer);
    }
    measure(
        args,
        &Bench {
            tracer: binaries.tracer,
            workload: binaries.workload,
            smoke: args.smoke,
            runs,
            kernels: args.kernels.clone(),
        },
    )
}

/// `cargo xtask test`'s `bench --smoke`, on the programs of its tests' compile (a build of
/// its own would compile the tracer a second time, without the dev-dependencies' features)
/// and with what its set-up installed.
pub fn smoke(binaries: &Binaries) -> Result<()> {
    let args = Args {
        smoke: true,
        runs: None,
        tracer: None,
        only: Vec::new(),
        kernels: Vec::new(),
    };
    measure(
        &args,
        &Bench {
            tracer: binaries.tracer.clone(),
            workload: binaries.workload.clone(),
            smoke: true,
            runs: 1,
            kernels: Vec::new(),
        },
    )
}

/// Every section (or those `args` names) of `bench`, one table.
fn measure(args: &Args, bench: &Bench) -> Result<()> {
    // bpftrace's tracepoint probes need tracefs.
    if !std::path::Path::new("/sys/kernel/tracing/events").exists() {
        cmd::run(Command::new("mount").args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"]))?;
    }
    let sections = [
        ("kernel", kernel::rows as fn(&Bench) -> Result<Vec<Row>>),
        ("slowdown", slowdown::rows),
        ("startup", startup::rows),
        ("ingest and memory", ingest::rows),
        ("sustained load", sustained::rows),
        ("vm-startup", vm_startup::rows),
    ];
    if let Some(unknown) = args.only.iter().find(|o| {
        !sections
            .iter()
            .any(|(name, _)| name.starts_with(o.as_str()))
    }) {
        bail!(
            "--only {unknown}: no such section (kernel, slowdown, startup, ingest, sustained, \
             vm-startup)"
        );
    }
    let _lock = host_lock()?;
    let started = Instant::now();
    let load_before = uptime();
    let mut rows: Vec<Row> = Vec::new();
    let mut failed = false;
    for (name, section) in sections.into_iter().filter(|(name, _)| {
        args.only.is_empty() || args.only.iter().any(|o| name.starts_with(o.as_str()))
    }) {
        let t = Instant::now();
        eprintln!("bench: {name}…");
        // A section that fails leaves a row saying why, and the others are still measured.
        match section(bench) {
            // A section that fails in part (a kernel of vm-startup) says so in "failed" rows.
            Ok(section_rows) => {
                failed |= section_rows.iter().any(|r| r.section == "failed");
                rows.extend(section_rows);
            }
            Err(e) => {
                eprintln!("bench: {name} failed: {e:#}");
                rows.push(Row::new("failed", name, "-", &[]).note(format!("{e:#}")));
                failed = true;
            }
        }
        eprintln!("bench: {name} took {:.0} s", t.elapsed().as_secs_f64());
    }
    let table = Table {
        header: vec![
            format!(
                "`cargo xtask bench{}`: kernel {}, {} CPUs, tracer {}",
                if args.smoke { " --smoke" } else { "" },
                std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .unwrap_or_default()
                    .trim(),
                std::thread::available_parallelism().map_or(0, usize::from),
                bench.tracer.display()
            ),
            format!("load before: {load_before}"),
            format!("load after:  {}", uptime()),
            format!("measured in {:.0} s", started.elapsed().as_secs_f64()),
        ],
        rows,
    };
    print!("{}", table.render());
    let dir = paths::target().join("bench");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("bench.json");
    std::fs::write(&file, serde_json::to_string_pretty(&table.json())? + "\n")
        .with_context(|| format!("writing {}", file.display()))?;
    eprintln!("bench: written to {}", file.display());
    if failed {
        bail!("some sections failed (see their rows)");
    }
    Ok(())
}

/// The host tests' lock, held while measuring; waits for it.
fn host_lock() -> Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(LOCK)
        .with_context(|| format!("opening {LOCK}"))?;
    eprintln!("bench: waiting for {LOCK}");
    // SAFETY: flock on an fd we own; released when the file closes.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == -1 {
        return Err(std::io::Error::last_os_error()).context(format!("flock {LOCK}"));
    }
    Ok(file)
}

fn uptime() -> String {
    cmd::stdout(&mut Command::new("uptime"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// One `perf bench sched pipe -l loops`: microseconds per message.
pub fn pipe_run(loops: u64) -> Result<f64> {
    let out = cmd::stdout(Command::new("perf").args([
        "bench",
        "sched",
        "pipe",
        "-l",
        &loops.to_string(),
    ]))?;
    parse_value(&out, "usecs/op").with_context(|| format!("no `usecs/op` in perf's output:\n{out}"))
}

/// One `perf bench sched messaging -g groups -l loops`: seconds.
pub fn messaging_run(groups: u32, loops: u32) -> Result<f64> {
    let out = cmd::stdout(Command::new("perf").args([
        "bench",
        "sched",
        "messaging",
        "-g",
        &groups.to_string(),
        "-l",
        &loops.to_string(),
    ]))?;
    out.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Total time:")?
                .trim()
                .strip_suffix("[sec]")?
                .trim()
                .parse()
                .ok()
        })
        .with_context(|| format!("no `Total time` in perf's output:\n{out}"))
}

fn parse_value(perf_output: &str, unit: &str) -> Option<f64> {
    perf_output.lines().find_map(|l| {
        let (value, u) = l.trim().split_once(char::is_whitespace)?;
        (u.trim() == unit).then(|| value.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usecs_per_op_from_perf() {
        let out = "# Running 'sched/pipe' benchmark:\n# Executed 100000 pipe operations between two processes\n\n     Total time: 0.857 [sec]\n\n       8.572290 usecs/op\n         116654 ops/sec\n";
        assert_eq!(parse_value(out, "usecs/op"), Some(8.572290));
        assert_eq!(parse_value("Total time: 0.857 [sec]\n", "usecs/op"), None);
    }
}
