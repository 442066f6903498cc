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
use test_support as common;

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    thread,
    time::Duration,
};

use common::{Cgroup, Running, tracer::Tracer};
use serde_json::Value;

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

/// Judges `held_ns`, the time `stops` stops held the spinner (its only wait), against `grown`,
/// its run_delay growth over a window holding those stops whole (`edge_ns`: stops ended so
/// close before it that their wait may be in it):
/// - at least the held time, less 20 µs a stop (200 µs emulated) between the two clocks; the
///   kprobe and fentry backends on 6.18+ date a wait from the throttle, not the park, so there
///   only the 2 % bound holds (docs/design.md);
/// - at most 2 % above it plus a tick a stop: an unthrottle reschedules only an idle CPU
///   (unthrottle_cfs_rq), so on a busy one the spinner waits for the next tick, in run_delay.
fn judge_run_delay(start: &Value, held_ns: u64, stops: u64, grown: u64, edge_ns: u64) {
    let slack = if common::emulated() { 200_000 } else { 20_000 };
    if start["backend"] == "tracepoint"
        || !common::kernel::task_based_throttle(start["kernel"].as_str().unwrap_or(""))
    {
        assert!(
            grown + stops * slack >= held_ns,
            "run_delay grew {grown} ns, less than the {held_ns} ns the stops held it"
        );
    } else {
        eprintln!(
            "threads: the {} backend sees no park: no lower bound",
            start["backend"]
        );
    }
    let tick = common::tick_ns();
    let (held, grown) = (held_ns as f64, grown as f64);
    assert!(
        grown - held - edge_ns as f64 <= held * 0.02 + (stops * tick) as f64
            && held - grown <= held * 0.02,
        "run_delay grew {grown} ns, not within 2 % (+ a {tick} ns tick a stop above) of the \
         {held_ns} ns {stops} stops held it (+ {edge_ns} ns of stops that ended just before \
         the window)"
    );
}

/// `throttle-workload pair` running in a cgroup, its spinner pinned to the last CPU; killed
/// on drop.
struct Pair {
    workload: Running,
    pid: u32,
    spinner: u32,
    sleeper: u32,
}

impl Pair {
    fn start(group: &Cgroup) -> Self {
        let mut workload = common::spawn_in(
            common::pair(30).stdout(Stdio::piped()),
            group,
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
        Self {
            workload,
            pid,
            spinner,
            sleeper,
        }
    }
}

#[test]
fn each_stop_holds_the_spinning_thread_for_its_run_delay_and_never_the_sleeping_one() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let group = Cgroup::throttled(&host.cpu, "threads", 20_000, 100_000);
    let Pair {
        workload,
        pid,
        spinner,
        sleeper,
    } = Pair::start(&group);

    let mut tracer = Running::spawn(
        common::tracer::command()
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
    // A stop whose refill no program saw ends when the next throttle opens the next stop
    // (within 100 µs of it), holding the spinner past the time it ran again: the family
    // `host_tracepoint::one_thread_stops_last_the_rest_of_the_period` allows one of a run.
    // One is left out of the sum; more fail.
    let ns_of = |s: &Value, key: &str| s[key].as_u64().unwrap_or(0);
    let mut by_start = stops.clone();
    by_start.sort_by_key(|s| ns_of(s, "start_ns"));
    let late: Vec<u64> = by_start
        .windows(2)
        .filter(|w| ns_of(w[1], "start_ns").saturating_sub(ns_of(w[0], "end_ns")) <= 100_000)
        .map(|w| ns_of(w[0], "start_ns"))
        .collect();
    assert!(late.len() <= 1, "stops ended late: {late:?}");
    let mut held_ns = 0;
    let mut held_stops = 0;
    let mut edge_ns = 0;
    for stop in stops
        .iter()
        .filter(|s| !late.contains(&ns_of(s, "start_ns")))
    {
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
    judge_run_delay(&start, held_ns, held_stops, grown, edge_ns);

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

/// A thread's comm, from /proc.
fn comm(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/task/{tid}/comm: {e}"))
        .trim_end()
        .to_owned()
}

/// A duration as the text report prints it (`3.215 s`, `812.3 ms`, `20.1 µs`, `123 ns`), ns.
fn text_ns(value: &str, unit: &str) -> f64 {
    let value: f64 = value.parse().unwrap_or_else(|e| panic!("{value:?}: {e}"));
    let scale = match unit {
        "s" => 1e9,
        "ms" => 1e6,
        "µs" => 1e3,
        "ns" => 1.0,
        _ => panic!("unit {unit:?}"),
    };
    value * scale
}

/// The text summary of a `--pid` run (the "held" block and the `--pid` line) against the
/// kernel's figures, the quota (20 ms / 100 ms) set after the tracer starts and removed before
/// it stops, run_delay and cpu.stat read just outside, so every stop lies whole between them:
/// - the held time is the run_delay growth as [`judge_run_delay`] judges it;
/// - the stops are the window's throttled periods within 2 % or one (the last, ended by the
///   quota's removal, is in no period's count);
/// - p99 is at most a period (+10 ms for a late refill timer);
/// - the comm is the spinner's own: a process is named by its first thread held when its
///   main thread never is (docs/ndjson.md), and the sleeper is never named.
#[test]
fn the_text_summary_and_the_pid_line_show_the_stops_and_the_wait_the_kernel_counted() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let group = Cgroup::new(&host.cpu, "threads-text");
    group.favour();
    let pair = Pair::start(&group);
    let pid = pair.pid;
    let spinner_comm = comm(pid, pair.spinner);
    let process_comm = comm(pid, pid);
    let dir = common::tracer::output_dir();
    let recording = dir.path().join("threads.ndjson");
    let mut tracer = Running::spawn(
        common::tracer::command()
            .args(["--backend", &common::backend()])
            .args(["--pid", &pid.to_string(), "--record"])
            .arg(&recording)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    );
    common::tracer::wait_recorded_start(&recording);
    let (stat0, delay0) = (group.stat(), run_delay_ns(pid, pair.spinner));
    group.set_quota(Some(20_000), 100_000);
    thread::sleep(Duration::from_secs(4));
    group.write_quota(None);
    // The spinner runs again at once: its last wait is in run_delay well within this.
    thread::sleep(Duration::from_millis(300));
    let (stat1, delay1) = (group.stat(), run_delay_ns(pid, pair.spinner));
    assert!(tracer.interrupt().success());
    let text = String::from_utf8(tracer.wait_with_output().stdout).unwrap();
    println!("{text}");

    let grown = delay1 - delay0;
    let throttled = stat1.nr_throttled - stat0.nr_throttled;
    let start: Value = serde_json::from_str(
        std::fs::read_to_string(&recording)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    // `pid N (comm)  stops  held  p99` in the held block, `tid T (comm)  stops  held` below.
    let held_line = |who: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{who} ")) && !l.contains(':'))
            .unwrap_or_else(|| panic!("no held line of {who}:\n{text}"))
            .trim_start()
            .strip_prefix(who)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<&str>>()
    };
    let process = held_line(&format!("pid {pid} ({spinner_comm})"));
    let spinner_line = held_line(&format!("tid {} ({spinner_comm})", pair.spinner));
    assert!(
        !text.contains(&format!("tid {} ", pair.sleeper)) && !text.contains(&format!("tid {pid} ")),
        "the sleeping or the main thread was named:\n{text}"
    );
    // `pid N (comm): X stops, Y held, p99 Z`, named as the process is (its main thread's
    // comm), though only its spinner waits.
    let asked = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("pid {pid} ({process_comm}): ")))
        .unwrap_or_else(|| panic!("no --pid line for {pid}:\n{text}"));
    let words: Vec<&str> = asked.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    let ["stops", "held", "p99"] = [words[1], words[4], words[5]] else {
        panic!("--pid line: {asked}");
    };
    assert!(throttled >= 30, "{throttled} throttled periods in 4 s");
    for (what, stops, held) in [
        ("held block", process[0], (process[1], process[2])),
        (
            "thread line",
            spinner_line[0],
            (spinner_line[1], spinner_line[2]),
        ),
        ("--pid line", words[0], (words[2], words[3])),
    ] {
        let stops: u64 = stops.parse().unwrap();
        // Printed to 4 digits: good to 0.05 %.
        let held = text_ns(held.0, held.1) as u64;
        println!(
            "{what}: {stops} stops, {:.1} ms held; cpu.stat: {throttled} throttled periods; \
             run_delay grew {:.1} ms ({:+.2} %)",
            held as f64 / 1e6,
            grown as f64 / 1e6,
            (grown as f64 / held as f64 - 1.0) * 100.0
        );
        assert!(
            (stops as f64 - throttled as f64).abs() <= (throttled as f64 * 0.02).max(1.0),
            "{what}: {stops} stops vs {throttled} throttled periods"
        );
        judge_run_delay(&start, held, stops, grown, 0);
    }
    for p99 in [text_ns(process[3], process[4]), text_ns(words[6], words[7])] {
        assert!(p99 <= 110e6, "p99 {p99} ns past a 100 ms period:\n{text}");
    }
    drop(pair);
}

/// More of the group's threads held in one stop than a stop lists: twelve spinning threads
/// pinned to the last CPU in a group at 20 ms / 100 ms, next to a spinning process outside the
/// group on the same CPU. Every stop lists at most 8 threads, each the workload's (none of
/// the neighbour's, none twice) held for 80 – 100 % of the stop, its listed plus
/// `threads_unlisted` at least the tasks queued at its throttle, and in at least 80 % of the
/// stops at least the 12 the workload says spin there.
#[test]
fn a_stop_holding_twelve_threads_lists_eight_and_counts_the_rest() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cpu = Some(common::last_cpu());
    let group = Cgroup::throttled(&host.cpu, "threads-twelve", 20_000, 100_000);
    let outside = Cgroup::new(&host.cpu, "threads-outside");
    // The tracer first: started beside a CPU the spinners hold, it would start at half speed
    // under emulation, where one emulator thread runs both vCPUs.
    let mut tracer = Tracer::start(&["--cgroup", group.path()]);
    let blind = tracer.start["disabled_features"]
        .as_array()
        .is_some_and(|d| d.iter().any(|f| f == "tasks"));
    if !common::applies(if blind {
        Err("this backend cannot count the tasks queued at a throttle")
    } else {
        Ok(())
    }) {
        return;
    }
    let mut workload = common::spawn_in(common::busy(12, 60).stdout(Stdio::piped()), &group, cpu);
    let neighbour = common::spawn_in(&mut common::busy(1, 60), &outside, cpu);
    // The workload's own word for which threads spin and from when: a thread just created is
    // runnable (state R in /proc) before it has started to spin.
    let (spinners, from_ns) = spinning_threads(&mut workload);
    assert_eq!(spinners.len(), 12, "{spinners:?}");
    // The stops of the first few hundred ms after that can count fewer queued at the throttle
    // (a 6.12 guest: 10, 10, 10, 11, then 12 in every stop): the stops judged start a second
    // later.
    let spinning = from_ns + 1_000_000_000;
    let pid = workload.id();
    let outsiders: Vec<u64> = neighbour
        .thread_ids()
        .into_iter()
        .chain([neighbour.id()])
        .map(u64::from)
        .collect();
    let mut seen = 0;
    tracer.wait_for(Duration::from_secs(30), "ten stops", |l| {
        seen += usize::from(l["type"] == "stop" && l["start_ns"].as_u64() > Some(spinning));
        seen >= 10
    });
    // The spinners end before the tracer does: detaching its programs can wait for every task
    // to switch of its own accord (an RCU-tasks grace period), which they hold off as long as
    // they spin (5.10 and 6.1 guests: up to the workload's whole minute). Stops judged began
    // before that.
    let killed_ns = common::monotonic_ns();
    drop(workload);
    drop(neighbour);
    let lines = tracer.stop();
    let stops: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["type"] == "stop"
                && l["cgroup"] == group.path()
                && l["start_ns"].as_u64() > Some(spinning)
                && l["start_ns"].as_u64() < Some(killed_ns)
        })
        .collect();
    // A stop first seen at its refill cannot name what it held: the refill's walk sees no
    // task of the group, and the record says so (no `pid`, `tasks` 0). On 6.18 a stop can be
    // first seen at its refill, no context switch seen in between (the missed observations of
    // docs/kernel.md section 2.1): one such stop a run is allowed; every other must be whole.
    let seen_at_refill = |stop: &&&Value| stop["pid"].is_null() && stop["tasks"] == 0;
    let late = stops.iter().filter(seen_at_refill).count();
    assert!(
        late <= 1,
        "{late} stops first seen at their refill, with no task"
    );
    let (mut listed, mut unlisted, mut short) = (Vec::new(), Vec::new(), Vec::new());
    for stop in stops.iter().filter(|s| !seen_at_refill(s)) {
        let threads = stop["threads"].as_array().map_or(&[][..], Vec::as_slice);
        let more = stop["threads_unlisted"].as_u64().unwrap_or(0);
        listed.push(threads.len());
        unlisted.push(more);
        assert!(threads.len() <= 8, "more than 8 listed: {stop}");
        let queued = stop["tasks"].as_u64().unwrap_or(0);
        assert!(
            threads.len() as u64 + more >= queued,
            "fewer held than the {queued} tasks queued at the throttle: {stop}"
        );
        if threads.len() as u64 + more < 12 {
            short.push(stop["start_ns"].as_u64().unwrap_or(0));
        }
        let mut tids: Vec<u64> = threads.iter().map(|t| t["tid"].as_u64().unwrap()).collect();
        let length = stop["duration_ns"].as_u64().unwrap();
        for (t, tid) in threads.iter().zip(&tids) {
            assert_eq!(t["pid"], pid, "{stop}");
            // The main thread too, runnable between printing the spinners' ids and its join.
            assert!(
                (spinners.contains(tid) || *tid == u64::from(pid)) && !outsiders.contains(tid),
                "tid {tid} is none of the workload's threads: {stop}"
            );
            // Runnable throughout, each waits from the throttle (on 6.18+, from its park, a
            // few ms later) to the refill.
            let held = t["held_ns"].as_u64().unwrap_or(0);
            assert!(
                held <= length && held * 5 >= length * 4,
                "tid {tid} held for {held} ns of the {length} ns stop: {stop}"
            );
        }
        // The task running at the throttle, if seen, is the group's.
        assert!(
            stop["pid"].is_null() || stop["pid"] == pid,
            "the running task is not the group's: {stop}"
        );
        tids.sort_unstable();
        tids.dedup();
        assert_eq!(tids.len(), threads.len(), "a thread listed twice: {stop}");
    }
    println!(
        "figure: {} stops: listed {:?}, unlisted {:?}",
        stops.len(),
        listed,
        unlisted
    );
    assert!(stops.len() >= 10, "{} stops", stops.len());
    // In VM guests an occasional stop finds fewer than the twelve queued at its throttle (7 to
    // 11 of 12), its other figures whole; why is not known yet, so those stops are bounded,
    // not excused.
    assert!(
        short.len() * 5 <= stops.len(),
        "{} of {} stops held fewer than the 12 spinning threads (starting at {short:?}): \
         listed {listed:?}, unlisted {unlisted:?}",
        short.len(),
        stops.len()
    );
}

/// The `tids …` and `spinning from_ns …` lines `throttle-workload busy` prints once every
/// thread spins: the spinners' ids, and the CLOCK_MONOTONIC time from which all of them do.
fn spinning_threads(workload: &mut Running) -> (Vec<u64>, u64) {
    let stdout = workload.stdout.take().expect("workload stdout");
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let tids = lines.next().expect("the workload's tids line");
    let from = lines.next().expect("the workload's spinning line");
    let spinners = tids
        .strip_prefix("tids ")
        .expect("tids …")
        .split(' ')
        .map(|t| t.parse().expect("a tid"))
        .collect();
    let from_ns = from
        .split(' ')
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("spinning from_ns N …: {from}"));
    (spinners, from_ns)
}
