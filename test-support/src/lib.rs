//! What the tracer's host tests and xtask's tasks share about the machine they run on: whether
//! it can run a test, the cpu controller's hierarchy and its files, temporary cgroups that clean
//! up after themselves, the programs (the tracer, the workload) started inside them, the
//! running kernel's version, and polling until something happens. A crate, not a module each
//! test binary compiles again, so that every part is checked once. Failures panic with what
//! failed: these are tests and test tasks.
mod cgroup;
pub mod containers;
mod cpu;
pub mod dashboard;
mod host;
pub mod http;
pub mod kernel;
mod process;
pub mod tracer;

use std::{
    thread,
    time::{Duration, Instant},
};

pub use cgroup::Cgroup;
pub use cpu::{CpuHierarchy, CpuStat, Version};
pub use host::{
    Host, applies, backend, ci, empty_stops_unaccounted, emulated, host, monotonic_ns, require,
    serial, task_based_throttle, tick_ns,
};
pub use process::{
    BPF_PERFMON, BPF_PERFMON_SYS_ADMIN, NOBODY, Running, arrivals, as_nobody, away_from, busy,
    fdinfo_values, held, last_cpu, least_privileged, move_away_from, ndjson_lines, pair, spawn_in,
    spiky, stdout_lines, tracer_program, with_bpf_perfmon_only, workload,
};

/// How often [`wait_until`] looks.
const POLL: Duration = Duration::from_millis(25);

/// Polls `done` until it holds; panics with "`what` did not happen within `limit`" if it has not.
/// The limit is a guard against hanging, not a timing assertion.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {limit:?}"
        );
        thread::sleep(POLL);
    }
}
