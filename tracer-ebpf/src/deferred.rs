//! The work a stop deferred, measured in hindsight (tracepoint backend): each held thread's
//! `sum_exec_runtime` at the hold and what it ran by the time it next blocks, one `DeferredEvent`
//! (`continues` set if a later stop held it first). The kernel keeps no count of a throttled
//! group's waiting work: docs/definitions.md and docs/design.md ("Deferred work"). The context
//! switch looks a thread up only while one is pending and its group has a bandwidth limit.
use aya_ebpf::{
    Global,
    macros::map,
    maps::{Array, HashMap},
};
use tracer_common::{
    ABSENT, DEFERRED_CONTINUES, DEFERRED_UNFOLLOWED, DeferredEvent, EVENT_DEFERRED, Offsets,
};

use crate::toolbox::{add_to, emit, load, nonzero, read, read_bits, still_queued};

/// 1 when the backend can see the threads block (the tracepoint backend's context switch);
/// set by the agent at load. The other backends hold threads too, but nothing would end them.
#[unsafe(no_mangle)]
static DEFERRED_ON: Global<u32> = Global::new(0);

/// A held thread's work in progress.
#[repr(C)]
#[derive(Clone, Copy)]
struct Pending {
    cgroup_id: u64,
    since_ns: u64,
    /// Its `sum_exec_runtime` at the hold.
    exec_ns: u64,
}

/// Held threads by tid. Full, a hold is sent at once as not followed.
#[map]
static PENDING: HashMap<u32, Pending> = HashMap::with_max_entries(16384, 0);

/// Entries in `PENDING`, kept with atomic adds: the context switch reads it before any lookup.
#[map]
static PENDING_COUNT: Array<u64> = Array::with_max_entries(1, 0);

/// Whether any held thread is still to be ended.
#[inline(always)]
pub fn any_pending() -> bool {
    nonzero(&PENDING_COUNT)
}

#[inline(always)]
fn exec_ns(o: &Offsets, task: u64) -> Option<u64> {
    if o.task_se == ABSENT {
        return None;
    }
    read::<u64>(task + u64::from(o.task_se), o.se_sum_exec_runtime)
}

fn send(tid: u32, p: &Pending, exec_ns: u64, continues: u32) {
    emit(&DeferredEvent {
        kind: EVENT_DEFERRED,
        tid,
        cgroup_id: p.cgroup_id,
        since_ns: p.since_ns,
        ran_ns: exec_ns.saturating_sub(p.exec_ns),
        continues,
        _reserved: 0,
    });
}

/// The stop of `cgroup_id` holds `task` (thread `tid`) from `since_ns`.
#[inline(always)]
pub fn held(o: &Offsets, task: u64, tid: u32, cgroup_id: u64, since_ns: u64) {
    if DEFERRED_ON.load() == 0 {
        return;
    }
    let Some(exec) = exec_ns(o, task) else {
        return;
    };
    let now = Pending {
        cgroup_id,
        since_ns,
        exec_ns: exec,
    };
    if let Some(p) = PENDING.get_ptr_mut(tid) {
        // SAFETY: a valid map value; only programs holding this thread's rq lock (its holds
        // and its switch-out) touch its entry.
        let p = unsafe { &mut *p };
        send(tid, p, exec, DEFERRED_CONTINUES);
        *p = now;
    } else if PENDING.insert(tid, now, 0).is_ok() {
        add_to(&PENDING_COUNT, 1);
    } else {
        send(tid, &now, exec, DEFERRED_UNFOLLOWED);
    }
}

/// `prev` (a BTF-typed task pointer) is being switched out: if it is held work's thread and no
/// longer queued, its work is done.
#[inline(always)]
pub fn switched_out(o: &Offsets, prev: u64) {
    let Some(tid) = load::<u32>(prev, o.task_pid) else {
        return;
    };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(p) = (unsafe { PENDING.get(tid) }).copied() else {
        return;
    };
    // Still queued (preempted, or held again by a stop), or parked by the 6.18 throttle:
    // its work is not done.
    if still_queued(o, prev) || read_bits(prev, &o.task_throttled).is_some_and(|t| t != 0) {
        return;
    }
    send(tid, &p, exec_ns(o, prev).unwrap_or(p.exec_ns), 0);
    if PENDING.remove(tid).is_ok() {
        add_to(&PENDING_COUNT, u64::MAX);
    }
}
