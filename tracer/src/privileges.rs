//! The capabilities tracing needs, read from /proc/self/status, and the one failure that names
//! the missing ones, whether found before loading or from the kernel's EPERM.
use std::fs;

use crate::error::Failure;

/// The capabilities that decide whether tracing programs may load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The `CapEff:` mask of /proc/self/status.
    pub effective: u64,
}

impl Capabilities {
    const SYS_ADMIN: u32 = 21;
    const PERFMON: u32 = 38;
    const BPF: u32 = 39;

    pub fn of_self() -> Self {
        let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
        let effective = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or(0);
        Self { effective }
    }

    fn has(self, cap: u32) -> bool {
        self.effective & (1 << cap) != 0
    }

    pub fn sys_admin(self) -> bool {
        self.has(Self::SYS_ADMIN)
    }

    pub fn bpf(self) -> bool {
        self.has(Self::BPF)
    }

    pub fn perfmon(self) -> bool {
        self.has(Self::PERFMON)
    }

    /// CAP_BPF and CAP_PERFMON (5.8+), or CAP_SYS_ADMIN, which covers both.
    pub fn can_trace(self) -> bool {
        self.sys_admin() || (self.bpf() && self.perfmon())
    }
}

/// Loading tracing programs needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN before 5.8);
/// checking first turns the kernel's bare EPERM into advice.
pub fn check() -> Result<(), Failure> {
    if Capabilities::of_self().can_trace() {
        Ok(())
    } else {
        Err(missing(None))
    }
}

/// The failure of a process without the capabilities; `refused` is what the kernel refused
/// for want of them, when it was asked.
pub fn missing(refused: Option<&str>) -> Failure {
    let needs = "tracing needs root, or the capabilities CAP_BPF and CAP_PERFMON";
    Failure::environment(
        match refused {
            Some(refused) => format!("{needs}; without them {refused}"),
            None => needs.to_owned(),
        },
        "run it with sudo, or grant them: setcap cap_bpf,cap_perfmon+ep throttle-tracer",
    )
}
