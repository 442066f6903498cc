//! `cargo xtask soak --minutes N`: the tracer left running on this host (tracepoint backend) over
//! a mixed load of throttling groups, its memory, CPU time and descriptors sampled every few
//! seconds and each group's traced kernel time checked against its cpu.stat; beside it for as
//! long, the churn test (tracer/tests/churn.rs). What passes: docs/testing.md ("Soak and churn").
//! `cargo xtask test` runs it for one minute; needs root.
use crate::arch::Arch;
use crate::bench::procfs::{self, Memory};
use crate::bench::procs::{Traced, Workload};
use crate::binaries::{self, Binaries};
use crate::cgroup;
use crate::{paths, setup};
use anyhow::{Context as _, Result, bail};
use std::thread;
use std::time::{Duration, Instant};
use test_support::Cgroup;

#[derive(clap::Args)]
pub struct Args {
    /// How long the tracer runs.
    #[arg(long, default_value_t = 5)]
    minutes: u64,
    /// Seconds between two samples of the tracer's process.
    #[arg(long, default_value_t = 5)]
    every: u64,
}

/// The groups: name, quota and period (µs), busy threads. One thread stopped 80 ms a period,
/// two threads on both CPUs, and a short period (10 ms) that makes ten times the records.
const GROUPS: [(&str, u64, u64, u32); 3] = [
    ("xtask-soak-one", 20_000, 100_000, 1),
    ("xtask-soak-two", 50_000, 100_000, 2),
    ("xtask-soak-short", 2_000, 10_000, 1),
];

/// Most memory growth after the warm-up, and most difference of a group's traced kernel time
/// from its cpu.stat.
const MAX_GROWTH: f64 = 0.05;
const MAX_DIFFERENCE: f64 = 0.01;

struct Sample {
    at: Duration,
    rss_kib: u64,
    cpu_s: f64,
    fds: usize,
}

/// The churn test that runs beside the soak, and its binary's name (tracer/tests/churn.rs).
pub const CHURN_TEST: &str = "churning_cgroups_leave_the_live_ones_traced_whole_and_nothing_behind";
const CHURN_BINARY: &str = "churn";

pub fn run(args: &Args) -> Result<()> {
    if args.minutes == 0 || args.every == 0 {
        bail!("--minutes and --every must be at least 1");
    }
    setup::run(&[setup::Part::Build])?;
    soak(&binaries::build_with_tests(Arch::HOST)?, args)
}

/// [`CHURN_TEST`] for `minutes`, on a thread of its own, as CI runs the tests (`CI=true`: a
/// test that cannot run fails).
fn churn(binaries: &Binaries, minutes: u64) -> Result<thread::JoinHandle<Result<()>>> {
    let (_, binary) = binaries
        .tests
        .iter()
        .find(|(name, _)| name == CHURN_BINARY)
        .context("the churn test was not built")?;
    let mut test = std::process::Command::new(binary);
    test.args(["--exact", CHURN_TEST, "--test-threads=1", "--nocapture"])
        .env("CI", "true")
        .env("TT_CHURN_SECONDS", (minutes * 60).to_string());
    Ok(thread::spawn(move || crate::cmd::run(&mut test)))
}

/// CI's soak: one minute, on the programs `cargo xtask test` built.
pub fn short(binaries: &Binaries) -> Result<()> {
    soak(
        binaries,
        &Args {
            minutes: 1,
            every: 5,
        },
    )
}

fn soak(binaries: &Binaries, args: &Args) -> Result<()> {
    let groups = GROUPS
        .iter()
        .map(|&(name, quota, period, _)| {
            let cgroup = cgroup::with_quota(name, quota, period)?;
            cgroup.favour();
            Ok(cgroup)
        })
        .collect::<Result<Vec<_>>>()?;
    let dir = paths::target().join("soak");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let recording = dir.join("soak.ndjson");
    let recording_arg = recording.to_string_lossy().into_owned();
    let mut tracer_args = vec![
        "--backend",
        "tracepoint",
        "--json",
        "--record",
        &recording_arg,
    ];
    for g in &groups {
        tracer_args.extend(["--cgroup", g.path()]);
    }
    let churn = churn(binaries, args.minutes)?;
    let mut tracer = Traced::tracer(&binaries.tracer, &tracer_args, &[])?;
    let pid = tracer.pid();
    // The groups are idle until now: their counters stand still from here to the workloads.
    let before = throttled(&groups);
    let mut busy = Vec::new();
    for (g, &(.., threads)) in groups.iter().zip(&GROUPS) {
        let b = Workload::busy(&binaries.workload, threads, args.minutes * 60 + 60)?;
        g.add(b.pid());
        busy.push(b);
    }
    let started = Instant::now();
    let run_for = Duration::from_secs(args.minutes * 60);
    let mut samples = Vec::new();
    println!(
        "soak: {} minute(s), a sample every {} s",
        args.minutes, args.every
    );
    println!("{:>8} {:>10} {:>8} {:>4}", "AT", "RSS KiB", "CPU s", "FDS");
    while started.elapsed() < run_for {
        thread::sleep(Duration::from_secs(args.every).min(run_for - started.elapsed()));
        let sample = Sample {
            at: started.elapsed(),
            rss_kib: Memory::of(pid)?.rss / 1024,
            cpu_s: procfs::cpu_seconds(pid)?,
            fds: procfs::fds(pid)?.len(),
        };
        println!(
            "{:>7.0}s {:>10} {:>8.2} {:>4}",
            sample.at.as_secs_f64(),
            sample.rss_kib,
            sample.cpu_s,
            sample.fds
        );
        samples.push(sample);
    }
    // Ended and reaped, then a period's rest: no stop is open, none ends after the reading.
    drop(busy);
    thread::sleep(Duration::from_millis(300));
    let after = throttled(&groups);
    let (stderr, lost) = tracer.stop()?;
    if !stderr.trim().is_empty() {
        eprintln!("{}", stderr.trim_end());
    }
    let traced = traced_kernel_ns(&recording, &groups)?;

    let mut failures = Vec::new();
    println!(
        "\n{:<20} {:>16} {:>16} {:>9}",
        "CGROUP", "TRACED ns", "CPU.STAT ns", "DIFF"
    );
    for ((g, t), (b, a)) in groups.iter().zip(&traced).zip(before.iter().zip(&after)) {
        let delta = a - b;
        let diff = (*t as f64 - delta as f64) / (delta.max(1) as f64);
        println!(
            "{:<20} {t:>16} {delta:>16} {:>8.3}%",
            g.path(),
            diff * 100.0
        );
        if diff.abs() > MAX_DIFFERENCE || delta == 0 {
            failures.push(format!(
                "{}: traced {t} ns vs cpu.stat {delta} ns",
                g.path()
            ));
        }
    }
    let warm_up = run_for / 5;
    let warm = samples
        .iter()
        .find(|s| s.at >= warm_up)
        .map_or(0, |s| s.rss_kib);
    let peak = samples
        .iter()
        .filter(|s| s.at >= warm_up)
        .map(|s| s.rss_kib)
        .max()
        .unwrap_or(0);
    let growth = peak as f64 / warm.max(1) as f64 - 1.0;
    let last = samples
        .last()
        .context("no sample: a run shorter than --every")?;
    println!(
        "memory: {warm} KiB after the warm-up ({:.0} s), at most {peak} KiB after it ({:+.2} %); \
         CPU {:.2} s in {:.0} s ({:.2} %); {} open fds at the end; {} records lost",
        warm_up.as_secs_f64(),
        growth * 100.0,
        last.cpu_s,
        last.at.as_secs_f64(),
        last.cpu_s / last.at.as_secs_f64() * 100.0,
        last.fds,
        lost.unwrap_or(0)
    );
    if growth >= MAX_GROWTH {
        failures.push(format!(
            "memory grew by {:.2} % after the warm-up",
            growth * 100.0
        ));
    }
    if samples.iter().any(|s| s.fds != samples[0].fds) {
        failures.push("the number of open fds changed".to_owned());
    }
    match churn.join() {
        Ok(Ok(())) => println!("the churn beside it passed (its figures above)"),
        Ok(Err(e)) => failures.push(format!("the churn beside it: {e:#}")),
        Err(_) => failures.push("the churn beside it panicked".to_owned()),
    }
    if !failures.is_empty() {
        bail!("soak failed: {}", failures.join("; "));
    }
    println!("soak passed");
    Ok(())
}

/// Each group's cpu.stat throttled time (ns: v1 `throttled_time`, v2 `throttled_usec` × 1000).
fn throttled(groups: &[Cgroup]) -> Vec<u64> {
    groups.iter().map(|g| g.stat().throttled_ns).collect()
}

/// Each group's `kernel_accounted_ns` from the recording's `summary` lines.
fn traced_kernel_ns(recording: &std::path::Path, groups: &[Cgroup]) -> Result<Vec<u64>> {
    let text = std::fs::read_to_string(recording)
        .with_context(|| format!("reading {}", recording.display()))?;
    let summaries: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| l.starts_with(r#"{"type":"summary""#))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    groups
        .iter()
        .map(|g| {
            summaries
                .iter()
                .find(|s| s["cgroup"] == g.path())
                .and_then(|s| s["kernel_accounted_ns"].as_u64())
                .with_context(|| format!("no summary of {} in {}", g.path(), recording.display()))
        })
        .collect()
}
