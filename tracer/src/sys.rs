//! What the tracer reads of the running system beyond cgroupfs and BTF: the kernel's release
//! and a stopwatch for the `startup:` debug lines. A leaf: it uses no other module of the crate.
use std::{fs, time::Instant};

/// Milliseconds since `since`, for the `startup:` debug lines `cargo xtask bench` reads.
pub fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// The running kernel's release (`uname -r`), or "unknown".
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}
