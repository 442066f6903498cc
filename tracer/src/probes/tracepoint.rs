//! The tracepoint backend, for kernels without kprobes and fentry: scheduler, hrtimer and CSD
//! tracepoints only (tp_btf, and a raw tracepoint on `csd_function_entry`). It attaches the
//! programs of tracer-ebpf/src/tracepoint/, which tell our timers and CSDs apart by function
//! pointers learnt from the kernel's own structures (docs/kernel.md §8), then writes when tracing
//! was armed (docs/design.md, "The tracepoint backend's start").
use aya::{
    Btf, Ebpf,
    maps::Array,
    programs::{Program, ProgramError},
};
use log::{debug, warn};
use tracer_common::{ABSENT, Offsets};

use super::{Attached, KernelBtf, concurrent};
use crate::{error::Failure, records};

/// The `TP_CONFIG` slots the agent writes (tracer-ebpf/src/tracepoint/config.rs `CFG_*`).
const CFG_ARMED_NS: u32 = 0;
const CFG_CSD_TRACED: u32 = 1;

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
pub fn attach(ebpf: &mut Ebpf, btf: &KernelBtf, offsets: &Offsets) -> Result<Attached, Failure> {
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
    let btf = btf.get().map_err(|e| {
        Failure::environment(
            format!("the tracepoint backend needs the kernel's BTF: {e}"),
            "tp_btf programs need a kernel built with CONFIG_DEBUG_INFO_BTF=y; \
             use --backend kprobe",
        )
    })?;
    let async_unthrottle = offsets.rq_cfsb_csd != ABSENT;

    let wanted: Vec<_> = PROGRAMS
        .into_iter()
        .filter(|&(_, tracepoint, _)| {
            let unneeded = tracepoint.starts_with("csd_") && !async_unthrottle;
            if unneeded {
                debug!("{tracepoint}: not needed, this kernel unthrottles inside the timer");
            }
            !unneeded
        })
        .collect();
    let names: Vec<_> = wanted.iter().map(|&(program, _, _)| program).collect();
    let loaded = concurrent::load(ebpf, &names, |i, program| {
        let (name, tracepoint, _) = wanted[i];
        load(name, program, tracepoint, btf)
    });

    let mut cgroup_removal_seen = false;
    let mut csd_attached = 0;
    for ((program, tracepoint, needed), loaded) in wanted.into_iter().zip(loaded) {
        let is_csd = tracepoint.starts_with("csd_");
        match loaded.and_then(|()| attach_loaded(ebpf, program, tracepoint)) {
            Ok(()) if tracepoint.starts_with("cgroup_") => cgroup_removal_seen = true,
            Ok(()) if is_csd => csd_attached += 1,
            Ok(()) => {}
            Err(e) if tracepoint.starts_with("cgroup_") => {
                debug!("cannot attach {tracepoint}: {e}");
            }
            Err(e) if program == "tp_hrtimer_period" => super::warn_no_demand(tracepoint, &e),
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
    // Only once both csd programs are attached: the eBPF side leaves an async unthrottle's end
    // to the CSD's exit when it is set.
    if csd_attached == 2 {
        config
            .set(CFG_CSD_TRACED, 1, 0)
            .map_err(|e| super::internal(&format!("TP_CONFIG: {e}")))?;
    }
    config
        .set(CFG_ARMED_NS, records::monotonic_now_ns(), 0)
        .map_err(|e| super::internal(&format!("TP_CONFIG: {e}")))?;

    // Quota writes are told apart only when they change quota, period or burst (or remove
    // the quota); a rewrite of the same values is hidden, so the list names it.
    let mut blind_end_reasons = vec!["cpu_offline", "quota_change"];
    if !cgroup_removal_seen {
        blind_end_reasons.push("cgroup_gone");
    }
    Ok(Attached { blind_end_reasons })
}

/// Why this backend cannot tell `reason` ends apart, for the warning at attach.
pub fn why_blind(reason: &str) -> &'static str {
    match reason {
        "cpu_offline" => {
            "no tracepoint marks the unthrottle of CPU hot-unplug; the stop ends at the next \
             observation of its cfs_rq, which tells it only if a context switch finds the \
             offline CPU's bandwidth turned off"
        }
        "cgroup_gone" => super::removal::WHY_BLIND,
        "quota_change" => {
            "no tracepoint marks a write to the bandwidth files: a write that changes quota, \
             period or burst, or removes the quota, is told from the settings, one that leaves \
             them as they were is not"
        }
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
        ("task_group.cfs_bandwidth", o.tg_cfs_bandwidth),
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

/// Loads (verifies) `program` for `tracepoint`; on a thread of its own, beside the others.
fn load(
    name: &str,
    program: Option<&mut Program>,
    tracepoint: &str,
    btf: &Btf,
) -> Result<(), String> {
    let program = program.ok_or_else(|| format!("program {name} missing from the eBPF object"))?;
    let phase = std::time::Instant::now();
    let info = match program {
        Program::BtfTracePoint(p) => {
            p.load(tracepoint, btf).map_err(|e| verifier_text(&e))?;
            p.info()
        }
        Program::RawTracePoint(p) => {
            p.load().map_err(|e| verifier_text(&e))?;
            p.info()
        }
        _ => return Err(format!("{name}: not a tracepoint program")),
    };
    debug!(
        "startup: {name} verified in {:.1} ms",
        crate::sys::ms(phase)
    );
    // What the verifier's time goes with (5.16+ says it).
    if let Some(n) = info.ok().and_then(|i| i.verified_instruction_count()) {
        debug!("{name}: the verifier processed {n} instructions");
    }
    Ok(())
}

fn attach_loaded(ebpf: &mut Ebpf, program: &str, tracepoint: &str) -> Result<(), String> {
    let attached = match ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
    {
        Program::BtfTracePoint(p) => p.attach().map(drop),
        Program::RawTracePoint(p) => p.attach(tracepoint).map(drop),
        _ => return Err(format!("{program}: not a tracepoint program")),
    };
    attached.map_err(|e| e.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_offsets_are_named() {
        let missing = required_missing(&Offsets::ABSENT);
        assert!(missing.contains(&"cfs_rq.runtime_enabled"));
        assert!(missing.contains(&"hrtimer.function"));
        assert_eq!(missing.len(), 12);
    }
}
