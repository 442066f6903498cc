//! What the tracepoint programs know beyond their arguments: the refill callbacks' addresses,
//! learnt from the kernel's own structures when a program first needs them (not /proc/kallsyms,
//! which hides them without CAP_SYSLOG: docs/kernel.md §8), and what the agent writes into
//! `TP_CONFIG` after load (when tracing was armed, whether the CSD programs are attached; slots
//! mirrored in tracer/src/probes/tracepoint.rs). Every hrtimer and CSD passes through [`timer`] or
//! [`is_csd_unthrottle`], so the learnt addresses sit in one map value of their own.
use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::{helpers::bpf_get_current_task, macros::map, maps::Array};
use tracer_common::{ABSENT, Offsets};

use crate::toolbox::{load, read};

/// `TP_CONFIG` slots, written by the agent.
/// CLOCK_MONOTONIC ns when every program was attached; 0 before.
pub const CFG_ARMED_NS: u32 = 0;
/// 1 once both CSD programs are attached: an async unthrottle's end is then left to its CSD's
/// exit.
const CFG_CSD_TRACED: u32 = 1;

#[map]
static TP_CONFIG: Array<u64> = Array::with_max_entries(2, 0);

/// The refill callbacks' addresses, learnt by the programs; 0 = not yet.
#[repr(C)]
struct Callbacks {
    period_timer: u64,
    slack_timer: u64,
    csd_unthrottle: u64,
}

/// One [`Callbacks`], so that the hot hooks (every hrtimer, every CSD) compare their callback
/// with all of them after one lookup.
#[map]
static TP_CALLBACKS: Array<Callbacks> = Array::with_max_entries(1, 0);

/// The value in `slot` (one of `CFG_*`); 0 when unset.
#[inline(always)]
pub fn cfg(slot: u32) -> u64 {
    TP_CONFIG.get(slot).copied().unwrap_or(0)
}

/// The learnt callbacks, read and written volatile: a program learns them in a call out of
/// line between its reads.
#[inline(always)]
fn callbacks() -> Option<*mut Callbacks> {
    TP_CALLBACKS.get_ptr_mut(0)
}

/// What an expiring hrtimer's callback is to the tracer.
#[derive(Clone, Copy, PartialEq)]
pub enum Timer {
    /// `sched_cfs_period_timer`: a group's period ends, its throttled cfs_rqs are refilled.
    Period,
    /// `sched_cfs_slack_timer`: returned runtime is handed to the throttled cfs_rqs.
    Slack,
    Other,
}

/// Which timer `function` (an `hrtimer.function`) is. The addresses are learnt at the first
/// call that can read them: the program that first needs them learns them before it compares,
/// so no period or slack timer goes unrecognised. After that any other timer costs one lookup
/// and two compares.
#[inline(always)]
pub fn timer(o: &Offsets, function: u64) -> Timer {
    let Some(known) = callbacks() else {
        return Timer::Other;
    };
    // SAFETY (every access to `known`): a valid map value pointer.
    let mut period = unsafe { read_volatile(&raw const (*known).period_timer) };
    if period == 0 {
        learn_timer_fns(o);
        period = unsafe { read_volatile(&raw const (*known).period_timer) };
    }
    if function == period && period != 0 {
        Timer::Period
    } else if function == unsafe { read_volatile(&raw const (*known).slack_timer) } && period != 0 {
        // The slack is read after the period, which is written after it.
        Timer::Slack
    } else {
        Timer::Other
    }
}

/// Whether `function` (a `csd->func`) is `__cfsb_csd_unthrottle` (6.2+), learnt like the
/// timers' ([`timer`]), and both CSD programs are attached. Any other function costs one
/// lookup and two compares.
#[inline(always)]
pub fn is_csd_unthrottle(o: &Offsets, function: u64) -> bool {
    let Some(known) = callbacks() else {
        return false;
    };
    // SAFETY (every access to `known`): a valid map value pointer.
    let mut target = unsafe { read_volatile(&raw const (*known).csd_unthrottle) };
    if target == 0 {
        if !csd_traced() {
            return false;
        }
        learn_csd_fn(o);
        target = unsafe { read_volatile(&raw const (*known).csd_unthrottle) };
    }
    function == target && target != 0 && csd_traced()
}

/// Whether the agent attached both CSD programs.
#[inline(always)]
pub fn csd_traced() -> bool {
    cfg(CFG_CSD_TRACED) != 0
}

/// The cfs_rq of the task running on this CPU (its group's, on this CPU; the root's for the
/// idle task); 0 if unreadable.
#[inline(always)]
fn current_cfs_rq(o: &Offsets) -> u64 {
    if o.task_se == ABSENT || o.se_cfs_rq == ABSENT {
        return 0;
    }
    // SAFETY: helper without preconditions; the task is only read through probe reads.
    let task = unsafe { bpf_get_current_task() };
    read::<u64>(task, o.task_se + o.se_cfs_rq).unwrap_or(0)
}

/// What is kept for good must look like it: a kernel address (the upper half on x86-64 and
/// arm64), and the two timer callbacks, neighbours in kernel/sched/fair.c, within 64 MiB of
/// each other (the whole kernel text, however the linker ordered it).
const NEAR: u64 = 64 << 20;

#[inline(always)]
fn is_text(address: u64) -> bool {
    address >= 0xffff_0000_0000_0000
}

// Out of line, returning nothing: they run until learnt, and a returned value bigger than a
// register (a pair) is passed through the caller's stack, which the BPF calling convention
// does not allow.
#[inline(never)]
fn learn_timer_fns(o: &Offsets) {
    if o.tg_cfs_bandwidth == ABSENT || o.cfsb_period_timer == ABSENT {
        return;
    }
    let Some(tg) = read::<u64>(current_cfs_rq(o), o.cfs_rq_tg) else {
        return;
    };
    if tg == 0 {
        return;
    }
    let bandwidth = tg + o.tg_cfs_bandwidth as u64;
    let Some(period) = read::<u64>(bandwidth + o.cfsb_period_timer as u64, o.hrtimer_function)
    else {
        return;
    };
    let Some(slack) = read::<u64>(bandwidth + o.cfsb_slack_timer as u64, o.hrtimer_function) else {
        return;
    };
    if is_text(period)
        && is_text(slack)
        && period != slack
        && period.abs_diff(slack) < NEAR
        && let Some(known) = callbacks()
    {
        // The slack first: a reader that sees the period set reads the slack after it.
        // SAFETY: a valid map value pointer; racing writers store the same values.
        unsafe {
            write_volatile(&raw mut (*known).slack_timer, slack);
            write_volatile(&raw mut (*known).period_timer, period);
        }
    }
}

#[inline(never)]
fn learn_csd_fn(o: &Offsets) {
    if o.rq_cfsb_csd == ABSENT {
        return;
    }
    let Some(rq) = read::<u64>(current_cfs_rq(o), o.cfs_rq_rq) else {
        return;
    };
    if rq == 0 {
        return;
    }
    let Some(csd) = read::<u64>(rq + o.rq_cfsb_csd as u64, o.csd_func) else {
        return;
    };
    if is_text(csd)
        && let Some(known) = callbacks()
    {
        // SAFETY: a valid map value pointer; racing writers store the same value.
        unsafe { write_volatile(&raw mut (*known).csd_unthrottle, csd) };
    }
}

/// The hrtimer `timer` is about to run its callback: if it is a group's period timer, the
/// group's period ends now (`crate::demand`).
#[inline(always)]
pub fn period_timer_entry(o: &Offsets, hrtimer: u64) {
    if let Some(function) = load::<u64>(hrtimer, o.hrtimer_function)
        && timer(o, function) == Timer::Period
    {
        crate::demand::timer_expires(o, hrtimer);
    }
}
