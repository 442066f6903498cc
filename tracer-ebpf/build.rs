//! Rebuild the eBPF object when the linker changes: a new bpf-linker can emit different BTF.
use which::which;

fn main() {
    let bpf_linker = which("bpf-linker").expect("bpf-linker not found: run `cargo xtask setup`");
    println!("cargo:rerun-if-changed={}", bpf_linker.display());
}
