//! What the tracepoint programs know beyond their arguments: the refill callbacks' addresses,
//! learnt from the kernel's own structures the first time a program needs them, and what the
//! agent writes into `TP_CONFIG` after load (the moment tracing was armed, whether the CSD
//! programs are attached). The slot numbers are mirrored in tracer/src/probes/tracepoint.rs.
//!
//! The addresses are not read from /proc/kallsyms, which shows zeros without CAP_SYSLOG: every
//! task group's bandwidth was set up by `init_cfs_bandwidth` (the root's too, in `sched_init`),
//! which sets `period_timer.function = sched_cfs_period_timer` and `slack_timer.function =
//! sched_cfs_slack_timer`, and from 6.2 `sched_init` sets every rq's `cfsb_csd.func =
//! __cfsb_csd_unthrottle` (docs/kernel.md §8). So the group of the task running here, and the
//! rq of its cfs_rq, hold them.
use aya_ebpf::{helpers::bpf_get_current_task, macros::map, maps::Array};
use tracer_common::{ABSENT, Offsets};

use crate::stops::{load, read};

/// `TP_CONFIG` slots. The callbacks' addresses are learnt by the programs; 0 = not yet.
const CFG_PERIOD_TIMER_FN: u32 = 0;
const CFG_SLACK_TIMER_FN: u32 = 1;
const CFG_CSD_UNTHROTTLE_FN: u32 = 2;
/// CLOCK_MONOTONIC ns when every program was attached; 0 before. Written by the agent.
pub const CFG_ARMED_NS: u32 = 3;
/// 1 once both CSD programs are attached (written by the agent): an async unthrottle's end is
/// then left to its CSD's exit.
const CFG_CSD_TRACED: u32 = 4;

#[map]
static TP_CONFIG: Array<u64> = Array::with_max_entries(5, 0);

/// The value in `slot` (one of `CFG_*`); 0 when unset.
#[inline(always)]
pub fn cfg(slot: u32) -> u64 {
    TP_CONFIG.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
fn set(slot: u32, value: u64) {
    if let Some(p) = TP_CONFIG.get_ptr_mut(slot) {
        // SAFETY: valid map value pointer; racing writers store the same value.
        unsafe { *p = value };
    }
}

/// The addresses of `sched_cfs_period_timer` and `sched_cfs_slack_timer`, learnt at the first
/// call that can read them: the program that first needs them learns them before it compares,
/// so no period or slack timer goes unrecognised. (0, 0) while they cannot be read.
#[inline(always)]
pub fn timer_fns(o: &Offsets) -> (u64, u64) {
    if cfg(CFG_PERIOD_TIMER_FN) == 0 {
        learn_timer_fns(o);
    }
    (cfg(CFG_PERIOD_TIMER_FN), cfg(CFG_SLACK_TIMER_FN))
}

/// The address of `__cfsb_csd_unthrottle` (6.2+), learnt like [`timer_fns`]; 0 while it
/// cannot be read, or when the CSD programs are not both attached.
#[inline(always)]
pub fn csd_fn(o: &Offsets) -> u64 {
    if !csd_traced() {
        return 0;
    }
    if cfg(CFG_CSD_UNTHROTTLE_FN) == 0 {
        learn_csd_fn(o);
    }
    cfg(CFG_CSD_UNTHROTTLE_FN)
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
    if is_text(period) && is_text(slack) && period != slack && period.abs_diff(slack) < NEAR {
        // The slack first: a reader that sees the period set reads the slack after it.
        set(CFG_SLACK_TIMER_FN, slack);
        set(CFG_PERIOD_TIMER_FN, period);
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
    if is_text(csd) {
        set(CFG_CSD_UNTHROTTLE_FN, csd);
    }
}

/// The hrtimer `timer` is about to run its callback: if it is a group's period timer, the
/// group's period ends now (`crate::demand`).
#[inline(always)]
pub fn period_timer_entry(o: &Offsets, timer: u64) {
    let (period_fn, _) = timer_fns(o);
    if period_fn != 0 && load::<u64>(timer, o.hrtimer_function) == Some(period_fn) {
        crate::demand::timer_expires(o, timer);
    }
}
