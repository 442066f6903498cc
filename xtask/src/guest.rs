//! What the VM boots into: a busybox initramfs holding the two binaries (and the tracer's
//! integration tests and a static xtask, if built) and an /init script.
use crate::apt::{self, Archive, PrivateApt};
use crate::arch::Arch;
use crate::binaries::{self, Binaries};
use crate::cmd;
use crate::cpio::Cpio;
use anyhow::{Context as _, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Mounts, helpers and the kernel release marker, shared by every task's /init.
const PRELUDE: &str = include_str!("../guest/prelude.sh");
/// The busybox-static package's binary, installed (`cargo xtask setup vm`) or unpacked from
/// the package downloaded for another architecture.
const BUSYBOX: &str = "bin/busybox";
/// Where the initramfs holds the integration-test binaries, by name (`/tests/ancestor`).
const TESTS: &str = "tests";
/// The guest's last words before it powers off; anything less means it died or hung.
pub const DONE: &str = "@@TT DONE";

/// The full /init: the prelude, the task's part, then power-off.
pub fn init_script(task_part: &str) -> String {
    format!("{PRELUDE}\n{task_part}\nmark DONE\npoweroff -f\n")
}

/// The initramfs of `init`, with `binaries` in /bin (and /tests), `xtask` as /bin/xtask if
/// given, and each `(guest path, host file)` of `extra` (bench/vm_startup.rs's bpftrace).
pub fn initramfs(
    init: &str,
    binaries: &Binaries,
    xtask: Option<&Path>,
    extra: &[(String, PathBuf)],
) -> Result<Vec<u8>> {
    let busybox = busybox(binaries.arch)?;
    binaries::ensure_static(&busybox, binaries.arch)?;
    let read =
        |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let mut cpio = Cpio::new();
    for dir in ["bin", "dev", "proc", "sys", "tmp"] {
        cpio.dir(dir);
    }
    // The kernel opens /dev/console for /init before anything is mounted.
    cpio.char_device("dev/console", 5, 1);
    cpio.file(BUSYBOX, 0o755, &read(&busybox)?);
    cpio.symlink("bin/sh", "busybox");
    cpio.file("bin/throttle-tracer", 0o755, &read(&binaries.tracer)?);
    cpio.file("bin/throttle-workload", 0o755, &read(&binaries.workload)?);
    if let Some(xtask) = xtask {
        cpio.file("bin/xtask", 0o755, &read(xtask)?);
    }
    if !binaries.tests.is_empty() {
        // The tests find the programs as cargo lays them out, one level above their own
        // directory (test-support's `programs_dir`): they are in <bin_dir>/deps, /tests a link.
        let dir = binaries::bin_dir(binaries.arch);
        let dir = dir
            .to_str()
            .context("a target directory path that is not UTF-8")?;
        let dir = dir.trim_start_matches('/');
        cpio.dirs(&format!("{dir}/deps"));
        for (name, file) in &binaries.tests {
            cpio.file(&format!("{dir}/deps/{name}"), 0o755, &read(file)?);
        }
        cpio.symlink(TESTS, &format!("/{dir}/deps"));
        for program in ["throttle-tracer", "throttle-workload"] {
            cpio.symlink(&format!("{dir}/{program}"), &format!("/bin/{program}"));
        }
    }
    for (at, file) in extra {
        if let Some((dir, _)) = at.rsplit_once('/') {
            cpio.dirs(dir);
        }
        cpio.file(at, 0o755, &read(file)?);
    }
    cpio.file("init", 0o755, init.as_bytes());
    Ok(cpio.finish())
}

/// The static busybox of `arch`: the installed one for this machine's; for another
/// architecture, the same package of this system's release for that architecture, downloaded
/// and unpacked (not installed) once into `target/vm/busybox/<architecture>/.`
fn busybox(arch: Arch) -> Result<PathBuf> {
    if arch == Arch::HOST {
        return Ok(Path::new("/").join(BUSYBOX));
    }
    let dir = crate::paths::vm().join("busybox").join(arch.debian());
    let busybox = dir.join("busybox");
    if busybox.exists() {
        return Ok(busybox);
    }
    let suites = apt::system_suites()?;
    let release = suites
        .first()
        .context("the system's apt sources list no suite")?;
    let apt = PrivateApt::new(release, Archive::Main, arch)?;
    apt.update_once()?;
    let download = dir.join("download");
    std::fs::create_dir_all(&download)?;
    let deb = apt.download("busybox-static", &download)?;
    let unpacked = dir.join("unpacked");
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    std::fs::rename(unpacked.join(BUSYBOX), &busybox)
        .with_context(|| format!("busybox-static for {arch:?} has no /{BUSYBOX}"))?;
    std::fs::remove_dir_all(&unpacked)?;
    std::fs::remove_dir_all(&download)?;
    Ok(busybox)
}
