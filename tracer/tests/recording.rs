//! `--record FILE` then `throttle-tracer report FILE` on this host: the offline report is the
//! text report the live run printed at its end, byte for byte. A real throttled cgroup v1
//! group traced with `--backend tracepoint`; needs root, kernel BTF and the cgroup v1 cpu
//! controller at /sys/fs/cgroup/cpu, otherwise it prints "skipped: reason".
mod common;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
const WORKLOAD: &str = env!("CARGO_BIN_EXE_throttle-workload");

/// The test's cgroup and processes; Drop kills them and removes the cgroup.
struct Scene {
    cgroup: PathBuf,
    children: Vec<Child>,
}

impl Drop for Scene {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for _ in 0..50 {
            if fs::remove_dir(&self.cgroup).is_ok() || !self.cgroup.exists() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.cgroup.display());
    }
}

#[test]
fn report_of_a_recording_is_what_the_run_printed() {
    if let Some(reason) = common::skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let name = format!("tt-record-{}", std::process::id());
    let cgroup = Path::new(common::CPU_ROOT).join(&name);
    fs::create_dir(&cgroup).expect("create cgroup");
    let mut scene = Scene {
        cgroup: cgroup.clone(),
        children: Vec::new(),
    };
    fs::write(cgroup.join("cpu.cfs_period_us"), "100000").unwrap();
    fs::write(cgroup.join("cpu.cfs_quota_us"), "30000").unwrap();
    // Other work on the machine could otherwise keep the group under its quota.
    fs::write(cgroup.join("cpu.shares"), "262144").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("run.ndjson");

    let tracer = Command::new(TRACER)
        .args(["--backend", "tracepoint", "--duration", "3s", "--cgroup"])
        .arg(format!("/{name}"))
        .arg("--record")
        .arg(&recording)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn throttle-tracer");
    scene.children.push(tracer);
    // The `start` line is in the file once the probes are attached; --duration counts from then.
    let attached = Instant::now();
    while fs::read_to_string(&recording).map_or(true, |t| !t.ends_with('\n')) {
        assert!(
            attached.elapsed() < Duration::from_secs(60),
            "the tracer recorded nothing (see its stderr above)"
        );
        thread::sleep(Duration::from_millis(20));
    }

    let mut workload = Command::new(WORKLOAD);
    workload.args(["busy", "--threads", "2", "--seconds", "2"]);
    let procs = std::ffi::CString::new(cgroup.join("cgroup.procs").to_str().unwrap()).unwrap();
    // SAFETY: between fork and exec only open/write/close, on memory prepared before the fork.
    unsafe {
        use std::os::unix::process::CommandExt;
        workload.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0\n".as_ptr().cast(), 2);
            libc::close(fd);
            if written != 2 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = workload.status().expect("run throttle-workload");
    assert!(status.success(), "workload: {status}");

    let tracer = scene.children.pop().unwrap();
    let live = tracer.wait_with_output().expect("wait for the tracer");
    assert!(live.status.success(), "tracer: {}", live.status);
    let live = String::from_utf8(live.stdout).unwrap();

    let offline = Command::new(TRACER)
        .arg("report")
        .arg(&recording)
        .output()
        .expect("run throttle-tracer report");
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
    assert!(live.contains(&format!("/{name} (id ")), "{live}");
    assert!(live.contains("cpu.stat delta    nr_periods"), "{live}");
    assert_eq!(
        offline, live,
        "the offline report differs from the live one"
    );
}
