//! The kprobe backend: entry probes remember the cfs_rq argument, return probes check whether
//! the call really (un)throttled it; the period timer's callback ends each period
//! (`crate::demand`).
use aya_ebpf::{
    macros::{kprobe, kretprobe, map},
    maps::PerCpuArray,
    programs::{ProbeContext, RetProbeContext},
};
use aya_log_ebpf::debug;

use crate::{calls, demand, offsets};

/// The cfs_rq argument of the `throttle_cfs_rq` call in progress on this CPU, for the return
/// probe (x86's argument registers are gone by then). Both functions run under the rq lock
/// with interrupts off, so calls on one CPU never nest.
#[map]
static THROTTLE_ARG: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[kprobe]
pub fn throttle_cfs_rq(ctx: ProbeContext) -> u32 {
    if let (Some(cfs_rq), Some(slot)) = (ctx.arg::<u64>(0), THROTTLE_ARG.get_ptr_mut(0)) {
        // SAFETY: per-CPU slot, see THROTTLE_ARG.
        unsafe { *slot = cfs_rq };
    }
    0
}

#[kretprobe]
pub fn throttle_cfs_rq_ret(ctx: RetProbeContext) -> u32 {
    match try_throttle_ret(&ctx) {
        Ok(()) => 0,
        Err(what) => {
            debug!(&ctx, "throttle_cfs_rq return skipped: {}", what);
            1
        }
    }
}

fn try_throttle_ret(ctx: &RetProbeContext) -> Result<(), &'static str> {
    let slot = THROTTLE_ARG.get_ptr_mut(0).ok_or("no per-CPU slot")?;
    // SAFETY: per-CPU slot, see THROTTLE_ARG.
    let cfs_rq = unsafe { core::mem::replace(&mut *slot, 0) };
    if cfs_rq == 0 {
        return Err("return without a recorded entry");
    }
    calls::throttle_returned(offsets(), cfs_rq, || ctx.ret::<u64>())
}

#[kprobe]
pub fn unthrottle_cfs_rq(ctx: ProbeContext) -> u32 {
    if let Some(cfs_rq) = ctx.arg::<u64>(0) {
        calls::unthrottle_entered(offsets(), cfs_rq);
    }
    0
}

#[kretprobe]
pub fn unthrottle_cfs_rq_ret(ctx: RetProbeContext) -> u32 {
    match calls::unthrottle_returned(offsets(), None) {
        Ok(()) => 0,
        Err(what) => {
            debug!(&ctx, "unthrottle_cfs_rq return skipped: {}", what);
            1
        }
    }
}

/// `sched_cfs_period_timer(struct hrtimer *)`: the period timer expires, before its refill.
#[kprobe]
pub fn sched_cfs_period_timer(ctx: ProbeContext) -> u32 {
    if let Some(timer) = ctx.arg::<u64>(0) {
        demand::timer_expires(offsets(), timer);
    }
    0
}
