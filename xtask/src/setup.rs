//! `cargo xtask setup`: what each project task needs, installed only when missing.
//!
//! Every task builds the tracer (a C linker, rust-src, bpf-linker); the VM tasks, the host tests
//! and the benchmark each add their own Debian packages, so `cargo xtask demo` installs no
//! emulator and no server. apt is asked for a plan first (`apt-get -s`) and nothing is
//! installed when the plan removes a package the machine had: a set-up must not uninstall.
use crate::arch::Arch;
use crate::{apt, cmd, paths};
use anyhow::{Context as _, Result, bail};
use std::path::PathBuf;
use std::process::Command;

/// The toolchain tracer/build.rs builds the eBPF object with (aya-build's `Toolchain`).
const TOOLCHAIN: &str = "stable";
const BPF_LINKER_VERSION: &str = "0.13.0";

/// One set-up, named for the tasks that need it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Part {
    /// Building the tracer (every task; all `cargo xtask demo` needs).
    Build,
    /// Booting kernels under QEMU (vm-test, vm-demo, and so `cargo xtask test`).
    Vm,
    /// The host tests' own programs (tracer/tests, and so `cargo xtask test`).
    HostTests,
    /// `cargo xtask bench`.
    Bench,
    /// Building the tracer for arm64 on this machine and booting arm64 kernels
    /// (`vm-test --arch arm64`, the arm64 image).
    Arm64,
}

impl Part {
    pub const ALL: [Part; 5] = [
        Part::Build,
        Part::Vm,
        Part::HostTests,
        Part::Bench,
        Part::Arm64,
    ];

    fn packages(self) -> &'static [Package] {
        match self {
            Part::Build => BUILD,
            Part::Vm => VM,
            Part::HostTests => HOST_TESTS,
            Part::Bench => BENCH,
            Part::Arm64 => ARM64,
        }
    }
}

/// rustc links through `cc`, against glibc's crt files (and its static libc for the VM guest's
/// binaries); llvm-sys, under bpf-linker, compiles C too.
const BUILD: &[Package] = &[
    Package::new("gcc").unless_command("cc"),
    Package::new("libc6-dev"),
];
/// QEMU boots the kernels; the initramfs is built around a static busybox, which stands in for
/// a dynamic busybox package (the same /bin/busybox).
const VM: &[Package] = &[
    Package::new("qemu-system-x86").release_of("qemu-utils"),
    Package::new("busybox-static").replacing("busybox"),
];
/// tracer/tests/prometheus.rs runs prometheus, promtool and alertmanager; tracer/tests/live.rs
/// drives the live view in tmux; tracer/tests/containers.rs and image.rs start their own dockerd
/// (docker.io, which brings runc), podman and containerd, and run images built locally (no
/// registry); tracer/tests/deploy.rs checks the Grafana dashboard with tsc and Grafana's schema
/// types, which npm installs ([`grafana_schema`]). The other programs the tests run (setpriv,
/// taskset, ldd, tar) are in every Debian system.
const HOST_TESTS: &[Package] = &[
    Package::new("prometheus"),
    Package::new("prometheus-alertmanager"),
    Package::new("tmux"),
    Package::new("docker.io"),
    Package::new("podman"),
    Package::new("containerd"),
    Package::new("npm").unless_command("npm"),
];
/// `perf bench sched pipe` / `messaging`, and bpftrace, the peer the bench compares with.
const BENCH: &[Package] = &[Package::new("linux-perf"), Package::new("bpftrace")];
/// The cross linker and arm64 glibc (static, as the x86-64 guests' programs are; .cargo/config.toml
/// names the linker and the flag) and the arm64 emulator, from the release of the x86 one's
/// siblings for the reason [`VM`]'s qemu-system-x86 is. QEMU's user-mode emulator lists the
/// arm64 test binaries' tests on this machine (guest_tests.rs `select`); a package of its own,
/// which no qemu-system package breaks. The arm64 busybox is downloaded, not installed
/// (guest.rs).
const ARM64: &[Package] = &[
    Package::new("gcc-aarch64-linux-gnu"),
    Package::new("libc6-dev-arm64-cross"),
    Package::new("qemu-system-arm").release_of("qemu-utils"),
    Package::new("qemu-user-static"),
];

/// A Debian package a part needs.
struct Package {
    name: &'static str,
    /// A program whose presence makes the package unnecessary.
    command: Option<&'static str>,
    /// An installed package of the same source whose release this one must come from: apt
    /// takes qemu-system-x86 from the default release, and a newer qemu-utils (bookworm's
    /// backports: 10.0) `Breaks` that release's qemu-system-common (7.2), so apt would remove
    /// qemu-utils to satisfy the install.
    release_of: Option<&'static str>,
    /// A package this one may replace (it `Provides` and `Replaces` it).
    replaces: Option<&'static str>,
}

impl Package {
    const fn new(name: &'static str) -> Self {
        Self {
            name,
            command: None,
            release_of: None,
            replaces: None,
        }
    }

    const fn unless_command(self, command: &'static str) -> Self {
        Self {
            command: Some(command),
            ..self
        }
    }

    const fn release_of(self, sibling: &'static str) -> Self {
        Self {
            release_of: Some(sibling),
            ..self
        }
    }

    const fn replacing(self, package: &'static str) -> Self {
        Self {
            replaces: Some(package),
            ..self
        }
    }
}

/// Installs what `parts` need: their Debian packages in one apt transaction, then the build's
/// Rust pieces.
pub fn run(parts: &[Part]) -> Result<()> {
    let missing: Vec<&Package> = parts
        .iter()
        .flat_map(|part| part.packages())
        .filter(|p| !p.present())
        .collect();
    install(&missing)?;
    if parts.contains(&Part::Build) {
        rust_src()?;
        bpf_linker()?;
    }
    if parts.contains(&Part::HostTests) {
        grafana_schema()?;
    }
    if parts.contains(&Part::Arm64) {
        rust_target(Arch::Arm64.target())?;
    }
    Ok(())
}

/// deploy/grafana/schema's packages (tsc and Grafana's schema types, pinned by its lock file)
/// in target/grafana-schema, where tracer/tests/deploy.rs runs tsc; installed again only when
/// the lock file changed.
fn grafana_schema() -> Result<()> {
    let source = paths::root().join("deploy/grafana/schema");
    let dest = paths::target().join("grafana-schema");
    let lock = std::fs::read(source.join("package-lock.json"))?;
    if dest.join("node_modules/.bin/tsc").exists()
        && std::fs::read(dest.join("package-lock.json")).is_ok_and(|l| l == lock)
    {
        return Ok(());
    }
    std::fs::create_dir_all(&dest)?;
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(source.join(file), dest.join(file))
            .with_context(|| format!("copying deploy/grafana/schema/{file}"))?;
    }
    cmd::run(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dest),
    )
}

impl Package {
    fn present(&self) -> bool {
        self.command
            .is_some_and(|c| cmd::succeeds(Command::new(c).arg("--version")))
            || dpkg_installed(self.name)
    }

    /// What to ask apt for: the package, from an installed sibling's release when it has one.
    fn request(&self) -> Result<Request<'_>> {
        let release = match self.release_of {
            Some(sibling) if dpkg_installed(sibling) => {
                let policy = cmd::stdout(Command::new("apt-cache").args(["policy", sibling]))?;
                let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
                installed_release(&policy, &os)
            }
            _ => None,
        };
        Ok(Request {
            package: self,
            release,
        })
    }
}

/// A package and the release apt must take it from (None: the default release).
struct Request<'a> {
    package: &'a Package,
    release: Option<String>,
}

/// One apt transaction: the packages of one release. `-t RELEASE` takes their dependencies from
/// that release too (a `name/RELEASE` request would take only the package itself from it); a
/// release the system's sources lack (a sibling installed from a backports .deb) is added for
/// this install only.
struct Transaction<'a> {
    release: Option<String>,
    packages: Vec<&'a Package>,
    extra: Option<apt::WithSuite>,
}

impl Transaction<'_> {
    fn command(&self, simulate: bool) -> Command {
        let mut apt = match &self.extra {
            Some(extra) => extra.command("apt-get"),
            None => Command::new("apt-get"),
        };
        if simulate {
            apt.arg("-s");
        }
        if let Some(release) = &self.release {
            apt.args(["-t", release]);
        }
        apt.args(["install", "-y", "--no-install-recommends"])
            .args(self.packages.iter().map(|p| p.name))
            .env("DEBIAN_FRONTEND", "noninteractive");
        apt
    }

    fn describe(&self) -> String {
        let names: Vec<&str> = self.packages.iter().map(|p| p.name).collect();
        match &self.release {
            Some(release) => format!("{} (from {release})", names.join(" ")),
            None => names.join(" "),
        }
    }
}

/// Plans every transaction before running any, so that a plan that would remove a package
/// stops the set-up with nothing installed.
fn install(packages: &[&Package]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    cmd::run(Command::new("apt-get").arg("update"))?;
    let requests = packages
        .iter()
        .map(|p| p.request())
        .collect::<Result<Vec<_>>>()?;
    let mut releases: Vec<Option<String>> = requests.iter().map(|r| r.release.clone()).collect();
    releases.sort();
    releases.dedup();
    let system = apt::system_suites()?;
    let mut transactions = Vec::new();
    for release in releases {
        let extra = match &release {
            Some(suite) if !system.contains(suite) => {
                let extra = apt::WithSuite::new(suite)?;
                cmd::run(extra.command("apt-get").args(["-q", "update"]))?;
                Some(extra)
            }
            _ => None,
        };
        let packages = requests
            .iter()
            .filter(|r| r.release == release)
            .map(|r| r.package)
            .collect();
        transactions.push(Transaction {
            release,
            packages,
            extra,
        });
    }
    for transaction in &transactions {
        let plan = cmd::stdout(&mut transaction.command(true))
            .with_context(|| format!("apt cannot install {}", transaction.describe()))?;
        let lost: Vec<&str> = removals(&plan)
            .filter(|removed| !packages.iter().any(|p| p.replaces == Some(*removed)))
            .collect();
        if !lost.is_empty() {
            bail!(
                "installing {} would make apt remove {}; nothing was installed. Install those \
                 packages in versions that keep {} (or remove it yourself), then run this again",
                transaction.describe(),
                lost.join(" "),
                lost.join(" ")
            );
        }
    }
    for transaction in &transactions {
        cmd::run(&mut transaction.command(false))?;
    }
    Ok(())
}

fn dpkg_installed(package: &str) -> bool {
    cmd::stdout(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_ok_and(|status| status == "install ok installed")
}

/// The packages an `apt-get -s` plan removes (its `Remv NAME [VERSION]` lines).
fn removals(plan: &str) -> impl Iterator<Item = &str> {
    plan.lines()
        .filter_map(|l| l.strip_prefix("Remv "))
        .filter_map(|rest| rest.split_whitespace().next())
}

/// The release (suite) the installed version in `apt-cache policy` output comes from: the first
/// archive row under its `***` row. A copy installed from no listed archive (a local .deb) whose
/// version is a backport of this system's release (`~bpo12` on Debian 12) belongs to that
/// release's backports suite; any other such copy to none.
fn installed_release(policy: &str, os_release: &str) -> Option<String> {
    policy
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("*** "))
        .skip(1)
        .map_while(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                // `500 http://host/debian bookworm-backports/main amd64 Packages`
                [_, _, suite, _, "Packages"] => Some(suite.split('/').next()),
                // `100 /var/lib/dpkg/status`: the installed copy itself.
                [_, path] if path.starts_with('/') => Some(None),
                // The next version's row.
                _ => None,
            },
        )
        .flatten()
        .next()
        .map(str::to_owned)
        .or_else(|| backports_of(policy, os_release))
}

fn backports_of(policy: &str, os_release: &str) -> Option<String> {
    let installed = policy
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Installed: "))?;
    let (_, backport) = installed.split_once("~bpo")?;
    let field = |name: &str| {
        os_release
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .map(|v| v.trim_matches('"'))
    };
    let version_id = field("VERSION_ID")?;
    let codename = field("VERSION_CODENAME")?;
    let of_this_release = backport
        .strip_prefix(version_id)
        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()));
    of_this_release.then(|| format!("{codename}-backports"))
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

/// The standard library of a target the guests' programs are cross-built for.
fn rust_target(target: &str) -> Result<()> {
    let installed = cmd::stdout(Command::new("rustup").args([
        "target",
        "list",
        "--installed",
        "--toolchain",
        TOOLCHAIN,
    ]))?;
    if installed.lines().any(|t| t == target) {
        return Ok(());
    }
    cmd::run(Command::new("rustup").args(["target", "add", target, "--toolchain", TOOLCHAIN]))
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

    /// `apt-cache policy qemu-utils` on a bookworm host with qemu-utils from bookworm-backports.
    const POLICY_BACKPORT: &str = "qemu-utils:
  Installed: 1:10.0.2+ds-2+deb13u1~bpo12+1
  Candidate: 1:10.0.2+ds-2+deb13u1~bpo12+1
  Version table:
 *** 1:10.0.2+ds-2+deb13u1~bpo12+1 100
        100 http://mirror.example/debian bookworm-backports/main amd64 Packages
        100 /var/lib/dpkg/status
     1:7.2+dfsg-7+deb12u18+b3 500
        500 http://mirror.example/debian bookworm/main amd64 Packages
";

    #[test]
    fn installed_release_follows_the_installed_row() {
        assert_eq!(
            installed_release(POLICY_BACKPORT, BOOKWORM).as_deref(),
            Some("bookworm-backports")
        );
        // Installed from a local .deb: the row has only the status file, then the next version.
        let local = "qemu-utils:\n  Installed: 1:11.0-1\n  Version table:\n *** 1:11.0-1 100\n        \
            100 /var/lib/dpkg/status\n     1:7.2+dfsg-7+deb12u18+b3 500\n        \
            500 http://mirror.example/debian bookworm/main amd64 Packages\n";
        assert_eq!(installed_release(local, BOOKWORM), None);
        assert_eq!(
            installed_release("qemu-utils:\n  Installed: (none)\n", BOOKWORM),
            None
        );
    }

    const BOOKWORM: &str = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\n\
        VERSION_CODENAME=bookworm\n";

    #[test]
    fn a_local_backport_belongs_to_the_backports_suite() {
        // This machine kind: qemu-utils from a backports .deb, no backports in the sources.
        let policy = "qemu-utils:\n  Installed: 1:10.0.2+ds-2+deb13u1~bpo12+1\n  Version table:\n \
            *** 1:10.0.2+ds-2+deb13u1~bpo12+1 100\n        100 /var/lib/dpkg/status\n";
        assert_eq!(
            installed_release(policy, BOOKWORM).as_deref(),
            Some("bookworm-backports")
        );
        // A backport made for another release is not this one's.
        let other = policy.replace("bpo12", "bpo11");
        assert_eq!(installed_release(&other, BOOKWORM), None);
        let longer = policy.replace("bpo12", "bpo120");
        assert_eq!(installed_release(&longer, BOOKWORM), None);
    }

    /// `apt-get -s install --no-install-recommends qemu-system-x86` with that qemu-utils.
    #[test]
    fn removals_are_the_remv_lines() {
        let plan = "The following packages will be REMOVED:\n  qemu-utils\n\
            Remv qemu-utils [1:10.0.2+ds-2+deb13u1~bpo12+1]\n\
            Inst qemu-system-common (1:7.2+dfsg-7+deb12u18+b3 Debian:12.15/oldstable [amd64])\n\
            Conf qemu-system-common (1:7.2+dfsg-7+deb12u18+b3 Debian:12.15/oldstable [amd64])\n";
        assert_eq!(removals(plan).collect::<Vec<_>>(), ["qemu-utils"]);
        assert_eq!(
            removals("Inst tmux (3.3a-3 Debian:12.15/oldstable [amd64])\n").count(),
            0
        );
    }

    #[test]
    fn llvm_major_from_rustc_vv() {
        let vv = "rustc 1.95.0 (59807616e 2026-04-14)\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.2\n";
        assert_eq!(llvm_major(vv).unwrap(), 22);
        assert!(llvm_major("rustc 1.95.0\n").is_err());
    }
}
