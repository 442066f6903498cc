//! ns per invocation of every program the tracepoint backend attaches, from the kernel's BPF
//! run-time statistics (`BPF_ENABLE_STATS`, released with its fd, so that the
//! `kernel.bpf_stats_enabled` sysctl is never left on), each under the [`Load`] that calls its hook
//! most and then while a quota'd cgroup is throttled, beside an empty program on the same hooks
//! (the floor) and bpftrace's one-line check (the peer). The loads, and why the empty programs
//! attach as they do: docs/performance.md ("The sections", kernel cost).
use super::bpf::{self, Floor, Program, Snapshot};
use super::loads;
use super::procs::{self, Traced, Workload};
use super::table::Row;
use super::{BPFTRACE_CHECK, Bench, PerfBench, TRACEPOINT};
use crate::cgroup;
use anyhow::{Context as _, Result, bail};
use std::thread;
use std::time::{Duration, Instant};

const SECTION: &str = "kernel cost, ns per invocation";

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    let loops = if bench.smoke { 20_000 } else { 100_000 };
    // The first program on a hook pays for being first, whichever program it is (measured:
    // 10-15 ns on the hrtimer and CSD hooks, an empty program first or last): an empty
    // program goes first on every hook, so that the tracer's programs and the floor they are
    // compared with, attached after them, both run after another.
    let mut hooks = procs::tracer_hooks(&bench.tracer)?;
    hooks.dedup();
    let leading = hooks
        .iter()
        .map(|h| Floor::attach(h))
        .collect::<Result<Vec<_>>>()?;
    let mut tracer = Traced::tracer(&bench.tracer, TRACEPOINT, &[])?;
    let ours = bpf::attached_programs(tracer.pid())?;
    let floors = hooks
        .iter()
        .map(|h| Floor::attach(h))
        .collect::<Result<Vec<_>>>()?;
    let peer = Traced::bpftrace(&BPFTRACE_CHECK)?;
    let theirs = peer.programs.clone();
    if theirs.len() != 1 {
        bail!("expected one new tracepoint program from bpftrace, found {theirs:?}");
    }
    let all: Vec<Program> = ours
        .iter()
        .chain(floors.iter().map(|f| &f.program))
        .chain(&theirs)
        .cloned()
        .collect();

    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("BPF_ENABLE_STATS (BPF run-time statistics)")?;
    let length = Duration::from_millis(if bench.smoke { 200 } else { 1_000 });
    let mut pipe: Vec<Snapshot> = Vec::new();
    let mut csds: Vec<Snapshot> = Vec::new();
    let mut sleeps: Vec<Snapshot> = Vec::new();
    let (mut barriers, mut naps) = (0, 0);
    for _ in 0..bench.runs {
        pipe.push(measured(&all, || PerfBench::pipe(loops).run().map(drop))?);
        csds.push(measured(&all, || {
            barriers += loads::membarrier(length)?;
            Ok(())
        })?);
        sleeps.push(measured(&all, || {
            naps += loads::nanosleep(length)?;
            Ok(())
        })?);
    }
    let window = Duration::from_millis(if bench.smoke { 500 } else { 3_000 });
    let throttled = throttled_window(bench, &all, window)?;
    drop(stats);
    drop(peer);
    drop(floors);
    drop(leading);
    tracer.stop()?;

    let mut rows = Vec::new();
    let floor_of = |hook: &str, runs: &[Snapshot]| -> f64 {
        let floor = all
            .iter()
            .find(|p| p.name == bpf::FLOOR_NAME && p.hook == hook);
        floor.map_or(f64::NAN, |f| median(&per_run(runs, f.id)))
    };
    let bpftrace_ns = median(&per_run(&pipe, theirs[0].id));
    let ms = length.as_millis();
    for (window, runs, load) in [
        (
            format!("pipe -l {loops}"),
            pipe.as_slice(),
            Some(Load::Pipe),
        ),
        (
            format!("{barriers} membarriers in {} × {ms} ms", bench.runs),
            csds.as_slice(),
            Some(Load::Membarrier),
        ),
        (
            format!("{naps} 10 µs sleeps in {} × {ms} ms", bench.runs),
            sleeps.as_slice(),
            Some(Load::Nanosleep),
        ),
        (
            format!("throttled {window:?}"),
            std::slice::from_ref(&throttled),
            None,
        ),
    ] {
        for p in ours
            .iter()
            .filter(|p| load.is_none_or(|l| Load::of(&p.hook) == l))
        {
            let values = per_run(runs, p.id);
            if values.iter().all(|v| v.is_nan()) {
                continue; // not invoked in this window (cgroup_rmdir, a csd without remote unthrottles)
            }
            let calls: u64 = runs
                .iter()
                .map(|s| s.get(&p.id).map_or(0, |&(_, c)| c))
                .sum();
            rows.push(
                Row::new(
                    SECTION,
                    format!("{} on {} ({window})", p.name, p.hook),
                    "ns",
                    &values,
                )
                .against(
                    format!("empty program on {}", p.hook),
                    floor_of(&p.hook, runs),
                )
                .note(format!("{calls} invocations")),
            );
        }
    }
    if let Some(switch) = ours.iter().find(|p| p.hook == "sched_switch") {
        rows.push(
            Row::new(
                SECTION,
                format!("{} vs bpftrace (pipe)", switch.name),
                "ns",
                &per_run(&pipe, switch.id),
            )
            .against("bpftrace's check on sched_switch", bpftrace_ns),
        );
        rows.push(
            Row::new(
                SECTION,
                "bpftrace's check on sched_switch (pipe)",
                "ns",
                &per_run(&pipe, theirs[0].id),
            )
            .against(
                "empty program on sched_switch",
                floor_of("sched_switch", &pipe),
            )
            .note(format!("`{}`", BPFTRACE_CHECK.script)),
        );
        // All our programs' time over the context switches in the same window.
        let total: Vec<f64> = pipe
            .iter()
            .map(|s| {
                let ns: u64 = ours
                    .iter()
                    .filter_map(|p| s.get(&p.id))
                    .map(|&(ns, _)| ns)
                    .sum();
                let switches = s.get(&switch.id).map_or(0, |&(_, c)| c);
                ns as f64 / switches as f64
            })
            .collect();
        rows.push(
            Row::new(
                SECTION,
                "all tracer programs, per context switch (pipe)",
                "ns",
                &total,
            )
            .against("bpftrace's check on sched_switch", bpftrace_ns),
        );
    }
    Ok(rows)
}

/// The load each hook's programs are measured under: the one that calls the hook most.
#[derive(Clone, Copy, PartialEq)]
enum Load {
    Pipe,
    Membarrier,
    Nanosleep,
}

impl Load {
    fn of(hook: &str) -> Load {
        if hook.starts_with("csd_function_") {
            Load::Membarrier
        } else if hook.starts_with("hrtimer_expire_") {
            Load::Nanosleep
        } else {
            Load::Pipe
        }
    }
}

/// The statistics of `programs` over one run of `load`.
fn measured(programs: &[Program], load: impl FnOnce() -> Result<()>) -> Result<Snapshot> {
    let s0 = bpf::snapshot(programs)?;
    load()?;
    Ok(bpf::delta(&s0, &bpf::snapshot(programs)?))
}

/// Mean ns per invocation of program `id` in each window (NaN where it did not run).
fn per_run(runs: &[Snapshot], id: u32) -> Vec<f64> {
    runs.iter()
        .map(|s| match s.get(&id) {
            Some(&(ns, cnt)) if cnt > 0 => ns as f64 / cnt as f64,
            _ => f64::NAN,
        })
        .collect()
}

fn median(values: &[f64]) -> f64 {
    super::table::Summary::of(values).median
}

/// The statistics over `window` while a cgroup with two busy threads and a quota of 20 ms per
/// 100 ms is throttled (then sched_switch really walks a bandwidth-limited cfs_rq and the
/// period timer refills it).
fn throttled_window(bench: &Bench, programs: &[Program], window: Duration) -> Result<Snapshot> {
    let cgroup = cgroup::with_quota("xtask-bench", 20_000, 100_000)?;
    let busy = Workload::busy(&bench.workload, 2, window.as_secs() + 30)?;
    cgroup.add(busy.pid());
    let deadline = Instant::now() + Duration::from_secs(10);
    while cgroup.stat().nr_throttled < 2 {
        if Instant::now() > deadline {
            bail!("{} did not throttle within 10 s", cgroup.dir().display());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let s0 = bpf::snapshot(programs)?;
    thread::sleep(window);
    let s1 = bpf::snapshot(programs)?;
    drop(busy);
    drop(cgroup);
    Ok(bpf::delta(&s0, &s1))
}
