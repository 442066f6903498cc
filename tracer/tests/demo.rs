//! `throttle-tracer demo` on this host, checked from the outside: its output, the cgroup
//! directory and the processes it leaves (none). Needs root, kernel BTF and a cgroup hierarchy
//! with the cpu controller (v1 or v2); otherwise each test says why it cannot run (a failure
//! under `CI=true`).
//!
//! The tests share the machine's CPUs, so they run one at a time.
use test_support as common;

use std::{
    fs,
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use common::{Cgroup, CpuHierarchy, Running};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
const PREFIX: &str = "throttle-tracer-demo-";

/// Processes of `pid`'s demo: its workload (`demo-workload ... --parent <pid>`).
fn workloads_of(pid: u32) -> Vec<u32> {
    let needle = format!("--parent\0{pid}\0");
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("demo-workload") && c.contains(&needle)
            })
        })
        .collect()
}

/// The cgroup the demo of `pid` makes, removed (its tasks killed) by the guard if a failed
/// test leaves it.
fn demo_cgroup(cpu: &CpuHierarchy, pid: u32) -> Cgroup {
    Cgroup::adopt(cpu, cpu.root.join(format!("{PREFIX}{pid}")))
}

/// The number after `label` on the line that contains it (e.g. "nr_throttled 6").
fn number_after(text: &str, label: &str) -> f64 {
    let rest = text
        .split_once(label)
        .unwrap_or_else(|| panic!("no {label:?} in\n{text}"))
        .1;
    let word: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    word.parse()
        .unwrap_or_else(|_| panic!("no number after {label:?} in\n{text}"))
}

/// A duration printed by the report ("158.9 ms", "2.001 s", "0 ns", "12.0 µs") after `label`, in ns.
fn duration_after(text: &str, label: &str) -> f64 {
    let rest = text
        .split_once(label)
        .unwrap_or_else(|| panic!("no {label:?} in\n{text}"))
        .1
        .trim_start();
    let mut words = rest.split_whitespace();
    let value: f64 = words
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::NAN);
    let scale = match words.next() {
        Some("ns") => 1.0,
        Some("µs") => 1e3,
        Some("ms") => 1e6,
        Some("s") => 1e9,
        other => panic!("unit {other:?} after {label:?} in\n{text}"),
    };
    value * scale
}

/// The stdout/stderr of a finished demo, and its independent checks.
fn check_demo_output(out: &Output, pid: u32, root: &Path) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("--- stdout\n{stdout}--- stderr\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "demo failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let cgroup = format!("/{PREFIX}{pid}");
    assert!(
        stdout.contains(&format!("cgroups: {cgroup};")),
        "the trace is limited to the demo cgroup"
    );
    // The detail block of the demo cgroup.
    let detail = stdout
        .split_once(&format!("\n{cgroup} (id "))
        .unwrap_or_else(|| panic!("no stops for {cgroup}:\n{stdout}"))
        .1;
    let stops = number_after(detail, "stops (per CPU)");
    let group_stops = number_after(detail, "group stops");
    let per_cpu = duration_after(detail, "stopped time      per-CPU");
    let wall = duration_after(detail, "   wall");
    let nr_throttled = number_after(detail, "nr_throttled");
    // "nr_throttled 6   throttled 158.9 ms": the time follows the next "throttled".
    let after_nr = detail
        .split_once("nr_throttled")
        .map_or("", |(_, rest)| rest);
    let throttled = duration_after(after_nr, "throttled");
    println!(
        "stops {stops} group {group_stops} per-CPU {per_cpu} wall {wall} nr_throttled \
         {nr_throttled} throttled {throttled}"
    );
    assert!(
        stops >= 1.0 && group_stops >= 1.0,
        "the demo cgroup was never stopped"
    );
    assert!(
        stops >= group_stops,
        "a group stop is one or more CPU stops"
    );
    assert!(per_cpu + 1e3 >= wall, "Σ per-CPU stops >= their union");
    assert!(nr_throttled >= 1.0, "cpu.stat saw no throttled period");
    // cpu.stat's throttled time is what the kernel added for the traced stops (the `kernel`
    // figure, its own clock), and close to their CLOCK_MONOTONIC sum (the backend sees each
    // stop's edges a little apart from the kernel's clock reads).
    let kernel = duration_after(detail, "   kernel");
    assert!(
        (throttled - kernel).abs() <= kernel * 0.01 + 1e5,
        "cpu.stat throttled {throttled} ns vs the traced stops' kernel time {kernel} ns in\n{detail}"
    );
    // On 6.18+ the kernel's clock of a stop starts at the first task it parks, which a busy
    // machine delays by milliseconds (a queued task is parked only when next picked): there
    // the stops may last longer than cpu.stat says, never shorter.
    let shorter = (throttled - per_cpu).max(0.0);
    let longer = (per_cpu - throttled).max(0.0);
    assert!(
        shorter <= per_cpu * 0.25 + 2e6
            && (common::task_based_throttle() || longer <= per_cpu * 0.25 + 2e6),
        "cpu.stat throttled {throttled} ns vs Σ per-CPU stops {per_cpu} ns in\n{detail}"
    );
    let overcount = number_after(detail, "overcount");
    assert!(
        (overcount - throttled / wall).abs() < 0.02,
        "overcount {overcount} vs {throttled} / {wall}"
    );
    // Two CPUs stopped at once count twice in cpu.stat, so it exceeds the wall-clock union;
    // not on 6.18+ when parks come late (above): there the kernel's count starts after ours.
    if stops > group_stops && !common::task_based_throttle() {
        assert!(
            overcount >= 0.99,
            "more than one CPU stopped at once, yet overcount {overcount} in\n{detail}"
        );
    }
    // The closing section repeats the same figures.
    assert!(stdout.contains("What the demo shows"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "stopped anyway {stops} per-CPU stops in {group_stops} group stops"
        )),
        "{stdout}"
    );
    // Its advice comes from the demand every backend measures: a burst, or why none fits (a
    // run that two bursts of requests made one, 100.4 ms, needs more burst than the quota,
    // which the kernel refuses).
    assert!(
        stdout.contains("cpu.cfs_burst_us >=")
            || stdout.contains("cpu.max.burst >=")
            || stdout.contains("or a burst     none: the largest run needs a burst of"),
        "{stdout}"
    );
    assert!(stdout.contains("Cleaned up: "), "{stdout}");

    // Independent checks: the cgroup directory is gone, no workload survives.
    let dir = root.join(format!("{PREFIX}{pid}"));
    assert!(!dir.exists(), "{} is still there", dir.display());
    assert_eq!(
        workloads_of(pid),
        Vec::<u32>::new(),
        "workload processes left"
    );
    stdout
}

/// `throttle-tracer demo` as root: the demo makes a cgroup of its own and sets its quota, which
/// cgroupfs lets root alone do (without_privileges_the_demo_says_so_and_makes_nothing checks
/// that it says so otherwise).
fn demo() -> Command {
    Command::new(TRACER)
}

#[test]
fn demo_traces_explains_and_cleans_up() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let child = Running::spawn(
        demo()
            .args(["demo", "--backend", &common::backend()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let pid = child.id();
    let _leftover = demo_cgroup(&host.cpu, pid);
    let out = child.wait_with_output();
    check_demo_output(&out, pid, &host.cpu.root);
}

#[test]
fn a_killed_demo_is_cleaned_up_by_the_next_one() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let mut first = Running::spawn(
        demo()
            .args(["demo", "--duration", "20s", "--backend", &common::backend()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let first_pid = first.id();
    let leftover = demo_cgroup(&host.cpu, first_pid);
    // Midway: the workload is running in the cgroup, and has been throttled.
    common::wait_until(
        Duration::from_secs(15),
        &format!(
            "the first demo's workload being throttled in {}",
            leftover.path()
        ),
        || !leftover.tasks().is_empty() && leftover.stat().nr_throttled >= 1,
    );
    first.kill().expect("SIGKILL the first demo");
    let _ = first.wait();

    assert!(
        leftover.dir().is_dir(),
        "a SIGKILLed demo cannot remove its cgroup"
    );
    // Its workload dies with it (PR_SET_PDEATHSIG).
    common::wait_until(
        Duration::from_secs(3),
        "the workload dying with its demo",
        || workloads_of(first_pid).is_empty(),
    );
    // Something still inside the leftover, which the next demo must kill.
    let mut sleeper = Running::spawn(Command::new("sleep").arg("600"));
    let sleeper_pid = sleeper.id();
    fs::write(leftover.dir().join("cgroup.procs"), sleeper_pid.to_string())
        .expect("move sleep into the leftover cgroup");
    // A workload process that already left /proc's view can still be listed in the cgroup
    // while it exits: start the next demo once the sleeper is
    // all that is left, so the count it reports is the count we know.
    common::wait_until(
        Duration::from_secs(5),
        "the leftover cgroup holding the sleeper alone",
        || leftover.tasks() == [sleeper_pid],
    );

    let second = Running::spawn(
        demo()
            .args(["demo", "--duration", "5s", "--backend", &common::backend()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let second_pid = second.id();
    let _second_leftover = demo_cgroup(&host.cpu, second_pid);
    let out = second.wait_with_output();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    check_demo_output(&out, second_pid, &host.cpu.root);
    assert!(
        stderr.contains(&format!(
            "removed /{PREFIX}{first_pid}, left behind by an earlier demo (pid {first_pid})"
        )) && stderr.contains("killed 1 task(s) still in it"),
        "{stderr}"
    );
    assert!(
        !leftover.dir().exists(),
        "{} is still there",
        leftover.dir().display()
    );
    let status = sleeper.wait().expect("reap sleep");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "sleep: {status}");
}

#[test]
fn bad_demo_options_are_usage_errors() {
    let out = common::tracer::command()
        .args(["demo", "--duration", "soon"])
        .output()
        .expect("run throttle-tracer demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("--duration"),
        "{stderr}"
    );
}

#[test]
fn without_privileges_the_demo_says_so_and_makes_nothing() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    // As nobody, with no capabilities.
    let child = common::as_nobody(TRACER, &[])
        .arg("demo")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the demo as nobody");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for the demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let mut lines = stderr.lines();
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("error: tracing needs root")),
        "{stderr}"
    );
    assert!(
        lines.next().is_some_and(|l| l.starts_with("hint: ")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout");
    // The tracer is the child itself: the demo's pid is the child's.
    assert!(!host.cpu.root.join(format!("{PREFIX}{pid}")).exists());
}
