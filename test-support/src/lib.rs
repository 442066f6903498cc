//! What the tracer's tests and xtask's tasks share about the machine they run on: the cpu
//! controller's hierarchy and its files, temporary cgroups that clean up after themselves, the
//! running kernel's version, and polling until something happens. Failures panic with what
//! failed: these are tests and test tasks.
mod cgroup;
mod cpu;
pub mod kernel;

use std::{
    thread,
    time::{Duration, Instant},
};

pub use cgroup::Cgroup;
pub use cpu::{CpuHierarchy, CpuStat, Version};

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
