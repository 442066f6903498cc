//! `cargo xtask setup`: host packages, rust-src and bpf-linker, each only when missing.
use crate::cmd;
use anyhow::{Context as _, Result, bail};
use std::path::PathBuf;
use std::process::Command;

/// Debian packages the tests run: QEMU and a static busybox for the VM tasks' initramfs, and
/// Prometheus (with promtool) for tracer/tests/prometheus.rs.
const HOST_PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static", "prometheus"];
/// The toolchain tracer/build.rs builds the eBPF object with (aya-build's `Toolchain`).
const TOOLCHAIN: &str = "stable";
const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn run() -> Result<()> {
    install_missing(HOST_PACKAGES)?;
    rust_src()?;
    bpf_linker()
}

/// `apt-get install`s those of the Debian `packages` that are not installed yet.
pub fn install_missing(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    cmd::run(Command::new("apt-get").arg("update"))?;
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn dpkg_installed(package: &str) -> bool {
    cmd::stdout(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_ok_and(|status| status == "install ok installed")
}

/// `-Z build-std=core` for the BPF target needs the standard library's source.
fn rust_src() -> Result<()> {
    let installed = cmd::stdout(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        TOOLCHAIN,
    ]))?;
    if installed.lines().any(|c| c.starts_with("rust-src")) {
        return Ok(());
    }
    cmd::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        TOOLCHAIN,
    ]))
}

/// bpf-linker must load a libLLVM of rustc's own LLVM major. Every rustup toolchain ships one,
/// so bpf-linker is built against a copy of it (the binary keeps that file name in its
/// RUNPATH, hence a copy in a cache directory that outlives `cargo clean`).
fn bpf_linker() -> Result<()> {
    if bpf_linker_runs() {
        return Ok(());
    }
    let sysroot = rustc(&["--print", "sysroot"])?;
    let lib_dir = PathBuf::from(sysroot.trim()).join("lib");
    let libllvm = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.file_name()))
        .find(|name| name.to_string_lossy().starts_with("libLLVM.so."))
        .with_context(|| format!("no libLLVM.so.* in {}", lib_dir.display()))?;
    let libllvm = libllvm.to_string_lossy().into_owned();

    let prefix = cache_dir()?.join(&libllvm);
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)?;
    std::fs::copy(lib_dir.join(&libllvm), prefix_lib.join(&libllvm))
        .with_context(|| format!("copying {libllvm} into {}", prefix_lib.display()))?;
    let link = prefix_lib.join("libLLVM.so");
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(&link)?;
    }
    std::os::unix::fs::symlink(&libllvm, &link)?;

    let major = llvm_major(&rustc(&["-vV"])?)?;
    cmd::run(
        Command::new("cargo")
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--locked", "--force", "--no-default-features", "--features"])
            .arg(format!("llvm-{major}"))
            .env("LLVM_PREFIX", &prefix),
    )?;
    if !bpf_linker_runs() {
        bail!("bpf-linker was installed but does not run from PATH (is ~/.cargo/bin on PATH?)");
    }
    Ok(())
}

fn bpf_linker_runs() -> bool {
    cmd::succeeds(Command::new("bpf-linker").arg("--version"))
}

fn rustc(args: &[&str]) -> Result<String> {
    cmd::stdout(
        Command::new("rustup")
            .args(["run", TOOLCHAIN, "rustc"])
            .args(args),
    )
}

/// The major of `LLVM version: 22.1.2` in `rustc -vV`.
fn llvm_major(rustc_vv: &str) -> Result<u32> {
    let version = rustc_vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("`rustc -vV` names no LLVM version")?;
    let major = version.split('.').next().unwrap_or_default();
    major
        .parse()
        .with_context(|| format!("LLVM version `{version}`"))
}

fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    Ok(base.join("throttle-tracer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_from_rustc_vv() {
        let vv = "rustc 1.95.0 (59807616e 2026-04-14)\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.2\n";
        assert_eq!(llvm_major(vv).unwrap(), 22);
        assert!(llvm_major("rustc 1.95.0\n").is_err());
    }
}
