//! What the function-probe backends (kprobe, fentry) do around one `throttle_cfs_rq` or
//! `unthrottle_cfs_rq` call, whichever way their programs get the argument and return value.
use aya_ebpf::{macros::map, maps::PerCpuArray};
use tracer_common::Offsets;

use crate::{stops, toolbox::read};

#[repr(C)]
#[derive(Clone, Copy)]
struct UnthrottleCall {
    cfs_rq: u64,
    /// `cfs_rq->throttled_clock` before unthrottle resets it (6.6+), or 0 when unreadable.
    throttled_clock: u64,
}

/// The `unthrottle_cfs_rq` call in progress on this CPU, from its entry to its return. Both
/// throttle functions run under the rq lock with interrupts off, so calls on one CPU never nest.
#[map]
static UNTHROTTLE_CALL: PerCpuArray<UnthrottleCall> = PerCpuArray::with_max_entries(1, 0);

/// `throttle_cfs_rq(cfs_rq)` returned; `ret` gives its return value, and is only called where
/// the function returns bool (its low byte; 5.4.69+ and 5.8+). Where it returns void (5.4.0 -
/// 5.4.68) `cfs_rq->throttled` decides instead. The offsets are read-only data the verifier
/// sees as constants, so a program never even loads the return slot of a void function.
#[inline(always)]
pub fn throttle_returned(
    o: &Offsets,
    cfs_rq: u64,
    ret: impl FnOnce() -> u64,
) -> Result<(), &'static str> {
    let throttled = if o.throttle_returns_bool != 0 {
        ret() & 0xff != 0
    } else {
        stops::is_throttled(o, cfs_rq)?
    };
    if throttled {
        stops::begin(o, cfs_rq);
    }
    Ok(())
}

/// `unthrottle_cfs_rq(cfs_rq)` was entered: keep what the return needs.
#[inline(always)]
pub fn unthrottle_entered(o: &Offsets, cfs_rq: u64) {
    if let Some(slot) = UNTHROTTLE_CALL.get_ptr_mut(0) {
        let call = UnthrottleCall {
            cfs_rq,
            throttled_clock: read::<u64>(cfs_rq, o.cfs_rq_throttled_clock).unwrap_or(0),
        };
        // SAFETY: per-CPU slot, see UNTHROTTLE_CALL.
        unsafe { *slot = call };
    }
}

/// `unthrottle_cfs_rq` returned. `cfs_rq` is its argument when the program still has it
/// (fexit); a return probe (kretprobe) has only what the entry kept.
#[inline(always)]
pub fn unthrottle_returned(o: &Offsets, cfs_rq: Option<u64>) -> Result<(), &'static str> {
    let slot = UNTHROTTLE_CALL.get_ptr_mut(0).ok_or("no per-CPU slot")?;
    let empty = UnthrottleCall {
        cfs_rq: 0,
        throttled_clock: 0,
    };
    // SAFETY: per-CPU slot, see UNTHROTTLE_CALL.
    let call = unsafe { core::mem::replace(&mut *slot, empty) };
    if call.cfs_rq == 0 {
        return Err("return without a recorded entry");
    }
    if cfs_rq.is_some_and(|c| c != call.cfs_rq) {
        return Err("return of another cfs_rq than the recorded entry");
    }
    // 6.18 returns early without unthrottling when the cfs_rq still has no runtime.
    if !stops::is_throttled(o, call.cfs_rq)? {
        stops::finish(o, call.cfs_rq, call.throttled_clock);
    }
    Ok(())
}
