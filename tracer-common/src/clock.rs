//! The clocks userspace reads by number: CLOCK_MONOTONIC, the clock the programs stamp records
//! with (`bpf_ktime_get_ns`), CLOCK_REALTIME, and the CPU-time clocks a workload burns by. One
//! reader for the tracer, its demo workload and the tests' workloads.

/// `clock` now, in ns.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clocks used here exist on every Linux
    // kernel, so the call cannot fail and the fields stay non-negative.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Burns `ns` of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID, so time spent stopped by a
/// quota does not count); returns what it burned.
pub fn burn(ns: u64) -> u64 {
    let start = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let mut used = 0;
    while used < ns {
        used = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(start);
    }
    used
}
