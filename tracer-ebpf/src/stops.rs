//! What every backend does once it knows a cfs_rq really throttled or unthrottled: describe the
//! group, remember the open stop, and emit START / END records.
use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::map,
    maps::{Array, PerCpuArray},
};
use tracer_common::{
    ABSENT, BitField, DeferredEvent, END_CGROUP_GONE, EVENT_END, EVENT_START,
    EVENT_UNSEEN_START_END, KERNEL_NS_UNKNOWN, LOST_KERNEL_NS, MAX_CHILDREN, MAX_THREADS, Offsets,
    PeriodEvent, StopEvent, lost_key,
};

use crate::{
    CGROUP_FILTER, EVENTS, FILTER_CGROUPS, LOST, LOST_BY_CGROUP, OPEN, OPEN_FULL, WAKEUP_BYTES,
    end_reason, queued,
    removal::{self, GroupCpu, OPEN_BY_GROUP},
};

/// Scratch space for the record `begin` and `finish` build (slot 0) and [`end_gone`] (slot
/// [`REMOVAL_SLOT`]): with the child list a `StopEvent` is too big to keep two of on the BPF
/// stack of kernels without private stacks.
#[map]
static STOP_SCRATCH: PerCpuArray<StopEvent> = PerCpuArray::with_max_entries(2, 0);

/// [`end_gone`]'s slot of `STOP_SCRATCH`: it runs in a cgroup removal's process context,
/// where a throttle or unthrottle program can interrupt it on the same CPU (7.2 throttles from
/// hardirq context) and fill slot 0.
const REMOVAL_SLOT: u32 = 1;

/// Most children of one group looked at when a stop is recorded.
const MAX_SIBLINGS: usize = 16;

/// CLOCK_MONOTONIC ns.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub fn read<T>(base: u64, offset: u32) -> Option<T> {
    if offset == ABSENT || base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address; a fault returns an error.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T).ok() }
}

#[inline(always)]
pub fn read_bits(base: u64, field: &BitField) -> Option<u32> {
    read::<u32>(base, field.offset).map(|w| field.extract(w))
}

/// [`read`] without the helper call, for the hot tracepoints: a helper call costs 50-90 ns
/// under SRSO/retpoline mitigations, a direct load a few. Only for `base` that the verifier
/// knows as a BTF-typed kernel pointer (a tp_btf argument, or a pointer loaded through one this
/// way): it checks the constant `offset` against the BTF (the load must be one whole member of
/// `T`'s size) and turns a fault into 0. Anything else (map values, list nodes) needs [`read`].
#[inline(always)]
pub fn load<T>(base: u64, offset: u32) -> Option<T> {
    if offset == ABSENT || base == 0 {
        return None;
    }
    // SAFETY: a BTF-checked load; the JIT covers it with an exception-table entry (PROBE_MEM).
    Some(unsafe { core::ptr::read_volatile((base + u64::from(offset)) as *const T) })
}

/// A BTF-typed pointer (see [`load`]) as the plain number it is: the verifier allows no
/// arithmetic on such a pointer, and a global function takes only numbers. A copy read back
/// through the helper is one; 0 if the read fails.
#[inline(always)]
pub fn number(pointer: u64) -> u64 {
    // SAFETY: reads a local of this frame.
    unsafe { bpf_probe_read_kernel(&pointer as *const u64) }.unwrap_or(0)
}

/// [`read_bits`] through [`load`]. The verifier takes a bitfield load only if it covers the
/// whole bitfield from its first byte, and a plain member only whole (6.18's `bool` in
/// `task_struct.throttled` would be overrun by the 32-bit window): so the load starts at the
/// field's first byte and is as narrow as the field. Little-endian (bpfel): the window's first
/// byte holds its lowest bits.
#[inline(always)]
pub fn load_bits(base: u64, field: &BitField) -> Option<u32> {
    if field.offset == ABSENT {
        return None;
    }
    let narrow = BitField {
        offset: field.offset + field.shift / 8,
        shift: field.shift % 8,
        bits: field.bits,
    };
    let end = narrow.shift + narrow.bits;
    let word = if end <= 8 {
        load::<u8>(base, narrow.offset).map(u32::from)
    } else if end <= 16 {
        load::<u16>(base, narrow.offset).map(u32::from)
    } else {
        return load::<u32>(base, field.offset).map(|w| field.extract(w));
    };
    word.map(|w| narrow.extract(w))
}

/// Whether `cfs_rq->throttled` is set now.
#[inline(always)]
pub fn is_throttled(o: &Offsets, cfs_rq: u64) -> Result<bool, &'static str> {
    read_bits(cfs_rq, &o.cfs_rq_throttled)
        .map(|t| t != 0)
        .ok_or("cfs_rq->throttled unreadable")
}

/// `*p += v` in one atomic instruction: BPF's `lock xadd` (every kernel; the fetching and
/// OR/AND forms need 5.12+).
///
/// # Safety
/// `p` is valid and aligned, and every other update of `*p` is atomic too.
#[inline(always)]
unsafe fn atomic_add(p: *mut u64, v: u64) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: as the caller promises.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            p, v,
        );
    }
    // Clippy's host build of this crate, which has no BPF intrinsics.
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: as the caller promises.
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(p)
            .fetch_add(v, core::sync::atomic::Ordering::Relaxed);
    }
}

/// Adds `delta` (`u64::MAX` subtracts one) to a counter kept in slot 0 of a one-slot array,
/// from any CPU: every update of such a counter is this atomic add.
#[inline(always)]
pub fn add_to(counter: &Array<u64>, delta: u64) {
    if let Some(p) = counter.get_ptr_mut(0) {
        // SAFETY: a valid, aligned map value; every update is this atomic add.
        unsafe { atomic_add(p, delta) };
    }
}

/// Whether the counter [`add_to`] keeps is not 0.
#[inline(always)]
pub fn nonzero(counter: &Array<u64>) -> bool {
    counter.get(0).is_some_and(|&n| n != 0)
}

#[inline(always)]
pub fn bump(counter: &PerCpuArray<u64>) {
    if let Some(p) = counter.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU writes it and programs do not nest on a CPU.
        unsafe { *p += 1 };
    }
}

/// A ring-buffer record, as a lost one is counted.
pub trait Record {
    /// `EVENT_*`.
    fn kind(&self) -> u32;
    fn cgroup_id(&self) -> u64;
    /// The kernel time of the stop an end record carries, if it was read.
    fn ended_kernel_ns(&self) -> Option<u64> {
        None
    }
}

impl Record for StopEvent {
    fn kind(&self) -> u32 {
        self.kind
    }

    fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    fn ended_kernel_ns(&self) -> Option<u64> {
        (matches!(self.kind, EVENT_END | EVENT_UNSEEN_START_END)
            && self.kernel_ns != KERNEL_NS_UNKNOWN)
            .then_some(self.kernel_ns)
    }
}

impl Record for PeriodEvent {
    fn kind(&self) -> u32 {
        self.kind
    }

    fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }
}

impl Record for DeferredEvent {
    fn kind(&self) -> u32 {
        self.kind
    }

    fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }
}

/// Puts one record (a `StopEvent`, `PeriodEvent` or `DeferredEvent`) on the ring buffer; one
/// that finds it full is counted in `LOST` and, by its cgroup and kind, in `LOST_BY_CGROUP`,
/// where a lost end's kernel time is added up too (`LOST_KERNEL_NS`).
pub fn emit<T: Record>(event: &T) {
    let flags = if EVENTS.query(BPF_RB_AVAIL_DATA.into()) >= WAKEUP_BYTES.load() {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    if EVENTS.output::<T>(event, flags.into()).is_err() {
        bump(&LOST);
        count_lost(lost_key(event.cgroup_id(), event.kind()), 1);
        if let Some(ns) = event.ended_kernel_ns() {
            count_lost(lost_key(event.cgroup_id(), LOST_KERNEL_NS), ns);
        }
    }
}

/// Adds `n` under `key` in `LOST_BY_CGROUP`. Several CPUs may lose records of one cgroup at
/// once: the count is only ever added to atomically, and the entry is made with BPF_NOEXIST,
/// so that a CPU that finds it made already adds to it instead.
#[inline(never)]
fn count_lost(key: u64, n: u64) {
    if let Some(p) = LOST_BY_CGROUP.get_ptr_mut(key) {
        // SAFETY: a valid, aligned map value; every update after its insert is this add.
        unsafe { atomic_add(p, n) };
        return;
    }
    if LOST_BY_CGROUP.insert(key, n, BPF_NOEXIST.into()).is_err()
        && let Some(p) = LOST_BY_CGROUP.get_ptr_mut(key)
    {
        // SAFETY: as above.
        unsafe { atomic_add(p, n) };
    }
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

/// Whether the running `task` is still queued: `schedule()` dequeues a task going to sleep
/// (`on_rq` cleared; 6.12+ may instead delay the dequeue, `sched_delayed` set) before the pick
/// that can throttle its group. Where the kernel's BTF lacks the flags it counts as queued.
#[inline(always)]
pub fn still_queued(o: &Offsets, task: u64) -> bool {
    let on_rq = read_bits(task, &o.task_on_rq).is_none_or(|q| q != 0);
    let delayed = o.task_se != ABSENT
        && read_bits(task + u64::from(o.task_se), &o.se_sched_delayed).is_some_and(|d| d != 0);
    on_rq && !delayed
}

/// Lists `task` among the threads the stop `ev` holds, waiting since `since_ns`, unless it is
/// listed already; past `MAX_THREADS` it is counted in `threads_unlisted`. A thread waits once
/// per stop (it cannot run again before the unthrottle), so an entry is never updated.
#[inline(never)]
pub fn hold(o: &Offsets, task: u64, since_ns: u64, ev: &mut StopEvent) {
    let Some(tid) = read::<u32>(task, o.task_pid) else {
        return;
    };
    let n = ev.threads as usize;
    // Every index a constant: with `held[n]` taken after the loop, 5.10's verifier lost the
    // pointer on one of the paths the compiler merged ("R3 invalid mem access 'inv'").
    for i in 0..MAX_THREADS {
        if i == n {
            crate::deferred::held(o, task, tid, ev.cgroup_id, since_ns);
            let entry = &mut ev.held[i];
            entry.tid = tid;
            entry.pid = read::<u32>(task, o.task_tgid).unwrap_or(0);
            entry.since_ns = since_ns;
            entry.comm = read::<[u8; 16]>(task, o.task_comm).unwrap_or([0; 16]);
            ev.threads += 1;
            return;
        }
        if ev.held[i].tid == tid {
            return;
        }
    }
    ev.threads_unlisted = ev.threads_unlisted.saturating_add(1);
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

/// `cgrp->kn->id`, the cgroup directory's inode (its low half on 5.4, see `kn_id_is_union`).
#[inline(always)]
pub fn cgroup_id(o: &Offsets, cgroup: u64) -> Option<u64> {
    let kn = read::<u64>(cgroup, o.cgroup_kn)?;
    let id = read::<u64>(kn, o.kn_id)?;
    Some(if o.kn_id_is_union != 0 {
        id & 0xffff_ffff
    } else {
        id
    })
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
            // ended this stop since the lookup (`end_gone`).
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

/// The open stop of `cfs_rq`, of the removed cgroup `cgroup_id`, ends now as `cgroup_gone`,
/// without kernel time: the kernel has not accounted it, and may never (crate::removal).
pub fn end_gone(cfs_rq: u64, cgroup_id: u64) {
    let Some(ev) = STOP_SCRATCH.get_ptr_mut(REMOVAL_SLOT) else {
        return;
    };
    // SAFETY: per-CPU slot of this program alone (see REMOVAL_SLOT).
    let ev = unsafe { &mut *ev };
    // SAFETY: the value is copied out before the entry is removed.
    match unsafe { OPEN.get(cfs_rq) } {
        Some(open) if open.cgroup_id == cgroup_id => *ev = *open,
        _ => return,
    }
    // The claim, as in `finish`: an unthrottle of this cfs_rq on another CPU may end it first.
    if OPEN.remove(cfs_rq).is_err() {
        return;
    }
    ev.kind = EVENT_END;
    ev.end_ns = now();
    ev.kernel_ns = KERNEL_NS_UNKNOWN;
    ev.end_reason = END_CGROUP_GONE;
    emit(ev);
}
