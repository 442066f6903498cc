//! Building the guest's programs: throttle-tracer and throttle-workload, statically linked.
use crate::{cmd, paths};
use anyhow::{Context as _, Result, bail};
use std::path::{Path, PathBuf};

const TARGET: &str = "x86_64-unknown-linux-gnu";

pub struct Binaries {
    pub tracer: PathBuf,
    pub workload: PathBuf,
}

/// `cargo build --release -p tracer` for the gnu target with a static C runtime. The flag is
/// given for the target only, so build scripts and the nested eBPF build do not see it.
pub fn build() -> Result<Binaries> {
    cmd::run(
        paths::cargo()
            .args(["build", "--release", "-p", "tracer", "--target", TARGET])
            .env(
                "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                "-C target-feature=+crt-static",
            ),
    )?;
    let dir = paths::target().join(TARGET).join("release");
    let binaries = Binaries {
        tracer: dir.join("throttle-tracer"),
        workload: dir.join("throttle-workload"),
    };
    for binary in [&binaries.tracer, &binaries.workload] {
        ensure_static(binary)?;
    }
    Ok(binaries)
}

/// The guest has no dynamic loader: refuse an ELF file with a `PT_INTERP` program header.
pub fn ensure_static(path: &Path) -> Result<()> {
    let elf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if has_interpreter(&elf).with_context(|| format!("{} is not a 64-bit ELF", path.display()))? {
        bail!(
            "{} is dynamically linked; the guest needs static binaries",
            path.display()
        );
    }
    Ok(())
}

fn has_interpreter(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if elf.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let phoff = u64::from_le_bytes(elf.get(0x20..0x28)?.try_into().ok()?) as usize;
    let (phentsize, phnum) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    (0..phnum)
        .map(|i| {
            let at = phoff + i * phentsize;
            Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?))
        })
        .try_fold(false, |found, kind| Some(found || kind? == PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_dynamic() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(has_interpreter(&me), Some(true));
        assert_eq!(has_interpreter(b"#!/bin/sh\n"), None);
    }
}
