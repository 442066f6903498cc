//! Per-period CPU demand, on every backend: at each expiry of a group's period timer (the
//! kernel's own period boundary) what each CPU's group entity's `sum_exec_runtime` grew by since
//! the last is one `PeriodEvent`, with the pool before the refill (so the burst it spent). Run
//! from the period timer only (the tracepoint backend's hrtimer_expire_entry, the others'
//! `sched_cfs_period_timer` entry), never on the sched_switch path. On 7.x the entities sit in
//! per-CPU copies the programs have no offsets for; how they find them is docs/kernel.md §7.
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_map_lookup_percpu_elem, bpf_probe_read_kernel},
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use tracer_common::{ABSENT, EVENT_PERIOD, Offsets, PeriodEvent};

use crate::{
    CGROUP_FILTER, FILTER_CGROUPS, nr_cpus,
    toolbox::{cgroup_id, emit, now, read},
};

/// Most CPUs read per period (`nr_cpus`, a constant to the verifier, is the real count, so
/// it walks that many iterations); on a machine with more, the usage is unknown. The verifier
/// follows each iteration's branches on one path, and refuses a path of more than 8192 of
/// them ("sequence of jumps is too complex"): 1024 CPUs were.
const MAX_CPUS: u64 = 512;

/// One group's entity on one CPU.
#[repr(C)]
#[derive(Clone, Copy)]
struct GroupCpu {
    tg: u64,
    cpu: u64,
}

/// Its `sum_exec_runtime` at the expiry `seen_ns`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Reading {
    sum_ns: u64,
    seen_ns: u64,
}

/// The last expiry seen of a group's period timer, and whose group it was (a freed
/// `task_group` can come back as another cgroup's).
#[repr(C)]
#[derive(Clone, Copy)]
struct LastExpiry {
    cgroup_id: u64,
    at_ns: u64,
}

/// LRU: the entries of removed groups age out by themselves.
#[map]
static DEMAND_CPU: LruHashMap<GroupCpu, Reading> = LruHashMap::with_max_entries(65536, 0);

#[map]
static DEMAND_GROUP: LruHashMap<u64, LastExpiry> = LruHashMap::with_max_entries(8192, 0);

/// The period being built, and what the per-CPU step needs.
#[repr(C)]
struct Scratch {
    ev: PeriodEvent,
    tg: u64,
    /// Where the entities are: `tg->se` (the array), or on 7.x what a CPU's copy of
    /// `DEMAND_COUNTS` is to be added to for the group's cfs_rq on that CPU ([`entities_shift`]).
    ses: u64,
    /// The previous expiry's time; 0 = none.
    prev: u64,
}

/// Per CPU: period timer expiries seen (`SEEN`) and periods emitted (`EMITTED`). On 7.x its
/// copies' addresses also measure the per-CPU offsets ([`percpu_copy`]).
///
/// Also load-bearing: without these two helper calls (at `period_ends`' entry and before the
/// ring-buffer output) the object built with bpf-linker emitted no period at all for some
/// workloads although the program ran (seen on 6.18 with a bursty group; the cause, in the
/// compiled code or the verifier, is not found yet). Keep them where they are.
#[map]
static DEMAND_COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);
const SEEN: u32 = 0;
const EMITTED: u32 = 1;

#[inline(always)]
fn count(slot: u32) {
    if let Some(p) = DEMAND_COUNTS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, only this CPU writes it and programs do not nest on a CPU.
        unsafe { *p += 1 };
    }
}

#[map]
static DEMAND_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Longest throttled list counted (one cfs_rq per CPU; past this the count is a lower bound).
const MAX_LIST: u64 = 64;

/// The period timer at `timer` is about to run its callback: the group's period ends now.
#[inline(always)]
pub fn timer_expires(o: &Offsets, timer: u64) {
    if !o.has_entities() || o.cfsb_throttled_cfs_rq == ABSENT {
        return;
    }
    // The group's addresses are computed from the timer's, and end up in map keys: the
    // verifier allows neither for a BTF-typed pointer (a tp_btf or fentry argument); a copy
    // read back is a plain number.
    // SAFETY: reads a local of this frame.
    if let Ok(timer) = unsafe { bpf_probe_read_kernel(&timer as *const u64) } {
        period_ends(o, timer);
    }
}

/// The cfs_rqs on the list at `head`, up to `MAX_LIST`.
#[inline(always)]
fn list_len(head: u64) -> u32 {
    let mut node = read::<u64>(head, 0).unwrap_or(head);
    let mut n = 0;
    for _ in 0..MAX_LIST {
        if node == head || node == 0 {
            break;
        }
        n += 1;
        node = read::<u64>(node, 0).unwrap_or(0);
    }
    n
}

/// The period timer at `timer` expires: emits the period of its group that ends now.
#[inline(never)]
fn period_ends(o: &Offsets, timer: u64) {
    let t = now();
    count(SEEN);
    let cfs_b = timer - u64::from(o.cfsb_period_timer);
    let tg = cfs_b - u64::from(o.tg_cfs_bandwidth);
    let Some(id) = read::<u64>(tg, o.tg_cgroup).and_then(|cgroup| cgroup_id(o, cgroup)) else {
        return;
    };
    // SAFETY: lookup by value; the value is not dereferenced.
    if FILTER_CGROUPS.load() != 0 && unsafe { CGROUP_FILTER.get(id) }.is_none() {
        return;
    }
    let ses = if o.entities_per_cpu() {
        entities_shift(o, tg)
    } else {
        read::<u64>(tg, o.tg_se)
    };
    if let Some(ses) = ses {
        emit_period(o, t, tg, id, ses);
    }
}

/// `cpu`'s copy of `DEMAND_COUNTS` (slot 0), as a plain number. Every per-CPU object's copies
/// lie the same per-CPU offsets apart (`per_cpu_ptr(p, cpu)` is `p + __per_cpu_offset[cpu]`
/// for static and allocated ones alike), so these addresses say how far apart any two CPUs'
/// copies of the group's cfs_tg_state are.
#[inline(always)]
fn percpu_copy(cpu: u32) -> Option<u64> {
    let slot: u32 = 0;
    // SAFETY: the map and the key are this object's; the value is not dereferenced.
    let copy = unsafe {
        bpf_map_lookup_percpu_elem(
            (&raw const DEMAND_COUNTS).cast_mut().cast(),
            (&raw const slot).cast(),
            cpu,
        )
    } as u64;
    if copy == 0 {
        return None;
    }
    // A map value pointer is no number to the verifier (no arithmetic with unknown values);
    // a copy read back is.
    // SAFETY: reads a local of this frame.
    unsafe { bpf_probe_read_kernel(&copy as *const u64) }.ok()
}

/// 7.x: the value to which a CPU's [`percpu_copy`] adds up to the group `tg`'s cfs_rq on that
/// CPU, i.e. `tg->cfs_rq` less the map's own per-CPU pointer. The one absolute offset it needs
/// is the current task's: its cfs_rq (`se.cfs_rq`, that of its group on its CPU, the root's
/// being `rq->cfs`) is its group's per-CPU `cfs_rq` pointer plus the offset of the CPU its rq
/// is.
#[inline(always)]
fn entities_shift(o: &Offsets, tg: u64) -> Option<u64> {
    if o.task_se == ABSENT || o.se_cfs_rq == ABSENT {
        return None;
    }
    // SAFETY: helper without preconditions; the task is only read through probe reads.
    let task = unsafe { bpf_get_current_task() };
    let here = read::<u64>(task, o.task_se + o.se_cfs_rq)?;
    let cpu = read::<u64>(here, o.cfs_rq_rq).and_then(|rq| read::<u32>(rq, o.rq_cpu))?;
    let here_base = read::<u64>(here, o.cfs_rq_tg).and_then(|g| read::<u64>(g, o.tg_cfs_rq))?;
    let copy = percpu_copy(cpu)?;
    let base = read::<u64>(tg, o.tg_cfs_rq)?;
    // here = here_base + offset(cpu) and copy = map + offset(cpu), so the group's cfs_rq on
    // CPU c, base + offset(c), is this plus copy(c).
    Some(
        base.wrapping_add(here.wrapping_sub(here_base))
            .wrapping_sub(copy),
    )
}

/// The group entity of `tg` on `cpu`, found through `ses` (see `Scratch::ses`).
#[inline(always)]
fn entity(o: &Offsets, tg: u64, ses: u64, cpu: u64) -> Option<u64> {
    if !o.entities_per_cpu() {
        return read::<u64>(ses + 8 * cpu, 0);
    }
    let cfs_rq = ses.wrapping_add(percpu_copy(cpu as u32)?);
    // A wrong offset would land elsewhere: what is found must be this group's cfs_rq.
    if read::<u64>(cfs_rq, o.cfs_rq_tg)? != tg {
        return None;
    }
    Some(cfs_rq - u64::from(o.tg_state_cfs_rq) + u64::from(o.tg_state_se))
}

/// Builds and emits the period of the group `tg` (cgroup `id`, entities `ses`) ending at `t`.
#[inline(never)]
fn emit_period(o: &Offsets, t: u64, tg: u64, id: u64, ses: u64) {
    let cfs_b = tg + u64::from(o.tg_cfs_bandwidth);
    let Some(scratch) = DEMAND_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot; programs do not nest on a CPU while using it.
    let scratch = unsafe { &mut *scratch };
    // SAFETY: the value is copied out.
    let prev = match unsafe { DEMAND_GROUP.get(tg) } {
        Some(last) if last.cgroup_id == id => last.at_ns,
        _ => 0,
    };
    scratch.tg = tg;
    scratch.ses = ses;
    scratch.prev = prev;
    scratch.ev = PeriodEvent {
        kind: EVENT_PERIOD,
        cgroup_id: id,
        start_ns: prev,
        end_ns: t,
        quota_ns: read::<u64>(tg, o.tg_quota).unwrap_or(u64::MAX),
        period_ns: read::<u64>(tg, o.tg_period).unwrap_or(u64::MAX),
        burst_ns: read::<u64>(tg, o.tg_burst).unwrap_or(u64::MAX),
        runtime_ns: read::<u64>(cfs_b, o.cfsb_runtime).unwrap_or(u64::MAX),
        runtime_snap_ns: read::<u64>(cfs_b, o.cfsb_runtime_snap).unwrap_or(u64::MAX),
        throttled_cpus: list_len(cfs_b + u64::from(o.cfsb_throttled_cfs_rq)),
        ..PeriodEvent::default()
    };
    let cpus = nr_cpus();
    if cpus > MAX_CPUS {
        scratch.prev = 0;
    }
    for cpu in 0..MAX_CPUS {
        if cpu >= cpus {
            break;
        }
        add_cpu(o, scratch, cpu);
    }
    let _ = DEMAND_GROUP.insert(
        tg,
        LastExpiry {
            cgroup_id: id,
            at_ns: t,
        },
        0,
    );
    count(EMITTED);
    let record: &PeriodEvent = &scratch.ev;
    emit(record);
}

/// Adds `cpu`'s share to the period in `scratch.ev` (whose `end_ns` is now): what the group entity
/// there ran since the expiry `prev`, and remembers its reading for the next one. A CPU without
/// a reading from `prev`, or whose entity cannot be read now, makes the period's usage unknown
/// (`start_ns` 0): never short.
///
/// The loop body is this one call, whose state lives in the map value `ev`: every path through
/// an iteration reaches the next with the same registers, so the verifier's cost stays linear
/// in the CPU bound.
#[inline(never)]
fn add_cpu(o: &Offsets, scratch: &mut Scratch, cpu: u64) {
    let (tg, prev, ev) = (scratch.tg, scratch.prev, &mut scratch.ev);
    let Some(sum) =
        entity(o, tg, scratch.ses, cpu).and_then(|se| read::<u64>(se, o.se_sum_exec_runtime))
    else {
        ev.start_ns = 0;
        return;
    };
    ev.cpus_read += 1;
    let key = GroupCpu { tg, cpu };
    // SAFETY: the value is copied out.
    match unsafe { DEMAND_CPU.get(key) }.copied() {
        Some(r) if prev != 0 && r.seen_ns == prev && sum >= r.sum_ns => {
            let delta = sum - r.sum_ns;
            ev.usage_ns += delta;
            if delta > 0 {
                ev.cpus_used += 1;
            }
            if delta > ev.max_cpu_ns {
                ev.max_cpu_ns = delta;
            }
        }
        _ => ev.start_ns = 0,
    }
    let _ = DEMAND_CPU.insert(
        key,
        Reading {
            sum_ns: sum,
            seen_ns: ev.end_ns,
        },
        0,
    );
}
