//! Ending a removed cgroup's open stops in the function-probe backends (kprobe, fentry): the
//! kernel may never unthrottle a removed group's throttled cfs_rqs (docs/kernel.md §2.3), so a
//! raw tracepoint program on `cgroup_rmdir` and `cgroup_release` ends them as `cgroup_gone`
//! (tracer-ebpf/src/removal.rs). Raw, not tp_btf: the kprobe backend loads without the kernel's
//! BTF.
use aya::{Ebpf, programs::RawTracePoint};
use log::debug;

/// Why `cgroup_gone` ends cannot be told apart when [`attach`] attached nothing.
pub const WHY_BLIND: &str = "neither cgroup_rmdir nor cgroup_release could be attached";

/// Attaches the removal program to both tracepoints; returns whether either attached.
pub fn attach(ebpf: &mut Ebpf) -> bool {
    let program = "fn_cgroup_rmdir";
    let Some(Ok(p)) = ebpf
        .program_mut(program)
        .map(<&mut RawTracePoint>::try_from)
    else {
        debug!("cgroup_gone: program {program} missing from the eBPF object");
        return false;
    };
    if let Err(e) = p.load() {
        debug!("cgroup_gone: cannot load {program}: {e}");
        return false;
    }
    let mut attached = false;
    for tracepoint in ["cgroup_rmdir", "cgroup_release"] {
        match p.attach(tracepoint) {
            Ok(_) => {
                attached = true;
                debug!("cgroup_gone: {program} attached to the raw tracepoint {tracepoint}");
            }
            Err(e) => debug!("cgroup_gone: cannot attach {program} to {tracepoint}: {e}"),
        }
    }
    attached
}
