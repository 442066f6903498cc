//! The sampler: every read of a cgroup's own files (cpu.stat and cpu.stat.local, v1
//! `cpuacct.usage`, the quota settings) is made here ([`cpustat`] knows their formats), and the
//! reports get what it read ([`Sample`], [`Snapshot`]) and do no I/O. During a trace the reads run
//! on tokio's blocking threads ([`Sampler::read`]), so that a slow cgroupfs never holds up the
//! draining of the ring buffer; the baseline and the final reading are taken on the calling thread
//! ([`Sampler::read_now`]), since nothing is drained then.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cgroups::{self, Hierarchy, Version};
use crate::cpustat::{self, CpuStat, CpuStatError};
use crate::records::{self, Bandwidth};

/// A cgroup to read: its id, its path under the cpu hierarchy, and which of its files.
#[derive(Clone, Debug)]
pub struct Target {
    pub id: u64,
    pub path: String,
    pub files: Files,
}

/// Which of a cgroup's files a read takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Files {
    /// cpu.stat and cpu.stat.local, the usage and the bandwidth settings.
    All,
    /// cpu.stat alone (the exporter's mirror): one file, where [`Files::All`] opens up to six.
    CpuStat,
}

/// One cgroup's files at one moment; each `None` where the file could not be read (the cgroup
/// is gone, the v2 root has no cpu.max, ...). A directory at the cgroup's path that is not the
/// cgroup (its id, the inode, differs: the path was made again after a removal) is not read:
/// its files are another cgroup's, which a delta against this one's baseline would mix up.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub at: Instant,
    pub stat: Option<CpuStat>,
    /// CPU time used, ns: v2 `cpu.stat` usage_usec (also of a cgroup without the cpu
    /// controller, whose `stat` is `None`), v1 `cpuacct.usage` of the same path in the cpuacct
    /// hierarchy (the cpu hierarchy's own directory when they are co-mounted).
    pub usage_ns: Option<u64>,
    pub settings: Option<Bandwidth>,
    /// Its directory exists and is still this cgroup (a cgroup can exist and still not be
    /// readable).
    pub exists: bool,
    /// Its cpu.stat or its bandwidth files could not be read for want of permission.
    pub denied: bool,
}

/// Samples of several cgroups, by id; a cgroup absent from it was not asked for, or had no
/// path then.
pub type Snapshot = HashMap<u64, Sample>;

/// Where to read.
#[derive(Clone, Debug)]
pub struct Sampler {
    root: PathBuf,
    version: Version,
    /// cgroup v1: the cpuacct hierarchy's mount; `None`: the cgroup's own directory.
    cpuacct: Option<PathBuf>,
}

impl Sampler {
    /// Reads the cgroups of `hierarchy`, and on v1 the cpuacct hierarchy this host mounts.
    pub fn of(hierarchy: &Hierarchy) -> Self {
        let cpuacct = match hierarchy.version() {
            Version::V1 => cgroups::v1_mount_of("cpuacct"),
            Version::V2 => None,
        };
        Self::at(hierarchy, cpuacct)
    }

    pub fn at(hierarchy: &Hierarchy, cpuacct: Option<PathBuf>) -> Self {
        Self {
            root: hierarchy.root().to_owned(),
            version: hierarchy.version(),
            cpuacct,
        }
    }

    /// The targets for `ids`, those that have a path now.
    pub fn targets(hierarchy: &mut Hierarchy, ids: impl IntoIterator<Item = u64>) -> Vec<Target> {
        ids.into_iter()
            .filter_map(|id| {
                let path = hierarchy.path_of(id)?.to_owned();
                Some(Target {
                    id,
                    path,
                    files: Files::All,
                })
            })
            .collect()
    }

    /// Every cgroup of the hierarchy now.
    pub fn all(hierarchy: &mut Hierarchy) -> Vec<Target> {
        hierarchy
            .all()
            .map(|(id, path)| Target {
                id,
                path: path.to_owned(),
                files: Files::All,
            })
            .collect()
    }

    /// Reads `targets` on this thread.
    pub fn read_now(&self, targets: &[Target]) -> Snapshot {
        targets.iter().map(|t| (t.id, self.sample(t))).collect()
    }

    /// Reads `targets` on a blocking thread; the caller's task goes on meanwhile.
    pub async fn read(&self, targets: Vec<Target>) -> Snapshot {
        let sampler = self.clone();
        // A failed blocking task (it cannot panic: every read error is a `None`) reads as
        // nothing read.
        tokio::task::spawn_blocking(move || sampler.read_now(&targets))
            .await
            .unwrap_or_default()
    }

    /// Reads `target`'s files, if its directory is still that cgroup before and after: ids
    /// (kernfs inode numbers) are never reused within a hierarchy (docs/definitions.md,
    /// "gone"), so the same inode at both ends means the files read were its own.
    fn sample(&self, target: &Target) -> Sample {
        let relative = target.path.trim_start_matches('/');
        let dir = self.root.join(relative);
        let is_target = || fs::metadata(&dir).is_ok_and(|m| m.is_dir() && m.ino() == target.id);
        if !is_target() {
            return Sample::absent();
        }
        if target.files == Files::CpuStat {
            let stat = CpuStat::read_counters(&dir, self.version);
            if !is_target() {
                return Sample::absent();
            }
            return Sample {
                at: Instant::now(),
                denied: stat.as_ref().err().is_some_and(CpuStatError::is_denied),
                stat: stat.ok(),
                usage_ns: None,
                settings: None,
                exists: true,
            };
        }
        let stat = CpuStat::read(&dir, self.version);
        let usage_ns = match self.version {
            Version::V2 => stat
                .as_ref()
                .ok()
                .and_then(|s| s.usage_ns)
                .or_else(|| cpustat::read_v2_usage(&dir).ok()),
            Version::V1 => match &self.cpuacct {
                Some(root) => cpuacct_usage(&root.join(relative)),
                None => cpuacct_usage(&dir),
            },
        };
        let settings = cpustat::read_bandwidth(&dir, self.version);
        if !is_target() {
            return Sample::absent();
        }
        let denied = stat.as_ref().err().is_some_and(CpuStatError::is_denied)
            || settings.as_ref().err().is_some_and(CpuStatError::is_denied);
        Sample {
            at: Instant::now(),
            stat: stat.ok(),
            usage_ns,
            settings: settings.ok(),
            exists: true,
            denied,
        }
    }
}

impl Sample {
    /// A cgroup whose directory is gone (or is another cgroup's now).
    fn absent() -> Self {
        Self {
            at: Instant::now(),
            stat: None,
            usage_ns: None,
            settings: None,
            exists: false,
            denied: false,
        }
    }

    /// What the counters did from `before`, an earlier sample of the same cgroup, to this one.
    pub fn since(&self, before: &Sample) -> Change {
        Change {
            stat: (self.stat.as_ref())
                .zip(before.stat.as_ref())
                .and_then(|(after, before)| after.since(before).ok()),
            usage_ns: (self.usage_ns)
                .zip(before.usage_ns)
                .and_then(|(after, before)| after.checked_sub(before)),
            span: self.at.saturating_duration_since(before.at),
        }
    }
}

/// The difference of two samples of one cgroup: counters the kernel reset or could not give
/// either time are `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub stat: Option<CpuStat>,
    pub usage_ns: Option<u64>,
    pub span: Duration,
}

/// v1 `cpuacct.usage` (ns) in the cgroup directory `dir` of the cpuacct hierarchy.
fn cpuacct_usage(dir: &Path) -> Option<u64> {
    fs::read_to_string(dir.join("cpuacct.usage"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// cpu.stat of every cgroup at the start of the trace, so the end can report deltas for
/// whichever cgroups turn out to stop; with, for each cgroup, the CLOCK_MONOTONIC span its
/// reading took, so that the trace can tell the stops the reading already holds from those it
/// does not (`opening`).
#[derive(Debug, Default)]
pub struct Baseline {
    samples: Snapshot,
    /// Cgroup id → (ns before its cpu.stat was read, ns after).
    read_ns: HashMap<u64, (u64, u64)>,
}

impl Baseline {
    /// Every cgroup of the hierarchy (one walk; a few ms for thousands of cgroups).
    pub fn take(sampler: &Sampler, hierarchy: &mut Hierarchy) -> Self {
        let mut baseline = Self::default();
        baseline.read(sampler, &Sampler::all(hierarchy));
        baseline
    }

    /// Reads `targets` (again), each stamped with the span its reading took.
    pub fn read(&mut self, sampler: &Sampler, targets: &[Target]) {
        for t in targets {
            let before = records::monotonic_now_ns();
            let sample = sampler.sample(t);
            self.read_ns
                .insert(t.id, (before, records::monotonic_now_ns()));
            self.samples.insert(t.id, sample);
        }
    }

    /// When cgroup `id`'s reading began and ended (CLOCK_MONOTONIC ns); `None` if it was not
    /// read (created later: its counters start at zero, after any record of it).
    pub fn read_ns(&self, id: u64) -> Option<(u64, u64)> {
        self.read_ns.get(&id).copied()
    }

    #[cfg(test)]
    pub fn set_read_ns(&mut self, id: u64, from: u64, to: u64) {
        self.read_ns.insert(id, (from, to));
    }

    /// The end of the last reading, CLOCK_MONOTONIC ns (0 when nothing was read).
    pub fn read_until_ns(&self) -> u64 {
        self.read_ns
            .values()
            .map(|&(_, end)| end)
            .max()
            .unwrap_or(0)
    }

    /// What cgroup `id` did between the baseline and `now` (its end reading). A cgroup
    /// created after the baseline is diffed against zero, where the kernel started its
    /// counters.
    pub fn delta(&self, id: u64, now: &CpuStat) -> Result<CpuStat, CpuStatError> {
        match self.samples.get(&id).map(|s| &s.stat) {
            Some(Some(start)) => now.since(start),
            Some(None) => Err(CpuStatError::NoBaseline),
            None => now.since(&CpuStat::zero(now.unit)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 tree with /demo: cpu.stat, quota files and (co-mounted) cpuacct.usage.
    fn tree() -> (tempfile::TempDir, Hierarchy, u64) {
        let dir = tempfile::tempdir().unwrap();
        let demo = dir.path().join("demo");
        std::fs::create_dir(&demo).unwrap();
        for (file, text) in [
            (
                "cpu.stat",
                "nr_periods 3\nnr_throttled 2\nthrottled_time 9\n",
            ),
            ("cpu.cfs_quota_us", "20000\n"),
            ("cpu.cfs_period_us", "100000\n"),
            ("cpuacct.usage", "123456\n"),
        ] {
            std::fs::write(demo.join(file), text).unwrap();
        }
        let h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let id = h.id_of("/demo").unwrap();
        (dir, h, id)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn samples_hold_what_the_files_say_read_off_the_callers_thread() {
        let (_dir, mut h, id) = tree();
        let sampler = Sampler::at(&h, None);
        let targets = Sampler::targets(&mut h, [id, u64::MAX]);
        assert_eq!(targets.len(), 1, "an id without a path is not a target");
        let snapshot = sampler.read(targets).await;
        let s = &snapshot[&id];
        let stat = s.stat.as_ref().unwrap();
        assert_eq!(
            (stat.nr_periods, stat.nr_throttled, stat.throttled_ns),
            (3, 2, 9)
        );
        assert_eq!(s.usage_ns, Some(123_456));
        assert_eq!(s.settings.unwrap().quota_ns, Some(20_000_000));
    }

    #[test]
    fn a_cpu_stat_read_takes_that_file_alone() {
        let (_dir, mut h, id) = tree();
        let sampler = Sampler::at(&h, None);
        let mut targets = Sampler::targets(&mut h, [id]);
        targets[0].files = Files::CpuStat;
        let s = &sampler.read_now(&targets)[&id];
        assert!(s.exists);
        assert_eq!(s.stat.as_ref().unwrap().nr_throttled, 2);
        assert_eq!((s.usage_ns, s.settings), (None, None));
    }

    #[test]
    fn a_missing_cgroup_samples_as_nothing_and_deltas_follow_the_baseline() {
        let (dir, mut h, id) = tree();
        let sampler = Sampler::at(&h, None);
        let baseline = Baseline::take(&sampler, &mut h);
        std::fs::write(
            dir.path().join("demo/cpu.stat"),
            "nr_periods 5\nnr_throttled 3\nthrottled_time 20\n",
        )
        .unwrap();
        let end = sampler.read_now(&Sampler::targets(&mut h, [id]));
        let d = baseline.delta(id, end[&id].stat.as_ref().unwrap()).unwrap();
        assert_eq!((d.nr_periods, d.nr_throttled, d.throttled_ns), (2, 1, 11));
        // Created after the baseline: against zero.
        let later = baseline
            .delta(id + 1, end[&id].stat.as_ref().unwrap())
            .unwrap();
        assert_eq!(later.nr_periods, 5);

        let gone = sampler.read_now(&[Target {
            id: 7,
            path: "/gone".into(),
            files: Files::All,
        }]);
        assert_eq!((&gone[&7].stat, gone[&7].usage_ns), (&None, None));
        assert_eq!(gone[&7].settings, None);
    }

    #[test]
    fn a_path_made_again_is_another_cgroup_and_not_read_for_the_old_one() {
        let (dir, mut h, id) = tree();
        let sampler = Sampler::at(&h, None);
        let targets = Sampler::targets(&mut h, [id]);
        // The old directory is kept (renamed) while the new one is made, so the new one
        // cannot get its inode.
        std::fs::rename(dir.path().join("demo"), dir.path().join("old")).unwrap();
        std::fs::create_dir(dir.path().join("demo")).unwrap();
        std::fs::write(dir.path().join("demo/cpu.stat"), "nr_periods 1\n").unwrap();
        let end = sampler.read_now(&targets);
        assert_eq!(
            end[&id],
            Sample {
                at: end[&id].at,
                ..Sample::absent()
            }
        );
        let new = h.id_of("/demo").unwrap();
        assert_ne!(new, id);
        assert!(sampler.read_now(&Sampler::all(&mut h))[&new].exists);
    }

    #[test]
    fn this_hosts_cpu_stat_root_and_child() {
        let Ok(mut h) = Hierarchy::discover() else {
            crate::testing::missing("no cgroup hierarchy with the cpu controller here");
            return;
        };
        let version = h.version();
        // The v2 root has no throttling fields; v1's root has them (all zero).
        if version == Version::V1 {
            let root = CpuStat::read(h.root(), version).unwrap();
            assert_eq!(root.unit, crate::cpustat::TimeUnit::Nanos);
            let bw = cpustat::read_bandwidth(h.root(), version).unwrap();
            assert_eq!(bw.quota_ns, None, "the root cgroup is never limited");
        }
        let base = Baseline::take(&Sampler::of(&h), &mut h);
        if version == Version::V1 {
            let root_id = h.id_of("/").unwrap();
            let d = base
                .delta(root_id, &CpuStat::read(h.root(), version).unwrap())
                .unwrap();
            assert_eq!(d.unit, crate::cpustat::TimeUnit::Nanos);
        }
        // A child we create (needs root); else any existing child with the controller.
        let made = tempfile::Builder::new()
            .prefix("throttle-tracer-test-")
            .tempdir_in(h.root())
            .ok();
        let child = match &made {
            Some(d) => d.path().to_owned(),
            None => {
                let found = h
                    .all()
                    .filter(|(_, p)| *p != "/")
                    .map(|(_, p)| p.to_owned())
                    .collect::<Vec<_>>();
                match found
                    .iter()
                    .filter_map(|p| h.dir_of(p).ok())
                    .find(|d| CpuStat::read(d, version).is_ok())
                {
                    Some(d) => d,
                    None => {
                        crate::testing::missing("cannot create a cgroup and none exists");
                        return;
                    }
                }
            }
        };
        let s = CpuStat::read(&child, version).unwrap();
        cpustat::read_bandwidth(&child, version).unwrap();
        if made.is_some() {
            assert_eq!((s.nr_periods, s.nr_throttled, s.throttled_ns), (0, 0, 0));
            // A cgroup created after the baseline diffs against zero.
            let id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&child).unwrap());
            assert_eq!(base.delta(id, &s).unwrap().throttled_ns, 0);
        }
        // cgroupfs removes a cgroup with rmdir, not by deleting its files: let TempDir's
        // recursive removal fail quietly and do it ourselves.
        if let Some(d) = made {
            let path = d.keep();
            std::fs::remove_dir(&path).unwrap();
        }
    }
}
