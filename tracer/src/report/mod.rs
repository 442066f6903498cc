//! Readers of the aggregate: the NDJSON stream and the text summary printed at the end, and
//! the Prometheus exporter of `serve` ([`prometheus`]).
//!
//! The run loop drives one [`Report`]: [`Report::start`] once, [`Report::event`] per record,
//! [`Report::finish`] with [`collect`]'s per-cgroup reports. With `--json` every call writes NDJSON
//! lines to stdout as it happens; otherwise only `finish` prints, the text summary. With
//! `--record` ([`Report::record_to`]) the NDJSON lines also go to a file, whatever stdout shows;
//! `throttle-tracer report` (`recording`) feeds them back through the same aggregate and
//! [`Report::finish`].
//! A [`CgroupReport`] joins what the trace measured ([`CgroupSummary`]) with what the cgroup's
//! files say at the end (path, cpu.stat delta since the start, quota settings).
//!
//! Definitions (shared by both formats; all times CLOCK_MONOTONIC ns unless noted):
//! - `cpu_stop_ns`: Σ per-CPU stop durations (N CPUs stopped together count N×, like cpu.stat).
//! - `wall_stop_ns`: wall-clock time with at least one CPU of the group stopped.
//! - `kernel_stop_ns`: Σ of the kernel's own `rq->clock` length of each traced stop — what it
//!   added to cpu.stat throttled time.
//! - `overcount`: cpu.stat throttled-time delta ÷ `wall_stop_ns`: how many times cpu.stat's
//!   figure exceeds the time the group was really (at least partly) stopped.

mod histogram;
pub mod live;
mod ndjson;
pub mod prometheus;
mod text;

use std::io::{self, Write};
use std::path::PathBuf;

use crate::aggregate::{Aggregate, CgroupSummary};
use crate::cgroups::{Hierarchy, Version};
use crate::cpustat::{self, Baseline, CpuStatDelta};
use crate::recording::Recorder;
use crate::records::{Bandwidth, EndedStop, Event};

/// What the run is: printed first (NDJSON `start`, the text header).
#[derive(Clone, Debug, Default)]
pub struct StartInfo {
    /// The probe backend, e.g. "kprobe".
    pub backend: String,
    /// What `--backend` asked for: "auto" or a backend's name.
    pub backend_requested: String,
    /// The backends `auto` tried before `backend`, in order, each with why it was refused.
    pub backend_refused: Vec<RefusedBackend>,
    /// `uname -r`.
    pub kernel: String,
    pub cgroup_version: Option<Version>,
    /// The cpu hierarchy's mount point.
    pub cgroup_root: PathBuf,
    /// The cgroup paths the run is limited to; empty = all cgroups.
    pub cgroups: Vec<String>,
    /// Probe features this kernel cannot support, so their fields are absent or 0.
    pub disabled: Vec<String>,
    /// End reasons the probes cannot tell apart on this kernel (`EndReason::as_str` names);
    /// such ends count as "unknown".
    pub blind_end_reasons: Vec<String>,
}

/// A backend `--backend auto` passed over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefusedBackend {
    pub backend: String,
    /// The one-line cause.
    pub reason: String,
}

/// Whole-run counters, printed last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Totals {
    /// Records the kernel could not put in the full ring buffer.
    pub lost: u64,
    /// Records that did not decode (`records::RecordError`).
    pub malformed: u64,
    /// CLOCK_MONOTONIC ns from attach to the end of the trace.
    pub elapsed_ns: u64,
}

/// One cgroup's measurements and its cgroup-file readings at the end of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct CgroupReport {
    pub summary: CgroupSummary,
    /// Path under the cpu hierarchy; `None` if the id no longer (or never) resolved.
    pub path: Option<String>,
    /// cpu.stat change since the baseline; `None` if the cgroup is gone or unreadable.
    pub cpu_stat: Option<CpuStatDelta>,
    /// Quota settings at the end (the control files).
    pub settings: Option<Bandwidth>,
}

impl CgroupReport {
    /// Reads the cgroup's end-of-trace state. Failures (the cgroup was removed, the v2 root has
    /// no cpu.max, ...) leave the field `None`: the report still has the trace's own figures.
    pub fn collect(
        mut summary: CgroupSummary,
        hierarchy: &mut Hierarchy,
        baseline: &Baseline,
    ) -> Self {
        for a in summary
            .descendants
            .iter_mut()
            .chain(summary.stopped_by_ancestor.iter_mut())
        {
            a.path = hierarchy.path_of(a.cgroup_id).map(str::to_owned);
        }
        let path = hierarchy.path_of(summary.cgroup_id).map(str::to_owned);
        let dir = path.as_deref().and_then(|p| hierarchy.dir_of(p).ok());
        let (cpu_stat, settings) = match &dir {
            Some(dir) => (
                baseline.delta(summary.cgroup_id, dir).ok(),
                cpustat::read_bandwidth(dir, hierarchy.version()).ok(),
            ),
            None => (None, None),
        };
        Self {
            summary,
            path,
            cpu_stat,
            settings,
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

    /// cpu.stat throttled-time delta ÷ wall-clock stopped time; `None` if either is missing or 0.
    pub fn overcount(&self) -> Option<f64> {
        let throttled = self.cpu_stat.as_ref()?.throttled_ns;
        let wall = self.summary.group_stops.sum_ns;
        (throttled > 0 && wall > 0).then(|| throttled as f64 / wall as f64)
    }
}

/// One [`CgroupReport`] per cgroup the trace saw, most stopped first: finishes the aggregate at
/// `now_ns` (CLOCK_MONOTONIC) and reads each cgroup's files.
pub fn collect(
    aggregate: Aggregate,
    now_ns: u64,
    hierarchy: &mut Hierarchy,
    baseline: &Baseline,
) -> Vec<CgroupReport> {
    aggregate
        .finish(now_ns)
        .into_iter()
        .map(|summary| CgroupReport::collect(summary, hierarchy, baseline))
        .collect()
}

/// Where the run's output goes, in the chosen format.
pub struct Report<W: Write = io::Stdout> {
    json: bool,
    out: W,
    /// `--record`: where the NDJSON lines go as well.
    record: Option<Recorder>,
    /// `--min-stop`, ns: shorter ended stops get no line on stdout.
    min_stop_ns: u64,
    info: StartInfo,
    /// The first write error (e.g. stdout closed by `| head`): later writes are skipped and
    /// `finish` returns it.
    failed: Option<io::Error>,
}

impl Report<io::Stdout> {
    /// NDJSON on stdout if `json`, else the text summary at the end.
    pub fn new(json: bool) -> Self {
        Self::to(json, io::stdout())
    }
}

impl<W: Write> Report<W> {
    pub(crate) fn to(json: bool, out: W) -> Self {
        Self {
            json,
            out,
            record: None,
            min_stop_ns: 0,
            info: StartInfo::default(),
            failed: None,
        }
    }

    fn write_line(&mut self, line: &str) {
        if self.failed.is_none()
            && let Err(e) = writeln!(self.out, "{line}")
        {
            self.failed = Some(e);
        }
    }

    /// One NDJSON line, to stdout if `stdout` and to the recording; made only if one of them
    /// takes it.
    fn emit(&mut self, stdout: bool, line: impl FnOnce() -> String) {
        if !stdout && self.record.is_none() {
            return;
        }
        let line = line();
        if stdout {
            self.write_line(&line);
        }
        if let Some(record) = &mut self.record {
            record.line(&line);
        }
    }

    pub fn start(&mut self, info: StartInfo) {
        self.emit(self.json, || ndjson::start(&info));
        self.info = info;
    }

    /// Copies the NDJSON stream into `record` from now on, beginning with the `start` line
    /// already made; call it before the first [`event`](Self::event).
    pub fn record_to(&mut self, mut record: Recorder) {
        record.line(&ndjson::start(&self.info));
        self.record = Some(record);
    }

    /// `--min-stop`: ended stops shorter than `ns` get no NDJSON line on stdout (the recording
    /// keeps every record, so that it rebuilds the whole summary).
    pub fn hide_stops_shorter_than(&mut self, ns: u64) {
        self.min_stop_ns = ns;
    }

    /// One record, as the aggregate takes it; `cgroup` is its cgroup's path if it resolved.
    /// The recording gets every record. Stdout (`--json`) gets the ended stops not under
    /// --min-stop and the unseen-start stops; a stop's beginning (`stop_begin`), which only a
    /// rebuild of the report needs, is left off it.
    pub fn event(&mut self, event: &Event, cgroup: Option<&str>) {
        let stdout = self.json
            && match event {
                Event::Start(_) => false,
                Event::End(end) => end.duration_ns() >= self.min_stop_ns,
                Event::UnseenStartEnd { .. } => true,
            };
        self.emit(stdout, || match event {
            Event::Start(stop) => ndjson::stop_begin(stop, cgroup),
            Event::End(end) => ndjson::stop(end, cgroup),
            Event::UnseenStartEnd {
                cgroup_id,
                cpu,
                end_ns,
                kernel_ns,
            } => ndjson::unseen_start_stop(*cgroup_id, cgroup, *cpu, *end_ns, *kernel_ns),
        });
    }

    /// An ended stop of an ancestor that is traced only for `credited`, the traced descendants
    /// it stopped: an `ancestor_stop` line, on stdout (`--json`, unless under --min-stop) and in
    /// the recording.
    pub fn ancestor_stop(&mut self, end: &EndedStop, cgroup: Option<&str>, credited: &[u64]) {
        let stdout = self.json && end.duration_ns() >= self.min_stop_ns;
        self.emit(stdout, || ndjson::ancestor_stop(end, cgroup, credited));
    }

    /// The per-cgroup summaries and the totals; returns the first write error of the run (on
    /// stdout, then in the recording).
    pub fn finish(mut self, reports: &[CgroupReport], totals: &Totals) -> io::Result<()> {
        for r in reports {
            self.emit(self.json, || ndjson::summary(r));
        }
        self.emit(self.json, || ndjson::end(totals));
        if !self.json {
            let text = text::render(&self.info, reports, totals);
            if self.failed.is_none()
                && let Err(e) = self.out.write_all(text.as_bytes())
            {
                self.failed = Some(e);
            }
        }
        let recorded = self.record.take().map_or(Ok(()), Recorder::finish);
        match self.failed.take() {
            Some(e) => Err(e),
            None => self.out.flush().and(recorded),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::aggregate::Aggregate;
    use crate::cpustat::TimeUnit;
    use crate::records::{EndReason, EndedStop, Event, Stop, Task};

    pub(crate) const MS: u64 = 1_000_000;

    pub(crate) fn ended(cpu: u32, start_ms: u64, end_ms: u64) -> EndedStop {
        EndedStop {
            stop: Stop {
                cgroup_id: 4242,
                cpu,
                start_ns: start_ms * MS,
                bandwidth: Bandwidth {
                    quota_ns: Some(20 * MS),
                    period_ns: Some(100 * MS),
                    burst_ns: Some(0),
                },
                tasks: 2,
                task: Some(Task {
                    pid: 100,
                    tid: 101,
                    comm: "stress".into(),
                }),
                parked: 1,
                park_ns: Some(start_ms * MS + 2_000),
                kernel_start_clock: Some(5_000 * MS),
                descendant: None,
                children: Vec::new(),
                children_unlisted: 0,
            },
            end_ns: end_ms * MS,
            kernel_ns: Some((end_ms - start_ms) * MS + 1_000),
            reason: EndReason::Refill,
        }
    }

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
            cpu_stat: Some(CpuStatDelta {
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
        }
    }

    #[test]
    fn report_writes_ndjson_as_it_goes_or_text_at_the_end() {
        let info = StartInfo {
            backend: "kprobe".into(),
            ..StartInfo::default()
        };
        let totals = Totals {
            lost: 0,
            malformed: 0,
            elapsed_ns: MS,
        };
        let mut buf = Vec::new();
        let mut report = Report::to(true, &mut buf);
        report.start(info.clone());
        report.event(&Event::End(ended(0, 0, 80)), Some("/demo"));
        report.finish(&[demo_report()], &totals).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let types: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].to_string())
            .collect();
        assert_eq!(
            types,
            [r#""start""#, r#""stop""#, r#""summary""#, r#""end""#]
        );

        let mut buf = Vec::new();
        let mut report = Report::to(false, &mut buf);
        report.start(info);
        report.event(&Event::End(ended(0, 0, 80)), Some("/demo"));
        report.finish(&[demo_report()], &totals).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.starts_with("throttle-tracer: "), "{text}");
        assert!(text.contains("/demo (id 4242)"));
    }

    #[test]
    fn write_errors_surface_at_finish() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut report = Report::to(true, Closed);
        report.start(StartInfo::default());
        report.event(&Event::End(ended(0, 0, 80)), None);
        let totals = Totals {
            lost: 0,
            malformed: 0,
            elapsed_ns: 0,
        };
        let err = report.finish(&[], &totals).unwrap_err();
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
        let baseline = Baseline::take(&mut h);
        std::fs::write(
            child.join("cpu.stat"),
            "nr_periods 3\nnr_throttled 2\nthrottled_time 9\n",
        )
        .unwrap();
        let mut summary = demo_report().summary;
        summary.cgroup_id = h.id_of("/demo").unwrap();
        let r = CgroupReport::collect(summary.clone(), &mut h, &baseline);
        assert_eq!(r.path.as_deref(), Some("/demo"));
        let d = r.cpu_stat.unwrap();
        assert_eq!((d.nr_periods, d.nr_throttled, d.throttled_ns), (2, 1, 4));
        assert_eq!(r.settings.unwrap().quota_ns, Some(20 * MS));

        summary.cgroup_id = u64::MAX;
        let r = CgroupReport::collect(summary, &mut h, &baseline);
        assert_eq!((r.path, r.cpu_stat, r.settings), (None, None, None));
    }
}
