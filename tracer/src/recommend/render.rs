//! What `recommend` prints: the table (one row per workload, then the workloads it did not
//! advise and why, then the entitlement it would ask for and free), one JSON object per line,
//! or one `kubectl patch` document per Kubernetes workload (comments for the rest).

use std::fmt::Write as _;

use super::fleet::{Recommendation, Refusal};
use crate::units::span;

/// What the table's header line says about where the rows come from.
pub struct Source<'a> {
    pub url: &'a str,
    pub window: &'a str,
}

const HEADER: [&str; 11] = [
    "WORKLOAD",
    "PODS",
    "NODES",
    "DATA",
    "LIMIT",
    "P99 DEMAND",
    "ADVISED",
    "BURST",
    "STOPPED",
    "AFTER",
    "CHANGE",
];

pub fn table(rows: &[Recommendation], source: &Source) -> String {
    let targets: Vec<String> = {
        let mut t: Vec<String> = rows
            .iter()
            .filter_map(|r| r.target_ratio)
            .map(percent)
            .collect();
        t.sort();
        t.dedup();
        t
    };
    let mut out = format!(
        "throttle-tracer recommend: {} workload(s) from {} over the last {}; advice for at most \
         {} of periods stopped\n",
        rows.len(),
        source.url,
        source.window,
        if targets.is_empty() {
            "the target".to_owned()
        } else {
            targets.join(" / ")
        }
    );
    let cells: Vec<[String; 11]> = std::iter::once(HEADER.map(String::from))
        .chain(rows.iter().map(cells))
        .collect();
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in &cells {
        let mut line = format!("{:<w$}", row[0], w = widths[0]);
        for (cell, w) in row.iter().zip(&widths).skip(1) {
            let _ = write!(line, "  {cell:>w$}");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    for r in rows {
        match &r.refused {
            Some(Refusal::TooLittleData {
                has_seconds,
                needs_seconds,
            }) => {
                let _ = writeln!(
                    out,
                    "not advised: {}: {} of measured periods in the window, needs {} \
                     (--min-data)",
                    r.workload,
                    span(*has_seconds),
                    span(*needs_seconds)
                );
            }
            Some(Refusal::NoAdvice { serve_said }) => {
                let said = if serve_said.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (throttle_tracer_advice_missing: {})",
                        serve_said.join(", ")
                    )
                };
                let _ = writeln!(
                    out,
                    "not advised: {}: serve exported no advice for it in the window{said}",
                    r.workload
                );
            }
            None => {}
        }
    }
    // Each pod gets the workload's limit: the fleet's entitlement changes by CHANGE × PODS.
    let changes: Vec<i64> = rows
        .iter()
        .filter_map(|r| Some(r.change_millicores? * r.pods as i64))
        .collect();
    let asked: i64 = changes.iter().filter(|c| **c > 0).sum();
    let freed: i64 = -changes.iter().filter(|c| **c < 0).sum::<i64>();
    let _ = writeln!(
        out,
        "entitlement over the pods seen: {asked}m more where limits stop periods, {freed}m \
         freed where limits are above demand (net {:+}m)",
        asked - freed
    );
    out.push_str(
        "DATA: measured periods × period, over the pods. LIMIT: today's quota / period (the \
         largest of\nthe pods). P99 DEMAND: the 99th percentile of one period's demand, as CPUs \
         of the period.\nADVISED: the limits.cpu that stops at most the target share, the \
         largest advice any pod had in\nthe window. BURST: the advised burst (n/a: Kubernetes \
         cannot set one; elsewhere cpu.max.burst\nor cpu.cfs_burst_us). STOPPED: the share of \
         periods stopped in the window; AFTER: the share the\nadvice's model predicts with it. \
         CHANGE: ADVISED - LIMIT per pod (negative: freed).\n",
    );
    out
}

fn cells(r: &Recommendation) -> [String; 11] {
    let cpus = |v: Option<f64>| v.map_or("-".into(), |c| format!("{}m", (c * 1000.0).round()));
    let burst = if !r.burst_settable {
        "n/a".to_owned()
    } else if r.refused.is_some() {
        "-".to_owned()
    } else {
        r.advised_burst_seconds
            .map_or("none".into(), |b| format!("{}ms", (b * 1e4).round() / 10.0))
    };
    [
        r.workload.clone(),
        r.pods.to_string(),
        r.nodes.to_string(),
        span(r.data_seconds),
        r.limit_millicores.map_or("-".into(), |m| format!("{m}m")),
        cpus(r.p99_demand_cpus),
        r.advised_millicores.map_or("-".into(), |m| format!("{m}m")),
        burst,
        r.stopped_ratio_now.map_or("-".into(), percent),
        r.stopped_ratio_after.map_or("-".into(), percent),
        match r.change_millicores {
            Some(c) if c < 0 => format!("{c}m freed"),
            Some(c) => format!("{c:+}m"),
            None => "-".into(),
        },
    ]
}

/// A share as a percentage, to a tenth: `0.9%`.
fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// One JSON object per workload and line.
pub fn json(rows: &[Recommendation]) -> String {
    rows.iter()
        .map(|r| serde_json::to_string(r).expect("a row serializes") + "\n")
        .collect()
}

/// The kinds whose pod template `kubectl patch` can change in place (a Job's is immutable, a
/// bare Pod's containers' limits too before in-place resize).
const PATCHABLE: [&str; 4] = ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"];

/// A strategic merge patch per advised Kubernetes workload, each after the command that applies
/// it and separated by `---`; the other rows as comments saying how to set their limit, or why
/// there is nothing to set.
pub fn patch(rows: &[Recommendation]) -> String {
    let mut out = String::new();
    for r in rows {
        if !out.is_empty() {
            out.push_str("---\n");
        }
        let _ = writeln!(out, "# {}", r.workload);
        let Some(millicores) = r.advised_millicores else {
            let _ = writeln!(out, "# not advised: see `recommend` without --output patch");
            continue;
        };
        let today = r.limit_millicores.map_or("-".into(), |m| format!("{m}m"));
        let _ = writeln!(out, "# limits.cpu {today} -> {millicores}m");
        let k = match &r.kubernetes {
            Some(k) => k,
            None => {
                out.push_str(&by_hand(r, millicores));
                continue;
            }
        };
        let Some(container) = &k.container else {
            let _ = writeln!(
                out,
                "# cannot patch: kube-state-metrics did not name the container \
                 (no kube_pod_container_info)"
            );
            continue;
        };
        if !PATCHABLE.contains(&k.kind.as_str()) {
            let _ = writeln!(
                out,
                "# cannot patch a {}'s pod template: set limits.cpu: {millicores}m in whatever \
                 creates it",
                k.kind
            );
            continue;
        }
        let document = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
            "name": container,
            "resources": {"limits": {"cpu": format!("{millicores}m")}},
        }]}}}});
        let _ = writeln!(
            out,
            "# kubectl patch {}/{} -n {} --patch-file <this document>\n{}",
            k.kind.to_lowercase(),
            k.name,
            k.namespace,
            serde_json::to_string_pretty(&document).expect("a patch serializes")
        );
    }
    out
}

/// How to set the advised limit of a row outside Kubernetes, as comments: the quota at the
/// row's period, in microseconds, as the files and `docker update` take it.
fn by_hand(r: &Recommendation, millicores: i64) -> String {
    let period_us = (r.period_seconds.unwrap_or(0.1) * 1e6).round() as i64;
    // Rounded up, as the advised millicores were.
    let quota_us = (millicores * period_us + 999) / 1000;
    match &r.container_id {
        Some(id) => format!(
            "# docker update --cpu-period {period_us} --cpu-quota {quota_us} {id} \
             (podman update takes the same)\n"
        ),
        None => format!(
            "# cgroup v2: echo '{quota_us} {period_us}' > /sys/fs/cgroup{path}/cpu.max; \
             v1: echo {quota_us} > /sys/fs/cgroup/cpu{path}/cpu.cfs_quota_us (its period: \
             {period_us})\n",
            path = r.cgroups.join(","),
        ),
    }
}
