//! `throttle-tracer serve` scraped by a real Prometheus server (Debian's `prometheus`, which
//! `cargo xtask setup` installs), while rounds of 40 ms of CPU every 500 ms on one pinned thread
//! run under a 20 ms / 100 ms quota in a real cgroup (v1 or v2): what Prometheus stored is what the exporter served, the mirrored
//! cpu.stat counter is the kernel's, and the exporter's stop count is the kernel's count of
//! throttled periods. A second Prometheus, with native histograms enabled, scrapes the protobuf
//! encoding: the count and sum of the native histograms it stored are the exporter's stop
//! counters. `promtool check metrics` must find nothing to say about a scrape.
//!
//! Both servers load deploy/prometheus/rules.yaml (its windows and `for` shortened to seconds):
//! while the workload runs, both alerts fire for the throttled cgroup (on the classic server
//! from the `_bucket` p99, on the native one from the native p99) and stay inactive for a
//! second, unthrottled cgroup whose series the rules evaluate too (its own cpu.stat shows no
//! throttled period); Debian's Alertmanager delivers the notification to a webhook receiver on
//! loopback, with the group's limit in its `advice` annotation. Every query of deploy/grafana/throttle-tracer.json, run against the server that
//! holds its form of the histogram at a moment the workload was throttled, returns series of the
//! throttled cgroup (or of the node, for the per-node lost records), and the dashboard's
//! variables list it. `promtool test rules` runs rules.yaml's unit tests.
//!
//! Needs root, kernel BTF, a cpu hierarchy, /usr/bin/prometheus and
//! /usr/bin/prometheus-alertmanager; otherwise it says why it cannot run (a failure under
//! `CI=true`).
use test_support as common;

use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use common::http::{
    self, PROMETHEUS, PROMTOOL, free_port, get, percent_encode, query, sample, scraped_since,
    wait_ready,
};
use common::{Cgroup, Host, Running};
use serde_json::Value;

const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";
/// How long the workload runs: long enough for both alerts to fire (a 5 s window, 2 s `for`,
/// 1 s scrapes and evaluations) and the notification to arrive, with room for a slow start.
const WORKLOAD_SECONDS: u32 = 16;
/// The alerts of rules.yaml that page on a throttled cgroup.
const ALERTS: [&str; 2] = ["CPUQuotaStopsLong", "CPUQuotaStoppedTime"];

/// The host, once Prometheus and Alertmanager are there too.
fn machine() -> Result<Host, String> {
    for program in [PROMETHEUS, PROMTOOL, ALERTMANAGER] {
        if !Path::new(program).exists() {
            return Err(format!(
                "no {program} (`cargo xtask setup host-tests` installs Debian's prometheus and \
                 prometheus-alertmanager)"
            ));
        }
    }
    common::host()
}

/// A file of deploy/.
fn deploy(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

/// rules.yaml with its windows (5 and 10 minutes, the hour, the day, the week), its hourly
/// group's interval and its `for` durations shortened to seconds, so that the alerts fire and
/// the "what to set" records fill within a test: each must be there to shorten.
fn rules_in_seconds() -> String {
    let mut rules = fs::read_to_string(deploy("prometheus/rules.yaml")).expect("rules.yaml");
    for (long, short) in [
        ("[5m]", "[5s]"),
        ("[10m]", "[10s]"),
        ("[1h]", "[5s]"),
        ("[1d]", "[10s]"),
        ("[7d]", "[15s]"),
        ("interval: 1h", "interval: 1s"),
        ("for: 15m", "for: 2s"),
        ("for: 10m", "for: 2s"),
    ] {
        assert!(rules.contains(long), "rules.yaml has no {long}");
        rules = rules.replace(long, short);
    }
    rules
}

/// The cgroup, the processes and the temporary directory of the test; the guards kill the
/// processes and remove the cgroup, also when an assertion failed.
struct Scene {
    /// 20 ms / 100 ms at the most CPU weight: other work cannot shorten the group's stops.
    cgroup: Cgroup,
    /// 200 ms / 100 ms for a workload of 5 ms per 100 ms pinned to one CPU: traced, and never
    /// throttled (one CPU cannot use more than 100 ms a period; the workload's start-up spin,
    /// which lines it up with the period, used up a 50 ms quota twice).
    calm: Cgroup,
    dir: tempfile::TempDir,
    children: Vec<Running>,
}

impl Scene {
    fn new(host: &Host) -> Self {
        Self {
            cgroup: Cgroup::throttled(&host.cpu, "prom", 20_000, 100_000),
            calm: Cgroup::throttled(&host.cpu, "prom-calm", 200_000, 100_000),
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

    /// Rounds of one thread pinned to the last CPU (as `taskset -c <last>`), inside the cgroup
    /// from before its exec, for `WORKLOAD_SECONDS`.
    /// With it, 5 ms of CPU every 100 ms in the calm group, on the same CPU.
    fn start_workload(&mut self) {
        let calm = common::spawn_in(
            common::spiky(100, 5, WORKLOAD_SECONDS * 10, 1).stdout(Stdio::null()),
            &self.calm,
            Some(common::last_cpu()),
        );
        // Rounds of 40 ms every 500 ms: each stopped once for about 80 ms (16 % of the wall
        // clock), and each a busy run that ends, so that its demand is measured as it goes.
        let workload = common::spawn_in(
            common::spiky(500, 40, WORKLOAD_SECONDS * 2, 1).stdout(Stdio::null()),
            &self.cgroup,
            Some(common::last_cpu()),
        );
        self.children.push(calm);
        self.children.push(workload);
    }

    fn wait_workload(&mut self) {
        for _ in 0..2 {
            let mut workload = self.children.pop().expect("workload running");
            let status = workload.wait().expect("wait workload");
            assert!(status.success(), "workload: {status}");
        }
    }
}

/// A Prometheus of the scene (`common::http`'s) that also evaluates the rules, shortened to
/// seconds, every second and sends its alerts to the Alertmanager at `alertmanager_port`;
/// returns its port once it is ready.
fn start_prometheus(
    scene: &mut Scene,
    name: &str,
    exporter_port: u16,
    alertmanager_port: u16,
    features: &[&str],
) -> u16 {
    let rules = scene.dir.path().join(format!("{name}-rules.yaml"));
    fs::write(&rules, rules_in_seconds()).unwrap();
    let alerting = format!(
        "rule_files: ['{}']\nalerting:\n  alertmanagers:\n    - static_configs:\n        \
         - targets: ['127.0.0.1:{alertmanager_port}']\n",
        rules.display()
    );
    let (server, port) =
        http::start_prometheus(scene.dir.path(), name, exporter_port, features, &alerting);
    scene.children.push(server);
    port
}

/// A webhook receiver on loopback, as Alertmanager posts to it: each request's body arrives
/// on the channel; the thread lives as long as the test process.
fn start_webhook() -> (u16, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook receiver");
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut length = 0;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some((key, value)) = line.split_once(':')
                    && key.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok() {
                let _ = (&stream).write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                let _ = tx.send(String::from_utf8_lossy(&body).into_owned());
            }
        }
    });
    (port, rx)
}

/// Starts Debian's Alertmanager on loopback (no cluster port), routing every alert at once to
/// the webhook receiver on `webhook_port`; returns its port once it is ready.
fn start_alertmanager(scene: &mut Scene, webhook_port: u16) -> u16 {
    let dir = scene.dir.path().join("alertmanager");
    fs::create_dir(&dir).expect("create the Alertmanager directory");
    let config = dir.join("alertmanager.yml");
    fs::write(
        &config,
        format!(
            "route:\n  receiver: webhook\n  group_by: [alertname, cgroup]\n  group_wait: 1s\n  \
             group_interval: 1s\n  repeat_interval: 1h\n\
             receivers:\n  - name: webhook\n    webhook_configs:\n      \
             - url: http://127.0.0.1:{webhook_port}/\n"
        ),
    )
    .unwrap();
    let log = fs::File::create(dir.join("alertmanager.log")).unwrap();
    let port = free_port();
    scene.spawn(
        Command::new(ALERTMANAGER)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(log),
    );
    wait_ready(port, "/-/ready", "alertmanager");
    port
}

/// The JSON `data` of a Prometheus API GET.
fn api(port: u16, path: &str) -> Value {
    let (status, body) = get(port, path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(status, 200, "{path}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["data"].clone()
}

/// Every series of an instant query at `time` (Unix seconds).
fn query_at(port: u16, promql: &str, time: f64) -> Vec<Value> {
    let data = api(
        port,
        &format!("/api/v1/query?query={}&time={time}", percent_encode(promql)),
    );
    data["result"].as_array().expect("result array").clone()
}

/// The alerts `port`'s Prometheus has pending or firing: (name, cgroup, state, value).
fn alerts(port: u16) -> Vec<(String, String, String, String)> {
    let data = api(port, "/api/v1/alerts");
    let field = |a: &Value, key: &str| a[key].as_str().unwrap_or_default().to_owned();
    data["alerts"]
        .as_array()
        .expect("alerts array")
        .iter()
        .map(|a| {
            (
                field(&a["labels"], "alertname"),
                field(&a["labels"], "cgroup"),
                field(a, "state"),
                field(a, "value"),
            )
        })
        .collect()
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Runs every query of the Grafana dashboard (and its variables) at `time` against both
/// servers: each returns series of `cgroup` (any `cgroup` label it keeps is that one) from
/// every server that holds its form of the stop histogram, with a positive value among them
/// (the lost records, per node, may be 0); prints one line per query.
fn dashboard_queries_return_the_throttled_cgroup(
    servers: [(u16, &str); 2],
    instance: &str,
    cgroup: &str,
    time: f64,
) {
    let dashboard = common::dashboard::load();
    for (variable, selector, label) in dashboard.label_values(instance) {
        for (port, name) in servers {
            let path = format!(
                "/api/v1/label/{label}/values?match%5B%5D={}",
                percent_encode(&selector)
            );
            let values: Vec<String> = api(port, &path)
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            let expected = if label == "cgroup" { cgroup } else { instance };
            println!("variable ${variable} ({name}): {values:?}");
            assert!(
                values.iter().any(|v| v == expected),
                "${variable} on {name}: {values:?}"
            );
        }
    }
    for (panel, ref_id, expr) in dashboard.queries(instance, cgroup) {
        let native_form = expr.contains("throttle_tracer_cpu_stop_seconds{");
        let classic_only = expr.contains("_bucket{") && !native_form;
        let per_node = expr.contains("throttle_tracer_lost_records_total");
        let mut said = Vec::new();
        for (port, name) in servers {
            let result = query_at(port, &expr, time);
            let values: Vec<f64> = result
                .iter()
                .filter_map(|r| r["value"][1].as_str()?.parse().ok())
                .collect();
            said.push(format!(
                "{name} {} series (max {:.4})",
                result.len(),
                values
                    .iter()
                    .copied()
                    .filter(|v| v.is_finite())
                    .fold(f64::NAN, f64::max)
            ));
            if classic_only && name == "native" {
                continue;
            }
            assert!(
                !result.is_empty(),
                "{panel} {ref_id} on {name}: no series for {expr}"
            );
            for r in &result {
                let labels = &r["metric"];
                if let Some(c) = labels["cgroup"].as_str() {
                    assert_eq!(c, cgroup, "{panel} {ref_id} on {name}");
                }
                if per_node {
                    assert_eq!(
                        labels["instance"].as_str(),
                        Some(instance),
                        "{panel} {ref_id}"
                    );
                }
            }
            assert!(
                per_node || values.iter().any(|v| v.is_finite() && *v > 0.0),
                "{panel} {ref_id} on {name}: {values:?} for {expr}"
            );
        }
        println!("panel \"{panel}\" {ref_id}: {expr} -> {}", said.join(", "));
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
    let calm = scene.calm.path().to_owned();
    let exporter_port = free_port();

    scene.spawn(
        common::tracer::command()
            .args(["serve", "--backend", "tracepoint", "--listen"])
            .arg(format!("127.0.0.1:{exporter_port}"))
            .args(["--cgroup", &cgroup, "--cgroup", &calm])
            // The advice made again every second, and for a target that a few seconds of
            // rounds can be judged on (5 %: 30 periods): the workload lasts seconds, not hours.
            .args(["--advice-every", "1s", "--target", "5%"])
            .stdout(Stdio::null()),
    );
    wait_ready(exporter_port, "/healthz", "throttle-tracer serve");
    let (webhook_port, notifications) = start_webhook();
    let alertmanager_port = start_alertmanager(&mut scene, webhook_port);

    // Prometheus 2.42 with native histograms on stores only the native form of a histogram
    // that has both, so the classic series come from a second server without the feature.
    let classic_port =
        start_prometheus(&mut scene, "classic", exporter_port, alertmanager_port, &[]);
    let native_port = start_prometheus(
        &mut scene,
        "native",
        exporter_port,
        alertmanager_port,
        &["native-histograms"],
    );
    let servers = [(classic_port, "classic"), (native_port, "native")];

    let before = scene.nr_throttled();
    let calm_before = scene.calm.stat().nr_throttled;
    scene.start_workload();
    let workload_started = Instant::now();
    // While the group is throttled: both alerts fire for it on both servers, none for the calm
    // group, whose rules see its series (a wall-stopped rate of 0).
    common::wait_until(
        Duration::from_secs(WORKLOAD_SECONDS.into()),
        "both alerts firing for the throttled cgroup on both servers",
        || {
            servers.iter().all(|(port, _)| {
                let now = alerts(*port);
                ALERTS.iter().all(|alert| {
                    now.iter()
                        .any(|a| a.0 == *alert && a.1 == cgroup && a.2 == "firing")
                })
            })
        },
    );
    let firing = unix_seconds(SystemTime::now());
    println!(
        "alerts firing {:.1} s after the workload started",
        workload_started.elapsed().as_secs_f64()
    );
    for (port, name) in servers {
        let now = alerts(port);
        for a in &now {
            println!(
                "alert ({name}): {} {{cgroup=\"{}\"}} {} value {}",
                a.0, a.1, a.2, a.3
            );
        }
        assert!(
            now.iter().all(|a| a.1 != calm),
            "{name}: an alert for {calm}: {now:?}"
        );
        let rate =
            format!("cgroup:throttle_tracer_wall_stopped_seconds:rate5m{{cgroup=\"{calm}\"}}");
        let calm_rate = query_at(port, &rate, firing);
        println!("{rate} ({name}): {calm_rate:?}");
        assert_eq!(
            calm_rate.len(),
            1,
            "{name}: the rules saw no series of {calm}"
        );
        assert_eq!(
            calm_rate[0]["value"][1].as_str(),
            Some("0"),
            "{name}: {calm_rate:?}"
        );
    }
    // The notification of each alert reaches the receiver through Alertmanager.
    let mut notified: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ALERTS.iter().all(|a| notified.iter().any(|n| n == a)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let body = notifications
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no webhook notification of {ALERTS:?}, only {notified:?}"));
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        for a in v["alerts"].as_array().expect("alerts in the notification") {
            let labels = &a["labels"];
            assert_ne!(labels["cgroup"].as_str(), Some(calm.as_str()), "{body}");
            if labels["cgroup"].as_str() == Some(cgroup.as_str()) && a["status"] == "firing" {
                let name = labels["alertname"].as_str().unwrap_or_default();
                let advice = a["annotations"]["advice"].as_str().unwrap_or_default();
                println!(
                    "webhook: {name} firing for {cgroup}: {}; advice: {advice}",
                    a["annotations"]["summary"]
                );
                // The group's own 20 ms / 100 ms, read back through the records by the
                // annotation's template.
                assert!(
                    advice.starts_with("Limit today: 200m."),
                    "{name}'s advice annotation: {advice:?}"
                );
                notified.push(name.to_owned());
            }
        }
    }
    dashboard_queries_return_the_throttled_cgroup(
        servers,
        &format!("127.0.0.1:{exporter_port}"),
        &cgroup,
        firing,
    );
    scene.wait_workload();
    let calm_after = scene.calm.stat().nr_throttled;
    assert_eq!(
        calm_after, calm_before,
        "the calm group was throttled after all"
    );
    // The last refill ends the last stop; then both servers scrape the frozen counters.
    scene.cgroup.wait_refilled();
    let frozen = SystemTime::now();
    let after = scene.nr_throttled();
    for (port, name) in servers {
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

/// rules.yaml is valid and its unit tests pass (deploy/prometheus/rules.test.yaml: input series
/// for a throttled, a briefly stopped and a free cgroup; rules.week.test.yaml: two containers
/// over eight days).
#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    let Some(()) = common::require(if Path::new(PROMTOOL).exists() {
        Ok(())
    } else {
        Err(format!(
            "no {PROMTOOL} (`cargo xtask setup host-tests` installs Debian's prometheus)"
        ))
    }) else {
        return;
    };
    for args in [
        &["check", "rules", "rules.yaml"][..],
        &["test", "rules", "rules.test.yaml", "rules.week.test.yaml"],
    ] {
        let out = Command::new(PROMTOOL)
            .args(args)
            .current_dir(deploy("prometheus"))
            .output()
            .expect("run promtool");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("promtool {}: {}", args.join(" "), said.trim());
        assert!(out.status.success() && said.contains("SUCCESS"), "{said}");
    }
}
