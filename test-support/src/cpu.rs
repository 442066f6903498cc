//! The cpu controller's hierarchy, v1 or v2, as the tests read and write it themselves: where
//! it is mounted, how a quota, a burst and a weight are written, and how cpu.stat and
//! cpu.stat.local read, each version in its own files and units. What these files say is the
//! independent truth the tracer is checked against.
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::wait_until;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `cpu.cfs_quota_us`, `cpu.cfs_period_us`, `cpu.cfs_burst_us`, `cpu.shares`; cpu.stat
    /// `throttled_time` in ns.
    V1,
    /// `cpu.max`, `cpu.max.burst`, `cpu.weight`; cpu.stat `throttled_usec` in µs.
    V2,
}

#[derive(Debug, Clone)]
pub struct CpuHierarchy {
    /// Where the hierarchy is mounted: a cgroup's path as the tracer names it is relative to it.
    pub root: PathBuf,
    pub version: Version,
    /// v1: a separate cpuacct hierarchy, where the tracer reads a cgroup's CPU usage
    /// (cpuacct.usage of the same path).
    pub cpuacct: Option<PathBuf>,
}

/// The counters of cpu.stat the tests compare with the tracer's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuStat {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    /// v1 `throttled_time`; v2 `throttled_usec` × 1000 (the kernel truncates to µs).
    pub throttled_ns: u64,
    /// Periods that spent burst (5.16+; `None` before).
    pub nr_bursts: Option<u64>,
    /// v1 `burst_time`; v2 `burst_usec` × 1000 (5.16+; `None` before).
    pub burst_ns: Option<u64>,
}

impl CpuHierarchy {
    /// How far a throttled time read here may be from the kernel's ns: 0 on v1, 1 µs on v2
    /// (`throttled_usec`, truncated).
    pub fn throttled_resolution_ns(&self) -> u64 {
        match self.version {
            Version::V1 => 0,
            Version::V2 => 1_000,
        }
    }

    /// The hierarchy this machine's cpu controller is in, from /proc/self/mountinfo.
    pub fn find() -> Result<Self, String> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        Self::from_mountinfo(&mountinfo)
            .ok_or_else(|| "no cgroup hierarchy with the cpu controller".into())
    }

    /// The v1 mount with the `cpu` super option, else the cgroup2 mount whose
    /// cgroup.controllers lists `cpu` (a v2 hierarchy without it cannot set a quota).
    pub fn from_mountinfo(mountinfo: &str) -> Option<Self> {
        // (mount point, fstype, super options) of each line.
        let mounts: Vec<(PathBuf, &str, &str)> = mountinfo
            .lines()
            .filter_map(|line| {
                let (left, right) = line.split_once(" - ")?;
                let point = PathBuf::from(left.split(' ').nth(4)?);
                let mut right = right.split(' ');
                let fstype = right.next()?;
                Some((point, fstype, right.nth(1)?))
            })
            .collect();
        let v1 = |controller: &str| {
            mounts
                .iter()
                .find(|(_, fstype, options)| {
                    *fstype == "cgroup" && options.split(',').any(|o| o == controller)
                })
                .map(|(point, ..)| point.clone())
        };
        if let Some(root) = v1("cpu") {
            let cpuacct = v1("cpuacct").filter(|dir| *dir != root);
            return Some(Self {
                root,
                version: Version::V1,
                cpuacct,
            });
        }
        mounts
            .iter()
            .find(|(point, fstype, _)| {
                *fstype == "cgroup2"
                    && fs::read_to_string(point.join("cgroup.controllers"))
                        .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
            })
            .map(|(root, ..)| Self {
                root: root.clone(),
                version: Version::V2,
                cpuacct: None,
            })
    }

    /// `quota_us` of CPU time per `period_us` for `dir` (`None`: no limit).
    pub fn set_quota(&self, dir: &Path, quota_us: Option<u64>, period_us: u64) {
        match self.version {
            Version::V1 => {
                // No quota while the period changes: a shorter period with the old quota can
                // exceed the parent's share, and the kernel refuses it.
                write(dir, "cpu.cfs_quota_us", "-1");
                write(dir, "cpu.cfs_period_us", &period_us.to_string());
                let quota = quota_us.map_or("-1".into(), |q| q.to_string());
                write(dir, "cpu.cfs_quota_us", &quota);
            }
            Version::V2 => {
                let quota = quota_us.map_or("max".into(), |q| q.to_string());
                write(dir, "cpu.max", &format!("{quota} {period_us}"));
            }
        }
    }

    /// Writes only the quota of `dir` (`None`: no limit), the period as it is: one write of
    /// the kernel's bandwidth settings (v1 writes period and quota through two files).
    pub fn write_quota(&self, dir: &Path, quota_us: Option<u64>) {
        match self.version {
            Version::V1 => {
                let quota = quota_us.map_or("-1".into(), |q| q.to_string());
                write(dir, "cpu.cfs_quota_us", &quota);
            }
            Version::V2 => {
                let quota = quota_us.map_or("max".into(), |q| q.to_string());
                let period = self.period_us(dir);
                write(dir, "cpu.max", &format!("{quota} {period}"));
            }
        }
    }

    /// The period of `dir`'s quota, in µs.
    pub fn period_us(&self, dir: &Path) -> u64 {
        let (file, text) = match self.version {
            Version::V1 => ("cpu.cfs_period_us", read(dir, "cpu.cfs_period_us")),
            // "max 100000" or "20000 100000".
            Version::V2 => ("cpu.max", read(dir, "cpu.max")),
        };
        text.split_whitespace()
            .last()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no period in {file}: {text:?}"))
    }

    /// Runtime `dir` may carry over from idle periods, in µs (5.14+).
    pub fn set_burst(&self, dir: &Path, burst_us: u64) {
        let file = match self.version {
            Version::V1 => "cpu.cfs_burst_us",
            Version::V2 => "cpu.max.burst",
        };
        write(dir, file, &burst_us.to_string());
    }

    /// Whether the kernel lets `dir` carry runtime over (`cpu.cfs_burst_us` / `cpu.max.burst`,
    /// 5.14+); `Err` says it does not.
    pub fn has_burst(&self, dir: &Path) -> Result<(), String> {
        let file = match self.version {
            Version::V1 => "cpu.cfs_burst_us",
            Version::V2 => "cpu.max.burst",
        };
        if dir.join(file).exists() {
            Ok(())
        } else {
            Err(format!("this kernel has no burst ({file}, 5.14+)"))
        }
    }

    /// The most CPU weight the version allows (v1 cpu.shares 262144, the kernel's MAX_SHARES;
    /// v2 cpu.weight 10000): other runnable work on a CPU then cannot share it with the group
    /// while the group has quota, so its quota is spent in as little wall time as it can be.
    pub fn favour(&self, dir: &Path) {
        match self.version {
            Version::V1 => write(dir, "cpu.shares", "262144"),
            Version::V2 => write(dir, "cpu.weight", "10000"),
        }
    }

    /// The least CPU weight the version allows (v1 cpu.shares 2, v2 cpu.weight 1): the group
    /// runs on what the machine's other work leaves idle.
    pub fn yield_to_others(&self, dir: &Path) {
        match self.version {
            Version::V1 => write(dir, "cpu.shares", "2"),
            Version::V2 => write(dir, "cpu.weight", "1"),
        }
    }

    /// Gives `dir`'s children the cpu controller's files: v2 only does that for controllers
    /// its cgroup.subtree_control enables; in v1 every cgroup of the hierarchy has them.
    pub fn enable_in_children(&self, dir: &Path) {
        if self.version == Version::V2 {
            write(dir, "cgroup.subtree_control", "+cpu");
        }
    }

    /// Waits until `dir`'s period timer has gone idle (cpu.stat nr_periods unchanged for two
    /// periods). The kernel stops that timer only when none of the group's CPUs is throttled:
    /// every stop has then ended at a refill and is counted in cpu.stat.
    pub fn wait_refilled(&self, dir: &Path) {
        let quiet = Duration::from_micros(2 * self.period_us(dir));
        let mut last = (self.stat(dir).nr_periods, Instant::now());
        let what = format!(
            "{}'s period timer going idle (cpu.stat nr_periods unchanged for {quiet:?})",
            dir.display()
        );
        wait_until(Duration::from_secs(10), &what, || {
            let periods = self.stat(dir).nr_periods;
            if periods != last.0 {
                last = (periods, Instant::now());
            }
            last.1.elapsed() >= quiet
        });
    }

    /// `dir`'s cpu.stat.
    pub fn stat(&self, dir: &Path) -> CpuStat {
        let text = read(dir, "cpu.stat");
        let required = |name| field(&text, name).unwrap_or_else(|| panic!("cpu.stat: no {name}"));
        CpuStat {
            nr_periods: required("nr_periods"),
            nr_throttled: required("nr_throttled"),
            throttled_ns: self.throttled_ns(&text, "cpu.stat"),
            nr_bursts: field(&text, "nr_bursts"),
            burst_ns: match self.version {
                Version::V1 => field(&text, "burst_time"),
                Version::V2 => field(&text, "burst_usec").map(|us| us * 1_000),
            },
        }
    }

    /// cpu.stat.local's throttled time of `dir` (6.6+), in ns: the time its own cfs_rqs were
    /// stopped, by its own quota or an ancestor's.
    pub fn local_throttled_ns(&self, dir: &Path) -> u64 {
        self.throttled_ns(&read(dir, "cpu.stat.local"), "cpu.stat.local")
    }

    /// Whether the kernel has cpu.stat.local (6.6+).
    pub fn has_local(&self, dir: &Path) -> bool {
        dir.join("cpu.stat.local").exists()
    }

    /// The file of `dir`'s CPU usage counter: v2 cpu.stat (`usage_usec`); v1 `cpuacct.usage`
    /// (ns) in `cpuacct_dir`, the same cgroup in the cpuacct hierarchy.
    pub fn usage_file(&self, dir: &Path, cpuacct_dir: &Path) -> PathBuf {
        match self.version {
            Version::V1 => cpuacct_dir.join("cpuacct.usage"),
            Version::V2 => dir.join("cpu.stat"),
        }
    }

    /// CPU time used by `dir`'s tasks, ns, from [`CpuHierarchy::usage_file`].
    pub fn usage_ns(&self, dir: &Path, cpuacct_dir: &Path) -> u64 {
        let file = self.usage_file(dir, cpuacct_dir);
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        match self.version {
            Version::V1 => text
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{}: {e}", file.display())),
            Version::V2 => {
                field(&text, "usage_usec").unwrap_or_else(|| panic!("cpu.stat: no usage_usec"))
                    * 1_000
            }
        }
    }

    fn throttled_ns(&self, text: &str, file: &str) -> u64 {
        let (name, scale) = match self.version {
            Version::V1 => ("throttled_time", 1),
            Version::V2 => ("throttled_usec", 1_000),
        };
        field(text, name).unwrap_or_else(|| panic!("{file}: no {name} in {text:?}")) * scale
    }
}

/// `name`'s value in a flat-keyed file's text (`name value` lines).
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn read(dir: &Path, file: &str) -> String {
    fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.join(file).display()))
}

fn write(dir: &Path, file: &str, value: &str) {
    fs::write(dir.join(file), value)
        .unwrap_or_else(|e| panic!("write {value} to {}: {e}", dir.join(file).display()));
}
