//! Rebuild the eBPF object when the linker changes: a new bpf-linker can emit different BTF.
//! And keep the tracepoint backend's global functions global: bpf-linker makes every symbol
//! it is not told to export local, and the kernel verifies a local function at every call.
use which::which;

fn main() {
    let bpf_linker = which("bpf-linker").expect("bpf-linker not found: run `cargo xtask setup`");
    println!("cargo:rerun-if-changed={}", bpf_linker.display());
    println!("cargo:rustc-link-arg-bins=--export=tp_start,tp_end");
}
