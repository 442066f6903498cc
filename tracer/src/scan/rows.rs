//! The rows of `scan`, from the sampler's readings alone (no I/O): which cgroups a quota holds, the
//! tightest quota on each one's path to the root (its effective limit), and each one's counters
//! over their lifetime or over the window between two readings. Why a lifetime's use of the limit
//! counts only the owner's active periods: docs/definitions.md (`scan`, "use").

use std::cmp::Ordering;
use std::collections::HashMap;
use std::time::Duration;

use super::json::{Limit, Row, Status};
use crate::cpustat::CpuStat;
use crate::sampler::{Sample, Snapshot, Target};
use crate::schema::CgroupRef;

/// Every cgroup of the hierarchy at one moment, by path.
#[derive(Debug, Default)]
pub struct Reading(HashMap<String, (u64, Sample)>);

impl Reading {
    /// The cgroups `targets` named that exist, with what `snapshot` read of each (the
    /// hierarchy keeps the paths of removed cgroups, whose directories are gone).
    pub fn new(targets: Vec<Target>, mut snapshot: Snapshot) -> Self {
        Self(
            targets
                .into_iter()
                .filter_map(|t| Some((t.path, (t.id, snapshot.remove(&t.id)?))))
                .filter(|(_, (_, s))| s.exists)
                .collect(),
        )
    }

    /// The cgroups that exist whose quota could not be read (permissions, or the cgroup went
    /// away while it was read), sorted: the scan cannot say whether a quota holds them, nor
    /// see the cgroups below one whose directory it may not enter.
    pub fn unreadable(&self) -> Vec<&str> {
        let mut paths: Vec<&str> = self
            .0
            .iter()
            .filter(|(path, (_, s))| {
                // The v2 root, and v2 cgroups without the cpu controller, have no cpu.max (and
                // no period counters): nothing to read there. One refused both is unreadable.
                *path != "/" && s.exists && s.settings.is_none() && (s.stat.is_some() || s.denied)
            })
            .map(|(path, _)| path.as_str())
            .collect();
        paths.sort_unstable();
        paths
    }

    /// The tightest quota on `path`'s way to the root (`path` itself first: the innermost
    /// wins a tie), with its owner's path.
    fn limit(&self, path: &str) -> Option<(&str, u64, u64)> {
        let mut best: Option<(&str, u64, u64)> = None;
        for p in lineage(path) {
            let Some((p, (_, sample))) = self.0.get_key_value(p) else {
                continue;
            };
            let Some(bw) = sample.settings else { continue };
            let (Some(quota), Some(period)) = (bw.quota_ns, bw.period_ns) else {
                continue;
            };
            if period == 0 {
                continue;
            }
            // quota / period < best quota / best period, without division.
            let tighter = best.is_none_or(|(_, q, pd)| {
                u128::from(quota) * u128::from(pd) < u128::from(q) * u128::from(period)
            });
            if tighter {
                best = Some((p.as_str(), quota, period));
            }
        }
        best
    }
}

/// `path` and its ancestors, innermost first, the root `/` last.
fn lineage(path: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(path), |p| match p.rfind('/') {
        Some(0) if *p != "/" => Some("/"),
        Some(0) | None => None,
        Some(i) => Some(&p[..i]),
    })
}

/// What one cgroup's counters say over the span of the rows.
#[derive(Clone, Debug)]
struct Counters {
    stat: Option<CpuStat>,
    usage_ns: Option<u64>,
}

impl Counters {
    fn ratio(&self) -> Option<f64> {
        let s = self.stat.as_ref()?;
        (s.nr_periods > 0).then(|| s.nr_throttled as f64 / s.nr_periods as f64)
    }
}

/// The rows of one reading: each held cgroup's counters since it was made.
pub fn lifetime(reading: &Reading) -> Vec<Row> {
    let counters: HashMap<&str, Counters> = reading
        .0
        .iter()
        .map(|(path, (_, s))| {
            let c = Counters {
                stat: s.stat.clone(),
                usage_ns: s.usage_ns,
            };
            (path.as_str(), c)
        })
        .collect();
    let mut rows: Vec<Row> = reading
        .0
        .iter()
        .filter_map(|(path, (id, sample))| {
            row(reading, path, *id, sample, Status::Present, &counters, None)
        })
        .collect();
    sort(&mut rows);
    rows
}

/// The rows of the window from `first` to `second`: the deltas of the cgroups in both; the
/// cgroups made or removed in between (a path with another id is both) marked, without
/// figures.
pub fn window(first: &Reading, second: &Reading) -> Vec<Row> {
    let same = |path: &str, id: u64| first.0.get(path).filter(|(i, _)| *i == id);
    let mut spans: HashMap<&str, Duration> = HashMap::new();
    let counters: HashMap<&str, Counters> = second
        .0
        .iter()
        .filter_map(|(path, (id, after))| {
            let (_, before) = same(path, *id)?;
            let change = after.since(before);
            spans.insert(path, change.span);
            let counters = Counters {
                stat: change.stat,
                usage_ns: change.usage_ns,
            };
            Some((path.as_str(), counters))
        })
        .collect();
    // A cgroup that was not there throughout has no span of its own: it gets the window's.
    let whole = spans.values().max().copied().unwrap_or_default();
    let mut rows: Vec<Row> = second
        .0
        .iter()
        .filter_map(|(path, (id, sample))| {
            let (status, span) = match spans.get(path.as_str()) {
                Some(span) => (Status::Present, *span),
                None => (Status::Created, whole),
            };
            row(second, path, *id, sample, status, &counters, Some(span))
        })
        .collect();
    sort(&mut rows);
    let gone = first
        .0
        .iter()
        .filter(|(path, (id, _))| second.0.get(path.as_str()).is_none_or(|(i, _)| i != id));
    let mut removed: Vec<Row> = gone
        .filter_map(|(path, (id, sample))| {
            let none = HashMap::new();
            row(
                first,
                path,
                *id,
                sample,
                Status::Removed,
                &none,
                Some(whole),
            )
        })
        .collect();
    removed.sort_by(|a, b| a.cgroup.path.cmp(&b.cgroup.path));
    rows.append(&mut removed);
    rows
}

/// The row of cgroup `path` if a quota holds it; `counters` are the span's, by path (none for
/// a created or removed cgroup); `span` is the window (`None`: the lifetime).
fn row(
    reading: &Reading,
    path: &str,
    id: u64,
    sample: &Sample,
    status: Status,
    counters: &HashMap<&str, Counters>,
    span: Option<Duration>,
) -> Option<Row> {
    let (owner, quota_ns, period_ns) = reading.limit(path)?;
    let (owner_id, _) = reading.0.get(owner)?;
    let own = counters.get(path).filter(|_| status == Status::Present);
    let owner_counters = counters.get(owner).filter(|_| status == Status::Present);
    let usage_ns = own.and_then(|c| c.usage_ns);
    let allowed_ns = match span {
        // The owner's active periods at its quota.
        None => owner_counters
            .and_then(|c| c.stat.as_ref())
            .map(|s| s.nr_periods as f64 * quota_ns as f64),
        Some(window) => Some(window.as_nanos() as f64 * quota_ns as f64 / period_ns as f64),
    };
    let use_of_limit = usage_ns
        .zip(allowed_ns.filter(|a| *a > 0.0))
        .map(|(u, a)| u as f64 / a);
    Some(Row {
        cgroup: CgroupRef::new(id, Some(path)),
        status,
        window_ns: span.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        settings: sample.settings.unwrap_or_default(),
        limit: Limit {
            owner: CgroupRef::new(*owner_id, Some(owner)),
            own: owner == path,
            quota_ns,
            period_ns,
            cpus: quota_ns as f64 / period_ns as f64,
            throttled_ratio: owner_counters.and_then(Counters::ratio),
        },
        cpu_stat: own.and_then(|c| c.stat.clone()),
        usage_ns,
        throttled_ratio: own
            .filter(|_| sample.settings.is_some_and(|b| b.quota_ns.is_some()))
            .and_then(Counters::ratio),
        use_of_limit,
    })
}

/// Most throttled first: by the higher of its own throttle ratio and its limit owner's, then
/// by the time it was stopped (cpu.stat.local where the kernel has it: own or ancestors'
/// quota), then by path.
fn sort(rows: &mut [Row]) {
    let rate = |r: &Row| {
        r.throttled_ratio
            .into_iter()
            .chain(r.limit.throttled_ratio)
            .fold(-1.0f64, f64::max)
    };
    let stopped = |r: &Row| {
        r.cpu_stat
            .as_ref()
            .map_or(0, |s| s.local_throttled_ns.unwrap_or(s.throttled_ns))
    };
    rows.sort_by(|a, b| {
        rate(b)
            .partial_cmp(&rate(a))
            .unwrap_or(Ordering::Equal)
            .then(stopped(b).cmp(&stopped(a)))
            .then(a.cgroup.path.cmp(&b.cgroup.path))
    });
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Instant;

    use super::*;
    use crate::cpustat::TimeUnit;
    use crate::records::Bandwidth;

    const MS: u64 = 1_000_000;

    fn stat(periods: u64, throttled: u64, throttled_ns: u64, local_ns: Option<u64>) -> CpuStat {
        CpuStat {
            nr_periods: periods,
            nr_throttled: throttled,
            throttled_ns,
            local_throttled_ns: local_ns,
            nr_bursts: Some(0),
            burst_ns: Some(0),
            ..CpuStat::zero(TimeUnit::Nanos)
        }
    }

    fn sample(at: Instant, quota_ms: Option<u64>, stat: CpuStat, usage_ns: u64) -> Sample {
        Sample {
            at,
            stat: Some(stat),
            usage_ns: Some(usage_ns),
            settings: Some(Bandwidth {
                quota_ns: quota_ms.map(|q| q * MS),
                period_ns: Some(100 * MS),
                burst_ns: Some(0),
            }),
            exists: true,
            denied: false,
        }
    }

    /// `/` (no quota), `/pod` at 0.5 CPU holding `/pod/a` (none of its own) and `/pod/b` (its
    /// own 0.8 CPU: the pod's is tighter), `/tight` at 0.2 CPU, `/free` (nothing on its path).
    pub(in crate::scan) fn reading(at: Instant, scale: u64) -> Reading {
        let cgroups = [
            ("/", 1, None, stat(0, 0, 0, None), 0),
            (
                "/pod",
                2,
                Some(50),
                stat(
                    10 * scale,
                    4 * scale,
                    90 * MS * scale,
                    Some(90 * MS * scale),
                ),
                400 * MS * scale,
            ),
            (
                "/pod/a",
                3,
                None,
                stat(0, 0, 0, Some(60 * MS * scale)),
                300 * MS * scale,
            ),
            (
                "/pod/b",
                4,
                Some(80),
                stat(9 * scale, 0, 0, Some(50 * MS * scale)),
                100 * MS * scale,
            ),
            (
                "/tight",
                5,
                Some(20),
                stat(10 * scale, 9 * scale, 700 * MS * scale, None),
                200 * MS * scale,
            ),
            ("/free", 6, None, stat(0, 0, 0, None), 5 * MS),
        ];
        Reading(
            cgroups
                .into_iter()
                .map(|(path, id, quota, stat, usage)| {
                    (path.to_owned(), (id, sample(at, quota, stat, usage)))
                })
                .collect(),
        )
    }

    fn by_path<'a>(rows: &'a [Row], path: &str) -> &'a Row {
        rows.iter()
            .find(|r| r.cgroup.path.as_deref() == Some(path))
            .unwrap_or_else(|| panic!("no row {path}: {rows:#?}"))
    }

    #[test]
    fn lineage_walks_up_to_the_root() {
        assert_eq!(
            lineage("/a/b/c").collect::<Vec<_>>(),
            ["/a/b/c", "/a/b", "/a", "/"]
        );
        assert_eq!(lineage("/").collect::<Vec<_>>(), ["/"]);
    }

    #[test]
    fn lifetime_rows_hold_the_held_cgroups_with_their_effective_limit() {
        let rows = lifetime(&reading(Instant::now(), 1));
        let paths: Vec<&str> = rows
            .iter()
            .map(|r| r.cgroup.path.as_deref().unwrap())
            .collect();
        // /tight 0.9, then the pod's three at its 0.4 (by stopped time: local 90, 60, 50 ms).
        assert_eq!(paths, ["/tight", "/pod", "/pod/a", "/pod/b"]);

        let a = by_path(&rows, "/pod/a");
        assert_eq!(a.limit.owner.path.as_deref(), Some("/pod"));
        assert!(!a.limit.own);
        assert_eq!((a.limit.quota_ns, a.limit.cpus), (50 * MS, 0.5));
        assert_eq!(a.limit.throttled_ratio, Some(0.4));
        assert_eq!(a.throttled_ratio, None, "no quota of its own");
        assert_eq!(a.settings.quota_ns, None);
        // 300 ms over the pod's 10 active periods of 50 ms.
        assert_eq!(a.use_of_limit, Some(0.6));
        assert_eq!(a.status, Status::Present);
        assert_eq!(a.window_ns, None);

        let b = by_path(&rows, "/pod/b");
        assert_eq!(
            b.limit.owner.path.as_deref(),
            Some("/pod"),
            "0.5 CPU < its own 0.8"
        );
        assert_eq!(b.settings.quota_ns, Some(80 * MS));
        assert_eq!(b.throttled_ratio, Some(0.0));

        let t = by_path(&rows, "/tight");
        assert!(t.limit.own);
        assert_eq!(t.throttled_ratio, Some(0.9));
        assert_eq!(t.cpu_stat.as_ref().unwrap().throttled_ns, 700 * MS);
        assert_eq!(t.use_of_limit, Some(1.0));
    }

    /// [`reading`] 2 s after `t0`, after three times the counters: /tight was removed and made
    /// again (a new id), /pod/new appeared, /pod/b went.
    pub(in crate::scan) fn changed(t0: Instant) -> Reading {
        let mut second = reading(t0 + Duration::from_secs(2), 3);
        second.0.get_mut("/tight").unwrap().0 = 50;
        let new = second.0["/pod/a"].1.clone();
        second.0.insert("/pod/new".into(), (51, new));
        second.0.remove("/pod/b");
        second
    }

    #[test]
    fn a_window_has_deltas_and_marks_what_came_and_went() {
        let t0 = Instant::now();
        let first = reading(t0, 1);
        let rows = window(&first, &changed(t0));
        let marks: Vec<(&str, Status)> = rows
            .iter()
            .map(|r| (r.cgroup.path.as_deref().unwrap(), r.status))
            .collect();
        assert_eq!(
            marks,
            [
                ("/pod", Status::Present),
                ("/pod/a", Status::Present),
                ("/pod/new", Status::Created),
                ("/tight", Status::Created),
                ("/pod/b", Status::Removed),
                ("/tight", Status::Removed),
            ]
        );
        let pod = by_path(&rows, "/pod");
        let d = pod.cpu_stat.as_ref().unwrap();
        assert_eq!(
            (d.nr_periods, d.nr_throttled, d.throttled_ns),
            (20, 8, 180 * MS)
        );
        assert_eq!(pod.window_ns, Some(2_000 * MS));
        assert_eq!(pod.throttled_ratio, Some(0.4));
        // 800 ms used in 2 s at 0.5 CPU.
        assert_eq!(pod.use_of_limit, Some(0.8));
        let a = by_path(&rows, "/pod/a");
        assert_eq!(
            a.cpu_stat.as_ref().unwrap().local_throttled_ns,
            Some(120 * MS)
        );
        for r in rows.iter().filter(|r| r.status != Status::Present) {
            assert_eq!(
                (&r.cpu_stat, r.usage_ns, r.use_of_limit),
                (&None, None, None)
            );
            assert_eq!((r.throttled_ratio, r.limit.throttled_ratio), (None, None));
        }
    }

    #[test]
    fn unreadable_quotas_are_counted() {
        let mut r = reading(Instant::now(), 1);
        assert!(r.unreadable().is_empty());
        r.0.get_mut("/pod").unwrap().1.settings = None;
        assert_eq!(r.unreadable(), ["/pod"]);
        // A directory it may not enter: neither cpu.stat nor the quota files read.
        let free = &mut r.0.get_mut("/free").unwrap().1;
        (free.settings, free.stat, free.denied) = (None, None, true);
        assert_eq!(r.unreadable(), ["/free", "/pod"]);
        // /pod/a is left out (no quota known on its path); /pod/b has its own.
        let paths: Vec<String> = lifetime(&r)
            .into_iter()
            .filter_map(|r| r.cgroup.path)
            .collect();
        assert_eq!(paths, ["/tight", "/pod/b"]);
    }
}
