//! `cargo xtask image`: the container image `throttle-tracer:<version>` from the project's own
//! static build and deploy/Dockerfile (`FROM scratch`: the binary and /etc/passwd), built with
//! no registry into the Docker daemon `docker` reaches, or, when none answers, into a private
//! dockerd started for the build (no bridge, no iptables rules) and stopped after it. Either
//! way the image is also saved as target/image/throttle-tracer-<version>.tar (`docker save`),
//! which `docker load` and `ctr image import` take and tracer/tests/image.rs runs.
use crate::binaries::{self, Binaries};
use crate::{cmd, paths};
use anyhow::{Context as _, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn run() -> Result<()> {
    build(&binaries::build()?)
}

/// The image of `binaries`' tracer (`cargo xtask test` passes its tests' compile).
pub fn build(binaries: &Binaries) -> Result<()> {
    let version = tracer_version()?;
    let tag = format!("throttle-tracer:{version}");
    let dir = paths::target().join("image");
    let context = dir.join("context");
    let _ = fs::remove_dir_all(&context);
    fs::create_dir_all(&context).with_context(|| format!("creating {}", context.display()))?;
    fs::copy(&binaries.tracer, context.join("throttle-tracer")).context("copying the binary")?;
    fs::copy(paths::root().join("deploy/passwd"), context.join("passwd"))
        .context("copying deploy/passwd")?;

    let daemon = Daemon::reachable_or_private(&dir)?;
    let docker = || daemon.docker();
    cmd::run(
        docker()
            .args(["build", "-t", &tag, "-f"])
            .arg(paths::root().join("deploy/Dockerfile"))
            .arg(&context),
    )?;
    let size: u64 = cmd::stdout(docker().args(["image", "inspect", "-f", "{{.Size}}", &tag]))?
        .trim()
        .parse()
        .context("docker image inspect's size")?;
    let tar = dir.join(format!("throttle-tracer-{version}.tar"));
    cmd::run(docker().args(["save", "-o"]).arg(&tar).arg(&tag))?;
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
    println!(
        "{tag}: {size} bytes ({:.1} MiB); saved as {}",
        size as f64 / (1 << 20) as f64,
        tar.display()
    );
    daemon.stop()
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
