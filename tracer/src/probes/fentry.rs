//! The fentry backend: fexit on `throttle_cfs_rq`, fentry + fexit on `unthrottle_cfs_rq`,
//! fentry/fexit pairs on its callers that tell why a stop ended, fentry on the period timer's
//! callback for the per-period demand, and the cgroup removal's raw tracepoint (removal.rs).
//! Cheaper than kprobes (a BPF trampoline, no breakpoint), with the return value beside the
//! arguments; an fentry program is bound to one kernel function at load, so the object has one
//! program per function.
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};

use aya::{
    Btf, Ebpf,
    programs::{FEntry, FExit, ProgramError},
};
use aya_obj::{
    VerifierLog,
    btf::BtfKind,
    generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_type},
};

use super::{
    Attached, KernelBtf, Spent, end_contexts,
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
    let btf = kernel_btf(btf)?;
    let mut spent = Spent::default();
    // Load the throttle programs before anything is attached: a kernel that refuses fentry
    // refuses it here, and nothing needs undoing.
    for (program, side, function) in THROTTLE_PROGRAMS {
        spent.load(|| load(ebpf, program, side, function, btf))?;
    }
    // Context programs (and the cgroup removal's) next: a stop that ends between the two
    // attach steps is then never reported with a reason we could have known.
    let mut blind_end_reasons = end_contexts::attach(ebpf, |ebpf, _, function| {
        for (side, suffix) in [(Side::Entry, "fentry"), (Side::Exit, "fexit")] {
            let program = format!("{function}_{suffix}");
            spent
                .load(|| load(ebpf, &program, side, function, btf))
                .map_err(|f| f.to_string())?;
            spent
                .attach(|| attach_program(ebpf, &program, side, function))
                .map_err(|e| format!("attach {program}: {e}"))?;
        }
        Ok(())
    });
    if !removal::attach(ebpf) {
        blind_end_reasons.push("cgroup_gone");
    }
    for (program, side, function) in THROTTLE_PROGRAMS {
        spent
            .attach(|| attach_program(ebpf, program, side, function))
            .map_err(|e| {
                // The errno is the kernel's own reason; aya's message does not carry it.
                let errno = errno::of(&e).map(|n| format!(": {}", errno::describe(n)));
                Failure::environment(
                    format!(
                        "cannot attach {program} to {function}: {e}{}",
                        errno.unwrap_or_default()
                    ),
                    "this kernel loads fentry programs but does not attach them; \
                 use --backend kprobe or tracepoint",
                )
            })?;
    }
    let demand = "sched_cfs_period_timer_fentry";
    if let Err(e) = spent
        .load(|| load(ebpf, demand, Side::Entry, "sched_cfs_period_timer", btf))
        .map_err(|f| f.to_string())
        .and_then(|()| {
            spent
                .attach(|| attach_program(ebpf, demand, Side::Entry, "sched_cfs_period_timer"))
                .map_err(|e| e.to_string())
        })
    {
        super::warn_no_demand("sched_cfs_period_timer", &e);
    }
    spent.log("fentry");
    Ok(Attached { blind_end_reasons })
}

fn kernel_btf(btf: &KernelBtf) -> Result<&Btf, Failure> {
    btf.get().map_err(|e| {
        Failure::environment(
            format!("the fentry backend needs the kernel's BTF: {e}"),
            "fentry/fexit need a kernel built with CONFIG_DEBUG_INFO_BTF=y; \
             use --backend kprobe or tracepoint",
        )
    })
}

/// Whether this kernel loads fentry programs, asked with the smallest one (`r0 = 0; exit` on
/// the first throttle program's function) before the object is loaded: a kernel that refuses
/// them all (EPERM before the verifier, as some hosts' do) then costs `--backend auto` no
/// creation of the object's maps, most of an attempt's time. Fails as [`attach`] would.
pub fn loadable(btf: &KernelBtf) -> Result<(), Failure> {
    let btf = kernel_btf(btf)?;
    let (_, side, function) = THROTTLE_PROGRAMS[0];
    let attach_btf_id = btf
        .id_by_type_name_kind(function, BtfKind::Func)
        .map_err(|e| load_failure(&ProgramError::Btf(e), function))?;
    // mov64 r0, 0; exit (little-endian `struct bpf_insn`s: the opcode in the low byte).
    let insns: [u64; 2] = [0xb7, 0x95];
    let mut log = vec![0u8; 4096];
    // SAFETY: plain integers and arrays; all zero is every field's "unset".
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the BPF_PROG_LOAD member of a zeroed union.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = bpf_prog_type::BPF_PROG_TYPE_TRACING as u32;
    load.expected_attach_type = match side {
        Side::Entry => bpf_attach_type::BPF_TRACE_FENTRY,
        Side::Exit => bpf_attach_type::BPF_TRACE_FEXIT,
    } as u32;
    load.attach_btf_id = attach_btf_id;
    load.insn_cnt = 2;
    load.insns = insns.as_ptr() as u64;
    // fentry/fexit programs must be GPL-compatible.
    load.license = c"GPL".as_ptr() as u64;
    load.log_level = 1;
    load.log_size = u32::try_from(log.len()).unwrap_or(0);
    load.log_buf = log.as_mut_ptr() as u64;
    // SAFETY: `attr` is a whole bpf_attr whose pointers outlive the call, and its size is passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_PROG_LOAD as libc::c_long,
            std::ptr::from_mut(&mut attr),
            size_of::<bpf_attr>(),
        )
    };
    if fd < 0 {
        let io_error = std::io::Error::last_os_error();
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let verifier_log = VerifierLog::new(String::from_utf8_lossy(&log[..end]).into_owned());
        return Err(load_failure(
            &ProgramError::LoadError {
                io_error,
                verifier_log,
            },
            function,
        ));
    }
    if let Ok(fd) = RawFd::try_from(fd) {
        // SAFETY: the program's fd, just returned and owned by nothing else; closing it
        // unloads the program.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    Ok(())
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
