//! Ancestor throttling on this host (`--backend tracepoint`, cgroup v1): the quota lives on a
//! parent, the work runs in its two children. The children's own cpu.stat shows nothing; the
//! tracer attributes the parent's stops to them, and their cpu.stat.local (the kernel's time
//! their cfs_rqs were stopped by their own or an ancestor's quota, read here independently of
//! the tracer) agrees with the kernel time of the stops attributed to them.
//!
//! Needs root, kernel BTF and the cgroup v1 cpu controller with cpu.stat.local (6.6+) at
//! /sys/fs/cgroup/cpu; otherwise it prints "skipped: reason".
use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use serde_json::Value;

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
const WORKLOAD: &str = env!("CARGO_BIN_EXE_throttle-workload");
const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";

fn skip_reason() -> Option<String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("no kernel BTF at /sys/kernel/btf/vmlinux".into());
    }
    if !Path::new(CPU_ROOT).join("cpu.stat.local").exists() {
        return Some(format!(
            "no cgroup v1 cpu controller with cpu.stat.local (6.6+) at {CPU_ROOT}"
        ));
    }
    if thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Some("fewer than 2 CPUs".into());
    }
    None
}

/// The parent with the quota, its two children, the tracer and the workloads. Drop kills the
/// processes and removes the cgroups, children first, also when an assertion failed.
struct Family {
    parent: PathBuf,
    name: String,
    children: Vec<PathBuf>,
    processes: Vec<Child>,
}

impl Family {
    fn new() -> Self {
        let name = format!("anc-{}", std::process::id());
        let parent = Path::new(CPU_ROOT).join(&name);
        fs::create_dir(&parent).expect("create parent cgroup");
        let mut family = Self {
            parent,
            name,
            children: Vec::new(),
            processes: Vec::new(),
        };
        write(&family.parent, "cpu.cfs_period_us", "100000");
        write(&family.parent, "cpu.cfs_quota_us", "50000");
        // The most shares v1 allows: other work on the machine cannot keep the group under
        // its quota (see host_tracepoint.rs).
        write(&family.parent, "cpu.shares", "262144");
        for child in ["c1", "c2"] {
            let dir = family.parent.join(child);
            fs::create_dir(&dir).expect("create child cgroup");
            family.children.push(dir);
        }
        family
    }

    /// Starts the tracer filtered on the parent; returns its stdout lines after `start`.
    fn start_tracer(&mut self) -> mpsc::Receiver<String> {
        let mut child = Command::new(TRACER)
            .args(["--backend", "tracepoint", "--json", "--cgroup"])
            .arg(format!("/{}", self.name))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn throttle-tracer");
        let stdout = child.stdout.take().expect("tracer stdout");
        self.processes.push(child);
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
        rx
    }

    /// One busy thread in child `i`, pinned to CPU `i` (as `taskset -c i` would).
    fn spawn_busy(&mut self, i: usize, seconds: u32) -> Child {
        let mut cmd = Command::new(WORKLOAD);
        cmd.args(["busy", "--threads", "1", "--seconds", &seconds.to_string()]);
        let procs = self.children[i].join("cgroup.procs");
        let procs_c = std::ffi::CString::new(procs.to_str().unwrap()).unwrap();
        // SAFETY: between fork and exec only async-signal-safe calls (open/write/close,
        // sched_setaffinity) on memory prepared before the fork.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                let fd = libc::open(procs_c.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                libc::close(fd);
                if written != 2 {
                    return Err(std::io::Error::last_os_error());
                }
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(i, &mut set);
                if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().expect("spawn throttle-workload")
    }

    /// SIGINTs the tracer and returns every line it printed after `start`.
    fn stop_tracer(&mut self, rx: mpsc::Receiver<String>) -> Vec<Value> {
        let mut tracer = self.processes.remove(0);
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
        let status = tracer.wait().expect("wait tracer");
        assert!(status.success(), "tracer: {status}");
        rx.iter()
            .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

impl Drop for Family {
    fn drop(&mut self) {
        for child in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Children first: a v1 cgroup with children cannot be removed. rmdir may still race
        // the exit of the processes just reaped.
        for dir in self.children.iter().rev().chain([&self.parent]) {
            for _ in 0..50 {
                if fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
            if dir.exists() {
                eprintln!("could not remove {}", dir.display());
            }
        }
    }
}

fn write(dir: &Path, file: &str, value: &str) {
    fs::write(dir.join(file), value).unwrap_or_else(|e| panic!("write {value} to {file}: {e}"));
}

/// `name`'s value (ns) in the flat-keyed file `dir/file`.
fn stat(dir: &Path, file: &str, name: &str) -> u64 {
    let text = fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{file} has no {name}: {text}"))
}

/// Parent 50 ms / 100 ms; c1 and c2 (no quota) each run one busy thread, on CPUs 0 and 1.
/// The tracer is filtered on the parent: the filter names quota owners, and the descendants
/// of a named owner are attributed with it.
#[test]
fn parent_quota_stops_are_attributed_to_the_children() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut family = Family::new();
    let rx = family.start_tracer();
    // The children are new and empty: every stop of their tasks falls inside the trace, and
    // after the workloads exit, the last refill ends every stop before the files are read.
    let read = |f: &Family| -> Vec<(u64, u64)> {
        f.children
            .iter()
            .map(|c| {
                (
                    stat(c, "cpu.stat", "throttled_time"),
                    stat(c, "cpu.stat.local", "throttled_time"),
                )
            })
            .collect()
    };
    let before = read(&family);
    let mut workloads = vec![family.spawn_busy(0, 3), family.spawn_busy(1, 3)];
    for w in &mut workloads {
        let status = w.wait().expect("wait workload");
        assert!(status.success(), "workload: {status}");
    }
    thread::sleep(Duration::from_millis(300));
    let after = read(&family);
    let lines = family.stop_tracer(rx);

    let summaries: Vec<&Value> = lines.iter().filter(|v| v["type"] == "summary").collect();
    let summary_of = |path: &str| {
        *summaries
            .iter()
            .find(|s| s["cgroup"] == path)
            .unwrap_or_else(|| panic!("no summary for {path}: {summaries:#?}"))
    };
    let parent_path = format!("/{}", family.name);
    let parent = summary_of(&parent_path);
    println!("parent summary: {parent}");
    assert!(parent["stops"].as_u64().unwrap() > 0, "{parent}");
    // As in tests/demo.rs: the exact check needs a trace of the parent the report does not
    // flag incomplete (the tracepoint backend sometimes misses part of a stop: an end without
    // its start, or a start replacing a lost end).
    let flag = |k: &str| parent[k].as_u64().unwrap_or(0);
    let parent_gap = parent["cpu_stat"]["throttled_ns"]
        .as_u64()
        .unwrap()
        .abs_diff(flag("kernel_accounted_ns"));
    let incomplete = flag("unmatched_ends") + flag("restarted") + flag("kernel_unknown_stops") > 0
        || flag("open") > 0
        || parent_gap > 0;
    for stop in lines.iter().filter(|v| v["type"] == "stop") {
        let (k, d) = (stop["kernel_ns"].as_u64(), stop["duration_ns"].as_u64());
        if let (Some(k), Some(d)) = (k, d)
            && k.abs_diff(d) > 5_000_000
        {
            println!("parent stop whose kernel time is far from its length: {stop}");
        }
    }
    let descendants = parent["descendants"].as_array().unwrap();
    let ids: Vec<&Value> = descendants.iter().map(|d| &d["cgroup_id"]).collect();
    let mut per_cpu = std::collections::BTreeMap::<(u64, u64), (u64, u64)>::new();
    for stop in lines.iter().filter(|v| v["type"] == "stop") {
        let key = (
            stop["cpu"].as_u64().unwrap(),
            stop["descendant_cgroup_id"].as_u64().unwrap_or(0),
        );
        let e = per_cpu.entry(key).or_default();
        e.0 += 1;
        e.1 += stop["kernel_ns"].as_u64().unwrap_or(0);
    }
    println!("parent stops by (cpu, descendant id): (count, kernel ns) {per_cpu:?}; ids {ids:?}");
    for stop in lines.iter().filter(|v| v["type"] == "stop") {
        let d = &stop["descendant_cgroup_id"];
        if d.is_null() || !ids.contains(&d) {
            println!("stop not attributed to a child: {stop}");
        }
    }
    for (i, child) in ["c1", "c2"].iter().enumerate() {
        let path = format!("{parent_path}/{child}");
        let s = summary_of(&path);
        // Stopped only by the parent's quota: no stop of its own.
        assert_eq!(s["stops"], 0, "{s}");
        let by = s["stopped_by_ancestor"].as_array().unwrap();
        assert_eq!(by.len(), 1, "{s}");
        assert_eq!(by[0]["cgroup"], parent_path.as_str(), "{s}");
        let stops = by[0]["stops"].as_u64().unwrap();
        assert!(stops > 0, "{s}");
        assert!(
            descendants
                .iter()
                .any(|d| d["cgroup"] == path.as_str() && d["stops"] == stops),
            "{parent}"
        );
        let attributed = by[0]["kernel_ns"].as_u64().unwrap();
        // The parent's stops on this child's CPU that named no stopped task (not attributed).
        let unnamed: Vec<&Value> = lines
            .iter()
            .filter(|v| v["type"] == "stop" && v["cpu"] == i && v["descendant_cgroup_id"].is_null())
            .collect();
        println!("{path}: parent stops on cpu {i} naming no task: {unnamed:?}");
        let own = after[i].0 - before[i].0;
        let local = after[i].1 - before[i].1;
        let error = (attributed as f64 - local as f64) / local.max(1) as f64;
        println!(
            "{path}: {stops} stops by {parent_path}'s quota, attributed kernel time {attributed} \
             ns vs cpu.stat.local {local} ns ({:+.4}%); own cpu.stat throttled_time {own} ns; \
             tracer's local_accounted_ns {}",
            error * 100.0,
            s["local_accounted_ns"]
        );
        // The users' complaint: the child's own counter says it was never throttled.
        assert_eq!(own, 0, "{path} own cpu.stat throttled_time");
        assert!(local > 0, "{path} cpu.stat.local never grew");
        if incomplete {
            // The backend lost part of a parent stop (its own check shows it): the child can
            // be off by what the parent's trace misses, and no more.
            println!(
                "{path}: the parent's trace is incomplete ({parent_gap} ns short of its \
                 cpu.stat): checked within that instead of 1%"
            );
            assert!(
                attributed.abs_diff(local) <= parent_gap + local / 100,
                "{path}: attributed {attributed} ns vs cpu.stat.local {local} ns"
            );
        } else {
            assert!(
                error.abs() <= 0.01,
                "{path}: attributed {attributed} ns vs cpu.stat.local {local} ns"
            );
        }
    }
}
