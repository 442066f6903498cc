//! The tracepoint backend: scheduler tracepoints only (tp_btf).
use aya::Ebpf;

use super::Attached;
use crate::error::Failure;

pub fn attach(_ebpf: &mut Ebpf) -> Result<Attached, Failure> {
    Err(Failure::environment(
        "the tracepoint backend is not built yet",
        "use --backend kprobe",
    ))
}
