//! What the host tests that trace real cgroups share: where the v1 cpu hierarchy is, and why a
//! test must skip on this machine.
use std::path::Path;

pub const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";

/// Why tracing a real v1 cgroup cannot be tested here, if it cannot.
pub fn skip_reason() -> Option<String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("no kernel BTF at /sys/kernel/btf/vmlinux".into());
    }
    if !Path::new(CPU_ROOT).join("cpu.cfs_quota_us").exists() {
        return Some(format!("no cgroup v1 cpu controller at {CPU_ROOT}"));
    }
    None
}
