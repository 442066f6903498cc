//! The fentry backend: fexit on `throttle_cfs_rq`, fentry + fexit on `unthrottle_cfs_rq`, and
//! fentry/fexit pairs on the callers of `unthrottle_cfs_rq` that tell why a stop ended, and
//! fentry on the period timer's callback for the per-period demand; the cgroup removal's raw
//! tracepoint (removal.rs).
//!
//! Cheaper than kprobes (a BPF trampoline, no breakpoint) and the return value comes with the
//! arguments. An fentry program is bound to one kernel function when it is loaded (its BTF id),
//! so the eBPF object has one program per function, named `<function>_fentry` / `_fexit`.
use aya::{
    Btf, Ebpf,
    programs::{FEntry, FExit, ProgramError},
};

use super::{
    Attached, KernelBtf, end_contexts,
    errno::{self, Cause},
    removal,
};
use crate::{
    error::Failure,
    privileges::{self, Capabilities},
};

/// Which side of the call a program runs on.
#[derive(Clone, Copy)]
enum Side {
    Entry,
    Exit,
}

/// The throttle programs, in attach order: unthrottle first, so that no stop begins whose end
/// could go unseen.
const THROTTLE_PROGRAMS: [(&str, Side, &str); 3] = [
    ("unthrottle_cfs_rq_fentry", Side::Entry, "unthrottle_cfs_rq"),
    ("unthrottle_cfs_rq_fexit", Side::Exit, "unthrottle_cfs_rq"),
    ("throttle_cfs_rq_fexit", Side::Exit, "throttle_cfs_rq"),
];

/// Loads and attaches every fentry/fexit program; fails if the throttle functions cannot be
/// traced this way.
pub fn attach(ebpf: &mut Ebpf, btf: &KernelBtf) -> Result<Attached, Failure> {
    let btf = btf.get().map_err(|e| {
        Failure::environment(
            format!("the fentry backend needs the kernel's BTF: {e}"),
            "fentry/fexit need a kernel built with CONFIG_DEBUG_INFO_BTF=y; \
             use --backend kprobe or tracepoint",
        )
    })?;
    // Load the throttle programs before anything is attached: a kernel that refuses fentry
    // refuses it here, and nothing needs undoing.
    for (program, side, function) in THROTTLE_PROGRAMS {
        load(ebpf, program, side, function, btf)?;
    }
    // Context programs (and the cgroup removal's) next: a stop that ends between the two
    // attach steps is then never reported with a reason we could have known.
    let mut blind_end_reasons = end_contexts::attach(ebpf, |ebpf, _, function| {
        for (side, suffix) in [(Side::Entry, "fentry"), (Side::Exit, "fexit")] {
            let program = format!("{function}_{suffix}");
            load(ebpf, &program, side, function, btf).map_err(|f| f.to_string())?;
            attach_program(ebpf, &program, side, function)
                .map_err(|e| format!("attach {program}: {e}"))?;
        }
        Ok(())
    });
    if !removal::attach(ebpf) {
        blind_end_reasons.push("cgroup_gone");
    }
    for (program, side, function) in THROTTLE_PROGRAMS {
        attach_program(ebpf, program, side, function).map_err(|e| {
            Failure::environment(
                format!("cannot attach {program} to {function}: {e}"),
                "this kernel loads fentry programs but does not attach them; \
                 use --backend kprobe or tracepoint",
            )
        })?;
    }
    let demand = "sched_cfs_period_timer_fentry";
    if let Err(e) = load(ebpf, demand, Side::Entry, "sched_cfs_period_timer", btf)
        .map_err(|f| f.to_string())
        .and_then(|()| {
            attach_program(ebpf, demand, Side::Entry, "sched_cfs_period_timer")
                .map_err(|e| e.to_string())
        })
    {
        super::warn_no_demand("sched_cfs_period_timer", &e);
    }
    Ok(Attached { blind_end_reasons })
}

fn load(
    ebpf: &mut Ebpf,
    program: &str,
    side: Side,
    function: &str,
    btf: &Btf,
) -> Result<(), Failure> {
    let missing = || super::internal(&format!("program {program} missing from the eBPF object"));
    let prog = ebpf.program_mut(program).ok_or_else(missing)?;
    let loaded = match side {
        Side::Entry => {
            let p: &mut FEntry = prog.try_into().map_err(|_| missing())?;
            p.load(function, btf)
        }
        Side::Exit => {
            let p: &mut FExit = prog.try_into().map_err(|_| missing())?;
            p.load(function, btf)
        }
    };
    loaded.map_err(|e| load_failure(&e, function))
}

fn attach_program(
    ebpf: &mut Ebpf,
    program: &str,
    side: Side,
    function: &str,
) -> Result<(), ProgramError> {
    let Some(prog) = ebpf.program_mut(program) else {
        return Err(ProgramError::NotLoaded);
    };
    let (kind, info) = match side {
        Side::Entry => {
            let p = <&mut FEntry>::try_from(prog)?;
            p.attach()?;
            ("fentry", p.info())
        }
        Side::Exit => {
            let p = <&mut FExit>::try_from(prog)?;
            p.attach()?;
            ("fexit", p.info())
        }
    };
    super::log_attached(kind, program, info, function);
    Ok(())
}

/// One line for why an fentry/fexit program on `function` did not load, and the way out.
fn load_failure(e: &ProgramError, function: &str) -> Failure {
    let fallback = "use --backend auto (falls back to kprobe, then tracepoint), \
                    or see `throttle-tracer doctor`";
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let errno = io_error.raw_os_error();
            let before_verifier = format!("{verifier_log:?}").trim().is_empty();
            let answer = errno.map_or_else(|| io_error.to_string(), errno::describe);
            let mut message = format!(
                "the kernel refused to load an fentry/fexit program on {function}: \
                 BPF_PROG_LOAD failed with {answer}"
            );
            if before_verifier {
                message.push_str(", before the verifier ran");
            }
            let hint = match Cause::of(errno, Capabilities::of_self()) {
                Cause::Unprivileged => return privileges::missing(Some(&message)),
                Cause::Forbidden => format!(
                    "this kernel does not allow fentry/fexit programs, even for root; {fallback}"
                ),
                Cause::Other => format!("{fallback}; RUST_LOG=debug shows the verifier output"),
            };
            log::debug!("verifier output for {function}: {verifier_log:?}");
            Failure::environment(message, hint)
        }
        ProgramError::Btf(e) => Failure::environment(
            format!(
                "cannot trace {function} with fentry: {e} (inlined or renamed on this kernel?)"
            ),
            fallback,
        ),
        other => Failure::environment(
            format!("cannot load an fentry/fexit program on {function}: {other}"),
            fallback,
        ),
    }
}
