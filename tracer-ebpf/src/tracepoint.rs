//! The tracepoint backend: scheduler, hrtimer and CSD tracepoints only (tp_btf), for kernels
//! without kprobes or fentry (docs/kernel.md §2, §8).
//!
//! START: the first time `cfs_rq->throttled == 1` is observed — at sched_switch (prev and next),
//! sched_wakeup(_new) (the task's whole se → cfs_rq chain, bounded), and at every CFS period or
//! slack timer (`cfs_b->throttled_cfs_rq`, every throttled cfs_rq of the group).
//! END (refill): `throttled` found 0 at hrtimer_expire_exit for the cfs_rqs that were on the
//! group's throttled list at entry (the local one since 6.2, all of them before), and at
//! csd_function_exit of `__cfsb_csd_unthrottle` for the cfs_rqs on `rq->cfsb_csd_list` at entry.
//! An unthrottle seen elsewhere (a context switch on the stopped CPU) while such an exit is
//! pending is left to that exit, which has the kernel's clock; its time is the END's time.
//! One unthrottle is seen from several CPUs at once: each stop is claimed (`TP_ENDED`) by the
//! first that ends it, so it is emitted once. A throttle seen again after an unthrottle nobody
//! ended (6.6+: `throttled_clock_self_time` moved) closes the old stop before opening the new.
//! END (other): `throttled` found 0 at any other observation point (quota write, CPU offline):
//! `quota_change` when the group's quota/period/burst differ from the start's, else `unknown`.
//! END (cgroup gone): at cgroup_rmdir (and again at cgroup_release) every open stop of the
//! removed cgroup ends as `cgroup_gone`. The kernel may never unthrottle those cfs_rqs
//! (`destroy_cfs_bandwidth` only flushes pending CSD unthrottles, docs/kernel.md §2.3), and a
//! removed cgroup has no task left to stop; a refill that still comes is not a new stop.
//!
//! Duration: `start_ns`/`end_ns` are CLOCK_MONOTONIC at the observations. `kernel_ns` is what the
//! kernel accounted, from its own clocks only: Δ`cfs_rq->throttled_clock_self_time` (6.6+, exact
//! at any later observation), else `rq->clock - throttled_clock` read at the exit tracepoints.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use tracer_common::{
    ABSENT, END_CGROUP_GONE, END_QUOTA_CHANGE, END_REFILL, END_UNKNOWN, EVENT_END, EVENT_START,
    EVENT_UNSEEN_START_END, KERNEL_NS_UNKNOWN, Offsets, StopEvent,
};

use crate::{
    OPEN_FULL, offsets,
    stops::{self, load, load_bits, read, read_bits},
};

/// `TP_CONFIG` slots, written by the agent after load.
pub const CFG_PERIOD_TIMER_FN: u32 = 0;
pub const CFG_SLACK_TIMER_FN: u32 = 1;
pub const CFG_CSD_UNTHROTTLE_FN: u32 = 2;
/// CLOCK_MONOTONIC ns when every program was attached; 0 before.
pub const CFG_ARMED_NS: u32 = 3;
/// The number of possible CPUs (cfs_rqs per group), for the sweep at cgroup removal.
pub const CFG_NR_CPUS: u32 = 4;

/// kallsyms addresses of `sched_cfs_period_timer`, `sched_cfs_slack_timer`,
/// `__cfsb_csd_unthrottle`, the armed time and the CPU count (see `CFG_*`).
#[map]
static TP_CONFIG: Array<u64> = Array::with_max_entries(5, 0);

/// The stop is a refill in progress: its cfs_rq is on a list a refill callback is working on.
const F_REFILL_PENDING: u32 = 1;
/// The throttle began before the trace did: the end is an unseen-start end.
const F_UNSEEN: u32 = 2;
/// Filtered out (or not a cgroup's): remembered only so the hot path need not describe it again.
const F_IGNORED: u32 = 4;
/// `key` is in `TP_BY_GROUP`.
const F_INDEXED: u32 = 8;
/// A refill callback whose exit looks at this cfs_rq is running or queued (the CSD of an async
/// unthrottle): an unthrottle seen elsewhere is left to that exit, which reads the kernel's
/// clock right after the unthrottle (the only exact `kernel_ns` before 6.6).
const F_EXIT_PENDING: u32 = 16;

/// How long an unthrottle seen outside a refill callback waits for the callback's exit before
/// it ends the stop itself (the exit never comes, e.g. a teardown flush without tracepoints).
const EXIT_WAIT_NS: u64 = 100_000_000;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct TpStop {
    ev: StopEvent,
    /// `throttled_clock_self_time` at START; `u64::MAX` when the kernel has none (< 6.6).
    self_time0: u64,
    flags: u32,
    _pad: u32,
    /// The first observation of `throttled == 0` that was left to a callback's exit; 0 = none.
    /// The earliest sign of the end, so it is the END's time.
    unthrottled_ns: u64,
    /// The group's `struct cgroup *` and this stop's `TP_BY_GROUP` key (with `F_INDEXED`).
    cgroup: u64,
    key: GroupCpu,
}

/// Stops in progress for this backend, by `struct cfs_rq *`.
#[map]
static TP_OPEN: HashMap<u64, TpStop> = HashMap::with_max_entries(16384, 0);

/// One stop: its cfs_rq and its `start_ns` (two stops of one cfs_rq never share a start).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StopId {
    cfs_rq: u64,
    start_ns: u64,
}

/// Stops already ended. An unthrottle is seen from several CPUs at once (the refill callback's
/// exit on the timer's CPU, the CSD's exit and the next context switch on the stopped CPU); the
/// first to insert the stop here (BPF_NOEXIST, atomic under the bucket lock) ends it, the
/// others do nothing. LRU: a loser looks within microseconds, old entries can go.
#[map]
static TP_ENDED: LruHashMap<StopId, u8> = LruHashMap::with_max_entries(4096, 0);

/// `-EEXIST`: the key is already there (an insert with BPF_NOEXIST).
const EEXIST: i32 = -17;

/// A cgroup's stop on one CPU: the key of `TP_BY_GROUP`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupCpu {
    cgroup_id: u64,
    cpu: u64,
}

/// Every `TP_OPEN` entry (ignored ones too) by cgroup and CPU, so that a removed cgroup's open
/// stops can be found without walking the kernel's structures: value = `struct cfs_rq *`.
#[map]
static TP_BY_GROUP: HashMap<GroupCpu, u64> = HashMap::with_max_entries(16384, 0);

/// A removed cgroup: its `struct cgroup *` and id (ids alone can repeat across v1 hierarchies,
/// addresses alone are reused after the free).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Gone {
    cgroup: u64,
    cgroup_id: u64,
}

/// Cgroups removed while tracing: a throttled cfs_rq of theirs that a late refill walks over
/// does not start a new stop. LRU: ids are never reused, old entries can go.
#[map]
static TP_GONE: LruHashMap<Gone, u8> = LruHashMap::with_max_entries(1024, 0);

/// Most CPUs swept at a cgroup's removal (`CFG_NR_CPUS` is the real count).
const MAX_CPUS: u64 = 1024;

/// Longest list walked at a timer or CSD callback (a group's throttled cfs_rqs: one per CPU).
const MAX_LIST: usize = 32;
/// Deepest cgroup nesting walked from a task.
const MAX_DEPTH: usize = 8;

/// Scratch space to build a new stop in.
#[map]
static TP_SCRATCH: PerCpuArray<TpStop> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
pub struct Pending {
    /// The hrtimer or csd whose callback is running; 0 = none.
    key: u64,
    n: u64,
    cfs_rqs: [u64; MAX_LIST],
}

const SLOT_TIMER: u32 = 0;
const SLOT_CSD: u32 = 1;

/// Per CPU, the cfs_rqs a refill callback may unthrottle, from its entry to its exit.
/// Callbacks run in hard IRQ with interrupts off, so they do not nest on one CPU.
#[map]
static TP_PENDING: PerCpuArray<Pending> = PerCpuArray::with_max_entries(2, 0);

#[inline(always)]
fn cfg(slot: u32) -> u64 {
    TP_CONFIG.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

// ---------------------------------------------------------------------------------------------
// Programs

#[btf_tracepoint(function = "sched_switch")]
pub fn tp_sched_switch(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    // (bool preempt, struct task_struct *prev, struct task_struct *next, unsigned prev_state)
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    let parked = load_bits(prev, &o.task_throttled).unwrap_or(0) != 0;
    walk(o, prev, parked);
    walk(o, next, false);
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn tp_sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    walk(o, ctx.arg(0), false);
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn tp_sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    walk(o, ctx.arg(0), false);
    0
}

#[btf_tracepoint(function = "hrtimer_expire_entry")]
pub fn tp_hrtimer_entry(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    let timer: u64 = ctx.arg(0);
    let Some(function) = read::<u64>(timer, o.hrtimer_function) else {
        return 0;
    };
    if function == 0 {
        return 0;
    }
    let timer_offset = if function == cfg(CFG_PERIOD_TIMER_FN) {
        o.cfsb_period_timer
    } else if function == cfg(CFG_SLACK_TIMER_FN) {
        o.cfsb_slack_timer
    } else {
        return 0;
    };
    if timer_offset == ABSENT || o.cfsb_throttled_cfs_rq == ABSENT {
        return 0;
    }
    let head = timer - timer_offset as u64 + o.cfsb_throttled_cfs_rq as u64;
    collect(SLOT_TIMER, timer, head, o.cfs_rq_throttled_list);
    refill_entry(o, SLOT_TIMER);
    0
}

#[btf_tracepoint(function = "hrtimer_expire_exit")]
pub fn tp_hrtimer_exit(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    refill_exit(o, SLOT_TIMER, ctx.arg(0));
    0
}

#[btf_tracepoint(function = "csd_function_entry")]
pub fn tp_csd_entry(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    // (smp_call_func_t func, call_single_data_t *csd): the verifier refuses reads of `func`
    // (a FUNC_PROTO argument), so the function is read from the csd.
    let csd: u64 = ctx.arg(1);
    let target = cfg(CFG_CSD_UNTHROTTLE_FN);
    if target == 0 || read::<u64>(csd, o.csd_func) != Some(target) {
        return 0;
    }
    if o.rq_cfsb_csd == ABSENT || o.rq_cfsb_csd_list == ABSENT {
        return 0;
    }
    let rq = csd - o.rq_cfsb_csd as u64;
    let head = rq + o.rq_cfsb_csd_list as u64;
    collect(SLOT_CSD, csd, head, o.cfs_rq_throttled_csd_list);
    refill_entry(o, SLOT_CSD);
    0
}

#[btf_tracepoint(function = "csd_function_exit")]
pub fn tp_csd_exit(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    refill_exit(o, SLOT_CSD, ctx.arg(1));
    0
}

#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn tp_cgroup_rmdir(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    // (struct cgroup *cgrp, const char *path)
    cgroup_gone(o, ctx.arg(0));
    0
}

#[btf_tracepoint(function = "cgroup_release")]
pub fn tp_cgroup_release(ctx: BtfTracePointContext) -> i32 {
    let o = offsets();
    // A cgroup can be released without an rmdir the tracer saw (e.g. removed before the
    // rmdir program was attached); the sweep is idempotent.
    cgroup_gone(o, ctx.arg(0));
    0
}

// ---------------------------------------------------------------------------------------------
// Observation from a task

/// Walks `task`'s sched_entity chain up through its parents and observes every cfs_rq with a
/// bandwidth limit. `parked`: the task was just parked by the 6.18 throttle work.
/// `task` is the tracepoint's BTF-typed argument, so the chain is read with direct loads.
#[inline(always)]
fn walk(o: &Offsets, task: u64, parked: bool) {
    if task == 0 || o.task_se == ABSENT {
        return;
    }
    let mut se = task + o.task_se as u64;
    for _ in 0..MAX_DEPTH {
        let Some(cfs_rq) = load::<u64>(se, o.se_cfs_rq) else {
            return;
        };
        if load::<i32>(cfs_rq, o.cfs_rq_runtime_enabled).unwrap_or(0) != 0
            && let Some(throttled) = load_bits(cfs_rq, &o.cfs_rq_throttled)
        {
            observe(o, cfs_rq, throttled != 0, task, parked);
        }
        match load::<u64>(se, o.se_parent) {
            Some(parent) if parent != 0 => se = parent,
            _ => return,
        }
    }
}

#[inline(always)]
fn observe(o: &Offsets, cfs_rq: u64, throttled: bool, task: u64, parked: bool) {
    // SAFETY: the entry is only touched by programs holding this cfs_rq's rq lock or running
    // its refill callback; a racing update loses at most one parked count. Ends are claimed
    // in `end`, so two observers never both end it.
    match TP_OPEN.get_ptr_mut(cfs_rq) {
        Some(ptr) => {
            // SAFETY: valid map value pointer from the lookup above.
            let st = unsafe { &mut *ptr };
            // The clock is read only where it is used: most observations of a throttled
            // cfs_rq change nothing, and a helper call is the dearest part of them.
            if throttled {
                if episode_changed(st, || {
                    load::<u64>(cfs_rq, o.cfs_rq_throttled_clock_self_time)
                }) {
                    // The unthrottle (and a new throttle) happened unseen: close the old stop,
                    // open the new one.
                    let reason = ended_reason(o, cfs_rq, st);
                    end(o, cfs_rq, st.ev.start_ns, reason, false);
                    start(o, cfs_rq, now(), task, parked);
                } else if parked {
                    note_park(o, cfs_rq, st, now());
                    if st.ev.leaf_cgroup_id == 0 {
                        st.ev.leaf_cgroup_id = stops::leaf_cgroup(o, task);
                    }
                }
                return;
            }
            if st.flags & F_EXIT_PENDING != 0 {
                // A refill callback's exit will end it with the kernel's own clock.
                let t = now();
                if st.unthrottled_ns == 0 {
                    st.unthrottled_ns = t;
                }
                if t.saturating_sub(st.unthrottled_ns) < EXIT_WAIT_NS {
                    return;
                }
            }
            let reason = ended_reason(o, cfs_rq, st);
            end(o, cfs_rq, st.ev.start_ns, reason, false);
        }
        None => {
            if throttled {
                start(o, cfs_rq, now(), task, parked);
            }
        }
    }
}

/// Why the stop `st` of `cfs_rq` ended, seen outside a refill callback's exit.
#[inline(always)]
fn ended_reason(o: &Offsets, cfs_rq: u64, st: &TpStop) -> u32 {
    if st.flags & F_REFILL_PENDING != 0 {
        END_REFILL
    } else {
        non_refill_reason(o, cfs_rq, &st.ev)
    }
}

/// Whether `cfs_rq`, throttled now, was unthrottled (and throttled again) since `st` began.
/// 6.6+: `throttled_clock_self_time` grows only when a throttle ends (it is written under the
/// rq lock, at the unthrottle). Before 6.6 nothing of the kernel's says so reliably
/// (`throttled_clock` is stored after `throttled`, and a timer's walk reads both without the rq
/// lock), so only an unthrottle we saw ourselves and left to a callback's exit counts.
/// `self_time` reads the cfs_rq's `throttled_clock_self_time` now: with a direct load on the
/// hot path, through the helper where the cfs_rq comes from a map.
#[inline(always)]
fn episode_changed(st: &TpStop, self_time: impl FnOnce() -> Option<u64>) -> bool {
    if st.self_time0 != u64::MAX {
        return self_time().is_some_and(|t| t != st.self_time0);
    }
    st.unthrottled_ns != 0
}

/// An end nobody refilled: a write to the group's bandwidth files unthrottles every CPU; if
/// the settings differ from the start's, that is what happened. Otherwise we cannot tell
/// (a write of the same values, CPU offline, group teardown).
#[inline(always)]
fn non_refill_reason(o: &Offsets, cfs_rq: u64, ev: &StopEvent) -> u32 {
    let Some(tg) = read::<u64>(cfs_rq, o.cfs_rq_tg) else {
        return END_UNKNOWN;
    };
    let quota = read::<u64>(tg, o.tg_quota).unwrap_or(u64::MAX);
    let period = read::<u64>(tg, o.tg_period).unwrap_or(0);
    let burst = read::<u64>(tg, o.tg_burst).unwrap_or(0);
    if quota != ev.quota_ns || period != ev.period_ns || burst != ev.burst_ns {
        END_QUOTA_CHANGE
    } else {
        END_UNKNOWN
    }
}

#[inline(always)]
fn note_park(o: &Offsets, cfs_rq: u64, st: &mut TpStop, now: u64) {
    st.ev.parked += 1;
    if st.ev.park_ns == 0 {
        st.ev.park_ns = now;
    }
    if st.ev.kernel_start_clock == 0 {
        st.ev.kernel_start_clock = read::<u64>(cfs_rq, o.cfs_rq_throttled_clock).unwrap_or(0);
    }
}

// ---------------------------------------------------------------------------------------------
// START / END

/// `cfs_rq` is throttled and not yet open: open it (emit START unless it predates the trace).
/// `task` is a task of the group seen at the observation (0 = use the CPU's current task).
/// Two CPUs may see the same throttle at once: the first to insert it opens it.
#[inline(never)]
fn start(o: &Offsets, cfs_rq: u64, now: u64, task: u64, parked: bool) {
    // Built in a per-CPU scratch slot: a StopEvent is too big for the BPF stack here.
    let Some(st) = TP_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot; programs do not nest on a CPU while using it.
    let st = unsafe { &mut *st };
    st.ev = StopEvent::default();
    st.ev.kind = EVENT_START;
    st.ev.start_ns = now;
    st.ev.kernel_ns = KERNEL_NS_UNKNOWN;
    st.ev.cfs_rq = cfs_rq;
    st.self_time0 = read::<u64>(cfs_rq, o.cfs_rq_throttled_clock_self_time).unwrap_or(u64::MAX);
    st.flags = 0;
    st.unthrottled_ns = 0;
    st.cgroup = 0;
    st.key = GroupCpu {
        cgroup_id: 0,
        cpu: 0,
    };
    if let Some((cgroup, cgroup_id)) = group_of(o, cfs_rq) {
        // SAFETY: lookup only.
        if unsafe { TP_GONE.get(Gone { cgroup, cgroup_id }) }.is_some() {
            // A removed cgroup's cfs_rq still on the throttled list: its stop already ended.
            return;
        }
        st.cgroup = cgroup;
        st.key = GroupCpu {
            cgroup_id,
            cpu: cpu_of(o, cfs_rq),
        };
    }
    if stops::describe(o, cfs_rq, &mut st.ev) {
        st.ev.tasks = read::<u32>(cfs_rq, o.cfs_rq_nr_tasks).unwrap_or(0);
        if task != 0 {
            stops::task_ids(o, task, &mut st.ev);
            // Only here: the refill callbacks' programs call `start` inside their list walk
            // with `task` 0, and the verifier then prunes this walk from them (it doubled their
            // verification time). A stop is first seen at a refill only if no context switch
            // on its CPU saw it first; it then credits the running task's group alone.
            stops::stopped_children(o, cfs_rq, &mut st.ev);
        } else {
            stops::running_task(o, cfs_rq, &mut st.ev);
        }
        st.ev.kernel_start_clock = read::<u64>(cfs_rq, o.cfs_rq_throttled_clock).unwrap_or(0);
        if parked {
            st.ev.parked = 1;
            st.ev.park_ns = now;
        }
        if started_before_trace(o, cfs_rq, now) {
            st.flags |= F_UNSEEN;
        }
    } else {
        st.flags |= F_IGNORED;
    }
    // By reference: the map copies from the scratch slot. A value would be copied onto the
    // BPF stack first, and the frame would no longer fit old kernels' 512-byte call chains.
    let stop: &TpStop = st;
    match TP_OPEN.insert(cfs_rq, stop, BPF_NOEXIST.into()) {
        Ok(()) => {}
        // Another CPU opened it first.
        Err(EEXIST) => return,
        Err(_) => {
            stops::bump(&OPEN_FULL);
            return;
        }
    }
    if st.cgroup != 0
        && TP_BY_GROUP.insert(st.key, cfs_rq, 0).is_ok()
        && let Some(open) = TP_OPEN.get_ptr_mut(cfs_rq)
    {
        // SAFETY: valid map value pointer; only this stop's own entry is marked.
        let open = unsafe { &mut *open };
        if open.ev.start_ns == now {
            open.flags |= F_INDEXED;
        }
    }
    if st.flags & (F_UNSEEN | F_IGNORED) == 0 {
        stops::emit(&st.ev);
    }
}

/// Whether the throttle began before the tracer was armed. Exact when observed before arming;
/// otherwise judged from the kernel's own start (`throttled_clock_self`, or `throttled_clock`
/// before 6.6) carried into CLOCK_MONOTONIC through this rq's current clock offset. A throttle
/// whose accounting has not begun yet (6.18: no task parked) counts as seen now.
#[inline(always)]
fn started_before_trace(o: &Offsets, cfs_rq: u64, now: u64) -> bool {
    let armed = cfg(CFG_ARMED_NS);
    if armed == 0 {
        return true;
    }
    let since = if o.cfs_rq_throttled_clock_self != ABSENT {
        read::<u64>(cfs_rq, o.cfs_rq_throttled_clock_self)
    } else {
        read::<u64>(cfs_rq, o.cfs_rq_throttled_clock)
    }
    .unwrap_or(0);
    if since == 0 {
        return false;
    }
    let Some(clock) = read::<u64>(cfs_rq, o.cfs_rq_rq).and_then(|rq| read::<u64>(rq, o.rq_clock))
    else {
        return false;
    };
    if clock < since {
        return false;
    }
    now.saturating_sub(clock - since) < armed
}

/// Closes the stop of `cfs_rq` that started at `start_ns` (now unthrottled) and emits END or an
/// unseen-start END, unless another CPU is ending it or has ended it: the stop is claimed in
/// `TP_ENDED` first, then looked up again (the caller's map value may have been freed and
/// reused since its lookup). `at_exit`: called right after a refill callback, so `rq->clock`
/// is the unthrottle's clock.
#[inline(never)]
fn end(o: &Offsets, cfs_rq: u64, start_ns: u64, reason: u32, at_exit: bool) {
    let now = now();
    // Another program claimed it first. Any other failure (the LRU map could not take the
    // claim) ends it anyway.
    if let Err(EEXIST) = TP_ENDED.insert(StopId { cfs_rq, start_ns }, 1, BPF_NOEXIST.into()) {
        return;
    }
    let Some(st) = TP_OPEN.get_ptr_mut(cfs_rq) else {
        return;
    };
    // SAFETY: a valid TP_OPEN value pointer, used before the entry is removed. The claim makes
    // this program the only one to finish or remove this stop.
    let st = unsafe { &mut *st };
    if st.ev.start_ns != start_ns {
        // That stop is gone and a new one of the same cfs_rq has begun.
        return;
    }
    unindex(st);
    if st.flags & F_IGNORED != 0 {
        let _ = TP_OPEN.remove(cfs_rq);
        return;
    }
    let kernel_ns = if reason == END_CGROUP_GONE {
        // The kernel has not accounted it (and may never); the cfs_rq may be freed already.
        KERNEL_NS_UNKNOWN
    } else if st.self_time0 != u64::MAX {
        // Exact at any observation after the unthrottle, until the next unthrottle.
        match read::<u64>(cfs_rq, o.cfs_rq_throttled_clock_self_time) {
            Some(t) if t >= st.self_time0 => t - st.self_time0,
            _ => KERNEL_NS_UNKNOWN,
        }
    } else if at_exit && st.ev.kernel_start_clock != 0 {
        match read::<u64>(cfs_rq, o.cfs_rq_rq).and_then(|rq| read::<u64>(rq, o.rq_clock)) {
            Some(clock) if clock >= st.ev.kernel_start_clock => clock - st.ev.kernel_start_clock,
            _ => KERNEL_NS_UNKNOWN,
        }
    } else {
        KERNEL_NS_UNKNOWN
    };
    st.ev.kind = if st.flags & F_UNSEEN != 0 {
        EVENT_UNSEEN_START_END
    } else {
        EVENT_END
    };
    // The earliest sight of the unthrottle, if one was left to this exit.
    st.ev.end_ns = if st.unthrottled_ns != 0 {
        st.unthrottled_ns
    } else {
        now
    };
    st.ev.kernel_ns = kernel_ns;
    st.ev.end_reason = reason;
    stops::emit(&st.ev);
    let _ = TP_OPEN.remove(cfs_rq);
}

/// Drops `st`'s `TP_BY_GROUP` entry, if it has one.
#[inline(always)]
fn unindex(st: &mut TpStop) {
    if st.flags & F_INDEXED != 0 {
        let _ = TP_BY_GROUP.remove(st.key);
        st.flags &= !F_INDEXED;
    }
}

/// The `struct cgroup *` and cgroup id of the group owning `cfs_rq`; None for groups without
/// a cgroup (autogroups, the root's `rq->cfs` has one but never a quota).
#[inline(always)]
fn group_of(o: &Offsets, cfs_rq: u64) -> Option<(u64, u64)> {
    let tg = read::<u64>(cfs_rq, o.cfs_rq_tg)?;
    let cgroup = read::<u64>(tg, o.tg_cgroup)?;
    Some((cgroup, stops::cgroup_id(o, cgroup)?))
}

#[inline(always)]
fn cpu_of(o: &Offsets, cfs_rq: u64) -> u64 {
    let rq = read::<u64>(cfs_rq, o.cfs_rq_rq).unwrap_or(0);
    read::<u32>(rq, o.rq_cpu).map_or(u64::MAX, u64::from)
}

/// `cgroup` is being removed: every open stop of its group ends as `cgroup_gone`, and a
/// throttled cfs_rq of it seen later starts nothing. The stops are found through
/// `TP_BY_GROUP` and matched by the `struct cgroup *` remembered at their start, so that
/// nothing of the (possibly freed) cfs_rq is read here.
#[inline(never)]
fn cgroup_gone(o: &Offsets, cgroup: u64) {
    let Some(cgroup_id) = stops::cgroup_id(o, cgroup) else {
        return;
    };
    let _ = TP_GONE.insert(Gone { cgroup, cgroup_id }, 1, 0);
    let cpus = cfg(CFG_NR_CPUS);
    for cpu in 0..MAX_CPUS {
        if cpu >= cpus {
            break;
        }
        let key = GroupCpu { cgroup_id, cpu };
        // SAFETY: the value is copied out.
        let Some(cfs_rq) = (unsafe { TP_BY_GROUP.get(key) }).copied() else {
            continue;
        };
        let Some(ptr) = TP_OPEN.get_ptr_mut(cfs_rq) else {
            let _ = TP_BY_GROUP.remove(key);
            continue;
        };
        // SAFETY: valid map value pointer. Ids can repeat across cgroup v1 hierarchies: only
        // a stop of this very cgroup ends.
        let (owner, start_ns) = unsafe { ((*ptr).cgroup, (*ptr).ev.start_ns) };
        if owner == cgroup {
            end(o, cfs_rq, start_ns, END_CGROUP_GONE, false);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Refill callbacks

/// Remembers up to `MAX_LIST` cfs_rqs of the list at `head` (linked through `link` inside each
/// cfs_rq) in this CPU's `slot`, for the callback `key`.
#[inline(always)]
fn collect(slot: u32, key: u64, head: u64, link: u32) {
    let Some(p) = TP_PENDING.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: per-CPU slot; refill callbacks do not nest on a CPU.
    let p = unsafe { &mut *p };
    p.key = key;
    p.n = 0;
    if link == ABSENT {
        return;
    }
    let Some(mut node) = read::<u64>(head, 0) else {
        return;
    };
    for i in 0..MAX_LIST {
        if node == head || node == 0 {
            break;
        }
        p.cfs_rqs[i] = node - link as u64;
        p.n = i as u64 + 1;
        match read::<u64>(node, 0) {
            Some(next) => node = next,
            None => break,
        }
    }
}

/// At a refill callback's entry: every listed cfs_rq that is throttled is open (started now if
/// we had not seen it) and marked as being refilled, its end left to this callback's exit.
#[inline(always)]
fn refill_entry(o: &Offsets, slot: u32) {
    let Some(p) = TP_PENDING.get_ptr(slot) else {
        return;
    };
    // SAFETY: per-CPU slot.
    let p = unsafe { &*p };
    let t = now();
    for i in 0..MAX_LIST {
        if i as u64 >= p.n {
            break;
        }
        let cfs_rq = p.cfs_rqs[i];
        if read_bits(cfs_rq, &o.cfs_rq_throttled).unwrap_or(0) == 0 {
            continue;
        }
        // SAFETY: lookup only.
        if unsafe { TP_OPEN.get(cfs_rq) }.is_none() {
            start(o, cfs_rq, t, 0, false);
        }
        if let Some(st) = TP_OPEN.get_ptr_mut(cfs_rq) {
            // SAFETY: valid map value pointer.
            let st = unsafe { &mut *st };
            st.flags |= F_REFILL_PENDING | F_EXIT_PENDING;
            if st.ev.kernel_start_clock == 0 {
                st.ev.kernel_start_clock =
                    read::<u64>(cfs_rq, o.cfs_rq_throttled_clock).unwrap_or(0);
            }
        }
    }
}

/// At a refill callback's exit: the listed cfs_rqs now unthrottled end as refills. Those still
/// throttled stay "being refilled" only if an async unthrottle is queued for them, and wait for
/// its CSD's exit only if that is traced. One throttled again after an unthrottle seen during
/// the callback ends that stop (its kernel time is known only from 6.6) and starts a new one.
///
/// From 6.2 the period timer unthrottles only its own CPU's cfs_rq; the others are unthrottled
/// by a CSD on their CPU, possibly while this exit runs, and `unthrottle_cfs_rq` clears
/// `throttled` before it accounts the time (`throttled_clock_self_time`, in tg_unthrottle_up).
/// Such a cfs_rq, read here without its rq lock, may look unthrottled and unaccounted: its end
/// is left to the CSD's exit or to the next observation under its rq lock.
#[inline(always)]
fn refill_exit(o: &Offsets, slot: u32, key: u64) {
    let Some(p) = TP_PENDING.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: per-CPU slot.
    let p = unsafe { &mut *p };
    if p.key == 0 || p.key != key {
        return;
    }
    let t = now();
    let async_kernel = slot == SLOT_TIMER && o.rq_cfsb_csd != ABSENT;
    // SAFETY: helper without preconditions.
    let this_cpu = u64::from(unsafe { bpf_get_smp_processor_id() });
    let csd_traced = cfg(CFG_CSD_UNTHROTTLE_FN) != 0;
    for i in 0..MAX_LIST {
        if i as u64 >= p.n {
            break;
        }
        let cfs_rq = p.cfs_rqs[i];
        let Some(ptr) = TP_OPEN.get_ptr_mut(cfs_rq) else {
            continue;
        };
        // SAFETY: valid map value pointer.
        let st = unsafe { &mut *ptr };
        let throttled = read_bits(cfs_rq, &o.cfs_rq_throttled).unwrap_or(1) != 0;
        if async_kernel && cpu_of(o, cfs_rq) != this_cpu {
            if throttled && !queued_for_async(o, cfs_rq) {
                // No runtime for it this time (or its CSD is taking it off the list now; that
                // CSD's exit ends it all the same).
                st.flags &= !(F_REFILL_PENDING | F_EXIT_PENDING);
            } else if !csd_traced {
                st.flags &= !F_EXIT_PENDING;
            }
        } else if !throttled {
            end(o, cfs_rq, st.ev.start_ns, END_REFILL, true);
        } else if episode_changed(st, || {
            read::<u64>(cfs_rq, o.cfs_rq_throttled_clock_self_time)
        }) {
            end(o, cfs_rq, st.ev.start_ns, END_REFILL, false);
            start(o, cfs_rq, t, 0, false);
        } else if !queued_for_async(o, cfs_rq) {
            st.flags &= !(F_REFILL_PENDING | F_EXIT_PENDING);
        } else if !csd_traced {
            // Its CSD is not traced: the next observation after it ends the stop.
            st.flags &= !F_EXIT_PENDING;
        }
    }
    p.key = 0;
    p.n = 0;
}

/// Whether `cfs_rq` is on some rq's `cfsb_csd_list` (an async unthrottle is on its way).
#[inline(always)]
fn queued_for_async(o: &Offsets, cfs_rq: u64) -> bool {
    if o.cfs_rq_throttled_csd_list == ABSENT {
        return false;
    }
    let link = cfs_rq + o.cfs_rq_throttled_csd_list as u64;
    read::<u64>(link, 0).is_some_and(|next| next != link)
}
