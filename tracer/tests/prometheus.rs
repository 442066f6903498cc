//! `throttle-tracer serve` scraped by a real Prometheus server (Debian's `prometheus`, which
//! `cargo xtask setup` installs), while one pinned busy thread runs under a 20 ms / 100 ms quota
//! in a real cgroup (v1 or v2): what Prometheus stored is what the exporter served, the mirrored
//! cpu.stat counter is the kernel's, and the exporter's stop count is the kernel's count of
//! throttled periods. A second Prometheus, with native histograms enabled, scrapes the protobuf
//! encoding: the count and sum of the native histograms it stored are the exporter's stop
//! counters. `promtool check metrics` must find nothing to say about a scrape.
//!
//! Needs root, kernel BTF, a cpu hierarchy and /usr/bin/prometheus; otherwise it says why it
//! cannot run (a failure under `CI=true`).
mod common;

use std::{
    io::Write,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime},
};

use common::http::{
    PROMETHEUS, PROMTOOL, free_port, get, query, sample, scraped_since, start_prometheus,
    wait_ready,
};
use common::{Cgroup, Host, Running};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
/// How long the workload runs: about six scrapes at 1 s.
const WORKLOAD_SECONDS: u32 = 6;

/// The host, once Prometheus is there too.
fn machine() -> Result<Host, String> {
    if !Path::new(PROMETHEUS).exists() || !Path::new(PROMTOOL).exists() {
        return Err(format!(
            "no {PROMETHEUS} or {PROMTOOL} (`cargo xtask setup` installs Debian's prometheus)"
        ));
    }
    common::host()
}

/// The cgroup, the processes and the temporary directory of the test; the guards kill the
/// processes and remove the cgroup, also when an assertion failed.
struct Scene {
    /// 20 ms / 100 ms at the most CPU weight: other work cannot shorten the group's stops.
    cgroup: Cgroup,
    dir: tempfile::TempDir,
    children: Vec<Running>,
}

impl Scene {
    fn new(host: &Host) -> Self {
        Self {
            cgroup: Cgroup::throttled(&host.cpu, "prom", 20_000, 100_000),
            dir: tempfile::tempdir().expect("temp dir"),
            children: Vec::new(),
        }
    }

    fn nr_throttled(&self) -> u64 {
        self.cgroup.stat().nr_throttled
    }

    fn spawn(&mut self, cmd: &mut Command) {
        self.children.push(Running::spawn(cmd));
    }

    /// One busy thread pinned to the last CPU (as `taskset -c <last>`), inside the cgroup from
    /// before its exec, for `WORKLOAD_SECONDS`.
    fn start_workload(&mut self) {
        let workload = common::spawn_in(
            &mut common::busy(1, WORKLOAD_SECONDS),
            &self.cgroup,
            Some(common::last_cpu()),
        );
        self.children.push(workload);
    }

    fn wait_workload(&mut self) {
        let mut workload = self.children.pop().expect("workload running");
        let status = workload.wait().expect("wait workload");
        assert!(status.success(), "workload: {status}");
    }
}

#[test]
fn prometheus_stores_what_the_exporter_serves_and_cpu_stat_agrees() {
    let Some(host) = common::require(machine()) else {
        return;
    };
    let started = Instant::now();
    let mut scene = Scene::new(&host);
    let cgroup = scene.cgroup.path().to_owned();
    let exporter_port = free_port();

    scene.spawn(
        Command::new(TRACER)
            .args(["serve", "--backend", "tracepoint", "--listen"])
            .arg(format!("127.0.0.1:{exporter_port}"))
            .args(["--cgroup", &cgroup])
            .stdout(Stdio::null()),
    );
    wait_ready(exporter_port, "/healthz", "throttle-tracer serve");

    // Prometheus 2.42 with native histograms on stores only the native form of a histogram
    // that has both, so the classic series come from a second server without the feature.
    let (classic, classic_port) = start_prometheus(scene.dir.path(), "classic", exporter_port, &[]);
    scene.children.push(classic);
    let (native, native_port) = start_prometheus(
        scene.dir.path(),
        "native",
        exporter_port,
        &["native-histograms"],
    );
    scene.children.push(native);

    let before = scene.nr_throttled();
    scene.start_workload();
    scene.wait_workload();
    // The last refill ends the last stop; then both servers scrape the frozen counters.
    scene.cgroup.wait_refilled();
    let frozen = SystemTime::now();
    let after = scene.nr_throttled();
    for (port, name) in [(classic_port, "classic"), (native_port, "native")] {
        common::wait_until(
            Duration::from_secs(10),
            &format!("a scrape by prometheus ({name}) after the counters froze"),
            || scraped_since(port, &cgroup, frozen),
        );
    }

    let l = format!("{{cgroup=\"{cgroup}\"}}");
    let names = [
        "throttle_tracer_stops_total",
        "throttle_tracer_cpu_stopped_seconds_total",
        "throttle_tracer_wall_stopped_seconds_total",
        "throttle_tracer_cpu_stop_seconds_count",
        "throttle_tracer_cpu_stop_seconds_sum",
        "throttle_tracer_group_stop_seconds_count",
        "throttle_tracer_group_stop_seconds_sum",
        "throttle_tracer_cpustat_nr_throttled_total",
        "throttle_tracer_cpustat_nr_periods_total",
        "throttle_tracer_cpustat_throttled_seconds_total",
    ];
    // The native histograms against the exporter's own figures for the same stops, each from
    // a counter family of its own (or the classic count): (query, served series).
    let native = [
        (
            format!("histogram_count(throttle_tracer_cpu_stop_seconds{l})"),
            "throttle_tracer_stops_total",
        ),
        (
            format!("histogram_sum(throttle_tracer_cpu_stop_seconds{l})"),
            "throttle_tracer_cpu_stopped_seconds_total",
        ),
        (
            format!("histogram_count(throttle_tracer_group_stop_seconds{l})"),
            "throttle_tracer_group_stop_seconds_count",
        ),
        (
            format!("histogram_sum(throttle_tracer_group_stop_seconds{l})"),
            "throttle_tracer_wall_stopped_seconds_total",
        ),
    ];
    // Nothing changes any more; a scrape may still be in flight, so allow a few seconds for
    // each Prometheus's latest sample to be the exporter's latest value.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (scrape, stored) = loop {
        let (status, scrape) = get(exporter_port, "/metrics").expect("scrape the exporter");
        assert_eq!(status, 200, "{scrape}");
        let served: Vec<f64> = names
            .iter()
            .map(|n| sample(&scrape, &format!("{n}{l}")))
            .collect();
        let stored: Vec<f64> = names
            .iter()
            .map(|n| query(classic_port, &format!("{n}{l}")))
            .collect();
        let truth: Vec<f64> = native
            .iter()
            .map(|(_, n)| served[names.iter().position(|m| m == n).unwrap()])
            .collect();
        let stored_native: Vec<f64> = native
            .iter()
            .map(|(promql, _)| query(native_port, promql))
            .collect();
        if (served == stored && truth == stored_native) || Instant::now() > deadline {
            for ((n, s), p) in names.iter().zip(&served).zip(&stored) {
                println!("{n}: exporter {s}, prometheus {p}");
            }
            for (((promql, n), t), p) in native.iter().zip(&truth).zip(&stored_native) {
                println!("{promql}: prometheus (native) {p}, exporter {n} {t}");
            }
            assert_eq!(
                served, stored,
                "Prometheus stored other values than were served"
            );
            assert_eq!(
                truth, stored_native,
                "the native histograms Prometheus stored disagree with the exporter's counters"
            );
            break (scrape, stored);
        }
        thread::sleep(Duration::from_millis(500));
    };
    let value = |name: &str| stored[names.iter().position(|n| *n == name).unwrap()];
    let stops = value("throttle_tracer_stops_total");
    let median = query(
        classic_port,
        &format!("histogram_quantile(0.5, throttle_tracer_cpu_stop_seconds_bucket{l})"),
    );
    let native_median = query(
        native_port,
        &format!("histogram_quantile(0.5, throttle_tracer_cpu_stop_seconds{l})"),
    );
    let mirrored = value("throttle_tracer_cpustat_nr_throttled_total");
    let mean = value("throttle_tracer_cpu_stopped_seconds_total") / stops;
    println!(
        "cpu.stat nr_throttled {before} -> {after} (delta {}); stops_total {stops}; \
         prometheus median stop {median:.4} s (classic), {native_median:.4} s (native); \
         mean stop {mean:.4} s",
        after - before
    );

    // The mirror is the kernel's counter itself.
    assert_eq!(mirrored, after as f64, "mirrored nr_throttled vs cpu.stat");
    // One pinned thread: one stop per throttled period.
    let delta = (after - before) as f64;
    assert!(
        delta >= 20.0,
        "the group was hardly throttled: {delta} periods"
    );
    assert!(
        (stops - delta).abs() <= 2.0,
        "stops_total {stops} vs nr_throttled delta {delta}"
    );
    // Each stop is the rest of the period, ~80 ms: in the (64 ms, 128 ms] bucket.
    assert!((0.064..=0.128).contains(&median), "median stop {median} s");
    // The stops are all about as long, so their median is near their mean; native buckets are
    // narrow enough (≤ 9%) to show it, where the classic median lands anywhere in its bucket.
    assert!(
        (native_median - mean).abs() <= 0.1 * mean,
        "native median stop {native_median} s vs mean {mean} s"
    );
    // One CPU: each stop is its own group stop; the last is held back (no later episode).
    let group = value("throttle_tracer_group_stop_seconds_count");
    assert!(
        stops - group <= 1.0 && group <= stops,
        "group stops {group} vs stops {stops}"
    );
    assert_eq!(
        value("throttle_tracer_cpu_stop_seconds_sum"),
        value("throttle_tracer_cpu_stopped_seconds_total")
    );

    let mut promtool = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("promtool check metrics: {} {:?}", out.status, said.trim());
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    println!("took {:.1} s", started.elapsed().as_secs_f64());
}
