//! How a run ends early, on this host: SIGINT (Ctrl-C), SIGTERM, SIGHUP (a dropped ssh session)
//! and standard output's pipe losing its reader (`| head -1`). Each must end the run at once
//! with exit status 0, the probes detached, and the `--record` file complete (its `end` line
//! written, `report FILE` replaying it without a warning). A real throttled cgroup traced with
//! `--backend tracepoint` (or [`common::backend`]'s); needs root, kernel BTF and a cpu
//! hierarchy, otherwise it says why it cannot run (a failure under `CI=true`).
mod common;

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, ExitStatus, Stdio},
    time::Duration,
};

use common::{Cgroup, Running};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");

/// Longer than a start-up on a loaded machine; a run that has not ended by then never will.
const LIMIT: Duration = Duration::from_secs(60);

/// The tracer on `cgroup`, recording into `recording`, with `stdout` as its standard output.
fn tracer(cgroup: &Cgroup, recording: &Path, stdout: Stdio) -> Running {
    Running::spawn(
        Command::new(TRACER)
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
    let replay = Command::new(TRACER)
        .arg("report")
        .arg(recording)
        .output()
        .expect("run throttle-tracer report");
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
    let dir = tempfile::tempdir().unwrap();
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
    let dir = tempfile::tempdir().unwrap();
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
