//! `cargo xtask bench`: what throttle-tracer costs on this host, beside bpftrace and the floor, in
//! one table (printed, and written to target/bench/bench.json). Each figure has its ratio to a
//! reference measured in the same run: ratios carry over between machines. One module a section
//! ([`kernel`], [`slowdown`], [`startup`], [`vm_startup`], [`ingest`], [`sustained`], [`fleet`];
//! [`vm_cost`] in the VM guests); what each measures and how: docs/performance.md ("The
//! sections"). Figures only, nothing asserted; needs root.
mod bpf;
mod fleet;
mod ingest;
mod kernel;
mod loads;
pub(crate) mod procfs;
pub(crate) mod procs;
pub(crate) mod scrape;
mod slowdown;
pub mod startup;
mod sustained;
mod table;
pub mod vm_cost;
pub mod vm_startup;

use crate::arch::Arch;
use crate::binaries::{self, Binaries};
use crate::{cmd, paths, results, setup};
use anyhow::{Context as _, Result, bail};
use aya_obj::generated::bpf_prog_type;
use std::io::Read as _;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
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
    /// Only these sections (kernel, slowdown, startup, ingest, sustained, serve-fleet,
    /// vm-startup), for working on one.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// How long serve-fleet traces its fleet.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// How long of that serve-fleet warms up before its figures are taken (leaving at least a
    /// minute measured): longer to measure serve once its advice windows hold their bound.
    #[arg(long, default_value_t = 1)]
    warm_minutes: u64,
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
    /// serve-fleet's length and warm-up.
    pub fleet_minutes: (u64, u64),
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

/// throttle-tracer's arguments wherever the bench measures its tracepoint backend.
pub const TRACEPOINT: &[&str] = &["--backend", "tracepoint", "--json"];

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
    let mut binaries = binaries::build(Arch::HOST)?;
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
            fleet_minutes: (args.minutes, args.warm_minutes),
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
        minutes: 0,
        warm_minutes: 0,
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
            fleet_minutes: (0, 0),
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
        ("serve-fleet", fleet::rows),
        ("vm-startup", vm_startup::rows),
    ];
    if let Some(unknown) = args.only.iter().find(|o| {
        !sections
            .iter()
            .any(|(name, _)| name.starts_with(o.as_str()))
    }) {
        bail!(
            "--only {unknown}: no such section (kernel, slowdown, startup, ingest, sustained, \
             serve-fleet, vm-startup)"
        );
    }
    let _lock = host_lock()?;
    // Taken before the sections run: the commit (and the state of the tree) the binaries
    // were built from, not the one checked out when a long run ends.
    let provenance = results::Provenance::here();
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
    let json = table.json();
    std::fs::write(&file, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", file.display()))?;
    eprintln!("bench: written to {}", file.display());
    if failed {
        bail!("some sections failed (see their rows); docs/results/bench.md is left as it was");
    }
    // A smoke run's figures are one brief sample each: they show that the bench works, not
    // what the tracer costs.
    if !args.smoke {
        let docs = results::update(
            "bench.md",
            RESULTS_INTRO,
            &provenance,
            &table::sections(&json),
        )?;
        eprintln!("bench: its sections written to {}", docs.display());
    }
    Ok(())
}

/// The top of docs/results/bench.md.
const RESULTS_INTRO: &str = "# Bench results\n\n\
Written by `cargo xtask bench` (not by hand): each section is the one its last run measured, \
headed with when, at which commit, on which machine and by which command. What each figure \
measures and how to read it: [performance.md](../performance.md).";

/// The host tests' lock, held while measuring (the bench, advise-check); waits for it.
pub fn host_lock() -> Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(LOCK)
        .with_context(|| format!("opening {LOCK}"))?;
    eprintln!("waiting for {LOCK}");
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

/// `perf bench sched ARGS…`, on one CPU where [`PerfBench::on_cpu`] says.
pub struct PerfBench {
    args: Vec<String>,
    /// Operations in a run where perf gives the time of one (pipe's messages).
    ops: Option<u64>,
    cpu: Option<usize>,
}

/// What one run of a [`PerfBench`] took.
#[derive(Clone, Copy, Debug)]
pub struct PerfRun {
    /// perf's own time of the benchmark, without its start-up, seconds: its µs per operation
    /// times the operations where it prints that (to the ns), else its "Total time" (to the
    /// ms).
    pub wall: f64,
    /// User + system time of perf and of the tasks it forked and reaped (wait4's rusage),
    /// seconds: what the kernel charged the benchmark, whoever else ran beside it.
    pub cpu: f64,
    /// Their context switches, voluntary and not.
    pub switches: u64,
}

impl PerfBench {
    /// `pipe -l loops`: two tasks passing a message back and forth, two context switches a
    /// message.
    pub fn pipe(loops: u64) -> Self {
        Self {
            ops: Some(loops),
            ..Self::new(["pipe", "-l", &loops.to_string()])
        }
    }

    /// `messaging -g groups -l loops` (hackbench): groups of 20 senders and 20 receivers.
    pub fn messaging(groups: u32, loops: u32) -> Self {
        Self::new([
            "messaging",
            "-g",
            &groups.to_string(),
            "-l",
            &loops.to_string(),
        ])
    }

    fn new<'a>(args: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            args: args.into_iter().map(str::to_owned).collect(),
            ops: None,
            cpu: None,
        }
    }

    /// Under `taskset -c cpu`: the benchmark's tasks inherit the affinity, so they take turns on
    /// that CPU and every wakeup is local (no inter-processor interrupt, no idle exit).
    pub fn on_cpu(mut self, cpu: usize) -> Self {
        self.cpu = Some(cpu);
        self
    }

    /// The command line, for the table.
    pub fn command_line(&self) -> String {
        let taskset = self.cpu.map(|c| format!("taskset -c {c} "));
        format!(
            "{}perf bench sched {}",
            taskset.unwrap_or_default(),
            self.args.join(" ")
        )
    }

    pub fn run(&self) -> Result<PerfRun> {
        let mut command = match self.cpu {
            Some(cpu) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", &cpu.to_string(), "perf"]);
                taskset
            }
            None => Command::new("perf"),
        };
        command
            .args(["bench", "sched"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot run {}", self.command_line()))?;
        // perf writes a few lines to each: neither pipe fills while the other is read.
        let (mut out, mut err) = (String::new(), String::new());
        child
            .stdout
            .take()
            .expect("piped")
            .read_to_string(&mut out)?;
        child
            .stderr
            .take()
            .expect("piped")
            .read_to_string(&mut err)?;
        // wait4 rather than Child::wait, for the resources of the benchmark's whole tree: taskset
        // execs perf, and perf reaps its tasks before it exits.
        let pid = libc::pid_t::try_from(child.id()).context("perf's pid")?;
        let mut status = 0;
        // SAFETY: plain integers and timevals; all zero is a valid rusage.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our unreaped child; `status` and `usage` outlive the call.
        while unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("wait4 on perf");
            }
        }
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            bail!(
                "`{}` failed (wait status {status}):\n{}",
                self.command_line(),
                err.trim_end()
            );
        }
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        let per_op = self
            .ops
            .zip(usecs_per_op(&out))
            .map(|(ops, us)| us * ops as f64 * 1e-6);
        Ok(PerfRun {
            wall: per_op
                .or_else(|| total_time(&out))
                .with_context(|| format!("no time in perf's output:\n{out}"))?,
            cpu: seconds(usage.ru_utime) + seconds(usage.ru_stime),
            switches: u64::try_from(usage.ru_nvcsw + usage.ru_nivcsw).unwrap_or(0),
        })
    }
}

/// perf bench's "8.572290 usecs/op".
fn usecs_per_op(perf_output: &str) -> Option<f64> {
    perf_output
        .lines()
        .find_map(|l| l.trim().strip_suffix("usecs/op")?.trim().parse().ok())
}

/// perf bench's `Total time: 0.857 [sec]`.
fn total_time(perf_output: &str) -> Option<f64> {
    perf_output.lines().find_map(|l| {
        l.trim()
            .strip_prefix("Total time:")?
            .trim()
            .strip_suffix("[sec]")?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_from_perf() {
        let out = "# Running 'sched/pipe' benchmark:\n# Executed 100000 pipe operations between two processes\n\n     Total time: 0.857 [sec]\n\n       8.572290 usecs/op\n         116654 ops/sec\n";
        assert_eq!(total_time(out), Some(0.857));
        assert_eq!(usecs_per_op(out), Some(8.572290));
        assert_eq!(total_time("8.572290 usecs/op\n"), None);
        assert_eq!(usecs_per_op("Total time: 0.857 [sec]\n"), None);
    }
}
