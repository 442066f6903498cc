//! What to set, for a fleet: two `serve`s (two "nodes") trace real Docker containers of known,
//! different demand, a real Prometheus scrapes both and a kube-state-metrics stand-in (a static
//! exposition of `kube_pod_info`, `kube_pod_owner` and `kube_pod_container_info` for the pods
//! the containers are, their cgroups laid out as the kubelet's cgroupfs driver lays them out),
//! and `recommend` reads it all back. The workloads:
//!
//! - `web`, a Deployment of two replicas, one on each node: rounds of 80 ms of CPU every 200 ms
//!   (reference 000's burn, closer together: a group whose period timer idles between rounds
//!   counts too few periods for 1 % of them to mean anything) at `--cpus 0.5`, stopped every
//!   round;
//! - `api`: reference 003's requests, 20 ms of CPU each arriving at random, 10 a second on 4
//!   workers, at `--cpus 0.5`;
//! - `batch`: 10 ms of CPU every 100 ms on one thread at `--cpus 2`, twenty times its mean
//!   demand: one thread never needs more than one CPU, so at least half of the limit is freed.
//!
//! The truths: the advice each `serve` exports is `advise`'s over the same periods (the
//! `advice` lines of its own recording, made at its end by the same code) to the nanosecond;
//! the p99 of the demand histogram is within 5 % of the rounds' CPU by the workload's own clock;
//! `recommend` gives each workload the exported advice (for `web` the larger of its two
//! replicas', with both pods and both nodes), and `batch` the entitlement it would free by quota
//! arithmetic; applied with `docker update`, the same load again stops at most 1 % of its
//! periods by cpu.stat's `nr_throttled` / `nr_periods`, and the share the advice predicted is
//! within a point of it.
//!
//! Needs root, kernel BTF, a cpu hierarchy, Docker and Prometheus; otherwise it says why it
//! cannot run (a failure under `CI=true`).
use test_support as common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::thread;
use std::time::Duration;

use common::Running;
use common::containers::{Container, Engine, Kind, WORKLOAD_IN_IMAGE};
use common::http::{self, free_port, get, wait_ready};
use serde_json::Value;

const PERIOD_US: u64 = 100_000;

/// One pod of the fleet: its workload's name, its uid, the node (`serve`) tracing it, its
/// container's limit and load.
struct Pod {
    workload: &'static str,
    uid: &'static str,
    node: usize,
    cpus: &'static str,
    load: &'static [&'static str],
}

const SPIKY: &[&str] = &[
    "spiky",
    "--every-ms",
    "200",
    "--burn-ms",
    "80",
    "--rounds",
    "200",
];
/// Each load lasts 40 s, before and after the advice is applied: 400 periods, so that 1 % of
/// them is four.
const ARRIVALS: &[&str] = &[
    "arrivals",
    "--rate",
    "10",
    "--cost-ms",
    "20",
    "--threads",
    "4",
    "--seconds",
    "40",
    "--seed",
    "3",
];
const BATCH: &[&str] = &[
    "spiky",
    "--every-ms",
    "100",
    "--burn-ms",
    "10",
    "--rounds",
    "400",
];

const PODS: [Pod; 4] = [
    Pod {
        workload: "web",
        uid: "0b2c3d4e-0000-4000-8000-000000000001",
        node: 0,
        cpus: "0.5",
        load: SPIKY,
    },
    Pod {
        workload: "web",
        uid: "0b2c3d4e-0000-4000-8000-000000000002",
        node: 1,
        cpus: "0.5",
        load: SPIKY,
    },
    Pod {
        workload: "api",
        uid: "0b2c3d4e-0000-4000-8000-000000000003",
        node: 0,
        cpus: "0.5",
        load: ARRIVALS,
    },
    Pod {
        workload: "batch",
        uid: "0b2c3d4e-0000-4000-8000-000000000004",
        node: 0,
        cpus: "2",
        load: BATCH,
    },
];

/// The Deployment's ReplicaSet: its name and a pod-template hash in Kubernetes' alphabet.
fn replica_set(workload: &str) -> String {
    format!("{workload}-5d9f8")
}

/// kube-state-metrics' series for the pods, as it exposes them.
fn kube_state_metrics(pods: &[(&Pod, Container)]) -> String {
    let mut text = String::new();
    for (i, (pod, c)) in pods.iter().enumerate() {
        let name = format!("{}-{i}", replica_set(pod.workload));
        let common = format!(r#"namespace="shop",pod="{name}",uid="{}""#, pod.uid);
        text += &format!("kube_pod_info{{{common},node=\"node-{}\"}} 1\n", pod.node);
        text += &format!(
            "kube_pod_owner{{{common},owner_kind=\"ReplicaSet\",owner_name=\"{}\",\
             owner_is_controller=\"true\"}} 1\n",
            replica_set(pod.workload)
        );
        text += &format!(
            "kube_pod_container_info{{{common},container=\"{}\",container_id=\"docker://{}\"}} 1\n",
            pod.workload, c.id
        );
    }
    text
}

/// Serves `body` at every path on a loopback port, for the test's life.
fn serve_static(body: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut line = String::new();
            let mut reader = BufReader::new(&stream);
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// The value of the first sample of `family` in a scrape whose labels include each of `labels`.
fn served(scrape: &str, family: &str, labels: &[String]) -> Option<f64> {
    scrape.lines().find_map(|l| {
        let rest = l.strip_prefix(family)?.strip_prefix('{')?;
        let (set, value) = rest.rsplit_once("} ")?;
        labels
            .iter()
            .all(|want| set.split(',').any(|l| l == want))
            .then(|| value.parse().ok())?
    })
}

/// `docker exec` of `load` in `c`, printing to a pipe.
fn exec(engine: &Engine, c: &Container, load: &[&str]) -> std::process::Child {
    engine
        .command()
        .args(["exec", &c.id, WORKLOAD_IN_IMAGE])
        .args(load)
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker exec")
}

/// Runs every pod's load at once until each ends; returns each one's standard output.
fn run_loads(engine: &Engine, pods: &[(&Pod, Container)]) -> Vec<String> {
    let children: Vec<_> = pods
        .iter()
        .map(|(pod, c)| exec(engine, c, pod.load))
        .collect();
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().expect("wait for the load");
            assert!(out.status.success(), "load: {}", out.status);
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect()
}

/// The CPU of each round by the workload's own clock (`round … cpu_ns C …` lines), ns.
fn rounds_cpu(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter(|l| l.starts_with("round "))
        .filter_map(|l| {
            let mut words = l.split(' ');
            words.find(|w| *w == "cpu_ns")?;
            words.next()?.parse().ok()
        })
        .collect()
}

fn cgroup_label(c: &Container) -> String {
    format!("cgroup=\"{}\"", c.cgroup)
}

#[test]
fn recommend_sizes_a_fleet_from_the_advice_serve_exports_and_applying_it_holds() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let Some(_) = common::require(common::containers::missing(&[http::PROMETHEUS])) else {
        return;
    };
    let kubepods = Kubepods::at(host.cpu.root.join("kubepods"));
    let Some(mut engine) = common::require(Engine::start(Kind::Docker, &host.cpu)) else {
        return;
    };
    let pods: Vec<(&Pod, Container)> = PODS
        .iter()
        .map(|pod| {
            let parent = format!("/kubepods/burstable/pod{}", pod.uid);
            let c =
                engine.idle_container(&host.cpu, &["--cpus", pod.cpus, "--cgroup-parent", &parent]);
            host.cpu
                .favour(&host.cpu.root.join(parent.trim_start_matches('/')));
            (pod, c)
        })
        .collect();
    // The tracer runs as nobody: its recordings go where nobody may write.
    let dir = common::tracer::output_dir();
    let ports = [free_port(), free_port()];
    let mut serves: Vec<Running> = (0..2)
        .map(|node| {
            let mut cmd = common::tracer::command();
            cmd.args(["serve", "--backend", "tracepoint", "--listen"])
                .arg(format!("127.0.0.1:{}", ports[node]))
                .args(["--advice-every", "1s", "--record"])
                .arg(dir.path().join(format!("node-{node}.ndjson")))
                .stdout(Stdio::null());
            for (_, c) in pods.iter().filter(|(p, _)| p.node == node) {
                cmd.args(["--cgroup", &c.cgroup]);
            }
            Running::spawn(&mut cmd)
        })
        .collect();
    for port in ports {
        wait_ready(port, "/healthz", "throttle-tracer serve");
    }
    let ksm = serve_static(kube_state_metrics(&pods));
    let (prometheus, prometheus_port) = http::start_prometheus_scraping(
        dir.path(),
        "prometheus",
        &[
            ("node-a", &[ports[0]]),
            ("node-b", &[ports[1]]),
            ("kube-state-metrics", &[ksm]),
        ],
        &[],
        "",
    );

    let outputs = run_loads(&engine, &pods);
    // The last periods end within a period of the loads; the advice is made every second and
    // Prometheus scrapes every second.
    thread::sleep(Duration::from_secs(4));
    let scrapes: Vec<String> = ports
        .iter()
        .map(|&port| {
            let (status, body) = get(port, "/metrics").expect("scrape");
            assert_eq!(status, 200);
            body
        })
        .collect();
    let exported = |pod: &Pod, c: &Container, fit: &str| {
        served(
            &scrapes[pod.node],
            "throttle_tracer_advised_quota_seconds",
            &[cgroup_label(c), format!("fit=\"{fit}\"")],
        )
        .unwrap_or_else(|| panic!("no advised quota ({fit}) for {}", c.cgroup))
    };

    // The demand histogram's p99 against the rounds' CPU by their own clock: half of the
    // periods held a round (80 ms) and the rest nothing, so the p99 is a round's CPU.
    let (_, web_c) = &pods[0];
    let mut cpu = rounds_cpu(&outputs[0]);
    cpu.sort_unstable();
    let truth = cpu[cpu.len() * 99 / 100] as f64 / 1e9;
    let promql = format!(
        "histogram_quantile(0.99, throttle_tracer_period_demand_seconds_bucket{{{}}})",
        cgroup_label(web_c)
    );
    let p99 = http::query(prometheus_port, &promql);
    println!("web p99 period demand: histogram {p99:.4} s, rounds' own clock {truth:.4} s");
    assert!(
        (p99 - truth).abs() <= 0.05 * truth,
        "the histogram's p99 {p99} is more than 5 % from {truth}"
    );

    // recommend against the Prometheus.
    let out = common::tracer::command()
        .args(["recommend", "--prometheus"])
        .arg(format!("http://127.0.0.1:{prometheus_port}"))
        .args(["--window", "5m", "--min-data", "10s", "--json"])
        .output()
        .expect("recommend");
    let table = common::tracer::command()
        .args(["recommend", "--prometheus"])
        .arg(format!("http://127.0.0.1:{prometheus_port}"))
        .args(["--window", "5m", "--min-data", "10s"])
        .output()
        .expect("recommend");
    println!("{}", String::from_utf8_lossy(&table.stdout));
    assert!(
        out.status.success(),
        "recommend: {}",
        common::containers::text(&out)
    );
    let rows: BTreeMap<String, Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            let name = v["kubernetes"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (name, v)
        })
        .collect();
    assert_eq!(
        rows.keys().map(String::as_str).collect::<Vec<_>>(),
        ["api", "batch", "web"],
        "one row per Deployment: {rows:#?}"
    );
    let period_s = PERIOD_US as f64 / 1e6;
    for workload in ["web", "api", "batch"] {
        let row = &rows[workload];
        let members: Vec<&(&Pod, Container)> = pods
            .iter()
            .filter(|(p, _)| p.workload == workload)
            .collect();
        // The largest advice each pod's serve exported over the window, as Prometheus stored it.
        let largest = members
            .iter()
            .map(|(_, c)| {
                http::query(
                    prometheus_port,
                    &format!(
                        "max_over_time(throttle_tracer_advised_quota_seconds{{{},fit=\"target\"}}[5m])",
                        cgroup_label(c)
                    ),
                )
            })
            .fold(0.0, f64::max);
        let advised = row["advised_cpus"].as_f64().expect("advised CPUs");
        println!("{workload}: exported {largest} s per period, recommend {advised} CPUs");
        assert!(
            (advised - largest / period_s).abs() < 1e-9,
            "{workload}: recommend {advised} CPUs, the exported advice {largest} s per {period_s} s"
        );
        assert_eq!(row["pods"], members.len(), "{workload}: {row}");
        assert_eq!(row["nodes"], members.len(), "{workload}: {row}");
    }
    // batch: 10 ms per 100 ms on one thread at 2 CPUs frees what its advice does not need, at
    // least the second CPU.
    let advised = rows["batch"]["advised_millicores"]
        .as_i64()
        .expect("advised");
    let freed = 2000 - advised;
    assert_eq!(
        rows["batch"]["change_millicores"].as_i64(),
        Some(-freed),
        "batch: {}",
        rows["batch"]
    );
    assert!(freed >= 1000, "batch would free {freed}m of its 2000m");

    // The exported advice is advise's over the same periods: the recordings' advice lines.
    // What recommend advises each pod, and the share it predicts: applied below.
    let advised_us: Vec<u64> = pods
        .iter()
        .map(|(p, _)| {
            let millicores = rows[p.workload]["advised_millicores"]
                .as_u64()
                .expect("advised");
            millicores * PERIOD_US / 1000
        })
        .collect();
    let predicted_after: Vec<f64> = pods
        .iter()
        .map(|(p, _)| {
            rows[p.workload]["stopped_ratio_after"]
                .as_f64()
                .expect("predicted")
        })
        .collect();
    for serve in &mut serves {
        assert!(serve.interrupt().success());
    }
    drop(prometheus);
    for (node, _) in ports.iter().enumerate() {
        let recording =
            fs::read_to_string(dir.path().join(format!("node-{node}.ndjson"))).expect("recording");
        for (pod, c) in pods.iter().filter(|(p, _)| p.node == node) {
            let line: Value = recording
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["type"] == "advice" && v["cgroup"] == c.cgroup.as_str())
                .unwrap_or_else(|| panic!("no advice line for {}", c.cgroup));
            for (fit, key) in [("target", "recommended"), ("all", "no_stop")] {
                let ns = line[key]["quota_ns"].as_u64().expect("a quota");
                assert_eq!(
                    (exported(pod, c, fit) * 1e9).round() as u64,
                    ns,
                    "{} ({fit}): exported against advise's {line}",
                    c.cgroup
                );
            }
        }
    }

    // Applied, the same loads again.
    // `--cpus` (Docker's NanoCPUs) set the limit, so `--cpus` changes it.
    for ((_, c), us) in pods.iter().zip(&advised_us) {
        let cpus = format!("{:.3}", *us as f64 / PERIOD_US as f64);
        engine.run_ok(&["update", "--cpus", &cpus, &c.id]);
        assert_eq!(
            fs::read_to_string(c.dir.join("cpu.cfs_quota_us"))
                .or_else(|_| fs::read_to_string(c.dir.join("cpu.max")))
                .expect("the quota")
                .split_whitespace()
                .next(),
            Some(us.to_string().as_str()),
            "{} after docker update --cpus {cpus}",
            c.cgroup
        );
    }
    let before: Vec<_> = pods.iter().map(|(_, c)| host.cpu.stat(&c.dir)).collect();
    run_loads(&engine, &pods);
    let mut wrong = Vec::new();
    for (((pod, c), before), predicted) in pods.iter().zip(&before).zip(&predicted_after) {
        let after = host.cpu.stat(&c.dir);
        let periods = after.nr_periods - before.nr_periods;
        // `spiky` finds the period boundary by burning until it is stopped, once, before its
        // rounds: that stop is the workload's own, whatever the quota.
        let synced = u64::from(pod.load[0] == "spiky");
        let throttled = (after.nr_throttled - before.nr_throttled).saturating_sub(synced);
        let share = throttled as f64 / periods as f64;
        println!(
            "{} ({}): {throttled} of {periods} periods stopped with the advice ({:.2} %; \
             {synced} more by the sync), predicted {:.2} %",
            pod.workload,
            c.short_id(),
            share * 100.0,
            predicted * 100.0
        );
        if share > 0.01 || (share - predicted).abs() > 0.01 {
            wrong.push(format!(
                "{} ({}): cpu.stat {share}, predicted {predicted}",
                pod.workload,
                c.short_id()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "stopped in more than 1 % of the periods, or more than a point from the prediction: \
         {wrong:#?}"
    );
    let left = engine.shut_down();
    assert!(left.is_empty(), "left behind: {left:?}");
    let (tree, ours) = (kubepods.dir.clone(), kubepods.ours);
    drop(kubepods);
    assert!(!ours || !tree.exists(), "left behind: {}", tree.display());
}

/// The pods' cgroups (and the kubepods tree, if the test made it): removed when dropped, after
/// the engine (declared after it, so dropped before it) removed the containers, also when the
/// test failed.
struct Kubepods {
    dir: std::path::PathBuf,
    ours: bool,
}

impl Kubepods {
    fn at(dir: std::path::PathBuf) -> Self {
        let ours = !dir.exists();
        Self { dir, ours }
    }
}

impl Drop for Kubepods {
    fn drop(&mut self) {
        let trees: Vec<String> = if self.ours {
            vec!["kubepods".to_owned()]
        } else {
            PODS.iter()
                .map(|p| format!("kubepods/burstable/pod{}", p.uid))
                .collect()
        };
        for left in common::containers::remove_cgroups(&trees) {
            eprintln!("left behind: {left}");
        }
    }
}
