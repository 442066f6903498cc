//! Cgroups removed while they are traced, on this host (tracepoint backend, or
//! [`common::backend`]'s): a group removed while one of its CPUs is stopped, and new cgroups
//! made after it, one at the very same path. Judged against each group's own cpu.stat, read
//! by the test (the removed one's just before its removal) and the test's own clock.
//!
//! What the kernel reuses and what it does not, which is what could credit a stop to the wrong
//! group: a cgroup's id is its kernfs node id, allocated cyclically per hierarchy
//! (`idr_alloc_cyclic`, with a generation in the high 32 bits once the low ones wrap), so ids
//! are never reused within a hierarchy and a path made again gets a new id (the first test
//! shows it with the kernel's own numbers). Paths are reused, and so is memory: a removed
//! group's `task_group` and `cfs_rq`s are freed and the next groups' are often allocated at
//! the same addresses, which the eBPF maps key open stops and period readings by. Needs root,
//! kernel BTF and a cpu hierarchy, otherwise each test says why it cannot run (a failure under
//! `CI=true`).
use test_support as common;

use std::{fs, thread, time::Duration};

use common::{
    Cgroup, CpuStat,
    tracer::{self, Tracer},
};
use serde_json::Value;

/// A guard against hanging, not a timing assertion.
const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn cgroup_ids_are_never_reused_within_the_cpu_hierarchy() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    // The same path made and removed again and again, and other paths in between: every id
    // is larger than every id before it (the kernel's cyclic allocation), none comes back.
    let mut ids = Vec::new();
    for i in 0..100 {
        let tag = if i % 2 == 0 { "ids" } else { "ids-other" };
        let cgroup = Cgroup::new(&host.cpu, tag);
        ids.push(cgroup.id());
    }
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "cgroup ids made one after another: {ids:?}"
    );
    println!(
        "100 cgroups made and removed in turn (50 at one path): ids {} to {}, each larger",
        ids[0],
        ids[ids.len() - 1]
    );
}

/// A stop line's `end`.
fn end(stop: &Value) -> &str {
    stop["end"].as_str().unwrap_or_default()
}

/// `stops`, a group's, match its cpu.stat `stat` (a delta from zero: the group was made
/// before the tracer's baseline and ran nothing before it, or made after it): each ended at a
/// refill, one per throttled period (one busy thread, pinned), except that a stop which
/// outlasted k periods (a refill too small for the debt of a quota overrun by a tick, frequent
/// under TCG: a 7.2 guest, 15 stops in 20 throttled periods) stands for k + 1 of them; and
/// their kernel time is its throttled time to the nanosecond (v2: to the µs, `resolution_ns`).
fn assert_matches(stops: &[&Value], stat: CpuStat, resolution_ns: u64, what: &str) {
    let unrefilled: Vec<&&Value> = stops.iter().filter(|s| end(s) != "refill").collect();
    assert!(
        unrefilled.is_empty(),
        "{what}: stops not ended by a refill: {unrefilled:?}"
    );
    let kernel_ns = tracer::kernel_ns(stops);
    assert!(
        kernel_ns.abs_diff(stat.throttled_ns) <= resolution_ns,
        "{what}: Σ kernel_ns of its stops {kernel_ns} vs its cpu.stat {}",
        stat.throttled_ns
    );
    let outlasted: u64 = stops
        .iter()
        .map(|s| s["duration_ns"].as_u64().unwrap() / s["period_ns"].as_u64().unwrap().max(1))
        .sum();
    let count = stops.len() as u64;
    assert!(
        count <= stat.nr_throttled && stat.nr_throttled <= count + outlasted,
        "{what}: {count} stops ({outlasted} period(s) outlasted by one) vs its cpu.stat \
         nr_throttled {}",
        stat.nr_throttled
    );
    assert!(stat.nr_throttled >= 5, "{what} barely throttled: {stat:?}");
}

#[test]
fn a_cgroup_removed_while_stopped_keeps_its_summary_marked_gone_and_new_ones_are_their_own() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cpu = common::last_cpu();
    // 10 ms of a 500 ms period for one busy thread: stopped 490 ms of every 500, so the test
    // has time to act inside a stop once the tracer has said that one began.
    let old = Cgroup::throttled(&host.cpu, "removed", 10_000, 500_000);
    let path = old.path().to_owned();
    let old_id = old.id();
    let dir = common::tracer::output_dir();
    let recording = dir.path().join("removed.ndjson");
    let mut tracer = Tracer::start(&["--record", recording.to_str().unwrap()]);
    let mut workload = common::spawn_in(&mut common::busy(1, 60), &old, Some(cpu));

    let mut ended = 0;
    let fifth = tracer.wait_for(LIMIT, "five stops of the group", |v| {
        ended += u32::from(v["type"] == "stop" && v["cgroup_id"] == old_id);
        ended == 5
    });
    // The next stop begins once the thread has run its 10 ms after that refill (a tick, 4 ms
    // at HZ=250, later at most) and lasts to the next refill, 500 ms after it: 50 ms after the
    // refill the group is stopped. Then the task leaves for the root cgroup (rmdir needs an
    // empty cgroup; a SIGKILLed task would have to run to exit, and it runs again only at the
    // refill), the group's cpu.stat is read, and the group removed, its cfs_rq still
    // throttled.
    let refilled_ns = fifth["end_ns"].as_u64().expect("end_ns");
    let inside = refilled_ns + 50_000_000;
    thread::sleep(Duration::from_nanos(
        inside.saturating_sub(common::monotonic_ns()),
    ));
    let moved_ns = common::monotonic_ns();
    fs::write(
        host.cpu.root.join("cgroup.procs"),
        workload.id().to_string(),
    )
    .expect("move the workload to the root cgroup");
    let old_stat = old.stat();
    drop(old);
    let removed_ns = common::monotonic_ns();
    let _ = workload.kill();
    let _ = workload.wait();

    // New cgroups, each with a busy thread: one at the removed one's path, three beside it.
    let new: Vec<Cgroup> = ["removed", "removed-a", "removed-b", "removed-c"]
        .iter()
        .map(|tag| Cgroup::throttled(&host.cpu, tag, 20_000, 100_000))
        .collect();
    assert_eq!(new[0].path(), path, "made again at the same path");
    let mut runs: Vec<_> = new
        .iter()
        .map(|cg| common::spawn_in(&mut common::busy(1, 2), cg, Some(cpu)))
        .collect();
    for run in &mut runs {
        assert!(run.wait().expect("wait for the workload").success());
    }
    let new_stats: Vec<CpuStat> = new.iter().map(Cgroup::stat).collect();
    let lines = tracer.stop();

    // The removed group: its stops before the removal are its cpu.stat read just before it;
    // the stop open at the removal ended then, as cgroup_gone (the kernel never accounts it);
    // nothing of it after.
    let stops = tracer::of(&lines, "stop", old_id);
    let (gone, before): (Vec<&Value>, Vec<&Value>) =
        stops.iter().copied().partition(|s| end(s) == "cgroup_gone");
    assert_eq!(gone.len(), 1, "one stop ended by the removal: {stops:?}");
    let gone = gone[0];
    let gone_start = gone["start_ns"].as_u64().unwrap();
    assert!(
        (refilled_ns..inside).contains(&gone_start),
        "the stop open at the removal began at {gone_start}, the one before ended at {refilled_ns}"
    );
    let gone_end = gone["end_ns"].as_u64().unwrap();
    assert!(
        (moved_ns..=removed_ns).contains(&gone_end),
        "it ended at {gone_end}, the removal was between {moved_ns} and {removed_ns}"
    );
    assert!(gone["kernel_ns"].is_null(), "{gone}");
    let resolution = host.cpu.throttled_resolution_ns();
    assert_matches(&before, old_stat, resolution, "the removed group");
    let late: Vec<&Value> = lines
        .iter()
        .filter(|v| v["cgroup_id"] == old_id && v["type"] != "summary")
        .filter(|v| v["end_ns"].as_u64().or(v["start_ns"].as_u64()) > Some(removed_ns))
        .collect();
    assert!(
        late.is_empty(),
        "lines of the removed group after its removal: {late:?}"
    );
    let summary = tracer::of(&lines, "summary", old_id);
    assert_eq!(summary.len(), 1, "one summary of the removed group");
    let summary = summary[0];
    assert_eq!(summary["gone"], true, "{summary}");
    assert_eq!(summary["cgroup"], path.as_str(), "{summary}");
    assert!(summary["cpu_stat"].is_null(), "{summary}");
    assert_eq!(summary["end_reasons"]["cgroup_gone"], 1, "{summary}");
    assert_eq!(summary["open"], 0, "{summary}");

    // The new groups: new ids, each one's stops its own cpu.stat, none gone.
    for (cgroup, stat) in new.iter().zip(new_stats) {
        let id = cgroup.id();
        assert!(id > old_id, "{} got id {id} after {old_id}", cgroup.path());
        let what = format!("the new {} (id {id})", cgroup.path());
        assert_matches(&tracer::of(&lines, "stop", id), stat, resolution, &what);
        let summary = tracer::of(&lines, "summary", id);
        assert_eq!(summary.len(), 1, "{what}: one summary");
        assert_eq!(summary[0]["cgroup"], cgroup.path(), "{}", summary[0]);
        assert!(summary[0].get("gone").is_none(), "{}", summary[0]);
        assert_eq!(
            summary[0]["cpu_stat"]["throttled_ns"], stat.throttled_ns,
            "{what}: its summary's cpu.stat delta is its own"
        );
    }

    // The text report of the recording names the removed group as such.
    let report = common::tracer::report(&recording);
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{text}");
    assert!(
        text.contains(&format!("{path} (id {old_id})  removed during the trace\n")),
        "{text}"
    );
    println!(
        "removed {path} (id {old_id}) {:.1} ms into a stop: {} stops before = its cpu.stat \
         ({} ns), the open one ended cgroup_gone; 4 new groups (one at its path) each = its own \
         cpu.stat",
        (moved_ns - gone_start) as f64 / 1e6,
        old_stat.nr_throttled,
        old_stat.throttled_ns
    );
}
