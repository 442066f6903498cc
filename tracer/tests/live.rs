//! The live view (`--interval`) on this host, piped: timestamped plain blocks, checked against a
//! real throttled cgroup (v1 or v2) and its cpu.stat read here; and the usage errors of the
//! filters. The host tests need root, kernel BTF and a cpu hierarchy; otherwise they say why
//! they cannot run (a failure under `CI=true`).
mod common;

use std::{
    fs,
    io::Read as _,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use common::{Cgroup, Host, Running};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");

/// A throttled cgroup with one pinned busy thread in it; the guards kill the workload and
/// remove the cgroup, also when an assertion failed.
struct Throttled {
    /// On v1 also in a separate cpuacct hierarchy, if the host has one: the live view's CPU
    /// column reads cpuacct.usage of the same path there.
    cgroup: Cgroup,
    name: String,
    workload: Running,
}

impl Throttled {
    /// 20 ms quota per 100 ms period, one busy thread pinned to the last CPU (as `taskset -c`
    /// would), at the most CPU weight so other work on that CPU does not stretch its quota.
    fn start(host: &Host, tag: &str, seconds: u32) -> Self {
        let cgroup =
            Cgroup::throttled(&host.cpu, &format!("live-{tag}"), 20_000, 100_000).with_cpuacct();
        let workload = common::spawn_in(
            &mut common::busy(1, seconds),
            &cgroup,
            Some(common::last_cpu()),
        );
        Self {
            name: cgroup.path().trim_start_matches('/').to_owned(),
            cgroup,
            workload,
        }
    }

    /// (nr_periods, nr_throttled) now.
    fn periods(&self) -> (u64, u64) {
        let stat = self.cgroup.stat();
        (stat.nr_periods, stat.nr_throttled)
    }
}

/// Runs the tracer to its end (a guard of 60 s against hanging, not a timing assertion);
/// returns its exit code, stdout and stderr.
fn run_tracer(args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(TRACER)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn throttle-tracer");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("throttle-tracer {args:?} still running after 60 s");
        }
        thread::sleep(Duration::from_millis(50));
    };
    (
        status.code().unwrap_or(-1),
        out.join().unwrap(),
        err.join().unwrap(),
    )
}

/// One plain block: its timestamp line and the row of `cgroup`, split in columns.
struct Block<'a> {
    header: &'a str,
    row: Option<Vec<&'a str>>,
}

fn blocks<'a>(stdout: &'a str, cgroup: &str) -> Vec<Block<'a>> {
    let mut out: Vec<Block> = Vec::new();
    // Whether the lines are inside a block (which ends at its blank line).
    let mut inside = false;
    for line in stdout.lines() {
        if line.starts_with("--- ") {
            out.push(Block {
                header: line,
                row: None,
            });
            inside = true;
        } else if line.is_empty() {
            inside = false;
        } else if let Some(b) = out.last_mut()
            && inside
            && line.split_whitespace().next() == Some(cgroup)
        {
            b.row = Some(line.split_whitespace().collect());
        }
    }
    out
}

/// Columns of a row, as the header names them: CGROUP STOPS/s GROUP/s P50 P99 MAX PER-CPU WALL
/// THROTTLED(ratio n/m) QUOTA/PERIOD CPU NAME.
const STOPS_PER_S: usize = 1;
const RATIO: usize = 8;
const CPU: usize = 11;

#[test]
fn piped_live_view_prints_timestamped_blocks_of_the_throttled_cgroup() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    // Longer than the tracer's start (a debug build reads BTF slowly) and its 4 s: Drop ends it.
    let scene = Throttled::start(&host, "piped", 120);
    // Let the workload reach its steady state (throttled every period) before tracing.
    common::wait_until(
        Duration::from_secs(10),
        "the workload being throttled in two periods",
        || scene.periods().1 >= 2,
    );
    let before = scene.periods();
    let pid = scene.workload.id().to_string();
    let (code, stdout, stderr) = run_tracer(&[
        "--backend",
        "tracepoint",
        "--interval",
        "1s",
        "--pid",
        &pid,
        "--duration",
        "4s",
    ]);
    let after = scene.periods();
    println!("{stdout}");
    assert_eq!(code, 0, "stderr: {stderr}");

    let cgroup = format!("/{}", scene.name);
    let blocks = blocks(&stdout, &cgroup);
    assert!(blocks.len() >= 3, "{} blocks:\n{stdout}", blocks.len());
    let (periods, throttled) = (after.0 - before.0, after.1 - before.1);
    let truth = throttled as f64 / periods as f64;
    println!("cpu.stat over the run: nr_throttled {throttled} / nr_periods {periods} = {truth:.3}");
    assert!(
        truth >= 0.9,
        "the workload was not throttled every period: {truth}"
    );
    for b in &blocks {
        // `--- 2026-11-29T22:50:01.123Z  interval 1.00s  1 stopped cgroup(s) ---`
        let stamp = b.header.split_whitespace().nth(1).unwrap();
        assert!(
            humantime::parse_rfc3339(stamp).is_ok(),
            "not a timestamp: {}",
            b.header
        );
        let row = b
            .row
            .as_ref()
            .unwrap_or_else(|| panic!("no row for {cgroup} in the block {}:\n{stdout}", b.header));
        // One pinned thread: one stop per 100 ms period.
        let per_s: f64 = row[STOPS_PER_S].parse().unwrap();
        assert!((8.0..=12.0).contains(&per_s), "stops/s {per_s}: {row:?}");
        let ratio: f64 = row[RATIO].parse().unwrap();
        assert!(
            (ratio - truth).abs() <= 0.1 && ratio >= 0.9,
            "throttled-period ratio {ratio} vs cpu.stat {truth:.3}: {row:?}"
        );
        let (t, p) = row[RATIO + 1].split_once('/').unwrap();
        let (t, p): (u64, u64) = (t.parse().unwrap(), p.parse().unwrap());
        assert!(t <= throttled && p <= periods, "{row:?}");
        // A quota of 20 ms per 100 ms: 0.20 CPU, read from cpuacct.usage of the same path.
        let cpus: f64 = row[CPU]
            .parse()
            .unwrap_or_else(|_| panic!("no CPU usage: {row:?}"));
        assert!((0.15..=0.25).contains(&cpus), "CPU {cpus}: {row:?}");
    }
    assert!(
        stdout.contains("throttle-tracer: CFS bandwidth (CPU quota) stops, traced for"),
        "no summary at the end:\n{stdout}"
    );
    let summary = stdout
        .split("throttle-tracer: CFS bandwidth")
        .nth(1)
        .unwrap();
    assert!(summary.contains(&cgroup), "{summary}");
}

#[test]
fn bad_filter_values_are_usage_errors() {
    let mounted = fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| m.contains(" - cgroup"));
    if common::require(
        mounted
            .then_some(())
            .ok_or("no cgroup filesystem is mounted here"),
    )
    .is_none()
    {
        return;
    }
    let (code, stdout, stderr) = run_tracer(&["--pid", "999999999", "--duration", "1s"]);
    assert_eq!(code, 2, "stdout: {stdout}\nstderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with("error: --pid 999999999: cannot read /proc/999999999/cgroup"),
        "{stderr}"
    );
    assert!(lines[1].starts_with("hint: "), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");

    let (code, _, stderr) = run_tracer(&["--container", "not-hex"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.starts_with("error: --container \"not-hex\""),
        "{stderr}"
    );

    for bad in [
        ["--interval", "0s"],
        ["--interval", "soon"],
        ["--min-stop", "x"],
    ] {
        let (code, _, stderr) = run_tracer(&bad);
        assert_eq!(code, 2, "{bad:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{bad:?}: {stderr}");
    }
}

/// A tmux session, killed on drop.
struct Tmux(String);

impl Tmux {
    fn run(args: &[&str]) -> String {
        let out = Command::new("tmux").args(args).output().expect("run tmux");
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The pane's text, with its scrollback.
    fn capture(&self) -> String {
        Self::run(&["capture-pane", "-p", "-J", "-S", "-500", "-t", &self.0])
    }

    /// Waits (up to 60 s, a guard against hanging) until the pane shows `text`.
    fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let pane = self.capture();
            if pane.contains(text) {
                return pane;
            }
            assert!(
                Instant::now() < deadline,
                "no {text:?} in the pane:\n{pane}"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .status();
    }
}

/// tmux, installed from apt if missing; `None` if that fails.
fn tmux() -> Option<()> {
    let have = || {
        Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have() {
        let _ = Command::new("apt-get")
            .args(["install", "-y", "-q", "tmux"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
    }
    have().then_some(())
}

#[test]
fn terminal_live_view_redraws_sorts_and_quits_on_keys() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    if common::require(tmux().ok_or("no tmux, and apt-get install tmux failed")).is_none() {
        return;
    }
    let scene = Throttled::start(&host, "tty", 120);
    let tmux = Tmux(scene.name.clone());
    let command = format!(
        "{TRACER} top --backend tracepoint --pid {}; echo tracer-exit-$?; sleep 120",
        scene.workload.id()
    );
    Tmux::run(&[
        "new-session",
        "-d",
        "-s",
        &tmux.0,
        "-x",
        "230",
        "-y",
        "50",
        &command,
    ]);
    let pane = tmux.wait_for("sort: wall  filter:   (s: sort;");
    // Redrawn in place: one table on the screen at a time.
    assert_eq!(pane.matches("CGROUP").count(), 1, "{pane}");
    Tmux::run(&["send-keys", "-t", &tmux.0, "s"]);
    let pane = tmux.wait_for("sort: stops");
    println!("{pane}");
    let cgroup = format!("/{}", scene.name);
    assert!(
        pane.lines()
            .any(|l| l.starts_with("CGROUP ") && l.ends_with("NAME")),
        "{pane}"
    );
    let row = pane
        .lines()
        .find(|l| l.split_whitespace().next() == Some(cgroup.as_str()))
        .unwrap_or_else(|| panic!("no row for {cgroup}:\n{pane}"));
    let per_s: f64 = row
        .split_whitespace()
        .nth(STOPS_PER_S)
        .unwrap()
        .parse()
        .unwrap();
    assert!((8.0..=12.0).contains(&per_s), "{row}");
    // Filter on the cgroup's name, then its histograms (Enter), then back (Esc).
    Tmux::run(&["send-keys", "-t", &tmux.0, "/", "tty", "Enter"]);
    tmux.wait_for("filter: tty  ");
    Tmux::run(&["send-keys", "-t", &tmux.0, "Enter"]);
    let pane = tmux.wait_for("per-CPU stop lengths in the interval:");
    println!("{pane}");
    assert!(pane.contains("64 -> 127"), "80 ms stops: {pane}");
    Tmux::run(&["send-keys", "-t", &tmux.0, "Escape"]);
    Tmux::run(&["send-keys", "-t", &tmux.0, "q"]);
    let pane = tmux.wait_for("tracer-exit-");
    assert!(pane.contains("tracer-exit-0"), "{pane}");
    assert!(
        pane.contains("lost records: 0"),
        "no summary after q:\n{pane}"
    );
}
