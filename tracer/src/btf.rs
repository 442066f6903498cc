//! Resolves the kernel struct offsets the probes need from the running kernel's BTF.
