//! Real containers under the tracer: a private dockerd and a private podman (Debian's, see
//! [`common::containers`]), containers with `--cpus` and `--cpu-period`/`--cpu-quota`, two at
//! once, each selected by `--container <short id>`. The truth is each container's own cpu.stat,
//! read here from the cgroup its first process is in (/proc/PID/cgroup), not from the runtime
//! or the tracer: Σ kernel_ns of its stops is its throttled time's growth, the exporter's
//! mirrored counters are its counters, and `scan`'s row holds them. The runtime's name (the
//! short id) is in the text summary, the NDJSON and the exporter's labels. At the end the
//! engine is shut down and nothing of it is left: no container, no daemon, no state directory,
//! no mount, no cgroup.
//!
//! Needs root, kernel BTF, a cpu hierarchy and the runtimes; otherwise it says why it cannot
//! run (a failure under `CI=true`).
mod common;

use std::{
    fs,
    process::{Command, Stdio},
    time::Duration,
};

use common::containers::{Container, Engine, Kind};
use common::http::{free_port, get, sample, wait_ready};
use common::{CpuStat, Running};
use serde_json::Value;

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
/// How long each container's load runs.
const LOAD_SECONDS: u32 = 3;

/// One container of a test: the runtime's limits, and how many threads its load spins.
struct Spec {
    limits: &'static [&'static str],
    threads: u32,
}

#[test]
fn two_docker_containers_by_short_id_match_their_own_cpu_stat() {
    containers_match_their_cpu_stat(
        Kind::Docker,
        &[
            Spec {
                limits: &["--cpus", "0.5"],
                threads: 2,
            },
            Spec {
                limits: &["--cpu-period", "50000", "--cpu-quota", "10000"],
                threads: 1,
            },
        ],
    );
}

#[test]
fn a_podman_container_by_short_id_matches_its_own_cpu_stat() {
    containers_match_their_cpu_stat(
        Kind::Podman,
        &[Spec {
            limits: &["--cpus", "0.5"],
            threads: 2,
        }],
    );
}

fn containers_match_their_cpu_stat(kind: Kind, specs: &[Spec]) {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let Some(mut engine) = common::require(Engine::start(kind, &host.cpu)) else {
        return;
    };
    let containers: Vec<Container> = specs
        .iter()
        .map(|s| engine.idle_container(&host.cpu, s.limits))
        .collect();
    for c in &containers {
        let quota = fs::read_to_string(c.dir.join("cpu.cfs_quota_us"))
            .or_else(|_| fs::read_to_string(c.dir.join("cpu.max")))
            .unwrap_or_default();
        println!(
            "{} {} in {}: quota {}",
            kind.as_str(),
            c.short_id(),
            c.cgroup,
            quota.trim()
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("run.ndjson");
    let selection: Vec<String> = containers
        .iter()
        .flat_map(|c| ["--container".to_owned(), c.short_id().to_owned()])
        .collect();
    // The text report on stdout, the NDJSON in the recording, the exporter beside them.
    let tracer = Running::spawn(
        Command::new(TRACER)
            .args(["--backend", &common::backend(), "--record"])
            .arg(&recording)
            .args(&selection)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    );
    let port = free_port();
    let _serve = Running::spawn(
        Command::new(TRACER)
            .args(["serve", "--backend", &common::backend(), "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(&selection)
            .stdout(Stdio::null()),
    );
    common::wait_until(
        Duration::from_secs(60),
        "the tracer recording its start line (see its stderr above)",
        || fs::read_to_string(&recording).is_ok_and(|t| t.ends_with('\n')),
    );
    wait_ready(port, "/healthz", "throttle-tracer serve");

    let before: Vec<CpuStat> = containers.iter().map(|c| host.cpu.stat(&c.dir)).collect();
    let loads: Vec<Running> = containers
        .iter()
        .zip(specs)
        .map(|(c, s)| engine.spawn_busy(c, s.threads, LOAD_SECONDS))
        .collect();
    for mut load in loads {
        assert!(load.wait().expect("wait for exec").success());
    }
    for c in &containers {
        host.cpu.wait_refilled(&c.dir);
    }
    let after: Vec<CpuStat> = containers.iter().map(|c| host.cpu.stat(&c.dir)).collect();
    let (_, scrape) = get(port, "/metrics").expect("scrape the exporter");
    let scan = Command::new(TRACER)
        .args(["scan", "--json"])
        .output()
        .expect("run scan");
    assert!(scan.status.success(), "scan: {scan:?}");
    let table = Command::new(TRACER).arg("scan").output().expect("run scan");
    println!("{}", String::from_utf8_lossy(&table.stdout));
    let mut tracer = tracer;
    let status = tracer.interrupt();
    assert!(status.success(), "tracer: {status}");
    let text = String::from_utf8(tracer.wait_with_output().stdout).unwrap();
    println!("{text}");

    let lines: Vec<Value> = fs::read_to_string(&recording)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let summary = lines
        .iter()
        .find(|v| v["type"] == "summary")
        .expect("a summary line");
    assert_eq!(summary["open"], 0, "{summary}");
    // The containers idled when the tracer started: no stop began before it.
    assert_eq!(summary["unseen_start_kernel_ns"], 0, "{summary}");
    let scan: Vec<Value> = String::from_utf8_lossy(&scan.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();

    for ((c, before), after) in containers.iter().zip(&before).zip(&after) {
        let stops: Vec<&Value> = lines
            .iter()
            .filter(|v| v["type"] == "stop" && v["cgroup"] == c.cgroup)
            .collect();
        let kernel: u64 = stops
            .iter()
            .map(|s| s["kernel_ns"].as_u64().unwrap_or_else(|| panic!("{s}")))
            .sum();
        let truth = after.throttled_ns - before.throttled_ns;
        println!(
            "{} {}: {} stops, Σ kernel_ns {kernel} vs cpu.stat throttled_time delta {truth} \
             ({:+.4}%), nr_throttled {} -> {}",
            kind.as_str(),
            c.short_id(),
            stops.len(),
            (kernel as f64 - truth as f64) / truth as f64 * 100.0,
            before.nr_throttled,
            after.nr_throttled
        );
        assert!(truth > 0, "{} was never throttled", c.cgroup);
        assert!(
            (kernel as f64 - truth as f64).abs() <= 0.01 * truth as f64,
            "Σ kernel_ns {kernel} vs cpu.stat {truth}"
        );
        // The runtime's name on every stop line, in the summary and as the exporter's label.
        for s in &stops {
            assert_eq!(s["name"]["kind"], kind.as_str(), "{s}");
            assert_eq!(s["name"]["container_id"], c.short_id(), "{s}");
        }
        assert!(
            text.lines()
                .any(|l| l.contains(kind.as_str()) && l.contains(c.short_id())),
            "no {} {} line in the text report",
            kind.as_str(),
            c.short_id()
        );
        let labels = format!(
            "{{cgroup=\"{}\",container_id=\"{}\",container_id_full=\"{}\"}}",
            c.cgroup,
            c.short_id(),
            c.id
        );
        for (family, want) in [
            (
                "throttle_tracer_cpustat_nr_throttled_total",
                after.nr_throttled as f64,
            ),
            (
                "throttle_tracer_cpustat_nr_periods_total",
                after.nr_periods as f64,
            ),
            (
                "throttle_tracer_cpustat_throttled_seconds_total",
                after.throttled_ns as f64 / 1e9,
            ),
        ] {
            let got = sample(&scrape, &format!("{family}{labels}"));
            assert!(
                (got - want).abs() <= want * 1e-9,
                "{family}{labels} {got} vs {want}"
            );
        }
        let stops_served = sample(&scrape, &format!("throttle_tracer_stops_total{labels}"));
        assert_eq!(stops_served, stops.len() as f64, "the exporter's stops");
        // `scan` read the counters after they froze: its row is the cgroup's cpu.stat now.
        let row = scan
            .iter()
            .find(|r| r["cgroup"] == c.cgroup)
            .unwrap_or_else(|| panic!("no scan row for {}", c.cgroup));
        let s = &row["cpu_stat"];
        assert_eq!(
            (
                s["nr_periods"].as_u64(),
                s["nr_throttled"].as_u64(),
                s["throttled_ns"].as_u64()
            ),
            (
                Some(after.nr_periods),
                Some(after.nr_throttled),
                Some(after.throttled_ns)
            ),
            "{row}"
        );
    }
    shut_down_cleanly(&mut engine, &containers);
}

/// Shuts `engine` down and checks that nothing of it is left.
fn shut_down_cleanly(engine: &mut Engine, containers: &[Container]) {
    let left = engine.shut_down();
    assert!(left.is_empty(), "left behind: {left:#?}");
    for c in containers {
        assert!(!c.dir.exists(), "{} is still there", c.dir.display());
        assert!(
            !std::path::Path::new(&format!("/proc/{}", c.pid)).exists(),
            "{}'s process {} still runs",
            c.short_id(),
            c.pid
        );
    }
}
