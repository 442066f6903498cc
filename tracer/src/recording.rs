//! Recordings: `--record FILE` copies the NDJSON stream into a file as it is written (line by
//! line, each flushed, so a run that is killed leaves every line it made), and
//! `throttle-tracer report FILE` prints the end report again from one.
//!
//! The offline report is the live run's own path with the recording as its source: every
//! `stop_begin`, `stop` and `unseen_start_stop` line is turned back into the [`Event`] the run
//! loop took, in the order it took them, through the same [`Aggregate`], and the result goes to
//! the same [`Report::finish`]; an `ancestor_stop` line (a stop of an untraced ancestor) is
//! credited to the traced descendants it names, as the run credited it. What the live run read from the machine rather than from the
//! kernel's records comes from its other lines: the run's description (`start`), each cgroup's
//! path, cpu.stat delta and quota settings at the end (`summary`), the lost and malformed counts
//! and the traced time (`end`). The moment the trace ended, which open stops are measured to,
//! is any open stop's `start_ns + elapsed_ns` (it matters for nothing else).
//!
//! A recording cut short (the tracer was killed) has no `end` line: the report is still made
//! from the records, without cpu.stat for the cgroups that have no `summary`, with open stops
//! measured to the last record, and a warning says so.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, LineWriter, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::aggregate::Aggregate;
use crate::cgroups::Version;
use crate::cpustat::{CpuStatDelta, TimeUnit};
use crate::error::Failure;
use crate::records::{Bandwidth, EndReason, EndedStop, Event, RecordError, Stop, Task};
use crate::report::{CgroupReport, RefusedBackend, Report, StartInfo, Totals};

/// `--record FILE`: the file the report copies its NDJSON lines into.
pub struct Recorder {
    path: PathBuf,
    /// Flushed at every newline: one write per line.
    out: LineWriter<File>,
    /// The first write error; later lines are skipped and [`Recorder::finish`] returns it.
    failed: Option<io::Error>,
}

impl Recorder {
    /// Creates `path`, or empties it if it exists.
    pub fn create(path: &Path) -> Result<Self, Failure> {
        let file = File::create(path).map_err(|e| {
            Failure::usage(
                format!("cannot create the recording {}: {e}", path.display()),
                "--record takes the path of a file to write, in a directory that exists",
            )
        })?;
        Ok(Self {
            path: path.to_owned(),
            out: LineWriter::new(file),
            failed: None,
        })
    }

    /// Writes one line (without its newline) to the file.
    pub(crate) fn line(&mut self, line: &str) {
        if self.failed.is_none()
            && let Err(e) = writeln!(self.out, "{line}")
        {
            self.failed = Some(e);
        }
    }

    /// The first write error, naming the file.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        let result = match self.failed.take() {
            Some(e) => Err(e),
            None => self.out.flush(),
        };
        result.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("the recording {}: {e}", self.path.display()),
            )
        })
    }
}

/// `throttle-tracer report FILE`: prints the text report the recorded run printed at its end.
/// Returns the exit code.
pub fn main(file: &Path) -> i32 {
    match report(file) {
        Ok(()) => 0,
        Err(failure) => {
            eprintln!("{failure}");
            failure.exit_code()
        }
    }
}

fn report(file: &Path) -> Result<(), Failure> {
    let hint = "`throttle-tracer report` reads a file written by `throttle-tracer --record FILE`";
    let input = File::open(file)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", file.display()), hint))?;
    let recorded = Recorded::read(BufReader::new(input))
        .map_err(|e| Failure::environment(format!("{}: {e}", file.display()), hint))?;
    if !recorded.complete {
        eprintln!(
            "warning: {} ends before the run did (no `end` line): cgroups without a `summary` \
             line have no cpu.stat comparison, open stops are measured to the last record, and \
             the traced time is that of the records",
            file.display()
        );
    }
    let mut report = Report::new(false);
    report.start(recorded.info);
    report
        .finish(&recorded.reports, &recorded.totals)
        .map_err(|e| {
            Failure::environment(
                format!("cannot write the report: {e}"),
                "check that standard output can be written",
            )
        })
}

/// Why a recording could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a throttle-tracer recording: it does not begin with a `start` line")]
    NotARecording,
    #[error("line {line}: {source}")]
    Json {
        line: usize,
        source: serde_json::Error,
    },
    #[error("line {line}: {source}")]
    Record { line: usize, source: RecordError },
    #[error("line {line}: {what}")]
    Invalid { line: usize, what: &'static str },
}

/// A recording read back: what [`Report::finish`] takes.
pub struct Recorded {
    pub info: StartInfo,
    /// The aggregate's summaries of the recorded events, with the recorded end-of-run readings.
    pub reports: Vec<CgroupReport>,
    pub totals: Totals,
    /// The recording has its `end` line: the run finished.
    pub complete: bool,
}

impl Recorded {
    pub fn read(input: impl BufRead) -> Result<Self, ReadError> {
        let mut info = None;
        let mut aggregate = Aggregate::default();
        let mut at_end: HashMap<u64, AtEnd> = HashMap::new();
        // Paths from the records, for cgroups without a `summary` line.
        let mut paths: HashMap<u64, String> = HashMap::new();
        // The paths the live run gave the cgroups in `descendants` / `stopped_by_ancestor`.
        let mut attributed_paths: HashMap<u64, Option<String>> = HashMap::new();
        let mut totals = None;
        let mut end_of_trace = None;
        let mut span: Option<(u64, u64)> = None;
        for (i, text) in input.lines().enumerate() {
            let line = i + 1;
            let text = text?;
            if text.trim().is_empty() {
                continue;
            }
            let record: Line =
                serde_json::from_str(&text).map_err(|source| ReadError::Json { line, source })?;
            match (record, info.is_some()) {
                (Line::Start(start), false) => info = Some(start.into_info()),
                (_, false) => return Err(ReadError::NotARecording),
                (Line::Start(_), true) => {
                    return Err(ReadError::Invalid {
                        line,
                        what: "a second `start` line (two runs in one file?)",
                    });
                }
                (Line::Summary(summary), _) => {
                    if let Some(open) = summary.open_stops.first() {
                        end_of_trace = Some(open.start_ns.saturating_add(open.elapsed_ns));
                    }
                    for a in summary
                        .descendants
                        .iter()
                        .chain(&summary.stopped_by_ancestor)
                    {
                        attributed_paths.insert(a.cgroup_id, a.cgroup.clone());
                    }
                    at_end.insert(summary.cgroup_id, summary.at_end());
                }
                (Line::End(end), _) => totals = Some(end.totals()),
                (Line::Other, _) => {}
                (Line::AncestorStop(a), _) => {
                    let end = a.stop.ended().map_err(|e| e.at(line))?;
                    widen(&mut span, (end.stop.start_ns, end.end_ns));
                    aggregate.credit_only(&end, |d| a.credited_cgroup_ids.contains(&d));
                }
                (record, _) => {
                    let (event, path) =
                        record
                            .event()
                            .map_err(|e| e.at(line))?
                            .ok_or(ReadError::Invalid {
                                line,
                                what: "not a record",
                            })?;
                    widen(&mut span, timestamps(&event));
                    if let Some(path) = path {
                        paths.insert(event.cgroup_id(), path);
                    }
                    aggregate.ingest(&event);
                }
            }
        }
        let info = info.ok_or(ReadError::NotARecording)?;
        // The live aggregate watched the cgroups named with --cgroup from the start; every one
        // has a `summary` line, and watching after the records changes nothing else.
        for id in at_end.keys() {
            aggregate.watch(*id);
        }
        let (first_ns, last_ns) = span.unwrap_or_default();
        let complete = totals.is_some();
        let totals = totals.unwrap_or(Totals {
            lost: 0,
            malformed: 0,
            elapsed_ns: last_ns - first_ns,
        });
        let reports = aggregate
            .finish(end_of_trace.unwrap_or(last_ns))
            .into_iter()
            .map(|mut summary| {
                for a in summary
                    .descendants
                    .iter_mut()
                    .chain(summary.stopped_by_ancestor.iter_mut())
                {
                    a.path = attributed_paths.get(&a.cgroup_id).cloned().flatten();
                }
                let end = at_end.remove(&summary.cgroup_id).unwrap_or(AtEnd {
                    path: paths.remove(&summary.cgroup_id),
                    cpu_stat: None,
                    settings: None,
                });
                CgroupReport {
                    summary,
                    path: end.path,
                    cpu_stat: end.cpu_stat,
                    settings: end.settings,
                }
            })
            .collect();
        Ok(Self {
            info,
            reports,
            totals,
            complete,
        })
    }
}

/// Widens the recording's time span to hold `(first, last)`.
fn widen(span: &mut Option<(u64, u64)>, (first, last): (u64, u64)) {
    *span = Some(span.map_or((first, last), |(a, b)| (a.min(first), b.max(last))));
}

/// The earliest and latest CLOCK_MONOTONIC time in a record.
fn timestamps(event: &Event) -> (u64, u64) {
    match event {
        Event::Start(stop) => (stop.start_ns, stop.start_ns),
        Event::End(end) => (end.stop.start_ns, end.end_ns),
        Event::UnseenStartEnd { end_ns, .. } => (*end_ns, *end_ns),
    }
}

/// One NDJSON line, the fields the offline report needs (`report::ndjson` writes them).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    Start(StartLine),
    StopBegin(StopLine),
    Stop(StopLine),
    AncestorStop(AncestorStopLine),
    UnseenStartStop(UnseenLine),
    Summary(SummaryLine),
    End(EndLine),
    /// A line type this version does not know (from a newer tracer): skipped.
    #[serde(other)]
    Other,
}

/// A record line that is not what its type says.
enum Malformed {
    NoEnd,
    Record(RecordError),
}

impl Malformed {
    fn at(self, line: usize) -> ReadError {
        match self {
            Self::NoEnd => ReadError::Invalid {
                line,
                what: "a `stop` line without end_ns",
            },
            Self::Record(source) => ReadError::Record { line, source },
        }
    }
}

impl Line {
    /// The record a `stop_begin`, `stop` or `unseen_start_stop` line holds, with the cgroup's
    /// path if it had resolved; `None` for the other lines.
    fn event(self) -> Result<Option<(Event, Option<String>)>, Malformed> {
        Ok(Some(match self {
            Line::StopBegin(begin) => {
                let stop = begin.stop();
                (Event::Start(stop), begin.cgroup)
            }
            Line::Stop(line) => (Event::End(line.ended()?), line.cgroup),
            Line::UnseenStartStop(u) => (
                Event::UnseenStartEnd {
                    cgroup_id: u.cgroup_id,
                    cpu: u.cpu,
                    end_ns: u.end_ns,
                    kernel_ns: u.kernel_ns,
                },
                u.cgroup,
            ),
            _ => return Ok(None),
        }))
    }
}

#[derive(Debug, Deserialize)]
struct StartLine {
    backend: String,
    backend_requested: String,
    backend_refused: Vec<RefusedLine>,
    kernel: String,
    cgroup_version: Option<String>,
    cgroup_root: String,
    cgroup_filter: Vec<String>,
    disabled_features: Vec<String>,
    blind_end_reasons: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct RefusedLine {
    backend: String,
    reason: String,
}

impl StartLine {
    fn into_info(self) -> StartInfo {
        StartInfo {
            backend: self.backend,
            backend_requested: self.backend_requested,
            backend_refused: self
                .backend_refused
                .into_iter()
                .map(|r| RefusedBackend {
                    backend: r.backend,
                    reason: r.reason,
                })
                .collect(),
            kernel: self.kernel,
            cgroup_version: match self.cgroup_version.as_deref() {
                Some("v1") => Some(Version::V1),
                Some("v2") => Some(Version::V2),
                _ => None,
            },
            cgroup_root: self.cgroup_root.into(),
            cgroups: self.cgroup_filter,
            disabled: self.disabled_features,
            blind_end_reasons: self.blind_end_reasons,
        }
    }
}

/// A `stop_begin` or `stop` line.
#[derive(Debug, Deserialize)]
struct StopLine {
    cgroup_id: u64,
    cgroup: Option<String>,
    cpu: u32,
    start_ns: u64,
    /// `stop` only, as are `kernel_ns` and `end`.
    end_ns: Option<u64>,
    kernel_ns: Option<u64>,
    end: Option<String>,
    quota_ns: Option<u64>,
    period_ns: Option<u64>,
    burst_ns: Option<u64>,
    tasks: u32,
    pid: Option<u32>,
    tid: Option<u32>,
    comm: Option<String>,
    parked: u32,
    park_ns: Option<u64>,
    kernel_start_clock_ns: Option<u64>,
    descendant_cgroup_id: Option<u64>,
    /// Absent from recordings made before stops listed every child.
    #[serde(default)]
    descendant_cgroup_ids: Vec<u64>,
    #[serde(default)]
    descendants_unlisted: u32,
}

impl StopLine {
    /// The ended stop a `stop` (or `ancestor_stop`) line holds.
    fn ended(&self) -> Result<EndedStop, Malformed> {
        let end_ns = self.end_ns.ok_or(Malformed::NoEnd)?;
        if end_ns < self.start_ns {
            return Err(Malformed::Record(RecordError::EndBeforeStart {
                cpu: self.cpu,
                start_ns: self.start_ns,
                end_ns,
            }));
        }
        Ok(EndedStop {
            stop: self.stop(),
            end_ns,
            kernel_ns: self.kernel_ns,
            reason: EndReason::from_name(self.end.as_deref().unwrap_or("unknown")),
        })
    }

    fn stop(&self) -> Stop {
        let task = match (self.pid, self.tid, &self.comm) {
            (Some(pid), Some(tid), Some(comm)) => Some(Task {
                pid,
                tid,
                comm: comm.clone(),
            }),
            _ => None,
        };
        Stop {
            cgroup_id: self.cgroup_id,
            cpu: self.cpu,
            start_ns: self.start_ns,
            bandwidth: Bandwidth {
                quota_ns: self.quota_ns,
                period_ns: self.period_ns,
                burst_ns: self.burst_ns,
            },
            tasks: self.tasks,
            task,
            parked: self.parked,
            park_ns: self.park_ns,
            kernel_start_clock: self.kernel_start_clock_ns,
            descendant: self.descendant_cgroup_id,
            children: self.descendant_cgroup_ids.clone(),
            children_unlisted: self.descendants_unlisted,
        }
    }
}

/// A stop of a cgroup traced only for the descendants it stopped.
#[derive(Debug, Deserialize)]
struct AncestorStopLine {
    #[serde(flatten)]
    stop: StopLine,
    credited_cgroup_ids: Vec<u64>,
}

#[derive(Debug, Deserialize)]
struct UnseenLine {
    cgroup_id: u64,
    cgroup: Option<String>,
    cpu: u32,
    end_ns: u64,
    kernel_ns: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct SummaryLine {
    cgroup_id: u64,
    cgroup: Option<String>,
    descendants: Vec<AttributedLine>,
    stopped_by_ancestor: Vec<AttributedLine>,
    open_stops: Vec<OpenLine>,
    cpu_stat: Option<CpuStatLine>,
    quota_ns: Option<u64>,
    period_ns: Option<u64>,
    burst_ns: Option<u64>,
}

/// An entry of a summary's `descendants` or `stopped_by_ancestor`: the other cgroup's path.
#[derive(Debug, Deserialize)]
struct AttributedLine {
    cgroup_id: u64,
    cgroup: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OpenLine {
    start_ns: u64,
    elapsed_ns: u64,
}

#[derive(Debug, Deserialize)]
struct CpuStatLine {
    nr_periods: u64,
    nr_throttled: u64,
    throttled_ns: u64,
    resolution_ns: u64,
    nr_bursts: Option<u64>,
    burst_ns: Option<u64>,
    throttled_local_ns: Option<u64>,
    usage_ns: Option<u64>,
    user_ns: Option<u64>,
    system_ns: Option<u64>,
    wait_sum_ns: Option<u64>,
}

/// What the live run read from a cgroup's files at the end.
struct AtEnd {
    path: Option<String>,
    cpu_stat: Option<CpuStatDelta>,
    settings: Option<Bandwidth>,
}

impl SummaryLine {
    fn at_end(self) -> AtEnd {
        AtEnd {
            path: self.cgroup,
            cpu_stat: self.cpu_stat.map(|c| CpuStatDelta {
                unit: if c.resolution_ns == 0 {
                    TimeUnit::Nanos
                } else {
                    TimeUnit::Micros
                },
                nr_periods: c.nr_periods,
                nr_throttled: c.nr_throttled,
                throttled_ns: c.throttled_ns,
                nr_bursts: c.nr_bursts,
                burst_ns: c.burst_ns,
                wait_sum_ns: c.wait_sum_ns,
                usage_ns: c.usage_ns,
                user_ns: c.user_ns,
                system_ns: c.system_ns,
                local_throttled_ns: c.throttled_local_ns,
            }),
            // The control files always give a period (v1 cpu.cfs_period_us, v2 cpu.max), so
            // a null period means the settings were not read.
            settings: self.period_ns.map(|period| Bandwidth {
                quota_ns: self.quota_ns,
                period_ns: Some(period),
                burst_ns: self.burst_ns,
            }),
        }
    }
}

#[derive(Debug, Deserialize)]
struct EndLine {
    lost: u64,
    malformed: u64,
    elapsed_ns: u64,
}

impl EndLine {
    fn totals(&self) -> Totals {
        Totals {
            lost: self.lost,
            malformed: self.malformed,
            elapsed_ns: self.elapsed_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpustat::TimeUnit;
    use crate::report::tests::{MS, ended};

    fn info() -> StartInfo {
        StartInfo {
            backend: "tracepoint".into(),
            backend_requested: "auto".into(),
            backend_refused: vec![RefusedBackend {
                backend: "fentry".into(),
                reason: "EPERM".into(),
            }],
            kernel: "6.18.0-test".into(),
            cgroup_version: Some(Version::V1),
            cgroup_root: "/sys/fs/cgroup/cpu,cpuacct".into(),
            cgroups: vec!["/demo".into()],
            disabled: vec!["tasks".into()],
            blind_end_reasons: vec!["cpu_offline".into()],
        }
    }

    /// Every kind of record, with and without the optional fields, in an order the aggregate
    /// cares about (overlapping CPUs, a late START, an open stop).
    fn events() -> Vec<Event> {
        let mut bare = ended(1, 20, 100);
        bare.kernel_ns = None;
        bare.reason = EndReason::QuotaChange;
        bare.stop.task = None;
        bare.stop.bandwidth.quota_ns = None;
        bare.stop.park_ns = None;
        bare.stop.kernel_start_clock = None;
        bare.stop.descendant = Some(77);
        let mut other = ended(0, 0, 50);
        other.stop.cgroup_id = 99;
        vec![
            Event::UnseenStartEnd {
                cgroup_id: 4242,
                cpu: 1,
                end_ns: 5 * MS,
                kernel_ns: Some(30 * MS),
            },
            Event::UnseenStartEnd {
                cgroup_id: 4242,
                cpu: 0,
                end_ns: 6 * MS,
                kernel_ns: None,
            },
            Event::Start(ended(0, 0, 80).stop),
            Event::End(ended(0, 0, 80)),
            Event::Start(bare.stop.clone()),
            Event::End(bare),
            Event::Start(other.stop.clone()),
            Event::End(other),
            Event::Start(ended(0, 200, 280).stop),
            Event::End(ended(0, 200, 280)),
            Event::Start(ended(1, 300, 301).stop),
        ]
    }

    /// What the live run does with `events`: the aggregate finished at `now_ns`, with end-of-run
    /// readings for /demo (cgroup 4242) and none for cgroup 99 (gone by the end).
    fn live(events: &[Event], now_ns: u64) -> Vec<CgroupReport> {
        let mut aggregate = Aggregate::watching(&[4242, 5]);
        for event in events {
            aggregate.ingest(event);
        }
        aggregate
            .finish(now_ns)
            .into_iter()
            .map(|summary| {
                let known = summary.cgroup_id == 4242;
                CgroupReport {
                    path: match summary.cgroup_id {
                        4242 => Some("/demo".into()),
                        5 => Some("/system.slice/nginx.service".into()),
                        _ => None,
                    },
                    cpu_stat: known.then_some(CpuStatDelta {
                        unit: TimeUnit::Micros,
                        nr_periods: 4,
                        nr_throttled: 3,
                        throttled_ns: 270 * MS,
                        nr_bursts: Some(0),
                        burst_ns: Some(0),
                        wait_sum_ns: None,
                        usage_ns: Some(900 * MS),
                        user_ns: Some(800 * MS),
                        system_ns: Some(100 * MS),
                        local_throttled_ns: Some(270 * MS),
                    }),
                    settings: known.then_some(Bandwidth {
                        quota_ns: None,
                        period_ns: Some(100 * MS),
                        burst_ns: None,
                    }),
                    summary,
                }
            })
            .collect()
    }

    fn totals() -> Totals {
        Totals {
            lost: 2,
            malformed: 1,
            elapsed_ns: 12_300 * MS,
        }
    }

    /// Runs `events` through a text report recording to a file; returns the text and the file.
    fn record(events: &[Event], reports: &[CgroupReport]) -> (String, tempfile::TempPath) {
        let file = tempfile::NamedTempFile::new().unwrap().into_temp_path();
        let mut text = Vec::new();
        let mut report = Report::to(false, &mut text);
        report.start(info());
        report.record_to(Recorder::create(&file).unwrap());
        for event in events {
            report.event(event, Some("/demo"));
        }
        report.finish(reports, &totals()).unwrap();
        (String::from_utf8(text).unwrap(), file)
    }

    #[test]
    fn ndjson_lines_turn_back_into_the_events_they_were_made_from() {
        let events = events();
        let (_, file) = record(&events, &[]);
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<Line> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert!(matches!(lines.first(), Some(Line::Start(_))));
        assert!(matches!(lines.last(), Some(Line::End(_))));
        let back: Vec<Event> = lines
            .into_iter()
            .filter_map(|l| l.event().ok().flatten())
            .map(|(event, path)| {
                assert_eq!(path.as_deref(), Some("/demo"));
                event
            })
            .collect();
        assert_eq!(back, events);
    }

    #[test]
    fn the_offline_report_is_the_live_one() {
        let events = events();
        // The end of the trace is 50 ms after the open stop's start.
        let reports = live(&events, 350 * MS);
        let (live_text, file) = record(&events, &reports);
        let recorded = Recorded::read(BufReader::new(File::open(&file).unwrap())).unwrap();
        assert!(recorded.complete);
        assert_eq!(recorded.reports, reports);
        assert_eq!(recorded.totals, totals());
        let mut text = Vec::new();
        let mut report = Report::to(false, &mut text);
        report.start(recorded.info);
        report.finish(&recorded.reports, &recorded.totals).unwrap();
        assert_eq!(String::from_utf8(text).unwrap(), live_text);
        // The text has what the offline report must rebuild.
        for needle in [
            "backend auto chose tracepoint; refused before it: fentry (EPERM)",
            "open at exit      cpu 1 for 50.0 ms",
            "cpu.stat delta    nr_periods 4",
            "/system.slice/nginx.service (id 5)",
            "lost records: 2   malformed records: 1",
        ] {
            assert!(live_text.contains(needle), "{needle:?} in\n{live_text}");
        }
    }

    #[test]
    fn a_child_only_run_replays_its_ancestors_stops() {
        // `--cgroup /pod/c1`: the pod's stops are not traced for themselves, only credited to
        // c1 (id 11), which they stopped along with its sibling 12.
        let ends: Vec<EndedStop> = (0..3)
            .map(|i| {
                let mut e = ended(i % 2, u64::from(i) * 100, u64::from(i) * 100 + 45);
                e.stop.cgroup_id = 10;
                e.stop.children = vec![11, 12];
                e
            })
            .collect();
        let mut aggregate = Aggregate::watching(&[11]);
        for e in &ends {
            aggregate.credit_only(e, |d| d == 11);
        }
        let reports: Vec<CgroupReport> = aggregate
            .finish(400 * MS)
            .into_iter()
            .map(|mut summary| {
                summary.stopped_by_ancestor[0].path = Some("/pod".into());
                CgroupReport {
                    summary,
                    path: Some("/pod/c1".into()),
                    cpu_stat: None,
                    settings: None,
                }
            })
            .collect();
        let file = tempfile::NamedTempFile::new().unwrap().into_temp_path();
        let mut live_text = Vec::new();
        let mut report = Report::to(false, &mut live_text);
        report.start(info());
        report.record_to(Recorder::create(&file).unwrap());
        for e in &ends {
            report.ancestor_stop(e, Some("/pod"), &[11]);
        }
        report.finish(&reports, &totals()).unwrap();
        let live_text = String::from_utf8(live_text).unwrap();
        assert!(
            live_text.contains("stopped by ancestor /pod"),
            "{live_text}"
        );

        let recorded = Recorded::read(BufReader::new(File::open(&file).unwrap())).unwrap();
        assert_eq!(recorded.reports, reports);
        let a = &recorded.reports[0].summary.stopped_by_ancestor[0];
        assert_eq!((a.cgroup_id, a.stops, a.stopped_ns), (10, 3, 135 * MS));
        let mut text = Vec::new();
        let mut report = Report::to(false, &mut text);
        report.start(recorded.info);
        report.finish(&recorded.reports, &recorded.totals).unwrap();
        assert_eq!(String::from_utf8(text).unwrap(), live_text);
    }

    #[test]
    fn a_recording_cut_short_still_reports_its_records() {
        let events = events();
        let (_, file) = record(&events, &live(&events, 350 * MS));
        let text = std::fs::read_to_string(&file).unwrap();
        let cut: String = text
            .lines()
            .filter(|l| !l.contains(r#""type":"summary""#) && !l.contains(r#""type":"end""#))
            .map(|l| format!("{l}\n"))
            .collect();
        let recorded = Recorded::read(cut.as_bytes()).unwrap();
        assert!(!recorded.complete);
        // Only the cgroups with records (77: a descendant a stop of 4242 stopped), no cpu.stat,
        // open stops measured to the last record.
        let ids: Vec<u64> = recorded
            .reports
            .iter()
            .map(|r| r.summary.cgroup_id)
            .collect();
        assert_eq!(ids, [4242, 99, 77]);
        let demo = &recorded.reports[0];
        assert_eq!(demo.path.as_deref(), Some("/demo"));
        assert_eq!((&demo.cpu_stat, &demo.settings), (&None, &None));
        assert_eq!(demo.summary.open_stops[0].elapsed_ns, 0);
        assert_eq!(recorded.totals.elapsed_ns, 300 * MS);
    }

    #[test]
    fn what_is_not_a_recording_is_an_error() {
        let read = |text: &str| Recorded::read(text.as_bytes()).err().map(|e| e.to_string());
        assert_eq!(
            read(""),
            Some("not a throttle-tracer recording: it does not begin with a `start` line".into())
        );
        assert_eq!(
            read("{\"type\":\"end\",\"lost\":0,\"malformed\":0,\"elapsed_ns\":1}\n"),
            read("")
        );
        let (_, file) = record(&[], &[]);
        let start = std::fs::read_to_string(&file).unwrap();
        let start = start.lines().next().unwrap();
        let err = read(&format!("{start}\nnot json\n")).unwrap();
        assert!(err.starts_with("line 2: "), "{err}");
        let err = read(&format!("{start}\n{start}\n")).unwrap();
        assert!(err.starts_with("line 2: a second `start` line"), "{err}");
        let stop = r#"{"type":"stop","cgroup_id":1,"cgroup":null,"cpu":0,"start_ns":10,"end_ns":9,"kernel_ns":null,"end":"refill","quota_ns":null,"period_ns":null,"burst_ns":null,"tasks":0,"pid":null,"tid":null,"comm":null,"parked":0,"park_ns":null,"kernel_start_clock_ns":null}"#;
        let err = read(&format!("{start}\n{stop}\n")).unwrap();
        assert!(err.contains("line 2: stop on cpu 0 ends at 9 ns"), "{err}");
        // Line types from a newer tracer are skipped.
        assert!(read(&format!("{start}\n{{\"type\":\"future\",\"x\":1}}\n")).is_none());
    }
}
