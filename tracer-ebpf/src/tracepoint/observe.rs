//! Observation from a task: at a context switch or a wakeup, the task's sched_entity chain is
//! walked up and each bandwidth-limited cfs_rq on it is compared with its open stop, which the
//! observation starts, ends, or counts a park on. These are the hot paths (every switch and
//! wakeup): the chain is read with direct loads, a level found unthrottled with no stop open
//! anywhere costs no map lookup, and everything past that is one global function
//! ([`observed`]) that the verifier checks once per program, not at every level of every chain.
use tracer_common::{ABSENT, END_CPU_OFFLINE, END_QUOTA_CHANGE, Offsets};

use super::stop::{
    TASK_HELD, TASK_PARKED, TP_OPEN, TpStop, any_open, end, ended_reason, episode_changed,
    refilling, start,
};
use crate::{
    deferred, held, offsets, stops,
    toolbox::{load, load_bits, now, number, read, read_bits},
};

/// How long an unthrottle seen outside a refill callback waits for the callback's exit before
/// it ends the stop itself (the exit never comes, e.g. a teardown flush without tracepoints).
const EXIT_WAIT_NS: u64 = 100_000_000;

/// Deepest cgroup nesting walked from a task.
const MAX_DEPTH: usize = 8;

/// How an observation saw its task, which says whether a throttled group holds it now.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(super) enum Seen {
    SwitchedOut = 0,
    SwitchedIn = 1,
    WokenUp = 2,
}

impl Seen {
    fn of(bits: u32) -> Self {
        match bits & SEEN_MASK {
            0 => Self::SwitchedOut,
            1 => Self::SwitchedIn,
            _ => Self::WokenUp,
        }
    }
}

/// [`observed`]'s `what`: the `Seen` in the low bits, and whether the cfs_rq is throttled.
const SEEN_MASK: u32 = 3;
const THROTTLED: u32 = 4;

/// A context switch from `prev` to `next` (the tracepoint's BTF-typed task arguments): both
/// chains are observed.
#[inline(always)]
pub(super) fn switched(o: &Offsets, prev: u64, next: u64) {
    if walk(o, prev, Seen::SwitchedOut) && deferred::any_pending() {
        deferred::switched_out(o, prev);
    }
    walk(o, next, Seen::SwitchedIn);
}

/// Walks `task`'s sched_entity chain up through its parents and observes every cfs_rq with a
/// bandwidth limit. `task` is the tracepoint's BTF-typed argument, so the chain is read with
/// direct loads. The root's cfs_rq (the entity without a parent) never has a limit, so a task
/// of the root group costs one load. Returns whether a level has a bandwidth limit.
#[inline(always)]
pub(super) fn walk(o: &Offsets, task: u64, seen: Seen) -> bool {
    let mut limited = false;
    if task == 0 || o.task_se == ABSENT {
        return limited;
    }
    let mut se = task + o.task_se as u64;
    for _ in 0..MAX_DEPTH {
        let parent = load::<u64>(se, o.se_parent).unwrap_or(0);
        if parent == 0 {
            return limited;
        }
        let Some(cfs_rq) = load::<u64>(se, o.se_cfs_rq) else {
            return limited;
        };
        if load::<i32>(cfs_rq, o.cfs_rq_runtime_enabled).unwrap_or(0) != 0 {
            limited = true;
            if let Some(throttled) = load_bits(cfs_rq, &o.cfs_rq_throttled) {
                observe(cfs_rq, throttled != 0, task, seen);
            }
        } else if any_open() {
            // A stop still open here had its quota removed (`max`), which unthrottled it and
            // turned its bandwidth off.
            quota_removed(cfs_rq);
        }
        se = parent;
    }
    limited
}

/// One bandwidth-limited `cfs_rq` on `task`'s chain: an unthrottled one with no open stop
/// (nearly every observation) returns here, without a map lookup while no stop is open
/// anywhere; the rest goes to [`observed`].
#[inline(always)]
fn observe(cfs_rq: u64, throttled: bool, task: u64, seen: Seen) {
    if !throttled {
        // SAFETY: lookup only.
        if !any_open() || unsafe { TP_OPEN.get(cfs_rq) }.is_none() {
            return;
        }
    }
    let what = seen as u32 | if throttled { THROTTLED } else { 0 };
    observed(number(cfs_rq), number(task), what);
}

/// Whether the throttled group that `task` was seen in holds it now: it waits on that CPU and
/// cannot run before the unthrottle. On the task-based throttle (6.18+) only a parked task
/// does; before it, the whole group is off the CPU, so a task switched out still runnable
/// (preempted or throttled, not going to sleep) or woken into it does. Read only for a
/// throttled group: nothing of this is on the path of an unthrottled switch.
#[inline(always)]
fn holds(o: &Offsets, task: u64, parked: bool, seen: Seen) -> bool {
    if parked {
        return true;
    }
    if o.task_throttled.offset != ABSENT {
        return false;
    }
    match seen {
        Seen::SwitchedIn => false,
        Seen::WokenUp => true,
        Seen::SwitchedOut => {
            let delayed = o.task_se != ABSENT
                && read_bits(task + u64::from(o.task_se), &o.se_sched_delayed).unwrap_or(0) != 0;
            read_bits(task, &o.task_on_rq).unwrap_or(0) != 0 && !delayed
        }
    }
}

/// `start`'s `how` for `task`.
#[inline(always)]
fn how(o: &Offsets, task: u64, parked: bool, seen: Seen) -> u32 {
    let mut how = 0;
    if parked {
        how |= TASK_PARKED;
    }
    if holds(o, task, parked, seen) {
        how |= TASK_HELD;
    }
    how
}

/// `cfs_rq`, on the chain of `task`, is throttled or has an open stop: start, end or update
/// it. `what`: the `Seen` and `THROTTLED` bits. A global function, as `stop::start` is: the
/// verifier checks it once per program, with numbers for arguments, so everything is read
/// through the helper here (this is not the common path).
#[unsafe(export_name = "tp_observed")]
#[inline(never)]
extern "C" fn observed(cfs_rq: u64, task: u64, what: u32) -> i32 {
    let o = offsets();
    let seen = Seen::of(what);
    // The 6.18 throttle work parks a task by switching it out with `throttled` set.
    let parked =
        seen == Seen::SwitchedOut && read_bits(task, &o.task_throttled).is_some_and(|t| t != 0);
    update(o, cfs_rq, what & THROTTLED != 0, task, parked, seen);
    0
}

#[inline(always)]
fn update(o: &Offsets, cfs_rq: u64, throttled: bool, task: u64, parked: bool, seen: Seen) {
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
                if episode_changed(o, cfs_rq, st) {
                    // The unthrottle (and a new throttle) happened unseen: close the old stop,
                    // open the new one.
                    let reason = ended_reason(o, cfs_rq, st);
                    end(cfs_rq, st.ev.start_ns, reason, false);
                    start(cfs_rq, now(), task, how(o, task, parked, seen));
                } else {
                    if parked {
                        note_park(o, cfs_rq, st, now());
                        if st.ev.leaf_cgroup_id == 0 {
                            st.ev.leaf_cgroup_id = stops::leaf_cgroup(o, task);
                        }
                    }
                    if holds(o, task, parked, seen) {
                        held::hold(o, task, now(), &mut st.ev);
                    }
                    if st.children_unlisted != 0 {
                        st.children_unlisted = 0;
                        stops::stopped_children(o, cfs_rq, &mut st.ev);
                    }
                }
                return;
            }
            if st.exit_pending == 0 && o.rq_cfsb_csd == ABSENT && refilling(st.cgroup) {
                // Unthrottled by a callback that did not list it (`stop::refill_begins`).
                st.refill_pending = 1;
                st.exit_pending = 1;
            }
            if st.exit_pending != 0 {
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
            end(cfs_rq, st.ev.start_ns, reason, false);
        }
        None => {
            if throttled {
                start(cfs_rq, now(), task, how(o, task, parked, seen));
            }
        }
    }
}

/// `cfs_rq` has no bandwidth limit now: a stop of it still open ended when its quota was
/// removed (`max`), or when its CPU went offline: `unthrottle_offline_cfs_rqs` turns the
/// bandwidth of an offline CPU's cfs_rqs off while the group keeps its quota.
#[inline(never)]
fn quota_removed(cfs_rq: u64) {
    // SAFETY: the value is copied out; `end` claims the stop before it touches it.
    if let Some(start_ns) = unsafe { TP_OPEN.get(cfs_rq) }.map(|st| st.ev.start_ns) {
        let o = offsets();
        let quota = read::<u64>(cfs_rq, o.cfs_rq_tg).and_then(|tg| read::<u64>(tg, o.tg_quota));
        let reason = match quota {
            // `u64::MAX` is the kernel's RUNTIME_INF: no limit.
            Some(q) if q != u64::MAX => END_CPU_OFFLINE,
            _ => END_QUOTA_CHANGE,
        };
        end(number(cfs_rq), start_ns, reason, false);
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
