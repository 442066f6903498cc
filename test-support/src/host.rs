//! The machine a test runs on: whether it can run the test (and what a skip means under
//! `CI=true`), one test at a time on its CPUs, the backend and emulation the run asks for, its
//! clock and tick.
use std::{
    fmt::Display,
    io::Write as _,
    path::Path,
    sync::{Mutex, MutexGuard},
    thread,
    time::Duration,
};

use crate::{CpuHierarchy, kernel};

/// Whether the running kernel throttles tasks rather than runqueues ([`kernel`]).
pub fn task_based_throttle() -> bool {
    kernel::task_based_throttle(&kernel::release())
}

/// Whether a stop of an empty runqueue adds nothing to cpu.stat here ([`kernel`]).
pub fn empty_stops_unaccounted() -> bool {
    kernel::empty_stops_unaccounted(&kernel::release())
}

/// Whether the tests run as CI runs them (`CI=true`): then a skip for want of something the
/// machine could have is a failure, not a pass.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// `need`'s value, or `None` when this machine lacks what the test needs but could have it
/// (root, kernel BTF, a cpu controller, an installed tool). Under `CI=true` that panics: CI
/// must not report as passed a test that never ran. Elsewhere the reason goes to stderr.
pub fn require<T>(need: Result<T, impl Display>) -> Option<T> {
    match need {
        Ok(value) => Some(value),
        Err(reason) => {
            assert!(!ci(), "CI=true: this test must run here, but {reason}");
            say("skipped", &reason);
            None
        }
    }
}

/// Whether a test about one kind of kernel or machine applies here (`Err` says why not, e.g.
/// "this kernel has kprobes"). That is a fact of the machine, not a missing set-up, so it
/// does not fail under `CI=true`; it is said on stderr either way.
pub fn applies(fact: Result<(), impl Display>) -> bool {
    match fact {
        Ok(()) => true,
        Err(reason) => {
            say("not applicable here", &reason);
            false
        }
    }
}

/// One line on stderr naming the test, written past libtest's capture (which holds a passing
/// test's output back): a test that did not run shows in every run's output.
fn say(what: &str, reason: &dyn Display) {
    let test = thread::current().name().unwrap_or("a test").to_owned();
    let _ = writeln!(std::io::stderr(), "{test}: {what}: {reason}");
}

/// The machine for one test that traces real cgroups: root, kernel BTF and a cpu hierarchy,
/// and the tests of this binary one at a time (they pin work to the same CPUs).
pub struct Host {
    pub cpu: CpuHierarchy,
    _serial: MutexGuard<'static, ()>,
}

/// [`Host`], or why this machine cannot trace real cgroups.
pub fn host() -> Result<Host, String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err("no kernel BTF at /sys/kernel/btf/vmlinux".into());
    }
    let cpu = CpuHierarchy::find()?;
    Ok(Host {
        cpu,
        _serial: serial(),
    })
}

/// One test at a time, for the tests of a binary that load the CPUs without [`host`].
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// CLOCK_MONOTONIC now, in ns: the clock of the tracer's `*_ns` times.
pub fn monotonic_ns() -> u64 {
    tracer_common::clock::clock_ns(libc::CLOCK_MONOTONIC)
}

/// The backend the tests trace with: `TT_TEST_BACKEND` if set, else tracepoint, the one this
/// host's kernel allows (6.18: no kprobes, fentry refused). vm-test's guests set each backend
/// for the kernel facts, and kprobe for the rest (xtask/src/guest_tests.rs).
pub fn backend() -> String {
    std::env::var("TT_TEST_BACKEND").unwrap_or_else(|_| "tracepoint".into())
}

/// Whether the tests run in an emulated VM (`TT_TEST_EMULATED=1`, set by vm-test's guests):
/// single-threaded TCG runs the two vCPUs in turn, so a thread's view of the clock can lag
/// its CPU's events by the other vCPU's turn (milliseconds). Timing bounds that hold on real
/// CPUs to a millisecond widen there; nothing else changes.
pub fn emulated() -> bool {
    std::env::var("TT_TEST_EMULATED").is_ok_and(|v| v == "1")
}

/// The kernel's tick: the jiffies counter's pace against the monotonic clock, both read from
/// /proc/timer_list 200 ms apart, rounded to the nearest of the HZ values Linux offers; 10 ms
/// (HZ=100, the coarsest) if the file cannot be read.
pub fn tick_ns() -> u64 {
    let read = || -> Option<(u64, u64)> {
        let list = std::fs::read_to_string("/proc/timer_list").ok()?;
        let value = |prefix: &str| -> Option<u64> {
            list.lines()
                .find_map(|l| l.strip_prefix(prefix))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        Some((value("now at ")?, value("jiffies: ")?))
    };
    let hz = (|| {
        let (t0, j0) = read()?;
        thread::sleep(Duration::from_millis(200));
        let (t1, j1) = read()?;
        let measured = (j1 - j0) as f64 * 1e9 / (t1 - t0) as f64;
        [100u64, 250, 300, 1000]
            .into_iter()
            .min_by_key(|hz| (*hz as f64 - measured).abs() as u64)
    })();
    let hz = hz.unwrap_or_else(|| {
        eprintln!("/proc/timer_list unreadable: taking the coarsest tick, HZ=100");
        100
    });
    1_000_000_000 / hz
}
