//! Which threads each stop held (`--backend tracepoint` or [`common::backend`]'s, cgroup v1 or
//! v2), against the kernel's own account of each thread's waiting: `run_delay`, the second
//! field of /proc/PID/task/TID/schedstat, the time the thread spent runnable but not running.
//!
//! One process in a cgroup with a 20 ms / 100 ms quota: a thread `spinner` spinning alone on
//! the last CPU (pinned, the cgroup weighted so nothing else runs there while it has quota)
//! and a thread `sleeper` sleeping, next to the main thread waiting for both. The tracer runs
//! with `--pid`. Over a window of whole stops:
//! - the spinner's run_delay grows by at least the time the stops held it, and by no more
//!   than 2 % beyond it (it waits for nothing else);
//! - no stop names the sleeper or the main thread;
//! - the summary's process entry has the spinner's held time and count of stops.
//!
//! `run_delay` is added when the thread next runs, so a stop counts in the window it ended
//! in. Cost: about 6 s.
mod common;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use common::{Cgroup, Running};
use serde_json::Value;

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
/// How soon after its stop ends the spinner, its group's only runnable thread, has run again.
const SETTLE_NS: u64 = 20_000_000;

fn run_delay_ns(pid: u32, tid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
        .expect("schedstat (CONFIG_SCHEDSTATS or CONFIG_SCHED_INFO)");
    text.split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("schedstat: {text}"))
}

/// Whether `release` (`uname -r`) is 6.18 or later: the task-based throttle.
fn task_based(release: &str) -> bool {
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 18)
}

#[test]
fn each_stop_holds_the_spinning_thread_for_its_run_delay_and_never_the_sleeping_one() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let group = Cgroup::throttled(&host.cpu, "threads", 20_000, 100_000);
    let mut workload = common::spawn_in(
        common::pair(30).stdout(Stdio::piped()),
        &group,
        Some(common::last_cpu()),
    );
    let pid = workload.id();
    let mut ids = String::new();
    BufReader::new(workload.stdout.take().expect("workload stdout"))
        .read_line(&mut ids)
        .expect("the pair's thread ids");
    let ids: Vec<u32> = ids
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [spinner, sleeper] = ids[..] else {
        panic!("thread ids: {ids:?}");
    };

    let mut tracer = Running::spawn(
        Command::new(TRACER)
            .args(["--backend", &common::backend(), "--json"])
            .args(["--pid", &pid.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    );
    let (start, lines) = common::ndjson_lines(&mut tracer);
    // Past the stop in progress when the probes attached (its start was not seen).
    thread::sleep(Duration::from_millis(300));
    let (t0, delay0) = (common::monotonic_ns(), run_delay_ns(pid, spinner));
    thread::sleep(Duration::from_secs(4));
    let (t1, delay1) = (common::monotonic_ns(), run_delay_ns(pid, spinner));
    // The stop in progress at t1 ends within a period.
    thread::sleep(Duration::from_millis(300));
    assert!(tracer.interrupt().success());
    let lines: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(&l).expect("NDJSON"))
        .collect();

    let stops: Vec<&Value> = lines.iter().filter(|l| l["type"] == "stop").collect();
    let mut held_ns = 0;
    let mut held_stops = 0;
    let mut edge_ns = 0;
    for stop in &stops {
        // A stop that held no thread of the group has no `threads` (docs/ndjson.md).
        for t in stop["threads"].as_array().map_or(&[][..], Vec::as_slice) {
            let tid = t["tid"].as_u64().unwrap() as u32;
            assert!(
                tid != sleeper && tid != pid,
                "a sleeping thread was credited: {stop}"
            );
            assert_eq!(t["pid"], pid, "{stop}");
            let end = stop["end_ns"].as_u64().unwrap();
            // The scheduler adds a wait to run_delay when the thread runs again: a stop that
            // ended after t0, and long enough before t1 for the thread to have run, is in the
            // delta; one that ended just before t0 may be too (it is allowed for above the 2 %
            // bound), one that ended just before t1 may not be (left out: 5 ms short on the
            // host in CI).
            if tid != spinner {
                continue;
            }
            let held = t["held_ns"].as_u64().unwrap();
            if end > t0 && end + SETTLE_NS <= t1 {
                held_ns += held;
                held_stops += 1;
            } else if end <= t0 && end + SETTLE_NS > t0 {
                edge_ns += held;
            }
        }
    }
    let grown = delay1 - delay0;
    eprintln!(
        "threads: spinner {spinner}: {held_stops} stops held it {:.1} ms; run_delay grew {:.1} ms \
         ({:+.2} %)",
        held_ns as f64 / 1e6,
        grown as f64 / 1e6,
        (grown as f64 / held_ns as f64 - 1.0) * 100.0
    );
    assert!(
        held_stops >= 30,
        "{held_stops} stops held the spinner in 4 s"
    );
    // A few µs per stop lie between the tracer's timestamps and the scheduler's: 20 µs a
    // stop, 200 µs under emulation. The kprobe and fentry backends on the task-based throttle
    // (6.18+) date a wait from the throttle, not from the park that starts it
    // (docs/design.md): there the held time may exceed run_delay by that gap (7.2 in TCG:
    // 84 to 449 µs a stop), and only the 2 % bound below holds.
    let slack = if common::emulated() { 200_000 } else { 20_000 };
    if start["backend"] == "tracepoint" || !task_based(start["kernel"].as_str().unwrap_or("")) {
        assert!(
            grown + held_stops * slack >= held_ns,
            "run_delay grew {grown} ns, less than the {held_ns} ns the stops held it"
        );
    } else {
        eprintln!(
            "threads: the {} backend sees no park: no lower bound",
            start["backend"]
        );
    }
    assert!(
        (grown as f64 - held_ns as f64 - edge_ns as f64) <= held_ns as f64 * 0.02
            && (held_ns as f64 - grown as f64) <= held_ns as f64 * 0.02,
        "run_delay grew {grown} ns, not within 2 % of the {held_ns} ns the stops held it \
         (+ {edge_ns} ns of stops that ended just before the first reading)"
    );

    let summary = lines
        .iter()
        .find(|l| {
            l["type"] == "summary" && l["processes"].as_array().is_some_and(|p| !p.is_empty())
        })
        .expect("a summary with the process");
    let process = &summary["processes"][0];
    assert_eq!(process["pid"], pid, "{summary}");
    let threads = process["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "only the spinner was held: {process}");
    assert_eq!(threads[0]["tid"], spinner);
    assert_eq!(threads[0]["comm"], "spinner");
    let whole: u64 = stops
        .iter()
        .flat_map(|s| s["threads"].as_array().map_or(&[][..], Vec::as_slice))
        .map(|t| t["held_ns"].as_u64().unwrap())
        .sum();
    assert_eq!(threads[0]["held_ns"], whole, "{process}");
    assert_eq!(
        process["held_ns"], whole,
        "one thread: the process waited as long"
    );
    drop(workload);
}
