//! `cargo xtask bench`: what `--backend tracepoint` costs on this host.
//!
//! 1. `perf bench sched pipe` (a context switch per message) in alternating runs without and
//!    with `throttle-tracer --backend tracepoint --json` attached: medians, spread, slowdown.
//! 2. The kernel's BPF run-time statistics (`BPF_ENABLE_STATS`, released with its fd, so the
//!    `kernel.bpf_stats_enabled` sysctl is never touched) of the tracer's own programs, found by
//!    the raw-tracepoint links the tracer process holds: invocations and mean ns per invocation,
//!    during one more pipe run and while a quota'd cgroup with two busy threads is throttled
//!    (then sched_switch really walks a bandwidth-limited cfs_rq). The peer, in the same pipe
//!    run: an empty program on sched_switch ([`EmptyPeer`]), what any program costs there.
//!
//! Figures only: nothing here asserts a timing. Needs root (BPF, cgroups).
use crate::cgroup::Cgroup;
use crate::process::{die_with_parent, signal, wait_timeout};
use crate::{binaries, cmd, setup};
use anyhow::{Context as _, Result, bail};
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_type};
use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const SCHED_SWITCH_BUDGET_NS: f64 = 150.0;
const SLOWDOWN_BUDGET_PCT: f64 = 3.0;
/// The throttled cgroup: 50 ms of CPU per 100 ms period for two busy threads.
const QUOTA_US: u64 = 50_000;
const PERIOD_US: u64 = 100_000;
const BUSY_THREADS: u32 = 2;
const CGROUP_NAME: &str = "xtask-bench";
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(clap::Args)]
pub struct Args {
    /// Benchmark runs with the tracer attached, and as many without, alternating.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Messages per `perf bench sched pipe` run (`-l`).
    #[arg(long, default_value_t = 100_000)]
    loops: u64,
    /// Seconds of BPF statistics while the quota'd cgroup is throttled.
    #[arg(long, default_value_t = 3)]
    throttled_seconds: u64,
    /// Measure this throttle-tracer binary instead of the one just built (to compare builds).
    #[arg(long, value_name = "PATH")]
    tracer: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    if args.runs == 0 || args.loops == 0 {
        bail!("--runs and --loops must be at least 1");
    }
    let started = Instant::now();
    setup::run(&[setup::Part::Build, setup::Part::Bench])?;
    let mut binaries = binaries::build()?;
    if let Some(tracer) = &args.tracer {
        binaries.tracer.clone_from(tracer);
    }
    let load_before = loadavg();
    pipe_run(args.loops).context("`perf bench sched pipe` does not work here")?; // warm-up

    // Alternating runs; every other pair starts with the tracer, so a steady drift in the
    // host's load weighs on both sides alike.
    let mut without = Vec::new();
    let mut with = Vec::new();
    let mut crowded_runs = 0;
    for i in 0..args.runs {
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for attached in order {
            if attached {
                let mut tracer = Tracer::start(&binaries.tracer)?;
                crowded_runs += usize::from(other_sched_switch_programs(&tracer.programs) > 0);
                with.push(pipe_run(args.loops)?);
                tracer.stop()?;
            } else {
                crowded_runs += usize::from(other_sched_switch_programs(&[]) > 0);
                without.push(pipe_run(args.loops)?);
            }
        }
        eprintln!(
            "bench: pair {}/{}: without {:.3} us/op, with {:.3} us/op",
            i + 1,
            args.runs,
            without[i],
            with[i]
        );
    }

    // BPF run-time statistics, only now: they cost a clock read per invocation of every BPF
    // program on the machine, which the slowdown runs above must not include.
    let mut tracer = Tracer::start(&binaries.tracer)?;
    let peer = EmptyPeer::attach()?;
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("BPF_ENABLE_STATS (BPF run-time statistics)")?;
    let s0 = tracer.snapshot()?;
    let p0 = peer.stats()?;
    let stats_pipe_us = pipe_run(args.loops)?;
    let s1 = tracer.snapshot()?;
    let p1 = peer.stats()?;
    drop(peer);
    let throttled = throttled_phase(&binaries.workload, &tracer, args.throttled_seconds)?;
    drop(stats);
    tracer.stop()?;

    let report = Report {
        loops: args.loops,
        without: Summary::of(&without),
        with: Summary::of(&with),
        pair_slowdowns: Summary::of(
            &with
                .iter()
                .zip(&without)
                .map(|(w, wo)| (w / wo - 1.0) * 100.0)
                .collect::<Vec<_>>(),
        ),
        crowded_runs,
        programs: tracer.programs.clone(),
        pipe: delta(&s0, &s1),
        peer: (p1.0 - p0.0, p1.1 - p0.1),
        stats_pipe_us,
        throttled,
        load: (load_before, loadavg()),
        elapsed: started.elapsed(),
    };
    print!("{}", report.render());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The benchmark

/// One `perf bench sched pipe -l loops`: microseconds per message.
fn pipe_run(loops: u64) -> Result<f64> {
    let out = cmd::stdout(Command::new("perf").args([
        "bench",
        "sched",
        "pipe",
        "-l",
        &loops.to_string(),
    ]))?;
    parse_usecs_per_op(&out).with_context(|| format!("no `usecs/op` in perf's output:\n{out}"))
}

fn parse_usecs_per_op(perf_output: &str) -> Option<f64> {
    perf_output.lines().find_map(|l| {
        let (value, unit) = l.trim().split_once(char::is_whitespace)?;
        (unit.trim() == "usecs/op").then(|| value.parse().ok())?
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Summary {
    n: usize,
    median: f64,
    mean: f64,
    min: f64,
    max: f64,
    stddev: f64,
}

impl Summary {
    fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => v[n / 2],
            _ => f64::midpoint(v[n / 2 - 1], v[n / 2]),
        };
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n.max(2) - 1) as f64;
        Self {
            n,
            median,
            mean,
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
            stddev: var.sqrt(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tracer

/// A BPF program of the tracer: the tracepoint its link attaches it to, and its id.
#[derive(Clone, Debug, PartialEq)]
struct Program {
    tracepoint: String,
    id: u32,
}

/// Per program id: (run_time_ns, run_cnt).
type Snapshot = HashMap<u32, (u64, u64)>;

/// `throttle-tracer --backend tracepoint --json` in the background, attached.
struct Tracer {
    child: Option<Child>,
    programs: Vec<Program>,
    /// `stop` records read so far.
    stops: Arc<AtomicU64>,
    stdout: Option<JoinHandle<()>>,
    stderr: Option<JoinHandle<String>>,
}

impl Tracer {
    /// Starts the tracer and waits for its `start` record (every program attached).
    fn start(binary: &Path) -> Result<Self> {
        let mut command = Command::new(binary);
        command
            .args(["--backend", "tracepoint", "--json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe. If this task dies, the tracer detaches.
        unsafe { command.pre_exec(|| die_with_parent(libc::SIGINT)) };
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot run {}", binary.display()))?;
        let (started_tx, started_rx) = mpsc::channel();
        let stops = Arc::new(AtomicU64::new(0));
        let out = child.stdout.take().expect("piped");
        let counter = Arc::clone(&stops);
        let stdout = thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let record: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                match record["type"].as_str() {
                    Some("start") => {
                        let _ = started_tx.send(());
                    }
                    Some("stop") => {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        });
        let mut err = child.stderr.take().expect("piped");
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        let mut tracer = Self {
            child: Some(child),
            programs: Vec::new(),
            stops,
            stdout: Some(stdout),
            stderr: Some(stderr),
        };
        if started_rx.recv_timeout(START_TIMEOUT).is_err() {
            let stderr = tracer.halt();
            bail!(
                "throttle-tracer printed no start record within {START_TIMEOUT:?}:\n{}",
                stderr.trim_end()
            );
        }
        tracer.programs = attached_programs(tracer.pid())?;
        Ok(tracer)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// run_time_ns and run_cnt of the tracer's programs now.
    fn snapshot(&self) -> Result<Snapshot> {
        let mut snapshot = Snapshot::new();
        // Other processes load and unload programs meanwhile: one that vanished between the
        // listing and the lookup is an error here, and not one of ours.
        for info in aya::programs::loaded_programs().flatten() {
            if self.programs.iter().any(|p| p.id == info.id()) {
                let ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
                snapshot.insert(info.id(), (ns, info.run_count()));
            }
        }
        if let Some(p) = self.programs.iter().find(|p| !snapshot.contains_key(&p.id)) {
            bail!(
                "the tracer's program {} ({}) is not loaded",
                p.id,
                p.tracepoint
            );
        }
        Ok(snapshot)
    }

    /// SIGINT and a clean exit.
    fn stop(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        signal(child.id(), libc::SIGINT)?;
        let status = wait_timeout(child, STOP_TIMEOUT)?;
        let stderr = self.halt();
        match status {
            Some(s) if s.success() => Ok(()),
            Some(s) => bail!("throttle-tracer exited with {s}:\n{}", stderr.trim_end()),
            None => bail!("throttle-tracer did not exit within {STOP_TIMEOUT:?} of SIGINT"),
        }
    }

    /// Ends the tracer whatever its state (SIGINT, then SIGKILL) and returns its stderr.
    fn halt(&mut self) -> String {
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

impl Drop for Tracer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The programs behind the raw-tracepoint links (what tp_btf attaches with) that `pid` holds,
/// from `/proc/<pid>/fdinfo`: the kernel truncates program names to 15 bytes
/// (`tp_sched_wakeup` and `tp_sched_wakeup_new` look alike); the link names the tracepoint.
fn attached_programs(pid: u32) -> Result<Vec<Program>> {
    let fds = PathBuf::from(format!("/proc/{pid}/fd"));
    let mut programs = Vec::new();
    for entry in std::fs::read_dir(&fds).with_context(|| format!("reading {}", fds.display()))? {
        let entry = entry?;
        let is_link = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy() == "anon_inode:bpf_link");
        if !is_link {
            continue;
        }
        let fdinfo = format!("/proc/{pid}/fdinfo/{}", entry.file_name().to_string_lossy());
        let Ok(text) = std::fs::read_to_string(&fdinfo) else {
            continue;
        };
        if let Some(program) = parse_link_fdinfo(&text) {
            programs.push(program);
        }
    }
    if programs.is_empty() {
        bail!("throttle-tracer (pid {pid}) holds no raw-tracepoint links");
    }
    // sched_switch first, then by name.
    programs.sort_by_key(|p| (p.tracepoint != "sched_switch", p.tracepoint.clone()));
    Ok(programs)
}

fn parse_link_fdinfo(text: &str) -> Option<Program> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    Some(Program {
        tracepoint: field("tp_name")?.to_owned(),
        id: field("prog_id")?.parse().ok()?,
    })
}

/// Loaded programs named like the tracer's sched_switch program that are not `own`: other
/// tracers on this host, which make the runs noisier.
fn other_sched_switch_programs(own: &[Program]) -> usize {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|info| info.name_as_str() == Some("tp_sched_switch"))
        .filter(|info| !own.iter().any(|p| p.id == info.id()))
        .count()
}

fn delta(before: &Snapshot, after: &Snapshot) -> Snapshot {
    after
        .iter()
        .map(|(id, &(ns, cnt))| {
            let (ns0, cnt0) = before.get(id).copied().unwrap_or_default();
            (*id, (ns.saturating_sub(ns0), cnt.saturating_sub(cnt0)))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The throttled cgroup

struct Throttled {
    stats: Snapshot,
    seconds: u64,
    periods: u64,
    throttled_periods: u64,
    stop_records: u64,
    cgroup: PathBuf,
}

/// BPF statistics over `seconds` while a cgroup with `BUSY_THREADS` busy threads and a quota
/// of `QUOTA_US` per `PERIOD_US` is throttled.
fn throttled_phase(workload: &Path, tracer: &Tracer, seconds: u64) -> Result<Throttled> {
    let cgroup = Cgroup::create(CGROUP_NAME, QUOTA_US, PERIOD_US)?;
    let busy = Busy::spawn(workload, seconds + 30)?;
    cgroup.add(busy.0.id())?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while cgroup.stat("nr_throttled")? < 2 {
        if Instant::now() > deadline {
            bail!("{} did not throttle within 5 s", cgroup.path().display());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let (periods0, throttled0) = (cgroup.stat("nr_periods")?, cgroup.stat("nr_throttled")?);
    let stops0 = tracer.stops.load(Ordering::Relaxed);
    let s0 = tracer.snapshot()?;
    thread::sleep(Duration::from_secs(seconds));
    let s1 = tracer.snapshot()?;
    let (periods1, throttled1) = (cgroup.stat("nr_periods")?, cgroup.stat("nr_throttled")?);
    drop(busy);
    let path = cgroup.path().to_path_buf();
    drop(cgroup);
    // The tracer reads its ring buffer on a tick: give the last records a moment.
    thread::sleep(Duration::from_millis(300));
    Ok(Throttled {
        stats: delta(&s0, &s1),
        seconds,
        periods: periods1.saturating_sub(periods0),
        throttled_periods: throttled1.saturating_sub(throttled0),
        stop_records: tracer.stops.load(Ordering::Relaxed) - stops0,
        cgroup: path,
    })
}

/// `throttle-workload busy`: killed and reaped on drop.
struct Busy(Child);

impl Busy {
    fn spawn(workload: &Path, seconds: u64) -> Result<Self> {
        let mut command = Command::new(workload);
        command
            .args(["busy", "--threads", &BUSY_THREADS.to_string()])
            .args(["--seconds", &seconds.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: prctl is async-signal-safe.
        unsafe { command.pre_exec(|| die_with_parent(libc::SIGKILL)) };
        let child = command
            .spawn()
            .with_context(|| format!("cannot run {}", workload.display()))?;
        Ok(Self(child))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Processes and files

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// The report

struct Report {
    loops: u64,
    without: Summary,
    with: Summary,
    /// Per alternating pair, with/without − 1, in %.
    pair_slowdowns: Summary,
    /// Runs during which other processes had a `tp_sched_switch` program loaded.
    crowded_runs: usize,
    programs: Vec<Program>,
    pipe: Snapshot,
    /// The empty peer's (run_time_ns, run_cnt) during the same pipe run.
    peer: (u64, u64),
    stats_pipe_us: f64,
    throttled: Throttled,
    load: (String, String),
    elapsed: Duration,
}

impl Report {
    fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let pct = |with: f64, without: f64| (with / without - 1.0) * 100.0;
        let slowdown = pct(self.with.median, self.without.median);
        let _ = writeln!(
            s,
            "\nperf bench sched pipe -l {} (usecs/op), {} runs each, alternating; \
             tracer: --backend tracepoint --json",
            self.loops, self.with.n
        );
        let _ = writeln!(
            s,
            "{:<10} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "", "median", "mean", "min", "max", "stddev"
        );
        for (name, x) in [("without", &self.without), ("with", &self.with)] {
            let _ = writeln!(
                s,
                "{name:<10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                x.median, x.mean, x.min, x.max, x.stddev
            );
        }
        let p = &self.pair_slowdowns;
        let _ = writeln!(
            s,
            "slowdown: {slowdown:+.1}% (median vs median; budget <= {SLOWDOWN_BUDGET_PCT}%: {}); \
             mean vs mean {:+.1}%; min vs min {:+.1}%;\n          \
             per pair median {:+.1}%, min {:+.1}%, max {:+.1}%, stddev {:.1}",
            verdict(slowdown <= SLOWDOWN_BUDGET_PCT),
            pct(self.with.mean, self.without.mean),
            pct(self.with.min, self.without.min),
            p.median,
            p.min,
            p.max,
            p.stddev
        );
        if self.crowded_runs > 0 {
            let _ = writeln!(
                s,
                "note: in {} of {} runs another tracer's tp_sched_switch program was loaded too",
                self.crowded_runs,
                2 * self.with.n
            );
        }

        let t = &self.throttled;
        let _ = writeln!(
            s,
            "\nBPF programs of the tracer (kernel run-time stats, BPF_ENABLE_STATS)\n  \
             A: one more perf bench sched pipe -l {} run ({:.3} usecs/op with stats on)\n  \
             B: {} s, {} busy threads in {} (quota {QUOTA_US}/{PERIOD_US} us), \
             throttled in {} of {} periods, {} stop records",
            self.loops,
            self.stats_pipe_us,
            t.seconds,
            BUSY_THREADS,
            t.cgroup.display(),
            t.throttled_periods,
            t.periods,
            t.stop_records
        );
        let _ = writeln!(
            s,
            "{:<22} {:>9} {:>12} {:>9} {:>12} {:>9}",
            "program (tracepoint)", "prog id", "A: invoc.", "A: ns", "B: invoc.", "B: ns"
        );
        let mean = |stats: &Snapshot, id: u32| {
            let (ns, cnt) = stats.get(&id).copied().unwrap_or_default();
            (
                cnt,
                if cnt == 0 {
                    f64::NAN
                } else {
                    ns as f64 / cnt as f64
                },
            )
        };
        let ns = |x: f64| {
            if x.is_nan() {
                "-".to_owned()
            } else {
                format!("{x:.1}")
            }
        };
        for prog in &self.programs {
            let (a_cnt, a_ns) = mean(&self.pipe, prog.id);
            let (b_cnt, b_ns) = mean(&t.stats, prog.id);
            let _ = writeln!(
                s,
                "{:<22} {:>9} {a_cnt:>12} {:>9} {b_cnt:>12} {:>9}",
                prog.tracepoint,
                prog.id,
                ns(a_ns),
                ns(b_ns)
            );
        }
        let pipe_ns: u64 = self.pipe.values().map(|&(ns, _)| ns).sum();
        let per_op = pipe_ns as f64 / self.loops as f64;
        let _ = writeln!(
            s,
            "A: all programs together {per_op:.0} ns per pipe message = {:.1}% of {:.3} us/op \
             (the direct BPF cost, without cache effects)",
            per_op / (self.stats_pipe_us * 10.0),
            self.stats_pipe_us
        );
        if let Some(sw) = self
            .programs
            .iter()
            .find(|p| p.tracepoint == "sched_switch")
        {
            let (_, a) = mean(&self.pipe, sw.id);
            let (_, b) = mean(&t.stats, sw.id);
            let _ = writeln!(
                s,
                "sched_switch: {a:.1} ns/invocation (A: {}), {b:.1} ns/invocation (B: {}); \
                 budget <= {SCHED_SWITCH_BUDGET_NS} ns",
                verdict(a <= SCHED_SWITCH_BUDGET_NS),
                verdict(b <= SCHED_SWITCH_BUDGET_NS)
            );
            let (peer_ns, peer_cnt) = self.peer;
            if peer_cnt > 0 {
                let floor = peer_ns as f64 / peer_cnt as f64;
                let _ = writeln!(
                    s,
                    "peer, same run A: an empty program (r0 = 0; exit) on sched_switch, {peer_cnt} \
                     invocations, {floor:.1} ns/invocation: the floor any program pays there on \
                     this host\n              (the call and the statistics' clock reads); the \
                     tracer's sched_switch is {:.2}x that, {:.1} ns above it",
                    a / floor,
                    a - floor
                );
            }
        }
        let _ = writeln!(
            s,
            "\nload average {} at start, {} at end; {} CPUs; {:.0} s",
            self.load.0,
            self.load.1,
            thread::available_parallelism().map_or(0, usize::from),
            self.elapsed.as_secs_f64()
        );
        s
    }
}

// ---------------------------------------------------------------------------------------------
// The peer

/// The cheapest program there can be (`r0 = 0; exit`) on `sched_switch`, a plain raw
/// tracepoint program: the kernel runs it through the same `bpf_trace_run` call as the tracer's
/// tp_btf programs, so its mean run time is what any program costs there on this host.
struct EmptyPeer {
    id: u32,
    _link: OwnedFd,
    _prog: OwnedFd,
}

/// The peer's program name, to find its id among the loaded programs.
const PEER_NAME: &str = "tt_bench_empty";

impl EmptyPeer {
    fn attach() -> Result<Self> {
        // mov64 r0, 0; exit (little-endian `struct bpf_insn`s: opcode in the low byte).
        let insns: [u64; 2] = [0xb7, 0x95];
        let mut attr = zeroed_attr();
        // SAFETY: the BPF_PROG_LOAD member of a zeroed union.
        let load = unsafe { &mut attr.__bindgen_anon_3 };
        load.prog_type = bpf_prog_type::BPF_PROG_TYPE_RAW_TRACEPOINT as u32;
        load.insn_cnt = 2;
        load.insns = insns.as_ptr() as u64;
        load.license = c"GPL".as_ptr() as u64;
        for (slot, byte) in load.prog_name.iter_mut().zip(PEER_NAME.bytes()) {
            *slot = byte as libc::c_char;
        }
        let prog = bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr).context("loading the empty peer")?;
        let mut attr = zeroed_attr();
        // SAFETY: the BPF_RAW_TRACEPOINT_OPEN member of a zeroed union.
        let open = unsafe { &mut attr.raw_tracepoint };
        open.name = c"sched_switch".as_ptr() as u64;
        open.prog_fd = u32::try_from(prog.as_raw_fd()).context("program fd")?;
        let link = bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr)
            .context("attaching the empty peer to sched_switch")?;
        // Ids grow: the newest program of that name is this one.
        let id = aya::programs::loaded_programs()
            .flatten()
            .filter(|p| p.name_as_str() == Some(PEER_NAME))
            .map(|p| p.id())
            .max()
            .context("the empty peer is not among the loaded programs")?;
        Ok(Self {
            id,
            _link: link,
            _prog: prog,
        })
    }

    /// (run_time_ns, run_cnt) now.
    fn stats(&self) -> Result<(u64, u64)> {
        aya::programs::loaded_programs()
            .flatten()
            .find(|p| p.id() == self.id)
            .map(|p| {
                (
                    u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX),
                    p.run_count(),
                )
            })
            .context("the empty peer was unloaded")
    }
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: plain integers and arrays; all zero is every field's "unset".
    unsafe { std::mem::zeroed() }
}

/// The bpf(2) commands that return a new fd.
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> Result<OwnedFd> {
    // SAFETY: `attr` is a whole bpf_attr, and its size is passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            size_of::<bpf_attr>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let fd = RawFd::try_from(fd).context("bpf(2) returned no fd")?;
    // SAFETY: a new fd the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn verdict(within: bool) -> &'static str {
    if within { "within" } else { "OVER" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usecs_per_op_from_perf() {
        let out = "# Running 'sched/pipe' benchmark:\n# Executed 100000 pipe operations between two processes\n\n     Total time: 0.857 [sec]\n\n       8.572290 usecs/op\n         116654 ops/sec\n";
        assert_eq!(parse_usecs_per_op(out), Some(8.572290));
        assert_eq!(parse_usecs_per_op("Total time: 0.857 [sec]\n"), None);
    }

    #[test]
    fn link_fdinfo() {
        let text = "pos:\t0\nflags:\t02000000\nmnt_id:\t17\nino:\t1038\nlink_type:\traw_tracepoint\nlink_id:\t259\nprog_tag:\t346a43a1833c03a0\nprog_id:\t411\ntp_name:\thrtimer_expire_exit\ncookie:\t0\n";
        assert_eq!(
            parse_link_fdinfo(text),
            Some(Program {
                tracepoint: "hrtimer_expire_exit".into(),
                id: 411
            })
        );
        assert_eq!(parse_link_fdinfo("prog_id:\t3\n"), None);
    }

    #[test]
    fn summary() {
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!(
            (s.n, s.median, s.mean, s.min, s.max),
            (4, 2.5, 4.0, 1.0, 10.0)
        );
        assert!((s.stddev - 4.0825).abs() < 1e-3);
        assert_eq!(Summary::of(&[5.0]).median, 5.0);
    }
}
