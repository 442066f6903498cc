//! The architectures the guests run: each one's Rust target, Debian name, emulators and serial
//! console.
use std::path::Path;
use std::process::Command;

/// What `--arch` takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, clap::ValueEnum)]
pub enum Arch {
    #[default]
    #[value(name = "x86-64")]
    X86_64,
    Arm64,
}

impl Arch {
    /// This machine's, which xtask is built for: the programs the host tasks run.
    #[cfg(target_arch = "x86_64")]
    pub const HOST: Arch = Arch::X86_64;
    #[cfg(target_arch = "aarch64")]
    pub const HOST: Arch = Arch::Arm64;

    /// The Rust target of the guest's static programs.
    pub fn target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// Debian's name: in kernel package names and apt's `APT::Architecture`.
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The ELF header's `e_machine` of its programs.
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::X86_64 => 62,
            Arch::Arm64 => 183,
        }
    }

    /// `program`, built for this architecture, to run on this machine: itself on this machine's,
    /// under QEMU's user-mode emulator (`cargo xtask setup arm64`) on another's.
    pub fn command(self, program: &Path) -> Command {
        if self == Arch::HOST {
            return Command::new(program);
        }
        let mut emulated = Command::new(match self {
            Arch::X86_64 => "qemu-x86_64-static",
            Arch::Arm64 => "qemu-aarch64-static",
        });
        emulated.arg(program);
        emulated
    }

    pub fn qemu(self) -> &'static str {
        match self {
            Arch::X86_64 => "qemu-system-x86_64",
            Arch::Arm64 => "qemu-system-aarch64",
        }
    }

    /// QEMU's machine and CPU. arm64: the virt board, and Neoverse N1 (Graviton 2, Ampere
    /// Altra) rather than `max`, whose pointer authentication and SVE the emulator runs
    /// several times slower and which no test needs.
    pub fn machine(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &["-cpu", "max"],
            Arch::Arm64 => &["-machine", "virt", "-cpu", "neoverse-n1"],
        }
    }

    /// The serial console's device name (the virt board's PL011 on arm64).
    pub fn console(self) -> &'static str {
        match self {
            Arch::X86_64 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        }
    }
}
