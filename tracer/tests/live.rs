//! The live view (`--interval`) on this host, piped: timestamped plain blocks, checked against a
//! real throttled cgroup (v1 or v2) and its cpu.stat read here; on a terminal (tmux): the
//! selection, the histogram pane, the processes held (`p`), a resize, and the terminal given
//! back after q, Ctrl-C and SIGTERM; and the usage errors of the filters. The host tests need
//! root, kernel BTF and a cpu hierarchy; otherwise they say why they cannot run (a failure
//! under `CI=true`).
use test_support as common;

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
    let mut child = common::tracer::command()
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
/// THROTTLED(ratio n/m) QUOTA/PERIOD CPU MAX-RUN QUOTA-OF NAME.
const STOPS_PER_S: usize = 1;
const RATIO: usize = 8;
const CPU: usize = 11;
const MAX_RUN: usize = 12;

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
        &common::backend(),
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
    /// A detached session `name`, `cols` × `rows`, running `command`.
    fn start(name: &str, cols: u32, rows: u32, command: &str) -> Self {
        let (cols, rows) = (cols.to_string(), rows.to_string());
        Self::run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            &cols,
            "-y",
            &rows,
            command,
        ]);
        Self(name.to_owned())
    }

    fn run(args: &[&str]) -> String {
        let out = Command::new("tmux").args(args).output().expect("run tmux");
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        Self::run(&[&["send-keys", "-t", &self.0][..], keys].concat());
    }

    /// The pane's text, with its scrollback (the normal screen's; the alternate screen has none).
    fn capture(&self) -> String {
        Self::run(&["capture-pane", "-p", "-J", "-S", "-500", "-t", &self.0])
    }

    /// The pane's visible lines only, as wide as the pane.
    fn visible(&self) -> String {
        Self::run(&["capture-pane", "-p", "-t", &self.0])
    }

    /// Waits (up to 60 s, a guard against hanging) until `done` holds for the pane's text.
    fn wait_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let pane = self.capture();
            if done(&pane) {
                return pane;
            }
            assert!(Instant::now() < deadline, "no {what} in the pane:\n{pane}");
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_for(&self, text: &str) -> String {
        self.wait_until(&format!("{text:?}"), |pane| pane.contains(text))
    }

    /// The tracer running in the pane now (a child of the pane's shell).
    fn tracer_pid(&self) -> i32 {
        let shell = Self::run(&["display-message", "-p", "-t", &self.0, "#{pane_pid}"]);
        let shell = shell.trim();
        let children = fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .expect("children of the pane's shell");
        children
            .split_whitespace()
            .find(|pid| {
                fs::read_link(format!("/proc/{pid}/exe"))
                    .is_ok_and(|exe| exe == std::path::Path::new(TRACER))
            })
            .unwrap_or_else(|| panic!("no tracer among {children:?}"))
            .parse()
            .unwrap()
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

/// The live view's line of keys, at the bottom of its screen (never in the summary).
const KEYS_LINE: &str = "(s: sort; /: filter;";
/// The selected row's mark.
const SELECTED: &str = "> ";

/// The row of `cgroup` on the screen, split in columns (without the selection mark).
fn row_of<'a>(pane: &'a str, cgroup: &str) -> Option<Vec<&'a str>> {
    pane.lines().find_map(|l| {
        let columns: Vec<&str> = l.trim_start_matches(SELECTED).split_whitespace().collect();
        (columns.first() == Some(&cgroup)).then_some(columns)
    })
}

/// The cgroup path of the selected row.
fn selected(pane: &str) -> Option<&str> {
    pane.lines()
        .find_map(|l| l.strip_prefix(SELECTED))
        .and_then(|l| l.split_whitespace().next())
}

#[test]
fn terminal_live_view_selects_scrolls_resizes_and_gives_the_terminal_back() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    if common::require(tmux().ok_or("no tmux, and apt-get install tmux failed")).is_none() {
        return;
    }
    // Two throttled cgroups, so that there is a second row; named so that sorting by name puts
    // tty1 first.
    let (one, two) = (
        Throttled::start(&host, "tty1", 300),
        Throttled::start(&host, "tty2", 300),
    );
    let (cg1, cg2) = (format!("/{}", one.name), format!("/{}", two.name));
    let top = format!(
        "{} top --backend tracepoint --pid {} --pid {}",
        common::tracer::shell_command(),
        one.workload.id(),
        two.workload.id()
    );
    // After each run: its exit code, and whether the terminal is back in its cooked mode; then
    // the shell waits for Enter, so that the next run does not take the screen (hiding these
    // lines behind its alternate screen) before the test has read them.
    let after = |n: u32| {
        format!(
            "echo run{n}-exit-$?; if stty -a | grep -q -w -e -icanon -e -echo; \
             then echo run{n}-tty-raw; else echo run{n}-tty-cooked; fi; read next"
        )
    };
    let command = format!(
        "{top}; {}; {top}; {}; {top}; {}; sleep 300",
        after(1),
        after(2),
        after(3)
    );
    let tmux = Tmux::start(&one.name, 230, 50, &command);
    let pane = tmux.wait_for("2 stopped cgroup(s)");
    println!("{pane}");
    // Redrawn in place: one table on the screen, the keys on its last line.
    assert_eq!(pane.matches("CGROUP").count(), 1, "{pane}");
    let visible = tmux.visible();
    assert_eq!(visible.lines().count(), 50, "{visible}");
    assert!(
        visible.lines().last().unwrap().starts_with("sort: wall"),
        "{visible}"
    );
    for cgroup in [&cg1, &cg2] {
        let row = row_of(&pane, cgroup).unwrap_or_else(|| panic!("no row for {cgroup}:\n{pane}"));
        // Each pinned thread: one stop per 100 ms period.
        let per_s: f64 = row[STOPS_PER_S].parse().unwrap();
        assert!((8.0..=12.0).contains(&per_s), "{row:?}");
    }

    // wall -> stops -> p99 -> name: tty1 first. The selection stays on its cgroup across a
    // sort (whichever row wall time put first), so Home selects the first row.
    tmux.keys(&["s", "s", "s"]);
    tmux.wait_for("sort: name");
    tmux.keys(&["Home"]);
    let pane = tmux.wait_for(&format!("{SELECTED}{cg1} "));
    let position = |cgroup: &str| pane.find(&format!(" {cgroup} ")).unwrap();
    assert!(position(&cg1) < position(&cg2), "{pane}");
    assert_eq!(selected(&pane), Some(cg1.as_str()), "{pane}");

    // Arrow keys move the selection: down to the second row, up, down again.
    tmux.keys(&["Down"]);
    tmux.wait_until("the second row selected", |p| selected(p) == Some(&cg2));
    tmux.keys(&["Up"]);
    tmux.wait_until("the first row selected", |p| selected(p) == Some(&cg1));
    tmux.keys(&["Down"]);
    tmux.wait_until("the second row selected", |p| selected(p) == Some(&cg2));

    // Enter: the second row's histograms.
    tmux.keys(&["Enter"]);
    let title = |cgroup: &str| format!("histograms of {cgroup} in the interval");
    let pane = tmux.wait_for(&title(&cg2));
    println!("{pane}");
    assert!(!pane.contains(&title(&cg1)), "{pane}");
    assert!(
        pane.contains("per-CPU stop lengths in the interval:"),
        "{pane}"
    );
    // Quota arithmetic: a stop lasts the period less the runtime used in it, at most
    // 100 - 20 = 80 ms, and at least 100 - 20 - 20 = 60 ms when the other cgroup on the same CPU
    // ran its 20 ms first: every stop in the slots 32-63 or 64-127 ms.
    assert!(
        pane.contains("32 -> 63") && !pane.contains("128 -> 255"),
        "{pane}"
    );
    // An arrow key with the pane open moves the selection, and the pane follows: its ESC byte
    // is not taken for the Esc key, which would close the pane.
    tmux.keys(&["Up"]);
    let pane = tmux.wait_for(&title(&cg1));
    assert!(!pane.contains(&title(&cg2)), "{pane}");
    tmux.keys(&["Escape"]);
    tmux.wait_until("the pane closed", |p| !p.contains("histograms of /"));

    // A smaller terminal: the view is laid out again for 120 x 30, the keys on its last line.
    Tmux::run(&["resize-window", "-t", &tmux.0, "-x", "120", "-y", "30"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let visible = loop {
        let visible = tmux.visible();
        let lines: Vec<&str> = visible.lines().collect();
        if lines.len() == 30 && lines[29].starts_with("sort: name") {
            break visible;
        }
        assert!(
            Instant::now() < deadline,
            "not redrawn at 120x30:\n{visible}"
        );
        thread::sleep(Duration::from_millis(200));
    };
    println!("{visible}");
    assert!(
        visible.lines().all(|l| l.chars().count() <= 120),
        "{visible}"
    );
    assert!(
        visible
            .lines()
            .any(|l| l.trim_start().starts_with("CGROUP")),
        "{visible}"
    );
    assert_eq!(selected(&visible), Some(cg1.as_str()), "{visible}");

    // q: the run ends with its summary, on the normal screen, and the terminal is cooked again.
    tmux.keys(&["q"]);
    let pane = tmux.wait_for("run1-tty-");
    println!("{pane}");
    assert!(pane.contains("run1-exit-0"), "{pane}");
    assert!(pane.contains("run1-tty-cooked"), "{pane}");
    assert!(
        !pane.contains(KEYS_LINE),
        "the alternate screen was not left:\n{pane}"
    );
    assert!(
        pane.contains("lost records: 0"),
        "no summary after q:\n{pane}"
    );
    let summary = pane
        .split("throttle-tracer: CFS bandwidth")
        .nth(1)
        .unwrap_or("");
    assert!(summary.contains(&cg1) && summary.contains(&cg2), "{pane}");

    // Ctrl-C, a key in raw mode: the same end as q.
    tmux.keys(&["Enter"]);
    tmux.wait_for(KEYS_LINE);
    tmux.keys(&["C-c"]);
    let pane = tmux.wait_for("run2-tty-");
    assert!(
        pane.contains("run2-exit-0") && pane.contains("run2-tty-cooked"),
        "{pane}"
    );
    assert!(
        !pane.contains(KEYS_LINE),
        "the alternate screen was not left:\n{pane}"
    );
    assert_eq!(pane.matches("lost records: 0").count(), 2, "{pane}");

    // SIGTERM: the same.
    tmux.keys(&["Enter"]);
    tmux.wait_for(KEYS_LINE);
    let pid = tmux.tracer_pid();
    // SAFETY: a signal to the tracer this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let pane = tmux.wait_for("run3-tty-");
    println!("{pane}");
    assert!(
        pane.contains("run3-exit-0") && pane.contains("run3-tty-cooked"),
        "{pane}"
    );
    assert!(
        !pane.contains(KEYS_LINE),
        "the alternate screen was not left:\n{pane}"
    );
    assert_eq!(pane.matches("lost records: 0").count(), 3, "{pane}");
}

/// `80.1ms` → 80.1e6 ns; `None` for `-`.
fn parse_ms(cell: &str) -> Option<f64> {
    cell.strip_suffix("ms")
        .map(|ms| ms.parse::<f64>().expect("a number of ms") * 1e6)
}

/// `top` on a terminal (tmux) over a spiky burn of 80 ms every 500 ms at 50 ms / 100 ms
/// (tracepoint backend): its MAX RUN column shows, redraw after redraw,
/// the CPU one round burned by the workload's own clock (CLOCK_THREAD_CPUTIME_ID), within 5 %.
#[test]
fn terminal_live_view_shows_the_largest_run_demand_of_the_interval() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    if common::require(tmux().ok_or("no tmux, and apt-get install tmux failed")).is_none() {
        return;
    }
    let cgroup = Cgroup::throttled(&host.cpu, "live-run", 50_000, 100_000);
    let mut cmd = common::spiky(500, 80, 60, 1);
    cmd.stdout(Stdio::piped());
    let mut workload = common::spawn_in(&mut cmd, &cgroup, Some(common::last_cpu()));
    // Its lines on a thread: `synced` once its boundary-finding stop is over (a run of its
    // own, before the view starts), then one `round ... cpu_ns C` per round.
    let stdout = workload.stdout.take().expect("workload stdout");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let synced = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the workload's synced line");
    assert!(synced.starts_with("synced"), "{synced}");

    let top = format!(
        "{} top --backend tracepoint --cgroup {}; sleep 300",
        common::tracer::shell_command(),
        cgroup.path()
    );
    let tmux = Tmux::start("live-run", 230, 20, &top);
    tmux.wait_for(KEYS_LINE);
    // Five seconds of redraws, each interval holding two rounds.
    let mut shown = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut pane = String::new();
    while Instant::now() < deadline {
        pane = tmux.visible();
        if let Some(ns) = row_of(&pane, cgroup.path())
            .and_then(|row| row.get(MAX_RUN).copied().and_then(parse_ms))
        {
            shown.push(ns);
        }
        thread::sleep(Duration::from_millis(250));
    }
    println!("{pane}");
    let rounds: Vec<f64> = lines
        .try_iter()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "cpu_ns")?;
            words.get(at + 1)?.parse().ok()
        })
        .collect();
    assert!(!rounds.is_empty(), "no round done");
    let known = rounds.iter().sum::<f64>() / rounds.len() as f64;
    println!(
        "MAX RUN shown {} times: {:.1}..{:.1} ms; a round burned {:.1} ms by its own clock",
        shown.len(),
        shown.iter().copied().fold(f64::MAX, f64::min) / 1e6,
        shown.iter().copied().fold(0.0, f64::max) / 1e6,
        known / 1e6
    );
    assert!(
        shown.len() >= 10,
        "MAX RUN seldom shown ({shown:?}):\n{pane}"
    );
    for ns in &shown {
        assert!(
            (ns - known).abs() <= 0.05 * known,
            "MAX RUN {ns} ns vs a round's own CPU {known} ns:\n{pane}"
        );
    }
}

/// `p` on a terminal (tmux) switches `top` to the processes the interval's stops held, and
/// back: a busy process pinned in a cgroup at 20 ms / 100 ms shows with its pid, its comm
/// (/proc/PID/comm, which its spinning thread shares), its cgroup, its spinning thread's tid
/// and, by quota arithmetic, one stop per 100 ms period of the 1 s interval.
#[test]
fn terminal_live_view_p_shows_the_held_process_by_pid_and_comm() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    if common::require(tmux().ok_or("no tmux, and apt-get install tmux failed")).is_none() {
        return;
    }
    let busy = Throttled::start(&host, "procs", 300);
    let pid = busy.workload.id();
    common::wait_until(Duration::from_secs(10), "the spinning thread", || {
        busy.workload.running_threads() == 1
    });
    let [tid] = busy.workload.thread_ids()[..] else {
        panic!("not one spinning thread");
    };
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    let comm = comm.trim_end();
    let top = format!(
        "{} top --backend tracepoint --pid {pid}; sleep 300",
        common::tracer::shell_command()
    );
    let tmux = Tmux::start(&busy.name, 230, 30, &top);
    tmux.wait_for("1 stopped cgroup(s)");
    tmux.keys(&["p"]);
    // PID COMM STOPS HELD P99-WAIT CGROUP THREADS, inside the table's border.
    let row = |pane: &str| -> Option<Vec<String>> {
        pane.lines().find_map(|l| {
            let columns: Vec<String> = l
                .trim_matches(|c: char| c == '│' || c.is_whitespace())
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            (columns.first() == Some(&pid.to_string())).then_some(columns)
        })
    };
    let pane = tmux.wait_until("the held process's row", |p| {
        p.contains("processes held in the interval") && row(p).is_some()
    });
    println!("{pane}");
    let row = row(&pane).unwrap();
    assert_eq!(row[1], comm, "{row:?}");
    assert_eq!(row[5], busy.cgroup.path(), "{row:?}");
    assert!(row[6].starts_with(&format!("{tid}:")), "{row:?}");
    let stops: u32 = row[2].parse().unwrap();
    assert!((8..=12).contains(&stops), "{row:?}");
    tmux.keys(&["p"]);
    tmux.wait_until("the cgroups again", |p| {
        !p.contains("processes held in") && row_of(p, busy.cgroup.path()).is_some()
    });
    tmux.keys(&["q"]);
}
