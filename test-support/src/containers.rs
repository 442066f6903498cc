//! Real container runtimes for the tests, each private to one test: a dockerd, podman and a
//! containerd, each with its state under a temporary directory of its own, no network set-up and no
//! image registry (images are imported from a local root filesystem or a `docker save` archive).
//! The runtimes are Debian's (`cargo xtask setup host-tests` installs them); this module installs
//! nothing. [`Engine::shut_down`] leaves the host as it was (docs/testing.md, "Real containers").
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::{CpuHierarchy, Running, wait_until};

/// Where the workload is in its image.
pub const WORKLOAD_IN_IMAGE: &str = "/throttle-workload";
/// The most cpu.shares a v1 cgroup takes (the kernel's MAX_SHARES), as [`CpuHierarchy::favour`].
pub const MAX_SHARES: &str = "262144";

/// Which container engine a test drives through its docker-compatible command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Docker,
    Podman,
}

impl Kind {
    /// The name the tracer gives the runtime (NDJSON `name.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Podman => "podman",
        }
    }

    /// The parent cgroup the runtime puts its containers in with the cgroupfs driver.
    fn parent_cgroup(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Podman => "libpod_parent",
        }
    }

    fn programs(self) -> &'static [&'static str] {
        match self {
            Self::Docker => &["/usr/sbin/dockerd", "/usr/bin/docker", "/usr/sbin/runc"],
            Self::Podman => &["/usr/bin/podman", "/usr/bin/conmon", "/usr/sbin/runc"],
        }
    }
}

/// Why this machine cannot run `programs` (they are missing), if it cannot.
pub fn missing(programs: &[&str]) -> Result<(), String> {
    match programs.iter().find(|p| !Path::new(p).exists()) {
        Some(p) => Err(format!(
            "no {p} (`cargo xtask setup host-tests` installs docker.io, podman and containerd)"
        )),
        None => Ok(()),
    }
}

/// A private docker daemon or podman, with the workload image imported as [`Engine::IMAGE`].
pub struct Engine {
    pub kind: Kind,
    dir: Option<tempfile::TempDir>,
    /// The client and the global options that point it at this engine's state.
    client: Vec<String>,
    env: Vec<(String, String)>,
    daemon: Option<Running>,
    /// The cgroup trees the runtime made (parents of its containers), to remove at the end.
    parents: Vec<String>,
}

/// One running container: its full id, the pid of its first process and its cgroup in the
/// cpu hierarchy (read from /proc/PID/cgroup, not from the runtime).
pub struct Container {
    pub id: String,
    pub pid: u32,
    /// The cgroup's path as the tracer names it (`/docker/<id>`).
    pub cgroup: String,
    pub dir: PathBuf,
}

impl Container {
    /// The 12 digits `docker ps` shows.
    pub fn short_id(&self) -> &str {
        &self.id[..12]
    }
}

impl Engine {
    pub const IMAGE: &str = "localhost/tt-workload:test";

    /// Starts a private engine of `kind` and imports the workload image into it.
    pub fn start(kind: Kind, cpu: &CpuHierarchy) -> Result<Self, String> {
        missing(kind.programs())?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("tt-{}-", kind.as_str()))
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let d = dir.path().to_owned();
        let parent = kind.parent_cgroup();
        let mut engine = Self {
            kind,
            client: Vec::new(),
            env: Vec::new(),
            daemon: None,
            parents: if cpu.root.join(parent).exists() {
                Vec::new()
            } else {
                vec![parent.to_owned()]
            },
            dir: Some(dir),
        };
        match kind {
            Kind::Docker => engine.start_dockerd(&d),
            Kind::Podman => engine.configure_podman(&d),
        }
        let rootfs = workload_rootfs(&d.join("rootfs"));
        let tar = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("tar: {e}"))?;
        let out = engine
            .command()
            .args(["import", "-", Self::IMAGE])
            .stdin(tar.stdout.expect("tar's stdout"))
            .output()
            .expect("import");
        if !out.status.success() {
            return Err(format!("{} import: {}", kind.as_str(), text(&out)));
        }
        Ok(engine)
    }

    /// dockerd with its data, exec state, pid file and socket in `d`; no bridge, no iptables.
    fn start_dockerd(&mut self, d: &Path) {
        let socket = d.join("docker.sock");
        fs::write(d.join("daemon.json"), "{}").unwrap();
        let log = fs::File::create(d.join("dockerd.log")).unwrap();
        let mut cmd = Command::new("/usr/sbin/dockerd");
        cmd.arg("--config-file")
            .arg(d.join("daemon.json"))
            .args(["--bridge=none", "--iptables=false", "--ip-masq=false"])
            .args(["--storage-driver", "vfs"])
            .args(["--exec-opt", "native.cgroupdriver=cgroupfs"])
            .arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("--pidfile")
            .arg(d.join("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(log);
        self.daemon = Some(Running::spawn(&mut cmd));
        self.client = vec![
            "/usr/bin/docker".into(),
            "-H".into(),
            format!("unix://{}", socket.display()),
        ];
        let log = d.join("dockerd.log");
        wait_until(Duration::from_secs(60), "dockerd answering", || {
            let ok = self
                .command()
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok
                && let Some(status) = self
                    .daemon
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "dockerd exited ({status}): {}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            ok
        });
    }

    /// podman with its storage, run state and temporary files in `d`: rootful, cgroupfs,
    /// runc (crun refuses this host's hybrid cgroup layout) and no default rlimits (this
    /// sandbox may not raise them).
    fn configure_podman(&mut self, d: &Path) {
        let conf = d.join("containers.conf");
        fs::write(
            &conf,
            "[containers]\ndefault_ulimits = []\n[engine]\nevents_logger = \"file\"\n\
             cgroup_manager = \"cgroupfs\"\n",
        )
        .unwrap();
        self.env = vec![("CONTAINERS_CONF".into(), conf.display().to_string())];
        self.client = [
            "/usr/bin/podman",
            "--storage-driver",
            "vfs",
            "--runtime",
            "runc",
        ]
        .map(String::from)
        .to_vec();
        for (option, sub) in [
            ("--root", "root"),
            ("--runroot", "run"),
            ("--tmpdir", "tmp"),
        ] {
            self.client.push(option.into());
            self.client.push(d.join(sub).display().to_string());
        }
    }

    /// The directory that holds the engine's state (its data-root, sockets, storage) while
    /// it runs.
    pub fn state_dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(tempfile::TempDir::path)
    }

    /// The private dockerd's pid (podman has no daemon).
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(|d| d.id())
    }

    /// The engine's client, pointed at this engine.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.client[0]);
        cmd.args(&self.client[1..]).envs(self.env.iter().cloned());
        cmd
    }

    /// Runs the client; panics with its output if it fails.
    pub fn run_ok(&self, args: &[&str]) -> String {
        let out = self
            .command()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{} {args:?}: {e}", self.kind.as_str()));
        assert!(
            out.status.success(),
            "{} {args:?}: {}",
            self.kind.as_str(),
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Starts a detached container of the workload image that idles (its cgroup stays while
    /// the test `exec`s loads into it), with `limits` (`--cpus 0.5`, `--cgroup-parent`, …) and
    /// the most CPU weight for it and every cgroup above it: on a loaded machine a container weighted
    /// as one task would get less than its quota and never be throttled.
    pub fn idle_container(&self, cpu: &CpuHierarchy, limits: &[&str]) -> Container {
        let mut args = vec!["run", "-d", "--network", "none", "--cpu-shares", MAX_SHARES];
        args.extend(limits);
        args.extend([Self::IMAGE, WORKLOAD_IN_IMAGE, "idle", "--seconds", "600"]);
        let id = self.run_ok(&args);
        let pid: u32 = self
            .run_ok(&["inspect", "-f", "{{.State.Pid}}", &id])
            .parse()
            .expect("a pid");
        let container = Container::of(cpu, id, pid);
        // Every cgroup between the root and the container's: the runtime's parent, or the
        // ones `--cgroup-parent` named.
        for parent in container.dir.ancestors().skip(1) {
            if parent == cpu.root || !parent.starts_with(&cpu.root) {
                break;
            }
            cpu.favour(parent);
        }
        container
    }

    /// Runs `busy` with `threads` threads for `seconds` inside `container`, until it exits.
    pub fn exec_busy(&self, container: &Container, threads: u32, seconds: u32) {
        self.run_ok(&[
            "exec",
            &container.id,
            WORKLOAD_IN_IMAGE,
            "busy",
            "--threads",
            &threads.to_string(),
            "--seconds",
            &seconds.to_string(),
        ]);
    }

    /// [`Engine::exec_busy`] on a thread of its own, for loads that run at once.
    pub fn spawn_busy(&self, container: &Container, threads: u32, seconds: u32) -> Running {
        let mut cmd = self.command();
        cmd.args([
            "exec",
            &container.id,
            WORKLOAD_IN_IMAGE,
            "busy",
            "--threads",
        ])
        .arg(threads.to_string())
        .arg("--seconds")
        .arg(seconds.to_string());
        Running::spawn(&mut cmd)
    }

    /// The ids of every container the engine has, running or not.
    pub fn containers(&self) -> Vec<String> {
        self.run_ok(&["ps", "-a", "-q", "--no-trunc"])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Removes every container, stops the daemon and every process it left (found by the state
    /// directory in their command line, killed by pid), unmounts what the runtime mounted below
    /// its directory, removes the directory and the parent cgroups the runtime made (`/docker`,
    /// `/libpod_parent`) in every hierarchy if they were not there before. The drop guard calls
    /// it too, also after a failed assertion. Returns what is left (empty: nothing), so that a
    /// test can assert a clean end.
    pub fn shut_down(&mut self) -> Vec<String> {
        let Some(dir) = self.dir.take() else {
            return Vec::new();
        };
        let mut left = Vec::new();
        let ids = self.containers();
        if !ids.is_empty() {
            let mut rm = vec!["rm", "-f"];
            if self.kind == Kind::Podman {
                // SIGKILL at once: the idle first process ignores SIGTERM (pid 1).
                rm.extend(["-t", "0"]);
            }
            rm.extend(ids.iter().map(String::as_str));
            let out = self.command().args(&rm).output().expect("rm");
            if !out.status.success() {
                left.push(format!("rm -f: {}", text(&out)));
            }
        }
        left.extend(
            self.containers()
                .into_iter()
                .map(|id| format!("container {id}")),
        );
        if let Some(mut daemon) = self.daemon.take() {
            // SIGTERM: dockerd stops its containerd on the way out.
            // SAFETY: signalling our own unreaped child by pid.
            unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while daemon.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            if daemon.try_wait().ok().flatten().is_none() {
                left.push(format!("dockerd {} did not stop on SIGTERM", daemon.id()));
            }
        }
        left.extend(release_dir(dir));
        left.extend(remove_cgroups(&self.parents));
        left
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for thing in self.shut_down() {
            eprintln!("left behind: {thing}");
        }
    }
}

impl Container {
    /// The container whose first process is `pid`: its cpu cgroup from /proc/PID/cgroup.
    pub fn of(cpu: &CpuHierarchy, id: String, pid: u32) -> Self {
        let cgroup = cpu_cgroup_of(pid);
        let dir = cpu.root.join(cgroup.trim_start_matches('/'));
        Self {
            id,
            pid,
            cgroup,
            dir,
        }
    }
}

/// `pid`'s cgroup in the cpu controller's hierarchy (v1 `N:...cpu...:PATH`, else v2 `0::PATH`).
pub fn cpu_cgroup_of(pid: u32) -> String {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/cgroup: {e}"));
    let line = |v1: bool| {
        text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            let cpu = controllers.split(',').any(|c| c == "cpu");
            (if v1 { cpu } else { controllers.is_empty() }).then(|| path.to_owned())
        })
    };
    line(true)
        .or_else(|| line(false))
        .unwrap_or_else(|| panic!("no cpu cgroup in /proc/{pid}/cgroup: {text}"))
}

/// A root filesystem for the workload: the test build's binary (dynamically linked) and the
/// shared objects it loads, at the paths `ldd` shows, in `dir`.
pub fn workload_rootfs(dir: &Path) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let workload = super::workload();
    fs::copy(
        &workload,
        dir.join(WORKLOAD_IN_IMAGE.trim_start_matches('/')),
    )
    .unwrap();
    let out = Command::new("ldd").arg(&workload).output().expect("ldd");
    assert!(
        out.status.success(),
        "ldd {}: {}",
        workload.display(),
        text(&out)
    );
    for lib in String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let to = dir.join(lib.trim_start_matches('/'));
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(lib, &to).unwrap_or_else(|e| panic!("copy {lib}: {e}"));
    }
    dir.to_owned()
}

/// Stops what still runs from `dir` (a runtime's shims), unmounts what is mounted below it and
/// removes it; returns what could not be.
pub fn release_dir(dir: tempfile::TempDir) -> Vec<String> {
    let path = dir.path().to_owned();
    let mut left = Vec::new();
    let needle = path.display().to_string();
    let mut pids = processes_mentioning(&needle);
    for &pid in &pids {
        // SAFETY: signalling a process started from this test's own state directory.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids.is_empty() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
        pids = processes_mentioning(&needle);
    }
    left.extend(
        pids.iter()
            .map(|p| format!("process {p} running from {needle}")),
    );
    let mut mounts = mounts_below(&path);
    // Deepest first; detached, as a busy mount of an exited runtime must not keep the rest.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in &mounts {
        let c = std::ffi::CString::new(mount.as_str()).unwrap();
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    left.extend(
        mounts_below(&path)
            .into_iter()
            .map(|m| format!("mount {m}")),
    );
    if let Err(e) = fs::remove_dir_all(&path) {
        left.push(format!("{}: {e}", path.display()));
    }
    std::mem::forget(dir);
    left
}

/// The processes (but this one) whose command line holds `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// The mount points at or below `path` (/proc/self/mountinfo's fifth field).
pub fn mounts_below(path: &Path) -> Vec<String> {
    let prefix = path.display().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Every cgroup hierarchy's mount point (v1 and v2).
pub fn cgroup_mounts() -> Vec<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let point = left.split(' ').nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(point))
        })
        .collect()
}

/// Removes the cgroup trees `paths` (relative to each hierarchy's root) in every hierarchy,
/// children first; returns those still there. A runtime removes its containers' cgroups but
/// not the parents it made for them.
pub fn remove_cgroups(paths: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for root in cgroup_mounts() {
        for path in paths {
            let dir = root.join(path);
            if dir.exists() {
                remove_tree(&dir);
                if dir.exists() {
                    left.push(format!("cgroup {}", dir.display()));
                }
            }
        }
    }
    left
}

fn remove_tree(dir: &Path) {
    for sub in fs::read_dir(dir).into_iter().flatten().flatten() {
        if sub.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&sub.path());
        }
    }
    let _ = fs::remove_dir(dir);
}

/// A command's stdout and stderr, for a failure message.
pub fn text(out: &Output) -> String {
    format!(
        "{} {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A private containerd (the runtime the kubelet talks to) and its `ctr`, with its root, state
/// and socket in a temporary directory and the CRI plugin off; containers in namespace `tt`.
pub struct Containerd {
    dir: Option<tempfile::TempDir>,
    socket: PathBuf,
    daemon: Option<Running>,
    /// The cgroup trees its containers made, to remove at the end (see [`Engine`]).
    parents: Vec<String>,
}

impl Containerd {
    pub fn start() -> Result<Self, String> {
        missing(&["/usr/bin/containerd", "/usr/bin/ctr", "/usr/sbin/runc"])?;
        let dir = tempfile::Builder::new()
            .prefix("tt-containerd-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let d = dir.path().to_owned();
        let config = d.join("config.toml");
        fs::write(
            &config,
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
        )
        .unwrap();
        let socket = d.join("containerd.sock");
        let log = fs::File::create(d.join("containerd.log")).unwrap();
        let daemon = Running::spawn(
            Command::new("/usr/bin/containerd")
                .arg("--config")
                .arg(&config)
                .arg("--root")
                .arg(d.join("root"))
                .arg("--state")
                .arg(d.join("state"))
                .arg("--address")
                .arg(&socket)
                .stdout(Stdio::null())
                .stderr(log),
        );
        let containerd = Self {
            dir: Some(dir),
            socket,
            daemon: Some(daemon),
            parents: vec!["tt".into()],
        };
        wait_until(Duration::from_secs(30), "containerd answering", || {
            containerd
                .ctr()
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
        Ok(containerd)
    }

    /// `ctr` talking to this containerd, in namespace `tt`.
    pub fn ctr(&self) -> Command {
        let mut cmd = Command::new("/usr/bin/ctr");
        cmd.arg("-a").arg(&self.socket).args(["-n", "tt"]);
        cmd
    }

    /// Runs `ctr args`; panics with its output if it fails. Returns its stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr().args(args).output().expect("ctr");
        assert!(out.status.success(), "ctr {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ctr image import` of a `docker save` archive (snapshotter `native`: no overlay needed).
    pub fn import(&self, archive: &Path) {
        let archive = archive.display().to_string();
        self.ctr_ok(&["image", "import", "--snapshotter", "native", &archive]);
    }

    /// Records that containers will be placed under the cgroup tree `path` (made by runc), so
    /// that shutting down removes it.
    pub fn owns_cgroups(&mut self, path: &str) {
        self.parents.push(path.to_owned());
    }

    /// The host pid of task `id`'s first process (`ctr task ls`).
    pub fn pid(&self, id: &str) -> u32 {
        self.ctr_ok(&["task", "ls"])
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == id).then(|| f.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no task {id}"))
    }

    /// Kills every task, removes the containers, stops containerd, removes its state and the
    /// cgroups its containers made; returns what is left.
    pub fn shut_down(&mut self) -> Vec<String> {
        let Some(dir) = self.dir.take() else {
            return Vec::new();
        };
        let mut left = Vec::new();
        let ids: Vec<String> = self
            .ctr_ok(&["container", "ls", "-q"])
            .lines()
            .map(str::to_owned)
            .collect();
        for id in &ids {
            let _ = self
                .ctr()
                .args(["task", "kill", "-s", "SIGKILL", id])
                .output();
        }
        for id in &ids {
            // A killed task is removable once its exit has been reaped by the shim.
            let gone = (0..100).any(|_| {
                let done = self
                    .ctr()
                    .args(["task", "rm", "-f", id])
                    .output()
                    .is_ok_and(|o| o.status.success())
                    || !self.ctr_ok(&["task", "ls"]).contains(id.as_str());
                if !done {
                    thread::sleep(Duration::from_millis(50));
                }
                done
            });
            if !gone {
                left.push(format!("task {id}"));
            }
            let _ = self.ctr().args(["container", "rm", id]).output();
        }
        left.extend(
            self.ctr_ok(&["container", "ls", "-q"])
                .lines()
                .map(|id| format!("container {id}")),
        );
        if let Some(mut daemon) = self.daemon.take() {
            // SAFETY: signalling our own unreaped child by pid.
            unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
            if daemon.wait().is_err() {
                left.push("containerd did not stop".into());
            }
        }
        left.extend(release_dir(dir));
        left.extend(remove_cgroups(&self.parents));
        left
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for thing in self.shut_down() {
            eprintln!("left behind: {thing}");
        }
    }
}
