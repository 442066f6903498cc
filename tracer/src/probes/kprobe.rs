//! The kprobe backend: entry and return probes on `throttle_cfs_rq` / `unthrottle_cfs_rq`, and
//! on the callers of `unthrottle_cfs_rq` that tell why a stop ended.
use std::path::Path;

use aya::{Ebpf, programs::KProbe};
use log::warn;

use super::Attached;
use crate::error::Failure;

/// Callers of `unthrottle_cfs_rq` whose entry and return mark why a stop ended, with every name
/// the kernel has used for them; the first that the running kernel has is probed.
const END_CONTEXTS: &[EndContext] = &[
    EndContext {
        reason: "refill",
        programs: ("refill_enter", "refill_leave"),
        // Period and slack timers refill in distribute; since 6.2 remote CPUs unthrottle in
        // the CSD callback. Both are probed.
        functions: &["distribute_cfs_runtime", "__cfsb_csd_unthrottle"],
    },
    EndContext {
        reason: "quota_change",
        programs: ("quota_change_enter", "quota_change_leave"),
        // tg_set_cfs_bandwidth is inlined into tg_set_bandwidth on 6.18.
        functions: &["tg_set_cfs_bandwidth", "tg_set_bandwidth"],
    },
    EndContext {
        reason: "cpu_offline",
        programs: ("cpu_offline_enter", "cpu_offline_leave"),
        functions: &["rq_offline_fair"],
    },
    EndContext {
        reason: "cgroup_gone",
        programs: ("cgroup_gone_enter", "cgroup_gone_leave"),
        functions: &["destroy_cfs_bandwidth"],
    },
];

struct EndContext {
    reason: &'static str,
    programs: (&'static str, &'static str),
    functions: &'static [&'static str],
}

/// Attaches every kprobe program of the object; fails if the throttle functions cannot be probed.
pub fn attach(ebpf: &mut Ebpf) -> Result<Attached, Failure> {
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
    // Context probes first: a stop that ends between the two attach steps is then never
    // reported with a reason we could have known.
    let mut blind_end_reasons = Vec::new();
    for ctx in END_CONTEXTS {
        let mut attached = false;
        for function in ctx.functions {
            let enter = attach_kprobe(ebpf, ctx.programs.0, function);
            let leave = enter.and_then(|()| attach_kprobe(ebpf, ctx.programs.1, function));
            match leave {
                Ok(()) => attached = true,
                Err(e) => log::debug!("{} not probed at {function}: {e}", ctx.reason),
            }
        }
        if !attached {
            warn!(
                "cannot tell '{}' ends apart on this kernel (none of {} can be probed); \
                     they are reported as 'unknown'",
                ctx.reason,
                ctx.functions.join(", ")
            );
            blind_end_reasons.push(ctx.reason);
        }
    }
    for (program, function) in [
        ("unthrottle_cfs_rq", "unthrottle_cfs_rq"),
        ("unthrottle_cfs_rq_ret", "unthrottle_cfs_rq"),
        ("throttle_cfs_rq_ret", "throttle_cfs_rq"),
        ("throttle_cfs_rq", "throttle_cfs_rq"),
    ] {
        attach_kprobe(ebpf, program, function).map_err(|e| {
            Failure::environment(
                format!("cannot attach a kprobe to {function}: {e}"),
                format!(
                    "the kernel must export {function} to kprobes \
                         (check `grep -w {function} /proc/kallsyms`)"
                ),
            )
        })?;
    }
    Ok(Attached { blind_end_reasons })
}

fn attach_kprobe(ebpf: &mut Ebpf, program: &str, function: &str) -> Result<(), String> {
    let probe: &mut KProbe = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
        .try_into()
        .map_err(|e| format!("{program}: {e}"))?;
    if probe.fd().is_err() {
        probe.load().map_err(|e| format!("load {program}: {e}"))?;
    }
    probe
        .attach(function, 0)
        .map(|_| ())
        .map_err(|e| format!("{e}"))
}
