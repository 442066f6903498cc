//! The kprobe backend: entry probes remember the cfs_rq argument, return probes check whether
//! the call really (un)throttled it.
use aya_ebpf::{
    macros::{kprobe, kretprobe, map},
    maps::PerCpuArray,
    programs::{ProbeContext, RetProbeContext},
};
use aya_log_ebpf::debug;

use crate::{
    OFFSETS,
    stops::{self, read},
};

/// The cfs_rq argument of the `throttle_cfs_rq` call in progress on this CPU, for the return
/// probe (x86's argument registers are gone by then). Both functions run under the rq lock
/// with interrupts off, so calls on one CPU never nest.
#[map]
static THROTTLE_ARG: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct UnthrottleArg {
    cfs_rq: u64,
    /// `cfs_rq->throttled_clock` before unthrottle resets it (6.6+), or 0 when unreadable.
    throttled_clock: u64,
}

#[map]
static UNTHROTTLE_ARG: PerCpuArray<UnthrottleArg> = PerCpuArray::with_max_entries(1, 0);

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
    let o = OFFSETS.load();
    let slot = THROTTLE_ARG.get_ptr_mut(0).ok_or("no per-CPU slot")?;
    // SAFETY: per-CPU slot, see THROTTLE_ARG.
    let cfs_rq = unsafe { core::mem::replace(&mut *slot, 0) };
    if cfs_rq == 0 {
        return Err("return without a recorded entry");
    }
    let throttled = if o.throttle_returns_bool != 0 {
        ctx.ret::<u64>() & 0xff != 0
    } else {
        stops::is_throttled(&o, cfs_rq)?
    };
    if throttled {
        stops::begin(&o, cfs_rq);
    }
    Ok(())
}

#[kprobe]
pub fn unthrottle_cfs_rq(ctx: ProbeContext) -> u32 {
    let o = OFFSETS.load();
    if let (Some(cfs_rq), Some(slot)) = (ctx.arg::<u64>(0), UNTHROTTLE_ARG.get_ptr_mut(0)) {
        let arg = UnthrottleArg {
            cfs_rq,
            throttled_clock: read::<u64>(cfs_rq, o.cfs_rq_throttled_clock).unwrap_or(0),
        };
        // SAFETY: per-CPU slot, see THROTTLE_ARG.
        unsafe { *slot = arg };
    }
    0
}

#[kretprobe]
pub fn unthrottle_cfs_rq_ret(ctx: RetProbeContext) -> u32 {
    match try_unthrottle_ret() {
        Ok(()) => 0,
        Err(what) => {
            debug!(&ctx, "unthrottle_cfs_rq return skipped: {}", what);
            1
        }
    }
}

fn try_unthrottle_ret() -> Result<(), &'static str> {
    let o = OFFSETS.load();
    let slot = UNTHROTTLE_ARG.get_ptr_mut(0).ok_or("no per-CPU slot")?;
    let empty = UnthrottleArg {
        cfs_rq: 0,
        throttled_clock: 0,
    };
    // SAFETY: per-CPU slot, see THROTTLE_ARG.
    let arg = unsafe { core::mem::replace(&mut *slot, empty) };
    if arg.cfs_rq == 0 {
        return Err("return without a recorded entry");
    }
    // 6.18 returns early without unthrottling when the cfs_rq still has no runtime.
    if !stops::is_throttled(&o, arg.cfs_rq)? {
        stops::finish(&o, arg.cfs_rq, arg.throttled_clock);
    }
    Ok(())
}
