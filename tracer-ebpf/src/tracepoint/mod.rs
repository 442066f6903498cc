//! The tracepoint backend, for kernels without kprobes or fentry: scheduler, hrtimer and CSD
//! tracepoints only. A stop starts where `cfs_rq->throttled` is first seen set and ends where it is
//! seen cleared: at the refill callbacks' exits, else at the next observation, period timer or
//! removal (docs/kernels.md's table, docs/kernel.md sections 2 and 9). `observe` reads a task's
//! group chain, `stop` keeps the open stops, `refill` the timer and CSD callbacks' lists, `config`
//! what the agent writes after load.
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
