//! The live view's rows: one per cgroup stopped in the interval, from the aggregate's interval
//! window ([`crate::aggregate::IntervalSummary`]), the sampler's reading of the cgroup's files at
//! the tick and the paths the run loop resolved (no I/O here). cpu.stat and the CPU usage (read as
//! for `scan`'s use, docs/definitions.md) are diffed against this view's previous reading of the
//! same cgroup, so a cgroup's first row has `-` there unless the run selected it at the start.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use crate::aggregate::{DurationSummary, IntervalSummary};
use crate::names::Name;
use crate::records::Bandwidth;
use crate::sampler::{Sample, Snapshot};

/// One cgroup in one interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub cgroup_id: u64,
    pub path: Option<String>,
    /// What users call it (container, pod, unit), when the path says more than its last part.
    pub name: Option<String>,
    pub interval: IntervalSummary,
    /// cpu.stat (nr_throttled, nr_periods) deltas since the previous reading.
    pub periods: Option<(u64, u64)>,
    /// CPUs used on average since the previous reading.
    pub cpus: Option<f64>,
    pub settings: Option<Bandwidth>,
}

impl Row {
    pub(super) fn wall_ns(&self) -> u64 {
        self.interval.group_stops.sum_ns
    }

    /// Only an ancestor's quota stopped it in the interval.
    pub(super) fn by_ancestor_only(&self) -> bool {
        self.interval.stops.count == 0 && self.interval.ancestor_stops.count > 0
    }

    /// The per-CPU stops its stop columns show: its own, or the ancestors' when it has none.
    pub(super) fn shown(&self) -> &DurationSummary {
        if self.by_ancestor_only() {
            &self.interval.ancestor_stops
        } else {
            &self.interval.stops
        }
    }

    /// `own`, the owner's path (`cgroup id N` unresolved; `+k` more owners), or both.
    pub(super) fn quota_of(&self) -> String {
        let owners = &self.interval.by_ancestor;
        let first = owners.first().map(|a| {
            let path = a
                .path
                .clone()
                .unwrap_or_else(|| format!("cgroup id {}", a.cgroup_id));
            match owners.len() {
                1 => path,
                n => format!("{path}+{}", n - 1),
            }
        });
        match (self.interval.stops.count > 0, first) {
            (_, None) => "own".into(),
            (false, Some(owner)) => owner,
            (true, Some(owner)) => format!("own+{owner}"),
        }
    }

    /// nr_throttled / nr_periods over the interval.
    pub fn throttled_ratio(&self) -> Option<f64> {
        let (throttled, periods) = self.periods?;
        (periods > 0).then(|| throttled as f64 / periods as f64)
    }
}

/// What the rows are sorted by, largest first (names alphabetically).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    /// Wall-clock stopped time in the interval.
    #[default]
    Wall,
    /// Per-CPU stops in the interval.
    Stops,
    /// p99 of the interval's per-CPU stops.
    P99,
    /// The cgroup path.
    Name,
}

impl SortKey {
    pub(super) fn next(self) -> Self {
        match self {
            Self::Wall => Self::Stops,
            Self::Stops => Self::P99,
            Self::P99 => Self::Name,
            Self::Name => Self::Wall,
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Wall => "wall",
            Self::Stops => "stops",
            Self::P99 => "p99",
            Self::Name => "name",
        }
    }

    pub(super) fn sort(self, rows: &mut [Row]) {
        let p99 = |r: &Row| r.shown().percentiles.map_or(0, |p| p.p99_ns);
        rows.sort_by(|a, b| {
            match self {
                Self::Wall => b.wall_ns().cmp(&a.wall_ns()),
                Self::Stops => b.shown().count.cmp(&a.shown().count),
                Self::P99 => p99(b).cmp(&p99(a)),
                Self::Name => a.path.cmp(&b.path),
            }
            .then(b.shown().sum_ns.cmp(&a.shown().sum_ns))
            .then(a.cgroup_id.cmp(&b.cgroup_id))
        });
    }
}

/// One refresh: the interval's rows, most wall-clock-stopped first.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub at: SystemTime,
    pub interval: Duration,
    pub rows: Vec<Row>,
}

/// The rows' state between refreshes: the previous reading of each cgroup.
pub struct Live {
    last_tick: Instant,
    readings: HashMap<u64, Sample>,
}

impl Default for Live {
    fn default() -> Self {
        Self {
            last_tick: Instant::now(),
            readings: HashMap::new(),
        }
    }
}

impl Live {
    /// The readings of the selected cgroups at the start, so that their first row already has
    /// deltas.
    pub fn watch(&mut self, snapshot: Snapshot) {
        self.readings.extend(snapshot);
    }

    /// Builds the interval's table at `at` from the aggregate's interval window, the cgroup
    /// files and the cgroups' paths.
    pub fn table(
        &mut self,
        at: Instant,
        intervals: &[IntervalSummary],
        snapshot: &Snapshot,
        paths: &HashMap<u64, String>,
    ) -> Table {
        let interval = at.saturating_duration_since(self.last_tick);
        self.last_tick = at;
        let mut rows: Vec<Row> = intervals
            .iter()
            .map(|interval| {
                let mut interval = interval.clone();
                let id = interval.cgroup_id;
                for a in &mut interval.by_ancestor {
                    a.path = paths.get(&a.cgroup_id).cloned();
                }
                let path = paths.get(&id).cloned();
                let reading = snapshot.get(&id).filter(|s| s.stat.is_some());
                let (periods, cpus) = match (self.readings.get(&id), reading) {
                    (Some(before), Some(after)) => deltas(before, after),
                    _ => (None, None),
                };
                let settings = reading.and_then(|r| r.settings);
                match reading {
                    Some(r) => self.readings.insert(id, r.clone()),
                    None => self.readings.remove(&id),
                };
                Row {
                    cgroup_id: id,
                    name: path.as_deref().and_then(Name::friendly),
                    path,
                    interval,
                    periods,
                    cpus,
                    settings,
                }
            })
            .collect();
        SortKey::default().sort(&mut rows);
        Table {
            at: SystemTime::now(),
            interval,
            rows,
        }
    }
}

fn deltas(before: &Sample, after: &Sample) -> (Option<(u64, u64)>, Option<f64>) {
    let change = after.since(before);
    let periods = change.stat.map(|d| (d.nr_throttled, d.nr_periods));
    let secs = change.span.as_secs_f64();
    let cpus = (change.usage_ns)
        .filter(|_| secs > 0.0)
        .map(|used| used as f64 / 1e9 / secs);
    (periods, cpus)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::aggregate::Aggregate;
    use crate::cgroups::{Hierarchy, Version};
    use crate::records::Event;
    use crate::report::live::plain;
    use crate::sampler::Sampler;
    use crate::testing::{MS, ended};
    use std::fs;

    /// Two cgroups through the real aggregate: 4242 stopped 80 ms per 100 ms on one CPU, 7
    /// stopped less but more often.
    pub(in crate::report::live) fn synthetic() -> Vec<IntervalSummary> {
        let mut agg = Aggregate::watching(&[]).with_intervals(0);
        for i in 0..10 {
            let e = ended(0, i * 100, i * 100 + 80);
            agg.ingest(&Event::Start(e.stop.clone()));
            agg.ingest(&Event::End(e));
        }
        for i in 0..20 {
            let mut e = ended(1, i * 50, i * 50 + 10);
            e.stop.cgroup_id = 7;
            agg.ingest(&Event::Start(e.stop.clone()));
            agg.ingest(&Event::End(e));
        }
        agg.take_interval()
    }

    /// `rows` as one table of a 1 s interval at a fixed time.
    pub(in crate::report::live) fn table(rows: Vec<Row>) -> Table {
        Table {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            interval: Duration::from_secs(1),
            rows,
        }
    }

    #[test]
    fn rows_from_a_synthetic_aggregate_most_wall_stopped_first() {
        let mut live = Live {
            last_tick: Instant::now() - Duration::from_secs(1),
            ..Live::default()
        };
        let t = live.table(
            Instant::now(),
            &synthetic(),
            &Snapshot::new(),
            &HashMap::new(),
        );
        let ids: Vec<u64> = t.rows.iter().map(|r| r.cgroup_id).collect();
        assert_eq!(ids, [4242, 7]);
        let top = &t.rows[0];
        // 10 stops; the last group stop is still held back by the aggregate.
        assert_eq!(top.interval.stops.count, 10);
        assert_eq!(top.interval.stops.sum_ns, 800 * MS);
        assert_eq!(top.interval.group_stops.count, 9);
        assert_eq!(top.interval.group_stops.sum_ns, 720 * MS);
        let p = top.interval.stops.percentiles.unwrap();
        assert_eq!(p.max_ns, 80 * MS);
        assert!(p.p50_ns >= 80 * MS && p.p50_ns <= 81 * MS, "{p:?}");
        // No files for these ids: no path, no cpu.stat columns.
        assert_eq!(
            (top.path.as_ref(), top.periods, top.cpus),
            (None, None, None)
        );
    }

    #[test]
    fn cpu_stat_columns_are_deltas_between_readings() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir
            .path()
            .join("docker")
            .join("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
        fs::create_dir_all(&cg).unwrap();
        let write = |periods: u32, throttled: u32, usage: u64| {
            fs::write(
                cg.join("cpu.stat"),
                format!("nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time 0\n"),
            )
            .unwrap();
            fs::write(cg.join("cpuacct.usage"), format!("{usage}\n")).unwrap();
        };
        fs::write(cg.join("cpu.cfs_quota_us"), "20000\n").unwrap();
        fs::write(cg.join("cpu.cfs_period_us"), "100000\n").unwrap();
        write(5, 4, 1_000_000_000);
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let id = h
            .id_of(&format!(
                "/docker/{}",
                cg.file_name().unwrap().to_str().unwrap()
            ))
            .unwrap();
        let sampler = Sampler::at(&h, None);
        let mut live = Live::default();
        live.watch(sampler.read_now(&Sampler::targets(&mut h, [id])));
        live.readings.get_mut(&id).unwrap().at -= Duration::from_secs(1);
        write(15, 14, 1_200_000_000);
        let mut interval = synthetic().remove(0);
        interval.cgroup_id = id;
        let now = sampler.read_now(&Sampler::targets(&mut h, [id]));
        let paths = HashMap::from([(id, h.path_of(id).unwrap().to_owned())]);
        let t = live.table(Instant::now(), &[interval], &now, &paths);
        let r = &t.rows[0];
        assert_eq!(r.periods, Some((10, 10)));
        assert_eq!(r.throttled_ratio(), Some(1.0));
        let cpus = r.cpus.unwrap();
        assert!((0.19..=0.21).contains(&cpus), "{cpus}");
        assert_eq!(r.settings.unwrap().quota_ns, Some(20 * MS));
        assert_eq!(r.name.as_deref(), Some("docker 0123456789ab"));
    }

    #[test]
    fn a_child_stopped_by_its_parents_quota_has_a_row_naming_the_parent() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("pod/ctr")).unwrap();
        let h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let (pod, ctr) = (h.id_of("/pod").unwrap(), h.id_of("/pod/ctr").unwrap());
        let mut agg = Aggregate::watching(&[]).with_intervals(0);
        for i in 0..4u32 {
            let mut e = ended(i % 2, u64::from(i) * 100, u64::from(i) * 100 + 40);
            e.stop.cgroup_id = pod;
            e.stop.children = vec![ctr];
            agg.credit_only(&e, |d| d == ctr);
        }
        let mut live = Live {
            last_tick: Instant::now() - Duration::from_secs(1),
            ..Live::default()
        };
        let paths = HashMap::from([(pod, "/pod".to_owned()), (ctr, "/pod/ctr".to_owned())]);
        let t = live.table(
            Instant::now(),
            &agg.take_interval(),
            &Snapshot::new(),
            &paths,
        );
        assert_eq!(
            t.rows.len(),
            1,
            "no row for the parent, taken only for its child"
        );
        let r = &t.rows[0];
        assert_eq!((r.cgroup_id, r.quota_of().as_str()), (ctr, "/pod"));
        let text = plain::render(&t);
        let row: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        // STOPS/s GROUP/s P50 P99 MAX PER-CPU WALL: the parent's stops that stopped it.
        assert_eq!(row[0], "/pod/ctr");
        assert_eq!(row[2], "-", "{text}");
        assert_eq!(row[5..8], ["40.0ms", "160.0ms", "-"], "{text}");
        assert!(text.contains(" /pod  "), "{text}");
        let s = plain::histograms(r);
        assert!(
            s.contains("ancestors' per-CPU stops (that stopped it)"),
            "{s}"
        );
    }

    #[test]
    fn sort_keys_order_the_rows() {
        let mut t = Live::default().table(
            Instant::now(),
            &synthetic(),
            &Snapshot::new(),
            &HashMap::new(),
        );
        let order = |t: &Table| t.rows.iter().map(|r| r.cgroup_id).collect::<Vec<_>>();
        assert_eq!(order(&t), [4242, 7], "wall");
        let mut key = SortKey::default();
        let mut orders = Vec::new();
        for _ in 0..4 {
            key = key.next();
            key.sort(&mut t.rows);
            orders.push((key, order(&t)));
        }
        assert_eq!(
            orders,
            [
                (SortKey::Stops, vec![7, 4242]),
                (SortKey::P99, vec![4242, 7]),
                (SortKey::Name, vec![4242, 7]), // no paths: by stopped time
                (SortKey::Wall, vec![4242, 7]),
            ]
        );
    }
}
