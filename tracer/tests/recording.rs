//! `--record FILE` then `throttle-tracer report FILE` on this host: the offline report is the
//! text report the live run printed at its end, byte for byte. A real throttled cgroup (v1 or
//! v2) traced with `--backend tracepoint` (or [`common::backend`]'s); needs root, kernel BTF
//! and a cpu hierarchy, otherwise it says why it cannot run (a failure under `CI=true`).
use test_support as common;

use std::{fs, process::Stdio};

use common::{Cgroup, Running};

#[test]
fn report_of_a_recording_is_what_the_run_printed() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    // The most CPU weight: other work on the machine could otherwise keep the group under its
    // quota.
    let cgroup = Cgroup::throttled(&host.cpu, "record", 30_000, 100_000);
    let name = cgroup.path();
    let dir = common::tracer::output_dir();
    let recording = dir.path().join("run.ndjson");

    let tracer = Running::spawn(
        common::tracer::command()
            .args([
                "--backend",
                &common::backend(),
                "--duration",
                "3s",
                "--cgroup",
            ])
            .arg(name)
            .arg("--record")
            .arg(&recording)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    );
    // The `start` line is in the file once the probes are attached; --duration counts from then.
    common::tracer::wait_recorded_start(&recording);

    let status = common::spawn_in(&mut common::busy(2, 2), &cgroup, None)
        .wait()
        .expect("run throttle-workload");
    assert!(status.success(), "workload: {status}");

    let live = tracer.wait_with_output();
    assert!(live.status.success(), "tracer: {}", live.status);
    let live = String::from_utf8(live.stdout).unwrap();

    let offline = common::tracer::report(&recording);
    let stderr = String::from_utf8_lossy(&offline.stderr);
    assert!(offline.status.success(), "report: {stderr}");
    assert!(
        stderr.is_empty(),
        "a complete recording: no warning: {stderr}"
    );
    let offline = String::from_utf8(offline.stdout).unwrap();
    println!("{live}");

    let records = fs::read_to_string(&recording).unwrap();
    let count = |t: &str| {
        records
            .lines()
            .filter(|l| l.contains(&format!(r#""type":"{t}""#)))
            .count()
    };
    println!(
        "recording: {} stop_begin, {} stop, {} unseen_start_stop, {} summary lines",
        count("stop_begin"),
        count("stop"),
        count("unseen_start_stop"),
        count("summary")
    );
    assert!(count("stop") >= 5, "the group was hardly stopped:\n{live}");
    assert!(live.contains(&format!("{name} (id ")), "{live}");
    assert!(live.contains("cpu.stat delta    nr_periods"), "{live}");
    assert_eq!(
        offline, live,
        "the offline report differs from the live one"
    );
}
