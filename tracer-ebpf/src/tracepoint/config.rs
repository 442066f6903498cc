//! The agent's settings for the tracepoint programs: what it learns only at run time (kallsyms
//! addresses, the moment tracing was armed) and writes into `TP_CONFIG` after load. The slot numbers are mirrored in tracer/src/probes/tracepoint.rs.
use aya_ebpf::{macros::map, maps::Array};

/// `TP_CONFIG` slots, written by the agent after load.
pub const CFG_PERIOD_TIMER_FN: u32 = 0;
pub const CFG_SLACK_TIMER_FN: u32 = 1;
pub const CFG_CSD_UNTHROTTLE_FN: u32 = 2;
/// CLOCK_MONOTONIC ns when every program was attached; 0 before.
pub const CFG_ARMED_NS: u32 = 3;

/// kallsyms addresses of `sched_cfs_period_timer`, `sched_cfs_slack_timer`,
/// `__cfsb_csd_unthrottle` and the armed time (see `CFG_*`).
#[map]
static TP_CONFIG: Array<u64> = Array::with_max_entries(4, 0);

/// The value in `slot` (one of `CFG_*`); 0 when unset.
#[inline(always)]
pub fn cfg(slot: u32) -> u64 {
    TP_CONFIG.get(slot).copied().unwrap_or(0)
}
