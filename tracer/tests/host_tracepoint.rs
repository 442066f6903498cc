//! `--backend tracepoint` on this host, against real cgroup v1 quotas and the kernel's own
//! cpu.stat (read here, independently of the tracer). Needs root, kernel BTF and the cgroup v1
//! cpu controller at /sys/fs/cgroup/cpu; otherwise each test prints "skipped: reason".
//!
//! The tests share the machine's CPUs, so they run one at a time.
mod common;

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, mpsc},
    thread,
    time::Duration,
};

use serde_json::Value;

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
const WORKLOAD: &str = env!("CARGO_BIN_EXE_throttle-workload");

static SERIAL: Mutex<()> = Mutex::new(());

/// A cgroup and the processes of one test; Drop kills them and removes the cgroup, also when
/// an assertion failed.
struct Scene {
    cgroup: PathBuf,
    name: String,
    tracer: Option<Child>,
    workload: Option<Child>,
}

impl Scene {
    fn new(tag: &str, quota_us: u64, period_us: u64) -> Self {
        let name = format!("tt-host-{tag}-{}", std::process::id());
        let cgroup = Path::new(common::CPU_ROOT).join(&name);
        fs::create_dir(&cgroup).expect("create cgroup");
        let scene = Self {
            cgroup,
            name,
            tracer: None,
            workload: None,
        };
        scene.write("cpu.cfs_period_us", &period_us.to_string());
        scene.write("cpu.cfs_quota_us", &quota_us.to_string());
        scene
    }

    fn write(&self, file: &str, value: &str) {
        fs::write(self.cgroup.join(file), value)
            .unwrap_or_else(|e| panic!("write {value} to {file}: {e}"));
    }

    fn cpu_stat(&self) -> CpuStat {
        let text = fs::read_to_string(self.cgroup.join("cpu.stat")).expect("read cpu.stat");
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or_else(|| panic!("cpu.stat has no {name}: {text}"))
        };
        CpuStat {
            nr_throttled: field("nr_throttled"),
            throttled_ns: field("throttled_time"),
        }
    }

    /// Starts the tracer for this cgroup and returns its stdout lines once `start` was printed.
    fn start_tracer(&mut self) -> mpsc::Receiver<String> {
        let mut child = Command::new(TRACER)
            .args(["--backend", "tracepoint", "--json", "--cgroup"])
            .arg(format!("/{}", self.name))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn throttle-tracer");
        let stdout = child.stdout.take().expect("tracer stdout");
        self.tracer = Some(child);
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // A guard against hanging forever, not a timing assertion.
        let first = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the tracer printed nothing (see its stderr above)");
        let v: Value = serde_json::from_str(&first).expect("first line is JSON");
        assert_eq!(v["type"], "start", "{first}");
        assert_eq!(v["backend"], "tracepoint", "{first}");
        rx
    }

    /// Runs the busy workload inside the cgroup (optionally pinned to one CPU) until it exits.
    fn run_workload(&mut self, threads: u32, seconds: u32, cpu: Option<usize>) {
        let mut cmd = Command::new(WORKLOAD);
        cmd.args([
            "busy",
            "--threads",
            &threads.to_string(),
            "--seconds",
            &seconds.to_string(),
        ]);
        let procs = self.cgroup.join("cgroup.procs");
        // SAFETY: between fork and exec only async-signal-safe calls: open/write/close and
        // sched_setaffinity, on memory prepared before the fork.
        let procs_c = std::ffi::CString::new(procs.to_str().unwrap()).unwrap();
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                // Enter the cgroup before exec, so every thread the workload makes is inside.
                let fd = libc::open(procs_c.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                libc::close(fd);
                if written != 2 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(cpu) = cpu {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn throttle-workload");
        self.workload = Some(child);
        let status = self
            .workload
            .as_mut()
            .unwrap()
            .wait()
            .expect("wait workload");
        self.workload = None;
        assert!(status.success(), "workload: {status}");
    }

    /// SIGINTs the tracer and returns every line it printed after `start`.
    fn stop_tracer(&mut self, rx: mpsc::Receiver<String>) -> Vec<Value> {
        let mut child = self.tracer.take().expect("tracer running");
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let status = child.wait().expect("wait tracer");
        assert!(status.success(), "tracer: {status}");
        rx.iter()
            .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        for child in [self.workload.take(), self.tracer.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        // The cgroup is empty once its processes are reaped; rmdir may still race the exit.
        for _ in 0..50 {
            if fs::remove_dir(&self.cgroup).is_ok() || !self.cgroup.exists() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.cgroup.display());
    }
}

#[derive(Debug, Clone, Copy)]
struct CpuStat {
    nr_throttled: u64,
    throttled_ns: u64,
}

fn of_type<'a>(lines: &'a [Value], t: &str) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["type"] == t).collect()
}

/// Every stop is reported once: one throttle of one cfs_rq (CPU) is one stop line, however many
/// CPUs saw its end (the timer's exit, the CSD's exit, the next context switch).
fn assert_each_stop_once(stops: &[&Value]) {
    let mut seen = std::collections::HashSet::new();
    for s in stops {
        let key = (s["cpu"].as_u64(), s["start_ns"].as_u64());
        assert!(seen.insert(key), "stop reported twice: {s}");
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Time for the last period timer to refill what the workload left throttled.
const SETTLE: Duration = Duration::from_millis(300);

/// The most `cpu.shares` cgroup v1 allows (the kernel's MAX_SHARES, 1 << 18).
const MAX_SHARES: &str = "262144";

/// One busy thread at 20 ms / 100 ms: each stop is the rest of the period, 80 ms.
///
/// "80 ms" is quota arithmetic for one CPU that the group has to itself whenever it has
/// quota: it spends its 20 ms in the first 20 ms of wall time after each refill and is
/// stopped for the other 80. The setup makes that premise true as far as it can:
/// - Pinned to one CPU (as `taskset -c <last CPU>` would): one cfs_rq spends the whole quota,
///   so every period holds exactly one per-CPU stop.
/// - `cpu.shares` at its maximum: other runnable work on that CPU (other tests, builds)
///   would otherwise share the CPU with the group while it has quota; its 20 ms of CPU then
///   take more than 20 ms of wall time and every stop really is shorter than 80 ms. The
///   kernel agrees: its own accounting (cpu.stat throttled_time, each stop's kernel_ns)
///   shrinks the same way. Measured here under a load average of ~4 on 2 CPUs: stops of
///   57-73 ms (median 62-66) at the default 1024 shares, pinned or not, and no slack-timer
///   refill at all (every stop ended at the period timer); 77-78 ms at 262144 shares.
///
/// What the setup cannot remove: an unthrottle reschedules only an idle CPU, so when other
/// work is running there at the refill the group starts at that CPU's next tick (HZ=250:
/// up to 4 ms later, at the same phase every period). On a loaded machine the median is then
/// 0-4 ms short of 80 ms; on an idle CPU it is 80 ms. The assertion is unchanged; the test
/// prints the unthrottled spans (refill to next stop) so that a contended CPU shows as such.
#[test]
fn one_thread_stops_last_the_rest_of_the_period() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(reason) = common::skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut scene = Scene::new("one", 20_000, 100_000);
    scene.write("cpu.shares", MAX_SHARES);
    let rx = scene.start_tracer();
    // Pinned to the last CPU (the same as `taskset -c <last>`): see above.
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    scene.run_workload(1, 2, Some(cpus - 1));
    thread::sleep(SETTLE);
    let lines = scene.stop_tracer(rx);

    let stops = of_type(&lines, "stop");
    assert!(stops.len() >= 10, "{} stops: {lines:#?}", stops.len());
    assert_each_stop_once(&stops);
    for s in &stops {
        assert_eq!(s["cgroup"], format!("/{}", scene.name));
        assert_eq!(s["quota_ns"], 20_000_000);
        assert_eq!(s["period_ns"], 100_000_000);
        assert_eq!(s["end"], "refill", "{s}");
        assert!(s["kernel_ns"].is_u64(), "{s}");
    }
    let durations: Vec<u64> = stops
        .iter()
        .map(|s| s["duration_ns"].as_u64().unwrap())
        .collect();
    let m = median(durations.clone());
    // Wall time from each refill to the next stop: the 20 ms quota when the CPU was the group's.
    let mut spans: Vec<u64> = stops
        .windows(2)
        .filter_map(|w| {
            let end = w[0]["end_ns"].as_u64()?;
            w[1]["start_ns"].as_u64()?.checked_sub(end)
        })
        .collect();
    spans.sort_unstable();
    let ms = |v: &[u64]| v.iter().map(|d| d / 1_000_000).collect::<Vec<_>>();
    println!(
        "stops {} median {:.3} ms; durations ms {:?}; unthrottled spans ms {:?}",
        stops.len(),
        m as f64 / 1e6,
        ms(&durations),
        ms(&spans)
    );
    assert!(
        m.abs_diff(80_000_000) <= 3_000_000,
        "median stop {m} ns is not 80 ms ± 3 ms (unthrottled spans, ms: {:?}; well above 20 ms \
         means other work shared the CPU with the group while it had quota)",
        ms(&spans)
    );
    for s in &stops {
        // 6.18 parks the busy thread at every stop; older kernels park nothing.
        let parked = s["parked"].as_u64().unwrap();
        assert!(parked <= 1, "{s}");
        if parked == 1 {
            let park = s["park_ns"].as_u64().unwrap();
            let (start, end) = (
                s["start_ns"].as_u64().unwrap(),
                s["end_ns"].as_u64().unwrap(),
            );
            assert!((start..=end).contains(&park), "{s}");
        }
    }
}

/// Two busy threads at 50 ms / 100 ms on two CPUs: the kernel-accounted time the tracer reports
/// is what cpu.stat's throttled_time grew by, and its group stops are the throttled periods.
#[test]
fn kernel_accounted_time_matches_cpu_stat() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(reason) = common::skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut scene = Scene::new("two", 50_000, 100_000);
    // Without it, other work on the machine can keep the group under its quota: few stops.
    scene.write("cpu.shares", MAX_SHARES);
    // The tracer runs before the workload enters the cgroup, and after the workload is gone
    // the last refill ends every stop before cpu.stat is read: both windows hold every stop.
    let rx = scene.start_tracer();
    let before = scene.cpu_stat();
    scene.run_workload(2, 3, None);
    thread::sleep(SETTLE);
    let after = scene.cpu_stat();
    let lines = scene.stop_tracer(rx);

    let stops = of_type(&lines, "stop");
    let summary = of_type(&lines, "summary");
    assert_eq!(summary.len(), 1, "{lines:#?}");
    let summary = summary[0];
    assert_each_stop_once(&stops);
    let kernel: u64 = stops
        .iter()
        .map(|s| {
            s["kernel_ns"]
                .as_u64()
                .unwrap_or_else(|| panic!("no kernel_ns: {s}"))
        })
        .sum();
    let unseen = summary["unseen_start_kernel_ns"].as_u64().unwrap();
    let traced = kernel + unseen;
    let truth = after.throttled_ns - before.throttled_ns;
    let periods = after.nr_throttled - before.nr_throttled;
    let group_stops = summary["group_stops"].as_u64().unwrap();
    let error = (traced as f64 - truth as f64) / truth as f64;
    println!(
        "stops {} Σkernel {traced} ns vs cpu.stat {truth} ns ({:+.4}%); group stops {group_stops} \
         vs nr_throttled {periods}; open {}",
        stops.len(),
        error * 100.0,
        summary["open"]
    );
    assert!(truth > 0, "the group was never throttled");
    assert_eq!(summary["open"], 0, "{summary}");
    assert!(error.abs() <= 0.01, "Σ kernel {traced} vs cpu.stat {truth}");
    let tolerance = (periods as f64 * 0.02).max(1.0);
    assert!(
        (group_stops as f64 - periods as f64).abs() <= tolerance,
        "group stops {group_stops} vs nr_throttled {periods}"
    );
}
