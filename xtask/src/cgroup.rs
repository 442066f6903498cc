//! Temporary cgroups under the cpu controller's root (v1 `/sys/fs/cgroup/cpu` or v2
//! `/sys/fs/cgroup`), for the host tasks: one with a quota (its bandwidth files, its processes,
//! its cpu.stat), or a [`Tree`] of many under one parent; removed on drop.
use anyhow::{Context as _, Result, bail};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

pub struct Cgroup {
    path: PathBuf,
    /// Its path below the hierarchy's root, as the tracer's `--cgroup` takes it.
    name: String,
    /// cgroup v1 (`cpu.cfs_quota_us`) rather than v2 (`cpu.max`).
    v1: bool,
}

impl Cgroup {
    /// Makes `/<name>` with `quota_us` per `period_us`.
    pub fn create(name: &str, quota_us: u64, period_us: u64) -> Result<Self> {
        let cgroup = Self::make(name)?;
        cgroup.set_quota(quota_us, period_us)?;
        Ok(cgroup)
    }

    /// Makes `/<name>` without a quota (its parent's, if any, applies).
    fn make(name: &str) -> Result<Self> {
        let (root, v1) = root()?;
        let path = root.join(name);
        // Left over by a run that was killed: removable when empty.
        if path.exists() && std::fs::remove_dir(&path).is_err() {
            bail!(
                "{} exists and is in use (another run of this task?)",
                path.display()
            );
        }
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            path,
            name: format!("/{name}"),
            v1,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets the quota and the period (v1: the period first, so that a longer one is never
    /// refused for a quota it would make too large a share of).
    pub fn set_quota(&self, quota_us: u64, period_us: u64) -> Result<()> {
        if self.v1 {
            // A shorter period with the old quota can exceed the parent's share: drop the
            // quota first.
            write(&self.path.join("cpu.cfs_quota_us"), "-1")?;
            write(&self.path.join("cpu.cfs_period_us"), &period_us.to_string())?;
            write(&self.path.join("cpu.cfs_quota_us"), &quota_us.to_string())
        } else {
            write(
                &self.path.join("cpu.max"),
                &format!("{quota_us} {period_us}"),
            )
        }
    }

    /// The most CPU weight the version allows (v1 cpu.shares 262144, v2 cpu.weight 10000):
    /// other runnable work on a CPU then cannot share it with the group while the group has
    /// quota, so a burst of work is spent in as little wall time as it can be, not spread over
    /// more periods by the machine's other load.
    pub fn favour(&self) -> Result<()> {
        if self.v1 {
            write(&self.path.join("cpu.shares"), "262144")
        } else {
            write(&self.path.join("cpu.weight"), "10000")
        }
    }

    /// The least CPU weight the version allows (v1 cpu.shares 2, v2 cpu.weight 1): the group
    /// runs on what the machine's other work leaves idle.
    pub fn yield_to_others(&self) -> Result<()> {
        if self.v1 {
            write(&self.path.join("cpu.shares"), "2")
        } else {
            write(&self.path.join("cpu.weight"), "1")
        }
    }

    /// Sets the burst (5.14+; the kernel refuses one above the quota).
    pub fn set_burst(&self, burst_us: u64) -> Result<()> {
        let file = if self.v1 {
            "cpu.cfs_burst_us"
        } else {
            "cpu.max.burst"
        };
        write(&self.path.join(file), &burst_us.to_string())
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) -> Result<()> {
        write(&self.path.join("cgroup.procs"), &pid.to_string())
    }

    /// A counter of `cpu.stat`.
    pub fn stat(&self, key: &str) -> Result<u64> {
        let file = self.path.join("cpu.stat");
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
            .with_context(|| format!("no {key} in {} ({})", file.display(), self.version()))
    }

    /// cpu.stat's throttled time in ns (v1 `throttled_time`, v2 `throttled_usec` × 1000).
    pub fn throttled_ns(&self) -> Result<u64> {
        if self.v1 {
            self.stat("throttled_time")
        } else {
            Ok(self.stat("throttled_usec")? * 1000)
        }
    }

    pub fn version(&self) -> &'static str {
        if self.v1 { "v1" } else { "v2" }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its processes (ours) are killed and reaped before; the kernel may still be tearing
        // the tasks down for a moment.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!("xtask: could not remove {}", self.path.display());
    }
}

/// The cpu controller's root, and whether it is cgroup v1; on v2, the controller enabled for
/// the root's children.
fn root() -> Result<(&'static Path, bool)> {
    let v1_root = Path::new("/sys/fs/cgroup/cpu");
    let v2_root = Path::new("/sys/fs/cgroup");
    if v1_root.join("cpu.cfs_quota_us").exists() {
        return Ok((v1_root, true));
    }
    let controllers =
        std::fs::read_to_string(v2_root.join("cgroup.controllers")).unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == "cpu") {
        bail!("no cpu controller at /sys/fs/cgroup/cpu (v1) or /sys/fs/cgroup (v2)");
    }
    write(&v2_root.join("cgroup.subtree_control"), "+cpu")?;
    Ok((v2_root, false))
}

/// `/<parent>/cNNNN`, `count` cgroups with the same quota under one parent without a quota;
/// all removed on drop (the children first).
pub struct Tree {
    pub children: Vec<Cgroup>,
    pub parent: Cgroup,
}

impl Tree {
    pub fn create(parent: &str, count: usize, quota_us: u64, period_us: u64) -> Result<Self> {
        let (root, _) = root()?;
        // Left over by a run that was killed: its empty children go first, then the parent.
        if let Ok(entries) = std::fs::read_dir(root.join(parent)) {
            for entry in entries.flatten().filter(|e| e.path().is_dir()) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        let parent = Cgroup::make(parent)?;
        if !parent.v1 {
            write(&parent.path.join("cgroup.subtree_control"), "+cpu")?;
        }
        let children = (0..count)
            .map(|i| {
                Cgroup::create(
                    &format!("{}/c{i:04}", parent.name.trim_start_matches('/')),
                    quota_us,
                    period_us,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { children, parent })
    }

    /// Moves process `pid` back to the hierarchy's root, out of the tree.
    pub fn release(&self, pid: u32) -> Result<()> {
        write(&root()?.0.join("cgroup.procs"), &pid.to_string())
    }
}

pub fn write(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).with_context(|| format!("writing {value} to {}", path.display()))
}
