//! The kprobe backend: entry and return probes on `throttle_cfs_rq` / `unthrottle_cfs_rq`, on
//! the callers of `unthrottle_cfs_rq` that tell why a stop ended, and on the period timer's
//! callback for the per-period demand; the cgroup removal's raw tracepoint (removal.rs).
use std::path::Path;

use aya::{
    Ebpf,
    programs::{KProbe, ProbeKind},
};

use super::{Attached, Spent, end_contexts, removal};
use crate::error::Failure;

/// Whether this kernel has kprobes at all.
pub fn available() -> Result<(), Failure> {
    if !Path::new("/sys/bus/event_source/devices/kprobe").exists()
        && !Path::new("/sys/kernel/tracing/kprobe_events").exists()
        && !Path::new("/sys/kernel/debug/tracing/kprobe_events").exists()
    {
        return Err(Failure::environment(
            "kprobes are not available on this kernel (CONFIG_KPROBES is off)",
            "the kprobe backend needs a kernel built with CONFIG_KPROBES; \
                 `cargo xtask demo` shows the tracer on Debian kernels in QEMU",
        ));
    }
    Ok(())
}

/// Attaches every kprobe program of the object; fails if the throttle functions cannot be probed.
pub fn attach(ebpf: &mut Ebpf) -> Result<Attached, Failure> {
    // Context probes (and the cgroup removal's) first: a stop that ends between the two attach
    // steps is then never reported with a reason we could have known.
    let mut spent = Spent::default();
    let mut blind_end_reasons = end_contexts::attach(ebpf, |ebpf, ctx, function| {
        attach_kprobe(ebpf, ctx.kprobe_programs.0, function, &mut spent)
            .and_then(|()| attach_kprobe(ebpf, ctx.kprobe_programs.1, function, &mut spent))
            .map_err(|e| e.to_string())
    });
    if !removal::attach(ebpf) {
        blind_end_reasons.push("cgroup_gone");
    }
    for (program, function) in [
        ("unthrottle_cfs_rq", "unthrottle_cfs_rq"),
        ("unthrottle_cfs_rq_ret", "unthrottle_cfs_rq"),
        ("throttle_cfs_rq_ret", "throttle_cfs_rq"),
        ("throttle_cfs_rq", "throttle_cfs_rq"),
    ] {
        attach_kprobe(ebpf, program, function, &mut spent).map_err(|e| {
            let hint = if e.errno == Some(libc::EACCES) {
                // Seen on Debian's 5.10, 6.1, 6.12 and 7.2 with CAP_BPF + CAP_PERFMON alone: the
                // kprobe's perf event is refused to them, not the function to the kprobe.
                "this kernel refuses kprobe perf events to the capabilities this process has: \
                 run as root (or add CAP_SYS_ADMIN), or use `--backend fentry` or \
                 `--backend tracepoint`, which CAP_BPF + CAP_PERFMON run"
                    .to_owned()
            } else {
                format!(
                    "the kernel must export {function} to kprobes \
                     (check `grep -w {function} /proc/kallsyms`)"
                )
            };
            Failure::environment(format!("cannot attach a kprobe to {function}: {e}"), hint)
        })?;
    }
    let demand = "sched_cfs_period_timer";
    if let Err(e) = attach_kprobe(ebpf, demand, demand, &mut spent) {
        super::warn_no_demand(demand, &e);
    }
    spent.log("kprobe");
    Ok(Attached { blind_end_reasons })
}

/// Why a kprobe did not attach, with the errno the kernel gave, if any.
#[derive(Debug)]
struct Refused {
    message: String,
    errno: Option<i32>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.errno {
            Some(errno) => write!(f, "{}: {}", self.message, super::errno::describe(errno)),
            None => f.write_str(&self.message),
        }
    }
}

impl From<String> for Refused {
    fn from(message: String) -> Self {
        Self {
            message,
            errno: None,
        }
    }
}

fn attach_kprobe(
    ebpf: &mut Ebpf,
    program: &str,
    function: &str,
    spent: &mut Spent,
) -> Result<(), Refused> {
    let probe: &mut KProbe = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
        .try_into()
        .map_err(|e| format!("{program}: {e}"))?;
    if probe.fd().is_err() {
        spent
            .load(|| probe.load())
            .map_err(|e| format!("load {program}: {e}"))?;
    }
    spent
        .attach(|| probe.attach(function, 0))
        .map_err(|e| Refused {
            errno: super::errno::of(&e),
            message: e.to_string(),
        })?;
    let kind = match probe.kind() {
        ProbeKind::Entry => "kprobe",
        ProbeKind::Return => "kretprobe",
    };
    super::log_attached(kind, program, probe.info(), function);
    Ok(())
}
