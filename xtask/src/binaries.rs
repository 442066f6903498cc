//! Building the guest's programs, statically linked: throttle-tracer and throttle-workload, and
//! (for vm-test) the tracer's integration-test binaries and this xtask.
use crate::arch::Arch;
use crate::{cmd, guest_tests, paths};
use anyhow::{Context as _, Result, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub struct Binaries {
    /// What they were built for.
    pub arch: Arch,
    pub tracer: PathBuf,
    pub workload: PathBuf,
    /// The integration-test binaries of tracer/tests, by name (`ancestor` for ancestor.rs); empty
    /// unless asked for.
    pub tests: Vec<(String, PathBuf)>,
}

/// `cargo build --release` of the two programs for `arch`'s gnu target with a static C runtime.
pub fn build(arch: Arch) -> Result<Binaries> {
    cmd::run(static_cargo(arch).args([
        "build",
        "--release",
        "-p",
        "tracer",
        "-p",
        "throttle-workload",
        "--target",
        arch.target(),
    ]))?;
    built(arch, Vec::new())
}

/// The programs the last build left in [`bin_dir`], checked static, with `tests`.
fn built(arch: Arch, tests: Vec<(String, PathBuf)>) -> Result<Binaries> {
    let dir = bin_dir(arch);
    let binaries = Binaries {
        arch,
        tracer: dir.join("throttle-tracer"),
        workload: dir.join("throttle-workload"),
        tests,
    };
    for binary in [&binaries.tracer, &binaries.workload] {
        ensure_static(binary, arch)?;
    }
    Ok(binaries)
}

/// This xtask, built as the guests' binaries are, for what vm-test measures inside the guest
/// (`xtask guest-program-cost`). A build of its own: built together with the tracer, cargo
/// would unify the two packages' dependency features and change the tracer.
pub fn xtask(arch: Arch) -> Result<PathBuf> {
    cmd::run(static_cargo(arch).args([
        "build",
        "--release",
        "-p",
        "xtask",
        "--target",
        arch.target(),
    ]))?;
    let xtask = bin_dir(arch).join("xtask");
    ensure_static(&xtask, arch)?;
    Ok(xtask)
}

/// `cargo test --no-run` of [`tests`] for `arch`: the programs and every test binary. The
/// integration tests find the programs they run in [`bin_dir`]: the tracer at the path cargo
/// compiled into them (`CARGO_BIN_EXE_*`), the workload beside it (its crate's own tests make
/// cargo build it). Another architecture's are cross-built, for its guests: only the binaries
/// they run where they run the kernel facts only.
pub fn build_with_tests(arch: Arch) -> Result<Binaries> {
    // Cargo's progress and errors stay on the terminal; stdout is its JSON.
    compile_tests(arch, Stdio::inherit())
}

/// [`build_with_tests`] with cargo's progress held back (beside other output): its errors come
/// in the error.
pub fn build_quietly(arch: Arch) -> Result<Binaries> {
    compile_tests(arch, Stdio::piped())
}

fn compile_tests(arch: Arch, stderr: Stdio) -> Result<Binaries> {
    let mut cargo = tests(arch);
    cargo.args(["--no-run", "--message-format=json"]);
    // Cross-built for guests that run the kernel facts only: their binaries alone, not the
    // other test binaries and the unit tests (half the compile).
    for binary in guest_tests::guest_binaries(arch).unwrap_or_default() {
        cargo.args(["--test", binary]);
    }
    let json = cmd::stdout(cargo.stderr(stderr))?;
    let mut tests = Vec::new();
    for line in json.lines() {
        let message: Value =
            serde_json::from_str(line).with_context(|| format!("cargo's JSON message {line:?}"))?;
        if message["reason"] == "compiler-artifact"
            && message["target"]["kind"] == serde_json::json!(["test"])
            && let (Some(name), Some(file)) = (
                message["target"]["name"].as_str(),
                message["executable"].as_str(),
            )
        {
            ensure_static(file.as_ref(), arch)?;
            tests.push((name.to_owned(), PathBuf::from(file)));
        }
    }
    tests.sort();
    // The programs of the tests' compile: cargo links them with the dev-dependencies' features
    // unified in (proptest's rand with std, syn with `visit`: nothing the tracer calls), which
    // makes every crate above syn a second compile. One compile serves the image, the host
    // tests and the guests in `cargo xtask test` (3.5 minutes of CI's 20 on 2 cores).
    built(arch, tests)
}

/// `cargo test` of the tracer's crates, built as the guests' binaries are (static, release):
/// the host tests and the VM guests share one compile. [`build_with_tests`] selects exactly
/// these packages and targets: the tracer's build script (the eBPF build, a minute) has one
/// output directory, which another selection's features would make it run again into.
pub fn tests(arch: Arch) -> Command {
    let mut cargo = static_cargo(arch);
    cargo
        .args(["test", "--release", "--target", arch.target()])
        .args([
            "-p",
            "tracer",
            "-p",
            "tracer-common",
            "-p",
            "throttle-workload",
        ]);
    cargo
}

/// Where cargo puts the static programs, and where the tests it builds look for them.
pub fn bin_dir(arch: Arch) -> PathBuf {
    paths::target().join(arch.target()).join("release")
}

/// Cargo with a static C runtime for `arch`'s gnu target. The flag is given for the target
/// only, so build scripts and the nested eBPF build do not see it: in the environment for
/// x86-64, where .cargo/config.toml's target table would also reach this machine's own builds;
/// arm64's is in that table, with its cross linker, so that a plain `cargo build --target` is
/// static too (the same flags either way: cargo rebuilds on a change of flags).
fn static_cargo(arch: Arch) -> Command {
    let mut cargo = paths::cargo();
    if arch == Arch::X86_64 {
        cargo.env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static",
        );
    }
    cargo
}

/// The guest has no dynamic loader and runs one architecture: refuse an ELF file with a
/// `PT_INTERP` program header, or built for another machine.
pub fn ensure_static(path: &Path, arch: Arch) -> Result<()> {
    let elf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let not_elf = || format!("{} is not a 64-bit ELF", path.display());
    if machine(&elf).with_context(not_elf)? != arch.elf_machine() {
        bail!("{} is not built for {arch:?}", path.display());
    }
    if has_interpreter(&elf).with_context(not_elf)? {
        bail!(
            "{} is dynamically linked; the guest needs static binaries",
            path.display()
        );
    }
    Ok(())
}

/// The ELF header's `e_machine`.
fn machine(elf: &[u8]) -> Option<u16> {
    if elf.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    Some(u16::from_le_bytes(elf.get(0x12..0x14)?.try_into().ok()?))
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
        // xtask is always built for the host, never with the guests' static flags.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(has_interpreter(&me), Some(true));
        assert_eq!(has_interpreter(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn machine_is_read_from_the_header() {
        let mut header = b"\x7fELF\x02\x01\x01".to_vec();
        header.resize(0x12, 0);
        header.extend_from_slice(&183u16.to_le_bytes());
        assert_eq!(machine(&header), Some(Arch::Arm64.elf_machine()));
        assert_eq!(machine(&header[..0x13]), None);
    }
}
