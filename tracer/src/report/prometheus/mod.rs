//! The Prometheus exporter: per-cgroup stop histograms and counters and cpu.stat mirrored, a
//! [`Sink`] of the report like the others, so that its figures are the text summary's, seen live.
//! This module tracks the cgroups that have series (at most `max_cgroups`); [`families`] is the
//! table of families, [`collector`] mirrors cpu.stat, [`labels`] has the label sets, [`demand`]
//! the advice series and [`scraper`] encodes it all for `serve`. The families, labels, bound and
//! encodings are docs/prometheus.md's.

mod collector;
mod demand;
mod families;
mod labels;
mod scraper;

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use self::collector::CpuStatCollector;
pub use self::demand::AdviceConfig;
use self::demand::{DemandCollector, Measured, WINDOW_RUNS};
use self::families::Families;
use self::labels::CgroupLabels;
pub use self::scraper::Scraper;
use super::{CgroupReport, Entry, Sink, Tick};
use crate::cpustat::CpuStat;
use crate::sampler::Snapshot;
use crate::schema::{CgroupRef, End, Line, Start};

const NS_PER_S: f64 = 1e9;
/// How often `serve`'s run loop ticks the exporter: its bookkeeping (lost records, removed
/// cgroups, cpu.stat) and its share of the advice.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// Every this many ticks the run loop reads every tracked cgroup's cpu.stat, not only those
/// whose records say it can have changed ([`Scraper::due`]).
pub const SWEEP_EVERY: u64 = 10;

/// The `Content-Type` of [`Scraper::encode`]'s OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of [`Scraper::encode`]'s Prometheus text (0.0.4).
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// The `Content-Type` of [`Scraper::protobuf`]: length-delimited `MetricFamily` messages.
pub const PROTOBUF_CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// Limits of the exported label set.
#[derive(Clone, Debug)]
pub struct Config {
    /// The most cgroups with series.
    pub max_cgroups: usize,
    /// How long a removed cgroup keeps its series.
    pub gone_after: Duration,
    /// Cgroups to track from the start, stops or not (those the selection names).
    pub named: Vec<CgroupRef>,
    /// How the advice over the rolling window is made; `None`: no demand or advice series.
    pub advice: Option<AdviceConfig>,
}

/// A cgroup with series.
#[derive(Debug)]
struct Tracked {
    labels: CgroupLabels,
    /// Its path under the cpu hierarchy, for the sampler; `None` if the id never resolved.
    path: Option<String>,
    /// Its cpu.stat at the sampler's last reading (each scrape's, and the run loop's once a
    /// second); `None` before the first or if unreadable.
    stat: Option<CpuStat>,
    /// A record of it came since its cpu.stat was last asked for: its counters can have
    /// changed (they move only at its period timer's expiry and its stops, each a record).
    changed: bool,
    /// When the sampler first found it missing.
    gone_since: Option<Instant>,
    /// Its demand and advice, once a period of its quota was measured.
    measured: Option<Measured>,
    /// Its demand histogram, once a period's demand is known: held, so that a period does not
    /// look it up in the family by its labels.
    demand: Option<Histogram>,
}

/// The tracked cgroups, shared with the scrape-time cpu.stat collector.
#[derive(Debug)]
struct Shared {
    cgroups: HashMap<u64, Tracked>,
    /// Cgroups dropped as gone since the run loop last asked ([`Scraper::take_gone`]), for the
    /// aggregate to forget too, so that a long run's memory stays bounded.
    gone: Vec<u64>,
}

type SharedRef = Arc<Mutex<Shared>>;

fn lock(shared: &SharedRef) -> std::sync::MutexGuard<'_, Shared> {
    // Nothing panics while holding it; a poisoned map is still consistent.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The exporter's state, owned by the run loop.
#[derive(Debug)]
pub struct Exporter {
    config: Config,
    families: Families,
    shared: SharedRef,
    registry: Arc<Registry>,
    /// Cgroups left out for the limit, each counted once.
    refused: HashSet<u64>,
    /// The lost-record count at the last refresh.
    lost_seen: u64,
    /// The machine's runtime slice, from the `start` line, for the advice.
    slice_ns: Option<u64>,
}

impl Exporter {
    pub fn new(config: Config) -> Self {
        let families = Families::new();
        let shared = Arc::new(Mutex::new(Shared {
            cgroups: HashMap::new(),
            gone: Vec::new(),
        }));
        let mut registry = Registry::with_prefix("throttle_tracer");
        families.register(&mut registry);
        registry.register_collector(Box::new(CpuStatCollector {
            shared: shared.clone(),
        }));
        if config.advice.is_some() {
            registry.register_collector(Box::new(DemandCollector {
                shared: shared.clone(),
            }));
        }
        let named = config.named.clone();
        let mut exporter = Self {
            config,
            families,
            shared,
            registry: Arc::new(registry),
            refused: HashSet::new(),
            lost_seen: 0,
            slice_ns: None,
        };
        for cgroup in &named {
            exporter.track(cgroup);
        }
        exporter
    }

    /// What the HTTP server encodes at each scrape.
    pub fn scraper(&self) -> Scraper {
        Scraper {
            registry: self.registry.clone(),
            shared: self.shared.clone(),
        }
    }

    /// Counts a stop of `seconds` of an ancestor's quota for each descendant in `credited`.
    fn credit(&mut self, credited: &[CgroupRef], seconds: f64) {
        for d in credited {
            let Some(labels) = self.track(d) else {
                continue;
            };
            self.families.ancestor_stops.get_or_create(&labels).inc();
            self.families
                .ancestor_cpu_stopped
                .get_or_create(&labels)
                .inc_by(seconds);
        }
    }

    /// The labels of `cgroup`, tracking it first if there is room; `None` if there is not.
    fn track(&mut self, cgroup: &CgroupRef) -> Option<CgroupLabels> {
        let id = cgroup.id;
        let mut shared = lock(&self.shared);
        if let Some(t) = shared.cgroups.get(&id) {
            return Some(t.labels.clone());
        }
        if shared.cgroups.len() >= self.config.max_cgroups {
            if self.refused.insert(id) {
                self.families.dropped("limit");
            }
            return None;
        }
        self.refused.remove(&id);
        let path = cgroup.path.clone();
        let labels = CgroupLabels::of(path.clone().unwrap_or_else(|| format!("id:{id}")));
        // A removed cgroup whose path was reused: the new one continues its series.
        let previous: Vec<u64> = shared
            .cgroups
            .iter()
            .filter(|(_, t)| t.labels == labels)
            .map(|(old, _)| *old)
            .collect();
        for old in previous {
            shared.cgroups.remove(&old);
            self.families.dropped("gone");
        }
        self.families.create(&labels);
        shared.cgroups.insert(
            id,
            Tracked {
                labels: labels.clone(),
                path,
                stat: None,
                changed: true,
                gone_since: None,
                measured: None,
                demand: None,
            },
        );
        self.families.tracked.set(shared.cgroups.len() as i64);
        Some(labels)
    }

    /// Takes a period of `cgroup`'s quota into its window, and its arrived demand once known
    /// into the histogram. A cgroup without a quota starts no window.
    fn period(&mut self, cgroup: &CgroupRef, period: &crate::records::Period) {
        let Some(advice) = self.config.advice else {
            return;
        };
        let mut shared = lock(&self.shared);
        let measured = (shared.cgroups.get(&cgroup.id)).is_some_and(|t| t.measured.is_some());
        if !measured {
            drop(shared);
            if period.bandwidth.quota_ns.is_none() || self.track(cgroup).is_none() {
                return;
            }
            self.start_window(cgroup.id, &advice);
            shared = lock(&self.shared);
        }
        let Some(Tracked {
            labels,
            measured: Some(m),
            demand,
            ..
        }) = shared.cgroups.get_mut(&cgroup.id)
        else {
            return;
        };
        let arrived = m.period(period);
        // No series before the first period whose demand is known: a group stopped in every
        // period has none until its run ends, and 115 lines of zeros would say nothing.
        if arrived.is_empty() {
            return;
        }
        let histogram = demand
            .get_or_insert_with(|| self.families.period_demand.get_or_create_owned(labels))
            .clone();
        drop(shared);
        for (ns, n) in arrived {
            for _ in 0..n {
                histogram.observe(ns as f64 / NS_PER_S);
            }
        }
    }

    /// Starts the window of the tracked cgroup `id`: one more window, each keeps an equal part
    /// of the runs.
    fn start_window(&self, id: u64, advice: &AdviceConfig) {
        let mut shared = lock(&self.shared);
        let windows = 1 + shared
            .cgroups
            .values()
            .filter(|t| t.measured.is_some())
            .count();
        let share = WINDOW_RUNS / windows;
        shared
            .cgroups
            .values_mut()
            .filter_map(|t| t.measured.as_mut())
            .for_each(|m| m.bound(share));
        if let Some(t) = shared.cgroups.get_mut(&id) {
            t.measured = Some(Measured::new(advice, share));
        }
    }

    /// Hands `cgroup`'s window what its held threads' records say, if it has one.
    fn measured(&self, cgroup: &CgroupRef, take: impl FnOnce(&mut Measured)) {
        if let Some(m) = lock(&self.shared)
            .cgroups
            .get_mut(&cgroup.id)
            .and_then(|t| t.measured.as_mut())
        {
            take(m);
        }
    }

    /// Marks `cgroup`'s cpu.stat as due for a reading, if it is tracked.
    fn changed(&self, cgroup: &CgroupRef) {
        if let Some(t) = lock(&self.shared).cgroups.get_mut(&cgroup.id) {
            t.changed = true;
        }
    }

    /// Takes the sampler's reading of the tracked cgroups it read ([`Scraper::due`]), which
    /// scrapes then serve, and drops the cgroups found missing (no path, or no directory) for
    /// longer than `gone_after`. A cgroup not read keeps its last reading.
    fn update(&mut self, snapshot: &Snapshot, now: Instant) {
        let mut shared = lock(&self.shared);
        let mut gone = Vec::new();
        // The advice is made between two drains of the ring buffer: a tick makes only its
        // share of the cgroups' advice (each once per `--advice-every`), so that cgroups whose
        // windows began together do not all come due in one tick while records pile up.
        let mut advice_budget = self.config.advice.map_or(0, |a| {
            let measured = shared
                .cgroups
                .values()
                .filter(|t| t.measured.is_some())
                .count();
            let ticks = (a.every.as_secs_f64() / REFRESH_EVERY.as_secs_f64()).max(1.0);
            (measured as f64 / ticks).ceil() as usize + 1
        });
        for (id, t) in &mut shared.cgroups {
            let present = match snapshot.get(id) {
                Some(sample) if sample.exists => {
                    t.stat.clone_from(&sample.stat);
                    t.gone_since = None;
                    true
                }
                // Not read this time: its counters are as last read.
                None => t.path.is_some(),
                Some(_) => false,
            };
            if present {
                if let (Some(m), Some(advice)) = (&mut t.measured, &self.config.advice) {
                    m.read(t.stat.as_ref(), now, advice);
                    if advice_budget > 0 && m.refresh(now, self.slice_ns, advice) {
                        advice_budget -= 1;
                    }
                }
            } else {
                t.stat = None;
                let since = *t.gone_since.get_or_insert(now);
                if now.duration_since(since) >= self.config.gone_after {
                    gone.push(*id);
                }
            }
        }
        for id in &gone {
            if let Some(t) = shared.cgroups.remove(id) {
                self.families.remove(&t.labels);
                self.families.dropped("gone");
            }
        }
        shared.gone.extend(gone);
        self.families.tracked.set(shared.cgroups.len() as i64);
    }
}

impl Sink for Exporter {
    fn takes_lines(&self) -> bool {
        true
    }

    fn line(&mut self, entry: &Entry) {
        let (cgroup, stop_ns) = match entry.line {
            Line::Start(s) => {
                self.slice_ns = s.bandwidth_slice_ns;
                return;
            }
            Line::Period(p) => {
                self.changed(&p.cgroup);
                self.period(&p.cgroup, &p.period);
                return;
            }
            Line::StopBegin(s) => (&s.cgroup, None),
            Line::Stop(s) => {
                if s.started.threads_unlisted > 0 {
                    let start_ns = s.started.start_ns;
                    self.measured(&s.started.cgroup, |m| m.unknown_hold(start_ns));
                }
                (&s.started.cgroup, Some(s.duration_ns))
            }
            Line::UnseenStartStop(u) => (&u.cgroup, None),
            Line::AncestorStop(a) => {
                self.credit(entry.credited, a.stop.duration_ns as f64 / NS_PER_S);
                return;
            }
            Line::Deferred(d) => {
                self.measured(&d.cgroup, |m| m.deferred(&d.deferred));
                return;
            }
            Line::Advice(_)
            | Line::ClockStep(_)
            | Line::Summary(_)
            | Line::End(_)
            | Line::Other => return,
        };
        if let Some(ns) = stop_ns {
            self.credit(entry.credited, ns as f64 / NS_PER_S);
        }
        let Some(labels) = self.track(cgroup) else {
            return;
        };
        self.changed(cgroup);
        let f = &self.families;
        if let Some(ns) = stop_ns {
            let seconds = ns as f64 / NS_PER_S;
            f.cpu_stop.get_or_create(&labels).observe(seconds);
            f.stops.get_or_create(&labels).inc();
            f.cpu_stopped.get_or_create(&labels).inc_by(seconds);
        }
        if let Some(ns) = entry.group_stop_ns {
            let seconds = ns as f64 / NS_PER_S;
            f.group_stop.get_or_create(&labels).observe(seconds);
            f.wall_stopped.get_or_create(&labels).inc_by(seconds);
        }
    }

    /// The kernel's lost-record count, and the sampler's reading of the tracked cgroups.
    fn tick(&mut self, tick: &Tick) -> io::Result<()> {
        self.families
            .lost
            .inc_by(tick.lost.saturating_sub(self.lost_seen));
        self.lost_seen = self.lost_seen.max(tick.lost);
        self.update(tick.snapshot, tick.at);
        Ok(())
    }

    fn finish(self: Box<Self>, _: &Start, _: &[CgroupReport], _: &End) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::MetricFamily;
    use prost::Message;

    use super::*;
    use crate::aggregate::Aggregate;
    use crate::cgroups::{Hierarchy, Version};
    use crate::records::Event;
    use crate::report::Report;
    use crate::testing::{MS, ended};

    pub(super) fn tree() -> (tempfile::TempDir, Hierarchy, u64) {
        let dir = tempfile::tempdir().unwrap();
        let child = dir.path().join("demo");
        std::fs::create_dir(&child).unwrap();
        std::fs::write(
            child.join("cpu.stat"),
            "nr_periods 7\nnr_throttled 5\nthrottled_time 400000000\n",
        )
        .unwrap();
        let h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let id = h.id_of("/demo").unwrap();
        (dir, h, id)
    }

    /// `exporter` as the one sink of a report, and its scraper.
    pub(super) fn reporting(exporter: Exporter) -> (Report<'static>, Scraper) {
        let scraper = exporter.scraper();
        (
            Report::new(Start::default(), vec![Box::new(exporter)]),
            scraper,
        )
    }

    /// The run loop's tick: the sampler's reading of the tracked cgroups; returns the cgroups
    /// dropped as gone.
    pub(super) fn ticked(
        report: &mut Report,
        scraper: &Scraper,
        h: &Hierarchy,
        lost: u64,
        at: Instant,
    ) -> Vec<u64> {
        let sampler = crate::sampler::Sampler::at(h, None);
        let snapshot = sampler.read_now(&scraper.due(true));
        report
            .tick(&Tick {
                at,
                snapshot: &snapshot,
                intervals: Vec::new(),
                paths: &HashMap::new(),
                lost,
            })
            .unwrap();
        scraper.take_gone()
    }

    pub(super) fn config(max_cgroups: usize) -> Config {
        Config {
            max_cgroups,
            gone_after: Duration::from_secs(300),
            named: Vec::new(),
            advice: Some(AdviceConfig::default()),
        }
    }

    /// The value of the sample line `name{labels}` in Prometheus text.
    pub(super) fn sample(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    /// Stops on two CPUs of /demo: [0, 80] and [20, 100] overlap, then [200, 280], through the
    /// aggregate and the report as the run loop feeds them.
    pub(super) fn feed(report: &mut Report, h: &mut Hierarchy, id: u64) -> Aggregate {
        let mut agg = Aggregate::watching(&[]);
        for (cpu, s, end) in [(0, 0, 80), (1, 20, 100), (0, 200, 280)] {
            let mut stop = ended(cpu, s, end);
            stop.stop.cgroup_id = id;
            for ev in [Event::Start(stop.stop.clone()), Event::End(stop)] {
                let closed = agg.ingest(&ev);
                report.event(&ev, h.path_of(id), closed, &[]);
            }
        }
        agg
    }

    #[test]
    fn series_are_the_aggregates_figures_and_cpu_stat() {
        let (_dir, mut h, id) = tree();
        let (mut report, scraper) = reporting(Exporter::new(config(10)));
        let agg = feed(&mut report, &mut h, id);
        ticked(&mut report, &scraper, &h, 3, Instant::now());
        let (ty, text) = scraper.encode(false).unwrap();
        assert_eq!(ty, TEXT_CONTENT_TYPE);
        let l = r#"{cgroup="/demo"}"#;
        assert_eq!(
            sample(&text, &format!("throttle_tracer_stops_total{l}")),
            3.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("throttle_tracer_cpu_stopped_seconds_total{l}")
            ),
            0.24
        );
        assert_eq!(
            sample(&text, &format!("throttle_tracer_cpu_stop_seconds_count{l}")),
            3.0
        );
        // [0, 100] is final once [200, 280] began; [200, 280] is not yet.
        assert_eq!(
            sample(
                &text,
                &format!("throttle_tracer_group_stop_seconds_count{l}")
            ),
            1.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("throttle_tracer_wall_stopped_seconds_total{l}")
            ),
            0.1
        );
        assert_eq!(
            sample(
                &text,
                r#"throttle_tracer_cpu_stop_seconds_bucket{cgroup="/demo",le="0.064"}"#
            ),
            0.0
        );
        assert_eq!(
            sample(
                &text,
                r#"throttle_tracer_cpu_stop_seconds_bucket{cgroup="/demo",le="0.128"}"#
            ),
            3.0
        );
        assert_eq!(
            sample(
                &text,
                r#"throttle_tracer_cpu_stop_seconds_bucket{cgroup="/demo",le="4.096"}"#
            ),
            3.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("throttle_tracer_cpustat_nr_throttled_total{l}")
            ),
            5.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("throttle_tracer_cpustat_nr_periods_total{l}")
            ),
            7.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("throttle_tracer_cpustat_throttled_seconds_total{l}")
            ),
            0.4
        );
        assert_eq!(sample(&text, "throttle_tracer_lost_records_total"), 3.0);
        assert_eq!(sample(&text, "throttle_tracer_cgroups_tracked"), 1.0);
        // The same figures as the end-of-run summary.
        let s = &agg.finish(300 * MS)[0];
        assert_eq!(s.stops.count, 3);
        assert_eq!(s.stops.sum_ns, 240 * MS);

        let (ty, om) = scraper.encode(true).unwrap();
        assert_eq!(ty, OPENMETRICS_CONTENT_TYPE);
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(om.contains("# UNIT throttle_tracer_cpu_stop_seconds seconds"));
    }

    /// A protobuf scrape body: the length-delimited `MetricFamily` messages, decoded.
    pub(crate) fn families(mut body: &[u8]) -> Vec<MetricFamily> {
        let mut families = Vec::new();
        while !body.is_empty() {
            families.push(MetricFamily::decode_length_delimited(&mut body).unwrap());
        }
        families
    }

    /// A stop of /demo's quota that stopped its children /demo/a and /demo/b counts for both.
    #[test]
    fn ancestor_stops_count_for_every_stopped_child() {
        let (dir, mut h, id) = tree();
        let mut children = Vec::new();
        for c in ["a", "b"] {
            std::fs::create_dir(dir.path().join("demo").join(c)).unwrap();
            children.push(h.id_of(&format!("/demo/{c}")).unwrap());
        }
        let (mut report, scraper) = reporting(Exporter::new(config(10)));
        let mut stop = ended(0, 0, 80);
        stop.stop.cgroup_id = id;
        stop.stop.children = children;
        let credited: Vec<CgroupRef> = stop
            .stop
            .credited()
            .into_iter()
            .map(|d| CgroupRef::new(d, h.path_of(d)))
            .collect();
        report.ancestor_stop(&stop, h.path_of(id), &credited);
        let (_, text) = scraper.encode(false).unwrap();
        for c in ["a", "b"] {
            let l = format!(r#"{{cgroup="/demo/{c}"}}"#);
            assert_eq!(
                sample(&text, &format!("throttle_tracer_ancestor_stops_total{l}")),
                1.0
            );
            assert_eq!(
                sample(
                    &text,
                    &format!("throttle_tracer_ancestor_cpu_stopped_seconds_total{l}")
                ),
                0.08
            );
            assert_eq!(
                sample(&text, &format!("throttle_tracer_stops_total{l}")),
                0.0
            );
        }
    }

    #[test]
    fn cgroups_beyond_the_limit_and_gone_ones_are_dropped_and_counted() {
        let (dir, mut h, id) = tree();
        std::fs::create_dir(dir.path().join("other")).unwrap();
        let other = h.id_of("/other").unwrap();
        let (mut report, scraper) = reporting(Exporter::new(config(1)));
        feed(&mut report, &mut h, id);
        feed(&mut report, &mut h, other);
        let (_, text) = scraper.encode(false).unwrap();
        assert!(!text.contains(r#"cgroup="/other""#), "{text}");
        let limit = r#"throttle_tracer_cgroups_dropped_total{reason="limit"}"#;
        let gone = r#"throttle_tracer_cgroups_dropped_total{reason="gone"}"#;
        assert_eq!(sample(&text, limit), 1.0, "counted once, not per record");

        // /demo disappears: kept for the grace period, then dropped; /other gets its place.
        std::fs::remove_dir_all(dir.path().join("demo")).unwrap();
        let t0 = Instant::now();
        let mut tick = |at| ticked(&mut report, &scraper, &h, 0, at);
        assert!(tick(t0).is_empty());
        assert!(tick(t0 + Duration::from_secs(299)).is_empty());
        assert_eq!(tick(t0 + Duration::from_secs(300)), [id]);
        let (_, text) = scraper.encode(false).unwrap();
        assert!(!text.contains(r#"cgroup="/demo""#), "{text}");
        assert_eq!(sample(&text, gone), 1.0);
        assert_eq!(sample(&text, "throttle_tracer_cgroups_tracked"), 0.0);
        feed(&mut report, &mut h, other);
        let (_, text) = scraper.encode(false).unwrap();
        assert_eq!(
            sample(&text, r#"throttle_tracer_stops_total{cgroup="/other"}"#),
            3.0
        );
    }

    #[test]
    fn named_cgroups_have_series_before_they_stop() {
        let (_dir, mut h, demo) = tree();
        let (mut report, scraper) = reporting(Exporter::new(Config {
            named: vec![CgroupRef::new(demo, h.path_of(demo))],
            ..config(10)
        }));
        ticked(&mut report, &scraper, &h, 0, Instant::now());
        let (_, text) = scraper.encode(false).unwrap();
        assert_eq!(
            sample(&text, r#"throttle_tracer_stops_total{cgroup="/demo"}"#),
            0.0
        );
        assert_eq!(
            sample(
                &text,
                r#"throttle_tracer_cpustat_nr_throttled_total{cgroup="/demo"}"#
            ),
            5.0
        );
    }

    /// Between sweeps, a tick reads only the cgroups with a record since their last reading:
    /// an idle cgroup's counters cannot have moved.
    #[test]
    fn only_cgroups_with_a_record_since_their_last_reading_are_due_between_sweeps() {
        let (dir, mut h, demo) = tree();
        std::fs::create_dir(dir.path().join("idle")).unwrap();
        std::fs::write(
            dir.path().join("idle/cpu.stat"),
            "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
        )
        .unwrap();
        let idle = h.id_of("/idle").unwrap();
        let (mut report, scraper) = reporting(Exporter::new(Config {
            named: [demo, idle]
                .map(|id| CgroupRef::new(id, h.path_of(id)))
                .to_vec(),
            ..config(10)
        }));
        let due = |all| {
            let mut ids: Vec<u64> = scraper.due(all).iter().map(|t| t.id).collect();
            ids.sort_unstable();
            ids
        };
        let mut both = vec![demo, idle];
        both.sort_unstable();
        assert_eq!(due(false), both, "never read: both");
        ticked(&mut report, &scraper, &h, 0, Instant::now());
        assert_eq!(due(false), Vec::<u64>::new());
        feed(&mut report, &mut h, demo);
        assert_eq!(due(false), [demo]);
        assert_eq!(due(false), Vec::<u64>::new(), "asked for once");
        assert_eq!(due(true), both);
        // Not read, not gone: /idle keeps its series and its reading.
        ticked(&mut report, &scraper, &h, 0, Instant::now());
        let snapshot = crate::sampler::Sampler::at(&h, None).read_now(&scraper.due(false));
        assert!(snapshot.is_empty());
        report
            .tick(&Tick {
                at: Instant::now() + Duration::from_secs(3600),
                snapshot: &snapshot,
                intervals: Vec::new(),
                paths: &HashMap::new(),
                lost: 0,
            })
            .unwrap();
        let (_, text) = scraper.encode(false).unwrap();
        assert_eq!(
            sample(
                &text,
                r#"throttle_tracer_cpustat_nr_periods_total{cgroup="/idle"}"#
            ),
            0.0
        );
        assert_eq!(sample(&text, "throttle_tracer_cgroups_tracked"), 2.0);
    }

    /// Every family of docs/prometheus.md's "Metric families", with its type, in the order of the
    /// exposition and the same in the three encodings (OpenMetrics names a counter's family
    /// without `_total`).
    #[test]
    fn every_family_with_its_type_in_every_encoding() {
        let expected = [
            ("cpu_stop_seconds", "histogram"),
            ("group_stop_seconds", "histogram"),
            ("stops_total", "counter"),
            ("cpu_stopped_seconds_total", "counter"),
            ("wall_stopped_seconds_total", "counter"),
            ("ancestor_stops_total", "counter"),
            ("ancestor_cpu_stopped_seconds_total", "counter"),
            ("period_demand_seconds", "histogram"),
            ("lost_records_total", "counter"),
            ("cgroups_tracked", "gauge"),
            ("cgroups_dropped_total", "counter"),
            ("cpustat_nr_periods_total", "counter"),
            ("cpustat_nr_throttled_total", "counter"),
            ("cpustat_throttled_seconds_total", "counter"),
            ("periods_total", "counter"),
            ("throttled_periods_total", "counter"),
            ("quota_seconds", "gauge"),
            ("period_seconds", "gauge"),
            ("burst_seconds", "gauge"),
            ("advised_quota_seconds", "gauge"),
            ("advised_burst_seconds", "gauge"),
            ("advised_period_seconds", "gauge"),
            ("advice_target_ratio", "gauge"),
            ("advice_window_seconds", "gauge"),
            ("advice_missing", "gauge"),
            ("unfinished_run_demand_seconds", "gauge"),
            ("unfinished_run_periods", "gauge"),
            ("advice_stopped_ratio", "gauge"),
            ("cpustat_throttled_ratio", "gauge"),
        ]
        .map(|(name, ty)| (format!("throttle_tracer_{name}"), ty.to_owned()));
        let (_dir, mut h, id) = tree();
        let (mut report, scraper) = reporting(Exporter::new(config(10)));
        feed(&mut report, &mut h, id);
        // A measured period: the demand histogram has a series.
        let mut p = crate::testing::period(100, 20, 1, false);
        p.cgroup_id = id;
        report.period(&p, Some("/demo"));
        ticked(&mut report, &scraper, &h, 0, Instant::now());
        let protobuf: Vec<(String, String)> = families(&scraper.protobuf().unwrap())
            .iter()
            .map(|f| (f.name.clone(), format!("{:?}", f.r#type()).to_lowercase()))
            .collect();
        assert_eq!(protobuf, expected);
        let declared = |text: &str| -> Vec<(String, String)> {
            text.lines()
                .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
                .map(|(name, ty)| (name.to_owned(), ty.to_owned()))
                .collect()
        };
        assert_eq!(declared(&scraper.encode(false).unwrap().1), expected);
        let openmetrics = expected
            .clone()
            .map(|(name, ty)| match name.strip_suffix("_total") {
                Some(family) if ty == "counter" => (family.to_owned(), ty),
                _ => (name, ty),
            });
        assert_eq!(declared(&scraper.encode(true).unwrap().1), openmetrics);
    }
}
