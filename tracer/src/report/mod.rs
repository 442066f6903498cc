//! Readers of the aggregate: the run's output, written to a list of [`Sink`]s (NDJSON, the
//! `--record` file, the end's text, the live view ([`live`]), `serve`'s exporter ([`prometheus`])).
//! Nothing here reads the machine: cgroup readings come from the caller. The run loop drives one
//! [`Report`]: made with the `start` line, then fed records, readings and keys, and finished with
//! [`collect`]'s [`CgroupReport`]s (the trace's [`CgroupSummary`] joined with the cgroup's files at
//! the end). The figures' definitions are docs/definitions.md's.

mod advice_text;
mod histogram;
pub mod live;
pub mod prometheus;
pub mod sink;
mod text;

use std::collections::HashMap;
use std::io;

use crossterm::event::Event as Key;

pub use sink::{AdviceOnly, Entry, Ndjson, Sink, Text, Tick};

use crate::advice::{self, Advice, Target};
use crate::aggregate::{CgroupSummary, DurationSummary};
use crate::cgroups::Hierarchy;
use crate::cpustat::CpuStat;
use crate::records::{Bandwidth, Deferred, EndedStop, Event, Lost, Period};
use crate::sampler::{Baseline, Sample, Snapshot};
use crate::schema::{self, CgroupRef, End, Line, Start};
use crate::wallclock::{self, Step};

/// One cgroup's measurements and its cgroup-file readings at the end of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct CgroupReport {
    pub summary: CgroupSummary,
    /// Path under the cpu hierarchy; `None` if the id no longer (or never) resolved.
    pub path: Option<String>,
    /// cpu.stat change since the baseline; `None` if the cgroup is gone or unreadable.
    pub cpu_stat: Option<CpuStat>,
    /// Quota settings at the end (the control files).
    pub settings: Option<Bandwidth>,
    /// The cgroup was removed during the trace: at the end no directory of the hierarchy is
    /// this cgroup (none at its path, or one made again there, with another id). Its figures
    /// are the trace's to its removal; it has no cpu.stat delta.
    pub gone: bool,
    /// Its cpu.stat or quota files could not be read for want of permission at the end (a
    /// private subtree, mode 700, traced by a process without root): why it has no cpu.stat
    /// delta although it exists.
    pub unreadable: bool,
    /// Its records the kernel could not put in the ring buffer: which of its figures are
    /// incomplete.
    pub lost: Lost,
}

impl CgroupReport {
    /// Joins the summary with the cgroup's end-of-trace reading. What could not be read (the
    /// cgroup was removed, the v2 root has no cpu.max, ...) is `None`: the report still has the
    /// trace's own figures.
    pub fn collect(
        mut summary: CgroupSummary,
        hierarchy: &mut Hierarchy,
        baseline: &Baseline,
        end: Option<&Sample>,
        lost: Lost,
    ) -> Self {
        for a in summary
            .descendants
            .iter_mut()
            .chain(summary.stopped_by_ancestor.iter_mut())
        {
            a.path = hierarchy.path_of(a.cgroup_id).map(str::to_owned);
        }
        let path = hierarchy.path_of(summary.cgroup_id).map(str::to_owned);
        let cpu_stat = end
            .and_then(|e| e.stat.as_ref())
            .and_then(|now| baseline.delta(summary.cgroup_id, now).ok());
        let settings = end.and_then(|e| e.settings);
        // No path now (after a fresh walk, if the last is a second old) or a sample that found
        // another directory, or none, at the path: no directory is this cgroup any more.
        let gone = !end.is_some_and(|e| e.exists);
        let unreadable = end.is_some_and(|e| e.denied);
        Self {
            summary,
            path,
            cpu_stat,
            settings,
            gone,
            unreadable,
            lost,
        }
    }

    /// The trace's account of the cpu.stat.local throttled-time delta (6.6+): the group's own
    /// stops' kernel time plus that of the ancestors' stops that stopped its tasks.
    pub fn local_accounted_ns(&self) -> u64 {
        let s = &self.summary;
        s.stopped_by_ancestor
            .iter()
            .fold(s.kernel_accounted_ns(), |t, a| {
                t.saturating_add(a.kernel_ns)
            })
    }

    /// What to set, from the demand the trace measured (`advice::advise`); `None` without a
    /// measured run or a quota. The settings are the control files' at the end, else the
    /// kernel's in the last period.
    pub fn advice(&self, target: Target) -> Option<Advice> {
        let demand = self.summary.demand.as_ref()?;
        let current = self
            .settings
            .filter(|s| s.period_ns.is_some())
            .unwrap_or(demand.bandwidth);
        let kernel = advice::Kernel {
            burst: current.burst_ns.is_some() || demand.bandwidth.burst_ns.is_some(),
        };
        advice::advise(demand, current, kernel, target)
    }

    /// Its `advice` line, if it has advice.
    pub fn advice_line(&self, target: Target) -> Option<schema::AdviceLine> {
        let advice = self.advice(target)?;
        let d = self.summary.demand.as_ref()?;
        Some(schema::AdviceLine {
            cgroup: CgroupRef::new(self.summary.cgroup_id, self.path.as_deref()),
            periods: d.periods,
            throttled_periods: d.throttled_periods,
            usage_ns: d.usage_ns,
            burst_spent_ns: d.burst_spent_ns,
            run_p50_ns: d.runs.percentiles.map(|p| p.p50_ns),
            run_p90_ns: d.runs.percentiles.map(|p| p.p90_ns),
            waiting_periods: d.waiting.count,
            waiting_p50_ns: d.waiting.percentiles.map(|p| p.p50_ns),
            waiting_p99_ns: d.waiting.percentiles.map(|p| p.p99_ns),
            waiting_max_ns: d.waiting.percentiles.map(|p| p.max_ns),
            waiting_unplaced: d.holds_unplaced,
            runs_log2_ms: d.runs.log2_ms.clone(),
            largest_runs: d
                .largest
                .iter()
                .map(|&run| schema::RunLine {
                    run,
                    wall: schema::WallSpan::default(),
                })
                .collect(),
            advice,
        })
    }

    /// cpu.stat throttled-time delta ÷ wall-clock stopped time; `None` if either is missing or 0.
    pub fn overcount(&self) -> Option<f64> {
        let throttled = self.cpu_stat.as_ref()?.throttled_ns;
        let wall = self.summary.group_stops.sum_ns;
        (throttled > 0 && wall > 0).then(|| throttled as f64 / wall as f64)
    }

    /// Its `summary` line.
    pub fn summary_line(&self) -> schema::Summary {
        let s = &self.summary;
        let pct = |d: &DurationSummary| {
            d.percentiles
                .map(|p| [p.p50_ns, p.p90_ns, p.p99_ns, p.max_ns].map(Some))
                .unwrap_or_default()
        };
        let [p50_ns, p90_ns, p99_ns, max_ns] = pct(&s.stops);
        let [group_p50_ns, group_p90_ns, group_p99_ns, group_max_ns] = pct(&s.group_stops);
        schema::Summary {
            cgroup: CgroupRef::new(s.cgroup_id, self.path.as_deref()),
            stops: s.stops.count,
            group_stops: s.group_stops.count,
            cpu_stop_ns: s.stops.sum_ns,
            kernel_stop_ns: s.kernel_stop_ns,
            kernel_unknown_stops: s.kernel_unknown_stops,
            wall_stop_ns: s.group_stops.sum_ns,
            p50_ns,
            p90_ns,
            p99_ns,
            max_ns,
            group_p50_ns,
            group_p90_ns,
            group_p99_ns,
            group_max_ns,
            stops_log2_ms: s.stops.log2_ms.clone(),
            group_stops_log2_ms: s.group_stops.log2_ms.clone(),
            end_reasons: s
                .end_reasons
                .iter()
                .map(|(r, n)| (r.as_str().to_owned(), *n))
                .collect(),
            open: s.open_stops.len(),
            open_stops: s.open_stops.iter().map(schema::OpenStop::of).collect(),
            unseen_start_stops: s.unseen_start_stops,
            unseen_start_kernel_ns: s.unseen_start_kernel_ns,
            unseen_start_kernel_unknown: s.unseen_start_kernel_unknown,
            kernel_accounted_ns: s.kernel_accounted_ns(),
            unmatched_ends: s.unmatched_ends,
            restarted: s.restarted,
            cpu_stat: self.cpu_stat.clone(),
            overcount: self.overcount(),
            settings: self.settings.unwrap_or_default(),
            descendants: s.descendants.clone(),
            stopped_by_ancestor: s.stopped_by_ancestor.clone(),
            children_unlisted_stops: s.children_unlisted_stops,
            local_accounted_ns: self.local_accounted_ns(),
            processes: s
                .held
                .processes
                .iter()
                .map(schema::ProcessLine::of)
                .collect(),
            threads_unlisted: s.held.unlisted,
            gone: self.gone,
            unreadable: self.unreadable,
            lost: self.lost,
        }
    }
}

/// One [`CgroupReport`] per cgroup the trace saw, most stopped first, from the summaries,
/// each cgroup's end-of-trace reading in `end` and its lost records in `lost`.
pub fn collect(
    summaries: Vec<CgroupSummary>,
    hierarchy: &mut Hierarchy,
    baseline: &Baseline,
    end: &Snapshot,
    lost: &HashMap<u64, Lost>,
) -> Vec<CgroupReport> {
    summaries
        .into_iter()
        .map(|summary| {
            let sample = end.get(&summary.cgroup_id);
            let lost = lost.get(&summary.cgroup_id).copied().unwrap_or_default();
            CgroupReport::collect(summary, hierarchy, baseline, sample, lost)
        })
        .collect()
}

/// The run's output: every line, every tick and the end, to each of its sinks.
pub struct Report<'a> {
    start: Start,
    sinks: Vec<Box<dyn Sink + 'a>>,
    /// The wall-clock offset the lines are stamped with; `None` for a recording made before
    /// the lines had wall-clock times.
    clock: Option<wallclock::Reading>,
}

impl<'a> Report<'a> {
    /// Starts the output: each sink gets the `start` line now, its wall-clock times filled
    /// in from its `realtime_offset_ns`.
    pub fn new(mut start: Start, sinks: Vec<Box<dyn Sink + 'a>>) -> Self {
        let clock = start
            .realtime_offset_ns
            .map(|offset_ns| wallclock::Reading {
                at_ns: start.start_ns.unwrap_or_default(),
                offset_ns,
            });
        if let Some(clock) = clock {
            start.stamp(clock);
        }
        let mut report = Self {
            start,
            sinks: Vec::with_capacity(sinks.len()),
            clock,
        };
        for sink in sinks {
            report.sinks.push(report.started(sink));
        }
        report
    }

    /// Adds a sink once the run is under way (the live view, which takes the terminal only
    /// once the probes are attached; the exporter). It gets the `start` line now, and finishes
    /// before the others: a view that holds the terminal gives it back before the summary.
    pub fn add(&mut self, sink: Box<dyn Sink + 'a>) {
        let sink = self.started(sink);
        self.sinks.insert(0, sink);
    }

    fn started(&self, mut sink: Box<dyn Sink + 'a>) -> Box<dyn Sink + 'a> {
        sink.line(&Entry {
            line: &Line::Start(self.start.clone()),
            group_stop_ns: None,
            credited: &[],
        });
        sink
    }

    /// The wall clock was stepped: a `clock_step` line, and the new offset from now on.
    pub fn clock_step(&mut self, step: Step) {
        self.clock = Some(step.now);
        self.emit(|| Line::ClockStep(schema::ClockStep::of(step)), None, &[]);
    }

    /// Gives `line` to the sinks that take lines; made only if one of them does.
    fn emit(
        &mut self,
        line: impl FnOnce() -> Line,
        group_stop_ns: Option<u64>,
        credited: &[CgroupRef],
    ) {
        if !self.sinks.iter().any(|s| s.takes_lines()) {
            return;
        }
        let mut line = line();
        if let Some(clock) = self.clock {
            line.stamp(clock);
        }
        let entry = Entry {
            line: &line,
            group_stop_ns,
            credited,
        };
        for sink in self.sinks.iter_mut().filter(|s| s.takes_lines()) {
            sink.line(&entry);
        }
    }

    /// One record of a traced cgroup (`cgroup`: its path if it resolved), with the group stop
    /// the aggregate closed on it and the traced descendants it stopped.
    pub fn event(
        &mut self,
        event: &Event,
        cgroup: Option<&str>,
        group_stop_ns: Option<u64>,
        credited: &[CgroupRef],
    ) {
        if matches!(event, Event::Start(_)) && !self.sinks.iter().any(|s| s.takes_stop_begins()) {
            return;
        }
        self.emit(|| Line::of_event(event, cgroup), group_stop_ns, credited);
    }

    /// One period of a cgroup with a quota: a `period` line.
    pub fn period(&mut self, period: &Period, cgroup: Option<&str>) {
        self.emit(
            || Line::Period(schema::PeriodLine::of(period, cgroup)),
            None,
            &[],
        );
    }

    /// The deferred work one held thread ran: a `deferred` line.
    pub fn deferred(&mut self, deferred: &Deferred, cgroup: Option<&str>) {
        self.emit(
            || Line::Deferred(schema::DeferredLine::of(deferred, cgroup)),
            None,
            &[],
        );
    }

    /// An ended stop of an ancestor that is traced only for `credited`, the traced descendants
    /// it stopped: an `ancestor_stop` line.
    pub fn ancestor_stop(&mut self, end: &EndedStop, cgroup: Option<&str>, credited: &[CgroupRef]) {
        self.emit(
            || {
                Line::AncestorStop(schema::AncestorStop {
                    stop: schema::Stop::of(end, cgroup),
                    credited_cgroup_ids: credited.iter().map(|c| c.id).collect(),
                })
            },
            None,
            credited,
        );
    }

    /// The end of a batch of records, to every sink ([`Sink::flush`]).
    pub fn flush(&mut self) {
        for sink in &mut self.sinks {
            sink.flush();
        }
    }

    /// A periodic reading, to every sink; the first write error.
    pub fn tick(&mut self, tick: &Tick) -> io::Result<()> {
        self.sinks.iter_mut().try_for_each(|s| s.tick(tick))
    }

    /// A key press or resize, to every sink; true when one of them ends the run.
    pub fn key(&mut self, key: &Key) -> io::Result<bool> {
        let mut ends = false;
        for sink in &mut self.sinks {
            ends |= sink.key(key)?;
        }
        Ok(ends)
    }

    /// The per-cgroup summaries and the totals, then each sink's end; returns the first
    /// write error of the run, in the order of the sinks.
    pub fn finish(mut self, reports: &[CgroupReport], totals: &End) -> io::Result<()> {
        for r in reports {
            self.emit(|| Line::Summary(Box::new(r.summary_line())), None, &[]);
        }
        let target = self.start.advice_target.unwrap_or_default();
        for line in reports.iter().filter_map(|r| r.advice_line(target)) {
            self.emit(|| Line::Advice(Box::new(line)), None, &[]);
        }
        self.emit(|| Line::End(*totals), None, &[]);
        let mut first = Ok(());
        for sink in self.sinks {
            let result = sink.finish(&self.start, reports, totals);
            if first.is_ok() {
                first = result;
            }
        }
        first
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::Value;

    use super::*;
    use crate::aggregate::Aggregate;
    use crate::cgroups::Version;
    use crate::cpustat::TimeUnit;
    use crate::records::Event;
    use crate::testing::{MS, ended};

    /// /demo: two CPUs, three overlapping-in-pairs stops of 80 ms, one open at the end.
    pub(crate) fn demo_report() -> CgroupReport {
        let mut agg = Aggregate::watching(&[]);
        for (cpu, s, e) in [(0, 0, 80), (1, 20, 100), (0, 200, 280)] {
            let end = ended(cpu, s, e);
            agg.ingest(&Event::Start(end.stop.clone()));
            agg.ingest(&Event::End(end));
        }
        agg.ingest(&Event::Start(ended(1, 300, 301).stop));
        agg.ingest(&Event::UnseenStartEnd {
            cgroup_id: 4242,
            cpu: 1,
            end_ns: 5 * MS,
            kernel_ns: Some(30 * MS),
        });
        let summary = agg.finish(350 * MS).remove(0);
        CgroupReport {
            summary,
            path: Some("/demo".into()),
            cpu_stat: Some(CpuStat {
                unit: TimeUnit::Nanos,
                nr_periods: 4,
                nr_throttled: 3,
                throttled_ns: 270 * MS,
                nr_bursts: Some(0),
                burst_ns: Some(0),
                wait_sum_ns: None,
                usage_ns: None,
                user_ns: None,
                system_ns: None,
                local_throttled_ns: Some(270 * MS),
            }),
            settings: Some(Bandwidth {
                quota_ns: Some(20 * MS),
                period_ns: Some(100 * MS),
                burst_ns: Some(0),
            }),
            gone: false,
            unreadable: false,
            lost: Lost::default(),
        }
    }

    /// Runs one stop through a report with `sink` and returns what it wrote.
    fn written(sink: impl FnOnce(&mut Vec<u8>) -> Box<dyn Sink + '_>) -> String {
        let mut buf = Vec::new();
        let start = Start {
            backend: "kprobe".into(),
            ..Start::default()
        };
        let mut report = Report::new(start, vec![sink(&mut buf)]);
        report.event(&Event::End(ended(0, 0, 80)), Some("/demo"), None, &[]);
        report.finish(&[demo_report()], &End::default()).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn report_writes_ndjson_as_it_goes_or_text_at_the_end() {
        let text = written(|buf| Box::new(Ndjson::to(buf, Some(0))));
        let types: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["type"].to_string())
            .collect();
        assert_eq!(
            types,
            [r#""start""#, r#""stop""#, r#""summary""#, r#""end""#]
        );

        let text = written(|buf| Box::new(Text::to(buf)));
        assert!(text.starts_with("throttle-tracer: "), "{text}");
        assert!(text.contains("/demo (id 4242)"));
    }

    #[test]
    fn write_errors_surface_at_finish() {
        struct Closed;
        impl io::Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut report = Report::new(
            Start::default(),
            vec![Box::new(Ndjson::to(Closed, Some(0)))],
        );
        report.event(&Event::End(ended(0, 0, 80)), None, None, &[]);
        let err = report.finish(&[], &End::default()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn overcount_is_cpu_stat_over_wall_clock() {
        let mut r = demo_report();
        // Group stops [0, 100] and [200, 280]: 180 ms of wall clock.
        assert_eq!(r.summary.group_stops.sum_ns, 180 * MS);
        assert_eq!(r.overcount(), Some(1.5));
        r.cpu_stat = None;
        assert_eq!(r.overcount(), None);
    }

    #[test]
    fn collect_reads_the_cgroup_files() {
        let dir = tempfile::tempdir().unwrap();
        let child = dir.path().join("demo");
        std::fs::create_dir(&child).unwrap();
        std::fs::write(
            child.join("cpu.stat"),
            "nr_periods 1\nnr_throttled 1\nthrottled_time 5\n",
        )
        .unwrap();
        std::fs::write(child.join("cpu.cfs_quota_us"), "20000\n").unwrap();
        std::fs::write(child.join("cpu.cfs_period_us"), "100000\n").unwrap();
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let sampler = crate::sampler::Sampler::at(&h, None);
        let baseline = Baseline::take(&sampler, &mut h);
        std::fs::write(
            child.join("cpu.stat"),
            "nr_periods 3\nnr_throttled 2\nthrottled_time 9\n",
        )
        .unwrap();
        let mut summary = demo_report().summary;
        summary.cgroup_id = h.id_of("/demo").unwrap();
        let end = sampler.read_now(&crate::sampler::Sampler::targets(
            &mut h,
            [summary.cgroup_id],
        ));
        let r = CgroupReport::collect(
            summary.clone(),
            &mut h,
            &baseline,
            end.get(&summary.cgroup_id),
            Lost::default(),
        );
        assert_eq!(r.path.as_deref(), Some("/demo"));
        assert!(!r.gone);
        let d = r.cpu_stat.unwrap();
        assert_eq!((d.nr_periods, d.nr_throttled, d.throttled_ns), (2, 1, 4));
        assert_eq!(r.settings.unwrap().quota_ns, Some(20 * MS));

        summary.cgroup_id = u64::MAX;
        let r = CgroupReport::collect(summary, &mut h, &baseline, None, Lost::default());
        assert_eq!((r.path, r.cpu_stat, r.settings), (None, None, None));
        assert!(r.gone, "no directory is that cgroup");
    }

    fn parse(line: &Line) -> Value {
        serde_json::from_str(&line.to_json()).unwrap()
    }

    #[test]
    fn summary_line() {
        let r = demo_report();
        let v = parse(&Line::Summary(Box::new(r.summary_line())));
        assert_eq!(v["type"], "summary");
        assert_eq!(v["cgroup"], "/demo");
        assert!(v["name"].is_null());
        assert_eq!(v["stops"], 3);
        assert_eq!(v["group_stops"], 2);
        assert_eq!(v["cpu_stop_ns"], 240 * MS);
        assert_eq!(v["wall_stop_ns"], 180 * MS);
        assert_eq!(v["kernel_stop_ns"], 240 * MS + 3_000);
        assert_eq!(v["max_ns"], 80 * MS);
        assert_eq!(v["group_max_ns"], 100 * MS);
        let p50 = v["p50_ns"].as_u64().unwrap();
        assert!((79 * MS..=80 * MS).contains(&p50), "{p50}");
        assert_eq!(v["stops_log2_ms"], serde_json::json!([0, 0, 0, 0, 0, 0, 3]));
        assert_eq!(v["end_reasons"], serde_json::json!({"refill": 3}));
        assert_eq!(v["open"], 1);
        assert_eq!(
            v["open_stops"],
            serde_json::json!([{"cpu": 1, "start_ns": 300 * MS, "elapsed_ns": 50 * MS}])
        );
        assert_eq!(v["unseen_start_stops"], 1);
        assert_eq!(v["unseen_start_kernel_ns"], 30 * MS);
        assert_eq!(v["kernel_accounted_ns"], 270 * MS + 3_000);
        let cs = &v["cpu_stat"];
        assert_eq!(
            (cs["nr_periods"].as_u64(), cs["nr_throttled"].as_u64()),
            (Some(4), Some(3))
        );
        assert_eq!(cs["throttled_ns"], 270 * MS);
        assert_eq!(cs["resolution_ns"], 0);
        assert!(cs["usage_ns"].is_null());
        assert_eq!(v["overcount"].as_f64(), Some(1.5));
        assert_eq!(v["quota_ns"], 20 * MS);

        // A cgroup gone by the end, with no ended stop: nulls, not zeros or sentinels.
        let mut r = r;
        r.path = None;
        r.cpu_stat = None;
        r.settings = None;
        r.summary.stops = crate::aggregate::DurationSummary {
            count: 0,
            sum_ns: 0,
            percentiles: None,
            log2_ms: vec![],
        };
        let v = parse(&Line::Summary(Box::new(r.summary_line())));
        for key in [
            "cgroup",
            "name",
            "cpu_stat",
            "overcount",
            "p50_ns",
            "max_ns",
            "quota_ns",
        ] {
            assert!(v[key].is_null(), "{key} should be null: {v}");
        }
        assert_eq!(v["stops"], 0);
    }

    #[test]
    fn stop_and_summary_name_the_container() {
        let id = "4c1f0e6a9b2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f";
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod6f2d0c1f_3e21_4b6a_9a59_0d3c3b6f5f5e.slice/cri-containerd-{id}.scope"
        );
        let want = serde_json::json!({
            "kind": "containerd",
            "container_id": "4c1f0e6a9b2d",
            "pod_uid": "6f2d0c1f-3e21-4b6a-9a59-0d3c3b6f5f5e",
            "qos": "burstable",
            "unit": format!("cri-containerd-{id}.scope"),
        });
        assert_eq!(
            parse(&Line::Stop(schema::Stop::of(&ended(0, 0, 80), Some(&path))))["name"],
            want
        );
        let mut r = demo_report();
        r.path = Some(path);
        assert_eq!(
            parse(&Line::Summary(Box::new(r.summary_line())))["name"],
            want
        );
    }
}
