//! Cgroups removed while they are traced, for every backend: the kernel may never unthrottle a
//! removed group's throttled cfs_rqs (docs/kernel.md §2.3), so the programs end its open stops at
//! `cgroup_rmdir` (and `cgroup_release`) as `cgroup_gone`, found by cgroup and CPU
//! (`OPEN_BY_GROUP`), and remember the cgroup so that a late refill or walk does nothing. The
//! tracepoint backend's sweep is in `tracepoint::stop`; kprobe's and fentry's is
//! [`cgroup_removed`], a raw tracepoint program (raw: the kprobe backend needs no kernel BTF).
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, LruHashMap},
    programs::RawTracePointContext,
};
use tracer_common::{END_CGROUP_GONE, EVENT_END, KERNEL_NS_UNKNOWN, Offsets};

use crate::{
    OPEN, STOP_SCRATCH, nr_cpus, offsets,
    toolbox::{add_to, cgroup_id, emit, now, read},
};

/// A cgroup's stop on one CPU: the key of `OPEN_BY_GROUP`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupCpu {
    pub cgroup_id: u64,
    pub cpu: u64,
}

/// Every open stop (the tracepoint backend's ignored ones too) by cgroup and CPU: value =
/// `struct cfs_rq *`, the key of the backend's map of open stops.
#[map]
pub static OPEN_BY_GROUP: HashMap<GroupCpu, u64> = HashMap::with_max_entries(16384, 0);

/// A removed cgroup: its `struct cgroup *` and id (ids alone can repeat across v1 hierarchies,
/// addresses alone are reused after the free).
#[repr(C)]
#[derive(Clone, Copy)]
struct Gone {
    cgroup: u64,
    cgroup_id: u64,
}

/// Cgroups removed while tracing. LRU: ids are never reused, old entries can go.
#[map]
static GONE: LruHashMap<Gone, u8> = LruHashMap::with_max_entries(1024, 0);

/// `GONE`'s new entries so far (atomic adds, from any CPU; a cgroup's rmdir and its release
/// both mark it gone, the second finds it there). Nothing deletes from `GONE`, so its new
/// entries less the entries it holds are the removed cgroups it evicted, which the agent
/// reports (the `end` line's `evicted_removed_cgroups`): a throttled cfs_rq of such a cgroup
/// seen after its eviction would start a stop.
#[map]
static GONE_INSERTED: Array<u64> = Array::with_max_entries(1, 0);

/// [`end_stop`]'s slot of `STOP_SCRATCH`: it runs in a cgroup removal's process context,
/// where a throttle or unthrottle program can interrupt it on the same CPU (7.2 throttles from
/// hardirq context) and fill slot 0.
const REMOVAL_SLOT: u32 = 1;

/// Most CPUs swept at a cgroup's removal (`nr_cpus` is the real count).
pub const MAX_CPUS: u64 = 1024;

/// Remembers `cgroup` (id `cgroup_id`) as removed.
#[inline(always)]
pub fn mark_gone(cgroup: u64, cgroup_id: u64) {
    if GONE
        .insert(Gone { cgroup, cgroup_id }, 1, BPF_NOEXIST.into())
        .is_ok()
    {
        add_to(&GONE_INSERTED, 1);
    }
}

/// Whether `cgroup` (id `cgroup_id`) was removed while tracing.
#[inline(always)]
pub fn is_gone(cgroup: u64, cgroup_id: u64) -> bool {
    // SAFETY: lookup only.
    unsafe { GONE.get(Gone { cgroup, cgroup_id }) }.is_some()
}

/// Whether the group owning `cfs_rq` was removed while tracing.
#[inline(always)]
pub fn owner_gone(o: &Offsets, cfs_rq: u64) -> bool {
    group_of(o, cfs_rq).is_some_and(|(cgroup, cgroup_id)| is_gone(cgroup, cgroup_id))
}

/// The `struct cgroup *` and cgroup id of the group owning `cfs_rq`; None for groups without
/// a cgroup (autogroups; the root's `rq->cfs` has one but never a quota).
#[inline(always)]
pub fn group_of(o: &Offsets, cfs_rq: u64) -> Option<(u64, u64)> {
    let tg = read::<u64>(cfs_rq, o.cfs_rq_tg)?;
    let cgroup = read::<u64>(tg, o.tg_cgroup)?;
    Some((cgroup, cgroup_id(o, cgroup)?))
}

/// `(struct cgroup *cgrp, const char *path)`: the cgroup is being removed.
#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn fn_cgroup_rmdir(ctx: RawTracePointContext) -> i32 {
    cgroup_removed(offsets(), ctx.arg(0));
    0
}

/// The function-probe backends' sweep: `cgroup` is being removed, so each of its open stops
/// (`OPEN`) ends now as `cgroup_gone`, without kernel time (the kernel has not accounted it and
/// may never), and the cgroup is remembered as gone (`stops::begin` and `stops::finish` look).
/// Its cfs_rqs are still allocated here: the task group is freed only after the css is
/// released, later. Also run at `cgroup_release` (the same program attached there): a cgroup
/// removed before the rmdir program was attached; the sweep is idempotent.
#[inline(always)]
fn cgroup_removed(o: &Offsets, cgroup: u64) {
    let Some(cgroup_id) = cgroup_id(o, cgroup) else {
        return;
    };
    mark_gone(cgroup, cgroup_id);
    let cpus = nr_cpus();
    for cpu in 0..MAX_CPUS {
        if cpu >= cpus {
            break;
        }
        end_gone(cgroup, cgroup_id, cpu);
    }
}

/// Ends the open stop of `cgroup` (id `cgroup_id`) on `cpu`, if there is one. A global function
/// (exported, and BTF says so): the verifier checks it once, not once per CPU of the loop.
/// Returns 0: a global function must return a number.
#[unsafe(export_name = "fn_end_gone")]
#[inline(never)]
pub extern "C" fn end_gone(cgroup: u64, cgroup_id: u64, cpu: u64) -> i32 {
    let key = GroupCpu { cgroup_id, cpu };
    // SAFETY: the value is copied out.
    let Some(cfs_rq) = (unsafe { OPEN_BY_GROUP.get(key) }).copied() else {
        return 0;
    };
    // Ids can repeat across cgroup v1 hierarchies: only a stop of this very cgroup ends.
    if group_of(offsets(), cfs_rq).map(|(c, _)| c) == Some(cgroup) {
        let _ = OPEN_BY_GROUP.remove(key);
        end_stop(cfs_rq, cgroup_id);
    }
    0
}

/// The open stop of `cfs_rq`, of the removed cgroup `cgroup_id`, ends now as `cgroup_gone`,
/// without kernel time: the kernel has not accounted it, and may never.
fn end_stop(cfs_rq: u64, cgroup_id: u64) {
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
    // The claim, as in `stops::finish`: an unthrottle of this cfs_rq on another CPU may end it
    // first.
    if OPEN.remove(cfs_rq).is_err() {
        return;
    }
    ev.kind = EVENT_END;
    ev.end_ns = now();
    ev.kernel_ns = KERNEL_NS_UNKNOWN;
    ev.end_reason = END_CGROUP_GONE;
    emit(ev);
}
