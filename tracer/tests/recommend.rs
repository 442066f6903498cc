//! `throttle-tracer recommend` against a real Prometheus (Debian's) that scrapes, on loopback,
//! two synthetic `serve` expositions (two nodes) and a synthetic kube-state-metrics, each with
//! the series and labels docs/prometheus.md documents: a Deployment with a replica on each node,
//! a StatefulSet whose limit is 4× its demand, a systemd unit on both nodes, two Docker
//! containers (one with advice and a burst, one without advice) and a Deployment with too
//! little data. The truth is the quota arithmetic of the values the test serves: the advised
//! limit is the largest `advised_quota_seconds{fit="target"}` / period any replica served at
//! any scrape, the entitlement freed is (quota - advised) / period. Prometheus that cannot be
//! reached, answers an error page or an API error, or holds no `serve` series: one `error:`
//! line, one `hint:` line, exit 1.
//!
//! Needs /usr/bin/prometheus, and root to run `recommend` as nobody without any capability
//! (what it needs: none); otherwise it says why it cannot run (a failure under `CI=true`).
use test_support as common;

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    path::Path,
    process::Output,
    thread,
    time::Duration,
};

use common::http::{PROMETHEUS, free_port, get, percent_encode, start_prometheus_scraping};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_throttle-tracer");
/// Every synthetic group's period but the tiny one's.
const PERIOD: f64 = 0.1;
/// The classic buckets of the synthetic demand histograms (serve's are finer; the quantile
/// arithmetic is Prometheus' either way).
const BUCKETS: [f64; 6] = [0.01, 0.05, 0.1, 0.2, 0.25, 0.4];
/// Scrapes of every target Prometheus holds before `recommend` runs: the web replica's advice
/// spike (scrapes 3 and 4) is then in the past.
const SCRAPES: u64 = 6;
/// The data the workloads need in the test (`--min-data`): every group but the tiny one
/// serves 10 periods of 0.1 s a scrape, 1 s; the tiny one one period of 0.01 s.
const MIN_DATA: f64 = 2.0;

/// What the machine needs: Prometheus, and root to drop to nobody.
fn machine() -> Result<(), String> {
    if !Path::new(PROMETHEUS).exists() {
        return Err(format!(
            "no {PROMETHEUS} (`cargo xtask setup host-tests` installs Debian's prometheus)"
        ));
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root (recommend runs as nobody)".into());
    }
    Ok(())
}

/// `throttle-tracer recommend ARGS`, as nobody with no capability, to its end.
fn recommend(args: &[&str]) -> Output {
    common::as_nobody(BIN, &[])
        .arg("recommend")
        .args(args)
        .output()
        .expect("run throttle-tracer recommend")
}

/// One synthetic quota'd cgroup of a node's exposition.
struct Group {
    /// The labels of its series, `cgroup` first.
    labels: String,
    period: f64,
    quota: f64,
    /// Periods measured and throttled per scrape.
    periods: u64,
    throttled: u64,
    /// Every period's demand lies in the bucket ending here.
    demand_le: f64,
    /// `advised_quota_seconds{fit="target"}` at scrape n (1, 2, …); `None`: no advice.
    advised: fn(u64) -> Option<f64>,
    burst: Option<f64>,
    /// `advice_stopped_ratio{setting="advised"}`.
    after: f64,
}

/// `cgroup`, and the container's ids and pod uid when given, as serve labels them.
fn labels(cgroup: &str, container: Option<&str>, pod: Option<&str>) -> String {
    let mut l = format!("cgroup=\"{cgroup}\"");
    if let Some(full) = container {
        let _ = write!(
            l,
            ",container_id=\"{}\",container_id_full=\"{full}\"",
            &full[..12]
        );
    }
    if let Some(uid) = pod {
        let _ = write!(l, ",pod_uid=\"{uid}\",qos=\"burstable\"");
    }
    l
}

/// A series' value of a group, if it has the series.
type Figure<'a> = &'a dyn Fn(&Group) -> Option<f64>;

/// A node's exposition at its scrape `n`, family by family.
fn exposition(groups: &[Group], n: u64) -> String {
    let mut out = String::from("# TYPE throttle_tracer_period_demand_seconds histogram\n");
    for g in groups {
        let count = g.periods * n;
        let name = "throttle_tracer_period_demand_seconds";
        for le in BUCKETS {
            let c = if le >= g.demand_le { count } else { 0 };
            let _ = writeln!(out, "{name}_bucket{{{},le=\"{le}\"}} {c}", g.labels);
        }
        let _ = writeln!(out, "{name}_bucket{{{},le=\"+Inf\"}} {count}", g.labels);
        let sum = count as f64 * g.demand_le * 0.9;
        let _ = writeln!(
            out,
            "{name}_sum{{{}}} {sum}\n{name}_count{{{}}} {count}",
            g.labels, g.labels
        );
    }
    // (family, type, labels after the group's, value at scrape n)
    let families: [(&str, &str, &str, Figure<'_>); 10] = [
        ("throttle_tracer_periods_total", "counter", "", &|g| {
            Some((g.periods * n) as f64)
        }),
        (
            "throttle_tracer_throttled_periods_total",
            "counter",
            "",
            &|g| Some((g.throttled * n) as f64),
        ),
        ("throttle_tracer_quota_seconds", "gauge", "", &|g| {
            Some(g.quota)
        }),
        ("throttle_tracer_period_seconds", "gauge", "", &|g| {
            Some(g.period)
        }),
        (
            "throttle_tracer_advised_quota_seconds",
            "gauge",
            ",fit=\"target\"",
            &|g| (g.advised)(n),
        ),
        ("throttle_tracer_advised_burst_seconds", "gauge", "", &|g| {
            g.burst
        }),
        ("throttle_tracer_advice_target_ratio", "gauge", "", &|g| {
            (g.advised)(n).map(|_| 0.01)
        }),
        (
            "throttle_tracer_advice_missing",
            "gauge",
            ",reason=\"no_runs\"",
            &|g| (g.advised)(n).is_none().then_some(1.0),
        ),
        (
            "throttle_tracer_advice_stopped_ratio",
            "gauge",
            ",setting=\"advised\"",
            &|g| (g.advised)(n).map(|_| g.after),
        ),
        ("throttle_tracer_advice_window_seconds", "gauge", "", &|g| {
            Some(g.period * g.periods as f64 * n as f64)
        }),
    ];
    for (name, kind, more, value) in families {
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for g in groups {
            if let Some(v) = value(g) {
                let _ = writeln!(out, "{name}{{{}{more}}} {v}", g.labels);
            }
        }
    }
    out
}

/// Serves `body(n)` at the nth GET /metrics on a loopback port, 404 elsewhere; returns the
/// port. The thread lives as long as the test process.
fn serve(body: impl Fn(u64) -> String + Send + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an exposition");
    let port = listener.local_addr().unwrap().port();
    let mut served = 0;
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut request = String::new();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                request.push_str(&line);
                line.clear();
            }
            let (status, text) = if request.starts_with("GET /metrics ") {
                served += 1;
                ("200 OK", body(served))
            } else {
                ("404 Not Found", "404 page not found\n".to_owned())
            };
            let _ = write!(
                &stream,
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    port
}

/// A 64-hex container id made of one digit.
fn id(digit: char) -> String {
    digit.to_string().repeat(64)
}

const WEB_A: &str = "5f0c6e52-0000-4000-8000-00000000000a";
const WEB_B: &str = "5f0c6e52-0000-4000-8000-00000000000b";
const DB: &str = "5f0c6e52-0000-4000-8000-00000000000d";
const TINY: &str = "5f0c6e52-0000-4000-8000-00000000000e";

/// kube-state-metrics' series for the four pods (uid, pod, owner kind, owner, container, id).
fn kube_state_metrics() -> String {
    let pods = [
        (
            WEB_A,
            "web-7c9d8f6b5d-x2x4z",
            "ReplicaSet",
            "web-7c9d8f6b5d",
            "app",
            id('a'),
        ),
        (
            WEB_B,
            "web-7c9d8f6b5d-q8w7r",
            "ReplicaSet",
            "web-7c9d8f6b5d",
            "app",
            id('b'),
        ),
        (DB, "db-0", "StatefulSet", "db", "postgres", id('d')),
        (
            TINY,
            "tiny-6b7f9c8d4-k2j5h",
            "ReplicaSet",
            "tiny-6b7f9c8d4",
            "worker",
            id('e'),
        ),
    ];
    let mut out = String::from("# TYPE kube_pod_info gauge\n");
    for (uid, pod, _, _, _, _) in &pods {
        let _ = writeln!(
            out,
            "kube_pod_info{{namespace=\"shop\",pod=\"{pod}\",uid=\"{uid}\",node=\"node-{}\"}} 1",
            &uid[uid.len() - 1..]
        );
    }
    out.push_str("# TYPE kube_pod_owner gauge\n");
    for (uid, pod, kind, owner, _, _) in &pods {
        let _ = writeln!(
            out,
            "kube_pod_owner{{namespace=\"shop\",pod=\"{pod}\",uid=\"{uid}\",owner_kind=\"{kind}\",\
             owner_name=\"{owner}\",owner_is_controller=\"true\"}} 1"
        );
    }
    out.push_str("# TYPE kube_pod_container_info gauge\n");
    for (uid, pod, _, _, container, full) in &pods {
        let _ = writeln!(
            out,
            "kube_pod_container_info{{namespace=\"shop\",pod=\"{pod}\",uid=\"{uid}\",\
             container=\"{container}\",container_id=\"containerd://{full}\"}} 1"
        );
    }
    out
}

fn k8s(uid: &str, full: &str) -> String {
    labels(
        &format!("/kubepods/burstable/pod{uid}/{full}"),
        Some(full),
        Some(uid),
    )
}

/// A group with the usual period and 10 periods a scrape, `throttled` of them stopped.
fn group(labels: String, quota: f64, throttled: u64, demand_le: f64) -> Group {
    Group {
        labels,
        period: PERIOD,
        quota,
        periods: 10,
        throttled,
        demand_le,
        advised: |_| None,
        burst: None,
        after: 0.0,
    }
}

/// The systemd unit on either node: 0.3 s a period, demand in (0.2 s, 0.25 s].
fn batch(advised: fn(u64) -> Option<f64>) -> Group {
    Group {
        advised,
        ..group(
            labels("/system.slice/batch.service", None, None),
            0.3,
            0,
            0.25,
        )
    }
}

/// Node a: web's first replica (advice 0.15 s of 0.2 s), its pod's own cgroup (which must be
/// no row), db (0.4 s for a demand ≤ 0.1 s, advice 0.1 s), the unit (advice 0.2 s) and the
/// tiny deployment (one 10 ms period a scrape).
fn node_a() -> Vec<Group> {
    vec![
        Group {
            advised: |_| Some(0.15),
            after: 0.008,
            ..group(k8s(WEB_A, &id('a')), 0.2, 1, 0.2)
        },
        Group {
            advised: |_| Some(0.5),
            ..group(
                labels(
                    &format!("/kubepods/burstable/pod{WEB_A}"),
                    None,
                    Some(WEB_A),
                ),
                0.4,
                0,
                0.2,
            )
        },
        Group {
            advised: |_| Some(0.1),
            after: 0.005,
            ..group(k8s(DB, &id('d')), 0.4, 0, 0.1)
        },
        batch(|_| Some(0.2)),
        Group {
            period: 0.01,
            periods: 1,
            advised: |_| Some(0.006),
            ..group(k8s(TINY, &id('e')), 0.005, 0, 0.01)
        },
    ]
}

/// Node b: web's second replica (advice 0.2 s, 0.25 s at scrapes 3 and 4), the unit (advice
/// 0.25 s), a Docker container advised 0.08 s of 0.05 s with a 20 ms burst, and one without
/// advice.
fn node_b() -> Vec<Group> {
    vec![
        Group {
            advised: |n| Some(if (3..=4).contains(&n) { 0.25 } else { 0.2 }),
            after: 0.009,
            ..group(k8s(WEB_B, &id('b')), 0.2, 1, 0.25)
        },
        batch(|_| Some(0.25)),
        Group {
            advised: |_| Some(0.08),
            burst: Some(0.02),
            ..group(
                labels(&format!("/docker/{}", id('c')), Some(&id('c')), None),
                0.05,
                3,
                0.1,
            )
        },
        group(
            labels(&format!("/docker/{}", id('f')), Some(&id('f')), None),
            0.1,
            0,
            0.05,
        ),
    ]
}

/// The value of an instant query returning one series, or `None` (no series yet, or no
/// answer).
fn try_query(port: u16, promql: &str) -> Option<f64> {
    let (status, body) = get(
        port,
        &format!("/api/v1/query?query={}", percent_encode(promql)),
    )
    .ok()?;
    let v: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// The most `increase(throttle_tracer_periods_total{selector}[10m])` can be over the series
/// selected: each one's growth over its k samples times (k - 1 + 2.2) / (k - 1), summed.
fn most_periods(port: u16, selector: &str) -> f64 {
    let s = format!("throttle_tracer_periods_total{{{selector}}}[10m]");
    let promql = format!(
        "sum((max_over_time({s}) - min_over_time({s})) / (count_over_time({s}) - 1) \
         * (count_over_time({s}) + 1.2))"
    );
    try_query(port, &promql).unwrap_or_else(|| panic!("no answer to {promql}"))
}

fn stdout(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "recommend: {}: {stderr}", out.status);
    String::from_utf8(out.stdout.clone()).expect("UTF-8")
}

#[test]
fn recommend_gives_each_workload_the_largest_advice_of_its_replicas() {
    let Some(()) = common::require(machine()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let a = serve(|n| exposition(&node_a(), n));
    let b = serve(|n| exposition(&node_b(), n));
    let ksm = serve(|_| kube_state_metrics());
    let jobs: [(&str, &[u16]); 2] = [("throttle-tracer", &[a, b]), ("kube-state-metrics", &[ksm])];
    let (_prometheus, port) = start_prometheus_scraping(dir.path(), "prometheus", &jobs, &[], "");
    // Every series has SCRAPES samples (a poll, not a timing check).
    common::wait_until(
        Duration::from_secs(60),
        &format!("{SCRAPES} scrapes of every target stored"),
        || {
            try_query(
                port,
                "min(count_over_time(throttle_tracer_periods_total[10m]))",
            )
            .is_some_and(|n| n >= SCRAPES as f64)
                && try_query(port, "count(kube_pod_info)") == Some(4.0)
        },
    );
    let url = format!("http://127.0.0.1:{port}");
    let min_data = format!("{MIN_DATA}s");
    let base = [
        "--prometheus",
        &url,
        "--window",
        "10m",
        "--min-data",
        &min_data,
    ];
    let table = stdout(&recommend(&[&base[..], &["--output", "table"]].concat()));
    println!("{table}");
    let json = stdout(&recommend(&[&base[..], &["--json"]].concat()));
    let patch = stdout(&recommend(&[&base[..], &["--output", "patch"]].concat()));
    println!("{patch}");

    let rows: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    let c = &id('c')[..12];
    let f = &id('f')[..12];
    // The pod's own cgroup of web's first replica is no row of its own, nor part of web's.
    assert_eq!(
        names,
        [
            "/system.slice/batch.service".to_owned(),
            format!("container:{c}"),
            format!("container:{f}"),
            "shop/Deployment/tiny:worker".to_owned(),
            "shop/Deployment/web:app".to_owned(),
            "shop/StatefulSet/db:postgres".to_owned(),
        ],
        "{json}"
    );
    let row = |name: &str| rows.iter().find(|r| r["workload"] == name).unwrap();
    let millicores = |quota: f64| (quota / PERIOD * 1000.0).round();
    let f64_of = |r: &Value, key: &str| r[key].as_f64().unwrap_or_else(|| panic!("{key}: {r}"));

    // Web: both replicas, on both nodes; the larger advice of the two, the spike of the
    // second's past scrapes included; its limit and what the change asks.
    let web = row("shop/Deployment/web:app");
    assert_eq!(
        (web["pods"].as_u64(), web["nodes"].as_u64()),
        (Some(2), Some(2)),
        "{web}"
    );
    assert_eq!(
        web["kubernetes"],
        serde_json::json!({"namespace": "shop", "kind": "Deployment", "name": "web", "container": "app"})
    );
    assert_eq!(f64_of(web, "advised_millicores"), millicores(0.25), "{web}");
    assert_eq!(f64_of(web, "limit_millicores"), millicores(0.2), "{web}");
    assert_eq!(
        f64_of(web, "change_millicores"),
        millicores(0.25) - millicores(0.2)
    );
    // One of each replica's ten periods a scrape stopped; the larger predicted share.
    assert!(
        (f64_of(web, "stopped_ratio_now") - 0.1).abs() < 1e-9,
        "{web}"
    );
    assert_eq!(f64_of(web, "stopped_ratio_after"), 0.009);
    // Half the pooled periods are in (0.1, 0.2], half in (0.2, 0.25]: the p99 is in the upper.
    let p99 = f64_of(web, "p99_demand_seconds");
    assert!(p99 > 0.2 && p99 <= 0.25, "{web}");
    assert_eq!(web["burst_settable"], false);
    // Both replicas' periods: `increase()` over k ≥ SCRAPES samples of a counter that grows
    // 10 a scrape is at least (k - 1) × 10; at most their growth extrapolated by up to 1.1
    // average intervals at each end (Prometheus' threshold; under load its scrapes come
    // unevenly, and 0.5 + 1.1 was exceeded: 6.80 of a bound of 6.6), from Prometheus' own
    // samples: a scrape it dropped (served, but timed out under load) leaves a step of two
    // scrapes in the counter.
    let data = f64_of(web, "data_seconds");
    let most = most_periods(
        port,
        &format!("pod_uid=~\"{WEB_A}|{WEB_B}\",container_id!=\"\""),
    );
    assert!(
        data >= 2.0 * (SCRAPES - 1) as f64 * 10.0 * PERIOD && data <= most * PERIOD + 1e-9,
        "{data} s of data, at most {most} periods"
    );

    // db: a limit 4× its demand (every period ≤ 0.1 s of 0.4 s): the advice frees the rest.
    let db = row("shop/StatefulSet/db:postgres");
    assert!(f64_of(db, "p99_demand_seconds") <= 0.1, "{db}");
    assert_eq!(f64_of(db, "limit_millicores"), millicores(0.4));
    assert_eq!(f64_of(db, "advised_millicores"), millicores(0.1));
    assert_eq!(
        f64_of(db, "change_millicores"),
        -(millicores(0.4) - millicores(0.1))
    );
    assert_eq!(f64_of(db, "stopped_ratio_now"), 0.0);

    // The unit: one row for both nodes' cgroups of one path, the larger advice, a burst can
    // be set (none advised).
    let unit = row("/system.slice/batch.service");
    assert_eq!(
        (unit["pods"].as_u64(), unit["nodes"].as_u64()),
        (Some(2), Some(2)),
        "{unit}"
    );
    assert_eq!(f64_of(unit, "advised_millicores"), millicores(0.25));
    assert_eq!(
        f64_of(unit, "change_millicores"),
        millicores(0.25) - millicores(0.3)
    );
    assert_eq!(
        (
            unit["burst_settable"].as_bool(),
            &unit["advised_burst_seconds"]
        ),
        (Some(true), &Value::Null)
    );

    let docker = row(&format!("container:{c}"));
    assert_eq!(f64_of(docker, "advised_millicores"), millicores(0.08));
    assert_eq!(f64_of(docker, "advised_burst_seconds"), 0.02);
    assert_eq!(docker["container_id"], c);

    // Refused, with no number: too little data (how much it has, how much it needs), and no
    // advice (what serve said instead).
    let tiny = row("shop/Deployment/tiny:worker");
    let refused = &tiny["refused"];
    assert_eq!(refused["reason"], "too_little_data", "{tiny}");
    assert_eq!(f64_of(refused, "needs_seconds"), MIN_DATA);
    let most = most_periods(port, &format!("pod_uid=\"{TINY}\""));
    let has = f64_of(refused, "has_seconds");
    assert!(
        has > 0.0 && has <= most * 0.01 + 1e-9,
        "at most {most} periods: {tiny}"
    );
    assert_eq!(
        (&tiny["advised_millicores"], &tiny["change_millicores"]),
        (&Value::Null, &Value::Null)
    );
    let silent = row(&format!("container:{f}"));
    assert_eq!(
        silent["refused"],
        serde_json::json!({"reason": "no_advice", "serve_said": ["no_runs"]})
    );
    assert_eq!(silent["advised_millicores"], Value::Null);
    for (name, words) in [
        (
            "shop/Deployment/tiny:worker",
            "of measured periods in the window, needs 2s (--min-data)",
        ),
        (
            &format!("container:{f}"),
            "serve exported no advice for it in the window",
        ),
    ] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(&format!("not advised: {name}: ")) && l.contains(words)),
            "{name}: {words} in\n{table}"
        );
    }
    let header = table.lines().nth(1).unwrap();
    assert!(
        header.starts_with("WORKLOAD") && header.ends_with("CHANGE"),
        "{table}"
    );
    let web_line = table
        .lines()
        .find(|l| l.starts_with("shop/Deployment/web:app"))
        .unwrap();
    assert!(
        web_line.contains(" 2000m ") && web_line.contains(" 2500m ") && web_line.contains(" n/a "),
        "{web_line}"
    );
    let db_line = table
        .lines()
        .find(|l| l.starts_with("shop/StatefulSet/db:postgres"))
        .unwrap();
    assert!(db_line.ends_with("-3000m freed"), "{db_line}");

    // The patches: a strategic merge patch per patchable workload, after its command.
    let documents: Vec<&str> = patch.split("---\n").collect();
    assert_eq!(documents.len(), rows.len(), "{patch}");
    for (kind, name, container, cpu) in [
        ("deployment", "web", "app", "2500m"),
        ("statefulset", "db", "postgres", "1000m"),
    ] {
        let document = documents
            .iter()
            .find(|d| {
                d.contains(&format!(
                    "# kubectl patch {kind}/{name} -n shop --patch-file"
                ))
            })
            .unwrap_or_else(|| panic!("no patch of {kind}/{name}: {patch}"));
        let body: String = document.lines().filter(|l| !l.starts_with('#')).collect();
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {document}"));
        assert_eq!(
            v,
            serde_json::json!({"spec": {"template": {"spec": {"containers": [
                {"name": container, "resources": {"limits": {"cpu": cpu}}}
            ]}}}}),
            "{document}"
        );
    }
    // Outside Kubernetes, the command that sets it: 0.08 s of each 0.1 s period, in µs.
    assert!(
        patch.contains(&format!(
            "# docker update --cpu-period 100000 --cpu-quota 80000 {c}"
        )),
        "{patch}"
    );
}

/// Its stderr's two lines, after checking that it failed with `code` and printed nothing else.
fn failure(out: &Output, code: i32) -> (String, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "an error and a hint: {stderr}");
    assert!(
        lines[0].starts_with("error: ") && lines[1].starts_with("hint: "),
        "{stderr}"
    );
    println!("{stderr}");
    (lines[0].to_owned(), lines[1].to_owned())
}

#[test]
fn recommend_says_in_one_line_why_it_cannot_read_prometheus() {
    let Some(()) = common::require(machine()) else {
        return;
    };
    // Nothing listens on a free port.
    let url = format!("http://127.0.0.1:{}", free_port());
    let (error, _) = failure(&recommend(&["--prometheus", &url]), 1);
    assert!(
        error.starts_with(&format!("error: cannot reach Prometheus at {url}: ")),
        "{error}"
    );

    // A Prometheus that scrapes kube-state-metrics only: no serve series.
    let dir = tempfile::tempdir().expect("temp dir");
    let ksm = serve(|_| kube_state_metrics());
    let jobs: [(&str, &[u16]); 1] = [("kube-state-metrics", &[ksm])];
    let (_prometheus, port) = start_prometheus_scraping(dir.path(), "prometheus", &jobs, &[], "");
    common::wait_until(Duration::from_secs(60), "kube_pod_info stored", || {
        try_query(port, "count(kube_pod_info)") == Some(4.0)
    });
    let url = format!("http://127.0.0.1:{port}");
    let (error, hint) = failure(&recommend(&["--prometheus", &url, "--window", "1h"]), 1);
    assert_eq!(
        error,
        format!(
            "error: Prometheus at {url} holds no throttle_tracer_period_seconds series in the last 1h"
        )
    );
    assert!(hint.contains("scrapes serve"), "{hint}");

    // The API's own error: a range longer than Prometheus reads (its durations end at 292
    // years).
    let (error, hint) = failure(&recommend(&["--prometheus", &url, "--window", "300y"]), 1);
    assert!(
        error.starts_with(&format!("error: Prometheus at {url} refused the query `"))
            && error.contains(": bad_data: ")
            && error.contains("duration out of range"),
        "{error}"
    );
    assert!(hint.contains("--window"), "{hint}");

    // The same Prometheus under a path it does not serve: its 404 page.
    let wrong = format!("{url}/not-prometheus");
    let (error, hint) = failure(&recommend(&["--prometheus", &wrong]), 1);
    assert_eq!(
        error,
        format!(
            "error: {wrong} answered HTTP 404 Not Found to /not-prometheus/api/v1/query: 404 page \
             not found"
        )
    );
    assert!(hint.contains("base URL"), "{hint}");

    // TLS is not spoken: a usage error.
    let (error, _) = failure(&recommend(&["--prometheus", "https://127.0.0.1:9090"]), 2);
    assert!(error.contains("only plain http"), "{error}");
}
