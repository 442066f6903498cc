//! What the tracer reads of the running system beyond cgroupfs and BTF: the kernel's release
//! and machine, and a stopwatch for the `startup:` debug lines. A leaf: it uses no other module of the crate.
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

/// The machine the kernel runs (`uname -m`: `x86_64`, `aarch64`), or "unknown".
pub fn machine() -> String {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut name) } != 0 {
        return "unknown".to_owned();
    }
    // SAFETY: see above.
    unsafe { std::ffi::CStr::from_ptr(name.machine.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
