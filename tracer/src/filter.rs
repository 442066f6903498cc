//! Which cgroups a run traces: `--cgroup` (a path or a glob), `--container` (a prefix of a
//! container id) and `--pid` (that process's cgroup), resolved against the cpu hierarchy. Exact
//! paths go to the kernel-side filter with their [`Ancestors`]; a glob or an id prefix can match
//! cgroups not made yet, so then every selector is decided here ([`Filter`]). [`Traced`] is what a
//! run keeps. Why: docs/design.md ("Selecting cgroups").

use std::collections::{HashMap, HashSet};
use std::fs;

use glob::{MatchOptions, Pattern};

use crate::cgroups::{Hierarchy, Version};
use crate::error::Failure;
use crate::names;
use crate::records::EndedStop;

/// One way of naming cgroups on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Selector {
    /// A cgroup path matched exactly.
    Path(String),
    /// A path pattern: `*` matches any run of characters but `/`, `?` one character but `/`,
    /// `[abc]` one of those characters.
    Glob(Pattern),
    /// A lowercase hex prefix of a container id.
    Container(String),
}

impl Selector {
    fn matches(&self, path: &str) -> bool {
        match self {
            Self::Path(p) => p == path,
            Self::Glob(g) => g.matches_with(path, GLOB_OPTIONS),
            Self::Container(prefix) => {
                names::container_ids(path).any(|id| id.starts_with(prefix.as_str()))
            }
        }
    }
}

/// What the command line selected.
#[derive(Debug, Default)]
pub struct Selection {
    selectors: Vec<Selector>,
}

impl Selection {
    /// Checks and resolves `--cgroup`, `--container` and `--pid` values (usage errors, exit 2).
    pub fn parse(
        hierarchy: &Hierarchy,
        cgroups: &[String],
        containers: &[String],
        pids: &[u32],
    ) -> Result<Self, Failure> {
        let mut selectors = Vec::new();
        for c in cgroups {
            if !c.starts_with('/') {
                return Err(Failure::usage(
                    format!("--cgroup {c:?} is not a cgroup path"),
                    "give a path under the cpu hierarchy starting with `/`, such as \
                     /system.slice/docker-*.scope",
                ));
            }
            selectors.push(if is_glob(c) {
                Selector::Glob(Pattern::new(c).map_err(|e| {
                    Failure::usage(
                        format!(
                            "--cgroup {c:?} is not a valid glob: {} at character {}",
                            e.msg,
                            e.pos + 1
                        ),
                        "`*` and `?` match within one path component, `[abc]` one of the \
                         characters and `[!abc]` any other; `[[]` is a literal `[`",
                    )
                })?)
            } else {
                Selector::Path(c.clone())
            });
        }
        for id in containers {
            let prefix = id.to_ascii_lowercase();
            if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Failure::usage(
                    format!("--container {id:?} is not a container id"),
                    "give the first hex digits of the id, as `docker ps` or `crictl ps` shows it",
                ));
            }
            selectors.push(Selector::Container(prefix));
        }
        for &pid in pids {
            let file = format!("/proc/{pid}/cgroup");
            let text = fs::read_to_string(&file).map_err(|e| {
                Failure::usage(
                    format!("--pid {pid}: cannot read {file}: {e}"),
                    "give the id of a running process (see `ps -e`)",
                )
            })?;
            let path = cgroup_of_process(&text, hierarchy.version()).ok_or_else(|| {
                Failure::usage(
                    format!("--pid {pid}: {file} names no cgroup of the cpu controller"),
                    "the process may be in another cgroup namespace; use --cgroup with its path",
                )
            })?;
            selectors.push(Selector::Path(path));
        }
        Ok(Self { selectors })
    }

    /// Whether the cgroup at `path` is selected: any selector matches it.
    pub fn matches(&self, path: &str) -> bool {
        self.selectors.iter().any(|s| s.matches(path))
    }

    /// True when nothing was selected: every cgroup is traced.
    pub fn is_all(&self) -> bool {
        self.selectors.is_empty()
    }

    /// The paths for the kernel-side filter, if every selector is an exact path; `None` when
    /// the selection must be applied in userspace ([`Selection::into_filter`]).
    pub fn exact_paths(&self) -> Option<Vec<String>> {
        self.selectors
            .iter()
            .map(|s| match s {
                Selector::Path(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    /// The userspace filter, with the cgroups that exist now already decided; returns it and
    /// the ids selected so far.
    pub fn into_filter(self, hierarchy: &mut Hierarchy) -> (Filter, Vec<u64>) {
        let mut filter = Filter {
            selection: self,
            decided: HashMap::new(),
        };
        let existing: Vec<(u64, String)> = hierarchy
            .all()
            .map(|(id, path)| (id, path.to_owned()))
            .collect();
        let mut selected: Vec<u64> = existing
            .into_iter()
            .filter(|(id, path)| filter.decide(*id, path))
            .map(|(id, _)| id)
            .collect();
        selected.sort_unstable();
        (filter, selected)
    }
}

/// The userspace side of a selection: decides each cgroup id once, by its path.
#[derive(Debug)]
pub struct Filter {
    selection: Selection,
    decided: HashMap<u64, bool>,
}

impl Filter {
    fn decide(&mut self, id: u64, path: &str) -> bool {
        let keep = self.selection.matches(path);
        self.decided.insert(id, keep);
        keep
    }

    /// Whether records of cgroup `id` are kept. An id whose path does not resolve (yet) is
    /// left out and decided again at its next record.
    pub fn admits(&mut self, id: u64, hierarchy: &mut Hierarchy) -> bool {
        if let Some(&keep) = self.decided.get(&id) {
            return keep;
        }
        match hierarchy.path_of(id) {
            Some(path) => {
                let path = path.to_owned();
                self.decide(id, &path)
            }
            None => false,
        }
    }
}

/// The ancestors of cgroups named by exact path. A stop of an ancestor's quota also stops the
/// named cgroup, so the kernel-side filter must admit the ancestors too; their stops then count
/// only for the named descendants they stopped ("stopped by ancestor"), and the ancestors get
/// no row of their own.
#[derive(Debug, Default)]
pub struct Ancestors {
    named: HashSet<u64>,
    ancestors: HashSet<u64>,
}

impl Ancestors {
    /// The ancestors (the root excepted: it never has a quota) of `paths`, whose ids are
    /// `named`; an ancestor that is itself named is not one here.
    pub fn of(hierarchy: &Hierarchy, paths: &[String], named: &[u64]) -> Self {
        let named: HashSet<u64> = named.iter().copied().collect();
        let ancestors = paths
            .iter()
            .flat_map(|p| proper_ancestors(p))
            .filter_map(|p| hierarchy.id_of(p).ok())
            .filter(|id| !named.contains(id))
            .collect();
        Self { named, ancestors }
    }

    /// The ancestors' ids, for the kernel-side filter.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.ancestors.iter().copied()
    }

    /// Whether `id` is traced only for its named descendants' sake.
    pub fn only_for_descendants(&self, id: u64) -> bool {
        self.ancestors.contains(&id)
    }

    /// Whether `id` was named.
    pub fn is_named(&self, id: u64) -> bool {
        self.named.contains(&id)
    }
}

/// What a run keeps of the records as they arrive: the userspace selection, if any, and the
/// ancestors of the cgroups named by exact path.
#[derive(Debug, Default)]
pub struct Traced {
    pub filter: Option<Filter>,
    pub ancestors: Ancestors,
}

impl Traced {
    /// Whether cgroup `id` is traced for its own sake: it gets a row and `stop` lines.
    pub fn for_itself(&mut self, id: u64, hierarchy: &mut Hierarchy) -> bool {
        !self.ancestors.only_for_descendants(id)
            && self.filter.as_mut().is_none_or(|f| f.admits(id, hierarchy))
    }

    /// The traced cgroups among those `end` stopped (`Stop::credited`): a stop of a cgroup not
    /// traced for itself counts for these only. With a userspace selection (globs, container
    /// ids) that is every selected descendant, so a container's row shows its pod's stops.
    pub fn credited_descendants(&mut self, end: &EndedStop, hierarchy: &mut Hierarchy) -> Vec<u64> {
        end.stop
            .credited()
            .into_iter()
            .filter(|&d| {
                self.ancestors.is_named(d)
                    || self.filter.as_mut().is_some_and(|f| f.admits(d, hierarchy))
            })
            .collect()
    }
}

/// `/a/b/c` → `/a/b`, `/a`: every ancestor path but the root's.
pub(crate) fn proper_ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(|(i, _)| &path[..i])
        .filter(|p| !p.is_empty())
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// `*`, `?` and `[...]` stay within one path component, as in a shell: a glob names cgroups at
/// one depth of the hierarchy. `**` (any number of components) comes with the crate.
const GLOB_OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// The cgroup of a process in the hierarchy of the cpu controller, from its /proc/PID/cgroup:
/// on v1 the line whose controller list holds `cpu` (`4:cpu,cpuacct:/path`), on v2 the `0::`
/// line.
pub fn cgroup_of_process(text: &str, version: Version) -> Option<String> {
    text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (hid, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let wanted = match version {
            Version::V1 => controllers.split(',').any(|c| c == "cpu"),
            Version::V2 => hid == "0" && controllers.is_empty(),
        };
        wanted.then(|| path.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn glob_match(pattern: &str, path: &str) -> bool {
        Selector::Glob(Pattern::new(pattern).unwrap()).matches(path)
    }

    #[test]
    fn ancestor_paths_stop_below_the_root() {
        let a: Vec<&str> = proper_ancestors("/kubepods/pod1/ctr").collect();
        assert_eq!(a, ["/kubepods", "/kubepods/pod1"]);
        assert_eq!(proper_ancestors("/top").count(), 0);
        assert_eq!(proper_ancestors("/").count(), 0);
    }

    #[test]
    fn globs_match_within_path_components() {
        let g = "/system.slice/docker-*.scope";
        assert!(glob_match(g, &format!("/system.slice/docker-{ID}.scope")));
        assert!(!glob_match(g, "/system.slice/containerd.service"));
        assert!(
            !glob_match(g, "/system.slice/docker-x/y.scope"),
            "* stops at /"
        );
        assert!(glob_match(
            "/kubepods/*/pod*",
            "/kubepods/burstable/pod1234"
        ));
        assert!(!glob_match("/kubepods/*", "/kubepods/burstable/pod1234"));
        assert!(glob_match("/demo?", "/demo1"));
        assert!(!glob_match("/demo?", "/demo"));
        assert!(glob_match("/*", "/"));
        assert!(glob_match("*", ""));
        assert!(glob_match("/a*b*c", "/aXbYbZc"));
        assert!(!glob_match("/a*b*c", "/aXbYbZ"));
        assert!(is_glob(g) && !is_glob("/system.slice"));
    }

    #[test]
    fn glob_classes_match_one_character_of_a_component() {
        assert!(glob_match("/demo[12]", "/demo1"));
        assert!(glob_match("/demo[12]", "/demo2"));
        assert!(!glob_match("/demo[12]", "/demo3"));
        assert!(glob_match("/demo[0-9]", "/demo7"));
        assert!(glob_match("/demo[!12]", "/demo3"));
        assert!(!glob_match("/demo[!12]", "/demo1"));
        assert!(!glob_match("/a[/]b", "/a/b"), "a class never matches /");
        assert!(glob_match("/a[[]b", "/a[b"));
        assert!(is_glob("/demo[12]"));
    }

    #[test]
    fn a_malformed_glob_is_a_usage_error_naming_it() {
        let h = Hierarchy::at("/nonexistent".into(), Version::V1);
        for bad in ["/demo[", "/demo[12", "/a**b"] {
            let failure = Selection::parse(&h, &[bad.into()], &[], &[]).unwrap_err();
            assert_eq!(failure.exit_code(), 2, "{bad}");
            let text = failure.to_string();
            assert!(
                text.lines()
                    .next()
                    .is_some_and(|l| l.contains(&format!("{bad:?}"))),
                "{text}"
            );
        }
    }

    #[test]
    fn container_ids_in_every_runtime_layout() {
        let c = |prefix: &str| Selector::Container(prefix.into());
        for path in [
            format!("/system.slice/docker-{ID}.scope"),
            format!("/docker/{ID}"),
            format!("/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope"),
            format!("/kubepods-pod1.slice:cri-containerd:{ID}"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
            format!("/kubepods/burstable/pod1/crio-{ID}"),
            // The kubelet's cgroupfs driver: the bare id under the pod.
            format!("/kubepods/burstable/pod6f2d0c1f-3e21-4b6a-9a59-0d3c3b6f5f5e/{ID}"),
            format!("/kubepods/pod6f2d0c1f-3e21-4b6a-9a59-0d3c3b6f5f5e/{ID}"),
            format!("/system.slice/crio-{ID}.scope"),
        ] {
            assert!(c("0123456789ab").matches(&path), "{path}");
            assert!(c(ID).matches(&path), "{path}");
            assert!(!c("0123456789ac").matches(&path), "{path}");
        }
        assert!(!c("01").matches("/system.slice/docker.service"));
        // A monitor is not its container.
        assert!(!c("0123456789ab").matches(&format!("/system.slice/crio-conmon-{ID}.scope")));
        assert!(!c("0").matches("/docker/notanid"));
    }

    #[test]
    fn proc_pid_cgroup_v1_and_v2_lines() {
        let v1 = "12:pids:/user.slice\n4:cpu,cpuacct:/tt-live-1\n3:cpuset:/\n0::/user.slice/x\n";
        assert_eq!(
            cgroup_of_process(v1, Version::V1).as_deref(),
            Some("/tt-live-1")
        );
        assert_eq!(
            cgroup_of_process(v1, Version::V2).as_deref(),
            Some("/user.slice/x")
        );
        // cpuacct alone is not cpu; a path with `:` stays whole.
        let odd = "5:cpuacct:/a\n6:cpu:/k8s:cri-containerd:1\n";
        assert_eq!(
            cgroup_of_process(odd, Version::V1).as_deref(),
            Some("/k8s:cri-containerd:1")
        );
        assert_eq!(cgroup_of_process("", Version::V2), None);
        assert_eq!(cgroup_of_process("1:name=systemd:/a\n", Version::V1), None);
    }

    #[test]
    fn selection_goes_to_the_kernel_only_when_every_selector_is_exact() {
        let dir = tempfile::tempdir().unwrap();
        for d in [
            "system.slice/docker-abc.scope",
            "system.slice/cron.service",
            "demo",
        ] {
            fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let exact = Selection::parse(&h, &["/demo".into()], &[], &[]).unwrap();
        assert_eq!(exact.exact_paths(), Some(vec!["/demo".to_owned()]));

        let globbed = Selection::parse(
            &h,
            &["/demo".into(), "/system.slice/docker-*.scope".into()],
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(globbed.exact_paths(), None);
        let id = |p: &str| h.id_of(p).unwrap();
        let mut want = vec![id("/demo"), id("/system.slice/docker-abc.scope")];
        want.sort_unstable();
        let cron = id("/system.slice/cron.service");
        let (mut filter, selected) = globbed.into_filter(&mut h);
        assert_eq!(selected, want);
        assert!(!filter.admits(cron, &mut h));
        assert!(
            !filter.admits(u64::MAX, &mut h),
            "unresolved ids are left out"
        );

        assert!(Selection::parse(&h, &[], &[], &[]).unwrap().is_all());
        for bad in [
            Selection::parse(&h, &["demo".into()], &[], &[]),
            Selection::parse(&h, &[], &["xyz".into()], &[]),
            Selection::parse(&h, &[], &[], &[999_999_999]),
        ] {
            assert_eq!(bad.unwrap_err().exit_code(), 2);
        }
    }
}
