//! The host tests' own reading and writing of the cpu controller's files (test-support), for
//! both cgroup versions, against a temporary directory: this host's cpu controller is v1, so
//! the v2 formats are checked here before a v2 guest relies on them. The expected texts are
//! what the kernel's files hold (kernel-facts: v2 cpu.stat in µs, truncated; v1 in ns).
use test_support as common;

use std::{fs, path::Path};

use common::{Cgroup, CpuHierarchy, CpuStat, Version};

/// This host's mounts: the cpu controller in v1, a separate cpuacct, v2 without cpu.
const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

fn at(version: Version) -> (tempfile::TempDir, CpuHierarchy) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let cpu = CpuHierarchy {
        root: dir.path().to_owned(),
        version,
        cpuacct: None,
    };
    (dir, cpu)
}

fn text(dir: &Path, file: &str) -> String {
    fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn a_hybrid_host_uses_the_v1_cpu_mount_and_its_separate_cpuacct() {
    let cpu = CpuHierarchy::from_mountinfo(HYBRID).expect("a cpu hierarchy");
    assert_eq!(cpu.version, Version::V1);
    assert_eq!(cpu.root, Path::new("/sys/fs/cgroup/cpu"));
    assert_eq!(
        cpu.cpuacct.as_deref(),
        Some(Path::new("/sys/fs/cgroup/cpuacct"))
    );
}

#[test]
fn a_v1_mount_of_cpu_and_cpuacct_together_has_no_separate_cpuacct() {
    let mountinfo = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
    let cpu = CpuHierarchy::from_mountinfo(mountinfo).expect("a cpu hierarchy");
    assert_eq!(cpu.root, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
    assert_eq!(cpu.cpuacct, None);
}

#[test]
fn a_v2_host_uses_the_cgroup2_mount_that_lists_cpu() {
    let root = tempfile::tempdir().unwrap();
    let mountinfo = format!(
        "29 23 0:26 / {} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
        root.path().display()
    );
    // A v2 root without the cpu controller (this host's /sys/fs/cgroup/unified) cannot set a
    // quota.
    fs::write(
        root.path().join("cgroup.controllers"),
        "cpuset io memory pids\n",
    )
    .unwrap();
    assert!(CpuHierarchy::from_mountinfo(&mountinfo).is_none());
    fs::write(
        root.path().join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    )
    .unwrap();
    let cpu = CpuHierarchy::from_mountinfo(&mountinfo).expect("a cpu hierarchy");
    assert_eq!(cpu.version, Version::V2);
    assert_eq!(cpu.root, root.path());
    assert_eq!(cpu.cpuacct, None);
}

#[test]
fn v2_quota_burst_and_weight_are_cpu_max_files() {
    let (dir, cpu) = at(Version::V2);
    let d = dir.path();
    cpu.set_quota(d, Some(20_000), 100_000);
    assert_eq!(text(d, "cpu.max"), "20000 100000");
    assert_eq!(cpu.period_us(d), 100_000);
    cpu.set_quota(d, None, 50_000);
    assert_eq!(text(d, "cpu.max"), "max 50000");
    assert_eq!(cpu.period_us(d), 50_000);
    cpu.set_burst(d, 5_000);
    assert_eq!(text(d, "cpu.max.burst"), "5000");
    cpu.favour(d);
    assert_eq!(text(d, "cpu.weight"), "10000");
    cpu.enable_in_children(d);
    assert_eq!(text(d, "cgroup.subtree_control"), "+cpu");
}

#[test]
fn v2_cpu_stat_is_in_microseconds() {
    let (dir, cpu) = at(Version::V2);
    let d = dir.path();
    fs::write(
        d.join("cpu.stat"),
        "usage_usec 1234567\nuser_usec 1200000\nsystem_usec 34567\n\
         core_sched.force_idle_usec 0\nnr_periods 21\nnr_throttled 20\n\
         throttled_usec 1600123\nnr_bursts 3\nburst_usec 4567\n",
    )
    .unwrap();
    assert_eq!(
        cpu.stat(d),
        CpuStat {
            nr_periods: 21,
            nr_throttled: 20,
            throttled_ns: 1_600_123_000,
            nr_bursts: Some(3),
            burst_ns: Some(4_567_000),
        }
    );
    fs::write(d.join("cpu.stat.local"), "throttled_usec 42\n").unwrap();
    assert_eq!(cpu.local_throttled_ns(d), 42_000);
}

#[test]
fn v1_quota_burst_and_weight_are_cfs_files() {
    let (dir, cpu) = at(Version::V1);
    let d = dir.path();
    cpu.set_quota(d, Some(20_000), 100_000);
    assert_eq!(text(d, "cpu.cfs_period_us"), "100000");
    assert_eq!(text(d, "cpu.cfs_quota_us"), "20000");
    assert_eq!(cpu.period_us(d), 100_000);
    cpu.set_quota(d, None, 50_000);
    assert_eq!(text(d, "cpu.cfs_quota_us"), "-1");
    cpu.set_burst(d, 5_000);
    assert_eq!(text(d, "cpu.cfs_burst_us"), "5000");
    cpu.favour(d);
    assert_eq!(text(d, "cpu.shares"), "262144");
    // Every v1 cgroup has the controller's files: nothing to enable.
    cpu.enable_in_children(d);
    assert!(!d.join("cgroup.subtree_control").exists());
}

#[test]
fn v1_cpu_stat_is_in_nanoseconds() {
    let (dir, cpu) = at(Version::V1);
    let d = dir.path();
    fs::write(
        d.join("cpu.stat"),
        "nr_periods 21\nnr_throttled 20\nthrottled_time 1600123456\nnr_bursts 3\nburst_time 4567\n",
    )
    .unwrap();
    assert_eq!(
        cpu.stat(d),
        CpuStat {
            nr_periods: 21,
            nr_throttled: 20,
            throttled_ns: 1_600_123_456,
            nr_bursts: Some(3),
            burst_ns: Some(4567),
        }
    );
    fs::write(d.join("cpu.stat.local"), "throttled_time 42\n").unwrap();
    assert_eq!(cpu.local_throttled_ns(d), 42);
}

#[test]
fn a_cgroup_is_named_by_its_path_below_the_root() {
    let (dir, cpu) = at(Version::V2);
    // Not created, so the guard has nothing to remove.
    let cgroup = Cgroup::adopt(&cpu, dir.path().join("kubepods.slice/pod-1"));
    assert_eq!(cgroup.path(), "/kubepods.slice/pod-1");
    assert_eq!(
        cgroup.procs_files().collect::<Vec<_>>(),
        [dir.path().join("kubepods.slice/pod-1/cgroup.procs")]
    );
}
