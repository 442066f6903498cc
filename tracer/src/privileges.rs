//! The capabilities tracing needs, read from /proc/self/status, and the one failure that names
//! the missing ones, whether found before loading or from the kernel's EPERM.
use std::fs;

use crate::error::Failure;

/// The capabilities that decide whether tracing programs may load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The `CapEff:` mask of /proc/self/status.
    pub effective: u64,
    /// Whether they are the initial user namespace's: the kernel checks CAP_BPF and
    /// CAP_PERFMON there, so those of a user namespace of its own (`unshare -U`, a rootless
    /// container) load nothing.
    pub initial_user_ns: bool,
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
        Self {
            effective,
            initial_user_ns: is_initial_user_ns(
                &fs::read_to_string("/proc/self/uid_map").unwrap_or_default(),
            ),
        }
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

    /// CAP_BPF and CAP_PERFMON (5.8+), or CAP_SYS_ADMIN, which covers both, in the initial
    /// user namespace.
    pub fn can_trace(self) -> bool {
        self.initial_user_ns && (self.sys_admin() || (self.bpf() && self.perfmon()))
    }
}

/// The initial user namespace maps every uid to itself; a namespace of its own maps a range
/// (`0 1000 1` for `unshare -r` as uid 1000). /proc/self/uid_map unreadable (no user
/// namespaces in this kernel) counts as the initial one.
fn is_initial_user_ns(uid_map: &str) -> bool {
    let fields: Vec<&str> = uid_map.split_whitespace().collect();
    fields.is_empty() || fields == ["0", "0", "4294967295"]
}

/// Loading tracing programs needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN before 5.8) in the
/// initial user namespace; checking first turns the kernel's bare EPERM into advice.
pub fn check() -> Result<(), Failure> {
    if Capabilities::of_self().can_trace() {
        Ok(())
    } else {
        Err(missing(None))
    }
}

fn user_namespace() -> Failure {
    Failure::environment(
        "this process is in a user namespace of its own, whose capabilities the kernel does \
         not count for loading eBPF programs (it checks CAP_BPF and CAP_PERFMON in the initial \
         one)",
        "run it in the host's user namespace: as root or with the capabilities on the host, \
         or in a container that does not remap users (not rootless, no userns-remap)",
    )
}

/// The failure of a process without the capabilities (or with a user namespace's only);
/// `refused` is what the kernel refused for want of them, when it was asked.
pub fn missing(refused: Option<&str>) -> Failure {
    if !Capabilities::of_self().initial_user_ns {
        return user_namespace();
    }
    let needs = "tracing needs root, or the capabilities CAP_BPF and CAP_PERFMON";
    Failure::environment(
        match refused {
            Some(refused) => format!("{needs}; without them {refused}"),
            None => needs.to_owned(),
        },
        "run it with sudo, or grant them: setcap cap_bpf,cap_perfmon+ep throttle-tracer",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_identity_map_is_the_initial_user_namespace() {
        assert!(is_initial_user_ns("         0          0 4294967295\n"));
        assert!(is_initial_user_ns(""));
        assert!(!is_initial_user_ns("         0       1000          1\n"));
        assert!(!is_initial_user_ns("0 100000 65536\n"));
    }
}
