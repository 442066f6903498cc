//! The tracepoint backend: scheduler, hrtimer and CSD tracepoints only (tp_btf), for kernels
//! without kprobes and fentry. The eBPF side (tracer-ebpf/src/tracepoint/) observes each
//! cfs_rq's `throttled` flag at sched_switch / sched_wakeup, walks the group's throttled list at
//! every CFS period/slack timer, and ends stops at the exit of the refill callbacks.
//!
//! Before attaching, the agent gives it the kallsyms addresses of the refill callbacks (the
//! hrtimer and CSD tracepoints fire for every timer and every cross-CPU call; the function
//! pointer tells ours apart). After attaching, it records when tracing was armed, so a stop
//! whose throttle began before that is reported as an unseen-start end.
use std::fs;

use aya::{
    Btf, Ebpf,
    maps::Array,
    programs::{BtfTracePoint, ProgramError},
};
use log::{debug, warn};
use tracer_common::{ABSENT, Offsets};

use super::Attached;
use crate::{error::Failure, records};

/// `TP_CONFIG` slots (tracer-ebpf/src/tracepoint/config.rs `CFG_*`).
const CFG_PERIOD_TIMER_FN: u32 = 0;
const CFG_SLACK_TIMER_FN: u32 = 1;
const CFG_CSD_UNTHROTTLE_FN: u32 = 2;
const CFG_ARMED_NS: u32 = 3;

/// (program, tracepoint, needed). Attach order: the ends first, so no stop can begin whose end
/// would go unseen; the refill entries next; the hot scheduler tracepoints last.
const PROGRAMS: [(&str, &str, bool); 10] = [
    ("tp_hrtimer_exit", "hrtimer_expire_exit", true),
    ("tp_csd_exit", "csd_function_exit", false),
    ("tp_cgroup_rmdir", "cgroup_rmdir", false),
    ("tp_cgroup_release", "cgroup_release", false),
    ("tp_hrtimer_entry", "hrtimer_expire_entry", true),
    ("tp_csd_entry", "csd_function_entry", false),
    ("tp_sched_wakeup", "sched_wakeup", true),
    ("tp_sched_wakeup_new", "sched_wakeup_new", true),
    ("tp_sched_switch", "sched_switch", true),
    ("tp_hrtimer_period", "hrtimer_expire_entry", false),
];

/// Loads and attaches the tracepoint programs; fails if the kernel lacks what they need.
pub fn attach(ebpf: &mut Ebpf, offsets: &Offsets) -> Result<Attached, Failure> {
    let missing = required_missing(offsets);
    if !missing.is_empty() {
        return Err(Failure::environment(
            format!(
                "the tracepoint backend needs kernel fields this kernel's BTF lacks: {}",
                missing.join(", ")
            ),
            "run with RUST_LOG=debug to see why each field did not resolve, and report it",
        ));
    }
    let btf = Btf::from_sys_fs().map_err(|e| {
        Failure::environment(
            format!("the tracepoint backend needs the kernel's BTF: {e}"),
            "tp_btf programs need a kernel built with CONFIG_DEBUG_INFO_BTF=y; \
             use --backend kprobe",
        )
    })?;
    let symbols = kallsyms(&[
        "sched_cfs_period_timer",
        "sched_cfs_slack_timer",
        "__cfsb_csd_unthrottle",
    ])?;
    let [period, slack, csd] = [symbols[0], symbols[1], symbols[2]];
    if period.is_none() {
        return Err(Failure::environment(
            "sched_cfs_period_timer is not in /proc/kallsyms",
            "the tracepoint backend needs a kernel with CONFIG_CFS_BANDWIDTH=y",
        ));
    }
    let async_unthrottle = offsets.rq_cfsb_csd != ABSENT && csd.is_some();
    {
        let map = ebpf
            .map_mut("TP_CONFIG")
            .ok_or_else(|| super::internal("map TP_CONFIG missing"))?;
        let mut config: Array<_, u64> =
            Array::try_from(map).map_err(|e| super::internal(&format!("TP_CONFIG: {e}")))?;
        // CFG_CSD_UNTHROTTLE_FN only once both csd programs are attached: the eBPF side
        // leaves an async unthrottle's end to the CSD's exit when it is set.
        for (slot, value) in [(CFG_PERIOD_TIMER_FN, period), (CFG_SLACK_TIMER_FN, slack)] {
            config
                .set(slot, value.unwrap_or(0), 0)
                .map_err(|e| super::internal(&format!("TP_CONFIG: {e}")))?;
        }
    }

    let mut cgroup_removal_seen = false;
    let mut csd_attached = 0;
    for (program, tracepoint, needed) in PROGRAMS {
        let is_csd = tracepoint.starts_with("csd_");
        if is_csd && !async_unthrottle {
            debug!("{tracepoint}: not needed, this kernel unthrottles inside the timer");
            continue;
        }
        match load_attach(ebpf, program, tracepoint, &btf) {
            Ok(()) if tracepoint.starts_with("cgroup_") => cgroup_removal_seen = true,
            Ok(()) if is_csd => csd_attached += 1,
            Ok(()) => {}
            Err(e) if tracepoint.starts_with("cgroup_") => {
                debug!("cannot attach {tracepoint}: {e}");
            }
            Err(e) if program == "tp_hrtimer_period" => {
                warn!(
                    "cannot attach the per-period demand program to {tracepoint} ({e}); no \
                     CPU demand is measured, so no quota advice is given"
                );
            }
            Err(e) if !needed => {
                // 6.2-6.4 unthrottle remote CPUs through a CSD but have no csd tracepoints.
                warn!(
                    "cannot attach {tracepoint} ({e}); stops ended by an async unthrottle on \
                     another CPU are seen at that CPU's next context switch instead"
                );
            }
            Err(e) => {
                return Err(Failure::environment(
                    format!("cannot attach the tp_btf program {program} to {tracepoint}: {e}"),
                    "the tracepoint backend needs BTF-enabled tracepoints (5.5+) and \
                     CAP_BPF + CAP_PERFMON",
                ));
            }
        }
    }

    let map = ebpf
        .map_mut("TP_CONFIG")
        .ok_or_else(|| super::internal("map TP_CONFIG missing"))?;
    let mut config: Array<_, u64> =
        Array::try_from(map).map_err(|e| super::internal(&format!("TP_CONFIG: {e}")))?;
    if csd_attached == 2 {
        config
            .set(CFG_CSD_UNTHROTTLE_FN, csd.unwrap_or(0), 0)
            .map_err(|e| super::internal(&format!("TP_CONFIG: {e}")))?;
    }
    config
        .set(CFG_ARMED_NS, records::monotonic_now_ns(), 0)
        .map_err(|e| super::internal(&format!("TP_CONFIG: {e}")))?;

    let mut blind_end_reasons = vec!["cpu_offline"];
    if !cgroup_removal_seen {
        blind_end_reasons.push("cgroup_gone");
    }
    Ok(Attached {
        // Quota writes are told apart only when they change quota, period or burst; see
        // `why_blind` for the rest.
        blind_end_reasons,
    })
}

/// Why this backend cannot tell `reason` ends apart, for the warning at attach.
pub fn why_blind(reason: &str) -> &'static str {
    match reason {
        "cpu_offline" => {
            "no tracepoint marks the unthrottle of CPU hot-unplug; the stop ends at the next \
             observation of its cfs_rq"
        }
        "cgroup_gone" => "neither cgroup_rmdir nor cgroup_release could be attached",
        _ => "no tracepoint marks it",
    }
}

/// The `Offsets` fields without which the backend sees nothing.
fn required_missing(o: &Offsets) -> Vec<&'static str> {
    [
        ("cfs_rq.runtime_enabled", o.cfs_rq_runtime_enabled),
        ("cfs_rq.throttled_list", o.cfs_rq_throttled_list),
        ("cfs_bandwidth.period_timer", o.cfsb_period_timer),
        ("cfs_bandwidth.slack_timer", o.cfsb_slack_timer),
        ("cfs_bandwidth.throttled_cfs_rq", o.cfsb_throttled_cfs_rq),
        ("hrtimer.function", o.hrtimer_function),
        ("task_struct.se", o.task_se),
        ("sched_entity.cfs_rq", o.se_cfs_rq),
        ("sched_entity.parent", o.se_parent),
        ("rq.clock", o.rq_clock),
        ("cfs_rq.throttled_clock", o.cfs_rq_throttled_clock),
    ]
    .into_iter()
    .filter(|&(_, v)| v == ABSENT)
    .map(|(name, _)| name)
    .collect()
}

fn load_attach(ebpf: &mut Ebpf, program: &str, tracepoint: &str, btf: &Btf) -> Result<(), String> {
    let p: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
        .try_into()
        .map_err(|e: ProgramError| format!("{program}: {e}"))?;
    p.load(tracepoint, btf).map_err(|e| verifier_text(&e))?;
    p.attach().map(|_| ()).map_err(|e| e.to_string())
}

/// The error with its source chain (a load error's text carries the verifier's log).
fn verifier_text(e: &ProgramError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The addresses of `names` in /proc/kallsyms (None for a name it lacks). Addresses read as 0
/// when kptr_restrict hides them from this process: that is an error, not "absent".
fn kallsyms(names: &[&str]) -> Result<Vec<Option<u64>>, Failure> {
    let text = fs::read_to_string("/proc/kallsyms").map_err(|e| {
        Failure::environment(
            format!("cannot read /proc/kallsyms: {e}"),
            "the tracepoint backend needs /proc/kallsyms (run as root)",
        )
    })?;
    let mut found = vec![None; names.len()];
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(addr), Some(_kind), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if fields.next().is_some() {
            continue; // a module symbol ("[module]"): never ours
        }
        if let Some(i) = names.iter().position(|n| *n == name)
            && found[i].is_none()
        {
            found[i] = u64::from_str_radix(addr, 16).ok();
        }
    }
    if found.iter().flatten().any(|&a| a == 0) {
        return Err(Failure::environment(
            "/proc/kallsyms shows zero addresses to this process",
            "run as root (kernel.kptr_restrict hides kernel addresses from others)",
        ));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_offsets_are_named() {
        let missing = required_missing(&Offsets::ABSENT);
        assert!(missing.contains(&"cfs_rq.runtime_enabled"));
        assert!(missing.contains(&"hrtimer.function"));
        assert_eq!(missing.len(), 11);
    }
}
