//! What the unit tests that read this machine share (the host tests have theirs in the
//! test-support crate): a test that cannot run here either lacks something this machine should
//! have, which fails under `CI=true` ([`missing`]), or checks a fact of another kernel
//! ([`not_applicable`]), which never fails. Both say so on stderr. Also the record the unit
//! tests of every layer build on ([`ended`]).

use crate::records::{Bandwidth, EndReason, EndedStop, HeldThread, Period, Stop, Task};

/// This machine lacks what the test needs: a failure under `CI=true`, else a visible skip.
pub fn missing(reason: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: this test must run here, but {reason}"
    );
    eprintln!("skipped: {reason}");
}

/// The test checks another kernel's facts.
pub fn not_applicable(reason: &str) {
    eprintln!("not applicable here: {reason}");
}

/// 1 ms in ns.
pub const MS: u64 = 1_000_000;

/// A refill-ended stop of cgroup 4242 on `cpu` from `start_ms` to `end_ms`, with every field set.
pub fn ended(cpu: u32, start_ms: u64, end_ms: u64) -> EndedStop {
    EndedStop {
        stop: Stop {
            cgroup_id: 4242,
            cpu,
            start_ns: start_ms * MS,
            bandwidth: Bandwidth {
                quota_ns: Some(20 * MS),
                period_ns: Some(100 * MS),
                burst_ns: Some(0),
            },
            tasks: 2,
            task: Some(Task {
                pid: 100,
                tid: 101,
                comm: "stress".into(),
            }),
            parked: 1,
            park_ns: Some(start_ms * MS + 2_000),
            kernel_start_clock: Some(5_000 * MS),
            descendant: None,
            children: Vec::new(),
            children_unlisted: 0,
            threads: vec![HeldThread {
                pid: 100,
                tid: 101,
                comm: "stress".into(),
                since_ns: start_ms * MS + 2_000,
            }],
            threads_unlisted: 1,
        },
        end_ns: end_ms * MS,
        kernel_ns: Some((end_ms - start_ms) * MS + 1_000),
        reason: EndReason::Refill,
    }
}

/// A known period of cgroup 1 ending at `end_ms` (100 ms long) with `usage_ms` used on
/// `cpus` CPUs, ending throttled or not.
pub fn period(end_ms: u64, usage_ms: u64, cpus: u32, throttled: bool) -> Period {
    Period {
        cgroup_id: 1,
        end_ns: end_ms * MS,
        start_ns: Some((end_ms - 100) * MS),
        usage_ns: usage_ms * MS,
        max_cpu_ns: usage_ms * MS / u64::from(cpus.max(1)),
        cpus_used: cpus,
        throttled_cpus: u32::from(throttled) * cpus,
        bandwidth: Bandwidth {
            quota_ns: Some(50 * MS),
            period_ns: Some(100 * MS),
            burst_ns: Some(0),
        },
        runtime_ns: None,
        burst_spent_ns: None,
    }
}
