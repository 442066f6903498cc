//! Tracing on this host, with `--backend tracepoint` (or the backend of [`common::backend`]),
//! against real quotas (cgroup v1 or v2) and the kernel's own cpu.stat (read here,
//! independently of the tracer). Needs root, kernel BTF and a
//! cpu hierarchy; otherwise each test says why it cannot run (a failure under `CI=true`).
//!
//! The tests share the machine's CPUs, so they run one at a time.
use test_support as common;

use std::{
    fs,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use common::{Cgroup, CpuHierarchy, Running};
use serde_json::Value;

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");

/// A throttled cgroup and the tracer of one test; the guards clean up, also when an assertion
/// failed.
struct Scene {
    cgroup: Cgroup,
    tracer: Option<Running>,
    /// The tracer's `start` line.
    start: Value,
}

impl Scene {
    /// `quota_us` per `period_us`, at the most CPU weight the hierarchy allows (see below).
    fn new(cpu: &CpuHierarchy, tag: &str, quota_us: u64, period_us: u64) -> Self {
        Self {
            cgroup: Cgroup::throttled(cpu, &format!("host-{tag}"), quota_us, period_us),
            tracer: None,
            start: Value::Null,
        }
    }

    /// Starts the tracer for this cgroup and returns its stdout lines once `start` was printed.
    fn start_tracer(&mut self) -> mpsc::Receiver<String> {
        self.start_tracer_as(common::tracer::command())
    }

    /// [`Scene::start_tracer`] through `tracer`, a command that runs TRACER.
    fn start_tracer_as(&mut self, tracer: Command) -> mpsc::Receiver<String> {
        self.start_tracer_with(tracer, &common::backend())
    }

    /// The tracer with `--backend BACKEND`; `auto` takes what this kernel allows it.
    fn start_tracer_with(&mut self, mut tracer: Command, backend: &str) -> mpsc::Receiver<String> {
        let mut child = Running::spawn(
            tracer
                .args(["--backend", backend, "--json", "--cgroup"])
                .arg(self.cgroup.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        );
        let (v, rx) = common::ndjson_lines(&mut child);
        let first = v.to_string();
        self.tracer = Some(child);
        if backend != "auto" {
            assert_eq!(v["backend"], backend, "{first}");
        }
        assert!(v["realtime_offset_ns"].is_i64(), "{first}");
        self.start = v;
        rx
    }

    /// Runs of the tracer's programs the kernel skipped so far: `recursion_misses` in the
    /// fdinfo of each of its program fds, summed; `None` where the kernel does not count them.
    fn missed_runs(&self) -> Option<u64> {
        let pid = self.tracer.as_ref().expect("tracer running").id();
        common::fdinfo_values(pid, "recursion_misses")
            .into_iter()
            .reduce(|a, b| a + b)
    }

    /// SIGINTs the tracer and returns every line it printed after `start`.
    fn stop_tracer(&mut self, rx: mpsc::Receiver<String>) -> Vec<Value> {
        let status = self.tracer.take().expect("tracer running").interrupt();
        assert!(status.success(), "tracer: {status}");
        rx.iter()
            .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

fn of_type<'a>(lines: &'a [Value], t: &str) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["type"] == t).collect()
}

/// Every stop is reported once: one throttle of one cfs_rq (CPU) is one stop line, however many
/// CPUs saw its end (the timer's exit, the CSD's exit, the next context switch).
fn assert_each_stop_once(stops: &[&Value]) {
    let mut seen = std::collections::HashSet::new();
    for s in stops {
        let key = (s["cpu"].as_u64(), s["start_ns"].as_u64());
        assert!(seen.insert(key), "stop reported twice: {s}");
    }
}

/// Sorts `v` and returns its median.
fn median_i64(v: &mut [i64]) -> i64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The stops of one busy thread at 20 ms / 100 ms, after the first (cut short by the phase at
/// which the thread joined): their median within `rest_ms` (period − quota) ± 3 ms, and 95 %
/// held one thread of the workload, alone or beside its main thread, for 80 – 100 % of the stop
/// (the whole stop before 6.18; from its park, a few ms after the throttle, on the task-based
/// throttle). No band is asserted on each stop's own length: under emulation on a loaded host
/// it moves with the host's scheduling of the emulator (53 to 92 ms in a 6.1 guest), as the
/// workload's own clock does, against which the caller judges each stop's edges instead.
fn assert_lengths_are_the_rest_of_the_period(stops: &[&Value], rest_ms: f64) {
    let first = stops.iter().filter_map(|s| s["start_ns"].as_u64()).min();
    let steady: Vec<&Value> = stops
        .iter()
        .copied()
        .filter(|s| s["start_ns"].as_u64() != first)
        .collect();
    let mut lengths: Vec<f64> = steady
        .iter()
        .map(|s| s["duration_ns"].as_u64().unwrap() as f64 / 1e6)
        .collect();
    lengths.sort_by(f64::total_cmp);
    let median = lengths[lengths.len() / 2];
    let held = held_its_thread(&steady);
    println!(
        "figure: median stop after the first {median:.1} ms; {held} of {} held one thread of \
         the workload",
        steady.len()
    );
    assert!(
        (median - rest_ms).abs() <= 3.0,
        "median stop {median:.1} ms, expected {rest_ms} ± 3 ms: {lengths:.1?}"
    );
    assert!(
        held * 100 >= steady.len() * 95,
        "{held} of {} stops held one thread of the workload for 80 – 100 % of the stop",
        steady.len()
    );
}

/// How many of `stops` name threads of one process only, the one most stops name, each held
/// for 80 – 100 % of the stop.
fn held_its_thread(stops: &[&Value]) -> usize {
    let pid_of = |s: &Value| {
        let threads = s["threads"].as_array()?;
        let pid = threads.first()?["pid"].as_u64()?;
        threads
            .iter()
            .all(|t| t["pid"].as_u64() == Some(pid))
            .then_some(pid)
    };
    let mut counts = std::collections::HashMap::<u64, usize>::new();
    for pid in stops.iter().filter_map(|s| pid_of(s)) {
        *counts.entry(pid).or_default() += 1;
    }
    let Some((&workload, _)) = counts.iter().max_by_key(|(_, n)| **n) else {
        return 0;
    };
    stops
        .iter()
        .filter(|s| {
            let length = s["duration_ns"].as_u64().unwrap();
            pid_of(s) == Some(workload)
                && s["threads"].as_array().into_iter().flatten().all(|t| {
                    let held = t["held_ns"].as_u64().unwrap_or(0);
                    held <= length && held * 5 >= length * 4
                })
        })
        .count()
}

/// The summary's group stops against the cpu.stat nr_throttled delta `throttled` read around
/// the workload: 2 % or one stop, besides the periods that a stop outlasted. A refill too
/// small for a runqueue's debt, or a period timer that fired a whole period late (its overrun
/// is added to nr_throttled, do_sched_cfs_period_timer), counts a period that ended no stop.
fn assert_group_stops_are_the_throttled_periods(lines: &[Value], throttled: u64) {
    let group = of_type(lines, "summary")[0]["group_stops"]
        .as_u64()
        .unwrap();
    let spans: u64 = of_type(lines, "stop")
        .iter()
        .map(|s| s["duration_ns"].as_u64().unwrap() / s["period_ns"].as_u64().unwrap().max(1))
        .sum();
    let tolerance = (throttled / 50).max(1);
    println!("group stops {group} vs nr_throttled {throttled} ({spans} period(s) outlasted)");
    assert!(
        group <= throttled + tolerance && throttled.saturating_sub(group) <= spans + tolerance,
        "group stops {group} vs nr_throttled delta {throttled} (± {tolerance}, + {spans} \
         outlasted)"
    );
}

/// One busy thread at 20 ms / 100 ms for 4 s (about 40 stops: the 95 % below needs more
/// than 20 to judge) that logs its own CLOCK_REALTIME around each time it is held
/// (`throttle-workload held`): each stop is the rest of its period, judged by two truths
/// the tracer does not make. Refills come one period apart (a stop plus the span the thread ran
/// before it is 100 ms); pinned to one CPU at the most weight, the group spends its quota alone.
/// A stop's own length moves with the host's ticks and steal, so it is judged against the
/// workload's wall clock instead: every hold lies inside exactly one stop (1 ms, under
/// emulation 10 ms: [`common::emulated`]), which also checks the CLOCK_MONOTONIC → UTC mapping.
#[test]
fn one_thread_stops_last_the_rest_of_the_period() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let mut scene = Scene::new(&host.cpu, "one", 20_000, 100_000);
    // The tracer and this test off the workload's CPU: what they ran there would delay the
    // throttle and shorten the stop.
    common::move_away_from(common::last_cpu());
    let mut tracer = common::tracer::command();
    common::away_from(&mut tracer, common::last_cpu());
    let rx = scene.start_tracer_as(tracer);
    let before = scene.cgroup.stat();
    let mut workload = common::spawn_in(
        common::held(4).stdout(Stdio::piped()),
        &scene.cgroup,
        Some(common::last_cpu()),
    );
    let mut out = String::new();
    std::io::Read::read_to_string(&mut workload.stdout.take().unwrap(), &mut out).unwrap();
    assert!(workload.wait().expect("wait workload").success());
    scene.cgroup.wait_refilled();
    let after = scene.cgroup.stat();
    let missed = scene.missed_runs();
    let lines = scene.stop_tracer(rx);

    let stops = of_type(&lines, "stop");
    assert!(stops.len() >= 10, "{} stops: {lines:#?}", stops.len());
    assert_each_stop_once(&stops);
    assert_eq!(of_type(&lines, "end")[0]["lost"], 0, "records lost");
    assert_lengths_are_the_rest_of_the_period(&stops, 80.0);
    assert_group_stops_are_the_throttled_periods(&lines, after.nr_throttled - before.nr_throttled);
    let int = |v: &Value, key: &str| v[key].as_i64().unwrap_or_else(|| panic!("no {key}: {v}"));
    for s in &stops {
        assert_eq!(s["cgroup"], scene.cgroup.path());
        assert_eq!(s["quota_ns"], 20_000_000);
        assert_eq!(s["period_ns"], 100_000_000);
        assert!(s["end"] == "refill" || s["end"] == "unknown", "{s}");
        assert!(s["kernel_ns"].is_u64(), "{s}");
        // 6.18 parks the busy thread at every stop; older kernels park nothing.
        let parked = s["parked"].as_u64().unwrap();
        assert!(parked <= 1, "{s}");
        if parked == 1 {
            let park = int(s, "park_ns");
            assert!(
                (int(s, "start_ns")..=int(s, "end_ns")).contains(&park),
                "{s}"
            );
        }
    }
    // Every stop here ends at a refill, seen at the refill's callbacks when the kernel runs the
    // tracer's programs there. A run its recursion guard skipped leaves the end to the next
    // context switch, which cannot tell a refill from an unchanged quota write: `unknown`, up
    // to that switch after the refill (bounded below). Host, 6.18: one stop in about 700 also
    // ended `unknown` with no skipped run counted, of a cause not found; one such stop a run is
    // allowed beside the kernel's count, read here from the tracer's program fds, which the end
    // line reports.
    let unknown = stops.iter().filter(|s| s["end"] == "unknown").count() as u64;
    println!("{unknown} stop(s) ended unknown; the kernel skipped {missed:?} program run(s)");
    assert!(
        unknown <= missed.unwrap_or(0) + 1,
        "{unknown} stop(s) ended unknown, the kernel skipped {missed:?} program run(s)"
    );
    let end = of_type(&lines, "end");
    match missed {
        Some(n) => assert!(end[0]["missed_runs"].as_u64().unwrap() >= n, "{end:?}"),
        None => assert!(end[0].get("missed_runs").is_none(), "{end:?}"),
    }

    // Under emulation the workload's clock reads lag by a vCPU turn: 2.4 ms seen on a 7.2 guest.
    let bound = if common::emulated() {
        10_000_000
    } else {
        1_000_000
    };
    let mut durations: Vec<i64> = stops.iter().map(|s| int(s, "duration_ns")).collect();
    let mut refill_gaps: Vec<i64> = stops
        .windows(2)
        .map(|w| int(w[1], "end_ns") - int(w[0], "end_ns"))
        .collect();
    let (duration, refill_gap) = (median_i64(&mut durations), median_i64(&mut refill_gaps));
    println!(
        "{} stops, median {:.3} ms, refills a median {:.3} ms apart",
        stops.len(),
        duration as f64 / 1e6,
        refill_gap as f64 / 1e6
    );
    assert!(
        (refill_gap - 100_000_000).abs() <= bound,
        "refills a median {refill_gap} ns apart, not one period"
    );

    // (last realtime before, first after) of each hold, as the workload saw them.
    let holds: Vec<(i64, i64)> = out
        .lines()
        .map(|l| {
            let f: Vec<i64> = l
                .split(' ')
                .skip(2)
                .step_by(2)
                .map(|v| v.parse().unwrap())
                .collect();
            (f[0], f[1])
        })
        .collect();
    assert!(holds.len() >= 10, "{} holds: {out}", holds.len());
    // A stop whose refill no program saw (6.18, cause unknown) ends only when the next throttle
    // opens the next stop: no span between them, where a refill gives the thread its quota.
    // One is allowed, more fail.
    let mut by_start = stops.clone();
    by_start.sort_by_key(|s| int(s, "start_ns"));
    let late: Vec<&Value> = by_start
        .windows(2)
        .filter(|w| int(w[1], "start_ns") - int(w[0], "end_ns") <= 100_000)
        .map(|w| w[0])
        .collect();
    assert!(late.len() <= 1, "stops ended late: {late:#?}");
    let (mut lead, mut lag) = (Vec::new(), Vec::new());
    for &(held, resumed) in &holds {
        let covers =
            |s: &&&Value| int(s, "start_unix_ns") <= resumed && int(s, "end_unix_ns") >= held;
        let covering: Vec<&&Value> = stops
            .iter()
            .filter(covers)
            .filter(|s| !late.contains(s))
            .collect();
        if covering.is_empty() {
            // The hold a late stop began with: it began when the workload last ran.
            let s = late
                .iter()
                .find(|s| covers(s))
                .unwrap_or_else(|| panic!("hold {held}..{resumed} in no stop: {stops:#?}"));
            assert!(int(s, "start_unix_ns") - held >= -bound, "{s}");
            continue;
        }
        assert_eq!(covering.len(), 1, "hold {held}..{resumed}: {covering:#?}");
        let s = covering[0];
        let (start, end) = (int(s, "start_unix_ns"), int(s, "end_unix_ns"));
        // The same offset for both ends of one stop, and the UTC text is the same time.
        assert_eq!(end - start, int(s, "duration_ns"), "{s}");
        let utc: jiff::Timestamp = s["end_utc"].as_str().unwrap().parse().unwrap();
        assert_eq!(utc.as_nanosecond() as i64, end / 1_000 * 1_000, "{s}");
        lead.push(start - held);
        // Never before the workload last ran, nor after it ran again; later only when something
        // else held its CPU first (CI host, 6.18: 5.9 ms, the task parked at its next return
        // to user), so the closeness is judged on the median below.
        assert!(
            start - held >= -bound,
            "stop began {} ns before the workload last ran: {s}",
            held - start
        );
        // An end no program saw at its refill (`unknown`) is the next observation of the
        // cfs_rq, which can come after the workload ran again (CI host, 6.18: 3.5 ms, when its
        // thread was next switched out): an upper bound, at most a period late.
        if s["end"] == "unknown" {
            assert!(
                end - resumed <= 100_000_000,
                "an unknown end {} ns after the workload ran again: {s}",
                end - resumed
            );
            continue;
        }
        lag.push(resumed - end);
        assert!(
            resumed - end >= -bound,
            "the workload ran {} ns before the stop ended: {s}",
            end - resumed
        );
    }
    let (median_lead, median_lag) = (median_i64(&mut lead), median_i64(&mut lag));
    let us = |v: &[i64]| (v[0] / 1_000, v[v.len() - 1] / 1_000);
    println!(
        "{} holds, each inside one stop; stop start − last run (µs) median {} (min, max) {:?}; \
         resumed − stop end (µs) median {} (min, max) {:?}",
        holds.len(),
        median_lead / 1_000,
        us(&lead),
        median_lag / 1_000,
        us(&lag)
    );
    assert!(
        median_lead <= bound,
        "the median stop began {median_lead} ns after the workload last ran"
    );
}

/// Two busy threads at 50 ms / 100 ms on two CPUs: the kernel-accounted time the tracer reports
/// is what cpu.stat's throttled_time grew by, and its group stops are the throttled periods.
#[test]
fn kernel_accounted_time_matches_cpu_stat() {
    kernel_time_matches_cpu_stat("two", |_| common::tracer::command(), &common::backend());
}

/// The same, traced as nobody with CAP_BPF + CAP_PERFMON only (what deploy/daemonset.yaml
/// grants) with the backend `auto` takes (the DaemonSet's): the refill callbacks are
/// recognised without kernel symbol addresses, which /proc/kallsyms shows such a process as
/// zeros. (The kprobe backend's perf events are refused to such a process on 7.2: doctor.rs.)
#[test]
fn bpf_and_perfmon_alone_trace_every_stop() {
    kernel_time_matches_cpu_stat("caps", |_| common::with_bpf_perfmon_only(TRACER), "auto");
}

/// A cgroup the tracer may not read (mode 700, as a runtime's private subtree can be), traced
/// as nobody with CAP_BPF + CAP_PERFMON only: its stops are still traced whole (the kernel's
/// records need no cgroupfs access; Σ kernel_ns = the cpu.stat delta read here as root), the
/// run ends with exit 0, and its summary says that the cpu.stat delta is missing because the
/// cgroup is unreadable: `unreadable` in the NDJSON summary and the text report's line, in
/// `report` of the run's recording.
#[test]
fn a_cgroup_it_may_not_read_is_traced_and_its_missing_cpu_stat_explained() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = common::tracer::output_dir();
    let recording = dir.path().join("private.ndjson");
    let Some((lines, _)) = kernel_time_matches_cpu_stat(
        "private",
        |cgroup| {
            std::fs::set_permissions(cgroup.dir(), std::fs::Permissions::from_mode(0o700))
                .expect("chmod 700 the cgroup");
            let mut tracer = common::with_bpf_perfmon_only(TRACER);
            tracer.arg("--record").arg(&recording);
            tracer
        },
        "auto",
    ) else {
        return;
    };
    let summary = of_type(&lines, "summary")[0];
    assert!(summary["cpu_stat"].is_null(), "{summary}");
    assert_eq!(summary["unreadable"], true, "{summary}");
    let report = common::tracer::report(&recording);
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{report:?}");
    println!("{text}");
    assert!(
        text.contains("cpu.stat delta    unavailable: the cgroup is unreadable to the tracer"),
        "{text}"
    );
}

/// What CAP_DAC_READ_SEARCH would add to CAP_BPF + CAP_PERFMON, and why the tests, the README
/// and deploy/daemonset.yaml leave it out: with it, the same private (mode 700) cgroup's
/// cpu.stat is read, its delta in the summary equal to the one read here as root, and nothing
/// else changes (the stops, traced whole above without it). A capability that bypasses every
/// directory's read permission for the cpu.stat comparison of private subtrees alone: not
/// worth granting by default.
#[test]
fn dac_read_search_adds_only_a_private_cgroups_cpu_stat() {
    use std::os::unix::fs::PermissionsExt as _;
    /// CAP_DAC_READ_SEARCH (2), CAP_PERFMON, CAP_BPF.
    const WITH_DAC_READ_SEARCH: &[u32] = &[2, 38, 39];
    let Some((lines, truth)) = kernel_time_matches_cpu_stat(
        "private-dac",
        |cgroup| {
            std::fs::set_permissions(cgroup.dir(), std::fs::Permissions::from_mode(0o700))
                .expect("chmod 700 the cgroup");
            common::least_privileged(Command::new(TRACER), WITH_DAC_READ_SEARCH)
        },
        "auto",
    ) else {
        return;
    };
    let summary = of_type(&lines, "summary")[0];
    assert!(summary.get("unreadable").is_none(), "{summary}");
    assert_eq!(summary["cpu_stat"]["throttled_ns"], truth, "{summary}");
}

/// Traces two busy threads at 50 ms / 100 ms with `tracer` (made for the cgroup, which it may
/// change first) and `--backend backend`: Σ kernel_ns = the cpu.stat delta, group stops = the
/// throttled periods. Returns the run's lines and the cpu.stat throttled-time delta read here;
/// `None` if this machine cannot run it.
fn kernel_time_matches_cpu_stat(
    tag: &str,
    tracer: impl FnOnce(&Cgroup) -> Command,
    backend: &str,
) -> Option<(Vec<Value>, u64)> {
    let host = common::require(common::host())?;
    // The most CPU weight: without it, other work on the machine can keep the group under its
    // quota (few stops).
    let mut scene = Scene::new(&host.cpu, tag, 50_000, 100_000);
    // The tracer runs before the workload enters the cgroup, and after the workload is gone
    // the last refill ends every stop before cpu.stat is read: both windows hold every stop.
    let tracer = tracer(&scene.cgroup);
    let rx = scene.start_tracer_with(tracer, backend);
    let before = scene.cgroup.stat();
    // One busy thread pinned to each of two CPUs: every throttled period stops both (unpinned,
    // two threads sometimes share a CPU and a period stops one).
    let mut workloads: Vec<Running> = [0, 1]
        .map(|cpu| common::spawn_in(&mut common::busy(1, 3), &scene.cgroup, Some(cpu)))
        .into();
    for w in &mut workloads {
        let status = w.wait().expect("wait workload");
        assert!(status.success(), "workload: {status}");
    }
    scene.cgroup.wait_refilled();
    let after = scene.cgroup.stat();
    let lines = scene.stop_tracer(rx);

    let stops = of_type(&lines, "stop");
    let summary = of_type(&lines, "summary");
    assert_eq!(summary.len(), 1, "{lines:#?}");
    let summary = summary[0];
    assert_each_stop_once(&stops);
    let kernel: u64 = stops
        .iter()
        .map(|s| {
            s["kernel_ns"]
                .as_u64()
                .unwrap_or_else(|| panic!("no kernel_ns: {s}"))
        })
        .sum();
    let unseen = summary["unseen_start_kernel_ns"].as_u64().unwrap();
    let traced = kernel + unseen;
    let truth = after.throttled_ns - before.throttled_ns;
    let periods = after.nr_throttled - before.nr_throttled;
    let error = (traced as f64 - truth as f64) / truth as f64;
    let refills = stops.iter().filter(|s| s["end"] == "refill").count();
    println!(
        "stops {} ({refills} ended by a refill) Σkernel {traced} ns vs cpu.stat {truth} ns \
         ({:+.4}%); open {}",
        stops.len(),
        error * 100.0,
        summary["open"]
    );
    assert!(truth > 0, "the group was never throttled");
    assert_eq!(summary["open"], 0, "{summary}");
    // The refill callbacks are recognised from the first refill on (their addresses are learnt
    // at the first hrtimer expiry after attach): a refill not recognised would end its stops
    // as `unknown` at the next context switch. (Later, under load, an async unthrottle can
    // still race its way to an `unknown` end now and then; the kernel time above is exact.)
    let mut first_per_cpu = std::collections::BTreeMap::new();
    for s in &stops {
        let start = s["start_ns"].as_u64().unwrap();
        let first = first_per_cpu.entry(s["cpu"].as_u64()).or_insert(*s);
        if start < first["start_ns"].as_u64().unwrap() {
            *first = s;
        }
    }
    for (cpu, first) in first_per_cpu {
        assert_eq!(first["end"], "refill", "CPU {cpu:?}'s first stop: {first}");
    }
    assert!(error.abs() <= 0.01, "Σ kernel {traced} vs cpu.stat {truth}");
    assert_group_stops_are_the_throttled_periods(&lines, periods);
    // Every throttled period stops one CPU or both, give or take the two edge periods; no
    // tighter count follows from the kernel's figures (a late period timer adds its overrun
    // to nr_throttled for one refill; under single-threaded emulation a vCPU not run until
    // the refill is never stopped in that period).
    let cpus: std::collections::BTreeSet<u64> =
        stops.iter().filter_map(|s| s["cpu"].as_u64()).collect();
    assert!(
        cpus.contains(&0) && cpus.contains(&1),
        "stops on CPUs {cpus:?}, expected on 0 and 1"
    );
    let count = stops.len() as u64;
    assert!(
        count + 2 >= periods && count <= 2 * periods + 2,
        "{count} stops in {periods} throttled periods"
    );
    // Both CPUs stopped, mostly together: cpu.stat's figure (the per-CPU sum) is about twice
    // the time the group was stopped on any CPU (docs/definitions.md, "overcount").
    let wall = summary["wall_stop_ns"].as_u64().unwrap();
    let overcount = truth as f64 / wall as f64;
    println!(
        "figure: {} stops on CPUs {cpus:?} in {periods} throttled periods; Σ kernel {:.1} ms vs \
         cpu.stat {:.1} ms ({:+.3}%); overcount {overcount:.2}",
        stops.len(),
        traced as f64 / 1e6,
        truth as f64 / 1e6,
        error * 100.0
    );
    assert!(overcount >= 1.5, "overcount {overcount}, expected ≥ 1.5");
    Some((lines, truth))
}

/// Started in the middle of an incident: two busy threads at 50 ms / 100 ms have been stopped
/// for a while when the tracer starts, so stops are in progress while it attaches (which takes
/// hundreds of ms, program by program) and some end before it has read cpu.stat. The window's
/// figures and its cpu.stat deltas hold the same stops: the trace's kernel time equals the
/// cpu.stat delta to the nanosecond, live and in `report` of the recording, and the run is
/// within what cpu.stat (read here) says of the whole span.
#[test]
fn started_in_the_middle_of_an_incident_the_cross_check_is_exact() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let mut scene = Scene::new(&host.cpu, "midway", 50_000, 100_000);
    let before = scene.cgroup.stat();
    // Runs until killed: however long the tracer takes to attach (seconds on a loaded
    // machine; a 4 s workload had ended before it), the group throttles on both sides of it.
    let workload = common::spawn_in(&mut common::busy(2, 600), &scene.cgroup, None);
    common::wait_until(
        std::time::Duration::from_secs(5),
        "the group being throttled before the tracer starts",
        || scene.cgroup.stat().nr_throttled >= before.nr_throttled + 3,
    );
    let dir = common::tracer::output_dir();
    let recording = dir.path().join("midway.ndjson");
    let mut tracer = common::tracer::command();
    tracer.arg("--record").arg(&recording);
    let rx = scene.start_tracer_as(tracer);
    let attached = scene.cgroup.stat().nr_throttled;
    common::wait_until(
        std::time::Duration::from_secs(30),
        "twenty throttled periods while traced",
        || scene.cgroup.stat().nr_throttled >= attached + 20,
    );
    drop(workload);
    scene.cgroup.wait_refilled();
    let after = scene.cgroup.stat();
    let lines = scene.stop_tracer(rx);

    let summary = of_type(&lines, "summary");
    assert_eq!(summary.len(), 1, "{lines:#?}");
    let summary = summary[0];
    let traced = summary["kernel_accounted_ns"].as_u64().unwrap();
    let window = summary["cpu_stat"]["throttled_ns"].as_u64().unwrap();
    let span = after.throttled_ns - before.throttled_ns;
    println!(
        "traced {traced} ns ({} stops, {} begun before tracing: {} ns) vs the window's cpu.stat \
         {window} ns; cpu.stat of the whole span {span} ns",
        summary["stops"], summary["unseen_start_stops"], summary["unseen_start_kernel_ns"]
    );
    assert!(window > 0 && window < span, "{summary}");
    assert_eq!(summary["kernel_unknown_stops"], 0, "{summary}");
    assert_eq!(summary["unseen_start_kernel_unknown"], 0, "{summary}");
    assert_eq!(summary["open"], 0, "{summary}");
    // Exact on v1 (ns); v2's cpu.stat is in µs, truncated, so the window's delta is ±1 µs.
    let resolution = summary["cpu_stat"]["resolution_ns"].as_u64().unwrap_or(0);
    assert!(traced.abs_diff(window) <= resolution, "{summary}");

    let offline = common::tracer::report(&recording);
    let text = String::from_utf8_lossy(&offline.stdout);
    assert!(offline.status.success(), "report: {text}");
    let cross_check = text
        .lines()
        .find(|l| l.trim_start().starts_with("cross-check "))
        .unwrap_or_else(|| panic!("no cross-check line: {text}"));
    // The recording's own cross-check: the difference it prints, `(trace ±N ns)`, within the
    // counter's resolution (0 on v1).
    let difference: i64 = cross_check
        .split("(trace ")
        .nth(1)
        .and_then(|rest| rest.split(" ns)").next())
        .and_then(|n| n.trim_start_matches('+').parse().ok())
        .unwrap_or_else(|| panic!("no `(trace N ns)` in {cross_check}"));
    assert!(difference.unsigned_abs() <= resolution, "{cross_check}");
}

/// Waits, at most a second, until `cgroup`'s threads have run nothing for 20 ms by their
/// schedstat (sum_exec_runtime, brought up to date at every tick while a thread runs; 20 ms is
/// longer than a tick and a scheduler slice): the group is stopped, by the kernel's own count.
fn wait_stopped(cgroup: &Cgroup) -> bool {
    let run_ns = || -> u64 {
        cgroup
            .tasks()
            .iter()
            .filter_map(|pid| fs::read_dir(format!("/proc/{pid}/task")).ok())
            .flatten()
            .flatten()
            .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let before = run_ns();
        std::thread::sleep(Duration::from_millis(20));
        if run_ns() == before {
            return true;
        }
    }
    false
}

/// The quota written while the group is stopped (changed, rewritten unchanged, removed): each
/// write unthrottles the stopped CPU at once (tg_set_cfs_bandwidth), so the open stop ends
/// within the write as `quota_change`, never as a refill and never left open. A rewrite may
/// read `unknown` only where `start` lists `quota_change` as hidden, and `refill` only where
/// nr_periods moved during the write (the period timer raced it). At 1 ms / 100 ms one busy
/// thread is stopped 98 % of the time, and each write waits until its threads' schedstat says
/// the group is stopped, so nearly every write finds a stop open.
#[test]
fn a_quota_written_while_stopped_ends_the_stop_as_a_quota_change() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let mut scene = Scene::new(&host.cpu, "quota", 1_000, 100_000);
    let rx = scene.start_tracer();
    let hidden = scene.start["blind_end_reasons"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r == "quota_change"));
    let mut workload = common::spawn_in(
        &mut common::busy(1, 3),
        &scene.cgroup,
        Some(common::last_cpu()),
    );
    // (quota written, whether the settings change, when the write began and ended, whether a
    // period timer ran meanwhile, whether the threads' schedstat saw the group stopped before).
    let mut writes = Vec::new();
    std::thread::sleep(std::time::Duration::from_millis(300));
    for (quota, changes) in [
        (Some(2_000), true),
        (Some(2_000), false),
        (Some(1_000), true),
        (Some(1_000), false),
        (Some(2_000), true),
        (Some(2_000), false),
        (None, true),
    ] {
        let stopped = wait_stopped(&scene.cgroup);
        let periods = scene.cgroup.stat().nr_periods;
        let from = common::monotonic_ns();
        scene.cgroup.write_quota(quota);
        let to = common::monotonic_ns();
        let refilled = scene.cgroup.stat().nr_periods != periods;
        writes.push((quota, changes, from, to, refilled, stopped));
        std::thread::sleep(std::time::Duration::from_millis(150));
    }
    let status = workload.wait().expect("wait workload");
    assert!(status.success(), "workload: {status}");
    let lines = scene.stop_tracer(rx);
    let stops = of_type(&lines, "stop");
    let summary = of_type(&lines, "summary");
    assert_eq!(summary.len(), 1, "{lines:#?}");
    assert_eq!(summary[0]["open"], 0, "{}", summary[0]);

    let slack = if common::emulated() { 50 } else { 10 } * 1_000_000;
    let mut hit = 0;
    for (quota, changes, from, to, refilled, stopped) in &writes {
        let open: Vec<_> = stops
            .iter()
            .filter(|s| {
                s["start_ns"].as_u64().unwrap() < *from && s["end_ns"].as_u64().unwrap() >= *from
            })
            .collect();
        println!(
            "write {quota:?} (changes: {changes}, a period timer ran: {refilled}, seen stopped: \
             {stopped}) at {from}..{to}: {:?}",
            open.iter()
                .map(|s| (s["end"].clone(), s["end_ns"].as_u64().unwrap() - from))
                .collect::<Vec<_>>()
        );
        assert!(open.len() <= 1, "one CPU, one stop at a time: {open:?}");
        let Some(stop) = open.first() else {
            continue;
        };
        hit += u32::from(!refilled);
        assert!(
            stop["end_ns"].as_u64().unwrap() <= to + slack,
            "the stop open at the write ended after it: {stop}"
        );
        let mut allowed = vec!["quota_change"];
        if !changes && hidden {
            allowed.push("unknown");
        }
        if *refilled {
            // The refill and the write both unthrottle, under the same lock, in either order.
            allowed.push("refill");
        }
        assert!(
            allowed.iter().any(|a| stop["end"] == *a),
            "write {quota:?} at {from}..{to} ended {stop}"
        );
    }
    assert!(
        hit >= 5,
        "only {hit} of {} writes found the group stopped",
        writes.len()
    );
    let after_max = writes.last().unwrap().3 + slack;
    assert!(
        stops
            .iter()
            .all(|s| s["start_ns"].as_u64().unwrap() < after_max),
        "the group stopped after its quota was removed"
    );
}
