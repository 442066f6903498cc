//! Why a stop ended: entry/return probes on the callers of `unthrottle_cfs_rq` keep, per CPU,
//! how many calls of each kind are in progress.
use aya_ebpf::{
    macros::{kprobe, kretprobe, map},
    maps::PerCpuArray,
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{END_CGROUP_GONE, END_CPU_OFFLINE, END_QUOTA_CHANGE, END_REFILL, END_UNKNOWN};

/// Per CPU, how many calls of each `END_*` kind of unthrottle caller are in progress.
#[map]
static END_CONTEXT: PerCpuArray<u32> = PerCpuArray::with_max_entries(5, 0);

/// Why this CPU is unthrottling now. A refill wins, because a CSD refill can interrupt a quota
/// write on the same CPU, and the pending async unthrottles that a group's teardown flushes were
/// queued by a refill.
#[inline(always)]
pub fn current() -> u32 {
    for reason in [
        END_REFILL,
        END_CPU_OFFLINE,
        END_QUOTA_CHANGE,
        END_CGROUP_GONE,
    ] {
        if END_CONTEXT.get(reason).copied().unwrap_or(0) > 0 {
            return reason;
        }
    }
    END_UNKNOWN
}

#[inline(always)]
fn enter(reason: u32) -> u32 {
    if let Some(p) = END_CONTEXT.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot.
        unsafe { *p += 1 };
    }
    0
}

#[inline(always)]
fn leave(reason: u32) -> u32 {
    if let Some(p) = END_CONTEXT.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot; never below zero if a return probe fired without its entry.
        unsafe { *p = (*p).saturating_sub(1) };
    }
    0
}

/// Entry and return probes on one caller of `unthrottle_cfs_rq` that marks why stops end.
macro_rules! end_context {
    ($enter:ident, $leave:ident, $reason:expr) => {
        #[kprobe]
        pub fn $enter(_ctx: ProbeContext) -> u32 {
            enter($reason)
        }
        #[kretprobe]
        pub fn $leave(_ctx: RetProbeContext) -> u32 {
            leave($reason)
        }
    };
}

end_context!(refill_enter, refill_leave, END_REFILL);
end_context!(quota_change_enter, quota_change_leave, END_QUOTA_CHANGE);
end_context!(cpu_offline_enter, cpu_offline_leave, END_CPU_OFFLINE);
end_context!(cgroup_gone_enter, cgroup_gone_leave, END_CGROUP_GONE);
