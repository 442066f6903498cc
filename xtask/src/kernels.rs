//! The Debian kernels the VM tests boot, and fetching one: newest package first, older ones
//! when a download fails; cached under target/vm/kernels/<series>/.
use crate::apt::{Archive, PrivateApt};
use crate::cmd;
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
    /// Whether vm-test runs the rest of the host tests on it too (guest_tests.rs): they add
    /// minutes per boot under TCG, and their v2 paths are the tracer's and the tests' own, the
    /// same on every kernel, so on the newest only (the ones that judge what differs from
    /// kernel to kernel run on each: guest_tests.rs `EVERY_KERNEL`, `KERNEL_FACTS`).
    pub host_tests: bool,
    /// The backends its guest runs the kernel facts with (guest_tests.rs `KERNEL_FACTS`): every
    /// backend on every kernel, as each attaches to its own hooks, which change from version to
    /// version. `--backend` narrows it.
    pub backends: &'static [&'static str],
    /// The backends (other than the host tests' kprobe) with which its guest runs the fault
    /// tests (guest_tests.rs `FAULTS`): one kernel per backend, each run being a tracer start
    /// more. fentry beside the host tests on the newest; the tracepoint backend on 6.12, which
    /// has what the host's 6.18 has but its task-based throttle (the CSD unthrottle, the
    /// self-time clock).
    pub fault_backends: &'static [&'static str],
}

/// Every backend the tracer has, as `--backend` names them.
pub const BACKENDS: &[&str] = &["kprobe", "fentry", "tracepoint"];

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
        backends: BACKENDS,
        fault_backends: &[],
    },
    Kernel {
        series: "6.12",
        suite: "bookworm-security",
        archive: Archive::Security,
        package: r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$",
        host_tests: false,
        backends: BACKENDS,
        fault_backends: &["tracepoint"],
    },
    // sid's linux-image-7.* is a small meta package; the image is in linux-binary-*.
    Kernel {
        series: "7",
        suite: "sid",
        archive: Archive::Main,
        package: r"^linux-binary-7\.[0-9]+\.[0-9]+\+deb[0-9]+-cloud-amd64$",
        host_tests: true,
        backends: BACKENDS,
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
