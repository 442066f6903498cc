//! What the VM boots into: a busybox initramfs holding the two binaries (and the tracer's
//! integration tests and a static xtask, if built) and an /init script.
use crate::binaries::{self, Binaries};
use crate::cpio::Cpio;
use anyhow::{Context as _, Result};
use std::path::{Path, PathBuf};

/// Mounts, helpers and the kernel release marker, shared by every task's /init.
const PRELUDE: &str = include_str!("../guest/prelude.sh");
/// The busybox-static package's binary.
const BUSYBOX: &str = "/bin/busybox";
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
    binaries::ensure_static(BUSYBOX.as_ref())?;
    let read =
        |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let mut cpio = Cpio::new();
    for dir in ["bin", "dev", "proc", "sys", "tmp"] {
        cpio.dir(dir);
    }
    // The kernel opens /dev/console for /init before anything is mounted.
    cpio.char_device("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, &read(BUSYBOX.as_ref())?);
    cpio.symlink("bin/sh", "busybox");
    cpio.file("bin/throttle-tracer", 0o755, &read(&binaries.tracer)?);
    cpio.file("bin/throttle-workload", 0o755, &read(&binaries.workload)?);
    if let Some(xtask) = xtask {
        cpio.file("bin/xtask", 0o755, &read(xtask)?);
    }
    if !binaries.tests.is_empty() {
        // The tests find the programs as cargo lays them out, one level above their own
        // directory (test-support's `programs_dir`): they are in <bin_dir>/deps, /tests a link.
        let dir = binaries::bin_dir();
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
