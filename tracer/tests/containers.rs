//! Real containers under the tracer: a private dockerd and a private podman (Debian's, see
//! [`common::containers`]), containers with `--cpus` and `--cpu-period`/`--cpu-quota`, two at
//! once, each selected by `--container <short id>`. The truth is each container's own cpu.stat,
//! read here from the cgroup its first process is in (/proc/PID/cgroup), not from the runtime
//! or the tracer: Σ kernel_ns of its stops is its throttled time's growth, the exporter's
//! mirrored counters are its counters, and `scan`'s row holds them. The runtime's name (the
//! short id) is in the text summary, the NDJSON (stop and summary lines), `scan` (JSON and
//! table) and the exporter's labels. At the end the engine is shut down and nothing of it is
//! left: no container, no daemon, no state directory, no mount, no cgroup; nor when the test
//! fails while its engine runs (its guard shuts it down as the panic unwinds).
//!
//! Needs root, kernel BTF, a cpu hierarchy and the runtimes; otherwise it says why it cannot
//! run (a failure under `CI=true`).
use test_support as common;

use std::{fs, process::Stdio};

use common::containers::{self, Container, Engine, Kind};
use common::http::{free_port, get, sample, wait_ready};
use common::{CpuStat, Running};
use serde_json::Value;

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
    let dir = common::tracer::output_dir();
    let recording = dir.path().join("run.ndjson");
    let selection: Vec<String> = containers
        .iter()
        .flat_map(|c| ["--container".to_owned(), c.short_id().to_owned()])
        .collect();
    // The text report on stdout, the NDJSON in the recording, the exporter beside them.
    let tracer = Running::spawn(
        common::tracer::command()
            .args(["--backend", &common::backend(), "--record"])
            .arg(&recording)
            .args(&selection)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    );
    let port = free_port();
    let _serve = Running::spawn(
        common::tracer::command()
            .args(["serve", "--backend", &common::backend(), "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(&selection)
            .stdout(Stdio::null()),
    );
    common::tracer::wait_recorded_start(&recording);
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
    let scan = common::tracer::command()
        .args(["scan", "--json"])
        .output()
        .expect("run scan");
    assert!(scan.status.success(), "scan: {scan:?}");
    let table = common::tracer::command()
        .arg("scan")
        .output()
        .expect("run scan");
    assert!(table.status.success(), "scan: {table:?}");
    let table = String::from_utf8(table.stdout).unwrap();
    println!("{table}");
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
        let summary = lines
            .iter()
            .find(|v| v["type"] == "summary" && v["cgroup"] == c.cgroup)
            .unwrap_or_else(|| panic!("no summary line for {}", c.cgroup));
        assert_eq!(summary["open"], 0, "{summary}");
        // The containers idled when the tracer started: no stop began before it.
        assert_eq!(summary["unseen_start_kernel_ns"], 0, "{summary}");
        // Exact, as in the other host tests that bracket a trace with cpu.stat: `before` was
        // read once the tracer had attached and while the container idled, `after` once every
        // stop had ended at a refill, so both readings hold the same stops as the trace. (The
        // 1 % this test allowed at first was host_tracepoint's bound for the kprobe backend
        // in the VM guests, which never run this test.) v1's throttled_time is in ns; v2's
        // throttled_usec makes the delta good to 1 µs.
        let resolution = host.cpu.throttled_resolution_ns();
        assert!(
            kernel.abs_diff(truth) <= resolution,
            "Σ kernel_ns {kernel} vs cpu.stat {truth}"
        );
        // The runtime's name (`docker 0123456789ab`) on every stop line, in the summary line,
        // in the text report's table and detail, in scan's JSON and table, and as the
        // exporter's label.
        let label = format!("{} {}", kind.as_str(), c.short_id());
        for s in stops.iter().chain([&summary]) {
            assert_eq!(s["name"]["kind"], kind.as_str(), "{s}");
            assert_eq!(s["name"]["container_id"], c.short_id(), "{s}");
        }
        let row_line = text
            .lines()
            .find(|l| l.starts_with(&format!("{} ", c.cgroup)) && !l.contains(" (id "));
        assert!(
            row_line.is_some_and(|l| l.ends_with(&format!("  {label}"))),
            "no table row of {} named {label} in the text report:\n{text}",
            c.cgroup
        );
        let detail = text
            .lines()
            .find(|l| l.starts_with(&format!("{} (id ", c.cgroup)));
        assert!(
            detail.is_some_and(|l| l.ends_with(&format!("  {label}"))),
            "no detail of {} named {label} in the text report:\n{text}",
            c.cgroup
        );
        let scan_line = table
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == c.cgroup));
        assert!(
            scan_line.is_some_and(|l| l.ends_with(&format!("{} ({label})", c.cgroup))),
            "no scan row of {} named {label}:\n{table}",
            c.cgroup
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
        assert_eq!(row["name"]["kind"], kind.as_str(), "{row}");
        assert_eq!(row["name"]["container_id"], c.short_id(), "{row}");
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

/// A test that fails while its engine runs (a panic with the [`Engine`] guard in scope, as a
/// failed assertion is) leaves nothing behind once the panic has unwound: the container's
/// process and cgroup, dockerd, what it mounted below its state directory, the directory and
/// the `/docker` parent cgroup it made are all gone, and no process runs from the directory.
#[test]
fn a_test_failing_while_its_engine_runs_leaves_nothing_behind() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let parent = host.cpu.root.join("docker");
    let parent_before = parent.exists();
    let Some(engine) = common::require(Engine::start(Kind::Docker, &host.cpu)) else {
        return;
    };
    let container = engine.idle_container(&host.cpu, &["--cpus", "0.5"]);
    let dir = engine.state_dir().expect("a running engine").to_owned();
    let daemon = engine.daemon_pid().expect("dockerd");
    let mounted = containers::mounts_below(&dir);
    println!(
        "dockerd {daemon}, container {} (pid {}, {}), {} mount(s) below {}",
        container.short_id(),
        container.pid,
        container.cgroup,
        mounted.len(),
        dir.display()
    );
    assert!(container.dir.exists(), "{}", container.dir.display());

    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _engine = engine;
        panic!("deliberate: this test fails while its engine runs (caught below)");
    }));
    assert!(failed.is_err(), "the scope did not fail");

    let running = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    assert!(!running(daemon), "dockerd {daemon} still runs");
    assert!(
        !running(container.pid),
        "the container's process {} still runs",
        container.pid
    );
    assert!(
        !container.dir.exists(),
        "its cgroup {} is still there",
        container.dir.display()
    );
    let needle = dir.display().to_string();
    assert_eq!(
        containers::processes_mentioning(&needle),
        Vec::<u32>::new(),
        "processes still run from {needle}"
    );
    assert_eq!(
        containers::mounts_below(&dir),
        Vec::<String>::new(),
        "still mounted"
    );
    assert!(!dir.exists(), "{needle} is still there");
    if !parent_before {
        assert!(!parent.exists(), "{} is still there", parent.display());
    }
}
