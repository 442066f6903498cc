//! The processes the bench runs: the tracer, bpftrace, busy loops in quota'd cgroups.
use super::{Check, bpf};
use crate::process::{die_with_parent, signal, wait_timeout};
use anyhow::{Context as _, Result, bail};
use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A hang guard. Under TCG (vm-startup's guests) a start takes up to tens of seconds.
const START_TIMEOUT: Duration = Duration::from_secs(180);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Not seen yet, in [`Traced::lost`].
const UNSEEN: u64 = u64::MAX;

/// A tracer (throttle-tracer with `--json`, or bpftrace) running in the background, ready.
pub struct Traced {
    child: Option<Child>,
    started: Instant,
    /// exec → ready (the `start` line; bpftrace's program loaded).
    pub ready_after: Duration,
    /// The line that said it is ready (the tracer's `start` line).
    pub ready_line: String,
    /// bpftrace's programs (none for the tracer, whose are found by its links).
    pub programs: Vec<bpf::Program>,
    /// `stop` lines read so far.
    pub stops: Arc<AtomicU64>,
    /// Σ `kernel_ns` of those stop lines: the kernel's account of their length.
    pub kernel_ns: Arc<AtomicU64>,
    /// The `end` line's `lost`, once printed.
    lost: Arc<AtomicU64>,
    stdin: Option<ChildStdin>,
    stdout: Option<JoinHandle<()>>,
    stderr: Option<JoinHandle<String>>,
}

impl Traced {
    /// `throttle-tracer ARGS…`, ready at its NDJSON `start` line.
    pub fn tracer(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let mut command = Command::new(binary);
        command.args(args).envs(env.iter().copied());
        Self::spawn(command, |line| line.contains(r#""type":"start""#))
    }

    /// `bpftrace -e SCRIPT` of `check`, ready when all its programs are loaded: it prints
    /// "Attaching" before it loads anything, and attaches each program as it loads it (the
    /// last one's attach is not in `ready_after`).
    pub fn bpftrace(check: &Check) -> Result<Self> {
        let before = bpf::loaded_ids();
        let mut command = Command::new("bpftrace");
        command.args(["-e", check.script]);
        let mut traced = Self::spawn(command, |line| line.starts_with("Attaching"))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            traced.programs = bpf::programs_since(&before, check.program_type, check.hook);
            if traced.programs.len() >= check.programs {
                traced.ready_after = traced.started.elapsed();
                return Ok(traced);
            }
            if Instant::now() > deadline {
                bail!(
                    "bpftrace loaded {} of its {} {:?} programs within {START_TIMEOUT:?}",
                    traced.programs.len(),
                    check.programs,
                    check.program_type
                );
            }
            thread::sleep(Duration::from_millis(2));
        }
    }

    fn spawn(mut command: Command, ready: fn(&str) -> bool) -> Result<Self> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe. If this task dies, the tracer detaches.
        unsafe { command.pre_exec(|| die_with_parent(libc::SIGINT)) };
        let started = Instant::now();
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot run {:?}", command.get_program()))?;
        let (ready_tx, ready_rx) = mpsc::channel();
        let stops = Arc::new(AtomicU64::new(0));
        let kernel_ns = Arc::new(AtomicU64::new(0));
        let lost = Arc::new(AtomicU64::new(UNSEEN));
        let out = child.stdout.take().expect("piped");
        let (counter, kernel_sum, lost_seen) = (
            Arc::clone(&stops),
            Arc::clone(&kernel_ns),
            Arc::clone(&lost),
        );
        let stdout = thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if ready(&line) {
                    let _ = ready_tx.send((Instant::now(), line));
                } else if line.starts_with(r#"{"type":"stop""#) {
                    counter.fetch_add(1, Ordering::Relaxed);
                    let record: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                    if let Some(ns) = record["kernel_ns"].as_u64() {
                        kernel_sum.fetch_add(ns, Ordering::Relaxed);
                    }
                } else if line.starts_with(r#"{"type":"end""#) {
                    let record: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                    if let Some(n) = record["lost"].as_u64() {
                        lost_seen.store(n, Ordering::Relaxed);
                    }
                }
            }
        });
        let mut err = child.stderr.take().expect("piped");
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        let stdin = child.stdin.take();
        let mut traced = Self {
            child: Some(child),
            started,
            ready_after: Duration::ZERO,
            ready_line: String::new(),
            programs: Vec::new(),
            stops,
            kernel_ns,
            lost,
            stdin,
            stdout: Some(stdout),
            stderr: Some(stderr),
        };
        match ready_rx.recv_timeout(START_TIMEOUT) {
            Ok((at, line)) => {
                traced.ready_after = at - started;
                traced.ready_line = line;
            }
            Err(_) => {
                let stderr = traced.halt();
                bail!(
                    "{:?} was not ready within {START_TIMEOUT:?}:\n{}",
                    command.get_program(),
                    stderr.trim_end()
                );
            }
        }
        Ok(traced)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGINT and a clean exit; returns stderr and the `end` line's `lost` (if printed).
    pub fn stop(&mut self) -> Result<(String, Option<u64>)> {
        let Some(child) = self.child.as_mut() else {
            bail!("already stopped");
        };
        signal(child.id(), libc::SIGINT)?;
        let status = wait_timeout(child, STOP_TIMEOUT)?;
        let stderr = self.halt();
        let lost = Some(self.lost.load(Ordering::Relaxed)).filter(|&n| n != UNSEEN);
        match status {
            Some(s) if s.success() => Ok((stderr, lost)),
            Some(s) => bail!("the tracer exited with {s}:\n{}", stderr.trim_end()),
            None => bail!("the tracer did not exit within {STOP_TIMEOUT:?} of SIGINT"),
        }
    }

    /// SIGKILL, for a start that is measured and nothing more: under the emulator bpftrace
    /// takes more than [`STOP_TIMEOUT`] to exit on SIGINT, and the startup rounds would mostly
    /// wait for it. The kernel detaches its programs as their fds close.
    pub fn kill(mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
        }
    }

    /// Ends the process whatever its state (stdin closed, SIGINT, then SIGKILL); its stderr.
    fn halt(&mut self) -> String {
        self.stdin.take();
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = signal(child.id(), libc::SIGINT);
                if !matches!(wait_timeout(&mut child, STOP_TIMEOUT), Ok(Some(_))) {
                    let _ = child.kill();
                }
            }
            let _ = child.wait();
        }
        if let Some(h) = self.stdout.take() {
            let _ = h.join();
        }
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        self.halt();
    }
}

/// `throttle-tracer bench-feed ARGS…` to its end: its stderr's last line, as JSON.
pub fn feed(binary: &Path, args: &[&str]) -> Result<serde_json::Value> {
    let out = Command::new(binary)
        .arg("bench-feed")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!(
            "bench-feed {args:?} exited with {}:\n{}",
            out.status,
            stderr.trim_end()
        );
    }
    let last = stderr.lines().last().unwrap_or_default();
    serde_json::from_str(last).with_context(|| format!("bench-feed printed no result:\n{stderr}"))
}

/// `throttle-tracer bench-feed --hold ARGS…`, fed and holding its state until dropped.
pub struct Held(Child);

impl Held {
    pub fn start(binary: &Path, args: &[&str]) -> Result<Self> {
        let mut command = Command::new(binary);
        command
            .arg("bench-feed")
            .arg("--hold")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe.
        unsafe { command.pre_exec(|| die_with_parent(libc::SIGKILL)) };
        let mut child = command.spawn().context("cannot run bench-feed")?;
        let err = child.stderr.take().expect("piped");
        // The result line comes after the feeding: from then on the state is all there.
        let mut lines = BufReader::new(err).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.starts_with(r#"{"records""#) => break,
                Some(Ok(_)) => {}
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("bench-feed --hold {args:?} ended before feeding");
                }
            }
        }
        Ok(Self(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.stdin.take();
        if !matches!(wait_timeout(&mut self.0, STOP_TIMEOUT), Ok(Some(_))) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The hook of each program throttle-tracer's tracepoint backend attaches (a hook twice if two
/// programs share it), from a start of its own: what the floors are attached to.
pub fn tracer_hooks(tracer: &Path) -> Result<Vec<String>> {
    let mut traced = Traced::tracer(tracer, super::TRACEPOINT, &[])?;
    let hooks = bpf::attached_programs(traced.pid())?
        .into_iter()
        .map(|p| p.hook)
        .collect();
    traced.stop()?;
    Ok(hooks)
}

/// `throttle-workload MODE ARGS…`: killed and reaped on drop.
pub struct Workload(Child);

impl Workload {
    /// `busy`: `threads` spinning threads for `seconds`.
    pub fn busy(workload: &Path, threads: u32, seconds: u64) -> Result<Self> {
        Self::spawn(
            workload,
            &[
                "busy",
                "--threads",
                &threads.to_string(),
                "--seconds",
                &seconds.to_string(),
            ],
        )
    }

    pub fn spawn(workload: &Path, args: &[&str]) -> Result<Self> {
        let mut command = Command::new(workload);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: prctl is async-signal-safe.
        unsafe { command.pre_exec(|| die_with_parent(libc::SIGKILL)) };
        let child = command
            .spawn()
            .with_context(|| format!("cannot run {}", workload.display()))?;
        Ok(Self(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
