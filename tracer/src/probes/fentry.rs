//! The fentry backend: fentry/fexit on throttle_cfs_rq / unthrottle_cfs_rq.
use aya::Ebpf;

use super::Attached;
use crate::error::Failure;

pub fn attach(_ebpf: &mut Ebpf) -> Result<Attached, Failure> {
    Err(Failure::environment(
        "the fentry backend is not built yet",
        "use --backend kprobe",
    ))
}
