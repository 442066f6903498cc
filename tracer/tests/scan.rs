//! `throttle-tracer scan` on this machine's real cgroups (cgroup v1 or v2, through
//! test-support), judged against the cpu.stat, cpu.stat.local and CPU usage the test reads
//! itself, and quota arithmetic: a pod-like parent with a quota and two children, one busy;
//! and a cgroup with a burst that a spiky workload spends.
//! Needs root (to make the cgroups); the scan itself also runs as `nobody`.
use test_support as common;

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use common::{Cgroup, CpuHierarchy, CpuStat, Running};
use serde_json::Value;

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
const MS: u64 = 1_000_000;

/// The rows `scan --json` printed, each checked to be one JSON object.
fn rows(out: std::process::Output) -> Vec<Value> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scan: {}: {stderr}", out.status);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `scan --json` as root: the reading that the unprivileged ones below are compared with. (scan
/// traces nothing: nobody without capabilities reads the same, nobody_can_scan_a_readable_tree.)
fn scan(args: &[&str]) -> Vec<Value> {
    rows(
        Command::new(TRACER)
            .args(["scan", "--json"])
            .args(args)
            .output()
            .expect("run scan"),
    )
}

fn row<'a>(rows: &'a [Value], cgroup: &Cgroup) -> &'a Value {
    rows.iter()
        .find(|r| r["cgroup"] == cgroup.path())
        .unwrap_or_else(|| panic!("no row for {}: {rows:#?}", cgroup.path()))
}

/// The parent at 20 ms / 100 ms, `busy` without a quota of its own, `tight` with a tighter one
/// (10 ms: its own is its limit; cgroup v1 refuses a child a looser quota than its parent's).
struct Pod {
    busy: Cgroup,
    tight: Cgroup,
    parent: Cgroup,
}

impl Pod {
    fn new(cpu: &CpuHierarchy, tag: &str) -> Self {
        let parent = Cgroup::throttled(cpu, tag, 20_000, 100_000).with_cpuacct();
        let busy = parent.child("busy").with_cpuacct();
        let tight = parent.child("tight").with_cpuacct();
        tight.set_quota(Some(10_000), 100_000);
        Self {
            busy,
            tight,
            parent,
        }
    }

    /// One busy thread in `busy` for `seconds`, pinned; then until every stop has ended.
    fn run(&self, seconds: u32) {
        let mut workload = common::spawn_in(
            &mut common::busy(1, seconds),
            &self.busy,
            Some(common::last_cpu()),
        );
        assert!(workload.wait().expect("wait workload").success());
        self.parent.wait_refilled();
    }
}

fn assert_counts(row: &Value, truth: CpuStat) {
    let s = &row["cpu_stat"];
    assert_eq!(
        (
            s["nr_periods"].as_u64(),
            s["nr_throttled"].as_u64(),
            s["throttled_ns"].as_u64()
        ),
        (
            Some(truth.nr_periods),
            Some(truth.nr_throttled),
            Some(truth.throttled_ns)
        ),
        "{row}"
    );
}

fn delta(after: CpuStat, before: CpuStat) -> CpuStat {
    CpuStat {
        nr_periods: after.nr_periods - before.nr_periods,
        nr_throttled: after.nr_throttled - before.nr_throttled,
        throttled_ns: after.throttled_ns - before.throttled_ns,
        nr_bursts: after.nr_bursts.zip(before.nr_bursts).map(|(a, b)| a - b),
        burst_ns: after.burst_ns.zip(before.burst_ns).map(|(a, b)| a - b),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn rows_hold_the_cgroups_own_counters_and_children_show_the_parents_limit() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let pod = Pod::new(&host.cpu, "scan-life");
    pod.run(2);
    let truth = (pod.parent.stat(), pod.busy.stat(), pod.busy.usage_ns());
    let rows = scan(&[]);
    assert_eq!(
        (pod.parent.stat(), pod.busy.stat(), pod.busy.usage_ns()),
        truth,
        "the counters moved while the scan read them"
    );
    let (parent, busy_stat, busy_usage) = truth;

    let p = row(&rows, &pod.parent);
    assert_counts(p, parent);
    assert!(
        parent.nr_throttled > 0,
        "the parent was never throttled: {p}"
    );
    assert_eq!(p["status"], "present");
    assert_eq!(
        (&p["quota_ns"], &p["period_ns"]),
        (&Value::from(20 * MS), &Value::from(100 * MS))
    );
    assert_eq!(p["limit"]["own"], true);
    let ratio = parent.nr_throttled as f64 / parent.nr_periods as f64;
    assert!(close(p["throttled_ratio"].as_f64().unwrap(), ratio), "{p}");

    let busy = row(&rows, &pod.busy);
    let limit = &busy["limit"];
    assert_eq!(limit["cgroup"], pod.parent.path(), "{busy}");
    assert_eq!(limit["own"], false);
    assert_eq!(
        (&limit["quota_ns"], &limit["cpus"]),
        (&Value::from(20 * MS), &Value::from(0.2))
    );
    assert!(
        close(limit["throttled_ratio"].as_f64().unwrap(), ratio),
        "{busy}"
    );
    let tight = row(&rows, &pod.tight);
    assert_eq!(tight["limit"]["cgroup"], pod.tight.path(), "{tight}");
    assert_eq!(tight["limit"]["cpus"], 0.1, "{tight}");
    assert_eq!(tight["quota_ns"], 10 * MS, "{tight}");
    assert_counts(busy, busy_stat);
    assert!(busy["quota_ns"].is_null(), "{busy}");
    if let Some(local) = pod.busy.local_throttled_ns() {
        assert!(local > 0, "the parent's quota stopped the busy child");
        assert_eq!(busy["cpu_stat"]["throttled_local_ns"], local, "{busy}");
    }
    // Its CPU time over the parent's active periods at the parent's quota.
    assert_eq!(busy["usage_ns"], busy_usage);
    let want = busy_usage as f64 / (parent.nr_periods as f64 * 20e6);
    assert!(
        close(busy["use_of_limit"].as_f64().unwrap(), want),
        "{busy} vs {want}"
    );
    // The most throttled first: the pod's rows before any cgroup that was never throttled.
    let first_quiet = rows.iter().position(|r| {
        r["limit"]["throttled_ratio"]
            .as_f64()
            .is_none_or(|x| x == 0.0)
    });
    let parent_at = rows.iter().position(|r| r["cgroup"] == pod.parent.path());
    assert!(first_quiet.is_none_or(|q| parent_at < Some(q)), "{rows:#?}");
    println!(
        "parent nr_periods {} nr_throttled {} throttled {} ns (ratio {ratio:.3}); busy child \
         usage {busy_usage} ns, use of the limit {want:.3}",
        parent.nr_periods, parent.nr_throttled, parent.throttled_ns
    );
}

#[test]
fn an_interval_has_the_windows_deltas_and_marks_what_came_and_went() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let pod = Pod::new(&host.cpu, "scan-window");
    // Counters before the window, so that the window's deltas are not the lifetime's.
    pod.run(1);
    // The period timer runs a period or two past the work: its last count must land before
    // the counters the window starts from (under TCG it came after, one period off).
    pod.parent.wait_refilled();
    let gone = pod.parent.child("gone");
    let before = (
        pod.parent.stat(),
        pod.busy.stat(),
        pod.busy.local_throttled_ns(),
    );
    let scan = Running::spawn(
        common::tracer::command()
            .args(["scan", "--json", "--interval", "4s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    // Well after the scan's first reading, well before its second.
    thread::sleep(Duration::from_secs(1));
    drop(gone);
    let late = pod.parent.child("late");
    pod.run(1);
    pod.parent.wait_refilled();
    let after = (
        pod.parent.stat(),
        pod.busy.stat(),
        pod.busy.local_throttled_ns(),
    );
    let rows = rows(scan.wait_with_output());
    assert_eq!(
        (pod.parent.stat(), pod.busy.stat()),
        (after.0, after.1),
        "the counters moved after the test read them"
    );

    let p = row(&rows, &pod.parent);
    let window = p["window_ns"].as_u64().unwrap();
    assert!((4_000 * MS..4_500 * MS).contains(&window), "{p}");
    let d = delta(after.0, before.0);
    assert_counts(p, d);
    assert!(
        d.nr_throttled > 0 && d.nr_periods < after.0.nr_periods,
        "{p}"
    );
    let b = row(&rows, &pod.busy);
    assert_counts(b, delta(after.1, before.1));
    if let (Some(after), Some(before)) = (after.2, before.2) {
        assert_eq!(b["cpu_stat"]["throttled_local_ns"], after - before, "{b}");
    }
    for (cgroup, status) in [(&late, "created"), (&pod.tight, "present")] {
        assert_eq!(row(&rows, cgroup)["status"], status);
    }
    let removed = rows
        .iter()
        .find(|r| r["status"] == "removed")
        .unwrap_or_else(|| panic!("no removed row: {rows:#?}"));
    assert_eq!(removed["cgroup"], format!("{}/gone", pod.parent.path()));
    for r in [removed, row(&rows, &late)] {
        assert!(r["cpu_stat"].is_null() && r["usage_ns"].is_null(), "{r}");
        assert_eq!(r["limit"]["cgroup"], pod.parent.path());
    }
    println!(
        "window {:.3} s: parent nr_periods +{} nr_throttled +{} throttled +{} ns",
        window as f64 / 1e9,
        d.nr_periods,
        d.nr_throttled,
        d.throttled_ns
    );
}

/// A quota with a burst (v1 `cpu.cfs_burst_us`, v2 `cpu.max.burst`, 5.14+) and a workload
/// that spends it: rounds of 80 ms of CPU 500 ms apart at 50 ms / 100 ms with a 40 ms burst,
/// each 30 ms over the quota, paid from what the idle periods before it left unused. The row
/// has the quota, period and burst the test wrote, and the cgroup's own cpu.stat `nr_bursts`
/// and burst time (v1 `burst_time` ns, v2 `burst_usec`; 5.16+), in the JSON and in the table.
#[test]
fn a_burst_and_the_burst_spent_are_the_cgroups_own() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cgroup = Cgroup::throttled(&host.cpu, "scan-burst", 50_000, 100_000);
    if !common::applies(host.cpu.has_burst(cgroup.dir())) {
        return;
    }
    host.cpu.set_burst(cgroup.dir(), 40_000);
    let mut workload = common::spawn_in(
        common::spiky(500, 80, 3, 1).stdout(Stdio::null()),
        &cgroup,
        Some(common::last_cpu()),
    );
    assert!(workload.wait().expect("wait workload").success());
    cgroup.wait_refilled();
    let truth = cgroup.stat();
    let rows = scan(&[]);
    let table = common::tracer::command()
        .arg("scan")
        .output()
        .expect("run scan");
    assert!(table.status.success(), "scan: {table:?}");
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(
        cgroup.stat(),
        truth,
        "the counters moved while scan read them"
    );

    let r = row(&rows, &cgroup);
    assert_eq!(
        (&r["quota_ns"], &r["period_ns"], &r["burst_ns"]),
        (
            &Value::from(50 * MS),
            &Value::from(100 * MS),
            &Value::from(40 * MS)
        ),
        "{r}"
    );
    assert_counts(r, truth);
    let line = table
        .lines()
        .find(|l| l.split_whitespace().last() == Some(cgroup.path()))
        .unwrap_or_else(|| panic!("no row for {} in the table:\n{table}", cgroup.path()));
    // RATE PERIODS THROTTLED THROTTLED-s LOCAL-s BURSTS BURST-s USE QUOTA/PERIOD ...
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[8], "50ms/100ms+40ms", "{line}");
    let s = &r["cpu_stat"];
    let (Some(bursts), Some(burst_ns)) = (truth.nr_bursts, truth.burst_ns) else {
        assert!(s["nr_bursts"].is_null() && s["burst_ns"].is_null(), "{r}");
        common::applies(Err("cpu.stat has no nr_bursts / burst time (5.16+)"));
        return;
    };
    println!(
        "burst 40 ms at 50 ms / 100 ms: cpu.stat nr_bursts {bursts} burst {burst_ns} ns, \
         nr_periods {} nr_throttled {}; table: {line}",
        truth.nr_periods, truth.nr_throttled
    );
    assert!(bursts > 0 && burst_ns > 0, "no burst was spent: {truth:?}");
    assert_eq!(
        (s["nr_bursts"].as_u64(), s["burst_ns"].as_u64()),
        (Some(bursts), Some(burst_ns)),
        "{r}"
    );
    assert_eq!(
        (cells[5], cells[6]),
        (
            bursts.to_string().as_str(),
            format!("{:.3}", burst_ns as f64 / 1e9).as_str()
        ),
        "{line}"
    );
}

#[test]
fn nobody_can_scan_a_readable_tree() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let pod = Pod::new(&host.cpu, "scan-nobody");
    pod.run(1);
    let as_root = scan(&[]);
    // As nobody, with no capabilities at all.
    let out = common::as_nobody(TRACER, &[])
        .args(["scan", "--json"])
        .output()
        .expect("run scan as nobody");
    let as_nobody = rows(out);
    for cgroup in [&pod.parent, &pod.busy, &pod.tight] {
        assert_eq!(row(&as_nobody, cgroup), row(&as_root, cgroup));
    }
    assert_counts(row(&as_nobody, &pod.parent), pod.parent.stat());
}

/// A cgroup nobody may enter (mode 700, as a runtime's private subtree can be) is not passed
/// over silently: `scan` as nobody names it (on standard error with `--json`, under the table
/// without), shows it under its parent's limit with its own quota and counters unknown, and
/// reads the rest as root does.
#[test]
fn a_cgroup_it_may_not_read_is_named_not_left_out_silently() {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let pod = Pod::new(&host.cpu, "scan-private");
    std::fs::set_permissions(pod.tight.dir(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod 700 the tight cgroup");
    let as_root = scan(&[]);
    row(&as_root, &pod.tight);

    let out = common::as_nobody(TRACER, &[])
        .args(["scan", "--json"])
        .output()
        .expect("run scan as nobody");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let as_nobody = rows(out);
    let named = |text: &str| {
        text.lines().any(|l| {
            l.contains("could not be read")
                && l.contains(pod.tight.path())
                && l.contains("read access")
        })
    };
    assert!(named(&stderr), "scan --json as nobody, stderr: {stderr}");
    let tight = row(&as_nobody, &pod.tight);
    assert!(
        tight["cpu_stat"].is_null() && tight["quota_ns"].is_null(),
        "{tight}"
    );
    assert_eq!(tight["limit"]["cgroup"], pod.parent.path(), "{tight}");
    // Read as root reads them; their counters may move between the two scans (a 7.2 guest's
    // parent counted a period in between), so what is compared is what does not.
    for cgroup in [&pod.parent, &pod.busy] {
        let (mine, roots) = (row(&as_nobody, cgroup), row(&as_root, cgroup));
        for key in ["cgroup_id", "quota_ns", "period_ns"] {
            assert_eq!(mine[key], roots[key], "{key}: {mine} vs {roots}");
        }
        for key in ["cgroup", "own", "cpus"] {
            assert_eq!(
                mine["limit"][key], roots["limit"][key],
                "{key}: {mine} vs {roots}"
            );
        }
        assert!(mine["cpu_stat"].is_object(), "{mine}");
    }

    let out = common::as_nobody(TRACER, &[])
        .arg("scan")
        .output()
        .expect("run scan as nobody");
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(named(&table), "scan as nobody: {table}");
}
