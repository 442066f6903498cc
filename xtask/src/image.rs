//! `cargo xtask image`: the container image `throttle-tracer:<version>` from the project's own
//! static builds and deploy/Dockerfile, built with no registry into the Docker daemon `docker`
//! reaches (or a private dockerd started for the build), one per architecture, each saved with
//! `docker save` under target/image/ (the one for this machine is what tracer/tests/image.rs runs),
//! and both under one tag as an OCI index put together by podman. What it makes and why:
//! docs/deploy.md ("The image").
use crate::arch::Arch;
use crate::binaries::{self, Binaries};
use crate::{cmd, paths};
use anyhow::{Context as _, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn run() -> Result<()> {
    crate::setup::run(&[crate::setup::Part::Build, crate::setup::Part::Arm64])?;
    let host = binaries::build(Arch::HOST)?;
    let arm64 = binaries::build(Arch::Arm64)?;
    build(&[&host, &arm64])
}

/// The image of each of `builds`' tracers (`cargo xtask test` passes its tests' compile), and,
/// with more than one, their index.
pub fn build(builds: &[&Binaries]) -> Result<()> {
    let version = tracer_version()?;
    let dir = paths::target().join("image");
    let daemon = Daemon::reachable_or_private(&dir)?;
    let mut archives = Vec::new();
    for binaries in builds {
        archives.push(image(&daemon, binaries, &version, &dir)?);
    }
    daemon.stop()?;
    if archives.len() > 1 {
        index(&archives, &version, &dir)?;
    }
    Ok(())
}

/// `binaries`' image, tagged `throttle-tracer:<version>` for this machine's architecture and
/// `…-<architecture>` for another, saved; returns the archive.
fn image(daemon: &Daemon, binaries: &Binaries, version: &str, dir: &Path) -> Result<PathBuf> {
    let arch = binaries.arch;
    let suffix = if arch == Arch::HOST {
        String::new()
    } else {
        format!("-{}", arch.debian())
    };
    let tag = format!("throttle-tracer:{version}{suffix}");
    let context = dir.join(format!("context{suffix}"));
    let _ = fs::remove_dir_all(&context);
    fs::create_dir_all(&context).with_context(|| format!("creating {}", context.display()))?;
    fs::copy(&binaries.tracer, context.join("throttle-tracer")).context("copying the binary")?;
    fs::copy(paths::root().join("deploy/passwd"), context.join("passwd"))
        .context("copying deploy/passwd")?;

    let docker = || daemon.docker();
    // FROM scratch and COPY only: another architecture's image needs no emulator to build.
    cmd::run(
        docker()
            .args(["build", "--platform", &format!("linux/{}", arch.debian())])
            .args(["-t", &tag, "-f"])
            .arg(paths::root().join("deploy/Dockerfile"))
            .arg(&context),
    )?;
    let size: u64 = cmd::stdout(docker().args(["image", "inspect", "-f", "{{.Size}}", &tag]))?
        .trim()
        .parse()
        .context("docker image inspect's size")?;
    let tar = dir.join(format!("throttle-tracer-{version}{suffix}.tar"));
    cmd::run(docker().args(["save", "-o"]).arg(&tar).arg(&tag))?;
    if arch == Arch::HOST {
        // Docker's default privileges hold no CAP_BPF: doctor runs and says what is missing.
        let doctor = docker()
            .args(["run", "--rm", "--network", "none", &tag, "doctor"])
            .output()
            .context("docker run … doctor")?;
        println!(
            "docker run --rm {tag} doctor ({}):\n{}{}",
            doctor.status,
            String::from_utf8_lossy(&doctor.stdout),
            String::from_utf8_lossy(&doctor.stderr)
        );
        if doctor.status.code().is_none_or(|c| c > 1) {
            bail!("doctor in the image did not run: {}", doctor.status);
        }
    }
    println!(
        "{tag}: {size} bytes ({:.1} MiB); saved as {}",
        size as f64 / (1 << 20) as f64,
        tar.display()
    );
    Ok(tar)
}

/// The `docker save` archives as one OCI image index, `throttle-tracer:<version>`, each image
/// under its platform: what a registry serves to nodes of either architecture once `skopeo
/// copy --all` or `podman manifest push --all` has put it there. podman keeps the list in a
/// storage of its own under target/image/podman, removed after.
fn index(archives: &[PathBuf], version: &str, dir: &Path) -> Result<()> {
    let storage = dir.join("podman");
    let _ = fs::remove_dir_all(&storage);
    fs::create_dir_all(&storage)?;
    let conf = storage.join("storage.conf");
    fs::write(
        &conf,
        format!(
            "[storage]\ndriver = \"vfs\"\nrunroot = \"{0}/run\"\ngraphroot = \"{0}/graph\"\n",
            storage.display()
        ),
    )?;
    let podman = || {
        let mut podman = Command::new("podman");
        podman.env("CONTAINERS_STORAGE_CONF", &conf);
        podman
    };
    let list = format!("localhost/throttle-tracer:{version}");
    cmd::run(podman().args(["manifest", "create", &list]))?;
    for archive in archives {
        cmd::run(
            podman()
                .args(["manifest", "add", &list])
                .arg(format!("docker-archive:{}", archive.display())),
        )?;
    }
    let manifest: serde_json::Value =
        serde_json::from_str(&cmd::stdout(podman().args(["manifest", "inspect", &list]))?)
            .context("podman manifest inspect's JSON")?;
    let platforms: Vec<String> = manifest["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| format!("{}/{}", m["platform"]["os"], m["platform"]["architecture"]))
        .map(|p| p.replace('"', ""))
        .collect();
    if platforms.len() != archives.len() {
        bail!("the index holds {platforms:?}, not one image per archive");
    }
    let oci = dir.join(format!("throttle-tracer-{version}.oci.tar"));
    let _ = fs::remove_file(&oci);
    cmd::run(
        podman()
            .args(["manifest", "push", "--all", &list])
            .arg(format!(
                "oci-archive:{}:throttle-tracer:{version}",
                oci.display()
            )),
    )?;
    fs::remove_dir_all(&storage)?;
    println!(
        "throttle-tracer:{version} for {}: an OCI index saved as {}",
        platforms.join(", "),
        oci.display()
    );
    Ok(())
}

/// The tracer package's version, from tracer/Cargo.toml.
fn tracer_version() -> Result<String> {
    let manifest = fs::read_to_string(paths::root().join("tracer/Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \"")?.strip_suffix('"'))
        .map(str::to_owned)
        .context("no version in tracer/Cargo.toml")
}

/// The Docker daemon the build talks to.
enum Daemon {
    /// The one `docker` reaches as it is (DOCKER_HOST or the default socket).
    Reachable,
    /// One started for this build, its state in `dir`; `cgroups`: the hierarchies' `docker`
    /// directories it makes for its containers (none was there before), removed with it.
    Private {
        child: Child,
        dir: PathBuf,
        cgroups: Vec<PathBuf>,
    },
}

impl Daemon {
    fn reachable_or_private(parent: &Path) -> Result<Self> {
        if cmd::succeeds(Command::new("docker").arg("info").stdout(Stdio::null())) {
            return Ok(Self::Reachable);
        }
        let dir = parent.join("dockerd");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("daemon.json"), "{}")?;
        eprintln!(
            "no Docker daemon answers `docker info`; starting a private dockerd in {}",
            dir.display()
        );
        let log = fs::File::create(dir.join("dockerd.log"))?;
        let child = Command::new("dockerd")
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .args(["--bridge=none", "--iptables=false", "--ip-masq=false"])
            .args(["--storage-driver", "vfs"])
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", dir.join("docker.sock").display()))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting dockerd (`apt-get install docker.io`)")?;
        let cgroups = cgroup_mounts()?
            .into_iter()
            .map(|m| m.join("docker"))
            .filter(|d| !d.exists())
            .collect();
        let daemon = Self::Private {
            child,
            dir,
            cgroups,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cmd::succeeds(daemon.docker().arg("version").stdout(Stdio::null())) {
            if Instant::now() > deadline {
                daemon.stop()?;
                bail!("the private dockerd did not answer within 60 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(daemon)
    }

    fn docker(&self) -> Command {
        let mut docker = Command::new("docker");
        if let Self::Private { dir, .. } = self {
            docker.env(
                "DOCKER_HOST",
                format!("unix://{}", dir.join("docker.sock").display()),
            );
        }
        docker
    }

    /// Stops a private daemon and removes its state (its data-root is a mount of its own).
    fn stop(self) -> Result<()> {
        let Self::Private {
            mut child,
            dir,
            cgroups,
        } = self
        else {
            return Ok(());
        };
        // SAFETY: signalling our own unreaped child by pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().context("waiting for dockerd")?;
        let prefix = dir.display().to_string();
        let mut mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")?
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&prefix))
            .map(str::to_owned)
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in mounts {
            cmd::run(Command::new("umount").arg("-l").arg(mount))?;
        }
        for cgroup in cgroups.iter().filter(|c| c.exists()) {
            fs::remove_dir(cgroup).with_context(|| format!("removing {}", cgroup.display()))?;
        }
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))
    }
}

/// Every cgroup hierarchy's mount point, from /proc/self/mountinfo.
fn cgroup_mounts() -> Result<Vec<PathBuf>> {
    Ok(fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            matches!(right.split(' ').next()?, "cgroup" | "cgroup2").then(|| PathBuf::from(point))
        })
        .collect())
}
