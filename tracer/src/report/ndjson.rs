//! The NDJSON stream: one JSON object per line, `"type"` first. A stable interface: fields may
//! be added, never renamed or retyped. Missing values are `null`, never a sentinel number.
//!
//! Lines: `start` (once), `stop_begin` (per per-CPU stop, when it begins), `stop` (per ended
//! per-CPU stop), `unseen_start_stop` (per stop that began before tracing and ended during it),
//! `summary` (per cgroup, at the end), `end` (last). Every record the aggregate takes is a line,
//! in the order it took them, so `throttle-tracer report` can rebuild the end report from them. All `*_ns` fields are ns; timestamps (`start_ns`, `end_ns`) are CLOCK_MONOTONIC
//! (`"clock":"monotonic"` in `start`); `kernel_ns` is the kernel's `rq->clock` length of the stop.
//! `*_log2_ms` arrays count durations in [2^i, 2^(i+1)) ms at index i (index 0 also holds < 1 ms).
//! `stop` and `summary` carry `name`, what users call the cgroup (`names::Name`): `{"kind",
//! "container_id", "pod_uid", "qos", "unit"}`, each `null` when the path does not say, or
//! `name: null` when nothing on the path is recognised.
//!
//! A `stop` has two spans on 6.18's task-based throttle (tracepoint backend): `start_ns` ..
//! `end_ns` (`duration_ns`) runs from when the group ran out of quota on that CPU to the
//! refill; the kernel's own span (`kernel_ns`, what cpu.stat counts) runs from the first task
//! parked (`park_ns`) to the refill. `parked` counts the tasks the stop parked; 0 where
//! nothing is parked (older kernels dequeue the whole group at once) or the backend cannot
//! see it (kprobe, fentry). `kernel_start_clock_ns` is `cfs_rq->throttled_clock` on the
//! kernel's rq clock (sched_clock), not CLOCK_MONOTONIC.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{CgroupReport, RefusedBackend, StartInfo, Totals};
use crate::aggregate::{Attributed, DurationSummary};
use crate::cgroups::Version;
use crate::cpustat::CpuStatDelta;
use crate::names::Name;
use crate::records::{EndedStop, Stop as StopRecord};

#[derive(Serialize)]
struct Start<'a> {
    r#type: &'static str,
    tracer_version: &'static str,
    backend: &'a str,
    kernel: &'a str,
    clock: &'static str,
    cgroup_version: Option<&'static str>,
    cgroup_root: String,
    /// Empty = every cgroup.
    cgroup_filter: &'a [String],
    disabled_features: &'a [String],
    blind_end_reasons: &'a [String],
    /// `"auto"` or the backend named on the command line.
    backend_requested: &'a str,
    /// What `auto` tried before `backend`, in order: `[{"backend":..,"reason":..}]`.
    backend_refused: Vec<Refused<'a>>,
}

#[derive(Serialize)]
struct Refused<'a> {
    backend: &'a str,
    reason: &'a str,
}

/// The first line: what produced the stream and how to read it.
pub(super) fn start(info: &StartInfo) -> String {
    line(&Start {
        r#type: "start",
        tracer_version: env!("CARGO_PKG_VERSION"),
        backend: &info.backend,
        kernel: &info.kernel,
        clock: "monotonic",
        cgroup_version: info.cgroup_version.map(|v| match v {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }),
        cgroup_root: info.cgroup_root.display().to_string(),
        cgroup_filter: &info.cgroups,
        disabled_features: &info.disabled,
        blind_end_reasons: &info.blind_end_reasons,
        backend_requested: &info.backend_requested,
        backend_refused: info
            .backend_refused
            .iter()
            .map(|RefusedBackend { backend, reason }| Refused { backend, reason })
            .collect(),
    })
}

/// What a `stop` line and a `stop_begin` line both say of a per-CPU stop: all that is known
/// when it begins.
#[derive(Serialize)]
struct Started<'a> {
    cgroup_id: u64,
    cgroup: Option<&'a str>,
    /// What users call the cgroup (`names::Name`); `null` if nothing on its path is known.
    name: Option<Name>,
    cpu: u32,
    start_ns: u64,
    /// `null` = no limit ("max").
    quota_ns: Option<u64>,
    period_ns: Option<u64>,
    burst_ns: Option<u64>,
    tasks: u32,
    pid: Option<u32>,
    tid: Option<u32>,
    comm: Option<&'a str>,
    parked: u32,
    park_ns: Option<u64>,
    kernel_start_clock_ns: Option<u64>,
    /// The stopped task's own cgroup when it is a descendant of `cgroup_id` (whose quota
    /// stopped it); `null` if no task was seen or it sat in `cgroup_id` itself.
    descendant_cgroup_id: Option<u64>,
    /// The direct children of `cgroup_id` with tasks queued on the stopped CPU at the throttle:
    /// the stop counts for each of them (their cpu.stat.local), at most 8.
    descendant_cgroup_ids: &'a [u64],
    /// Children stopped too but not listed (more than 8); a lower bound past 16 children.
    descendants_unlisted: u32,
}

impl<'a> Started<'a> {
    fn of(s: &'a StopRecord, cgroup: Option<&'a str>) -> Self {
        Self {
            cgroup_id: s.cgroup_id,
            cgroup,
            name: cgroup.and_then(Name::of),
            cpu: s.cpu,
            start_ns: s.start_ns,
            quota_ns: s.bandwidth.quota_ns,
            period_ns: s.bandwidth.period_ns,
            burst_ns: s.bandwidth.burst_ns,
            tasks: s.tasks,
            pid: s.task.as_ref().map(|t| t.pid),
            tid: s.task.as_ref().map(|t| t.tid),
            comm: s.task.as_ref().map(|t| t.comm.as_str()),
            parked: s.parked,
            park_ns: s.park_ns,
            kernel_start_clock_ns: s.kernel_start_clock,
            descendant_cgroup_id: s.descendant,
            descendant_cgroup_ids: &s.children,
            descendants_unlisted: s.children_unlisted,
        }
    }
}

#[derive(Serialize)]
struct Stop<'a> {
    r#type: &'static str,
    #[serde(flatten)]
    started: Started<'a>,
    end_ns: u64,
    duration_ns: u64,
    kernel_ns: Option<u64>,
    end: &'static str,
}

impl<'a> Stop<'a> {
    fn of(r#type: &'static str, end: &'a EndedStop, cgroup: Option<&'a str>) -> Self {
        Self {
            r#type,
            started: Started::of(&end.stop, cgroup),
            end_ns: end.end_ns,
            duration_ns: end.duration_ns(),
            kernel_ns: end.kernel_ns,
            end: end.reason.as_str(),
        }
    }
}

/// One ended per-CPU stop; `cgroup` is its path if it resolved.
pub(super) fn stop(end: &EndedStop, cgroup: Option<&str>) -> String {
    line(&Stop::of("stop", end, cgroup))
}

#[derive(Serialize)]
struct AncestorStop<'a> {
    #[serde(flatten)]
    stop: Stop<'a>,
    /// The traced cgroups it stopped, which it counts for (their `stopped_by_ancestor`).
    credited_cgroup_ids: &'a [u64],
}

/// An ended per-CPU stop of a cgroup that is not traced itself (an ancestor of a cgroup named
/// with `--cgroup`, or outside a glob): the `stop` line's fields and the traced descendants it
/// stopped. Its own type keeps readers of `stop` lines to the traced cgroups' own stops.
pub(super) fn ancestor_stop(end: &EndedStop, cgroup: Option<&str>, credited: &[u64]) -> String {
    line(&AncestorStop {
        stop: Stop::of("ancestor_stop", end, cgroup),
        credited_cgroup_ids: credited,
    })
}

#[derive(Serialize)]
struct Begin<'a> {
    r#type: &'static str,
    #[serde(flatten)]
    started: Started<'a>,
}

/// A per-CPU stop that began (its `stop` line follows when it ends); `cgroup` is its path if it
/// resolved. The fields are the `stop` line's, as known at the start.
pub(super) fn stop_begin(s: &StopRecord, cgroup: Option<&str>) -> String {
    line(&Begin {
        r#type: "stop_begin",
        started: Started::of(s, cgroup),
    })
}

#[derive(Serialize)]
struct UnseenStartStop<'a> {
    r#type: &'static str,
    cgroup_id: u64,
    cgroup: Option<&'a str>,
    name: Option<Name>,
    cpu: u32,
    end_ns: u64,
    kernel_ns: Option<u64>,
}

/// A stop that began before tracing: only its end and its kernel-accounted length are known.
pub(super) fn unseen_start_stop(
    cgroup_id: u64,
    cgroup: Option<&str>,
    cpu: u32,
    end_ns: u64,
    kernel_ns: Option<u64>,
) -> String {
    line(&UnseenStartStop {
        r#type: "unseen_start_stop",
        cgroup_id,
        cgroup,
        name: cgroup.and_then(Name::of),
        cpu,
        end_ns,
        kernel_ns,
    })
}

#[derive(Serialize)]
struct OpenStop {
    cpu: u32,
    start_ns: u64,
    elapsed_ns: u64,
}

#[derive(Serialize)]
struct CpuStat {
    nr_periods: u64,
    nr_throttled: u64,
    throttled_ns: u64,
    /// 0 for v1 (exact ns); 1000 for v2, whose µs readings make every time delta ±1 µs.
    resolution_ns: u64,
    nr_bursts: Option<u64>,
    burst_ns: Option<u64>,
    /// cpu.stat.local throttled time (own or ancestor's quota), 6.6+.
    throttled_local_ns: Option<u64>,
    usage_ns: Option<u64>,
    user_ns: Option<u64>,
    system_ns: Option<u64>,
    wait_sum_ns: Option<u64>,
}

impl From<&CpuStatDelta> for CpuStat {
    fn from(d: &CpuStatDelta) -> Self {
        Self {
            nr_periods: d.nr_periods,
            nr_throttled: d.nr_throttled,
            throttled_ns: d.throttled_ns,
            resolution_ns: d.unit.resolution_ns(),
            nr_bursts: d.nr_bursts,
            burst_ns: d.burst_ns,
            throttled_local_ns: d.local_throttled_ns,
            usage_ns: d.usage_ns,
            user_ns: d.user_ns,
            system_ns: d.system_ns,
            wait_sum_ns: d.wait_sum_ns,
        }
    }
}

#[derive(Serialize)]
struct Summary<'a> {
    r#type: &'static str,
    cgroup_id: u64,
    cgroup: Option<&'a str>,
    name: Option<Name>,
    stops: u64,
    group_stops: u64,
    cpu_stop_ns: u64,
    kernel_stop_ns: u64,
    kernel_unknown_stops: u64,
    wall_stop_ns: u64,
    p50_ns: Option<u64>,
    p90_ns: Option<u64>,
    p99_ns: Option<u64>,
    max_ns: Option<u64>,
    group_p50_ns: Option<u64>,
    group_p90_ns: Option<u64>,
    group_p99_ns: Option<u64>,
    group_max_ns: Option<u64>,
    stops_log2_ms: &'a [u32],
    group_stops_log2_ms: &'a [u32],
    end_reasons: BTreeMap<&'static str, u64>,
    open: usize,
    open_stops: Vec<OpenStop>,
    unseen_start_stops: u64,
    unseen_start_kernel_ns: u64,
    unseen_start_kernel_unknown: u64,
    /// kernel_stop_ns + unseen_start_kernel_ns: the trace's account of the cpu.stat delta.
    kernel_accounted_ns: u64,
    unmatched_ends: u64,
    restarted: u64,
    cpu_stat: Option<CpuStat>,
    overcount: Option<f64>,
    /// Settings from the control files at the end; `quota_ns` null = no limit.
    quota_ns: Option<u64>,
    period_ns: Option<u64>,
    burst_ns: Option<u64>,
    /// For a quota owner: its stops that stopped each descendant's tasks.
    descendants: Vec<AttributedJson<'a>>,
    /// For a descendant: the stops of each ancestor's quota that stopped its tasks (not in the
    /// figures above, which are the group's own quota's).
    stopped_by_ancestor: Vec<AttributedJson<'a>>,
    /// For a quota owner: stops that stopped more children than a stop line lists.
    children_unlisted_stops: u64,
    /// kernel_accounted_ns + Σ stopped_by_ancestor kernel_ns: the trace's account of the
    /// cpu.stat.local throttled delta (6.6+).
    local_accounted_ns: u64,
}

#[derive(Serialize)]
struct AttributedJson<'a> {
    cgroup_id: u64,
    cgroup: Option<&'a str>,
    stops: u64,
    stopped_ns: u64,
    kernel_ns: u64,
}

fn attributed(list: &[Attributed]) -> Vec<AttributedJson<'_>> {
    list.iter()
        .map(|a| AttributedJson {
            cgroup_id: a.cgroup_id,
            cgroup: a.path.as_deref(),
            stops: a.stops,
            stopped_ns: a.stopped_ns,
            kernel_ns: a.kernel_ns,
        })
        .collect()
}

/// One cgroup's figures at the end.
pub(super) fn summary(r: &CgroupReport) -> String {
    let s = &r.summary;
    let pct = |d: &DurationSummary| {
        d.percentiles
            .map(|p| {
                [
                    Some(p.p50_ns),
                    Some(p.p90_ns),
                    Some(p.p99_ns),
                    Some(p.max_ns),
                ]
            })
            .unwrap_or_default()
    };
    let [p50_ns, p90_ns, p99_ns, max_ns] = pct(&s.stops);
    let [group_p50_ns, group_p90_ns, group_p99_ns, group_max_ns] = pct(&s.group_stops);
    line(&Summary {
        r#type: "summary",
        cgroup_id: s.cgroup_id,
        cgroup: r.path.as_deref(),
        name: r.path.as_deref().and_then(Name::of),
        stops: s.stops.count,
        group_stops: s.group_stops.count,
        cpu_stop_ns: s.stops.sum_ns,
        kernel_stop_ns: s.kernel_stop_ns,
        kernel_unknown_stops: s.kernel_unknown_stops,
        wall_stop_ns: s.group_stops.sum_ns,
        p50_ns,
        p90_ns,
        p99_ns,
        max_ns,
        group_p50_ns,
        group_p90_ns,
        group_p99_ns,
        group_max_ns,
        stops_log2_ms: &s.stops.log2_ms,
        group_stops_log2_ms: &s.group_stops.log2_ms,
        end_reasons: s
            .end_reasons
            .iter()
            .map(|(r, n)| (r.as_str(), *n))
            .collect(),
        open: s.open_stops.len(),
        open_stops: s
            .open_stops
            .iter()
            .map(|o| OpenStop {
                cpu: o.cpu,
                start_ns: o.start_ns,
                elapsed_ns: o.elapsed_ns,
            })
            .collect(),
        unseen_start_stops: s.unseen_start_stops,
        unseen_start_kernel_ns: s.unseen_start_kernel_ns,
        unseen_start_kernel_unknown: s.unseen_start_kernel_unknown,
        kernel_accounted_ns: s.kernel_accounted_ns(),
        unmatched_ends: s.unmatched_ends,
        restarted: s.restarted,
        cpu_stat: r.cpu_stat.as_ref().map(CpuStat::from),
        overcount: r.overcount(),
        quota_ns: r.settings.and_then(|b| b.quota_ns),
        period_ns: r.settings.and_then(|b| b.period_ns),
        burst_ns: r.settings.and_then(|b| b.burst_ns),
        descendants: attributed(&s.descendants),
        stopped_by_ancestor: attributed(&s.stopped_by_ancestor),
        children_unlisted_stops: s.children_unlisted_stops,
        local_accounted_ns: r.local_accounted_ns(),
    })
}

#[derive(Serialize)]
struct End {
    r#type: &'static str,
    lost: u64,
    malformed: u64,
    elapsed_ns: u64,
}

/// The last line.
pub(super) fn end(t: &Totals) -> String {
    line(&End {
        r#type: "end",
        lost: t.lost,
        malformed: t.malformed,
        elapsed_ns: t.elapsed_ns,
    })
}

/// One line without its newline. These structs only hold strings, integers, finite floats
/// (a ratio of two non-zero integers) and maps with string keys, which always serialize.
fn line<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        serde_json::json!({"type": "error", "error": e.to_string()}).to_string()
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::report::tests::{MS, demo_report, ended};

    fn parse(line: &str) -> Value {
        assert!(!line.contains('\n'));
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn start_line() {
        let v = parse(&start(&StartInfo {
            backend: "kprobe".into(),
            kernel: "6.1.0-47-cloud-amd64".into(),
            cgroup_version: Some(Version::V1),
            cgroup_root: "/sys/fs/cgroup/cpu".into(),
            cgroups: vec![],
            disabled: vec!["tasks".into(), "pid".into()],
            blind_end_reasons: vec!["cpu_offline".into()],
            backend_requested: "auto".into(),
            backend_refused: vec![RefusedBackend {
                backend: "fentry".into(),
                reason: "EPERM".into(),
            }],
        }));
        assert_eq!(v["type"], "start");
        assert_eq!(v["backend"], "kprobe");
        assert_eq!(v["kernel"], "6.1.0-47-cloud-amd64");
        assert_eq!(v["clock"], "monotonic");
        assert_eq!(v["cgroup_version"], "v1");
        assert_eq!(v["cgroup_root"], "/sys/fs/cgroup/cpu");
        assert_eq!(v["cgroup_filter"], serde_json::json!([]));
        assert_eq!(v["disabled_features"], serde_json::json!(["tasks", "pid"]));
        assert_eq!(v["blind_end_reasons"], serde_json::json!(["cpu_offline"]));
        assert_eq!(v["backend_requested"], "auto");
        assert_eq!(
            v["backend_refused"],
            serde_json::json!([{"backend": "fentry", "reason": "EPERM"}])
        );
        assert!(parse(&start(&StartInfo::default()))["cgroup_version"].is_null());
    }

    #[test]
    fn stop_line_with_and_without_optional_values() {
        let e = ended(3, 100, 180);
        let v = parse(&stop(&e, Some("/demo")));
        assert_eq!(v["type"], "stop");
        assert_eq!(v["cgroup_id"], 4242);
        assert_eq!(v["cgroup"], "/demo");
        assert!(v["name"].is_null(), "/demo is nothing users would know");
        assert_eq!(v["cpu"], 3);
        assert_eq!(v["start_ns"], 100 * MS);
        assert_eq!(v["end_ns"], 180 * MS);
        assert_eq!(v["duration_ns"], 80 * MS);
        assert_eq!(v["kernel_ns"], 80 * MS + 1_000);
        assert_eq!(v["end"], "refill");
        assert_eq!(v["quota_ns"], 20 * MS);
        assert_eq!(v["period_ns"], 100 * MS);
        assert_eq!(v["burst_ns"], 0);
        assert_eq!(v["tasks"], 2);
        assert_eq!(
            (&v["pid"], &v["tid"], &v["comm"]),
            (&Value::from(100), &Value::from(101), &Value::from("stress"))
        );

        assert_eq!(v["parked"], 1);
        assert_eq!(v["park_ns"], 100 * MS + 2_000);
        assert_eq!(v["kernel_start_clock_ns"], 5_000 * MS);

        let mut e = e;
        e.kernel_ns = None;
        e.stop.bandwidth.quota_ns = None;
        e.stop.task = None;
        e.stop.parked = 0;
        e.stop.park_ns = None;
        e.stop.kernel_start_clock = None;
        let v = parse(&stop(&e, None));
        for key in [
            "cgroup",
            "name",
            "kernel_ns",
            "quota_ns",
            "pid",
            "tid",
            "comm",
            "park_ns",
            "kernel_start_clock_ns",
        ] {
            assert!(v[key].is_null(), "{key} should be null: {v}");
        }
        assert!(v["duration_ns"].is_u64());
        assert_eq!(v["parked"], 0);
    }

    #[test]
    fn ancestor_stop_line_is_a_stop_line_with_the_cgroups_it_counts_for() {
        let e = ended(1, 100, 140);
        let stop = parse(&stop(&e, Some("/pod")));
        let mut v = parse(&ancestor_stop(&e, Some("/pod"), &[11, 12]));
        assert_eq!(v["type"], "ancestor_stop");
        assert_eq!(v["credited_cgroup_ids"], serde_json::json!([11, 12]));
        let fields = v.as_object_mut().unwrap();
        fields.remove("credited_cgroup_ids");
        fields.insert("type".into(), "stop".into());
        assert_eq!(v, stop);
    }

    #[test]
    fn summary_line() {
        let r = demo_report();
        let v = parse(&summary(&r));
        assert_eq!(v["type"], "summary");
        assert_eq!(v["cgroup"], "/demo");
        assert!(v["name"].is_null());
        assert_eq!(v["stops"], 3);
        assert_eq!(v["group_stops"], 2);
        assert_eq!(v["cpu_stop_ns"], 240 * MS);
        assert_eq!(v["wall_stop_ns"], 180 * MS);
        assert_eq!(v["kernel_stop_ns"], 240 * MS + 3_000);
        assert_eq!(v["max_ns"], 80 * MS);
        assert_eq!(v["group_max_ns"], 100 * MS);
        let p50 = v["p50_ns"].as_u64().unwrap();
        assert!((79 * MS..=80 * MS).contains(&p50), "{p50}");
        assert_eq!(v["stops_log2_ms"], serde_json::json!([0, 0, 0, 0, 0, 0, 3]));
        assert_eq!(v["end_reasons"], serde_json::json!({"refill": 3}));
        assert_eq!(v["open"], 1);
        assert_eq!(
            v["open_stops"],
            serde_json::json!([{"cpu": 1, "start_ns": 300 * MS, "elapsed_ns": 50 * MS}])
        );
        assert_eq!(v["unseen_start_stops"], 1);
        assert_eq!(v["unseen_start_kernel_ns"], 30 * MS);
        assert_eq!(v["kernel_accounted_ns"], 270 * MS + 3_000);
        let cs = &v["cpu_stat"];
        assert_eq!(
            (cs["nr_periods"].as_u64(), cs["nr_throttled"].as_u64()),
            (Some(4), Some(3))
        );
        assert_eq!(cs["throttled_ns"], 270 * MS);
        assert_eq!(cs["resolution_ns"], 0);
        assert!(cs["usage_ns"].is_null());
        assert_eq!(v["overcount"].as_f64(), Some(1.5));
        assert_eq!(v["quota_ns"], 20 * MS);

        // A cgroup gone by the end, with no ended stop: nulls, not zeros or sentinels.
        let mut r = r;
        r.path = None;
        r.cpu_stat = None;
        r.settings = None;
        r.summary.stops = crate::aggregate::DurationSummary {
            count: 0,
            sum_ns: 0,
            percentiles: None,
            log2_ms: vec![],
        };
        let v = parse(&summary(&r));
        for key in [
            "cgroup",
            "name",
            "cpu_stat",
            "overcount",
            "p50_ns",
            "max_ns",
            "quota_ns",
        ] {
            assert!(v[key].is_null(), "{key} should be null: {v}");
        }
        assert_eq!(v["stops"], 0);
    }

    #[test]
    fn stop_and_summary_name_the_container() {
        let id = "4c1f0e6a9b2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f";
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod6f2d0c1f_3e21_4b6a_9a59_0d3c3b6f5f5e.slice/cri-containerd-{id}.scope"
        );
        let want = serde_json::json!({
            "kind": "containerd",
            "container_id": "4c1f0e6a9b2d",
            "pod_uid": "6f2d0c1f-3e21-4b6a-9a59-0d3c3b6f5f5e",
            "qos": "burstable",
            "unit": format!("cri-containerd-{id}.scope"),
        });
        assert_eq!(parse(&stop(&ended(0, 0, 80), Some(&path)))["name"], want);
        let mut r = demo_report();
        r.path = Some(path);
        assert_eq!(parse(&summary(&r))["name"], want);
    }

    #[test]
    fn end_line() {
        let v = parse(&end(&Totals {
            lost: 2,
            malformed: 1,
            elapsed_ns: 5 * MS,
        }));
        assert_eq!(
            v,
            serde_json::json!({"type": "end", "lost": 2, "malformed": 1, "elapsed_ns": 5 * MS})
        );
    }
}
