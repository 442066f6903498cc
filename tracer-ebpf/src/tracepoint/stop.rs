//! The open stops of the tracepoint backend and their two ends: `start` opens one (START), `end`
//! closes it (END or an unseen-start END) exactly once however many CPUs see the unthrottle, and
//! `cgroup_gone` closes a removed cgroup's. The state lives here because every observation
//! point (a task's walk, a refill callback, a cgroup's removal) reads and marks the same entry.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use tracer_common::{
    ABSENT, END_CGROUP_GONE, END_QUOTA_CHANGE, END_REFILL, END_UNKNOWN, EVENT_END, EVENT_START,
    EVENT_UNSEEN_START_END, KERNEL_NS_UNKNOWN, Offsets, StopEvent,
};

use super::config::{CFG_ARMED_NS, cfg};
use crate::{
    OPEN_FULL, held, nr_cpus, offsets,
    removal::{GroupCpu, MAX_CPUS, OPEN_BY_GROUP, group_of, is_gone, mark_gone},
    stops,
    toolbox::{self, now, read, read_bits},
};

/// The throttle began before the trace did: the end is an unseen-start end.
const F_UNSEEN: u32 = 2;
/// Filtered out (or not a cgroup's): remembered only so the hot path need not describe it again.
const F_IGNORED: u32 = 4;

/// `start`'s `how`: the task was just parked (6.18 task-based throttle).
pub(super) const TASK_PARKED: u32 = 1;
/// `start`'s `how`: the stop holds the task from now.
pub(super) const TASK_HELD: u32 = 2;

/// An open stop: its record so far, and what its end needs.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct TpStop {
    pub(super) ev: StopEvent,
    /// `throttled_clock_self_time` at START; `u64::MAX` when the kernel has none (< 6.6).
    self_time0: u64,
    /// `F_UNSEEN`, `F_IGNORED`: set in the scratch slot before the entry is inserted, never
    /// written after. What changes later is in the byte-sized marks below: programs on several
    /// CPUs update an open stop at once (the stopped CPU's observations, the refill timer's
    /// CPU, a CSD's CPU) and BPF has no atomic OR/AND before 5.12, so no mark shares a word
    /// that another program read-modify-writes: each is set or cleared by one byte store.
    flags: u32,
    /// Non-zero: the stop is a refill in progress: its cfs_rq is on a list a refill callback
    /// is working on (set at that callback's entry, cleared at its exit).
    pub(super) refill_pending: u8,
    /// Non-zero: a refill callback whose exit looks at this cfs_rq is running or queued (the
    /// CSD of an async unthrottle): an unthrottle seen elsewhere is left to that exit, which
    /// reads the kernel's clock right after the unthrottle (the only exact `kernel_ns` before
    /// 6.6). Set at the callback's entry, cleared at its exit.
    pub(super) exit_pending: u8,
    /// Non-zero: `key` is in `OPEN_BY_GROUP` (set by the program that opened the stop, cleared
    /// by the one that claimed its end).
    indexed: u8,
    /// Non-zero: the stop was opened by a refill callback's walk, which does not list the
    /// stopped children (see `start`); the next observation from a task lists them. Only
    /// observations from a task of this cfs_rq's CPU, which hold its rq lock, write it after
    /// the stop is open.
    pub(super) children_unlisted: u32,
    /// The first observation of `throttled == 0` that was left to a callback's exit; 0 = none.
    /// The earliest sign of the end, so it is the END's time.
    pub(super) unthrottled_ns: u64,
    /// The group's `struct cgroup *` and this stop's `OPEN_BY_GROUP` key (with `indexed`).
    pub(super) cgroup: u64,
    key: GroupCpu,
}

/// Stops in progress for this backend, by `struct cfs_rq *`.
#[map]
pub(super) static TP_OPEN: HashMap<u64, TpStop> = HashMap::with_max_entries(16384, 0);

/// How many `TP_OPEN` entries there are, never fewer: counted before an insert (taken back if
/// it fails) and after a removal (a failed removal leaves it high). While it is 0 the hot path
/// looks up no stop for a cfs_rq it finds unthrottled, or whose quota was removed. Updated
/// with BPF atomic adds (`lock xadd`, every kernel), from any CPU.
#[map]
static TP_OPEN_COUNT: Array<u64> = Array::with_max_entries(1, 0);

#[inline(always)]
fn count_open(delta: u64) {
    toolbox::add_to(&TP_OPEN_COUNT, delta);
}

/// Whether any stop may be open.
#[inline(always)]
pub(super) fn any_open() -> bool {
    toolbox::nonzero(&TP_OPEN_COUNT)
}

/// One stop: its cfs_rq and its `start_ns` (two stops of one cfs_rq never share a start).
#[repr(C)]
#[derive(Clone, Copy)]
struct StopId {
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

/// Scratch space to build a new stop in.
#[map]
static TP_SCRATCH: PerCpuArray<TpStop> = PerCpuArray::with_max_entries(1, 0);

/// Whether `cfs_rq`, throttled now, was unthrottled (and throttled again) since `st` began.
/// 6.6+: `throttled_clock_self_time` grows only when a throttle ends (it is written under the
/// rq lock, at the unthrottle). Before 6.6 nothing of the kernel's says so reliably
/// (`throttled_clock` is stored after `throttled`, and a timer's walk reads both without the rq
/// lock), so only an unthrottle we saw ourselves and left to a callback's exit counts.
#[inline(always)]
pub(super) fn episode_changed(o: &Offsets, cfs_rq: u64, st: &TpStop) -> bool {
    if st.self_time0 != u64::MAX {
        return read::<u64>(cfs_rq, o.cfs_rq_throttled_clock_self_time)
            .is_some_and(|t| t != st.self_time0);
    }
    st.unthrottled_ns != 0
}

/// `cfs_rq` is throttled and not yet open: open it (emit START unless it predates the trace).
/// `task` is a task of the group seen at the observation, `how` how it was seen (`TASK_PARKED`,
/// `TASK_HELD`: one word, as BPF calls take at most five arguments). Of two CPUs that see the
/// same throttle at once, the first to insert it opens it.
///
/// Global (exported, in BTF), so the verifier checks it once instead of at every call: its
/// arguments are plain numbers to it, read through the helper, and it must return one (0).
#[unsafe(export_name = "tp_start")]
#[inline(never)]
pub(super) extern "C" fn start(cfs_rq: u64, now: u64, task: u64, how: u32) -> i32 {
    open(offsets(), cfs_rq, now, task, how);
    0
}

/// [`start`] from a refill callback's list, where no task of the group is at hand (the CPU's
/// current task is looked at instead). A function of its own: the verifier does not know a
/// global function's arguments, so with `task` an argument the refill programs were verified
/// with everything a task's observation does too, and the observations with the refill's part.
#[unsafe(export_name = "tp_start_at_refill")]
#[inline(never)]
pub(super) extern "C" fn start_at_refill(cfs_rq: u64, now: u64) -> i32 {
    open(offsets(), cfs_rq, now, 0, 0);
    0
}

/// [`start`]'s work; `task` 0: from a refill callback ([`start_at_refill`]).
#[inline(always)]
fn open(o: &Offsets, cfs_rq: u64, now: u64, task: u64, how: u32) {
    // Nothing opens before every program is attached: a stop opened by the refill programs
    // alone could miss its end (the context switches that see it are not traced yet) and run
    // on through later stops of its cfs_rq, its kernel time theirs too, some of them ended
    // before the agent's cpu.stat baseline. Opened once armed, it is judged by the kernel's
    // own start (`started_before_trace`) and its kernel time is its own.
    if cfg(CFG_ARMED_NS) == 0 {
        return;
    }
    let parked = how & TASK_PARKED != 0;
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
    st.refill_pending = 0;
    st.exit_pending = 0;
    st.indexed = 0;
    st.children_unlisted = 0;
    st.unthrottled_ns = 0;
    st.cgroup = 0;
    st.key = GroupCpu {
        cgroup_id: 0,
        cpu: 0,
    };
    if let Some((cgroup, cgroup_id)) = group_of(o, cfs_rq) {
        if is_gone(cgroup, cgroup_id) {
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
            // Only here: the refill callbacks' programs open with `start_at_refill`, whose
            // `task` is 0, so this walk is not in them (it doubled their verification time).
            // A stop is first seen at a refill only if no context switch
            // on its CPU saw it first (a slack timer's walk right after the throttle); its
            // children are listed at the next observation from a task, before the tasks the
            // throttle stopped have all left the queue unnoticed.
            stops::stopped_children(o, cfs_rq, &mut st.ev);
            if how & TASK_HELD != 0 {
                held::hold(o, task, now, &mut st.ev);
            }
            // Before 6.18 the tasks queued when the group was throttled are neither switched
            // out nor woken during the stop: the first observation lists them from the
            // runqueue's tree, as the function-probe backends do at the throttle. From 6.18
            // each is listed when it is parked, which is when its wait is counted.
            if o.task_throttled.offset == ABSENT {
                crate::queued::list(o, cfs_rq, task, &mut st.ev);
            }
        } else {
            stops::running_task(o, cfs_rq, &mut st.ev);
            st.children_unlisted = 1;
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
    count_open(1);
    match TP_OPEN.insert(cfs_rq, stop, BPF_NOEXIST.into()) {
        Ok(()) => {}
        // Another CPU opened it first.
        Err(EEXIST) => {
            count_open(u64::MAX);
            return;
        }
        Err(_) => {
            count_open(u64::MAX);
            toolbox::bump(&OPEN_FULL);
            return;
        }
    }
    if st.cgroup != 0
        && OPEN_BY_GROUP.insert(st.key, cfs_rq, 0).is_ok()
        && let Some(open) = TP_OPEN.get_ptr_mut(cfs_rq)
    {
        // SAFETY: valid map value pointer; only this stop's own entry is marked.
        let open = unsafe { &mut *open };
        if open.ev.start_ns == now {
            open.indexed = 1;
        }
    }
    if st.flags & (F_UNSEEN | F_IGNORED) == 0 {
        toolbox::emit(&st.ev);
    }
}

/// Whether the throttle began before the tracer was armed (which `start` waits for), judged
/// from the kernel's own start (`throttled_clock_self`, or `throttled_clock` before 6.6)
/// carried into CLOCK_MONOTONIC through this rq's current clock offset. A throttle whose
/// accounting has not begun yet (6.18: no task parked) counts as seen now.
#[inline(always)]
fn started_before_trace(o: &Offsets, cfs_rq: u64, now: u64) -> bool {
    let armed = cfg(CFG_ARMED_NS);
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
/// is the unthrottle's clock. A global function, as [`start`] is.
#[unsafe(export_name = "tp_end")]
#[inline(never)]
pub(super) extern "C" fn end(cfs_rq: u64, start_ns: u64, reason: u32, at_exit: bool) -> i32 {
    close(offsets(), cfs_rq, start_ns, reason, at_exit);
    0
}

#[inline(always)]
fn close(o: &Offsets, cfs_rq: u64, start_ns: u64, reason: u32, at_exit: bool) {
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
        remove_open(cfs_rq);
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
    toolbox::emit(&st.ev);
    remove_open(cfs_rq);
}

#[inline(always)]
fn remove_open(cfs_rq: u64) {
    if TP_OPEN.remove(cfs_rq).is_ok() {
        count_open(u64::MAX);
    }
}

/// Drops `st`'s `OPEN_BY_GROUP` entry, if it has one.
#[inline(always)]
fn unindex(st: &mut TpStop) {
    if st.indexed != 0 {
        let _ = OPEN_BY_GROUP.remove(st.key);
        st.indexed = 0;
    }
}

#[inline(always)]
pub(super) fn cpu_of(o: &Offsets, cfs_rq: u64) -> u64 {
    let rq = read::<u64>(cfs_rq, o.cfs_rq_rq).unwrap_or(0);
    read::<u32>(rq, o.rq_cpu).map_or(u64::MAX, u64::from)
}

/// `cgroup` is being removed: every open stop of its group ends as `cgroup_gone`, and a
/// throttled cfs_rq of it seen later starts nothing.
#[inline(always)]
pub(super) fn cgroup_gone(o: &Offsets, cgroup: u64) {
    let Some(cgroup_id) = toolbox::cgroup_id(o, cgroup) else {
        return;
    };
    mark_gone(cgroup, cgroup_id);
    sweep(o, cgroup, cgroup_id, Sweep::Gone);
}

/// Group timers (`struct cgroup *`) whose callback is running, before 6.2 only (see
/// [`refill_begins`]).
#[map]
static TP_REFILLING: HashMap<u64, u8> = HashMap::with_max_entries(MAX_CPUS as u32, 0);

/// Before 6.2 a group's timer callback unthrottles every CPU's cfs_rq itself, and it may
/// unthrottle one that was throttled after its entry walked the list (the group's other CPU
/// ran dry between the tracepoint and the refill). Such a stop is not on the callback's list,
/// and its CPU sees the unthrottle before the callback's exit does: from here to
/// [`refill_ends`] that observation leaves the end to the exit ([`refilling`]), the only place
/// that reads the kernel's clock of the unthrottle before 6.6.
#[inline(always)]
pub(super) fn refill_begins(cgroup: u64) {
    let _ = TP_REFILLING.insert(cgroup, 1, 0);
}

/// Whether `cgroup`'s timer callback is running ([`refill_begins`]).
#[inline(always)]
pub(super) fn refilling(cgroup: u64) -> bool {
    // SAFETY: lookup only.
    unsafe { TP_REFILLING.get(cgroup) }.is_some()
}

/// `cgroup`'s timer callback returned: every open stop of the group now unthrottled ends as a
/// refill with the kernel's clock (the listed ones have, this takes the rest), then its
/// observations end stops themselves again.
#[inline(always)]
pub(super) fn refill_ends(o: &Offsets, cgroup: u64) {
    if let Some(cgroup_id) = toolbox::cgroup_id(o, cgroup) {
        sweep(o, cgroup, cgroup_id, Sweep::Refilled);
    }
    let _ = TP_REFILLING.remove(cgroup);
}

/// The period timer of `cgroup`'s group expires: an open stop of the group whose cfs_rq is no
/// longer throttled ends now. Its unthrottle was seen neither at a refill callback's exit nor
/// by an observation on its CPU since (the group's tasks there exited, as a killed workload's
/// do); without this it would stay open to the end of the trace. Its end time is the first
/// sight of the unthrottle if there was one, else this timer's: up to a period late; its
/// kernel time is exact from 6.6 (`throttled_clock_self_time`). A stop whose callback exit is
/// still to come is left to it before 6.6, where that exit alone has the kernel's clock.
#[inline(always)]
pub(super) fn period_expires(o: &Offsets, cgroup: u64) {
    if !any_open() {
        return;
    }
    if let Some(cgroup_id) = toolbox::cgroup_id(o, cgroup) {
        sweep(o, cgroup, cgroup_id, Sweep::Expired);
    }
}

/// Which of a group's open stops [`sweep`] ends, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sweep {
    /// The group was removed: all, as `cgroup_gone`.
    Gone,
    /// Its period timer expires: the unthrottled ones no exit is to end (`period_expires`).
    Expired,
    /// Its timer callback returned: the unthrottled ones, as refills (`refill_ends`).
    Refilled,
}

/// Ends the open stops of `cgroup` (id `cgroup_id`) on every CPU that `how` says. The stops are
/// found through
/// `OPEN_BY_GROUP` and matched by the `struct cgroup *` remembered at their start, so that
/// nothing of a removed group's (possibly freed) cfs_rq is read.
#[inline(never)]
fn sweep(o: &Offsets, cgroup: u64, cgroup_id: u64, how: Sweep) {
    let cpus = nr_cpus();
    for cpu in 0..MAX_CPUS {
        if cpu >= cpus {
            break;
        }
        let key = GroupCpu { cgroup_id, cpu };
        // SAFETY: the value is copied out.
        let Some(cfs_rq) = (unsafe { OPEN_BY_GROUP.get(key) }).copied() else {
            continue;
        };
        let Some(ptr) = TP_OPEN.get_ptr_mut(cfs_rq) else {
            let _ = OPEN_BY_GROUP.remove(key);
            continue;
        };
        // SAFETY: valid map value pointer. Ids can repeat across cgroup v1 hierarchies: only
        // a stop of this very cgroup ends.
        let st = unsafe { &*ptr };
        if st.cgroup != cgroup {
            continue;
        }
        if how == Sweep::Gone {
            end(cfs_rq, st.ev.start_ns, END_CGROUP_GONE, false);
        } else if read_bits(cfs_rq, &o.cfs_rq_throttled).unwrap_or(1) != 0 {
            continue;
        } else if how == Sweep::Refilled {
            end(cfs_rq, st.ev.start_ns, END_REFILL, true);
        } else if st.exit_pending == 0 || st.self_time0 != u64::MAX {
            end(cfs_rq, st.ev.start_ns, ended_reason(o, cfs_rq, st), false);
        }
    }
}

/// Why the stop `st` of `cfs_rq` ended, seen outside a refill callback's exit.
#[inline(always)]
pub(super) fn ended_reason(o: &Offsets, cfs_rq: u64, st: &TpStop) -> u32 {
    if st.refill_pending != 0 {
        END_REFILL
    } else {
        non_refill_reason(o, cfs_rq, &st.ev)
    }
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
