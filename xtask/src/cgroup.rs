//! The cgroups xtask's tasks put their loads in: test-support's, named below the cpu
//! controller's root (`--cgroup /<name>`), with a quota; or a [`Tree`] of many under one parent.
use anyhow::{Context as _, Result};
use test_support::{Cgroup, CpuHierarchy};

/// A new cgroup `/<name>` with `quota_us` per `period_us`, removed on drop.
pub fn with_quota(name: &str, quota_us: u64, period_us: u64) -> Result<Cgroup> {
    let cpu = CpuHierarchy::find().map_err(anyhow::Error::msg)?;
    let cgroup = Cgroup::named(&cpu, name);
    cgroup.set_quota(Some(quota_us), period_us);
    Ok(cgroup)
}

/// `count` cgroups with `quota_us` per `period_us` under a parent `/<parent>` without a quota,
/// removed on drop (the children first: fields drop in order).
pub struct Tree {
    pub children: Vec<Cgroup>,
    pub parent: Cgroup,
    cpu: CpuHierarchy,
}

impl Tree {
    pub fn create(parent: &str, count: usize, quota_us: u64, period_us: u64) -> Result<Self> {
        let cpu = CpuHierarchy::find().map_err(anyhow::Error::msg)?;
        // Left over by a run that was killed: its empty children go first, then the parent.
        if let Ok(entries) = std::fs::read_dir(cpu.root.join(parent)) {
            for entry in entries.flatten().filter(|e| e.path().is_dir()) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        let parent = Cgroup::named(&cpu, parent);
        let children = (0..count)
            .map(|i| {
                let child = parent.child(&format!("c{i:04}"));
                child.set_quota(Some(quota_us), period_us);
                child
            })
            .collect();
        Ok(Self {
            children,
            parent,
            cpu,
        })
    }

    /// The least CPU weight for the whole tree: it runs on what other work leaves idle.
    pub fn yield_to_others(&self) {
        self.cpu.yield_to_others(self.parent.dir());
    }

    /// Moves process `pid` back to the hierarchy's root, out of the tree.
    pub fn release(&self, pid: u32) -> Result<()> {
        let procs = self.cpu.root.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("writing {pid} to {}", procs.display()))
    }
}
