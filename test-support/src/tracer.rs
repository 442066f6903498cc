//! The tracer as the host tests start it: as nobody with the least privilege its backend needs
//! ([`command`], the one place that decides), and as the fault tests run it: its NDJSON on
//! stdout, read line by line as it comes (a test can wait for a line before it acts), stopped
//! with SIGINT, its lines returned parsed.
use std::{
    path::Path,
    process::{Command, Output, Stdio},
    sync::mpsc::{Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::Running;

/// The capabilities the tests' tracer keeps, as nobody: CAP_BPF + CAP_PERFMON, the set
/// deploy/daemonset.yaml grants and the README states, for the tracepoint backend (this
/// host's) and fentry; with CAP_SYS_ADMIN for the kprobe backend (the VM guests'), whose perf
/// events Debian's kernels refuse to the two alone, as the README says. Nothing for cgroupfs:
/// its files are world-readable, and a private (mode 700) cgroup is traced whole without
/// reading it (host_tracepoint.rs proves both, and what CAP_DAC_READ_SEARCH would add).
pub fn capabilities() -> &'static [u32] {
    if super::backend() == "kprobe" {
        super::BPF_PERFMON_SYS_ADMIN
    } else {
        super::BPF_PERFMON
    }
}

/// The tracer as a host test starts it unless the test is about root: as nobody with
/// [`capabilities`] only.
pub fn command() -> Command {
    unprivileged(Command::new(super::tracer_program()))
}

/// `tracer`, a command that runs the tracer in a changed environment (a mount namespace of its
/// own, made as root), dropped to nobody with [`capabilities`] after that.
pub fn unprivileged(tracer: Command) -> Command {
    super::least_privileged(tracer, capabilities())
}

/// [`command`] as a shell command line (for a terminal multiplexer's pane): util-linux's
/// setpriv dropping to nobody with [`capabilities`], then the tracer.
pub fn shell_command() -> String {
    let caps: Vec<String> = capabilities().iter().map(|c| format!("+cap_{c}")).collect();
    let caps = caps.join(",");
    let nobody = super::NOBODY;
    let tracer = super::tracer_program();
    let tracer = tracer.display();
    format!(
        "setpriv --reuid={nobody} --regid={nobody} --clear-groups --inh-caps=-all,{caps} \
         --ambient-caps=-all,{caps} --bounding-set=-all,{caps} {tracer}"
    )
}

/// A temporary directory that the tracer, as nobody, may write its recording into.
pub fn output_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::os::unix::fs::chown(dir.path(), Some(super::NOBODY), Some(super::NOBODY))
        .expect("give the temporary directory to nobody");
    dir
}

pub struct Tracer {
    child: Option<Running>,
    lines: Receiver<String>,
    /// Its `start` line.
    pub start: Value,
    /// The lines read so far after `start`.
    seen: Vec<Value>,
}

impl Tracer {
    /// `throttle-tracer --backend <common::backend()> --json` with `args`, run by [`command`],
    /// once its `start` line has come.
    pub fn start(args: &[&str]) -> Self {
        Self::start_as(command(), args)
    }

    /// [`Tracer::start`] through `tracer`, a command that runs the tracer in a changed
    /// environment (a mount namespace of its own, other privileges).
    pub fn start_as(mut tracer: Command, args: &[&str]) -> Self {
        let mut child = Running::spawn(
            tracer
                .args(["--backend", &super::backend(), "--json"])
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        );
        let (start, lines) = super::ndjson_lines(&mut child);
        Self {
            child: Some(child),
            lines,
            start,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("tracer running").id()
    }

    /// Reads lines until one satisfies `done` and returns it; panics if none has within
    /// `limit` (a guard against hanging, not a timing assertion).
    pub fn wait_for(
        &mut self,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => panic!("{what} did not happen within {limit:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("the tracer ended before {what}"),
            };
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            self.seen.push(v);
            let v = self.seen.last().expect("just pushed");
            if done(v) {
                return v.clone();
            }
        }
    }

    /// SIGINTs the tracer and returns every line it printed after `start`.
    pub fn stop(mut self) -> Vec<Value> {
        let status = self.child.take().expect("tracer running").interrupt();
        assert!(status.success(), "tracer: {status}");
        let mut lines = std::mem::take(&mut self.seen);
        lines.extend(
            self.lines
                .iter()
                .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))),
        );
        lines
    }
}

/// The lines of `lines` of type `kind` about cgroup `id`.
pub fn of<'a>(lines: &'a [Value], kind: &str, id: u64) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|v| v["type"] == kind && v["cgroup_id"] == id)
        .collect()
}

/// Σ `kernel_ns` of `stops` (a null one is a failure: the tracepoint backend reads every
/// stop's kernel time on this kernel).
pub fn kernel_ns(stops: &[&Value]) -> u64 {
    stops
        .iter()
        .map(|s| {
            s["kernel_ns"]
                .as_u64()
                .unwrap_or_else(|| panic!("no kernel_ns: {s}"))
        })
        .sum()
}

/// The trace's account of cgroup `id`'s cpu.stat throttled-time delta in `lines` (a run's,
/// with its `summary`): Σ `kernel_ns` of its stops plus the kernel time of the stops that began
/// before tracing; and how many stops it has.
pub fn accounted_ns(lines: &[Value], id: u64) -> (u64, usize) {
    let stops = of(lines, "stop", id);
    let summary = of(lines, "summary", id);
    assert_eq!(summary.len(), 1, "one summary of cgroup {id}: {lines:#?}");
    let unseen = summary[0]["unseen_start_kernel_ns"]
        .as_u64()
        .unwrap_or_else(|| panic!("no unseen_start_kernel_ns: {}", summary[0]));
    (kernel_ns(&stops) + unseen, stops.len())
}

/// Waits until a tracer started with `--record recording` has written its `start` line there,
/// which it does once its probes are attached (a guard of 60 s against hanging, not a timing
/// assertion).
pub fn wait_recorded_start(recording: &Path) {
    super::wait_until(
        Duration::from_secs(60),
        "the tracer recording its start line (see its stderr above)",
        || std::fs::read_to_string(recording).is_ok_and(|t| t.ends_with('\n')),
    );
}

/// `throttle-tracer report RECORDING`, run to its end (by [`command`]).
pub fn report(recording: &Path) -> Output {
    command()
        .arg("report")
        .arg(recording)
        .output()
        .expect("run throttle-tracer report")
}
