//! How a run ends early, on this host: SIGINT (Ctrl-C), SIGTERM, SIGHUP (a dropped ssh session)
//! and standard output's pipe losing its reader (`| head -1`). Each must end the run at once
//! with exit status 0, the probes detached, and the `--record` file complete (its `end` line
//! written, `report FILE` replaying it without a warning). A real throttled cgroup traced with
//! `--backend tracepoint` (or [`common::backend`]'s); needs root, kernel BTF and a cpu
//! hierarchy, otherwise it says why it cannot run (a failure under `CI=true`).
use test_support as common;

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use common::{Cgroup, Running};

/// Longer than a start-up on a loaded machine; a run that has not ended by then never will.
const LIMIT: Duration = Duration::from_secs(60);

/// The tracer on `cgroup`, recording into `recording`, with `stdout` as its standard output.
fn tracer(cgroup: &Cgroup, recording: &Path, stdout: Stdio) -> Running {
    Running::spawn(
        common::tracer::command()
            .args(["--backend", &common::backend(), "--json", "--cgroup"])
            .arg(cgroup.path())
            .arg("--record")
            .arg(recording)
            .stdout(stdout)
            .stderr(Stdio::inherit()),
    )
}

/// Waits for `tracer` to exit by itself.
fn ended(tracer: &mut Running, why: &str) -> ExitStatus {
    let mut status = None;
    common::wait_until(LIMIT, &format!("the tracer ending after {why}"), || {
        status = tracer.try_wait().expect("wait for the tracer");
        status.is_some()
    });
    status.expect("an exit status")
}

/// The recording is complete: it ends with the `end` line, and `report` replays it silently.
fn assert_complete(recording: &Path, why: &str) {
    let text = fs::read_to_string(recording).unwrap();
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(r#"{"type":"end""#),
        "after {why}, the recording ends with `{last}`"
    );
    let replay = common::tracer::report(recording);
    let stderr = String::from_utf8_lossy(&replay.stderr);
    assert!(replay.status.success(), "report after {why}: {stderr}");
    assert!(stderr.is_empty(), "report after {why} warns: {stderr}");
}

#[test]
fn signals_end_the_run_with_its_summary_and_a_complete_recording() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cgroup = Cgroup::throttled(&host.cpu, "endings-signal", 30_000, 100_000);
    let dir = common::tracer::output_dir();
    for (signal, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let recording = dir.path().join(format!("{name}.ndjson"));
        let mut tracer = tracer(&cgroup, &recording, Stdio::piped());
        common::tracer::wait_recorded_start(&recording);
        let workload = common::spawn_in(&mut common::busy(2, 1), &cgroup, None).wait();
        assert!(workload.expect("run throttle-workload").success());
        // SAFETY: signalling our own unreaped child by pid.
        unsafe { libc::kill(tracer.id() as i32, signal) };
        let status = ended(&mut tracer, name);
        assert!(status.success(), "after {name}: {status}");
        let output = tracer.wait_with_output();
        let stdout = String::from_utf8(output.stdout).unwrap();
        let summaries = stdout
            .lines()
            .filter(|l| l.contains(r#""type":"summary""#) && l.contains(cgroup.path()))
            .count();
        assert_eq!(
            summaries, 1,
            "after {name}, the stream's summary:\n{stdout}"
        );
        assert_complete(&recording, name);
        println!("{name}: exit 0, summary on stdout, recording complete");
    }
}

#[test]
fn a_closed_output_pipe_ends_the_run_at_once() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    // Nothing stops in this cgroup: the tracer has nothing to write after its start line, so
    // only watching the pipe can tell it that its reader is gone.
    let cgroup = Cgroup::new(&host.cpu, "endings-pipe");
    let dir = common::tracer::output_dir();
    let recording = dir.path().join("pipe.ndjson");
    let mut tracer = tracer(&cgroup, &recording, Stdio::piped());
    let mut stdout = BufReader::new(tracer.stdout.take().expect("piped stdout"));
    let mut start = String::new();
    stdout.read_line(&mut start).expect("read the start line");
    assert!(start.starts_with(r#"{"type":"start""#), "{start}");
    drop(stdout);
    let status = ended(&mut tracer, "its output pipe closed");
    assert!(status.success(), "after the pipe closed: {status}");
    assert_complete(&recording, "the pipe closed");
}

/// A recording cut short: the tracer SIGKILLed (nothing of it runs after the signal: no `end`
/// line, no summary) while the group it records is being stopped. `report FILE` says how far
/// the recording got, its last record's time (CLOCK_MONOTONIC and UTC, each within the test's
/// own clock readings around the run) and the stops it holds (= its `stop` lines, counted
/// here), reports those stops (the group's STOPS column = its `stop` lines) and exits 0.
#[test]
fn report_of_a_killed_recording_says_how_far_it_got() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cgroup = Cgroup::throttled(&host.cpu, "endings-kill", 30_000, 100_000);
    let dir = common::tracer::output_dir();
    let recording = dir.path().join("killed.ndjson");
    let began = (common::monotonic_ns(), jiff::Timestamp::now());
    let mut tracer = tracer(&cgroup, &recording, Stdio::null());
    common::tracer::wait_recorded_start(&recording);
    let _workload = common::spawn_in(&mut common::busy(2, 10), &cgroup, None);
    let stop_lines = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with(r#"{"type":"stop","#))
            .count()
    };
    common::wait_until(LIMIT, "five stops recorded", || {
        stop_lines(&fs::read_to_string(&recording).unwrap()) >= 5
    });
    tracer.kill().expect("SIGKILL the tracer");
    tracer.wait().expect("reap the tracer");
    let killed = (common::monotonic_ns(), jiff::Timestamp::now());

    let text = fs::read_to_string(&recording).unwrap();
    assert!(
        !text.contains(r#""type":"end""#),
        "a killed run wrote its end"
    );
    let stops = stop_lines(&text);
    let report = common::tracer::report(&recording);
    let stderr = String::from_utf8_lossy(&report.stderr);
    let stdout = String::from_utf8_lossy(&report.stdout);
    println!("{stops} stop lines; report's stderr: {stderr}{stdout}");
    assert_eq!(report.status.code(), Some(0), "{stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("warning: ") && l.contains("cut short"))
        .unwrap_or_else(|| panic!("no warning of the cut: {stderr}"));
    let after = |marker: &str| {
        warning
            .split_once(marker)
            .and_then(|(_, rest)| rest.split([' ', ')']).next())
            .unwrap_or_else(|| panic!("no {marker:?} in {warning}"))
    };
    assert_eq!(after("holds ").parse::<usize>(), Ok(stops), "{warning}");
    let last_ns: u64 = after("at monotonic ").parse().expect("a time in ns");
    let last_utc: jiff::Timestamp = after("ns (").parse().expect("an RFC 3339 time");
    assert!(
        (began.0..=killed.0).contains(&last_ns),
        "last record at {last_ns}, the run from {} to {}",
        began.0,
        killed.0
    );
    // The UTC time is printed to the µs, truncated.
    let micro = jiff::SignedDuration::from_micros(1);
    assert!(
        began.1 - micro <= last_utc && last_utc <= killed.1,
        "last record at {last_utc}, the run from {} to {}",
        began.1,
        killed.1
    );
    // The group's row: `PATH  STOPS  GROUP ...`.
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with(cgroup.path()))
        .unwrap_or_else(|| panic!("no row of {}: {stdout}", cgroup.path()))
        .split_whitespace()
        .collect();
    assert_eq!(row[1].parse::<usize>(), Ok(stops), "{row:?}");
}

/// A second tracer started while one runs, on the same cgroup: both trace at once, each its own
/// whole window. The first runs over two rounds of throttling, the second over the second
/// round only; for each, Σ kernel_ns of its stops equals the cgroup's cpu.stat throttled-time
/// delta over its own window (read here while the group is idle, between the rounds), and it
/// ends with exit 0.
#[test]
fn two_tracers_at_once_each_trace_their_whole_window() {
    use common::tracer::{Tracer, accounted_ns};
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cgroup = Cgroup::throttled(&host.cpu, "endings-two", 50_000, 100_000);
    let round = || {
        let workload = common::spawn_in(&mut common::busy(2, 2), &cgroup, None).wait();
        assert!(workload.expect("run throttle-workload").success());
        cgroup.wait_refilled();
        cgroup.stat().throttled_ns
    };
    let first = Tracer::start(&["--cgroup", cgroup.path()]);
    let at_first = cgroup.stat().throttled_ns;
    let after_one = round();
    let second = Tracer::start(&["--cgroup", cgroup.path()]);
    let at_second = cgroup.stat().throttled_ns;
    let after_two = round();
    let (first, second) = (first.stop(), second.stop());
    let id = cgroup.id();
    let (first_ns, first_stops) = accounted_ns(&first, id);
    let (second_ns, second_stops) = accounted_ns(&second, id);
    println!(
        "first tracer: {first_stops} stops, {first_ns} ns vs cpu.stat {} ns; second: \
         {second_stops} stops, {second_ns} ns vs cpu.stat {} ns",
        after_two - at_first,
        after_two - at_second
    );
    assert!(
        after_one > at_first && after_two > at_second,
        "not throttled"
    );
    assert_eq!(first_ns, after_two - at_first, "the first tracer");
    assert_eq!(second_ns, after_two - at_second, "the second tracer");
}
