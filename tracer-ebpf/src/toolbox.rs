//! What every program uses: the clock, reads of kernel memory (by helper or BTF-checked load),
//! cgroup ids, whether a task is still queued, atomic counters, and the ring buffer with its
//! count of lost records. A leaf: it uses only the maps and globals of main.rs.
use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    maps::{Array, PerCpuArray},
};
use tracer_common::{
    ABSENT, BitField, DeferredEvent, EVENT_END, EVENT_UNSEEN_START_END, KERNEL_NS_UNKNOWN,
    LOST_KERNEL_NS, Offsets, PeriodEvent, StopEvent, lost_key,
};

use crate::{EVENTS, LOST, LOST_BY_CGROUP, WAKEUP_BYTES};

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
