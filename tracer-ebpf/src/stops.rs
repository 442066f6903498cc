//! What every backend does once it knows a cfs_rq really throttled or unthrottled: describe the
//! group, remember the open stop, and emit START / END records.
use tracer_common::{
    ABSENT, EVENT_END, EVENT_START, EVENT_UNSEEN_START_END, KERNEL_NS_UNKNOWN, MAX_CHILDREN,
    Offsets, StopEvent,
};

use crate::{
    CGROUP_FILTER, FILTER_CGROUPS, OPEN, OPEN_FULL, STOP_SCRATCH, end_reason,
    held::hold,
    queued,
    removal::{self, GroupCpu, OPEN_BY_GROUP},
    toolbox::{bump, cgroup_id, emit, now, number, read, read_bits, still_queued},
};

/// Most children of one group looked at when a stop is recorded.
const MAX_SIBLINGS: usize = 16;

/// Whether `cfs_rq->throttled` is set now.
#[inline(always)]
pub fn is_throttled(o: &Offsets, cfs_rq: u64) -> Result<bool, &'static str> {
    read_bits(cfs_rq, &o.cfs_rq_throttled)
        .map(|t| t != 0)
        .ok_or("cfs_rq->throttled unreadable")
}

/// Fills the cgroup, CPU and bandwidth settings of the group that owns `cfs_rq`.
/// Returns false for cfs_rqs that are not a cgroup's (autogroups have no cgroup) or are filtered.
#[inline(always)]
pub fn describe(o: &Offsets, cfs_rq: u64, ev: &mut StopEvent) -> bool {
    let Some(tg) = read::<u64>(cfs_rq, o.cfs_rq_tg) else {
        return false;
    };
    let Some(cgroup) = read::<u64>(tg, o.tg_cgroup) else {
        return false;
    };
    let Some(id) = cgroup_id(o, cgroup) else {
        return false;
    };
    // SAFETY: lookup by value; the value is not dereferenced.
    if FILTER_CGROUPS.load() != 0 && unsafe { CGROUP_FILTER.get(id) }.is_none() {
        return false;
    }
    ev.cgroup_id = id;
    ev.cfs_rq = cfs_rq;
    let rq = read::<u64>(cfs_rq, o.cfs_rq_rq).unwrap_or(0);
    ev.cpu = read::<u32>(rq, o.rq_cpu).unwrap_or(u32::MAX);
    ev.quota_ns = read::<u64>(tg, o.tg_quota).unwrap_or(u64::MAX);
    ev.period_ns = read::<u64>(tg, o.tg_period).unwrap_or(0);
    ev.burst_ns = read::<u64>(tg, o.tg_burst).unwrap_or(0);
    true
}

/// The task running on the stopped CPU, if it is inside the throttled group (its sched_entity
/// chain reaches `cfs_rq`); the probe's own current task is often someone else. Returns it
/// when it is.
#[inline(always)]
pub fn running_task(o: &Offsets, cfs_rq: u64, ev: &mut StopEvent) -> Option<u64> {
    let rq = read::<u64>(cfs_rq, o.cfs_rq_rq).unwrap_or(0);
    let task = read::<u64>(rq, o.rq_curr)?;
    if o.task_se == ABSENT {
        return None;
    }
    let mut se = task + o.task_se as u64;
    let mut inside = false;
    // Bounded walk up the group hierarchy: cgroup trees are rarely deeper than this.
    for _ in 0..12 {
        match read::<u64>(se, o.se_cfs_rq) {
            Some(c) if c == cfs_rq => {
                inside = true;
                break;
            }
            Some(_) => {}
            None => break,
        }
        match read::<u64>(se, o.se_parent) {
            Some(parent) if parent != 0 => se = parent,
            _ => break,
        }
    }
    if !inside {
        return None;
    }
    task_ids(o, task, ev);
    Some(task)
}

/// pid, tid, comm and own (leaf) cgroup of `task`, which the caller knows is inside the
/// stopped group.
#[inline(always)]
pub fn task_ids(o: &Offsets, task: u64, ev: &mut StopEvent) {
    ev.tid = read::<u32>(task, o.task_pid).unwrap_or(0);
    ev.pid = read::<u32>(task, o.task_tgid).unwrap_or(0);
    if let Some(comm) = read::<[u8; 16]>(task, o.task_comm) {
        ev.comm = comm;
    }
    ev.leaf_cgroup_id = leaf_cgroup(o, task);
}

/// The cgroup id of `task`'s own group, `task->se.cfs_rq->tg->css.cgroup->kn->id`; 0 if
/// unreadable (or an autogroup, which has no cgroup).
#[inline(always)]
pub fn leaf_cgroup(o: &Offsets, task: u64) -> u64 {
    if o.task_se == ABSENT {
        return 0;
    }
    read::<u64>(task + o.task_se as u64, o.se_cfs_rq)
        .and_then(|cfs_rq| read::<u64>(cfs_rq, o.cfs_rq_tg))
        .and_then(|tg| read::<u64>(tg, o.tg_cgroup))
        .and_then(|cgroup| cgroup_id(o, cgroup))
        .unwrap_or(0)
}

/// The cgroup id of the group that owns `cfs_rq` now (`cfs_rq->tg->css.cgroup->kn->id`), 0 if
/// unreadable (no cgroup has id 0). A number, not an `Option`: compared with `Some(id)`, the
/// payload of a `None` was read from a stack slot never written on that path, which 5.10's
/// verifier refuses ("invalid read from stack"), and with it every kprobe and fentry program.
#[inline(always)]
fn group_id(o: &Offsets, cfs_rq: u64) -> u64 {
    read::<u64>(cfs_rq, o.cfs_rq_tg)
        .and_then(|tg| read::<u64>(tg, o.tg_cgroup))
        .and_then(|cgroup| cgroup_id(o, cgroup))
        .unwrap_or(0)
}

/// Lists in `ev` the direct children of the throttled group (of `cfs_rq`) that the throttle
/// stops too: those with tasks queued on the stopped CPU `ev.cpu`. The kernel's
/// `tg_throttle_down` starts each such child's `throttled_clock_self`, so crediting them with
/// the owner's stop reproduces their cpu.stat.local. A child whose own clock already runs
/// (6.18 parks tasks one by one, so its queue may already be empty) counts too.
///
/// The loop body is one call whose only result is an id: every path through an iteration
/// reaches the next with the same state, so the verifier's cost stays linear in the bound.
#[inline(never)]
pub fn stopped_children(o: &Offsets, cfs_rq: u64, ev: &mut StopEvent) {
    if o.tg_children == ABSENT || o.tg_siblings == ABSENT || ev.cpu == u32::MAX {
        return;
    }
    let Some(tg) = read::<u64>(cfs_rq, o.cfs_rq_tg) else {
        return;
    };
    // 7.x: per_cpu_ptr(child->cfs_rq, cpu) is the child's pointer plus this CPU's per-CPU
    // offset, which is what separates the stopped cfs_rq from its own group's pointer.
    let percpu_offset = if o.tg_cfs_rq_percpu != 0 {
        let Some(base) = read::<u64>(tg, o.tg_cfs_rq) else {
            return;
        };
        // The fentry and tp_btf backends' cfs_rq is a BTF-typed pointer.
        let stopped = number(cfs_rq);
        if stopped == 0 {
            return;
        }
        stopped.wrapping_sub(base)
    } else {
        0
    };
    let head = tg + o.tg_children as u64;
    let mut node = read::<u64>(head, 0).unwrap_or(0);
    for _ in 0..MAX_SIBLINGS {
        if node == head || node == 0 {
            return;
        }
        let id = stopped_child(o, node - o.tg_siblings as u64, ev.cpu, percpu_offset);
        if id != 0 {
            let n = ev.children as usize;
            if n < MAX_CHILDREN {
                ev.child_cgroup_ids[n] = id;
                ev.children += 1;
            } else {
                ev.children_unlisted = ev.children_unlisted.saturating_add(1);
            }
        }
        node = read::<u64>(node, 0).unwrap_or(0);
    }
    if node != head && node != 0 {
        // More children than looked at: at least one more may have been stopped.
        ev.children_unlisted = ev.children_unlisted.saturating_add(1);
    }
}

/// The cgroup id of the task group `tg` if its cfs_rq on `cpu` has tasks queued (or its
/// throttled clock running); 0 otherwise or when unreadable.
#[inline(never)]
fn stopped_child(o: &Offsets, tg: u64, cpu: u32, percpu_offset: u64) -> u64 {
    let Some(cfs_rq) = read::<u64>(tg, o.tg_cfs_rq).and_then(|rqs| {
        if o.tg_cfs_rq_percpu != 0 {
            Some(rqs.wrapping_add(percpu_offset))
        } else {
            read::<u64>(rqs + 8 * u64::from(cpu), 0)
        }
    }) else {
        return 0;
    };
    let queued = read::<u32>(cfs_rq, o.cfs_rq_nr_queued).unwrap_or(0) != 0
        || read::<u64>(cfs_rq, o.cfs_rq_throttled_clock_self).unwrap_or(0) != 0;
    if !queued {
        return 0;
    }
    read::<u64>(tg, o.tg_cgroup)
        .and_then(|cgroup| cgroup_id(o, cgroup))
        .unwrap_or(0)
}

/// `cfs_rq` has just been throttled: open its stop and emit START.
pub fn begin(o: &Offsets, cfs_rq: u64) {
    // Newer kernels (7.x) call throttle_cfs_rq again for a cfs_rq that is already throttled;
    // the stop that is open keeps its start. An open stop of another group is a removed
    // group's (the kernel does not unthrottle a removed group's cfs_rqs), whose memory this
    // cfs_rq now is: it is replaced, not continued.
    // SAFETY: lookup only; the id is copied out.
    if let Some(open) = unsafe { OPEN.get(cfs_rq) }.map(|s| s.cgroup_id)
        && open != 0
        && group_id(o, cfs_rq) == open
    {
        return;
    }
    // A removed cgroup's cfs_rq: its stop ended at the removal (crate::removal).
    if removal::owner_gone(o, cfs_rq) {
        return;
    }
    let Some(ev) = STOP_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot; programs do not nest on a CPU while using it.
    let ev = unsafe { &mut *ev };
    *ev = StopEvent {
        kind: EVENT_START,
        start_ns: now(),
        kernel_ns: KERNEL_NS_UNKNOWN,
        ..StopEvent::default()
    };
    if !describe(o, cfs_rq, ev) {
        return;
    }
    ev.tasks = read::<u32>(cfs_rq, o.cfs_rq_nr_tasks).unwrap_or(0);
    // The running task is the one the throttle takes off the CPU, unless it is going to sleep
    // (a throttle in the switch away from it); the others are queued in the runqueue's tree
    // (docs/design.md, "threads held").
    let running = running_task(o, cfs_rq, ev);
    if let Some(task) = running
        && still_queued(o, task)
    {
        hold(o, task, ev.start_ns, ev);
    }
    queued::list(o, cfs_rq, running.unwrap_or(0), ev);
    stopped_children(o, cfs_rq, ev);
    // By reference, not a stack copy (see tracepoint::stop::start).
    let record: &StopEvent = ev;
    if OPEN.insert(cfs_rq, record, 0).is_err() {
        bump(&OPEN_FULL);
        return;
    }
    let _ = OPEN_BY_GROUP.insert(group_cpu(ev), cfs_rq, 0);
    emit(ev);
}

/// The `OPEN_BY_GROUP` key of the stop `ev`.
#[inline(always)]
fn group_cpu(ev: &StopEvent) -> GroupCpu {
    GroupCpu {
        cgroup_id: ev.cgroup_id,
        cpu: u64::from(ev.cpu),
    }
}

/// `cfs_rq` has just been unthrottled; `throttled_clock` is its `throttled_clock` from before
/// the unthrottle reset it. Close its stop and emit END (or an unseen-start END).
pub fn finish(o: &Offsets, cfs_rq: u64, throttled_clock: u64) {
    let end_ns = now();
    // unthrottle_cfs_rq updated rq->clock and added exactly `rq->clock - throttled_clock` to
    // cfs_b->throttled_time (nothing if throttled_clock was 0, 6.6+); nothing updates the
    // clock again before it returns.
    let kernel_ns =
        match read::<u64>(cfs_rq, o.cfs_rq_rq).and_then(|rq| read::<u64>(rq, o.rq_clock)) {
            Some(_) if throttled_clock == 0 && o.cfs_rq_throttled_clock != ABSENT => 0,
            Some(clock) if clock >= throttled_clock => clock - throttled_clock,
            _ => KERNEL_NS_UNKNOWN,
        };
    let reason = end_reason::current();
    let Some(ev) = STOP_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot; programs do not nest on a CPU while using it.
    let ev = unsafe { &mut *ev };
    let group = group_id(o, cfs_rq);
    // SAFETY: the value is copied out before the entry is removed.
    match unsafe { OPEN.get(cfs_rq) } {
        Some(started) if group != 0 && started.cgroup_id == group => {
            *ev = *started;
            // The removal is the claim: a cgroup removal's sweep on another CPU may have
            // ended this stop since the lookup (`removal::end_gone`).
            if OPEN.remove(cfs_rq).is_err() {
                return;
            }
            let _ = OPEN_BY_GROUP.remove(group_cpu(ev));
            ev.kind = EVENT_END;
            ev.end_ns = end_ns;
            ev.kernel_ns = kernel_ns;
            ev.end_reason = reason;
        }
        // None, or a removed group's stop left in the map (see `begin`): this group's
        // stop began unseen, unless the group itself is gone (a refill after its removal).
        open => {
            if open.is_some() {
                let _ = OPEN.remove(cfs_rq);
            }
            if removal::owner_gone(o, cfs_rq) {
                return;
            }
            *ev = StopEvent {
                kind: EVENT_UNSEEN_START_END,
                end_ns,
                kernel_ns,
                end_reason: reason,
                ..StopEvent::default()
            };
            if !describe(o, cfs_rq, ev) {
                return;
            }
        }
    }
    emit(ev);
}
