//! Kernel side of throttle-tracer: turns the kernel's throttle/unthrottle of each cfs_rq into START
//! and END records on a ring buffer. A stop begins when `throttle_cfs_rq` really throttled and ends
//! when `unthrottle_cfs_rq` really unthrottled (docs/kernel.md, sections 1 and 2). Open stops are
//! keyed by the `struct cfs_rq *`, because the unthrottle often runs on another CPU than the one
//! stopped. Kernel struct offsets come from the agent (`OFFSETS`), resolved from BTF before load.
#![no_std]
#![no_main]
// `atomic_xadd` (toolbox::atomic_add): the BPF target has atomic adds (`lock xadd`) but not the
// compare-and-swap that core's `AtomicU64::fetch_add` requires there. Only for BPF: clippy
// checks this crate for the host too, on the stable channel.
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]

mod calls;
mod deferred;
mod demand;
mod end_reason;
mod fentry;
mod held;
mod kprobe;
mod queued;
mod removal;
mod stops;
mod toolbox;
mod tracepoint;

use aya_ebpf::{
    Global,
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
};
use tracer_common::{Offsets, StopEvent};

/// Kernel offsets, replaced by the agent before load. Read them through [`offsets`].
#[unsafe(no_mangle)]
static OFFSETS: Global<Offsets> = Global::new(Offsets::ABSENT);

/// The kernel offsets, by reference. `OFFSETS.load()` copies the whole struct onto the
/// 512-byte BPF stack (a volatile read cannot be narrowed to the fields used); with a stop
/// record or two on top, kernels before 6.13 (no private stacks) reject the program.
#[inline(always)]
pub fn offsets() -> &'static Offsets {
    // SAFETY: `Global` is `repr(transparent)` over `MaybeUninit<Offsets>` and is always
    // initialised. black_box hides the compile-time initialiser (all ABSENT) from the
    // optimiser, so every field is loaded from the .rodata map the agent filled before load.
    unsafe { &*core::hint::black_box((&raw const OFFSETS).cast::<Offsets>()) }
}

/// 1 when only the cgroups in `CGROUP_FILTER` are traced.
#[unsafe(no_mangle)]
static FILTER_CGROUPS: Global<u32> = Global::new(0);

/// The number of possible CPUs, set by the agent at load. A constant to the verifier (frozen
/// .rodata), so a loop over the CPUs is verified for this machine's count, not for the bound.
#[unsafe(no_mangle)]
static NR_CPUS: Global<u64> = Global::new(1);

#[inline(always)]
pub fn nr_cpus() -> u64 {
    // SAFETY: as for `offsets`: a `Global` is always initialised; black_box keeps the loaded
    // value from being folded into the compile-time initialiser.
    unsafe { *core::hint::black_box((&raw const NR_CPUS).cast::<u64>()) }
}

/// Ring-buffer bytes pending past which a record wakes the reader; below it the reader's own
/// tick drains the ring, so a busy machine does not pay one wakeup per record.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: Global<u64> = Global::new(64 * 1024);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Records that could not be reserved on the ring buffer, per CPU.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The same records by cgroup and kind (`tracer_common::lost_key`), so that the report can
/// say whose figures they are missing from. A full map leaves the rest to `LOST` alone.
#[map]
static LOST_BY_CGROUP: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

/// Stops in progress, by `struct cfs_rq *`.
#[map]
static OPEN: HashMap<u64, StopEvent> = HashMap::with_max_entries(65536, 0);

/// Scratch space for the record a stop's start or end builds (slot 0, `stops`) and a removed
/// cgroup's stop end (slot `removal::REMOVAL_SLOT`): with the child list a `StopEvent` is too
/// big to keep two of on the BPF stack of kernels without private stacks.
#[map]
static STOP_SCRATCH: PerCpuArray<StopEvent> = PerCpuArray::with_max_entries(2, 0);

/// Starts that could not be remembered because `OPEN` was full (their ends are then unseen).
#[map]
static OPEN_FULL: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map]
static CGROUP_FILTER: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
