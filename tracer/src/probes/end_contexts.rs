//! The callers of `unthrottle_cfs_rq` whose entry and return tell why a stop ended, shared by
//! the function-probe backends (kprobe, fentry): the table, and attaching it with whatever
//! attaches one entry/return pair to one function.
use aya::Ebpf;
use log::debug;

/// One kind of end and every kernel function that marks it.
pub struct EndContext {
    pub reason: &'static str,
    /// The kprobe backend's entry and return programs; one pair serves every function.
    pub kprobe_programs: (&'static str, &'static str),
    /// Every name the kernel has used for it; each that the running kernel has is probed.
    pub functions: &'static [&'static str],
}

pub const END_CONTEXTS: &[EndContext] = &[
    EndContext {
        reason: "refill",
        kprobe_programs: ("refill_enter", "refill_leave"),
        // Period and slack timers refill in distribute; since 6.2 remote CPUs unthrottle in
        // the CSD callback. Both are probed.
        functions: &["distribute_cfs_runtime", "__cfsb_csd_unthrottle"],
    },
    EndContext {
        reason: "quota_change",
        kprobe_programs: ("quota_change_enter", "quota_change_leave"),
        // tg_set_cfs_bandwidth is inlined into tg_set_bandwidth on 6.18.
        functions: &["tg_set_cfs_bandwidth", "tg_set_bandwidth"],
    },
    EndContext {
        reason: "cpu_offline",
        kprobe_programs: ("cpu_offline_enter", "cpu_offline_leave"),
        functions: &["rq_offline_fair"],
    },
];

/// Attaches every end context with `attach_pair(ebpf, context, function)`; returns the reasons
/// none of whose functions could be probed (their ends will read "unknown").
pub fn attach(
    ebpf: &mut Ebpf,
    mut attach_pair: impl FnMut(&mut Ebpf, &EndContext, &str) -> Result<(), String>,
) -> Vec<&'static str> {
    let mut blind = Vec::new();
    for ctx in END_CONTEXTS {
        let mut attached = false;
        for function in ctx.functions {
            match attach_pair(ebpf, ctx, function) {
                Ok(()) => attached = true,
                Err(e) => debug!("{} not probed at {function}: {e}", ctx.reason),
            }
        }
        if !attached {
            blind.push(ctx.reason);
        }
    }
    blind
}

/// The functions that mark `reason`, for messages.
pub fn functions_of(reason: &str) -> String {
    END_CONTEXTS
        .iter()
        .find(|c| c.reason == reason)
        .map(|c| c.functions.join(", "))
        .unwrap_or_default()
}
