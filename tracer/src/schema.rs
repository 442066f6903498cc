//! The NDJSON schema: one type per line kind, each both written (`--json`, the `--record` file)
//! and read (`replay`, the tests). A stable interface: fields may be added, never renamed or
//! retyped; a missing value is `null`, never a sentinel. Every record the aggregate takes is a
//! line, in its order, so a recording rebuilds the report. The lines and their fields are
//! docs/ndjson.md's to say; wall-clock times are stamped as a line is written ([`Line::stamp`]),
//! names derived again from the path when one is read ([`Line::parse`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::advice::{Advice, Target};
use crate::aggregate::{Attributed, Run};
use crate::cgroups::Version;
use crate::cpustat::CpuStat;
use crate::names::Name;
use crate::records::{
    Bandwidth, Deferred, EndReason, EndedStop, Event, HeldThread, Lost, Period, RecordError, Task,
};
use crate::wallclock::{Reading, Step, Utc};

/// One NDJSON line.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line {
    Start(Start),
    StopBegin(StopFields),
    Stop(Stop),
    AncestorStop(AncestorStop),
    UnseenStartStop(UnseenStartStop),
    ClockStep(ClockStep),
    Summary(Box<Summary>),
    End(End),
    Period(PeriodLine),
    Deferred(DeferredLine),
    Advice(Box<AdviceLine>),
    /// A line type this version does not know (from a newer tracer): read, never written.
    #[serde(other, skip_serializing)]
    #[cfg_attr(test, proptest(skip))]
    Other,
}

impl Line {
    /// Parses one line and derives the `name` of its cgroup path.
    pub fn parse(text: &str) -> serde_json::Result<Self> {
        let mut line: Self = serde_json::from_str(text)?;
        line.derive_name();
        Ok(line)
    }

    /// Sets `name` to that of the `cgroup` path, as the tracer writes it.
    fn derive_name(&mut self) {
        let cgroup = match self {
            Self::StopBegin(s) => &mut s.cgroup,
            Self::Stop(s) => &mut s.started.cgroup,
            Self::AncestorStop(a) => &mut a.stop.started.cgroup,
            Self::UnseenStartStop(u) => &mut u.cgroup,
            Self::Summary(s) => &mut s.cgroup,
            Self::Period(p) => &mut p.cgroup,
            Self::Deferred(d) => &mut d.cgroup,
            Self::Advice(a) => &mut a.cgroup,
            Self::Start(_) | Self::ClockStep(_) | Self::End(_) | Self::Other => return,
        };
        cgroup.name = cgroup.path.as_deref().and_then(Name::of);
    }

    /// Fills in the wall-clock twin of each CLOCK_MONOTONIC time at `clock`'s offset.
    pub fn stamp(&mut self, clock: Reading) {
        match self {
            Self::Start(s) => s.stamp(clock),
            Self::StopBegin(s) => s.stamp(clock),
            Self::Stop(s) => s.stamp(clock),
            Self::AncestorStop(a) => a.stop.stamp(clock),
            Self::UnseenStartStop(u) => (u.end_utc, u.end_unix_ns) = wall(clock, u.end_ns),
            Self::Summary(s) => s.open_stops.iter_mut().for_each(|o| o.stamp(clock)),
            Self::Period(p) => p.stamp(clock),
            Self::Advice(a) => a.stamp(clock),
            Self::Deferred(d) => d.stamp(clock),
            Self::ClockStep(_) | Self::End(_) | Self::Other => {}
        }
    }

    /// The line as JSON, without its newline. The line types hold only strings, integers,
    /// finite floats (a ratio of two non-zero integers) and maps with string keys, which
    /// always serialize; [`Line::Other`] is never made by the tracer.
    pub fn to_json(&self) -> String {
        let mut json = Vec::new();
        self.write_json(&mut json);
        String::from_utf8(json).expect("serde_json writes UTF-8")
    }

    /// [`to_json`](Self::to_json) appended to `out`: a sink that writes a line per record
    /// reuses one buffer instead of a String each.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let start = out.len();
        if let Err(e) = serde_json::to_writer(&mut *out, self) {
            out.truncate(start);
            let error = serde_json::json!({"type": "error", "error": e.to_string()});
            serde_json::to_writer(out, &error).expect("a JSON value serialises");
        }
    }

    /// The line of a ring-buffer record; `cgroup` is its cgroup's path if it resolved.
    pub fn of_event(event: &Event, cgroup: Option<&str>) -> Self {
        match event {
            Event::Start(stop) => Self::StopBegin(StopFields::of(stop, cgroup)),
            Event::End(end) => Self::Stop(Stop::of(end, cgroup)),
            Event::UnseenStartEnd {
                cgroup_id,
                cpu,
                end_ns,
                kernel_ns,
            } => Self::UnseenStartStop(UnseenStartStop {
                cgroup: CgroupRef::new(*cgroup_id, cgroup),
                cpu: *cpu,
                end_ns: *end_ns,
                kernel_ns: *kernel_ns,
                end_utc: None,
                end_unix_ns: None,
            }),
        }
    }

    /// The record a `stop_begin`, `stop` or `unseen_start_stop` line holds, with its cgroup's
    /// path; `None` for the other lines.
    pub fn event(&self) -> Result<Option<(Event, Option<&str>)>, RecordError> {
        Ok(Some(match self {
            Self::StopBegin(s) => (Event::Start(s.record()), s.cgroup.path.as_deref()),
            Self::Stop(s) => (Event::End(s.ended()?), s.started.cgroup.path.as_deref()),
            Self::UnseenStartStop(u) => (
                Event::UnseenStartEnd {
                    cgroup_id: u.cgroup.id,
                    cpu: u.cpu,
                    end_ns: u.end_ns,
                    kernel_ns: u.kernel_ns,
                },
                u.cgroup.path.as_deref(),
            ),
            _ => return Ok(None),
        }))
    }
}

/// The clock of every timestamp in the stream.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    #[default]
    Monotonic,
}

/// A `--pid` process and its name.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidComm {
    pub pid: u32,
    pub comm: String,
}

/// `start`: what the run is, printed first (also the text report's header).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    pub tracer_version: String,
    /// The probe backend, e.g. "kprobe".
    pub backend: String,
    /// `uname -r`.
    pub kernel: String,
    pub clock: Clock,
    pub cgroup_version: Option<Version>,
    /// The cpu hierarchy's mount point.
    #[cfg_attr(
        test,
        proptest(
            strategy = "proptest::strategy::Strategy::prop_map(\"[a-z/,]{0,24}\", PathBuf::from)"
        )
    )]
    pub cgroup_root: PathBuf,
    /// The cgroup paths the run is limited to; empty = all cgroups.
    #[serde(rename = "cgroup_filter")]
    pub cgroups: Vec<String>,
    /// The processes asked for with `--pid`, whose waits the report gives directly.
    #[serde(default, rename = "pid_filter", skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// Each `--pid` process's name (/proc/PID/comm) when tracing started: a process whose main
    /// thread never waits would otherwise be named by a worker thread's comm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pid_comms: Vec<PidComm>,
    /// Probe features this kernel cannot support, so their fields are absent or 0.
    #[serde(rename = "disabled_features")]
    pub disabled: Vec<String>,
    /// End reasons the probes cannot tell apart on this kernel ([`EndReason`] names); such
    /// ends count as "unknown".
    pub blind_end_reasons: Vec<String>,
    /// What `--backend` asked for: "auto" or a backend's name.
    pub backend_requested: String,
    /// The backends `auto` tried before `backend`, in order, each with why it was refused.
    pub backend_refused: Vec<RefusedBackend>,
    /// When the trace started (the probes attached), CLOCK_MONOTONIC, and as wall-clock time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_unix_ns: Option<i64>,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC, read together at the start: `x_unix_ns = x_ns +
    /// realtime_offset_ns` until a `clock_step` line gives another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime_offset_ns: Option<i64>,
    /// The machine's local time zone offset from UTC at the start, in seconds: the text report
    /// shows times of day at it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc_offset_s: Option<i32>,
    /// The machine's `sched_cfs_bandwidth_slice_us` at the start, in ns: the runtime a CPU
    /// draws from a group's pool at a time, which the p99 quota allows for. Absent when it
    /// could not be read, and in recordings made before it (the advice then assumes the
    /// kernel's default, 5 ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_slice_ns: Option<u64>,
    /// The throttling target the advice is for (`--target`): the share of periods its
    /// recommended quota may stop. Absent in recordings made before it: the default, 1 %.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advice_target: Option<Target>,
}

impl Start {
    /// Sets `realtime_offset_ns` to `clock`'s and `start_utc`, `start_unix_ns` from `start_ns`.
    pub fn stamp(&mut self, clock: Reading) {
        self.realtime_offset_ns = Some(clock.offset_ns);
        if let Some(ns) = self.start_ns {
            (self.start_utc, self.start_unix_ns) = wall(clock, ns);
        }
    }
}

/// `x_utc` and `x_unix_ns` of CLOCK_MONOTONIC `ns` at `clock`'s offset.
fn wall(clock: Reading, ns: u64) -> (Option<Utc>, Option<i64>) {
    let unix_ns = clock.unix_ns(ns);
    (Some(Utc::of_unix_ns(unix_ns)), Some(unix_ns))
}

/// `clock_step`: the wall clock was stepped (CLOCK_REALTIME − CLOCK_MONOTONIC moved by more
/// than 100 µs since the offset in use): the lines after it use the new offset.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockStep {
    /// When it was seen, CLOCK_MONOTONIC, and as wall-clock time at the new offset.
    pub at_ns: u64,
    pub at_utc: Utc,
    pub at_unix_ns: i64,
    pub realtime_offset_ns: i64,
    pub previous_realtime_offset_ns: i64,
    /// `realtime_offset_ns − previous_realtime_offset_ns`: how far the wall clock jumped.
    pub step_ns: i64,
}

impl ClockStep {
    pub fn of(step: Step) -> Self {
        let at_unix_ns = step.now.unix_ns(step.now.at_ns);
        Self {
            at_ns: step.now.at_ns,
            at_utc: Utc::of_unix_ns(at_unix_ns),
            at_unix_ns,
            realtime_offset_ns: step.now.offset_ns,
            previous_realtime_offset_ns: step.previous.offset_ns,
            step_ns: step.now.offset_ns - step.previous.offset_ns,
        }
    }
}

/// A backend `--backend auto` passed over.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedBackend {
    pub backend: String,
    /// The one-line cause.
    pub reason: String,
}

/// Which cgroup a line is about: `cgroup_id`, `cgroup` (its path, if it resolved) and `name`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupRef {
    #[serde(rename = "cgroup_id")]
    pub id: u64,
    #[serde(rename = "cgroup")]
    pub path: Option<String>,
    #[serde(skip_deserializing)]
    #[cfg_attr(test, proptest(value = "None"))]
    pub name: Option<Name>,
}

impl CgroupRef {
    pub fn new(id: u64, path: Option<&str>) -> Self {
        Self {
            id,
            path: path.map(str::to_owned),
            name: path.and_then(Name::of),
        }
    }
}

/// What `stop_begin`, `stop` and `ancestor_stop` lines all say of a per-CPU stop: all that
/// is known when it begins ([`crate::records::Stop`], flattened).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopFields {
    #[serde(flatten)]
    pub cgroup: CgroupRef,
    pub cpu: u32,
    pub start_ns: u64,
    /// `quota_ns` `null` = no limit ("max").
    #[serde(flatten)]
    pub bandwidth: Bandwidth,
    pub tasks: u32,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub comm: Option<String>,
    pub parked: u32,
    pub park_ns: Option<u64>,
    pub kernel_start_clock_ns: Option<u64>,
    /// The stopped task's own cgroup when it is a descendant of `cgroup_id` (whose quota
    /// stopped it); `null` if no task was seen or it sat in `cgroup_id` itself.
    pub descendant_cgroup_id: Option<u64>,
    /// The direct children of `cgroup_id` with tasks queued on the stopped CPU at the
    /// throttle: the stop counts for each of them (their cpu.stat.local), at most 8. Absent
    /// from recordings made before stops listed every child.
    #[serde(default)]
    pub descendant_cgroup_ids: Vec<u64>,
    /// Children stopped too but not listed (more than 8); a lower bound past 16 children.
    #[serde(default)]
    pub descendants_unlisted: u32,
    /// The threads the stop held on the stopped CPU (at most 8). Absent from recordings made
    /// before stops listed them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadLine>,
    /// Threads held but not listed (a lower bound, see docs/ndjson.md).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub threads_unlisted: u32,
    /// `start_ns` and `park_ns` as wall-clock time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_unix_ns: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park_unix_ns: Option<i64>,
}

impl StopFields {
    pub fn of(s: &crate::records::Stop, cgroup: Option<&str>) -> Self {
        Self {
            cgroup: CgroupRef::new(s.cgroup_id, cgroup),
            cpu: s.cpu,
            start_ns: s.start_ns,
            bandwidth: s.bandwidth,
            tasks: s.tasks,
            pid: s.task.as_ref().map(|t| t.pid),
            tid: s.task.as_ref().map(|t| t.tid),
            comm: s.task.as_ref().map(|t| t.comm.clone()),
            parked: s.parked,
            park_ns: s.park_ns,
            kernel_start_clock_ns: s.kernel_start_clock,
            descendant_cgroup_id: s.descendant,
            descendant_cgroup_ids: s.children.clone(),
            descendants_unlisted: s.children_unlisted,
            threads: s.threads.iter().map(ThreadLine::of).collect(),
            threads_unlisted: s.threads_unlisted,
            start_utc: None,
            start_unix_ns: None,
            park_utc: None,
            park_unix_ns: None,
        }
    }

    fn stamp(&mut self, clock: Reading) {
        (self.start_utc, self.start_unix_ns) = wall(clock, self.start_ns);
        if let Some(ns) = self.park_ns {
            (self.park_utc, self.park_unix_ns) = wall(clock, ns);
        }
        for t in &mut self.threads {
            (t.since_utc, t.since_unix_ns) = wall(clock, t.since_ns);
        }
    }

    /// The record these fields were made from.
    pub fn record(&self) -> crate::records::Stop {
        let task = match (self.pid, self.tid, &self.comm) {
            (Some(pid), Some(tid), Some(comm)) => Some(Task {
                pid,
                tid,
                comm: comm.clone(),
            }),
            _ => None,
        };
        crate::records::Stop {
            cgroup_id: self.cgroup.id,
            cpu: self.cpu,
            start_ns: self.start_ns,
            bandwidth: self.bandwidth,
            tasks: self.tasks,
            task,
            parked: self.parked,
            park_ns: self.park_ns,
            kernel_start_clock: self.kernel_start_clock_ns,
            descendant: self.descendant_cgroup_id,
            children: self.descendant_cgroup_ids.clone(),
            children_unlisted: self.descendants_unlisted,
            threads: self.threads.iter().map(ThreadLine::record).collect(),
            threads_unlisted: self.threads_unlisted,
        }
    }
}

/// Whether a count is 0: a field added after recordings were made is left out then, so
/// those recordings are written back byte for byte.
fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// One thread a stop held, in `threads` of `stop_begin`, `stop` and `ancestor_stop` lines.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadLine {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// CLOCK_MONOTONIC ns when it began to wait.
    pub since_ns: u64,
    /// How long the stop held it: `end_ns − since_ns` (ended stops only; written for
    /// readers, not needed to read a line back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_unix_ns: Option<i64>,
}

impl ThreadLine {
    fn of(t: &HeldThread) -> Self {
        Self {
            pid: t.pid,
            tid: t.tid,
            comm: t.comm.clone(),
            since_ns: t.since_ns,
            held_ns: None,
            since_utc: None,
            since_unix_ns: None,
        }
    }

    fn record(&self) -> HeldThread {
        HeldThread {
            pid: self.pid,
            tid: self.tid,
            comm: self.comm.clone(),
            since_ns: self.since_ns,
        }
    }
}

/// `stop`: one ended per-CPU stop.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    #[serde(flatten)]
    pub started: StopFields,
    pub end_ns: u64,
    /// `end_ns − start_ns`: written for readers, not needed to read a line back.
    #[serde(default)]
    pub duration_ns: u64,
    pub kernel_ns: Option<u64>,
    /// Absent in no recording the tracer wrote; read as "unknown" if it is.
    #[serde(default)]
    pub end: EndReason,
    /// `end_ns` as wall-clock time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_unix_ns: Option<i64>,
}

impl Stop {
    pub fn of(end: &EndedStop, cgroup: Option<&str>) -> Self {
        let mut started = StopFields::of(&end.stop, cgroup);
        for (line, t) in started.threads.iter_mut().zip(&end.stop.threads) {
            line.held_ns = Some(end.held_ns(t));
        }
        Self {
            started,
            end_ns: end.end_ns,
            duration_ns: end.duration_ns(),
            kernel_ns: end.kernel_ns,
            end: end.reason,
            end_utc: None,
            end_unix_ns: None,
        }
    }

    fn stamp(&mut self, clock: Reading) {
        self.started.stamp(clock);
        (self.end_utc, self.end_unix_ns) = wall(clock, self.end_ns);
    }

    /// The ended stop this line holds; an error if it ends before it starts.
    pub fn ended(&self) -> Result<EndedStop, RecordError> {
        let start_ns = self.started.start_ns;
        if self.end_ns < start_ns {
            return Err(RecordError::EndBeforeStart {
                cpu: self.started.cpu,
                start_ns,
                end_ns: self.end_ns,
            });
        }
        Ok(EndedStop {
            stop: self.started.record(),
            end_ns: self.end_ns,
            kernel_ns: self.kernel_ns,
            reason: self.end,
        })
    }
}

/// `ancestor_stop`: an ended per-CPU stop of a cgroup that is not traced itself (an ancestor
/// of a selected cgroup): the `stop` line's fields and the selected descendants it stopped,
/// which it counts for. Its own type keeps readers of `stop` lines to the selected cgroups.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AncestorStop {
    #[serde(flatten)]
    pub stop: Stop,
    /// The traced cgroups it stopped (their `stopped_by_ancestor`).
    pub credited_cgroup_ids: Vec<u64>,
}

/// `unseen_start_stop`: a stop that began before tracing; only its end and its
/// kernel-accounted length are known.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnseenStartStop {
    #[serde(flatten)]
    pub cgroup: CgroupRef,
    pub cpu: u32,
    pub end_ns: u64,
    pub kernel_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_unix_ns: Option<i64>,
}

/// A per-CPU stop still open when the trace finished, in a `summary`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenStop {
    pub cpu: u32,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// From `start_ns` to the end of the trace.
    pub elapsed_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_unix_ns: Option<i64>,
}

impl OpenStop {
    pub fn of(open: &crate::aggregate::OpenStop) -> Self {
        Self {
            cpu: open.cpu,
            start_ns: open.start_ns,
            elapsed_ns: open.elapsed_ns,
            start_utc: None,
            start_unix_ns: None,
        }
    }

    fn stamp(&mut self, clock: Reading) {
        (self.start_utc, self.start_unix_ns) = wall(clock, self.start_ns);
    }
}

/// `summary`: one cgroup's figures at the end of the run (definitions: docs/definitions.md).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    #[serde(flatten)]
    pub cgroup: CgroupRef,
    pub stops: u64,
    pub group_stops: u64,
    pub cpu_stop_ns: u64,
    pub kernel_stop_ns: u64,
    pub kernel_unknown_stops: u64,
    pub wall_stop_ns: u64,
    pub p50_ns: Option<u64>,
    pub p90_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: Option<u64>,
    pub group_p50_ns: Option<u64>,
    pub group_p90_ns: Option<u64>,
    pub group_p99_ns: Option<u64>,
    pub group_max_ns: Option<u64>,
    pub stops_log2_ms: Vec<u32>,
    pub group_stops_log2_ms: Vec<u32>,
    /// Ended stops per [`EndReason`] name.
    pub end_reasons: BTreeMap<String, u64>,
    pub open: usize,
    pub open_stops: Vec<OpenStop>,
    pub unseen_start_stops: u64,
    pub unseen_start_kernel_ns: u64,
    pub unseen_start_kernel_unknown: u64,
    /// kernel_stop_ns + unseen_start_kernel_ns: the trace's account of the cpu.stat delta.
    pub kernel_accounted_ns: u64,
    pub unmatched_ends: u64,
    pub restarted: u64,
    pub cpu_stat: Option<CpuStat>,
    #[cfg_attr(test, proptest(strategy = "proptest::option::of(0.0f64..1e12)"))]
    pub overcount: Option<f64>,
    /// Settings from the control files at the end; `quota_ns` null = no limit, and all
    /// three null when they could not be read.
    #[serde(flatten)]
    pub settings: Bandwidth,
    /// For a quota owner: its stops that stopped each descendant's tasks.
    pub descendants: Vec<Attributed>,
    /// For a descendant: the stops of each ancestor's quota that stopped its tasks (not in the
    /// figures above, which are the group's own quota's).
    pub stopped_by_ancestor: Vec<Attributed>,
    /// For a quota owner: stops that stopped more children than a stop line lists.
    pub children_unlisted_stops: u64,
    /// kernel_accounted_ns + Σ stopped_by_ancestor kernel_ns: the trace's account of the
    /// cpu.stat.local throttled delta (6.6+).
    pub local_accounted_ns: u64,
    /// The processes its stops held, most held first. Absent from recordings made before
    /// stops listed their threads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessLine>,
    /// Σ over its stops of the threads held but not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub threads_unlisted: u64,
    /// The cgroup was removed during the trace (its figures run to its removal, `cpu_stat`
    /// is null); absent when it was not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gone: bool,
    /// Its cpu.stat or quota files could not be read for want of permission at the end (so
    /// `cpu_stat` is null although it exists); absent when they could.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unreadable: bool,
    /// Its records lost (`lost_stop_begins`, `lost_stops`, `lost_periods`), each absent when 0.
    #[serde(flatten)]
    pub lost: Lost,
}

/// One process a cgroup's stops held, in a `summary`: the stops that held any of its threads
/// and its wait in them (per stop, its longest-held thread's), with each thread's.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLine {
    pub pid: u32,
    pub comm: String,
    pub stops: u64,
    pub held_ns: u64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: Option<u64>,
    pub threads: Vec<ThreadTotal>,
}

/// One thread's stops and held time, in a [`ProcessLine`].
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadTotal {
    pub tid: u32,
    pub comm: String,
    pub stops: u64,
    pub held_ns: u64,
}

impl ProcessLine {
    pub fn of(p: &crate::aggregate::ProcessHeld) -> Self {
        let pct = p.waits.percentiles;
        Self {
            pid: p.pid,
            comm: p.comm.clone(),
            stops: p.waits.count,
            held_ns: p.waits.sum_ns,
            p50_ns: pct.map(|p| p.p50_ns),
            p99_ns: pct.map(|p| p.p99_ns),
            max_ns: pct.map(|p| p.max_ns),
            threads: p
                .threads
                .iter()
                .map(|t| ThreadTotal {
                    tid: t.tid,
                    comm: t.comm.clone(),
                    stops: t.stops,
                    held_ns: t.held_ns,
                })
                .collect(),
        }
    }
}

/// `period`: one period of a cgroup with a quota (tracepoint backend), at the expiry of its
/// period timer: the CPU time it ran in the period and whether it ended throttled.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodLine {
    #[serde(flatten)]
    pub cgroup: CgroupRef,
    /// The record, less its cgroup id (`cgroup` has it).
    #[serde(flatten)]
    pub period: Period,
    #[serde(flatten)]
    pub wall: WallSpan,
}

/// `deferred`: the work a stop deferred that one held thread ran (tracepoint backend), once it
/// blocked: docs/definitions.md, "deferred work".
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeferredLine {
    #[serde(flatten)]
    pub cgroup: CgroupRef,
    /// The record, less its cgroup id (`cgroup` has it).
    #[serde(flatten)]
    pub deferred: Deferred,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_unix_ns: Option<i64>,
}

impl DeferredLine {
    pub fn of(d: &Deferred, cgroup: Option<&str>) -> Self {
        Self {
            cgroup: CgroupRef::new(d.cgroup_id, cgroup),
            deferred: *d,
            since_utc: None,
            since_unix_ns: None,
        }
    }

    fn stamp(&mut self, clock: Reading) {
        (self.since_utc, self.since_unix_ns) = wall(clock, self.deferred.since_ns);
    }

    /// The record this line was made from.
    pub fn record(&self) -> Deferred {
        Deferred {
            cgroup_id: self.cgroup.id,
            ..self.deferred
        }
    }
}

/// The wall-clock twins of a `start_ns` / `end_ns` span (left out when unknown).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WallSpan {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_unix_ns: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_utc: Option<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_unix_ns: Option<i64>,
}

impl WallSpan {
    fn of(clock: Reading, start_ns: Option<u64>, end_ns: u64) -> Self {
        let (start_utc, start_unix_ns) = start_ns.map_or((None, None), |ns| wall(clock, ns));
        let (end_utc, end_unix_ns) = wall(clock, end_ns);
        Self {
            start_utc,
            start_unix_ns,
            end_utc,
            end_unix_ns,
        }
    }
}

/// A busy run of an `advice` line, with its wall-clock span.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLine {
    #[serde(flatten)]
    pub run: Run,
    #[serde(flatten)]
    pub wall: WallSpan,
}

impl PeriodLine {
    fn stamp(&mut self, clock: Reading) {
        self.wall = WallSpan::of(clock, self.period.start_ns, self.period.end_ns);
    }

    pub fn of(p: &Period, cgroup: Option<&str>) -> Self {
        Self {
            cgroup: CgroupRef::new(p.cgroup_id, cgroup),
            period: *p,
            wall: WallSpan::default(),
        }
    }

    /// The record this line was made from.
    pub fn record(&self) -> Period {
        Period {
            cgroup_id: self.cgroup.id,
            ..self.period
        }
    }
}

/// `advice`: per cgroup with a quota whose demand was measured, at the end (after the
/// `summary` lines): what its busy runs needed and the quota, burst and period that fit them
/// (docs/definitions.md, "demand" and "advice").
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdviceLine {
    #[serde(flatten)]
    pub cgroup: CgroupRef,
    /// Periods measured, of them ended throttled, and the CPU time used in them.
    pub periods: u64,
    pub throttled_periods: u64,
    pub usage_ns: u64,
    /// Σ burst the periods spent (5.16+), as cpu.stat `burst_time` counts it.
    #[serde(default)]
    pub burst_spent_ns: Option<u64>,
    pub run_p50_ns: Option<u64>,
    pub run_p90_ns: Option<u64>,
    /// The work waiting at a throttled period's end, over the throttled periods whose held
    /// threads all finished it (tracepoint backend; docs/definitions.md, "deferred work"):
    /// how many, and its p50, p99 and largest. Absent in recordings made before it.
    #[serde(default)]
    pub waiting_periods: u64,
    #[serde(default)]
    pub waiting_p50_ns: Option<u64>,
    #[serde(default)]
    pub waiting_p99_ns: Option<u64>,
    #[serde(default)]
    pub waiting_max_ns: Option<u64>,
    /// Holds whose deferred work came for no throttled period the agent still kept open to it
    /// (the last 128 of the cgroup's, or a refill between period boundaries): in no figure.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waiting_unplaced: u64,
    /// Run demand in [2^i, 2^(i+1)) ms at index i.
    pub runs_log2_ms: Vec<u32>,
    /// The largest runs, largest first.
    pub largest_runs: Vec<RunLine>,
    #[serde(flatten)]
    pub advice: Advice,
}

impl AdviceLine {
    fn stamp(&mut self, clock: Reading) {
        for r in &mut self.largest_runs {
            r.wall = WallSpan::of(clock, Some(r.run.start_ns), r.run.end_ns);
        }
    }
}

/// `end`: whole-run counters, the last line.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    /// Records the kernel could not put in the full ring buffer.
    pub lost: u64,
    /// Records that did not decode (`records::RecordError`).
    pub malformed: u64,
    /// CLOCK_MONOTONIC ns from attach to the end of the trace.
    pub elapsed_ns: u64,
    /// Runs of the tracer's programs that the kernel skipped, summed over the programs: its
    /// recursion guard skips a program that an interrupt enters while it runs on that CPU
    /// (the hrtimer programs, running for a softirq hrtimer when a hard one expires). Each is
    /// an observation missed: a refill not seen at its callback ends its stop at the next
    /// observation instead, as `unknown`. From each program's fdinfo (`recursion_misses`,
    /// 5.12+); absent where the kernel does not count them, and in recordings made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed_runs: Option<u64>,
    /// Removed cgroups the programs' map of removed cgroups (LRU, 1024, every backend's)
    /// evicted to stay bounded: a throttled cfs_rq of one seen after its eviction would start a
    /// stop. Absent in recordings made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted_removed_cgroups: Option<u64>,
    /// Removed cgroups whose paths the agent forgot to stay bounded (it keeps the last 4096):
    /// a later line about one has no path. Absent in recordings made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forgotten_paths: Option<u64>,
    /// Cgroups that never stopped whose periods the agent forgot to stay bounded (it keeps
    /// the 1024 latest to have one): if one stops later, its demand and advice cover only the
    /// periods since. Absent in recordings made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forgotten_demand: Option<u64>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;
    use crate::testing::{MS, ended};

    fn parse(line: &Line) -> Value {
        let text = line.to_json();
        assert!(!text.contains('\n'));
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn start_line() {
        let v = parse(&Line::Start(Start {
            backend: "kprobe".into(),
            kernel: "6.1.0-47-cloud-amd64".into(),
            cgroup_version: Some(Version::V1),
            cgroup_root: "/sys/fs/cgroup/cpu".into(),
            cgroups: vec![],
            disabled: vec!["tasks".into(), "pid".into()],
            blind_end_reasons: vec!["cpu_offline".into()],
            backend_requested: "auto".into(),
            backend_refused: vec![RefusedBackend {
                backend: "fentry".into(),
                reason: "EPERM".into(),
            }],
            ..Start::default()
        }));
        assert_eq!(v["type"], "start");
        assert_eq!(v["backend"], "kprobe");
        assert_eq!(v["kernel"], "6.1.0-47-cloud-amd64");
        assert_eq!(v["clock"], "monotonic");
        assert_eq!(v["cgroup_version"], "v1");
        assert_eq!(v["cgroup_root"], "/sys/fs/cgroup/cpu");
        assert_eq!(v["cgroup_filter"], serde_json::json!([]));
        assert_eq!(v["disabled_features"], serde_json::json!(["tasks", "pid"]));
        assert_eq!(v["blind_end_reasons"], serde_json::json!(["cpu_offline"]));
        assert_eq!(v["backend_requested"], "auto");
        assert_eq!(
            v["backend_refused"],
            serde_json::json!([{"backend": "fentry", "reason": "EPERM"}])
        );
        assert!(parse(&Line::Start(Start::default()))["cgroup_version"].is_null());
    }

    #[test]
    fn stop_line_with_and_without_optional_values() {
        let e = ended(3, 100, 180);
        let v = parse(&Line::Stop(Stop::of(&e, Some("/demo"))));
        assert_eq!(v["type"], "stop");
        assert_eq!(v["cgroup_id"], 4242);
        assert_eq!(v["cgroup"], "/demo");
        assert!(v["name"].is_null(), "/demo is nothing users would know");
        assert_eq!(v["cpu"], 3);
        assert_eq!(v["start_ns"], 100 * MS);
        assert_eq!(v["end_ns"], 180 * MS);
        assert_eq!(v["duration_ns"], 80 * MS);
        assert_eq!(v["kernel_ns"], 80 * MS + 1_000);
        assert_eq!(v["end"], "refill");
        assert_eq!(v["quota_ns"], 20 * MS);
        assert_eq!(v["period_ns"], 100 * MS);
        assert_eq!(v["burst_ns"], 0);
        assert_eq!(v["tasks"], 2);
        assert_eq!(
            (&v["pid"], &v["tid"], &v["comm"]),
            (&Value::from(100), &Value::from(101), &Value::from("stress"))
        );

        assert_eq!(v["parked"], 1);
        assert_eq!(v["park_ns"], 100 * MS + 2_000);
        assert_eq!(v["kernel_start_clock_ns"], 5_000 * MS);

        let mut e = e;
        e.kernel_ns = None;
        e.stop.bandwidth.quota_ns = None;
        e.stop.task = None;
        e.stop.parked = 0;
        e.stop.park_ns = None;
        e.stop.kernel_start_clock = None;
        let v = parse(&Line::Stop(Stop::of(&e, None)));
        for key in [
            "cgroup",
            "name",
            "kernel_ns",
            "quota_ns",
            "pid",
            "tid",
            "comm",
            "park_ns",
            "kernel_start_clock_ns",
        ] {
            assert!(v[key].is_null(), "{key} should be null: {v}");
        }
        assert!(v["duration_ns"].is_u64());
        assert_eq!(v["parked"], 0);
    }

    #[test]
    fn ancestor_stop_line_is_a_stop_line_with_the_cgroups_it_counts_for() {
        let e = ended(1, 100, 140);
        let stop = parse(&Line::Stop(Stop::of(&e, Some("/pod"))));
        let mut v = parse(&Line::AncestorStop(AncestorStop {
            stop: Stop::of(&e, Some("/pod")),
            credited_cgroup_ids: vec![11, 12],
        }));
        assert_eq!(v["type"], "ancestor_stop");
        assert_eq!(v["credited_cgroup_ids"], serde_json::json!([11, 12]));
        let fields = v.as_object_mut().unwrap();
        fields.remove("credited_cgroup_ids");
        fields.insert("type".into(), "stop".into());
        assert_eq!(v, stop);
    }

    #[test]
    fn end_line() {
        let v = parse(&Line::End(End {
            lost: 2,
            malformed: 1,
            elapsed_ns: 5 * MS,
            missed_runs: Some(0),
            evicted_removed_cgroups: Some(3),
            forgotten_paths: Some(4),
            forgotten_demand: Some(5),
        }));
        assert_eq!(
            v,
            serde_json::json!({"type": "end", "lost": 2, "malformed": 1, "elapsed_ns": 5 * MS,
                "missed_runs": 0, "evicted_removed_cgroups": 3, "forgotten_paths": 4,
                "forgotten_demand": 5})
        );
    }

    #[test]
    fn records_turn_into_lines_and_back() {
        let mut bare = ended(1, 20, 100);
        bare.kernel_ns = None;
        bare.stop.task = None;
        bare.stop.children = vec![7, 8];
        for event in [
            Event::Start(ended(0, 0, 80).stop),
            Event::End(ended(0, 0, 80)),
            Event::End(bare),
            Event::UnseenStartEnd {
                cgroup_id: 9,
                cpu: 1,
                end_ns: 5,
                kernel_ns: None,
            },
        ] {
            let line = Line::parse(&Line::of_event(&event, Some("/demo")).to_json()).unwrap();
            assert_eq!(line.event().unwrap(), Some((event, Some("/demo"))));
        }
    }

    #[test]
    fn period_lines_hold_their_record() {
        let p = Period {
            cgroup_id: 3,
            end_ns: 200,
            start_ns: Some(100),
            usage_ns: 40,
            max_cpu_ns: 30,
            cpus_used: 2,
            throttled_cpus: 1,
            bandwidth: Bandwidth {
                quota_ns: Some(50),
                period_ns: Some(100),
                burst_ns: None,
            },
            runtime_ns: Some(0),
            burst_spent_ns: Some(7),
        };
        let line = Line::parse(&Line::Period(PeriodLine::of(&p, Some("/a"))).to_json()).unwrap();
        let Line::Period(back) = line else {
            panic!("not a period line");
        };
        assert_eq!(back.record(), p);
        let v = parse(&Line::Period(PeriodLine::of(&p, None)));
        assert_eq!(
            (v["type"].as_str(), v["usage_ns"].as_u64()),
            (Some("period"), Some(40))
        );
        assert!(v["burst_ns"].is_null());
        assert_eq!(v["burst_spent_ns"].as_u64(), Some(7));
        assert_eq!(v["cgroup_id"].as_u64(), Some(3));
    }

    /// Recordings made before this module existed (tests/golden.rs has their story).
    #[test]
    fn lines_of_earlier_recordings_are_written_back_byte_for_byte() {
        for text in [
            include_str!("../tests/data/golden/all.ndjson"),
            include_str!("../tests/data/golden/child.ndjson"),
        ] {
            for l in text.lines() {
                let line = Line::parse(l).unwrap_or_else(|e| panic!("{e}: {l}"));
                assert!(line != Line::Other, "{l}");
                assert_eq!(line.to_json(), l);
            }
        }
    }

    /// Runs `test` on arbitrary lines of every kind. The derived strategy of every line kind
    /// nests deeply: a debug build overflowed a test thread's 2 MiB stack building and running
    /// it.
    fn for_any_line(test: impl Fn(Line) -> Result<(), TestCaseError> + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(move || {
                proptest::test_runner::TestRunner::default()
                    .run(&any::<Line>(), test)
                    .unwrap_or_else(|e| panic!("{e}"));
            })
            .expect("spawn the property test")
            .join()
            .expect("the property holds for every line kind");
    }

    #[test]
    fn every_line_kind_parses_back_to_itself() {
        for_any_line(|mut line| {
            line.derive_name();
            let text = line.to_json();
            prop_assert!(!text.contains('\n'));
            let back =
                Line::parse(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            prop_assert_eq!(&back, &line);
            prop_assert_eq!(back.to_json(), text);
            Ok(())
        });
    }

    /// The keys of CLOCK_MONOTONIC times, wherever a line has them.
    const TIMES: [&str; 5] = ["start_ns", "end_ns", "park_ns", "since_ns", "at_ns"];

    /// Checks that every time of `TIMES` in `v` (at `path`, nested objects and arrays
    /// included) has its `_utc` and `_unix_ns` twins at `offset_ns`; adds each time's path to
    /// `seen`.
    fn wall_clock_twins(
        v: &Value,
        offset_ns: i64,
        path: &str,
        seen: &mut BTreeSet<String>,
    ) -> Result<(), TestCaseError> {
        match v {
            Value::Object(fields) => {
                for (key, value) in fields {
                    let at = format!("{path}.{key}");
                    if let (true, Some(ns)) = (TIMES.contains(&key.as_str()), value.as_u64()) {
                        let stem = key.trim_end_matches("_ns");
                        let unix = (i128::from(ns) + i128::from(offset_ns)).min(i64::MAX.into());
                        let unix = i64::try_from(unix).expect("clamped to i64");
                        prop_assert_eq!(
                            fields.get(&format!("{stem}_unix_ns")),
                            Some(&Value::from(unix)),
                            "{} in {}",
                            at,
                            v
                        );
                        prop_assert_eq!(
                            fields.get(&format!("{stem}_utc")),
                            Some(&Value::from(Utc::of_unix_ns(unix).to_string())),
                            "{} in {}",
                            at,
                            v
                        );
                        seen.insert(at.clone());
                    }
                    wall_clock_twins(value, offset_ns, &at, seen)?;
                }
            }
            Value::Array(items) => {
                for item in items {
                    wall_clock_twins(item, offset_ns, &format!("{path}[]"), seen)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Every line kind that carries a CLOCK_MONOTONIC time carries it as wall-clock time too,
    /// `x_utc` and `x_unix_ns`, at the offset in use when it is written (a `clock_step` line:
    /// its own new offset), nested times included; and the kinds the schema promises it for
    /// were all met with their times.
    #[test]
    fn every_time_a_line_carries_has_its_wall_clock_twins() {
        use std::sync::{Arc, Mutex};
        const OFFSET_NS: i64 = 1_764_666_843_000_000_000;
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let mine = Arc::clone(&seen);
        for_any_line(move |mut line| {
            if let Line::ClockStep(step) = &mut line {
                // Its times are the step's own, not stamped: made as the tracker's step makes
                // them (an arbitrary line's fields disagree with each other).
                *step = ClockStep::of(Step {
                    previous: Reading {
                        at_ns: 0,
                        offset_ns: OFFSET_NS,
                    },
                    now: Reading {
                        at_ns: step.at_ns,
                        offset_ns: OFFSET_NS + step.step_ns % 1_000_000_000_000,
                    },
                });
            }
            line.stamp(Reading {
                at_ns: 0,
                offset_ns: OFFSET_NS,
            });
            let v = parse(&line);
            let offset_ns = match &line {
                Line::ClockStep(step) => step.realtime_offset_ns,
                _ => OFFSET_NS,
            };
            let kind = v["type"].as_str().unwrap_or("?").to_owned();
            let mut seen = mine.lock().unwrap_or_else(|e| e.into_inner());
            wall_clock_twins(&v, offset_ns, &kind, &mut seen)
        });
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        for time in [
            "start.start_ns",
            "stop_begin.start_ns",
            "stop_begin.park_ns",
            "stop_begin.threads[].since_ns",
            "stop.start_ns",
            "stop.end_ns",
            "stop.park_ns",
            "stop.threads[].since_ns",
            "ancestor_stop.start_ns",
            "ancestor_stop.end_ns",
            "ancestor_stop.threads[].since_ns",
            "unseen_start_stop.end_ns",
            "clock_step.at_ns",
            "summary.open_stops[].start_ns",
            "period.start_ns",
            "period.end_ns",
            "advice.largest_runs[].start_ns",
            "advice.largest_runs[].end_ns",
        ] {
            assert!(seen.contains(time), "no {time} was met: {seen:?}");
        }
    }

    proptest! {
        #[test]
        fn paths_that_name_containers_keep_their_names(id in "[0-9a-f]{64}", cpu in 0u32..64) {
            let path = format!("/docker/{id}");
            let mut e = ended(cpu, 0, 80);
            e.stop.cgroup_id = 1;
            let line = Line::Stop(Stop::of(&e, Some(&path)));
            let back = Line::parse(&line.to_json()).unwrap();
            prop_assert_eq!(&back, &line);
            prop_assert!(matches!(&back, Line::Stop(s) if s.started.cgroup.name.is_some()));
        }
    }
}
