//! The Debian kernels the VM tests boot, and fetching one: newest package first, older ones
//! when a download fails; cached under target/vm/kernels/<series>/.
use crate::apt::{Archive, PrivateApt};
use crate::cmd;
use crate::scenarios::BACKENDS;
use anyhow::{Context as _, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One kernel series and where Debian keeps its cloud flavour.
pub struct Kernel {
    /// What `--kernel` takes.
    pub series: &'static str,
    suite: &'static str,
    archive: Archive,
    /// Package names, as an extended regular expression for `apt-cache search`.
    package: &'static str,
    /// Whether vm-test runs the host tests on it too (guest_tests.rs): they add two to three
    /// minutes per boot under TCG, and their v2 paths are the tracer's and the tests' own, the
    /// same on every kernel, so on the newest only (the few that differ from kernel to kernel,
    /// guest_tests.rs `EVERY_KERNEL`, run on each).
    pub host_tests: bool,
    /// The backends its scenarios run with. kprobe and fentry attach to the same kernel
    /// functions, which change from version to version: kprobe on every kernel, fentry on the
    /// oldest and the newest (5.10, 7.x), except kprobe's scenarios where the guest runs the
    /// host tests, which trace with kprobe and check what the scenarios do (one thread's
    /// stops, Σ kernel time = cpu.stat, burst spent, ancestors) and more. The tracepoint
    /// backend's hooks are stable tracepoints; it runs on the oldest (before 6.2's CSD
    /// unthrottle and 6.18's task-based throttle) and on the host's 6.18. That keeps `cargo
    /// xtask test` inside CI's 20 minutes (each backend is about 30 s a boot under TCG).
    /// `--backend` overrides it.
    pub backends: &'static [&'static str],
    /// The backends (other than the host tests' kprobe) with which its guest runs the fault
    /// tests (guest_tests.rs `FAULTS`): one kernel per backend, each run being a tracer start
    /// more. fentry beside the host tests on the newest; the tracepoint backend on 6.12, whose
    /// guest runs no tracepoint scenarios and which has what the host's 6.18 has but its
    /// task-based throttle (the CSD unthrottle, the self-time clock).
    pub fault_backends: &'static [&'static str],
}

/// 6.1's and 6.12's: between 5.10 and 7.x, which run fentry too, on the functions kprobe
/// attaches to.
const KPROBE: &[&str] = &["kprobe"];
/// The newest kernel's: its host tests trace with kprobe, and the tracepoint backend's
/// task-based throttle (6.18+) is the host's.
const BESIDE_HOST_TESTS: &[&str] = &["fentry"];

pub const KERNELS: &[Kernel] = &[
    Kernel {
        series: "5.10",
        suite: "bullseye-security",
        archive: Archive::Security,
        package: r"^linux-image-5\.10\.0-[0-9]+-cloud-amd64-unsigned$",
        host_tests: false,
        backends: BACKENDS,
        fault_backends: &[],
    },
    Kernel {
        series: "6.1",
        suite: "bookworm",
        archive: Archive::Main,
        package: r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$",
        host_tests: false,
        backends: KPROBE,
        fault_backends: &[],
    },
    Kernel {
        series: "6.12",
        suite: "bookworm-security",
        archive: Archive::Security,
        package: r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$",
        host_tests: false,
        backends: KPROBE,
        fault_backends: &["tracepoint"],
    },
    // sid's linux-image-7.* is a small meta package; the image is in linux-binary-*.
    Kernel {
        series: "7",
        suite: "sid",
        archive: Archive::Main,
        package: r"^linux-binary-7\.[0-9]+\.[0-9]+\+deb[0-9]+-cloud-amd64$",
        host_tests: true,
        backends: BESIDE_HOST_TESTS,
        fault_backends: &["fentry"],
    },
];

pub fn by_series(series: &str) -> Result<&'static Kernel> {
    KERNELS
        .iter()
        .find(|k| k.series == series)
        .with_context(|| {
            let known: Vec<_> = KERNELS.iter().map(|k| k.series).collect();
            format!("unknown kernel `{series}`; known: {}", known.join(", "))
        })
}

/// A kernel ready to boot.
pub struct Fetched {
    pub package: String,
    /// The Debian package version, e.g. `6.1.170-3`.
    pub version: String,
    pub vmlinuz: PathBuf,
}

impl Kernel {
    /// Returns the cached kernel, or downloads the newest one that downloads.
    pub fn fetch(&self) -> Result<Fetched> {
        let dir = crate::paths::vm().join("kernels").join(self.series);
        let vmlinuz = dir.join("vmlinuz");
        let about = dir.join("package");
        if let Ok(text) = std::fs::read_to_string(&about)
            && let Some((package, version)) = text.trim().split_once(' ')
            && vmlinuz.exists()
        {
            return Ok(Fetched {
                package: package.to_owned(),
                version: version.to_owned(),
                vmlinuz,
            });
        }

        let apt = PrivateApt::new(self.suite, self.archive)?;
        apt.update_once()?;
        let mut candidates = apt.search(self.package)?;
        if candidates.is_empty() {
            // Lists from an earlier run may be stale; try once with fresh ones.
            apt.update()?;
            candidates = apt.search(self.package)?;
        }
        candidates.sort_by_key(|name| std::cmp::Reverse(numbers(name)));

        let download_dir = dir.join("download");
        std::fs::create_dir_all(&download_dir)?;
        for package in &candidates {
            let deb = match apt.download(package, &download_dir) {
                Ok(deb) => deb,
                Err(e) => {
                    eprintln!("warning: {package}: {e:#}; trying an older one");
                    continue;
                }
            };
            let version = deb_version(&deb)?;
            let unpacked = dir.join("unpacked");
            if unpacked.exists() {
                std::fs::remove_dir_all(&unpacked)?;
            }
            cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
            std::fs::copy(find_vmlinuz(&unpacked)?, &vmlinuz)?;
            std::fs::remove_dir_all(&unpacked)?;
            std::fs::remove_dir_all(&download_dir)?;
            std::fs::write(&about, format!("{package} {version}\n"))?;
            return Ok(Fetched {
                package: package.clone(),
                version,
                vmlinuz,
            });
        }
        bail!(
            "no {} kernel could be downloaded from {} (candidates: {candidates:?})",
            self.series,
            self.suite
        )
    }
}

/// The digit groups of a package name, for ordering `5.10.0-9` before `5.10.0-10`.
fn numbers(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// `boot/vmlinuz-*` in linux-image packages, `usr/lib/modules/<release>/vmlinuz` in linux-binary.
fn find_vmlinuz(root: &Path) -> Result<PathBuf> {
    let in_boot = std::fs::read_dir(root.join("boot"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        });
    let in_modules = || {
        std::fs::read_dir(root.join("usr/lib/modules"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path().join("vmlinuz")))
            .find(|p| p.exists())
    };
    in_boot
        .or_else(in_modules)
        .with_context(|| format!("no vmlinuz in {}", root.display()))
}

fn deb_version(deb: &Path) -> Result<String> {
    let version = cmd::stdout(Command::new("dpkg-deb").arg("-f").arg(deb).arg("Version"))?;
    Ok(version.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_first() {
        let mut names = [
            "linux-image-5.10.0-9-cloud-amd64-unsigned",
            "linux-image-5.10.0-35-cloud-amd64-unsigned",
            "linux-image-5.10.0-10-cloud-amd64-unsigned",
        ];
        names.sort_by_key(|n| std::cmp::Reverse(numbers(n)));
        assert_eq!(names[0], "linux-image-5.10.0-35-cloud-amd64-unsigned");
        assert_eq!(names[2], "linux-image-5.10.0-9-cloud-amd64-unsigned");
    }
}
