//! The ring buffer overflowing, on this host (tracepoint backend, or [`common::backend`]'s): the
//! smallest ring (`--ring-buffer-size 4096`, eight stop records), two groups stopped on every
//! CPU in every 2 ms period, and the tracer held still (SIGSTOP) for half a second of it, as an
//! agent starved of CPU would be. The records the kernel could not write must be counted, by
//! cgroup: exactly in time (a group's traced kernel time plus its lost ends' kernel time is its
//! own cpu.stat throttled time, to the nanosecond on v1), and in number within what its
//! cpu.stat allows (the kernel counts throttled periods, not per-CPU stops, so the count of
//! stops it ended is bounded, not known); the summary must say whose figures are incomplete;
//! and once the flood is over the tracer must trace a new group completely.
//! Needs root, kernel BTF and a cpu hierarchy, otherwise it says why it cannot run (a failure
//! under `CI=true`).
use test_support as common;

use std::{thread, time::Duration};

use common::{
    Cgroup, CpuStat,
    tracer::{self, Tracer},
};
use serde_json::Value;

/// A guard against hanging, not a timing assertion.
const LIMIT: Duration = Duration::from_secs(60);

/// The flood's period, with the kernel's shortest quota (1 ms) half of it: each group may use
/// half a CPU and wants one on every CPU.
const FLOOD_PERIOD_US: u64 = 2_000;

fn summary(lines: &[Value], id: u64) -> &Value {
    let found = tracer::of(lines, "summary", id);
    assert_eq!(found.len(), 1, "one summary of cgroup {id}");
    found[0]
}

fn count(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or(0)
}

#[test]
fn an_overflowing_ring_loses_counted_records_and_the_trace_recovers() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cpus = common::last_cpu() + 1;
    // Each flood group: one busy thread pinned on every CPU, a quota of 1 ms per 2 ms period:
    // every CPU's cfs_rq of it is stopped in every period. Pinned, the threads never migrate,
    // so no CPU's runqueue of the group empties and returns runtime: every stop ends at a
    // period's refill.
    let flood: Vec<Cgroup> = ["overflow-a", "overflow-b"]
        .iter()
        .map(|tag| Cgroup::throttled(&host.cpu, tag, 1_000, FLOOD_PERIOD_US))
        .collect();
    // Named now (the tracer's `--cgroup`), limited only after the flood: a group with a quota
    // has a period timer, whose `period` records the full ring could lose before the group's
    // workload even starts.
    let fresh = Cgroup::throttled(&host.cpu, "overflow-fresh", 20_000, 100_000);
    fresh.write_quota(None);
    let mut args = vec!["--ring-buffer-size", "4096"];
    for cgroup in flood.iter().chain([&fresh]) {
        args.extend(["--cgroup", cgroup.path()]);
    }
    let mut tracer = Tracer::start(&args);

    let mut runs = Vec::new();
    for cgroup in &flood {
        for cpu in 0..cpus {
            runs.push(common::spawn_in(&mut common::busy(1, 3), cgroup, Some(cpu)));
        }
    }
    thread::sleep(Duration::from_secs(1));
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGSTOP) };
    thread::sleep(Duration::from_millis(500));
    // SAFETY: as above.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGCONT) };
    for run in &mut runs {
        assert!(run.wait().expect("wait for the flood").success());
    }
    // Every stop of the flood ended (and is in cpu.stat) before it is read.
    for cgroup in &flood {
        cgroup.wait_refilled();
    }
    let flood_stats: Vec<CpuStat> = flood.iter().map(Cgroup::stat).collect();
    // cpu.stat's unit: ns on v1, µs (truncated) on v2.
    let resolution_ns = match host.cpu.version {
        common::Version::V1 => 0,
        common::Version::V2 => 1_000,
    };

    // After the flood: a new group's stops, all of them.
    fresh.write_quota(Some(20_000));
    let fresh_id = fresh.id();
    let mut run = common::spawn_in(&mut common::busy(1, 2), &fresh, Some(cpus - 1));
    assert!(run.wait().expect("wait for the workload").success());
    let fresh_stat = fresh.stat();
    let mut seen = 0;
    // Its last stop's line is out before the tracer is stopped.
    tracer.wait_for(LIMIT, "the fresh group's stops", |v| {
        seen += u64::from(v["type"] == "stop" && v["cgroup_id"] == fresh_id);
        seen == fresh_stat.nr_throttled
    });
    let lines = tracer.stop();
    let end = lines.last().expect("an end line");
    assert_eq!(end["type"], "end", "{end}");
    let lost = count(end, "lost");
    assert!(lost > 0, "the ring never overflowed: {end}");

    let mut attributed = 0;
    for (cgroup, stat) in flood.iter().zip(&flood_stats) {
        let id = cgroup.id();
        let s = summary(&lines, id);
        let what = format!("{} (id {id})", cgroup.path());
        let traced = count(s, "stops");
        let lost_ends = count(s, "lost_stops");
        attributed += lost_ends + count(s, "lost_stop_begins") + count(s, "lost_periods");
        let kernel = count(s, "kernel_accounted_ns");
        let lost_kernel = count(s, "lost_stop_kernel_ns");
        // Exact in time: an end carries its whole stop's kernel time, and a lost one's is
        // counted by cgroup, so the traced and the lost add up to the kernel's own count.
        assert!(
            (kernel + lost_kernel).abs_diff(stat.throttled_ns) <= resolution_ns,
            "{what}: traced {kernel} ns + lost ends' {lost_kernel} ns vs cpu.stat {} ns: {s}",
            stat.throttled_ns
        );
        assert_eq!(
            lost_kernel > 0,
            lost_ends > 0,
            "{what}: {lost_ends} ends lost with {lost_kernel} ns: {s}"
        );
        // The kernel's own bounds: every stop ends at a refill at a period boundary the
        // group's nr_throttled counts, one stop per CPU at most there, so the stops the kernel
        // ended (traced or lost) are at most cpus × nr_throttled; and the time the trace
        // misses lies in the boundaries its stops do not cover, at most one period each.
        assert!(
            traced + lost_ends <= cpus as u64 * stat.nr_throttled,
            "{what}: {traced} traced + {lost_ends} lost ends > {cpus} × nr_throttled {}",
            stat.nr_throttled
        );
        let uncovered = (cpus as u64 * stat.nr_throttled).saturating_sub(traced);
        assert!(
            lost_kernel <= uncovered * FLOOD_PERIOD_US * 1_000,
            "{what}: {lost_kernel} ns lost, more than {uncovered} periods' worth"
        );
        println!(
            "{what}: {traced} stops traced, {lost_ends} ends lost ({} starts, {} periods); \
             kernel {kernel} + lost {lost_kernel} = {} ns, cpu.stat {} ns; nr_throttled {} \
             ({cpus} CPUs: at most {} stops)",
            count(s, "lost_stop_begins"),
            count(s, "lost_periods"),
            kernel + lost_kernel,
            stat.throttled_ns,
            stat.nr_throttled,
            cpus as u64 * stat.nr_throttled
        );
    }
    assert!(attributed > 0, "no flood group says it lost records");
    assert!(
        attributed <= lost,
        "{attributed} lost by cgroup > {lost} in all"
    );

    // Recovered: the fresh group's trace is complete and says nothing is missing.
    let s = summary(&lines, fresh_id);
    for field in ["lost_stops", "lost_stop_begins", "lost_periods"] {
        assert!(s.get(field).is_none(), "the fresh group lost {field}: {s}");
    }
    let stops = tracer::of(&lines, "stop", fresh_id);
    assert_eq!(
        tracer::kernel_ns(&stops),
        fresh_stat.throttled_ns,
        "the fresh group's Σ kernel_ns vs its cpu.stat"
    );
    assert_eq!(stops.len() as u64, fresh_stat.nr_throttled);
    assert!(fresh_stat.nr_throttled >= 10, "{fresh_stat:?}");
    println!(
        "{lost} records lost in all ({attributed} by the flood groups); the fresh group after \
         it: {} stops, Σ kernel_ns {} = cpu.stat",
        stops.len(),
        fresh_stat.throttled_ns
    );
}
