//! The refill callbacks: the CFS period and slack timers (hrtimer) and, from 6.2, the CSD that
//! unthrottles a remote CPU's cfs_rqs (`__cfsb_csd_unthrottle`). At a callback's entry the
//! cfs_rqs on the list it works on (`cfs_b->throttled_cfs_rq`, `rq->cfsb_csd_list`) are
//! remembered per CPU and their stops marked as being refilled; at its exit those now
//! unthrottled end as refills, with the kernel's clock still the unthrottle's.
use aya_ebpf::{helpers::bpf_get_smp_processor_id, macros::map, maps::PerCpuArray};
use tracer_common::{ABSENT, END_REFILL, Offsets};

use super::{
    config::{Timer, csd_traced, is_csd_unthrottle, timer},
    stop::{
        TP_OPEN, cpu_of, end, episode_changed, period_expires, refill_begins, refill_ends,
        start_at_refill,
    },
};
use crate::{
    offsets,
    toolbox::{load, now, read, read_bits},
};

/// Longest list walked at a timer or CSD callback (a group's throttled cfs_rqs: one per CPU).
const MAX_LIST: usize = 32;

#[repr(C)]
struct Pending {
    /// The hrtimer or csd whose callback is running; 0 = none.
    key: u64,
    /// The group's `struct cgroup *` while its timer callback runs before 6.2, else 0
    /// (`stop::refill_begins`).
    cgroup: u64,
    n: u64,
    cfs_rqs: [u64; MAX_LIST],
}

const SLOT_TIMER: u32 = 0;
const SLOT_CSD: u32 = 1;

/// Per CPU, the cfs_rqs a refill callback may unthrottle, from its entry to its exit.
/// Callbacks run in hard IRQ with interrupts off, so they do not nest on one CPU.
#[map]
static TP_PENDING: PerCpuArray<Pending> = PerCpuArray::with_max_entries(2, 0);

/// The hrtimer `hrtimer` is about to run its callback: if it is a group's period or slack timer,
/// its throttled list is what the callback refills.
#[inline(always)]
pub(super) fn timer_entry(o: &Offsets, hrtimer: u64) {
    let Some(function) = load::<u64>(hrtimer, o.hrtimer_function) else {
        return;
    };
    let kind = timer(o, function);
    let timer_offset = match kind {
        Timer::Period => o.cfsb_period_timer,
        Timer::Slack => o.cfsb_slack_timer,
        Timer::Other => return,
    };
    if timer_offset == ABSENT || o.cfsb_throttled_cfs_rq == ABSENT {
        return;
    }
    let cfs_b = hrtimer - timer_offset as u64;
    collect(
        SLOT_TIMER,
        hrtimer,
        cfs_b + o.cfsb_throttled_cfs_rq as u64,
        o.cfs_rq_throttled_list,
    );
    refill_entry(SLOT_TIMER);
    let Some(cgroup) = read::<u64>(cfs_b - u64::from(o.tg_cfs_bandwidth), o.tg_cgroup) else {
        return;
    };
    if kind == Timer::Period {
        period_expires(o, cgroup);
    }
    if o.rq_cfsb_csd == ABSENT
        && let Some(p) = TP_PENDING.get_ptr_mut(SLOT_TIMER)
    {
        // SAFETY: per-CPU slot; refill callbacks do not nest on a CPU.
        unsafe { (*p).cgroup = cgroup };
        refill_begins(cgroup);
    }
}

/// The hrtimer `timer`'s callback returned.
#[inline(always)]
pub(super) fn timer_exit(timer: u64) {
    if let Some(cgroup) = refill_exit(SLOT_TIMER, timer) {
        refill_ends(offsets(), cgroup);
    }
}

/// The CSD `csd` is about to run `function`: if that is `__cfsb_csd_unthrottle`, the csd is
/// its rq's `cfsb_csd` and the rq's `cfsb_csd_list` is what it unthrottles.
#[inline(always)]
pub(super) fn csd_entry(o: &Offsets, function: u64, csd: u64) {
    if !is_csd_unthrottle(o, function) || csd == 0 {
        return;
    }
    if o.rq_cfsb_csd == ABSENT || o.rq_cfsb_csd_list == ABSENT {
        return;
    }
    let rq = csd - o.rq_cfsb_csd as u64;
    let head = rq + o.rq_cfsb_csd_list as u64;
    collect(SLOT_CSD, csd, head, o.cfs_rq_throttled_csd_list);
    refill_entry(SLOT_CSD);
}

/// The CSD `csd`'s function returned.
#[inline(always)]
pub(super) fn csd_exit(csd: u64) {
    refill_exit(SLOT_CSD, csd);
}

/// Remembers up to `MAX_LIST` cfs_rqs of the list at `head` (linked through `link` inside each
/// cfs_rq) in this CPU's `slot`, for the callback `key`.
#[inline(always)]
fn collect(slot: u32, key: u64, head: u64, link: u32) {
    let Some(p) = TP_PENDING.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: per-CPU slot; refill callbacks do not nest on a CPU.
    let p = unsafe { &mut *p };
    p.key = key;
    p.cgroup = 0;
    p.n = 0;
    if link == ABSENT {
        return;
    }
    let Some(mut node) = read::<u64>(head, 0) else {
        return;
    };
    for i in 0..MAX_LIST {
        if node == head || node == 0 {
            break;
        }
        p.cfs_rqs[i] = node - link as u64;
        p.n = i as u64 + 1;
        match read::<u64>(node, 0) {
            Some(next) => node = next,
            None => break,
        }
    }
}

/// At a refill callback's entry: every listed cfs_rq that is throttled is open (started now if
/// we had not seen it) and marked as being refilled, its end left to this callback's exit.
#[inline(always)]
fn refill_entry(slot: u32) {
    let Some(p) = TP_PENDING.get_ptr(slot) else {
        return;
    };
    // SAFETY: per-CPU slot.
    let p = unsafe { &*p };
    let t = now();
    for i in 0..MAX_LIST {
        if i as u64 >= p.n {
            break;
        }
        entering(p.cfs_rqs[i], t);
    }
}

/// One cfs_rq of [`refill_entry`]'s list, `t` the callback's entry. A global function, as
/// `stop::start` is: the verifier checks it once per program, not once per list entry.
#[unsafe(export_name = "tp_refill_entering")]
#[inline(never)]
extern "C" fn entering(cfs_rq: u64, t: u64) -> i32 {
    let o = offsets();
    if read_bits(cfs_rq, &o.cfs_rq_throttled).unwrap_or(0) == 0 {
        return 0;
    }
    // SAFETY: lookup only.
    if unsafe { TP_OPEN.get(cfs_rq) }.is_none() {
        start_at_refill(cfs_rq, t);
    }
    if let Some(st) = TP_OPEN.get_ptr_mut(cfs_rq) {
        // SAFETY: valid map value pointer.
        let st = unsafe { &mut *st };
        st.refill_pending = 1;
        st.exit_pending = 1;
        if st.ev.kernel_start_clock == 0 {
            st.ev.kernel_start_clock = read::<u64>(cfs_rq, o.cfs_rq_throttled_clock).unwrap_or(0);
        }
    }
    0
}

/// At a refill callback's exit: the listed cfs_rqs now unthrottled end as refills ([`exited`]).
/// Returns the group whose callback this was, if [`timer_entry`] marked it running.
#[inline(always)]
fn refill_exit(slot: u32, key: u64) -> Option<u64> {
    let p = TP_PENDING.get_ptr_mut(slot)?;
    // SAFETY: per-CPU slot.
    let p = unsafe { &mut *p };
    if p.key == 0 || p.key != key {
        return None;
    }
    let t = now();
    let timer = u32::from(slot == SLOT_TIMER);
    for i in 0..MAX_LIST {
        if i as u64 >= p.n {
            break;
        }
        exited(p.cfs_rqs[i], t, timer);
    }
    p.key = 0;
    p.n = 0;
    (p.cgroup != 0).then_some(p.cgroup)
}

/// One cfs_rq of [`refill_exit`]'s list (`timer` 1 for a timer's callback, 0 for a CSD's):
/// unthrottled, it ends as a refill; still throttled, it waits for a queued async unthrottle's
/// CSD if that is traced; throttled again after an unthrottle, that stop ends and a new one
/// starts. Global, as [`entering`] is.
///
/// From 6.2 other CPUs' cfs_rqs are unthrottled by a CSD, possibly while this runs, and
/// `throttled` is cleared before the time is accounted (tg_unthrottle_up): read without the rq
/// lock, such a cfs_rq may look unthrottled and unaccounted, so its end is left to the CSD's
/// exit or the next observation under its rq lock.
#[unsafe(export_name = "tp_refill_exited")]
#[inline(never)]
extern "C" fn exited(cfs_rq: u64, t: u64, timer: u32) -> i32 {
    let o = offsets();
    let Some(ptr) = TP_OPEN.get_ptr_mut(cfs_rq) else {
        return 0;
    };
    // SAFETY: valid map value pointer.
    let st = unsafe { &mut *ptr };
    let throttled = read_bits(cfs_rq, &o.cfs_rq_throttled).unwrap_or(1) != 0;
    let async_kernel = timer != 0 && o.rq_cfsb_csd != ABSENT;
    // SAFETY: helper without preconditions.
    let this_cpu = u64::from(unsafe { bpf_get_smp_processor_id() });
    if async_kernel && cpu_of(o, cfs_rq) != this_cpu {
        if throttled && !unthrottle_coming(o, cfs_rq) {
            // No runtime for it this time.
            st.refill_pending = 0;
            st.exit_pending = 0;
        } else if !csd_traced() {
            st.exit_pending = 0;
        }
    } else if !throttled {
        end(cfs_rq, st.ev.start_ns, END_REFILL, true);
    } else if episode_changed(o, cfs_rq, st) {
        end(cfs_rq, st.ev.start_ns, END_REFILL, false);
        start_at_refill(cfs_rq, t);
    } else if !unthrottle_coming(o, cfs_rq) {
        st.refill_pending = 0;
        st.exit_pending = 0;
    } else if !csd_traced() {
        // Its CSD is not traced: the next observation after it ends the stop.
        st.exit_pending = 0;
    }
    0
}

/// Whether a refill has paid the throttled `cfs_rq` and its unthrottle is on its way: it is on
/// some rq's `cfsb_csd_list`, or its `runtime_remaining` is positive. The second covers the
/// moments the list does not: a CSD already running on its CPU has taken it off the list and
/// not yet unthrottled it, or another CPU's refill holds it on that CPU's own local list.
/// Without it the marks were cleared in that window, and an end seen later would be `unknown`
/// (a window read from the kernel's code; the rare `unknown` ends measured on the host, 6.18,
/// are of a cause not found: docs/kernel.md section 2.1).
#[inline(always)]
fn unthrottle_coming(o: &Offsets, cfs_rq: u64) -> bool {
    if o.cfs_rq_throttled_csd_list == ABSENT {
        return false;
    }
    let link = cfs_rq + o.cfs_rq_throttled_csd_list as u64;
    read::<u64>(link, 0).is_some_and(|next| next != link)
        || read::<i64>(cfs_rq, o.cfs_rq_runtime_remaining).is_some_and(|r| r > 0)
}
