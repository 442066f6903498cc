//! A test's temporary cgroup in the cpu hierarchy (on v1, with the same path in a separate
//! cpuacct hierarchy when asked). Drop SIGKILLs the tasks still in it and removes it, children
//! first, also when an assertion failed: no test leaves a cgroup or a workload behind.
use std::{
    fs,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use crate::{CpuHierarchy, CpuStat};

pub struct Cgroup {
    dir: PathBuf,
    /// The path as the tracer names it (`/tt-host-one-123`).
    path: String,
    cpu: CpuHierarchy,
    /// The same path in other hierarchies (v1 cpuacct): entered and removed with it.
    mirrors: Vec<PathBuf>,
}

impl Cgroup {
    /// A new cgroup `tt-<tag>-<pid>` below the hierarchy's root, without a quota.
    pub fn new(cpu: &CpuHierarchy, tag: &str) -> Self {
        cpu.enable_in_children(&cpu.root);
        Self::make(
            cpu,
            cpu.root.join(format!("tt-{tag}-{}", std::process::id())),
        )
    }

    /// A new cgroup `name` right below the hierarchy's root, without a quota. An empty one left
    /// behind by a run that was killed is removed first; one in use is not.
    pub fn named(cpu: &CpuHierarchy, name: &str) -> Self {
        cpu.enable_in_children(&cpu.root);
        let dir = cpu.root.join(name);
        let _ = fs::remove_dir(&dir);
        Self::make(cpu, dir)
    }

    /// [`Cgroup::new`] with `quota_us` per `period_us`, weighted as [`CpuHierarchy::favour`]s.
    pub fn throttled(cpu: &CpuHierarchy, tag: &str, quota_us: u64, period_us: u64) -> Self {
        let cgroup = Self::new(cpu, tag);
        cgroup.set_quota(Some(quota_us), period_us);
        cgroup.favour();
        cgroup
    }

    /// A cgroup someone else made (e.g. the demo's): removed the same way on drop, if it is
    /// there then.
    pub fn adopt(cpu: &CpuHierarchy, dir: PathBuf) -> Self {
        Self {
            path: path_in(cpu, &dir),
            dir,
            cpu: cpu.clone(),
            mirrors: Vec::new(),
        }
    }

    /// A new child `name`, removed by its own guard or, at the latest, by this one's.
    pub fn child(&self, name: &str) -> Self {
        self.cpu.enable_in_children(&self.dir);
        Self::make(&self.cpu, self.dir.join(name))
    }

    /// With the same path in the separate v1 cpuacct hierarchy, if the host has one.
    pub fn with_cpuacct(mut self) -> Self {
        if let Some(root) = &self.cpu.cpuacct {
            let dir = root.join(self.path.trim_start_matches('/'));
            fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            self.mirrors.push(dir);
        }
        self
    }

    fn make(cpu: &CpuHierarchy, dir: PathBuf) -> Self {
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Self::adopt(cpu, dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cgroup's id, as the tracer's lines give it (`cgroup_id`): its directory's inode.
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        fs::metadata(&self.dir)
            .unwrap_or_else(|e| panic!("{}: {e}", self.dir.display()))
            .ino()
    }

    /// The cgroup's path as the tracer names it: `--cgroup` takes it, reports print it.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The cgroup.procs files a process writes itself into to enter this cgroup.
    pub fn procs_files(&self) -> impl Iterator<Item = PathBuf> + '_ {
        [&self.dir]
            .into_iter()
            .chain(&self.mirrors)
            .map(|dir| dir.join("cgroup.procs"))
    }

    pub fn set_quota(&self, quota_us: Option<u64>, period_us: u64) {
        self.cpu.set_quota(&self.dir, quota_us, period_us);
    }

    pub fn write_quota(&self, quota_us: Option<u64>) {
        self.cpu.write_quota(&self.dir, quota_us);
    }

    pub fn favour(&self) {
        self.cpu.favour(&self.dir);
    }

    /// Runtime it may carry over from idle periods, in µs (5.14+).
    pub fn set_burst(&self, burst_us: u64) {
        self.cpu.set_burst(&self.dir, burst_us);
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) {
        for file in self.procs_files() {
            fs::write(&file, pid.to_string())
                .unwrap_or_else(|e| panic!("write {pid} to {}: {e}", file.display()));
        }
    }

    pub fn stat(&self) -> CpuStat {
        self.cpu.stat(&self.dir)
    }

    /// cpu.stat.local's throttled time, ns; `None` where the kernel has no cpu.stat.local
    /// (before 6.6).
    pub fn local_throttled_ns(&self) -> Option<u64> {
        self.cpu
            .has_local(&self.dir)
            .then(|| self.cpu.local_throttled_ns(&self.dir))
    }

    /// CPU time its tasks used, in ns: v2 cpu.stat `usage_usec`; v1 `cpuacct.usage` of the same
    /// path in the cpuacct hierarchy (made with [`Cgroup::with_cpuacct`]) or, co-mounted, its
    /// own directory.
    pub fn usage_ns(&self) -> u64 {
        self.cpu.usage_ns(&self.dir, &self.cpuacct_dir())
    }

    /// The file [`Cgroup::usage_ns`] reads.
    pub fn usage_file(&self) -> PathBuf {
        self.cpu.usage_file(&self.dir, &self.cpuacct_dir())
    }

    fn cpuacct_dir(&self) -> PathBuf {
        match &self.cpu.cpuacct {
            Some(root) => root.join(self.path.trim_start_matches('/')),
            None => self.dir.clone(),
        }
    }

    /// The pids in the cgroup now.
    pub fn tasks(&self) -> Vec<u32> {
        tasks(&self.dir)
    }

    /// [`CpuHierarchy::wait_refilled`] for this cgroup.
    pub fn wait_refilled(&self) {
        self.cpu.wait_refilled(&self.dir);
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for dir in [&self.dir].into_iter().chain(&self.mirrors) {
            remove(dir);
        }
    }
}

/// `dir`'s path below the hierarchy's root, with a leading `/`.
fn path_in(cpu: &CpuHierarchy, dir: &Path) -> String {
    let below = dir.strip_prefix(&cpu.root).unwrap_or(dir);
    format!("/{}", below.display())
}

fn tasks(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// Removes `dir` and its children, SIGKILLing what is still inside. A killed task leaves the
/// cgroup a moment after the signal, so rmdir is retried for a while; a failure is said on
/// stderr (a panic in a drop during a failed test's unwinding would abort the run).
fn remove(dir: &Path) {
    for sub in fs::read_dir(dir).into_iter().flatten().flatten() {
        if sub.file_type().is_ok_and(|t| t.is_dir()) {
            remove(&sub.path());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for pid in tasks(dir) {
            // SAFETY: signalling a pid read from the test's own cgroup.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(_) if !dir.exists() => return,
            Err(e) if Instant::now() > deadline => {
                eprintln!("could not remove {}: {e}", dir.display());
                return;
            }
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}
