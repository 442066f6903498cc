//! The human summary printed when the trace ends: a header with the definitions, one overview
//! line per stopped cgroup (most stopped first), then each cgroup in detail with its log2
//! histograms, and the lost-record count last. A cgroup's path is followed by the name users
//! know it by (`names`) when the path holds more than its last component says.

use std::fmt::Write;

use super::CgroupReport;
use super::histogram::log2_rows;
use crate::aggregate::{Attributed, CgroupSummary, DurationSummary, HeldSummary, ProcessHeld};
use crate::cgroups::Version;
use crate::cpustat::CpuStat;
use crate::names::Name;
use crate::records::{Bandwidth, Lost};
use crate::schema::{End, Start};
use crate::units::spaced;

/// Widest cgroup path column in the overview; longer paths push their row right.
const MAX_PATH_COLUMN: usize = 48;

/// The whole summary, ready to print.
pub(super) fn render(info: &Start, reports: &[CgroupReport], totals: &End) -> String {
    let mut out = String::new();
    header(&mut out, info, totals);
    asked_pids(&mut out, info, reports);
    if reports.is_empty() {
        out.push_str("\nNo cgroup was stopped by its CPU quota while tracing.\n");
    } else {
        overview(&mut out, reports);
        for r in reports {
            detail(&mut out, r);
            super::advice_text::render(&mut out, r, info);
        }
    }
    footer(&mut out, reports, totals);
    out
}

fn header(out: &mut String, info: &Start, totals: &End) {
    let list = |items: &[String], none: &str| {
        if items.is_empty() {
            none.to_owned()
        } else {
            items.join(", ")
        }
    };
    let version = match info.cgroup_version {
        Some(Version::V1) => "cgroup v1",
        Some(Version::V2) => "cgroup v2",
        None => "cgroup hierarchy",
    };
    let _ = writeln!(
        out,
        "throttle-tracer: CFS bandwidth (CPU quota) stops, traced for {} ({} backend, kernel {})",
        spaced(totals.elapsed_ns),
        info.backend,
        info.kernel
    );
    // Recordings made before the lines had wall-clock times have none.
    if let (Some(unix_ns), Some(utc_offset_s)) = (info.start_unix_ns, info.utc_offset_s) {
        let _ = writeln!(
            out,
            "started at {} local time; the NDJSON lines also carry UTC",
            crate::wallclock::local_time(unix_ns, utc_offset_s)
        );
    }
    let _ = writeln!(
        out,
        "cpu controller: {version} at {}; cgroups: {}; probe features off: {}",
        info.cgroup_root.display(),
        list(&info.cgroups, "all"),
        list(&info.disabled, "none"),
    );
    if !info.backend_refused.is_empty() {
        let _ = writeln!(
            out,
            "backend {} chose {}; refused before it: {}",
            info.backend_requested,
            info.backend,
            info.backend_refused
                .iter()
                .map(|r| format!("{} ({})", r.backend, r.reason))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    if !info.blind_end_reasons.is_empty() {
        let _ = writeln!(
            out,
            "end reasons this kernel hides (counted as unknown): {}",
            info.blind_end_reasons.join(", ")
        );
    }
    out.push_str(
        "Times are CLOCK_MONOTONIC. A stop is one CPU's runqueue of a cgroup throttled until \
         unthrottled.\n\
         \x20 per-CPU   sum of stop lengths; N CPUs stopped together count N times, as cpu.stat does\n\
         \x20 wall      wall-clock time with at least one CPU of the cgroup stopped; one such\n\
         \x20           episode is a group stop\n\
         \x20 kernel    what the kernel added to cpu.stat throttled time for the traced stops\n\
         \x20 overcount cpu.stat throttled-time delta / wall\n",
    );
}

fn overview(out: &mut String, reports: &[CgroupReport]) {
    let names: Vec<String> = reports.iter().map(name).collect();
    let friendly: Vec<Option<String>> = reports.iter().map(friendly_name).collect();
    let name_column = if friendly.iter().any(Option::is_some) {
        "  NAME"
    } else {
        ""
    };
    let w = names
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .clamp(6, MAX_PATH_COLUMN);
    let _ = writeln!(
        out,
        "\n{:<w$}  {:>6} {:>6}  {:>10} {:>10}  {:>10} {:>10}  {:>10} {:>9}  {:>4}{name_column}",
        "CGROUP",
        "STOPS",
        "GROUP",
        "PER-CPU",
        "WALL",
        "P99",
        "MAX",
        "CPU.STAT",
        "OVERCOUNT",
        "OPEN"
    );
    for ((r, name), friendly) in reports.iter().zip(&names).zip(&friendly) {
        let s = &r.summary;
        let p = s.stops.percentiles;
        let _ = writeln!(
            out,
            "{name:<w$}  {:>6} {:>6}  {:>10} {:>10}  {:>10} {:>10}  {:>10} {:>9}  {:>4}{}",
            s.stops.count,
            s.group_stops.count,
            spaced(s.stops.sum_ns),
            spaced(s.group_stops.sum_ns),
            p.map_or("-".into(), |p| spaced(p.p99_ns)),
            p.map_or("-".into(), |p| spaced(p.max_ns)),
            r.cpu_stat
                .as_ref()
                .map_or("-".into(), |d| spaced(d.throttled_ns)),
            r.overcount().map_or("-".into(), |o| format!("{o:.2}x")),
            s.open_stops.len(),
            friendly
                .as_deref()
                .map_or(String::new(), |f| format!("  {f}")),
        );
        for a in &s.stopped_by_ancestor {
            let _ = writeln!(
                out,
                "{:<w$}  ^ {} stops, {} per-CPU: stopped by ancestor {}'s quota",
                "",
                a.stops,
                spaced(a.stopped_ns),
                attributed_name(a)
            );
        }
    }
}

fn attributed_name(a: &Attributed) -> String {
    a.path
        .clone()
        .unwrap_or_else(|| format!("(id {})", a.cgroup_id))
}

fn detail(out: &mut String, r: &CgroupReport) {
    let s = &r.summary;
    let _ = write!(out, "\n{} (id {})", name(r), s.cgroup_id);
    if let Some(friendly) = friendly_name(r) {
        let _ = write!(out, "  {friendly}");
    }
    if r.gone {
        out.push_str("  removed during the trace");
    }
    out.push('\n');
    if let Some(b) = &r.settings {
        let _ = writeln!(out, "  quota now         {}", bandwidth(b));
    }
    distribution_line(out, "stops (per CPU)", &s.stops);
    distribution_line(out, "group stops", &s.group_stops);
    let _ = writeln!(
        out,
        "  stopped time      per-CPU {}   wall {}   kernel {}",
        spaced(s.stops.sum_ns),
        spaced(s.group_stops.sum_ns),
        spaced(s.kernel_stop_ns)
    );
    cpu_stat(out, r);
    attributed(out, s);
    endings(out, s);
    lost(out, &r.lost);
    held(out, &s.held);
    histogram(out, "per-CPU stop lengths", &s.stops);
    histogram(out, "group stop lengths", &s.group_stops);
}

/// The cgroup's cpu.stat delta over the trace, and the cross-checks of the trace against it.
fn cpu_stat(out: &mut String, r: &CgroupReport) {
    match &r.cpu_stat {
        Some(d) => delta(out, r, d),
        None if r.gone => out.push_str(
            "  cpu.stat delta    unavailable: the cgroup was removed, its cpu.stat with it\n",
        ),
        None if r.unreadable => out.push_str(
            "  cpu.stat delta    unavailable: the cgroup is unreadable to the tracer (permission \
             denied)\n",
        ),
        // Not read at the end of the run, or a recording cut before its `summary` lines.
        None => out.push_str(
            "  cpu.stat delta    unavailable: not read at the end of the trace (or not \
             recorded)\n",
        ),
    }
}

/// The cpu.stat delta `d` of the cgroup's report `r`, and the trace's own account of it.
fn delta(out: &mut String, r: &CgroupReport, d: &CpuStat) {
    let s = &r.summary;
    let _ = write!(
        out,
        "  cpu.stat delta    nr_periods {}   nr_throttled {}   throttled {}",
        d.nr_periods,
        d.nr_throttled,
        spaced(d.throttled_ns)
    );
    if let Some(o) = r.overcount() {
        let _ = write!(out, "   overcount {o:.2}x");
    }
    out.push('\n');
    if let Some(local) = d.local_throttled_ns {
        let _ = writeln!(
            out,
            "  cpu.stat.local    throttled {} (own or ancestors' quota)",
            spaced(local)
        );
        if !s.stopped_by_ancestor.is_empty() {
            let ours = r.local_accounted_ns();
            let _ = writeln!(
                out,
                "  cross-check local own kernel time {} + ancestors' {} = {} vs \
                 cpu.stat.local {} (trace {}{})",
                spaced(s.kernel_accounted_ns()),
                spaced(ours - s.kernel_accounted_ns()),
                spaced(ours),
                spaced(local),
                if ours >= local { "+" } else { "-" },
                spaced(ours.abs_diff(local))
            );
        }
    }
    // The trace's own account of the same delta: ended stops plus the stops that began
    // before tracing. Stops still open are in neither.
    let ours = s.kernel_accounted_ns();
    let diff = ours.abs_diff(d.throttled_ns);
    let _ = write!(
        out,
        "  cross-check       traced kernel time {} + {} stop(s) begun before tracing {} \
         = {} vs cpu.stat {} (trace {}{})",
        spaced(s.kernel_stop_ns),
        s.unseen_start_stops,
        spaced(s.unseen_start_kernel_ns),
        spaced(ours),
        spaced(d.throttled_ns),
        if ours >= d.throttled_ns { "+" } else { "-" },
        spaced(diff)
    );
    if d.unit.resolution_ns() > 0 {
        let _ = write!(out, " (cpu.stat in µs: ±1 µs)");
    }
    out.push('\n');
}

/// The stops the cgroup owes to an ancestor's quota, and those its own quota made its
/// descendants'.
fn attributed(out: &mut String, s: &CgroupSummary) {
    for a in &s.stopped_by_ancestor {
        let _ = writeln!(
            out,
            "  stopped by ancestor {}'s quota: {} stops, per-CPU {}, kernel {}",
            attributed_name(a),
            a.stops,
            spaced(a.stopped_ns),
            spaced(a.kernel_ns)
        );
    }
    for a in &s.descendants {
        let _ = writeln!(
            out,
            "  stopped descendant {}: {} of these stops, per-CPU {}, kernel {}",
            attributed_name(a),
            a.stops,
            spaced(a.stopped_ns),
            spaced(a.kernel_ns)
        );
    }
    if s.children_unlisted_stops > 0 {
        let _ = writeln!(
            out,
            "  {} stop(s) stopped more than 8 children: the children past the 8th are not \
             credited with them",
            s.children_unlisted_stops
        );
    }
}

/// How its stops ended, those still open, and the records that were incomplete.
fn endings(out: &mut String, s: &CgroupSummary) {
    if !s.end_reasons.is_empty() {
        let reasons: Vec<String> = s
            .end_reasons
            .iter()
            .map(|(r, n)| format!("{} {n}", r.as_str()))
            .collect();
        let _ = writeln!(out, "  ended by          {}", reasons.join(", "));
    }
    if !s.open_stops.is_empty() {
        let open: Vec<String> = s
            .open_stops
            .iter()
            .map(|o| format!("cpu {} for {}", o.cpu, spaced(o.elapsed_ns)))
            .collect();
        let _ = writeln!(out, "  open at exit      {}", open.join(", "));
    }
    let anomalies: Vec<String> = [
        (s.kernel_unknown_stops, "stops without kernel time"),
        (
            s.unseen_start_kernel_unknown,
            "pre-trace stops without kernel time",
        ),
        (s.unmatched_ends, "ends without a traced start"),
        (s.restarted, "starts on an already stopped CPU"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if !anomalies.is_empty() {
        let _ = writeln!(out, "  incomplete        {}", anomalies.join(", "));
    }
}

/// Processes and threads listed per cgroup in the summary; the NDJSON has them all.
const MAX_PROCESSES: usize = 10;
const MAX_THREADS_SHOWN: usize = 4;

/// The processes and threads the cgroup's stops held (docs/definitions.md, "held").
fn held(out: &mut String, h: &HeldSummary) {
    if h.processes.is_empty() && h.unlisted == 0 {
        return;
    }
    out.push_str(
        "  held              process / thread        stops       held    p99 wait
",
    );
    for p in h.processes.iter().take(MAX_PROCESSES) {
        let p99 = p
            .waits
            .percentiles
            .map_or_else(|| "-".to_owned(), |q| spaced(q.p99_ns));
        let who = format!("pid {} ({})", p.pid, p.comm);
        let _ = writeln!(
            out,
            "                    {who:<22} {:>6} {:>10} {:>11}",
            p.waits.count,
            spaced(p.waits.sum_ns),
            p99
        );
        for t in p.threads.iter().take(MAX_THREADS_SHOWN) {
            let who = format!("tid {} ({})", t.tid, t.comm);
            let _ = writeln!(
                out,
                "                      {who:<20} {:>6} {:>10}",
                t.stops,
                spaced(t.held_ns)
            );
        }
        if p.threads.len() > MAX_THREADS_SHOWN {
            let _ = writeln!(
                out,
                "                      … {} more threads",
                p.threads.len() - MAX_THREADS_SHOWN
            );
        }
    }
    if h.processes.len() > MAX_PROCESSES {
        let _ = writeln!(
            out,
            "                    … {} more processes (all in the NDJSON summary)",
            h.processes.len() - MAX_PROCESSES
        );
    }
    if h.unlisted > 0 {
        let _ = writeln!(
            out,
            "                    {} more held thread(s), counted once per stop, not named              (past 8 per stop, or queued unseen)",
            h.unlisted
        );
    }
}

/// One line per `--pid` process: what the stops held of it, whichever cgroup's they were.
fn asked_pids(out: &mut String, info: &Start, reports: &[CgroupReport]) {
    for &pid in &info.pids {
        let found: Vec<&ProcessHeld> = reports
            .iter()
            .flat_map(|r| &r.summary.held.processes)
            .filter(|p| p.pid == pid)
            .collect();
        let Some(first) = found.first() else {
            let _ = writeln!(out, "pid {pid}: no stop held any of its threads");
            continue;
        };
        for p in &found {
            let p99 = p
                .waits
                .percentiles
                .map_or_else(String::new, |q| format!(", p99 {}", spaced(q.p99_ns)));
            let _ = writeln!(
                out,
                "pid {pid} ({}): {} stops, {} held{p99}",
                info.pid_comms
                    .iter()
                    .find(|p| p.pid == pid)
                    .map_or(&first.comm, |p| &p.comm),
                p.waits.count,
                spaced(p.waits.sum_ns)
            );
        }
    }
}

fn distribution_line(out: &mut String, label: &str, d: &DurationSummary) {
    let _ = write!(out, "  {label:<17} {}", d.count);
    if let Some(p) = d.percentiles {
        let _ = write!(
            out,
            "   p50 {}   p90 {}   p99 {}   max {}",
            spaced(p.p50_ns),
            spaced(p.p90_ns),
            spaced(p.p99_ns),
            spaced(p.max_ns)
        );
    }
    out.push('\n');
}

fn histogram(out: &mut String, title: &str, d: &DurationSummary) {
    let rows = log2_rows(&d.log2_ms, "ms");
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "  {title}:");
    for row in rows {
        let _ = writeln!(out, "  {row}");
    }
}

/// Which of a cgroup's figures its lost records leave incomplete.
fn lost(out: &mut String, lost: &Lost) {
    if lost.ends > 0 {
        let _ = writeln!(
            out,
            "  lost              {} stop ends: its stops, stopped times, percentiles, histograms \
             and group stops are lower bounds, the cross-check falls short by their kernel time \
             ({})",
            lost.ends,
            spaced(lost.kernel_ns)
        );
    }
    if lost.starts > 0 {
        let _ = writeln!(
            out,
            "  lost              {} stop starts: the figures are whole (an end carries its \
             stop), the stream lacks their stop_begin lines",
            lost.starts
        );
    }
    if lost.periods > 0 {
        let _ = writeln!(
            out,
            "  lost              {} periods: its demand and advice leave them out",
            lost.periods
        );
    }
    if lost.deferred > 0 {
        let _ = writeln!(
            out,
            "  lost              {} deferred-work records: the work waiting at the ends of \
             their periods is unknown or short",
            lost.deferred
        );
    }
}

fn footer(out: &mut String, reports: &[CgroupReport], totals: &End) {
    let _ = writeln!(
        out,
        "\nlost records: {}   malformed records: {}",
        totals.lost, totals.malformed
    );
    if totals.lost > 0 {
        let listed: u64 = reports.iter().map(|r| r.lost.total()).sum();
        let _ = writeln!(
            out,
            "WARNING: the ring buffer overflowed (--ring-buffer-size); each cgroup above says \
             what it lost, {} lost record(s) belong to no cgroup listed (every record of it \
             lost, or the kernel's count by cgroup full).",
            totals.lost.saturating_sub(listed)
        );
    }
    if let Some(missed) = totals.missed_runs.filter(|&n| n > 0) {
        let _ = writeln!(
            out,
            "WARNING: the kernel skipped {} run(s) of the tracer's programs (its recursion \
             guard: an interrupt during a program's run on that CPU); a refill missed so ends \
             its stop at the next observation, as `unknown`.",
            missed
        );
    }
    let evicted = totals.evicted_removed_cgroups.unwrap_or(0);
    let forgotten = totals.forgotten_paths.unwrap_or(0);
    let quiet = totals.forgotten_demand.unwrap_or(0);
    if evicted + forgotten + quiet > 0 {
        let _ = writeln!(
            out,
            "evicted to stay bounded: {evicted} removed cgroup(s) from the programs' map of \
             removed cgroups (the last 1024 kept), the paths of {forgotten} (the last 4096 kept), \
             the periods of {quiet} cgroup(s) that never stopped (the 1024 latest kept)."
        );
    }
}

fn name(r: &CgroupReport) -> String {
    r.path
        .clone()
        .unwrap_or_else(|| format!("cgroup id {}", r.summary.cgroup_id))
}

fn friendly_name(r: &CgroupReport) -> Option<String> {
    r.path.as_deref().and_then(Name::friendly)
}

fn bandwidth(b: &Bandwidth) -> String {
    let quota = b.quota_ns.map_or("max (no limit)".to_owned(), spaced);
    let period = b.period_ns.map_or("?".to_owned(), spaced);
    let mut s = format!("{quota} per {period} period");
    if let Some(burst) = b.burst_ns {
        let _ = write!(s, ", burst {}", spaced(burst));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::demo_report;

    fn info() -> Start {
        Start {
            backend: "kprobe".into(),
            kernel: "6.1.0-47-cloud-amd64".into(),
            cgroup_version: Some(Version::V1),
            cgroup_root: "/sys/fs/cgroup/cpu".into(),
            cgroups: vec![],
            disabled: vec![],
            blind_end_reasons: vec![],
            backend_requested: "auto".into(),
            backend_refused: vec![crate::schema::RefusedBackend {
                backend: "fentry".into(),
                reason: "EPERM".into(),
            }],
            ..Start::default()
        }
    }

    #[test]
    fn summary_has_every_figure() {
        let totals = End {
            lost: 0,
            malformed: 0,
            elapsed_ns: 12_300_000_000,
            missed_runs: None,
            evicted_removed_cgroups: None,
            forgotten_paths: None,
            forgotten_demand: None,
        };
        let text = render(&info(), &[demo_report()], &totals);
        println!("{text}");
        for needle in [
            "traced for 12.300 s (kprobe backend, kernel 6.1.0-47-cloud-amd64)",
            "cgroup v1 at /sys/fs/cgroup/cpu",
            "backend auto chose kprobe; refused before it: fentry (EPERM)",
            "CLOCK_MONOTONIC",
            "/demo (id 4242)",
            "quota now         20.0 ms per 100.0 ms period, burst 0 ns",
            "stops (per CPU)   3   p50 ",
            "max 80.0 ms",
            "group stops       2",
            "per-CPU 240.0 ms   wall 180.0 ms   kernel 240.0 ms",
            "nr_periods 4   nr_throttled 3   throttled 270.0 ms   overcount 1.50x",
            "cpu.stat.local    throttled 270.0 ms",
            "+ 1 stop(s) begun before tracing 30.0 ms = 270.0 ms vs cpu.stat 270.0 ms (trace +3.0 µs)",
            "ended by          refill 3",
            "open at exit      cpu 1 for 50.0 ms",
            "        64 -> 127        : 3        |****************************************|",
            "lost records: 0   malformed records: 0",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(!text.contains("WARNING"));
        assert!(!text.contains("incomplete "));
        assert!(!text.contains("NAME"), "no cgroup has a name users know");
    }

    #[test]
    fn friendly_names_follow_the_paths_that_need_them() {
        let id = "4c1f0e6a9b2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f";
        let mut docker = demo_report();
        docker.path = Some(format!("/system.slice/docker-{id}.scope"));
        let mut service = demo_report();
        service.path = Some("/system.slice/nginx.service".into());
        service.summary.cgroup_id = 7;
        let totals = End {
            lost: 0,
            malformed: 0,
            elapsed_ns: 1,
            missed_runs: None,
            evicted_removed_cgroups: None,
            forgotten_paths: None,
            forgotten_demand: None,
        };
        let text = render(&info(), &[docker, service], &totals);
        let overview: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("CGROUP"))
            .collect();
        assert!(overview[0].ends_with("OPEN  NAME"), "{text}");
        assert!(overview[1].ends_with("1  docker 4c1f0e6a9b2d"), "{text}");
        assert!(
            overview[2].ends_with("1"),
            "the unit's name is its path's: {text}"
        );
        assert!(
            text.contains(&format!(
                "docker-{id}.scope (id 4242)  docker 4c1f0e6a9b2d\n"
            )),
            "{text}"
        );
        assert!(
            text.contains("\n/system.slice/nginx.service (id 7)\n"),
            "{text}"
        );
    }

    /// Why a cgroup that exists has no cpu.stat delta: the tracer may not read it, or not.
    #[test]
    fn a_missing_cpu_stat_says_why() {
        let mut r = demo_report();
        r.cpu_stat = None;
        let totals = End::default();
        let said = |r: &CgroupReport| {
            render(&info(), std::slice::from_ref(r), &totals)
                .lines()
                .find(|l| l.starts_with("  cpu.stat delta"))
                .map(str::to_owned)
        };
        assert_eq!(
            said(&r).as_deref(),
            Some(
                "  cpu.stat delta    unavailable: not read at the end of the trace (or not \
                 recorded)"
            )
        );
        r.unreadable = true;
        assert_eq!(
            said(&r).as_deref(),
            Some(
                "  cpu.stat delta    unavailable: the cgroup is unreadable to the tracer \
                 (permission denied)"
            )
        );
    }

    #[test]
    fn gone_cgroup_lost_records_and_empty_runs_say_so() {
        let mut r = demo_report();
        r.path = None;
        r.cpu_stat = None;
        r.settings = None;
        r.gone = true;
        r.lost = Lost {
            starts: 1,
            ends: 3,
            periods: 0,
            deferred: 0,
            kernel_ns: 240_000_000,
        };
        r.summary.unmatched_ends = 2;
        let totals = End {
            lost: 7,
            malformed: 1,
            elapsed_ns: 1,
            missed_runs: None,
            evicted_removed_cgroups: None,
            forgotten_paths: None,
            forgotten_demand: None,
        };
        let text = render(&info(), &[r], &totals);
        assert!(
            text.contains("cgroup id 4242 (id 4242)  removed during the trace\n"),
            "{text}"
        );
        assert!(text.contains("cpu.stat delta    unavailable: the cgroup was removed"));
        assert!(text.contains("incomplete        2 ends without a traced start"));
        assert!(text.contains("lost records: 7   malformed records: 1\nWARNING"));
        assert!(
            text.contains("  lost              3 stop ends: its stops"),
            "{text}"
        );
        assert!(text.contains("by their kernel time (240.0 ms)"), "{text}");
        assert!(text.contains("  lost              1 stop starts: the figures are whole"));
        assert!(!text.contains("periods: its demand"), "{text}");
        assert!(
            text.contains("3 lost record(s) belong to no cgroup listed"),
            "{text}"
        );

        let text = render(&info(), &[], &totals);
        assert!(text.contains("No cgroup was stopped"));
    }
}
