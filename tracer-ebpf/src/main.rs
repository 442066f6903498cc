//! Kernel side of throttle-tracer: turns the kernel's throttle/unthrottle of each cfs_rq into
//! START and END records on a ring buffer.
//!
//! A stop begins when `throttle_cfs_rq` really throttled (its bool return, or `cfs_rq->throttled`
//! on kernels where it returns void) and ends when `unthrottle_cfs_rq` really unthrottled
//! (`cfs_rq->throttled` cleared at return: 6.18 may return early). Open stops are keyed by the
//! `struct cfs_rq *`, because the unthrottle often runs on another CPU than the one stopped.
//! Kernel struct offsets come from the agent (`OFFSETS`), resolved from BTF before load.
#![no_std]
#![no_main]

use aya_ebpf::{
    Global,
    bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{kprobe, kretprobe, map},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
};
use aya_log_ebpf::debug;
use tracer_common::{
    ABSENT, BitField, END_CGROUP_GONE, END_CPU_OFFLINE, END_QUOTA_CHANGE, END_REFILL, END_UNKNOWN,
    EVENT_END, EVENT_START, EVENT_UNSEEN_START_END, KERNEL_NS_UNKNOWN, Offsets, StopEvent,
};

/// Kernel offsets, replaced by the agent before load.
#[unsafe(no_mangle)]
static OFFSETS: Global<Offsets> = Global::new(Offsets::ABSENT);

/// 1 when only the cgroups in `CGROUP_FILTER` are traced.
#[unsafe(no_mangle)]
static FILTER_CGROUPS: Global<u32> = Global::new(0);

/// Ring-buffer bytes pending past which a record wakes the reader; below it the reader's own
/// tick drains the ring, so a busy machine does not pay one wakeup per record.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: Global<u64> = Global::new(64 * 1024);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Records that could not be reserved on the ring buffer, per CPU.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Stops in progress, by `struct cfs_rq *`; the agent reads what is left here at exit.
#[map]
static OPEN: HashMap<u64, StopEvent> = HashMap::with_max_entries(65536, 0);

/// Starts that could not be remembered because `OPEN` was full (their ends are then unseen).
#[map]
static OPEN_FULL: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map]
static CGROUP_FILTER: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);

/// The cfs_rq argument of the `(un)throttle_cfs_rq` call in progress on this CPU, for the
/// return probe (x86's argument registers are gone by then). Both run under the rq lock with
/// interrupts off, so calls on one CPU never nest.
#[map]
static THROTTLE_ARG: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct UnthrottleEntry {
    cfs_rq: u64,
    /// `cfs_rq->throttled_clock` before unthrottle resets it (6.6+), or 0 when unreadable.
    throttled_clock: u64,
}

#[map]
static UNTHROTTLE_ARG: PerCpuArray<UnthrottleEntry> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU, how many calls of each `END_*` kind of unthrottle caller are in progress.
#[map]
static END_CONTEXT: PerCpuArray<u32> = PerCpuArray::with_max_entries(5, 0);

#[inline(always)]
fn read<T>(base: u64, offset: u32) -> Option<T> {
    if offset == ABSENT || base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address; a fault returns an error.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T).ok() }
}

#[inline(always)]
fn read_bits(base: u64, field: &BitField) -> Option<u32> {
    read::<u32>(base, field.offset).map(|w| field.extract(w))
}

#[inline(always)]
fn bump(counter: &PerCpuArray<u64>) {
    if let Some(p) = counter.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU writes it and programs do not nest on a CPU.
        unsafe { *p += 1 };
    }
}

fn emit(event: &StopEvent) {
    let flags = if EVENTS.query(aya_ebpf::bindings::BPF_RB_AVAIL_DATA.into()) >= WAKEUP_BYTES.load()
    {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    if EVENTS.output::<StopEvent>(event, flags.into()).is_err() {
        bump(&LOST);
    }
}

/// Fills the cgroup, CPU and bandwidth settings of the group that owns `cfs_rq`.
/// Returns false for cfs_rqs that are not a cgroup's (autogroups have no cgroup) or are filtered.
#[inline(always)]
fn describe(o: &Offsets, cfs_rq: u64, ev: &mut StopEvent) -> bool {
    let Some(tg) = read::<u64>(cfs_rq, o.cfs_rq_tg) else {
        return false;
    };
    let Some(cgroup) = read::<u64>(tg, o.tg_cgroup) else {
        return false;
    };
    let Some(kn) = read::<u64>(cgroup, o.cgroup_kn) else {
        return false;
    };
    let Some(mut id) = read::<u64>(kn, o.kn_id) else {
        return false;
    };
    if o.kn_id_is_union != 0 {
        id &= 0xffff_ffff;
    }
    // SAFETY: map lookups by value; the value is not dereferenced.
    if FILTER_CGROUPS.load() != 0 && unsafe { CGROUP_FILTER.get(&id) }.is_none() {
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
/// chain reaches `cfs_rq`); the probe's own current task is often someone else.
#[inline(always)]
fn running_task(o: &Offsets, cfs_rq: u64, ev: &mut StopEvent) {
    let rq = read::<u64>(cfs_rq, o.cfs_rq_rq).unwrap_or(0);
    let Some(task) = read::<u64>(rq, o.rq_curr) else {
        return;
    };
    if o.task_se == ABSENT {
        return;
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
        return;
    }
    ev.tid = read::<u32>(task, o.task_pid).unwrap_or(0);
    ev.pid = read::<u32>(task, o.task_tgid).unwrap_or(0);
    if let Some(comm) = read::<[u8; 16]>(task, o.task_comm) {
        ev.comm = comm;
    }
}

#[kprobe]
pub fn throttle_cfs_rq(ctx: ProbeContext) -> u32 {
    if let (Some(cfs_rq), Some(slot)) = (ctx.arg::<u64>(0), THROTTLE_ARG.get_ptr_mut(0)) {
        // SAFETY: per-CPU slot, see THROTTLE_ARG.
        unsafe { *slot = cfs_rq };
    }
    0
}

#[kretprobe]
pub fn throttle_cfs_rq_ret(ctx: RetProbeContext) -> u32 {
    match try_throttle_ret(&ctx) {
        Ok(()) => 0,
        Err(what) => {
            debug!(&ctx, "throttle_cfs_rq return skipped: {}", what);
            1
        }
    }
}

fn try_throttle_ret(ctx: &RetProbeContext) -> Result<(), &'static str> {
    let o = OFFSETS.load();
    let slot = THROTTLE_ARG.get_ptr_mut(0).ok_or("no per-CPU slot")?;
    // SAFETY: per-CPU slot, see THROTTLE_ARG.
    let cfs_rq = unsafe { core::mem::replace(&mut *slot, 0) };
    if cfs_rq == 0 {
        return Err("return without a recorded entry");
    }
    let throttled = if o.throttle_returns_bool != 0 {
        ctx.ret::<u64>() & 0xff != 0
    } else {
        read_bits(cfs_rq, &o.cfs_rq_throttled).ok_or("cfs_rq->throttled unreadable")? != 0
    };
    // Newer kernels (7.x) call throttle_cfs_rq again for a cfs_rq that is already throttled;
    // the stop that is open keeps its start.
    // SAFETY: lookup only; the value is not used.
    if !throttled || unsafe { OPEN.get(&cfs_rq) }.is_some() {
        return Ok(());
    }
    let mut ev = StopEvent {
        kind: EVENT_START,
        // SAFETY: helper without preconditions.
        start_ns: unsafe { bpf_ktime_get_ns() },
        kernel_ns: KERNEL_NS_UNKNOWN,
        ..StopEvent::default()
    };
    if !describe(&o, cfs_rq, &mut ev) {
        return Ok(());
    }
    ev.tasks = read::<u32>(cfs_rq, o.cfs_rq_nr_tasks).unwrap_or(0);
    running_task(&o, cfs_rq, &mut ev);
    if OPEN.insert(&cfs_rq, &ev, 0).is_err() {
        bump(&OPEN_FULL);
        return Ok(());
    }
    emit(&ev);
    Ok(())
}

#[kprobe]
pub fn unthrottle_cfs_rq(ctx: ProbeContext) -> u32 {
    let o = OFFSETS.load();
    if let (Some(cfs_rq), Some(slot)) = (ctx.arg::<u64>(0), UNTHROTTLE_ARG.get_ptr_mut(0)) {
        let entry = UnthrottleEntry {
            cfs_rq,
            throttled_clock: read::<u64>(cfs_rq, o.cfs_rq_throttled_clock).unwrap_or(0),
        };
        // SAFETY: per-CPU slot, see THROTTLE_ARG.
        unsafe { *slot = entry };
    }
    0
}

#[kretprobe]
pub fn unthrottle_cfs_rq_ret(ctx: RetProbeContext) -> u32 {
    match try_unthrottle_ret() {
        Ok(()) => 0,
        Err(what) => {
            debug!(&ctx, "unthrottle_cfs_rq return skipped: {}", what);
            1
        }
    }
}

fn try_unthrottle_ret() -> Result<(), &'static str> {
    let o = OFFSETS.load();
    let slot = UNTHROTTLE_ARG.get_ptr_mut(0).ok_or("no per-CPU slot")?;
    // SAFETY: per-CPU slot, see THROTTLE_ARG.
    let entry = unsafe {
        core::mem::replace(
            &mut *slot,
            UnthrottleEntry {
                cfs_rq: 0,
                throttled_clock: 0,
            },
        )
    };
    let cfs_rq = entry.cfs_rq;
    if cfs_rq == 0 {
        return Err("return without a recorded entry");
    }
    // 6.18 returns early without unthrottling when the cfs_rq still has no runtime.
    if read_bits(cfs_rq, &o.cfs_rq_throttled).ok_or("cfs_rq->throttled unreadable")? != 0 {
        return Ok(());
    }
    // SAFETY: helper without preconditions.
    let end_ns = unsafe { bpf_ktime_get_ns() };
    // unthrottle_cfs_rq updated rq->clock and added exactly `rq->clock - throttled_clock` to
    // cfs_b->throttled_time; nothing updates the clock again before it returns.
    let kernel_ns =
        match read::<u64>(cfs_rq, o.cfs_rq_rq).and_then(|rq| read::<u64>(rq, o.rq_clock)) {
            Some(_) if entry.throttled_clock == 0 && o.cfs_rq_throttled_clock != ABSENT => 0,
            Some(clock) if clock >= entry.throttled_clock => clock - entry.throttled_clock,
            _ => KERNEL_NS_UNKNOWN,
        };
    let end_reason = end_reason();
    // SAFETY: the value is copied out before the entry is removed.
    let started = unsafe { OPEN.get(&cfs_rq) }.copied();
    let ev = match started {
        Some(mut ev) => {
            let _ = OPEN.remove(&cfs_rq);
            ev.kind = EVENT_END;
            ev.end_ns = end_ns;
            ev.kernel_ns = kernel_ns;
            ev.end_reason = end_reason;
            ev
        }
        None => {
            let mut ev = StopEvent {
                kind: EVENT_UNSEEN_START_END,
                end_ns,
                kernel_ns,
                end_reason,
                ..StopEvent::default()
            };
            if !describe(&o, cfs_rq, &mut ev) {
                return Ok(());
            }
            ev
        }
    };
    emit(&ev);
    Ok(())
}

/// Why this CPU is unthrottling now: the innermost known caller in progress. A refill wins,
/// because a CSD refill can interrupt a quota write on the same CPU, and the pending async
/// unthrottles that a group's teardown flushes were queued by a refill.
#[inline(always)]
fn end_reason() -> u32 {
    for reason in [
        END_REFILL,
        END_CPU_OFFLINE,
        END_QUOTA_CHANGE,
        END_CGROUP_GONE,
    ] {
        if END_CONTEXT.get(reason).copied().unwrap_or(0) > 0 {
            return reason;
        }
    }
    END_UNKNOWN
}

#[inline(always)]
fn enter(reason: u32) -> u32 {
    if let Some(p) = END_CONTEXT.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot.
        unsafe { *p += 1 };
    }
    0
}

#[inline(always)]
fn leave(reason: u32) -> u32 {
    if let Some(p) = END_CONTEXT.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot; never below zero if a return probe fired without its entry.
        unsafe { *p = (*p).saturating_sub(1) };
    }
    0
}

/// Entry and return probes on one caller of `unthrottle_cfs_rq` that marks why stops end.
macro_rules! end_context {
    ($enter:ident, $leave:ident, $reason:expr) => {
        #[kprobe]
        pub fn $enter(_ctx: ProbeContext) -> u32 {
            enter($reason)
        }
        #[kretprobe]
        pub fn $leave(_ctx: RetProbeContext) -> u32 {
            leave($reason)
        }
    };
}

end_context!(refill_enter, refill_leave, END_REFILL);
end_context!(quota_change_enter, quota_change_leave, END_QUOTA_CHANGE);
end_context!(cpu_offline_enter, cpu_offline_leave, END_CPU_OFFLINE);
end_context!(cgroup_gone_enter, cgroup_gone_leave, END_CGROUP_GONE);

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
