//! The tracepoint backend: scheduler, hrtimer and CSD tracepoints only (tp_btf, and a raw
//! tracepoint for `csd_function_entry`), for kernels without kprobes or fentry
//! (docs/kernel.md §2, §8).
//!
//! START: the first time `cfs_rq->throttled == 1` is observed — at sched_switch (prev and next),
//! sched_wakeup(_new) (the task's whole se → cfs_rq chain, bounded), and at every CFS period or
//! slack timer (`cfs_b->throttled_cfs_rq`, every throttled cfs_rq of the group).
//! END (refill): `throttled` found 0 at hrtimer_expire_exit for the cfs_rqs that were on the
//! group's throttled list at entry (the local one since 6.2, all of them before), and at
//! csd_function_exit of `__cfsb_csd_unthrottle` for the cfs_rqs on `rq->cfsb_csd_list` at entry.
//! An unthrottle seen elsewhere (a context switch on the stopped CPU) while such an exit is
//! pending is left to that exit, which has the kernel's clock; its time is the END's time.
//! One unthrottle is seen from several CPUs at once: each stop is claimed (`TP_ENDED`) by the
//! first that ends it, so it is emitted once. A throttle seen again after an unthrottle nobody
//! ended (6.6+: `throttled_clock_self_time` moved) closes the old stop before opening the new.
//! END (other): `throttled` found 0 at any other observation point (quota write, CPU offline):
//! `quota_change` when the group's quota/period/burst differ from the start's, else `unknown`.
//! END (late): an open stop whose cfs_rq is found unthrottled at its group's next period timer,
//! which no exit and no observation on its CPU saw (its tasks there exited); it ends then.
//! END (cgroup gone): at cgroup_rmdir (and again at cgroup_release) every open stop of the
//! removed cgroup ends as `cgroup_gone`. The kernel may never unthrottle those cfs_rqs
//! (`destroy_cfs_bandwidth` only flushes pending CSD unthrottles, docs/kernel.md §2.3), and a
//! removed cgroup has no task left to stop; a refill that still comes is not a new stop.
//!
//! Duration: `start_ns`/`end_ns` are CLOCK_MONOTONIC at the observations. `kernel_ns` is what the
//! kernel accounted, from its own clocks only: Δ`cfs_rq->throttled_clock_self_time` (6.6+, exact
//! at any later observation), else `rq->clock - throttled_clock` read at the exit tracepoints.
//!
//! This file holds the programs, each of which only decodes its tracepoint's arguments:
//! `observe` (a task's group chain), `stop` (the open stops, START and END), `refill` (the timer
//! and CSD callbacks' lists), `config::period_timer_entry` (hands period timers to the shared
//! per-period demand measurement, `crate::demand`),
//! `config` (the refill callbacks' addresses, learnt at run time, and what the agent writes after
//! load).
mod config;
mod observe;
mod refill;
mod stop;

use aya_ebpf::{
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};

use crate::offsets;

#[btf_tracepoint(function = "sched_switch")]
pub fn tp_sched_switch(ctx: BtfTracePointContext) -> i32 {
    // (bool preempt, struct task_struct *prev, struct task_struct *next, unsigned prev_state)
    observe::switched(offsets(), ctx.arg(1), ctx.arg(2));
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn tp_sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    observe::walk(offsets(), ctx.arg(0), observe::Seen::WokenUp);
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn tp_sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    observe::walk(offsets(), ctx.arg(0), observe::Seen::WokenUp);
    0
}

#[btf_tracepoint(function = "hrtimer_expire_entry")]
pub fn tp_hrtimer_entry(ctx: BtfTracePointContext) -> i32 {
    refill::timer_entry(offsets(), ctx.arg(0));
    0
}

/// A second program on the same tracepoint: the demand measurement is verified (and fails to
/// load, on a kernel that refuses it) apart from the stops' programs.
#[btf_tracepoint(function = "hrtimer_expire_entry")]
pub fn tp_hrtimer_period(ctx: BtfTracePointContext) -> i32 {
    config::period_timer_entry(offsets(), ctx.arg(0));
    0
}

#[btf_tracepoint(function = "hrtimer_expire_exit")]
pub fn tp_hrtimer_exit(ctx: BtfTracePointContext) -> i32 {
    refill::timer_exit(ctx.arg(0));
    0
}

/// Raw, not tp_btf: the verifier refuses a tp_btf program's reads of `func` (a FUNC_PROTO
/// pointer), which then had to be loaded from the csd, while a raw tracepoint's arguments are
/// plain numbers. Every cross-CPU call on the machine runs it, nearly all for other functions,
/// and that load was most of their cost: 20-30 ns over an empty program's 50 on the
/// development machine, a few ns without it (README, Performance).
#[raw_tracepoint(tracepoint = "csd_function_entry")]
pub fn tp_csd_entry(ctx: RawTracePointContext) -> i32 {
    // (smp_call_func_t func, call_single_data_t *csd); csd is NULL for a function run locally.
    refill::csd_entry(offsets(), ctx.arg(0), ctx.arg(1));
    0
}

#[btf_tracepoint(function = "csd_function_exit")]
pub fn tp_csd_exit(ctx: BtfTracePointContext) -> i32 {
    refill::csd_exit(ctx.arg(1));
    0
}

#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn tp_cgroup_rmdir(ctx: BtfTracePointContext) -> i32 {
    // (struct cgroup *cgrp, const char *path)
    stop::cgroup_gone(offsets(), ctx.arg(0));
    0
}

#[btf_tracepoint(function = "cgroup_release")]
pub fn tp_cgroup_release(ctx: BtfTracePointContext) -> i32 {
    // A cgroup can be released without an rmdir the tracer saw (e.g. removed before the
    // rmdir program was attached); the sweep is idempotent.
    stop::cgroup_gone(offsets(), ctx.arg(0));
    0
}
