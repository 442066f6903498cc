//! The burst ceiling, with the tests' backend ([`common::backend`]), against the kernel's own
//! cpu.stat and the workload's clocks: spiky rounds (80 ms of CPU just after a refill, every
//! 500 ms, one thread) at 50 ms / 100 ms with `cpu.max.burst` 0, 25 ms and 50 ms. Quota + burst
//! is the most a period runs: 75 ms stops an 80 ms round as 50 ms does, 100 ms lets it through;
//! the trace stops each round exactly where cpu.stat counted it throttled.
//! In each run the time stopped within a round is at most the round's own wall − CPU time, each
//! round's demand (Σ usage of the periods it overlaps) lies between its process's CPU clock and
//! the group's usage counter (within 5 %), and the periods' burst spent is cpu.stat's burst
//! time (5.16+; short by at most the burst per program run the kernel skipped).
//!
//! Needs root, kernel BTF and a cpu hierarchy; otherwise it says why it cannot run (a failure
//! under `CI=true`). Before 5.14 (no burst) only the run without one applies, and it says so.
use test_support as common;

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
};

use common::{Cgroup, CpuHierarchy, tracer::Tracer};
use serde_json::Value;
use tracer_common::round::Round;

const QUOTA_US: u64 = 50_000;
const PERIOD_US: u64 = 100_000;
const BURN_MS: u32 = 80;
const EVERY_MS: u32 = 500;
const ROUNDS: u32 = 6;
/// A round can wait for more than its stops (a busy CPU, a late wake-up), never for less; a
/// round nothing stopped waits up to ~4.5 ms under emulation, and the stops' edges carry the
/// guest's tick jitter.
const WAIT_SLACK_NS: u64 = 10_000_000;

/// One run of the rounds in its own cgroup: the rounds, and the group's cpu.stat burst time
/// around it.
struct Run {
    rounds: Vec<Round>,
    cgroup: Cgroup,
    burst_ns: Option<u64>,
}

/// A cgroup at 50 ms / 100 ms with `burst_us` (none written if 0, so that it works before
/// 5.14).
fn cgroup(cpu: &CpuHierarchy, burst_us: u64) -> Cgroup {
    let cgroup =
        Cgroup::throttled(cpu, &format!("burst-{burst_us}"), QUOTA_US, PERIOD_US).with_cpuacct();
    if burst_us > 0 {
        cpu.set_burst(cgroup.dir(), burst_us);
    }
    cgroup
}

impl Run {
    /// Runs the rounds in `cgroup`, which the tracer already traces.
    fn of(cgroup: Cgroup) -> Self {
        let before = cgroup.stat();
        let mut workload = common::spawn_in(
            common::spiky(EVERY_MS, BURN_MS, ROUNDS, 1)
                .arg("--usage-file")
                .arg(cgroup.usage_file())
                .arg("--stat-file")
                .arg(cgroup.dir().join("cpu.stat"))
                .stdout(Stdio::piped()),
            &cgroup,
            Some(common::last_cpu()),
        );
        let mut rounds = Vec::new();
        let stdout = BufReader::new(workload.stdout.take().expect("workload stdout"));
        for line in stdout.lines() {
            let line = line.expect("workload line");
            if !line.starts_with("synced ") {
                rounds.push(Round::parse(&line).unwrap_or_else(|| panic!("workload line: {line}")));
            }
        }
        assert!(workload.wait().expect("wait workload").success());
        cgroup.wait_refilled();
        let after = cgroup.stat();
        assert_eq!(rounds.len(), ROUNDS as usize, "{rounds:?}");
        Self {
            rounds,
            burst_ns: after.burst_ns.zip(before.burst_ns).map(|(a, b)| a - b),
            cgroup,
        }
    }

    /// This run's lines of type `kind` in the trace of every run.
    fn of_type<'a>(&self, lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
        common::tracer::of(lines, kind, self.cgroup.id())
    }

    /// How long any stop kept the group off a CPU within [from, to): the union of the stops
    /// clipped to it. With the task-based throttle (6.18+) a task runs on after its group ran
    /// out until it is parked on its way back to user mode; the kernel's own span (`kernel_ns`,
    /// first park to refill) is then the time it waited.
    fn stopped_within(&self, lines: &[Value], from: u64, to: u64) -> u64 {
        let mut pieces: Vec<(u64, u64)> = self
            .of_type(lines, "stop")
            .iter()
            .map(|s| {
                let (start, end) = (ns(s, "start_ns"), ns(s, "end_ns"));
                let start = match s["kernel_ns"].as_u64() {
                    Some(kernel) if common::task_based_throttle() => {
                        start.max(end.saturating_sub(kernel))
                    }
                    _ => start,
                };
                (start.max(from), end.min(to))
            })
            .filter(|(a, b)| a < b)
            .collect();
        pieces.sort_unstable();
        let (mut total, mut reached) = (0, from);
        for (a, b) in pieces {
            total += b.saturating_sub(a.max(reached));
            reached = reached.max(b);
        }
        total
    }

    /// Judges the run at a ceiling of `ceiling_ns` per period (quota + burst) and returns its
    /// figures. Each round is stopped in the trace exactly where the kernel counted it
    /// throttled (cpu.stat's `nr_throttled` grew over it). Quota arithmetic: a round that fits
    /// the ceiling (by the group's counter) is never stopped, and where every round needs more
    /// than it, rounds are stopped. Not every one: a round that began late in its period spreads
    /// over two periods' ceilings, and where it began is known only to the wake-up's precision
    /// (the workload finds the boundary by resuming after a stop: under emulation tens of ms
    /// late).
    fn judge(&self, lines: &[Value], ceiling_ns: u64) -> String {
        let mut stopped = Vec::new();
        for round in &self.rounds {
            let within = self.stopped_within(lines, round.start_ns, round.end_ns);
            let waited = (round.end_ns - round.start_ns).saturating_sub(round.cpu_ns);
            let throttled = round.throttled.expect("the group's nr_throttled");
            assert!(
                within <= waited + WAIT_SLACK_NS,
                "round {}: stopped {within} ns within it, but it waited only {waited} ns",
                round.index
            );
            assert_eq!(
                within > 0,
                throttled > 0,
                "round {round:?}: stopped {within} ns in the trace, nr_throttled grew by \
                 {throttled}"
            );
            if within > 0 {
                stopped.push(round.index);
            }
            let cost = round
                .group_ns
                .expect("the group's counter")
                .max(round.cpu_ns);
            if cost <= ceiling_ns {
                assert_eq!(
                    throttled, 0,
                    "round {round:?} fits {ceiling_ns} ns, but stopped"
                );
            }
        }
        if self.rounds.iter().all(|r| r.cpu_ns > ceiling_ns) {
            assert!(
                !stopped.is_empty(),
                "every round needs more than {ceiling_ns} ns a period, none was stopped: {:?}",
                self.rounds
            );
        }
        format!(
            "rounds stopped {stopped:?} of {} at {:.0} ms per period, as cpu.stat counted; {}; {}",
            self.rounds.len(),
            ceiling_ns as f64 / 1e6,
            self.demand(lines),
            self.burst_spent(lines, ceiling_ns - QUOTA_US * 1000)
        )
    }

    /// Each round's demand as the trace measured it per period (Σ usage of the periods that
    /// overlap the round) between two truths, within 5 % of each: the CPU the round cost by
    /// its process's own clock, which misses the workload's own CPU around the round in the
    /// same periods, and the group's usage counter from the previous round's close to just
    /// before the next round, which holds all of that (a period whose timer idled before the
    /// round spans the time since the group's last expiry).
    fn demand(&self, lines: &[Value]) -> String {
        let periods = self.of_type(lines, "period");
        assert!(!periods.is_empty(), "no `period` record");
        let mut worst: f64 = 0.0;
        for round in &self.rounds {
            let overlapping: Vec<&&Value> = periods
                .iter()
                .filter(|p| {
                    ns(p, "end_ns") > round.start_ns
                        && p["start_ns"].as_u64().is_none_or(|s| s < round.end_ns)
                })
                .collect();
            assert!(
                overlapping.iter().all(|p| p["start_ns"].is_u64()),
                "round {}: a period of unknown usage: {overlapping:#?}",
                round.index
            );
            let measured: u64 = overlapping.iter().map(|p| ns(p, "usage_ns")).sum();
            let low = round.cpu_ns as f64;
            let high = round.group_ns.unwrap_or(round.cpu_ns).max(round.cpu_ns) as f64;
            let off = if (measured as f64) < low {
                (measured as f64 - low) / low
            } else {
                (measured as f64 - high).max(0.0) / high
            };
            if off.abs() > worst.abs() {
                worst = off;
            }
            assert!(
                off.abs() <= 0.05,
                "round {round:?}: demand {measured} ns over the period(s) {:?} (start, end, \
                 usage), but the round cost {low} ns by its own clock and {high} ns by the \
                 group's counter",
                overlapping
                    .iter()
                    .map(|p| (ns(p, "start_ns"), ns(p, "end_ns"), ns(p, "usage_ns")))
                    .collect::<Vec<_>>()
            );
        }
        format!(
            "round demand outside own CPU..group counter worst {:+.1} %",
            worst * 100.0
        )
    }

    /// Σ burst the periods spent against cpu.stat's burst time (5.16+): the same refill
    /// arithmetic, read by the tracer before each refill and counted by the kernel in it. The
    /// pool is read without the bandwidth lock: a CPU that draws a slice from it (5 ms by
    /// default) between the read and the refill makes the kernel count that much more. A
    /// period timer expiry the kernel skipped the tracer's program for (an interrupt while it
    /// ran for a softirq hrtimer: the end line's `missed_runs`) is a refill not read, at most
    /// `burst_ns` short each. Never more.
    fn burst_spent(&self, lines: &[Value], burst_ns: u64) -> String {
        let Some(counted) = self.burst_ns else {
            return "burst spent: no burst time in cpu.stat before 5.16".to_owned();
        };
        let spent: u64 = self
            .of_type(lines, "period")
            .iter()
            .map(|p| ns(p, "burst_spent_ns"))
            .sum();
        let missed = lines
            .iter()
            .find(|l| l["type"] == "end")
            .and_then(|e| e["missed_runs"].as_u64())
            .unwrap_or(0);
        let short = counted - spent.min(counted);
        assert!(
            spent <= counted + 1_000 && short <= counted / 100 + 5_000_000 + missed * burst_ns,
            "Σ burst spent {spent} ns vs cpu.stat's burst time {counted} ns, {missed} program \
             run(s) skipped; the periods (end, usage, runtime left, burst spent, throttled CPUs): \
             {:?}",
            self.of_type(lines, "period")
                .iter()
                .map(|p| (
                    ns(p, "end_ns"),
                    p["usage_ns"].as_u64(),
                    p["runtime_ns"].as_u64(),
                    ns(p, "burst_spent_ns"),
                    ns(p, "throttled_cpus")
                ))
                .collect::<Vec<_>>()
        );
        format!(
            "burst spent {:.3} ms vs cpu.stat {:.3} ms ({missed} program run(s) skipped)",
            spent as f64 / 1e6,
            counted as f64 / 1e6
        )
    }
}

fn ns(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key}: {v}"))
}

#[test]
fn quota_plus_burst_is_the_most_a_period_runs() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let probe = Cgroup::new(&host.cpu, "burst-probe");
    // Without a burst (before 5.14) the rounds still run at the quota alone.
    let bursts: &[u64] = if common::applies(host.cpu.has_burst(probe.dir())) {
        &[0, 25_000, 50_000]
    } else {
        &[0]
    };
    drop(probe);
    let cgroups: Vec<Cgroup> = bursts.iter().map(|&b| cgroup(&host.cpu, b)).collect();
    let args: Vec<&str> = cgroups
        .iter()
        .flat_map(|c| ["--cgroup", c.path()])
        .collect();
    // One tracer for every run: under emulation a start is seconds.
    let tracer = Tracer::start(&args);
    let runs: Vec<Run> = cgroups.into_iter().map(Run::of).collect();
    let lines = tracer.stop();
    let lost = &lines.iter().find(|l| l["type"] == "end").expect("end")["lost"];
    assert_eq!(*lost, 0, "records lost");
    for (run, &burst_us) in runs.iter().zip(bursts) {
        println!(
            "figure: burst {} ms: {}",
            burst_us / 1000,
            run.judge(&lines, (QUOTA_US + burst_us) * 1000)
        );
    }
}
