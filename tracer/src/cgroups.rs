//! The cgroup hierarchy that holds the cpu controller: where it is mounted, which version it is,
//! and cgroup id <-> path. An id is the inode number of the cgroup's directory in that hierarchy,
//! what the kernel sends as `kn->id` (docs/prometheus.md, "Cgroup ids and paths"); on cgroup v1
//! only the hierarchy the cpu controller is bound to has these ids. Paths are as seen under the
//! hierarchy's mount, with a leading slash; `/` is the root cgroup.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::{FastMap, records};

/// How often a miss in [`Hierarchy::path_of`] for an id that is not newer than the last walk
/// may re-walk the tree: ids that never resolve (removed cgroups, ids of no cgroup of this
/// hierarchy) must not turn every lookup into a walk. A newer id is walked for at once.
const REWALK_INTERVAL: Duration = Duration::from_secs(1);

/// Removed cgroups whose paths are kept: their last records may still come, and a long run
/// with cgroups made and removed all the time must not keep every path it ever saw.
const REMOVED_KEPT: usize = 4096;

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// cgroup v1: `cpu.cfs_quota_us`, `cpu.stat` times in ns.
    V1,
    /// cgroup v2: `cpu.max`, `cpu.stat` times in µs.
    V2,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error(
        "no mounted cgroup hierarchy has the cpu controller (looked for a cgroup v1 mount with the \
         `cpu` option and a cgroup2 mount whose cgroup.controllers lists `cpu`)"
    )]
    NoCpuController,
    #[error("no cgroup {path} in the cpu hierarchy at {}", root.display())]
    NoSuchCgroup { path: String, root: PathBuf },
    #[error("{0:?} is not a cgroup path: it must start with `/` and not contain `..`")]
    BadPath(String),
}

/// One line of /proc/self/mountinfo, the fields this module needs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Mount {
    /// The directory of the filesystem that is mounted (`/` unless a subtree is bind-mounted,
    /// e.g. inside a container).
    root: String,
    mount_point: PathBuf,
    fstype: String,
    super_options: String,
}

/// Parses mountinfo (proc(5)): `id parent maj:min root mount_point opts [optional...] - fstype
/// source super_opts`. Lines that do not have that shape are skipped.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut left = left.split(' ');
            let root = unescape(left.nth(3)?);
            let mount_point = PathBuf::from(unescape(left.next()?));
            let mut right = right.split(' ');
            let fstype = right.next()?.to_owned();
            let super_options = right.nth(1)?.to_owned();
            Some(Mount {
                root,
                mount_point,
                fstype,
                super_options,
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount of the hierarchy with the cpu controller. A controller is bound to exactly one
/// hierarchy, so at most one of the v1 and v2 candidates really has it; v1 is decided from the
/// mount options alone, v2 needs `cgroup.controllers` at its root. Whole-hierarchy mounts (root
/// `/`) are preferred over bind-mounted subtrees.
fn choose(mounts: &[Mount]) -> Option<(PathBuf, Version)> {
    let mut candidates: Vec<&Mount> = mounts
        .iter()
        .filter(|m| match m.fstype.as_str() {
            "cgroup" => m.super_options.split(',').any(|o| o == "cpu"),
            "cgroup2" => fs::read_to_string(m.mount_point.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu")),
            _ => false,
        })
        .collect();
    candidates.sort_by_key(|m| m.root != "/");
    candidates.first().map(|m| {
        let version = if m.fstype == "cgroup2" {
            Version::V2
        } else {
            Version::V1
        };
        (m.mount_point.clone(), version)
    })
}

/// The mount point of the cgroup v1 hierarchy that has `controller` (e.g. `cpuacct`, which is
/// either co-mounted with cpu or a hierarchy of its own), whole-hierarchy mounts first.
pub fn v1_mount_of(controller: &str) -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut mounts: Vec<Mount> = parse_mountinfo(&text)
        .into_iter()
        .filter(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == controller))
        .collect();
    mounts.sort_by_key(|m| m.root != "/");
    mounts.into_iter().next().map(|m| m.mount_point)
}

/// How the machine mounts cgroups, whichever hierarchy holds the cpu controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Only cgroup v1 hierarchies (systemd's "legacy").
    V1,
    /// Only the cgroup v2 tree ("unified").
    V2,
    /// v1 hierarchies next to a v2 tree ("hybrid").
    Hybrid,
    /// No cgroup filesystem is mounted.
    Unmounted,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
            Self::Hybrid => "hybrid",
            Self::Unmounted => "none",
        }
    }
}

/// The cgroup mode of this machine, from /proc/self/mountinfo.
pub fn mode() -> Result<Mode, CgroupError> {
    let path = Path::new("/proc/self/mountinfo");
    let text = fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(mode_of(&parse_mountinfo(&text)))
}

pub(crate) fn mode_of(mounts: &[Mount]) -> Mode {
    let v1 = mounts.iter().any(|m| m.fstype == "cgroup");
    let v2 = mounts.iter().any(|m| m.fstype == "cgroup2");
    match (v1, v2) {
        (true, true) => Mode::Hybrid,
        (true, false) => Mode::V1,
        (false, true) => Mode::V2,
        (false, false) => Mode::Unmounted,
    }
}

/// CLOCK_MONOTONIC as of the last tick (CLOCK_MONOTONIC_COARSE): read without the clock
/// source, a few ns where the precise clock costs tens (a VM's), and behind it by less than a
/// tick, nothing next to [`REWALK_INTERVAL`]. [`Hierarchy::path_of`] reads it at every miss.
fn coarse_now() -> Duration {
    // CLOCK_MONOTONIC_COARSE exists since 2.6.32.
    Duration::from_nanos(tracer_common::clock::clock_ns(libc::CLOCK_MONOTONIC_COARSE))
}

/// The cpu controller's hierarchy and a cache of its cgroups' paths by id.
///
/// A cgroup's id is its kernfs node id, allocated from one counter per hierarchy that only
/// grows (on 64-bit kernels since 5.5 the 32-bit allocator's wraps go into the high bits), so
/// an id above every id the last walk saw or looked for is a cgroup made since: its lookup
/// walks at once. Its first record is read after its directory appeared (a record needs a
/// task or a quota in it), so that walk finds it, and the first line naming it carries its
/// path. Any other miss waits for [`REWALK_INTERVAL`].
#[derive(Debug)]
pub struct Hierarchy {
    root: PathBuf,
    version: Version,
    /// The cgroups present at the last walk.
    paths: FastMap<u64, String>,
    /// Those removed since, the last `REMOVED_KEPT` of them, oldest first in `removed_order`.
    removed: FastMap<u64, String>,
    removed_order: VecDeque<u64>,
    /// Removed cgroups whose paths were dropped to keep the cache bounded.
    forgotten: u64,
    /// When the last walk began, CLOCK_MONOTONIC.
    last_walk: Option<Duration>,
    /// The highest id the walks saw, or were made for: a miss above it is a new cgroup.
    newest: u64,
}

impl Hierarchy {
    /// Finds the hierarchy from /proc/self/mountinfo.
    pub fn discover() -> Result<Self, CgroupError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = fs::read_to_string(path).map_err(|source| CgroupError::Read {
            path: path.to_owned(),
            source,
        })?;
        let (root, version) =
            choose(&parse_mountinfo(&text)).ok_or(CgroupError::NoCpuController)?;
        Ok(Self::at(root, version))
    }

    /// The hierarchy mounted at `root` (tests use a plain directory tree).
    pub(crate) fn at(root: PathBuf, version: Version) -> Self {
        Self {
            root,
            version,
            paths: FastMap::default(),
            removed: FastMap::default(),
            removed_order: VecDeque::new(),
            forgotten: 0,
            last_walk: None,
            newest: 0,
        }
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// The mount point, e.g. `/sys/fs/cgroup/cpu` or `/sys/fs/cgroup`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of the cgroup at `path` (`/` = the root cgroup).
    pub fn dir_of(&self, path: &str) -> Result<PathBuf, CgroupError> {
        let rel = path
            .strip_prefix('/')
            .ok_or_else(|| CgroupError::BadPath(path.to_owned()))?;
        let rel = Path::new(rel);
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(CgroupError::BadPath(path.to_owned()));
        }
        Ok(self.root.join(rel))
    }

    /// The id (directory inode number) of the cgroup at `path`.
    pub fn id_of(&self, path: &str) -> Result<u64, CgroupError> {
        let dir = self.dir_of(path)?;
        match fs::metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(m.ino()),
            Ok(_) => Err(CgroupError::NoSuchCgroup {
                path: path.to_owned(),
                root: self.root.clone(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(CgroupError::NoSuchCgroup {
                path: path.to_owned(),
                root: self.root.clone(),
            }),
            Err(source) => Err(CgroupError::Read { path: dir, source }),
        }
    }

    /// The path of cgroup `id`, re-walking the tree on a miss: at once for an id newer than
    /// the last walk, else at most once per [`REWALK_INTERVAL`]; a removed cgroup keeps the
    /// path it had (while it is among the last `REMOVED_KEPT` removed). `None` for ids that are
    /// not, and were not, directories of this hierarchy.
    pub fn path_of(&mut self, id: u64) -> Option<&str> {
        if !self.paths.contains_key(&id) && !self.removed.contains_key(&id) {
            let stale = self
                .last_walk
                .is_none_or(|t| coarse_now().saturating_sub(t) >= REWALK_INTERVAL);
            if id > self.newest || stale {
                self.walk();
                // It existed before this walk began; not found, it was removed (or is no
                // cgroup here), and walking again for it at once would not find it either.
                self.newest = self.newest.max(id);
            }
        }
        self.paths
            .get(&id)
            .or_else(|| self.removed.get(&id))
            .map(String::as_str)
    }

    /// Removed cgroups whose paths were forgotten to keep the cache bounded.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// Every cgroup in the hierarchy now (freshly walked): `(id, path)`.
    pub fn all(&mut self) -> impl Iterator<Item = (u64, &str)> {
        self.walk();
        self.paths.iter().map(|(id, p)| (*id, p.as_str()))
    }

    /// Rebuilds the id -> path map. Cgroups come and go while we walk, and some directories may
    /// be unreadable: those are skipped, the rest of the tree is still mapped. Cgroups gone
    /// since the last walk move to the removed ones (the kernel may still send their last
    /// records).
    fn walk(&mut self) {
        self.last_walk = Some(Duration::from_nanos(records::monotonic_now_ns()));
        let mut present = FastMap::default();
        if let Ok(m) = fs::metadata(&self.root) {
            self.newest = self.newest.max(m.ino());
            present.insert(m.ino(), "/".to_owned());
        }
        let mut stack = vec![(self.root.clone(), String::new())];
        while let Some((dir, path)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                // `DirEntry::metadata` is lstat: cgroupfs has no symlinks, and we must not
                // follow one out of the tree if a bind mount put one there.
                let Ok(meta) = entry.metadata() else {
                    continue;
                };
                if !meta.is_dir() {
                    continue;
                }
                let child = format!("{path}/{}", entry.file_name().to_string_lossy());
                self.newest = self.newest.max(meta.ino());
                present.insert(meta.ino(), child.clone());
                stack.push((entry.path(), child));
            }
        }
        for (id, path) in std::mem::replace(&mut self.paths, present) {
            if !self.paths.contains_key(&id) && self.removed.insert(id, path).is_none() {
                self.removed_order.push_back(id);
            }
        }
        while self.removed_order.len() > REMOVED_KEPT {
            if let Some(old) = self.removed_order.pop_front() {
                self.removed.remove(&old);
                self.forgotten += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
36 31 0:33 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
37 31 0:34 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,cpuset
38 31 0:35 / /sys/fs/cgroup/cpuacct rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,cpuacct
";

    /// /proc/self/mountinfo of a container run by containerd 1.6 (`ctr run`) as
    /// deploy/daemonset.yaml says, on this project's cgroup v1 host (trimmed): containerd adds
    /// no cgroup mount of its own, so the host's /sys/fs/cgroup, bind-mounted recursively and
    /// read-only, brings the host's whole hierarchies (root `/`).
    const CONTAINER: &str = "\
68 46 254:0 /run/containerd/rootfs / ro,relatime - ext4 /dev/vda rw
69 68 0:41 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
74 68 0:22 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs rw
76 74 0:28 / /sys/fs/cgroup ro,relatime - tmpfs tmpfs rw,mode=755
77 76 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
78 76 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
79 76 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
85 76 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
86 76 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A runtime that mounts the container's own cgroups (runc's `cgroup` mount: a tmpfs and a
    /// bind of the container's cgroup per hierarchy, root `/docker/<id>`) beneath the host's
    /// tree bind-mounted over them.
    const CONTAINER_OWN_CGROUPS_BENEATH: &str = "\
76 74 0:50 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
77 76 0:29 /docker/3f2a /sys/fs/cgroup/cpu ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu
78 76 0:30 /docker/3f2a /sys/fs/cgroup/cpuacct ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpuacct
90 74 0:28 / /sys/fs/cgroup ro,relatime - tmpfs tmpfs rw,mode=755
91 90 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
92 90 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
";

    #[test]
    fn a_daemonset_container_picks_the_host_s_whole_cpu_hierarchy() {
        let cpu = Some((PathBuf::from("/sys/fs/cgroup/cpu"), Version::V1));
        assert_eq!(choose(&parse_mountinfo(CONTAINER)), cpu);
        assert_eq!(mode_of(&parse_mountinfo(CONTAINER)), Mode::Hybrid);
        let beneath = parse_mountinfo(CONTAINER_OWN_CGROUPS_BENEATH);
        assert_eq!(beneath[1].root, "/docker/3f2a");
        assert_eq!(
            choose(&beneath),
            cpu,
            "the whole hierarchy, not the container's subtree"
        );
    }

    #[test]
    fn mountinfo_fields_and_escapes() {
        let m = parse_mountinfo(
            "40 31 0:37 /kube\\040pods /mnt/my\\040cg rw,relatime - cgroup cgroup rw,cpu\nnot a line\n",
        );
        assert_eq!(
            m,
            vec![Mount {
                root: "/kube pods".into(),
                mount_point: "/mnt/my cg".into(),
                fstype: "cgroup".into(),
                super_options: "rw,cpu".into(),
            }]
        );
        assert_eq!(parse_mountinfo(HYBRID).len(), 7);
    }

    #[test]
    fn mode_from_the_mounted_filesystems() {
        let mounts = parse_mountinfo(HYBRID);
        assert_eq!(mode_of(&mounts), Mode::Hybrid);
        let only = |fstype: &str| -> Vec<Mount> {
            parse_mountinfo(HYBRID)
                .into_iter()
                .filter(|m| m.fstype == fstype)
                .collect()
        };
        assert_eq!(mode_of(&only("cgroup")), Mode::V1);
        assert_eq!(mode_of(&only("cgroup2")), Mode::V2);
        assert_eq!(mode_of(&only("ext4")), Mode::Unmounted);
    }

    #[test]
    fn hybrid_host_picks_the_v1_cpu_mount_not_cpuset_or_cpuacct() {
        // The v2 mount point does not exist here, so it cannot list cpu either.
        assert_eq!(
            choose(&parse_mountinfo(HYBRID)),
            Some((PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"), Version::V1))
        );
    }

    #[test]
    fn pure_v2_needs_cpu_in_cgroup_controllers() {
        let dir = tempfile::tempdir().unwrap();
        let line = format!(
            "30 23 0:27 / {} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
            dir.path().display()
        );
        let mounts = parse_mountinfo(&line);
        assert_eq!(choose(&mounts), None, "no cgroup.controllers file");
        fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset io memory pids\n",
        )
        .unwrap();
        assert_eq!(choose(&mounts), None, "cpuset is not cpu");
        fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        assert_eq!(choose(&mounts), Some((dir.path().to_owned(), Version::V2)));
    }

    #[test]
    fn ids_and_paths_on_a_real_tree() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("demo/child")).unwrap();
        fs::create_dir_all(dir.path().join("system.slice")).unwrap();
        fs::write(dir.path().join("demo/cpu.stat"), "nr_periods 0\n").unwrap();
        let ino = |p: &str| fs::metadata(dir.path().join(p)).unwrap().ino();

        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        assert_eq!(h.id_of("/").unwrap(), ino(""));
        assert_eq!(h.id_of("/demo/child").unwrap(), ino("demo/child"));
        assert!(matches!(
            h.id_of("/nope"),
            Err(CgroupError::NoSuchCgroup { .. })
        ));
        assert!(matches!(
            h.id_of("/demo/cpu.stat"),
            Err(CgroupError::NoSuchCgroup { .. })
        ));
        assert!(matches!(h.id_of("demo"), Err(CgroupError::BadPath(_))));
        assert!(matches!(
            h.id_of("/demo/../.."),
            Err(CgroupError::BadPath(_))
        ));
        let msg = h.id_of("/nope").unwrap_err().to_string();
        assert!(
            msg.contains("/nope") && msg.contains("cpu hierarchy"),
            "{msg}"
        );

        assert_eq!(h.path_of(ino("")), Some("/"));
        assert_eq!(h.path_of(ino("demo/child")), Some("/demo/child"));
        assert_eq!(h.path_of(ino("system.slice")), Some("/system.slice"));
        assert_eq!(h.all().count(), 4);

        assert_eq!(h.path_of(u64::MAX), None);
    }

    /// Plain directories stand in for cgroupfs, whose ids only grow: `newest` is set as if the
    /// ids of the tree were older (or newer) than the directory made after the walk.
    #[test]
    fn a_cgroup_made_after_the_last_walk_resolves_at_its_first_lookup() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("old")).unwrap();
        let ino = |p: &str| fs::metadata(dir.path().join(p)).unwrap().ino();
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        assert_eq!(h.path_of(ino("old")), Some("/old"));
        let walked = h.last_walk;

        // Made within the re-walk interval of the last walk, with an id above every id walked:
        // the serve of issue 11 labelled such a container's stops `id:<n>` for good.
        fs::create_dir(dir.path().join("new")).unwrap();
        let new = ino("new");
        h.newest = new - 1;
        assert_eq!(h.path_of(new), Some("/new"), "a new id walks at once");
        assert_ne!(h.last_walk, walked);

        // An id the walks already covered (seen, or looked for and not found) waits for the
        // interval: removed cgroups and ids of no cgroup here do not walk at every lookup.
        let gone = h.newest + 1_000;
        assert_eq!(h.path_of(gone), None, "walked for, not there");
        assert_eq!(h.newest, gone);
        let walked = h.last_walk;
        assert_eq!(h.path_of(gone), None);
        assert_eq!(
            h.last_walk, walked,
            "no second walk for the same missing id"
        );
        fs::create_dir(dir.path().join("late")).unwrap();
        let late = ino("late");
        // As if a walk had seen a newer id (another cgroup made after it, by a race).
        h.newest = h.newest.max(late);
        assert_eq!(
            h.path_of(late),
            None,
            "not newer, walked less than a second ago"
        );
        h.last_walk = Some(Duration::ZERO);
        assert_eq!(
            h.path_of(late),
            Some("/late"),
            "found once the interval has passed"
        );
        assert_eq!(h.path_of(u64::MAX), None);

        // Removed, it keeps its path, and is no longer among the present ones.
        fs::remove_dir(dir.path().join("late")).unwrap();
        h.walk();
        assert_eq!(h.path_of(late), Some("/late"));
        // The root, /old and /new.
        assert_eq!(h.all().count(), 3);
        assert_eq!(h.forgotten(), 0);
    }

    #[test]
    fn the_paths_of_removed_cgroups_are_bounded_and_their_eviction_counted() {
        let dir = tempfile::tempdir().unwrap();
        // "Removed" by a move out of the tree: the inode stays taken, so no later directory
        // gets it (cgroupfs never reuses one; a disk filesystem would).
        let out = tempfile::tempdir().unwrap();
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let mut ids = Vec::new();
        for i in 0..=REMOVED_KEPT {
            let d = dir.path().join(format!("c{i}"));
            fs::create_dir(&d).unwrap();
            ids.push(h.id_of(&format!("/c{i}")).unwrap());
            h.walk();
            fs::rename(&d, out.path().join(format!("c{i}"))).unwrap();
        }
        h.walk();
        assert_eq!(h.forgotten(), 1);
        assert_eq!(h.removed.len(), REMOVED_KEPT);
        assert_eq!(h.path_of(ids[0]), None, "the oldest removed is forgotten");
        assert_eq!(h.path_of(ids[1]), Some("/c1"));
    }

    #[test]
    fn discovers_this_hosts_cpu_hierarchy() {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        if !mountinfo.contains(" - cgroup") {
            crate::testing::missing("no cgroup filesystem is mounted here");
            return;
        }
        let mut h = Hierarchy::discover().unwrap();
        let root = h.root().to_owned();
        assert!(root.join("cpu.stat").is_file(), "{}", root.display());
        match h.version() {
            // The v2 root cgroup has no cpu.max of its own; its controllers list says cpu.
            Version::V2 => assert!(
                fs::read_to_string(root.join("cgroup.controllers"))
                    .unwrap()
                    .split_whitespace()
                    .any(|c| c == "cpu")
            ),
            Version::V1 => assert!(root.join("cpu.cfs_quota_us").is_file()),
        }
        // This project's machines are hybrid with cpu on v1 (platform notes).
        if Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").is_file() {
            assert_eq!(h.version(), Version::V1);
        }
        let id = h.id_of("/").unwrap();
        assert_eq!(h.path_of(id), Some("/"));
    }

    proptest::proptest! {
        /// Any /proc/self/mountinfo: mounts or none, never a panic.
        #[test]
        fn any_mountinfo_parses(text in "(\\PC{0,120}\n){0,8}") {
            let _ = parse_mountinfo(&text);
        }
    }
}
