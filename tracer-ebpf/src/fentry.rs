//! The fentry backend: fexit on `throttle_cfs_rq` sees the argument and the return value
//! together; fentry on `unthrottle_cfs_rq` keeps `throttled_clock` before the call resets it, fexit
//! checks that it really unthrottled; fentry/fexit pairs on its callers tell why stops end, one
//! pair per function since an fentry program is bound to its function at load; fentry on
//! `sched_cfs_period_timer` ends each period (`crate::demand`). fexit reads the return value from
//! its context directly, not with `bpf_get_func_ret`, which needs 5.17.
use aya_ebpf::{
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};
use aya_log_ebpf::debug;
use tracer_common::{END_CPU_OFFLINE, END_QUOTA_CHANGE, END_REFILL};

use crate::{calls, demand, end_reason::end_context, offsets};

#[fexit]
pub fn throttle_cfs_rq_fexit(ctx: FExitContext) -> u32 {
    let cfs_rq: u64 = ctx.arg(0);
    match calls::throttle_returned(offsets(), cfs_rq, || ctx.arg::<u64>(1)) {
        Ok(()) => 0,
        Err(what) => {
            debug!(&ctx, "throttle_cfs_rq return skipped: {}", what);
            1
        }
    }
}

#[fentry]
pub fn unthrottle_cfs_rq_fentry(ctx: FEntryContext) -> u32 {
    calls::unthrottle_entered(offsets(), ctx.arg(0));
    0
}

#[fexit]
pub fn unthrottle_cfs_rq_fexit(ctx: FExitContext) -> u32 {
    match calls::unthrottle_returned(offsets(), Some(ctx.arg(0))) {
        Ok(()) => 0,
        Err(what) => {
            debug!(&ctx, "unthrottle_cfs_rq return skipped: {}", what);
            1
        }
    }
}

/// The period timer expires, before its refill.
#[fentry]
pub fn sched_cfs_period_timer_fentry(ctx: FEntryContext) -> u32 {
    demand::timer_expires(offsets(), ctx.arg(0));
    0
}

end_context!(
    fentry(FEntryContext) distribute_cfs_runtime_fentry,
    fexit(FExitContext) distribute_cfs_runtime_fexit,
    END_REFILL
);
end_context!(
    fentry(FEntryContext) __cfsb_csd_unthrottle_fentry,
    fexit(FExitContext) __cfsb_csd_unthrottle_fexit,
    END_REFILL
);
end_context!(
    fentry(FEntryContext) tg_set_cfs_bandwidth_fentry,
    fexit(FExitContext) tg_set_cfs_bandwidth_fexit,
    END_QUOTA_CHANGE
);
end_context!(
    fentry(FEntryContext) tg_set_bandwidth_fentry,
    fexit(FExitContext) tg_set_bandwidth_fexit,
    END_QUOTA_CHANGE
);
end_context!(
    fentry(FEntryContext) rq_offline_fair_fentry,
    fexit(FExitContext) rq_offline_fair_fexit,
    END_CPU_OFFLINE
);
