//! Per-period CPU demand: at each expiry of a group's period timer (a period boundary, as the
//! kernel itself draws them) the group's entity on every CPU (`tg->se[cpu]`) is read, and what
//! its `sum_exec_runtime` grew by since the previous expiry is sent as one `PeriodEvent`. It
//! runs for CFS period timers only, never on the sched_switch path.
use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use tracer_common::{ABSENT, EVENT_PERIOD, Offsets, PeriodEvent};

use super::config::timer_fns;
use crate::{
    CGROUP_FILTER, FILTER_CGROUPS, nr_cpus,
    stops::{cgroup_id, emit, load, now, read},
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
static TP_DEMAND_CPU: LruHashMap<GroupCpu, Reading> = LruHashMap::with_max_entries(65536, 0);

#[map]
static TP_DEMAND_GROUP: LruHashMap<u64, LastExpiry> = LruHashMap::with_max_entries(8192, 0);

/// The period being built, and what the per-CPU step needs.
#[repr(C)]
struct Scratch {
    ev: PeriodEvent,
    tg: u64,
    /// `tg->se`.
    ses: u64,
    /// The previous expiry's time; 0 = none.
    prev: u64,
}

/// Per CPU: period timer expiries seen (`SEEN`) and periods emitted (`EMITTED`).
///
/// Also load-bearing: without these two helper calls (at `period_ends`' entry and before the
/// ring-buffer output) the object built with bpf-linker emitted no period at all for some
/// workloads although the program ran (seen on 6.18 with a bursty group; the cause, in the
/// compiled code or the verifier, is not found yet). Keep them where they are.
#[map]
static TP_DEMAND_COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);
const SEEN: u32 = 0;
const EMITTED: u32 = 1;

#[inline(always)]
fn count(slot: u32) {
    if let Some(p) = TP_DEMAND_COUNTS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, only this CPU writes it and programs do not nest on a CPU.
        unsafe { *p += 1 };
    }
}

#[map]
static TP_DEMAND_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Longest throttled list counted (one cfs_rq per CPU; past this the count is a lower bound).
const MAX_LIST: u64 = 64;

/// The hrtimer `timer` is about to run its callback: if it is a group's period timer, the
/// group's period ends now.
#[inline(always)]
pub(super) fn timer_entry(o: &Offsets, timer: u64) {
    if o.tg_se == ABSENT || o.cfsb_throttled_cfs_rq == ABSENT {
        return;
    }
    let (period_fn, _) = timer_fns(o);
    if period_fn == 0 || load::<u64>(timer, o.hrtimer_function) != Some(period_fn) {
        return;
    }
    // The group's addresses are computed from the timer's, and end up in map keys: the
    // verifier allows neither for a BTF-typed pointer (the tp_btf argument); a copy read back
    // is a plain number.
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
    if let Some(ses) = read::<u64>(tg, o.tg_se) {
        emit_period(o, t, tg, id, ses);
    }
}

/// Builds and emits the period of the group `tg` (cgroup `id`, entities `ses`) ending at `t`.
#[inline(never)]
fn emit_period(o: &Offsets, t: u64, tg: u64, id: u64, ses: u64) {
    let cfs_b = tg + u64::from(o.tg_cfs_bandwidth);
    let Some(scratch) = TP_DEMAND_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot; programs do not nest on a CPU while using it.
    let scratch = unsafe { &mut *scratch };
    // SAFETY: the value is copied out.
    let prev = match unsafe { TP_DEMAND_GROUP.get(tg) } {
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
    let _ = TP_DEMAND_GROUP.insert(
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
/// a reading from `prev` makes the period's usage unknown (`start_ns` 0).
///
/// The loop body is this one call, whose state lives in the map value `ev`: every path through
/// an iteration reaches the next with the same registers, so the verifier's cost stays linear
/// in the CPU bound.
#[inline(never)]
fn add_cpu(o: &Offsets, scratch: &mut Scratch, cpu: u64) {
    let (tg, prev, ev) = (scratch.tg, scratch.prev, &mut scratch.ev);
    let Some(sum) =
        read::<u64>(scratch.ses + 8 * cpu, 0).and_then(|se| read::<u64>(se, o.se_sum_exec_runtime))
    else {
        return;
    };
    ev.cpus_read += 1;
    let key = GroupCpu { tg, cpu };
    // SAFETY: the value is copied out.
    match unsafe { TP_DEMAND_CPU.get(key) }.copied() {
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
    let _ = TP_DEMAND_CPU.insert(
        key,
        Reading {
            sum_ns: sum,
            seen_ns: ev.end_ns,
        },
        0,
    );
}
