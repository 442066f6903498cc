//! The Debian kernels the VM tests boot, and fetching one: newest package first, older ones
//! when a download fails; cached under `target/vm/kernels/<architecture>/<series>/`.
use crate::apt::{Archive, PrivateApt};
use crate::arch::Arch;
use crate::cmd;
use anyhow::{Context as _, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One kernel series, where Debian keeps its cloud flavour, and what vm-test runs on it per
/// architecture.
pub struct Kernel {
    /// What `--kernel` takes.
    pub series: &'static str,
    /// The suites that carry it, tried in order: a suite none of whose packages downloads gives
    /// way to the next (bullseye-security lists 5.10's arm64 packages that Debian's archive no
    /// longer serves, where bullseye's last point release still has its own).
    suites: &'static [(&'static str, Archive)],
    /// Package names, as an extended regular expression for `apt-cache search`, with `ARCH`
    /// for Debian's architecture. The cloud flavour on both architectures: the smallest
    /// image, built for virtual machines (virtio, the PL011 console of QEMU's arm64 board),
    /// with kprobes, BTF and CFS bandwidth like the generic one.
    package: &'static str,
    x86_64: Matrix,
    arm64: Matrix,
}

/// What one kernel runs on one architecture.
pub struct Matrix {
    /// Whether vm-test runs the rest of the host tests on it too (guest_tests.rs): they add
    /// minutes per boot under TCG, and their v2 paths are the tracer's and the tests' own, the
    /// same on every kernel, so on the newest only (the ones that judge what differs from
    /// kernel to kernel run on each: guest_tests.rs `EVERY_KERNEL`, `KERNEL_FACTS`).
    pub host_tests: bool,
    /// The backends its guest runs the kernel facts with (guest_tests.rs `KERNEL_FACTS`), the
    /// same shape on both architectures, for both matrices in CI's minutes: every backend on
    /// the oldest and the newest kernel, as each attaches to its own hooks, which change from
    /// version to version; kprobe, whose functions are the ones inlined or renamed between
    /// versions and whose argument registers are each architecture's own, on every kernel; on
    /// x86-64 also the tracepoint backend on 6.12, the kernel before the task-based throttle
    /// (the unthrottle's CSD, its clock). `--backend` names any backend on any kernel.
    pub backends: &'static [&'static str],
    /// The backends (other than the host tests' kprobe) with which its guest runs the fault
    /// tests (guest_tests.rs `FAULTS`): one kernel per backend, each run being a tracer start
    /// more. fentry beside the host tests on the newest; the tracepoint backend on 6.12, which
    /// has what the host's 6.18 has but its task-based throttle (the CSD unthrottle, the
    /// self-time clock).
    pub fault_backends: &'static [&'static str],
    /// Backends this kernel cannot run on this architecture, and why. They never run, even
    /// when `--backend` names them: vm-test shows each as a SKIP with the reason the guest's
    /// own doctor gives (the kernel's refusal), and fails if the doctor finds it usable.
    pub unable: &'static [(&'static str, &'static str)],
}

/// Every backend the tracer has, as `--backend` names them.
pub const BACKENDS: &[&str] = &["kprobe", "fentry", "tracepoint"];

/// x86-64 on a kernel that runs the kernel facts only, with every backend.
const X86_64_FACTS: Matrix = Matrix {
    host_tests: false,
    backends: BACKENDS,
    fault_backends: &[],
    unable: &[],
};

/// arm64 between the oldest and the newest kernel.
const ARM64_KPROBE: Matrix = Matrix {
    host_tests: false,
    backends: &["kprobe"],
    fault_backends: &[],
    unable: &[],
};

/// fentry's trampoline is entered from the traced function's ftrace call site, through
/// ftrace's direct calls: arm64 kernels have them from 6.4 (x86-64 from 5.5).
const NO_ARM64_TRAMPOLINE: &[(&str, &str)] = &[(
    "fentry",
    "arm64 attaches BPF trampolines to kernel functions through ftrace direct calls, from 6.4",
)];

pub const KERNELS: &[Kernel] = &[
    Kernel {
        series: "5.10",
        suites: &[
            ("bullseye-security", Archive::Security),
            ("bullseye", Archive::Main),
        ],
        package: r"^linux-image-5\.10\.0-[0-9]+-cloud-ARCH-unsigned$",
        x86_64: X86_64_FACTS,
        arm64: Matrix {
            backends: &["kprobe", "tracepoint"],
            unable: NO_ARM64_TRAMPOLINE,
            ..ARM64_KPROBE
        },
    },
    Kernel {
        series: "6.1",
        suites: &[("bookworm", Archive::Main)],
        package: r"^linux-image-6\.1\.0-[0-9]+-cloud-ARCH-unsigned$",
        x86_64: Matrix {
            backends: &["kprobe"],
            ..X86_64_FACTS
        },
        arm64: Matrix {
            unable: NO_ARM64_TRAMPOLINE,
            ..ARM64_KPROBE
        },
    },
    Kernel {
        series: "6.12",
        suites: &[("bookworm-security", Archive::Security)],
        package: r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-ARCH-unsigned$",
        x86_64: Matrix {
            backends: &["kprobe", "tracepoint"],
            fault_backends: &["tracepoint"],
            ..X86_64_FACTS
        },
        arm64: ARM64_KPROBE,
    },
    // sid's linux-image-7.* is a small meta package; the image is in linux-binary-*.
    Kernel {
        series: "7",
        suites: &[("sid", Archive::Main)],
        package: r"^linux-binary-7\.[0-9]+\.[0-9]+\+deb[0-9]+-cloud-ARCH$",
        x86_64: Matrix {
            host_tests: true,
            backends: BACKENDS,
            fault_backends: &["fentry"],
            unable: &[],
        },
        arm64: Matrix {
            backends: BACKENDS,
            ..ARM64_KPROBE
        },
    },
];

/// Whether every kernel of `arch`'s matrix runs only the kernel facts and the tests every kernel
/// runs (arm64's): its guests then need only those tests' binaries.
pub fn facts_only(arch: Arch) -> bool {
    KERNELS.iter().all(|k| {
        let m = k.matrix(arch);
        !m.host_tests && m.fault_backends.is_empty()
    })
}

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
    pub fn matrix(&self, arch: Arch) -> &Matrix {
        match arch {
            Arch::X86_64 => &self.x86_64,
            Arch::Arm64 => &self.arm64,
        }
    }

    /// Returns the cached kernel, or downloads the newest one that downloads.
    pub fn fetch(&self, arch: Arch) -> Result<Fetched> {
        let dir = crate::paths::vm()
            .join("kernels")
            .join(arch.debian())
            .join(self.series);
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

        let package = self.package.replace("ARCH", arch.debian());
        let download_dir = dir.join("download");
        let mut tried = Vec::new();
        for &(suite, archive) in self.suites {
            let apt = PrivateApt::new(suite, archive, arch)?;
            apt.update_once()?;
            let mut candidates = apt.search(&package)?;
            if candidates.is_empty() {
                // Lists from an earlier run may be stale; try once with fresh ones.
                apt.update()?;
                candidates = apt.search(&package)?;
            }
            candidates.sort_by_key(|name| std::cmp::Reverse(numbers(name)));
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
            tried.push(format!("{suite}: {candidates:?}"));
        }
        bail!(
            "no {} {} kernel could be downloaded (candidates: {})",
            self.series,
            arch.debian(),
            tried.join("; ")
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

    /// The issue's matrix on arm64: kprobe (the arch-specific backend) on every kernel, every
    /// backend on the oldest and the newest, unless that kernel cannot run it (a SKIP row).
    #[test]
    fn arm64_runs_kprobe_everywhere_and_all_on_the_ends() {
        for kernel in KERNELS {
            assert!(
                kernel.arm64.backends.contains(&"kprobe"),
                "{}",
                kernel.series
            );
        }
        for kernel in [&KERNELS[0], &KERNELS[KERNELS.len() - 1]] {
            let m = &kernel.arm64;
            for backend in BACKENDS {
                let unable = m.unable.iter().any(|(b, _)| b == backend);
                assert!(
                    m.backends.contains(backend) || unable,
                    "{} {backend}",
                    kernel.series
                );
            }
        }
    }

    #[test]
    fn a_backend_that_cannot_run_is_never_run() {
        for kernel in KERNELS {
            for m in [&kernel.x86_64, &kernel.arm64] {
                for (backend, why) in m.unable {
                    assert!(BACKENDS.contains(backend) && !why.is_empty());
                    assert!(!m.backends.contains(backend), "{} {backend}", kernel.series);
                    assert!(
                        !m.fault_backends.contains(backend),
                        "{} {backend}",
                        kernel.series
                    );
                }
            }
            assert!(kernel.package.contains("-ARCH"), "{}", kernel.series);
        }
    }

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
