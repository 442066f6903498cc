//! Observation from a task: at a context switch or a wakeup, the task's sched_entity chain is
//! walked up and each bandwidth-limited cfs_rq on it is compared with its open stop, which the
//! observation starts, ends, or counts a park on. These are the hot paths (every switch and
//! wakeup), so the chain is read with direct loads and the clock only where it is used.
use tracer_common::{ABSENT, END_QUOTA_CHANGE, Offsets};

use super::stop::{
    TASK_HELD, TASK_PARKED, TP_OPEN, TpStop, any_open, end, ended_reason, episode_changed, start,
};
use crate::stops::{self, load, load_bits, now, number, read, read_bits};

/// How long an unthrottle seen outside a refill callback waits for the callback's exit before
/// it ends the stop itself (the exit never comes, e.g. a teardown flush without tracepoints).
const EXIT_WAIT_NS: u64 = 100_000_000;

/// Deepest cgroup nesting walked from a task.
const MAX_DEPTH: usize = 8;

/// How an observation saw its task, which says whether a throttled group holds it now.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    SwitchedOut,
    SwitchedIn,
    WokenUp,
}

/// A context switch from `prev` to `next` (the tracepoint's BTF-typed task arguments): both
/// chains are observed, and `prev` counts as parked if the 6.18 throttle work just parked it.
#[inline(always)]
pub(super) fn switched(o: &Offsets, prev: u64, next: u64) {
    let parked = load_bits(prev, &o.task_throttled).unwrap_or(0) != 0;
    walk(o, prev, parked, Seen::SwitchedOut);
    walk(o, next, false, Seen::SwitchedIn);
}

/// Walks `task`'s sched_entity chain up through its parents and observes every cfs_rq with a
/// bandwidth limit. `parked`: the task was just parked by the 6.18 throttle work.
/// `task` is the tracepoint's BTF-typed argument, so the chain is read with direct loads.
#[inline(always)]
pub(super) fn walk(o: &Offsets, task: u64, parked: bool, seen: Seen) {
    if task == 0 || o.task_se == ABSENT {
        return;
    }
    let mut se = task + o.task_se as u64;
    for _ in 0..MAX_DEPTH {
        let Some(cfs_rq) = load::<u64>(se, o.se_cfs_rq) else {
            return;
        };
        let parent = load::<u64>(se, o.se_parent).unwrap_or(0);
        if load::<i32>(cfs_rq, o.cfs_rq_runtime_enabled).unwrap_or(0) != 0 {
            if let Some(throttled) = load_bits(cfs_rq, &o.cfs_rq_throttled) {
                observe(o, cfs_rq, throttled != 0, task, parked, seen);
            }
        } else if parent != 0 && any_open() {
            // Not the root's cfs_rq (never limited): a stop still open here had its quota
            // removed (`max`), which unthrottled it and turned its bandwidth off.
            quota_removed(cfs_rq);
        }
        if parent == 0 {
            return;
        }
        se = parent;
    }
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

#[inline(always)]
fn observe(o: &Offsets, cfs_rq: u64, throttled: bool, task: u64, parked: bool, seen: Seen) {
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
                    end(number(cfs_rq), st.ev.start_ns, reason, false);
                    start(
                        number(cfs_rq),
                        now(),
                        number(task),
                        how(o, task, parked, seen),
                    );
                } else {
                    if parked {
                        note_park(o, cfs_rq, st, now());
                        if st.ev.leaf_cgroup_id == 0 {
                            st.ev.leaf_cgroup_id = stops::leaf_cgroup(o, task);
                        }
                    }
                    if holds(o, task, parked, seen) {
                        stops::hold(o, task, now(), &mut st.ev);
                    }
                    if st.children_unlisted != 0 {
                        st.children_unlisted = 0;
                        stops::stopped_children(o, cfs_rq, &mut st.ev);
                    }
                }
                return;
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
            end(number(cfs_rq), st.ev.start_ns, reason, false);
        }
        None => {
            if throttled {
                start(
                    number(cfs_rq),
                    now(),
                    number(task),
                    how(o, task, parked, seen),
                );
            }
        }
    }
}

/// `cfs_rq` has no bandwidth limit now: a stop of it still open ended when its quota was
/// removed.
#[inline(never)]
fn quota_removed(cfs_rq: u64) {
    // SAFETY: the value is copied out; `end` claims the stop before it touches it.
    if let Some(start_ns) = unsafe { TP_OPEN.get(cfs_rq) }.map(|st| st.ev.start_ns) {
        end(number(cfs_rq), start_ns, END_QUOTA_CHANGE, false);
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
