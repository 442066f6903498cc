//! Why a stop ended: entry/return programs on the callers of `unthrottle_cfs_rq` keep, per CPU,
//! how many calls of each kind are in progress. [`end_context!`] makes such a pair for any
//! backend; the kprobe ones are here (one program serves every caller of a kind), the fentry
//! ones in `fentry.rs` (an fentry program is bound to one function at load).
use aya_ebpf::{
    macros::{kprobe, kretprobe, map},
    maps::PerCpuArray,
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{END_CPU_OFFLINE, END_QUOTA_CHANGE, END_REFILL, END_UNKNOWN};

/// Per CPU, how many calls of each `END_*` kind of unthrottle caller are in progress.
#[map]
static END_CONTEXT: PerCpuArray<u32> = PerCpuArray::with_max_entries(5, 0);

/// Why this CPU is unthrottling now. A refill wins, because a CSD refill can interrupt a quota
/// write on the same CPU. (A removed cgroup's stops end at its removal, crate::removal: the
/// kernel's teardown only flushes async unthrottles, which a refill queued.)
#[inline(always)]
pub fn current() -> u32 {
    for reason in [END_REFILL, END_CPU_OFFLINE, END_QUOTA_CHANGE] {
        if END_CONTEXT.get(reason).copied().unwrap_or(0) > 0 {
            return reason;
        }
    }
    END_UNKNOWN
}

#[inline(always)]
pub fn enter(reason: u32) -> u32 {
    if let Some(p) = END_CONTEXT.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot.
        unsafe { *p += 1 };
    }
    0
}

#[inline(always)]
pub fn leave(reason: u32) -> u32 {
    if let Some(p) = END_CONTEXT.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot; never below zero if a return probe fired without its entry.
        unsafe { *p = (*p).saturating_sub(1) };
    }
    0
}

/// Entry and return programs (of the given attribute macros and contexts) on callers of
/// `unthrottle_cfs_rq` that mark why stops end.
macro_rules! end_context {
    ($entry:ident($entry_ctx:ty) $enter:ident, $exit:ident($exit_ctx:ty) $leave:ident, $reason:expr) => {
        #[$entry]
        pub fn $enter(_ctx: $entry_ctx) -> u32 {
            $crate::end_reason::enter($reason)
        }
        #[$exit]
        pub fn $leave(_ctx: $exit_ctx) -> u32 {
            $crate::end_reason::leave($reason)
        }
    };
}
pub(crate) use end_context;

end_context!(kprobe(ProbeContext) refill_enter, kretprobe(RetProbeContext) refill_leave, END_REFILL);
end_context!(
    kprobe(ProbeContext) quota_change_enter,
    kretprobe(RetProbeContext) quota_change_leave,
    END_QUOTA_CHANGE
);
end_context!(
    kprobe(ProbeContext) cpu_offline_enter,
    kretprobe(RetProbeContext) cpu_offline_leave,
    END_CPU_OFFLINE
);
