//! The parsers of what the tracer reads from outside, as the fuzz targets call them (fuzz/, one
//! target per function of the same name) and as `cargo test` replays the kept corpora. Each calls
//! the real parser as the program does: broken input must end in an error or a skipped line, never
//! a panic, and where a parser promises more, that is checked too, so that a target also finds
//! wrong answers. docs/testing.md ("Fuzzing").

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::aggregate::Aggregate;
use crate::cgroups::{self, Hierarchy, Version};
use crate::cpustat::{self, CpuStat, TimeUnit};
use crate::filter::{self, Selection};
use crate::names::{self, Name};
use crate::records::{Record, RecordError};
use crate::replay::{self, Recorded};

/// A target: takes one input.
pub type Target = fn(&[u8]);

/// Every target, by name: the fuzz targets' names and their corpus directories.
pub const TARGETS: &[(&str, Target)] = &[
    ("cpu_stat", cpu_stat),
    ("cpu_max", cpu_max),
    ("mountinfo", mountinfo),
    ("cgroup_path", cgroup_path),
    ("proc_cgroup", proc_cgroup),
    ("cgroup_glob", cgroup_glob),
    ("container_names", container_names),
    ("recording", recording),
    ("record", record),
];

const VERSIONS: [Version; 2] = [Version::V1, Version::V2];

/// `cpu.stat` of either version (and cpu.stat.local, whose lines are the same `key value`).
pub fn cpu_stat(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for unit in [TimeUnit::Nanos, TimeUnit::Micros] {
        let Ok(stat) = CpuStat::parse(text, unit, Path::new("cpu.stat")) else {
            continue;
        };
        // The NDJSON `cpu_stat` object is this struct, and `report` reads it back.
        let json = serde_json::to_string(&stat).expect("a cpu.stat serializes");
        let back: CpuStat = serde_json::from_str(&json).expect("a cpu.stat reads back");
        assert_eq!(back, stat, "{json}");
        let none = stat.since(&stat).expect("a reading minus itself");
        assert_eq!(
            (none.nr_periods, none.nr_throttled, none.throttled_ns),
            (0, 0, 0)
        );
        // Either order: a counter going backwards is an error, not an underflow.
        let zero = CpuStat::zero(unit);
        let _ = stat.since(&zero);
        let _ = zero.since(&stat);
    }
}

/// v2 `cpu.max`, and the single µs values of v1's `cpu.cfs_*_us` and v2's `cpu.max.burst`.
pub fn cpu_max(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = cpustat::parse_max(Path::new("cpu.max"), text);
    let _ = cpustat::parse_us(Path::new("cpu.cfs_quota_us"), text);
}

/// /proc/self/mountinfo: which hierarchies are mounted where.
pub fn mountinfo(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mounts = cgroups::parse_mountinfo(text);
    assert!(mounts.len() <= text.lines().count());
    let _ = cgroups::mode_of(&mounts);
}

/// A cgroup path as `--cgroup` and the recordings give it: its directory must stay under the
/// hierarchy's mount, and its ancestors are its own prefixes.
pub fn cgroup_path(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let root = PathBuf::from("/sys/fs/cgroup");
    if let Ok(dir) = Hierarchy::at(root.clone(), Version::V2).dir_of(path) {
        let below = dir
            .strip_prefix(&root)
            .expect("a cgroup's directory is under the root");
        assert!(
            below
                .components()
                .all(|c| matches!(c, Component::Normal(_))),
            "{path:?} → {}",
            dir.display()
        );
    }
    for ancestor in filter::proper_ancestors(path) {
        assert!(path.starts_with(ancestor) && ancestor.len() < path.len());
    }
}

/// /proc/PID/cgroup (`--pid`), on either version.
pub fn proc_cgroup(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for version in VERSIONS {
        if let Some(path) = filter::cgroup_of_process(text, version) {
            assert!(text.contains(&path));
        }
    }
}

/// A `--cgroup` value (a path or a glob) and a `--container` value, the first line, against
/// a cgroup path, the rest.
pub fn cgroup_glob(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (selector, path) = text.split_once('\n').unwrap_or((text, "/"));
    // Only `--pid` reads the hierarchy.
    let hierarchy = Hierarchy::at(PathBuf::from("/sys/fs/cgroup"), Version::V2);
    let given = [selector.to_owned()];
    if let Ok(selection) = Selection::parse(&hierarchy, &given, &[], &[]) {
        let matched = selection.matches(path);
        if selection.exact_paths().is_some() {
            assert_eq!(
                matched,
                selector == path,
                "an exact path matches itself alone"
            );
        }
    }
    if let Ok(selection) = Selection::parse(&hierarchy, &[], &given, &[]) {
        let _ = selection.matches(path);
    }
}

/// The names of a cgroup path: container, pod, unit.
pub fn container_names(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(name) = Name::of(path) {
        let _ = name.to_string();
        serde_json::to_string(&name).expect("a name serializes");
        if let Some(id) = &name.container_id {
            assert_eq!(id.len(), 12, "{path:?}");
        }
    }
    for id in names::container_ids(path) {
        assert_eq!(id.len(), 64, "{path:?}");
    }
}

/// `throttle-tracer report FILE`: a recording read and its report written.
pub fn recording(data: &[u8]) {
    if let Ok(recorded) = Recorded::read(data) {
        recorded
            .print(io::sink())
            .expect("the report of a recording that was read");
    }
}

/// One ring-buffer record, decoded and taken by the aggregate as the run loop takes it.
pub fn record(data: &[u8]) {
    let mut aggregate = Aggregate::default();
    let now_ns = match Record::parse(data) {
        Ok(Record::Stop(event)) => {
            aggregate.ingest(&event);
            replay::timestamps(&event).1
        }
        Ok(Record::Period(period)) => {
            aggregate.ingest_period(&period);
            period.end_ns
        }
        Ok(Record::Deferred(deferred)) => {
            aggregate.ingest_deferred(&deferred);
            deferred.since_ns
        }
        Err(RecordError::Size { got, .. }) => {
            assert_eq!(got, data.len());
            return;
        }
        Err(_) => return,
    };
    aggregate.finish(now_ns);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::fs;

    use super::*;

    fn fuzz_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
    }

    /// The names of the entries of `dir` ending in `suffix`, without it.
    fn names_in(dir: &Path, suffix: &str) -> BTreeSet<String> {
        fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|n| n.strip_suffix(suffix).map(str::to_owned))
            .collect()
    }

    /// What the fuzzing covered, in every `cargo test`: each kept input (the minimised corpus,
    /// seeds and findings) through its target's function.
    #[test]
    fn every_kept_fuzz_input_passes_its_target() {
        for (name, target) in TARGETS {
            let dir = fuzz_dir().join("corpus").join(name);
            let inputs = names_in(&dir, "");
            assert!(!inputs.is_empty(), "{}: no corpus", dir.display());
            for input in inputs {
                let file = dir.join(&input);
                let data = fs::read(&file).unwrap();
                eprintln!("{}", file.display());
                target(&data);
            }
        }
    }

    /// TARGETS, the fuzz targets and the corpus directories name the same targets.
    #[test]
    fn every_fuzz_target_is_listed_and_has_a_corpus() {
        let listed: BTreeSet<String> = TARGETS.iter().map(|(n, _)| (*n).to_owned()).collect();
        assert_eq!(names_in(&fuzz_dir().join("fuzz_targets"), ".rs"), listed);
        assert_eq!(names_in(&fuzz_dir().join("corpus"), ""), listed);
    }
}
