//! The cgroups xtask's tasks put their loads in: test-support's, named below the cpu
//! controller's root (`--cgroup /<name>`), with a quota.
use anyhow::Result;
use test_support::{Cgroup, CpuHierarchy};

/// A new cgroup `/<name>` with `quota_us` per `period_us`, removed on drop.
pub fn with_quota(name: &str, quota_us: u64, period_us: u64) -> Result<Cgroup> {
    let cpu = CpuHierarchy::find().map_err(anyhow::Error::msg)?;
    let cgroup = Cgroup::named(&cpu, name);
    cgroup.set_quota(Some(quota_us), period_us);
    Ok(cgroup)
}
