//! The demo's temporary cgroup: made under the root of the hierarchy that holds the cpu
//! controller, named `throttle-tracer-demo-<pid>` so a leftover is recognisable and tells which
//! run left it, given the demo's quota, and removed again — its tasks killed first — when the
//! demo ends, fails, or (for a run that was killed) when the next demo starts.
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use crate::cgroups::{Hierarchy, Version};
use crate::error::{Failure, say};

/// Every demo cgroup's name starts with this; the demo's pid follows.
pub const PREFIX: &str = "throttle-tracer-demo-";

/// How long removal keeps killing tasks and retrying rmdir (a killed task leaves its cgroup
/// when it has exited, which a throttled task may only do at its next period).
const REMOVE_PATIENCE: Duration = Duration::from_secs(3);

/// A quota: runtime per period, and burst.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub quota_us: u64,
    pub period_us: u64,
    pub burst_us: u64,
}

/// The demo's cgroup and the workload running in it; dropping it kills the workload and removes
/// the cgroup (best effort, with a warning if that fails: [`DemoCgroup::remove`] reports it).
#[derive(Debug)]
pub struct DemoCgroup {
    /// Path under the hierarchy, e.g. `/throttle-tracer-demo-1234`.
    pub path: String,
    pub dir: PathBuf,
    version: Version,
    /// The workload, once started; killed and reaped before the rmdir.
    pub workload: Option<Child>,
    removed: bool,
}

/// What a cleanup did, for the message.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removal {
    /// Tasks that were still in the cgroup and were killed.
    pub killed: usize,
}

fn io_failure(what: &str, path: &Path, e: &io::Error) -> Failure {
    let hint = if e.kind() == io::ErrorKind::PermissionDenied {
        "the demo makes a cgroup: run it as root (sudo throttle-tracer demo)".to_owned()
    } else {
        format!(
            "check that {} is a writable cgroup hierarchy",
            path.parent().unwrap_or(path).display()
        )
    };
    Failure::environment(format!("cannot {what} {}: {e}", path.display()), hint)
}

fn write(path: &Path, value: &str) -> Result<(), Failure> {
    fs::write(path, value).map_err(|e| io_failure(&format!("write {value:?} to"), path, &e))
}

impl DemoCgroup {
    /// Makes `/throttle-tracer-demo-<pid>` with `quota`. On cgroup v2 the cpu controller is
    /// enabled in the root's `cgroup.subtree_control` first if it is not yet (and left on:
    /// turning it off later could take it away from cgroups made meanwhile); returns whether
    /// that was done.
    pub fn create(hierarchy: &Hierarchy, quota: Quota) -> Result<(Self, bool), Failure> {
        let name = format!("{PREFIX}{}", std::process::id());
        let path = format!("/{name}");
        let dir = hierarchy.root().join(&name);
        let version = hierarchy.version();
        let mut enabled = false;
        if version == Version::V2 {
            let control = hierarchy.root().join("cgroup.subtree_control");
            let on = fs::read_to_string(&control)
                .map_err(|e| io_failure("read", &control, &e))?
                .split_whitespace()
                .any(|c| c == "cpu");
            if !on {
                write(&control, "+cpu")?;
                enabled = true;
            }
        }
        fs::create_dir(&dir).map_err(|e| io_failure("create the cgroup", &dir, &e))?;
        let cgroup = Self {
            path,
            dir,
            version,
            workload: None,
            removed: false,
        };
        cgroup.configure(quota)?;
        Ok((cgroup, enabled))
    }

    /// Writes the quota files. The burst file is optional (kernels before 5.14 have none) and
    /// only written when a burst is asked for or the file exists.
    fn configure(&self, q: Quota) -> Result<(), Failure> {
        match self.version {
            Version::V1 => {
                // The period first: a quota above the old period is fine, but a burst is
                // checked against the quota in place.
                write(
                    &self.dir.join("cpu.cfs_period_us"),
                    &q.period_us.to_string(),
                )?;
                write(&self.dir.join("cpu.cfs_quota_us"), &q.quota_us.to_string())?;
                self.write_burst("cpu.cfs_burst_us", q.burst_us)
            }
            Version::V2 => {
                write(
                    &self.dir.join("cpu.max"),
                    &format!("{} {}", q.quota_us, q.period_us),
                )?;
                self.write_burst("cpu.max.burst", q.burst_us)
            }
        }
    }

    fn write_burst(&self, file: &str, burst_us: u64) -> Result<(), Failure> {
        let path = self.dir.join(file);
        if burst_us == 0 && !path.exists() {
            return Ok(());
        }
        write(&path, &burst_us.to_string())
    }

    /// Kills the workload and removes the cgroup.
    pub fn remove(mut self) -> Result<Removal, Failure> {
        self.removed = true;
        self.stop_workload();
        remove_dir(&self.dir, self.version)
    }

    fn stop_workload(&mut self) {
        if let Some(mut child) = self.workload.take() {
            // Already exited is fine; the wait reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DemoCgroup {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        self.stop_workload();
        if let Err(e) = remove_dir(&self.dir, self.version) {
            say!("{e}");
        }
    }
}

/// Lifts the quota (so killed tasks are not kept waiting for a refill), kills every task in the
/// cgroup until it is empty, and removes it. A cgroup that is already gone is fine.
pub fn remove_dir(dir: &Path, version: Version) -> Result<Removal, Failure> {
    let unlimited = match version {
        Version::V1 => ("cpu.cfs_quota_us", "-1"),
        Version::V2 => ("cpu.max", "max"),
    };
    let file = dir.join(unlimited.0);
    if file.exists() {
        // Best effort: if this is refused, rmdir below names the real problem.
        let _ = fs::write(file, unlimited.1);
    }
    let mut removal = Removal::default();
    let started = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(removal),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(removal),
            Err(e) if started.elapsed() >= REMOVE_PATIENCE => {
                return Err(Failure::environment(
                    format!("cannot remove the demo cgroup {}: {e}", dir.display()),
                    format!(
                        "see what is left in it (cat {0}/cgroup.procs; ls {0}), stop it, then \
                         rmdir {0}",
                        dir.display()
                    ),
                ));
            }
            Err(_) => {}
        }
        for pid in tasks(dir) {
            // SAFETY: kill(2) with a pid read from the cgroup and a valid signal number.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                removal.killed += 1;
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The processes in the cgroup now (`cgroup.procs`); empty if it cannot be read.
fn tasks(dir: &Path) -> Vec<libc::pid_t> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|&pid: &libc::pid_t| pid > 0)
        .collect()
}

/// A demo cgroup found at start-up.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Its demo is gone (killed, or crashed): it was removed.
    Removed {
        path: String,
        pid: u32,
        removal: Removal,
    },
    /// Its demo is still running: left alone.
    Running { path: String, pid: u32 },
}

/// Finds the cgroups of earlier demos under the hierarchy's root; removes those whose demo
/// process is gone, leaves those of demos still running.
pub fn clean_leftovers(hierarchy: &Hierarchy) -> Result<Vec<Found>, Failure> {
    let root = hierarchy.root();
    let entries = fs::read_dir(root).map_err(|e| io_failure("read", root, &e))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = format!("/{name}");
        if pid != std::process::id() && is_demo(pid) {
            found.push(Found::Running { path, pid });
        } else {
            let removal = remove_dir(&entry.path(), hierarchy.version())?;
            found.push(Found::Removed { path, pid, removal });
        }
    }
    found.sort_by_key(|f| match f {
        Found::Removed { pid, .. } | Found::Running { pid, .. } => *pid,
    });
    Ok(found)
}

/// Whether `pid` is a live throttle-tracer (a reused pid is some other program).
fn is_demo(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "throttle-tracer")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo_quota() -> Quota {
        Quota {
            quota_us: 50_000,
            period_us: 100_000,
            burst_us: 0,
        }
    }

    #[test]
    fn v1_files_and_name() {
        let root = tempfile::tempdir().unwrap();
        let h = Hierarchy::at(root.path().to_owned(), Version::V1);
        let (mut cg, enabled) = DemoCgroup::create(&h, demo_quota()).unwrap();
        assert!(!enabled);
        assert_eq!(cg.path, format!("/{PREFIX}{}", std::process::id()));
        let read = |f: &str| fs::read_to_string(cg.dir.join(f)).unwrap();
        assert_eq!(read("cpu.cfs_period_us"), "100000");
        assert_eq!(read("cpu.cfs_quota_us"), "50000");
        assert!(
            !cg.dir.join("cpu.cfs_burst_us").exists(),
            "no burst file made"
        );
        cg.removed = true; // a plain directory with files does not rmdir like a cgroup
    }

    #[test]
    fn v2_enables_the_controller_and_writes_cpu_max() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cgroup.subtree_control"), "memory io").unwrap();
        let h = Hierarchy::at(root.path().to_owned(), Version::V2);
        let quota = Quota {
            burst_us: 30_000,
            ..demo_quota()
        };
        let (mut cg, enabled) = DemoCgroup::create(&h, quota).unwrap();
        assert!(enabled);
        assert_eq!(
            fs::read_to_string(root.path().join("cgroup.subtree_control")).unwrap(),
            "+cpu"
        );
        let read = |f: &str| fs::read_to_string(cg.dir.join(f)).unwrap();
        assert_eq!(read("cpu.max"), "50000 100000");
        assert_eq!(read("cpu.max.burst"), "30000");
        cg.removed = true;

        fs::remove_dir_all(&cg.dir).unwrap();
        fs::write(root.path().join("cgroup.subtree_control"), "cpu memory").unwrap();
        let (mut cg, enabled) = DemoCgroup::create(&h, demo_quota()).unwrap();
        assert!(!enabled, "cpu was already on");
        cg.removed = true;
    }

    #[test]
    fn leftovers_of_dead_demos_are_removed_and_live_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        // pid 1 is alive but not a throttle-tracer; u32::MAX - 1 is no process at all.
        for name in [
            format!("{PREFIX}1"),
            format!("{PREFIX}{}", u32::MAX - 1),
            "throttle-tracer-demo-x".to_owned(),
            "other".to_owned(),
        ] {
            fs::create_dir(root.path().join(name)).unwrap();
        }
        let h = Hierarchy::at(root.path().to_owned(), Version::V1);
        let found = clean_leftovers(&h).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| matches!(f, Found::Removed { .. })));
        assert!(!root.path().join(format!("{PREFIX}1")).exists());
        assert!(root.path().join("throttle-tracer-demo-x").exists());
        assert!(root.path().join("other").exists());
    }

    #[test]
    fn removing_a_missing_cgroup_is_fine() {
        let root = tempfile::tempdir().unwrap();
        let removal = remove_dir(&root.path().join("gone"), Version::V1).unwrap();
        assert_eq!(removal, Removal::default());
    }
}
