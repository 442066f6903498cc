//! Sustained load: real cgroups throttling with a 5 ms period (1 ms quota, two busy threads each),
//! more of them at each step, traced at the default ring size. Per step: stop lines per second
//! beside cpu.stat's throttled periods, the stops' kernel time beside cpu.stat's throttled time
//! (the truth that no stop was missed), the agent's CPU and the records lost. Why stops are fewer
//! than throttled periods: docs/performance.md ("The sections", sustained load).
use super::Bench;
use super::procfs;
use super::procs::{Traced, Workload};
use super::table::Row;
use crate::cgroup;
use anyhow::{Context as _, Result};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};
use test_support::Cgroup;

const SECTION: &str = "sustained load (5 ms periods, default ring)";
const QUOTA_US: u64 = 1_000;
const PERIOD_US: u64 = 5_000;

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    let (steps, window): (&[usize], Duration) = if bench.smoke {
        (&[4], Duration::from_millis(500))
    } else {
        (&[2, 5, 10, 20], Duration::from_secs(5))
    };
    let mut rows = Vec::new();
    let mut loss_at = None;
    for &n in steps {
        let mut tracer = Traced::tracer(&bench.tracer, super::TRACEPOINT, &[])?;
        let cgroups = (0..n)
            .map(|i| cgroup::with_quota(&format!("xtask-bench-load-{i}"), QUOTA_US, PERIOD_US))
            .collect::<Result<Vec<_>>>()?;
        let mut busy = Vec::new();
        for cgroup in &cgroups {
            let b = Workload::busy(&bench.workload, 2, window.as_secs() + 30)?;
            cgroup.add(b.pid());
            busy.push(b);
        }
        thread::sleep(Duration::from_millis(300));
        let throttled =
            |cgroups: &[Cgroup]| -> u64 { cgroups.iter().map(|c| c.stat().nr_throttled).sum() };
        let (t0, stops0, cpu0, k0) = (
            Instant::now(),
            tracer.stops.load(Ordering::Relaxed),
            procfs::cpu_seconds(tracer.pid())?,
            throttled(&cgroups),
        );
        thread::sleep(window);
        let k1 = throttled(&cgroups);
        let cpu1 = procfs::cpu_seconds(tracer.pid())?;
        let elapsed = t0.elapsed().as_secs_f64();
        drop(busy);
        // The tracer drains its ring on a tick: give the last records a moment.
        thread::sleep(Duration::from_millis(300));
        let stops = tracer.stops.load(Ordering::Relaxed) - stops0;
        // The cgroups were made after the tracer started, so every stop of theirs is in the
        // trace: the whole run's kernel time, not the window's.
        let stat_ns: u64 = cgroups.iter().map(|c| c.stat().throttled_ns).sum();
        let (_, lost) = tracer.stop()?;
        let traced_ns = tracer.kernel_ns.load(Ordering::Relaxed);
        drop(cgroups);
        let lost = lost.context("the tracer printed no end line")?;
        if lost > 0 && loss_at.is_none() {
            loss_at = Some(n);
        }
        let per_s = stops as f64 / elapsed;
        rows.push(
            Row::new(
                SECTION,
                format!("{n} cgroups: stops traced"),
                "stops/s",
                &[per_s],
            )
            .against("throttled periods (cpu.stat)", (k1 - k0) as f64 / elapsed)
            .note(format!("lost {lost}")),
        );
        rows.push(
            Row::new(
                SECTION,
                format!("{n} cgroups: stops' kernel time"),
                "s",
                &[traced_ns as f64 / 1e9],
            )
            .against("cpu.stat throttled time", stat_ns as f64 / 1e9),
        );
        rows.push(
            Row::new(
                SECTION,
                format!("{n} cgroups: agent CPU"),
                "%",
                &[(cpu1 - cpu0) / elapsed * 100.0],
            )
            .note(format!("{window:?}")),
        );
    }
    let note = match loss_at {
        Some(n) => format!("records were lost from {n} cgroups on"),
        None => format!(
            "no record lost up to {} cgroups: with the kernel's 1 ms minimum quota, {} CPUs cannot \
             throttle faster",
            steps.last().copied().unwrap_or(0),
            thread::available_parallelism().map_or(0, usize::from)
        ),
    };
    if let Some(last) = rows.last_mut() {
        last.note = format!("{}; {note}", last.note);
    }
    Ok(rows)
}
