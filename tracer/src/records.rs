//! Turns ring-buffer bytes into typed stop events: one [`StopEvent`] per record (see
//! `tracer-common`), its sentinels made `Option`s and `kind`/`end_reason` enums, and anything not
//! well-formed rejected with a typed [`RecordError`], so that the run loop can count it as
//! malformed instead of guessing. Timestamps are CLOCK_MONOTONIC ns; `kernel_ns` is on the
//! kernel's `rq->clock`, which cpu.stat sums (docs/ndjson.md).

use serde::{Deserialize, Serialize};
use std::mem::size_of;

use tracer_common::{
    DEFERRED_CONTINUES, DEFERRED_UNFOLLOWED, DeferredEvent, END_CGROUP_GONE, END_CPU_OFFLINE,
    END_QUOTA_CHANGE, END_REFILL, EVENT_DEFERRED, EVENT_END, EVENT_PERIOD, EVENT_START,
    EVENT_UNSEEN_START_END, KERNEL_NS_UNKNOWN, LOST_KERNEL_NS, MAX_CHILDREN, MAX_THREADS,
    PeriodEvent, StopEvent,
};

/// Why a ring-buffer record could not be turned into an [`Event`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record of {got} bytes, expected {want}")]
    Size { got: usize, want: usize },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
    #[error("stop on cpu {cpu} ends at {end_ns} ns, before its start at {start_ns} ns")]
    EndBeforeStart {
        cpu: u32,
        start_ns: u64,
        end_ns: u64,
    },
}

/// What ended a stop: which kernel path called `unthrottle_cfs_rq`. Serialized as
/// [`as_str`](Self::as_str) names; a name this version does not know reads as `Unknown`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// Period or slack timer refill: the normal end of a quota stop.
    Refill,
    /// A write to the group's quota/period/burst files unthrottled it.
    QuotaChange,
    /// The CPU went offline.
    CpuOffline,
    /// The cgroup was being destroyed.
    CgroupGone,
    /// The probe could not tell (or the kernel sent a value this agent does not know).
    #[default]
    #[serde(other)]
    Unknown,
}

impl EndReason {
    fn from_raw(raw: u32) -> Self {
        match raw {
            END_REFILL => Self::Refill,
            END_QUOTA_CHANGE => Self::QuotaChange,
            END_CPU_OFFLINE => Self::CpuOffline,
            END_CGROUP_GONE => Self::CgroupGone,
            // `END_UNKNOWN`, and values from a newer eBPF object.
            _ => Self::Unknown,
        }
    }

    /// The stable name used in NDJSON and the text report.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refill => "refill",
            Self::QuotaChange => "quota_change",
            Self::CpuOffline => "cpu_offline",
            Self::CgroupGone => "cgroup_gone",
            Self::Unknown => "unknown",
        }
    }
}

/// A group's bandwidth settings (`tg->cfs_bandwidth`), ns: in a record, as the kernel had them
/// at the event; from `cpustat::read_bandwidth`, as the control files say now.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bandwidth {
    /// Runtime per period; `None` = "max" (no limit, the kernel's `RUNTIME_INF`).
    pub quota_ns: Option<u64>,
    /// `None` if the probe could not read it.
    pub period_ns: Option<u64>,
    /// Extra runtime a period may carry over; `None` if this kernel has no burst (< 5.14).
    pub burst_ns: Option<u64>,
}

/// The task that was running on the stopped CPU when the stop began, if it was in the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// Thread-group id (the "process id" users know).
    pub pid: u32,
    /// The thread's own id.
    pub tid: u32,
    /// `task->comm`, up to the first NUL, lossily decoded.
    pub comm: String,
}

/// A thread a stop held: it waited on the stopped CPU from `since_ns` to the stop's end.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldThread {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// CLOCK_MONOTONIC ns when it began to wait (docs/design.md, "threads held").
    pub since_ns: u64,
}

/// One per-CPU stop: one cfs_rq (one CPU's runqueue of one cgroup) throttled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stop {
    /// The cgroup directory's inode number in the cpu hierarchy (`kn->id`).
    pub cgroup_id: u64,
    /// The stopped CPU (not the CPU that ran the probe).
    pub cpu: u32,
    /// CLOCK_MONOTONIC ns when the throttle took effect.
    pub start_ns: u64,
    pub bandwidth: Bandwidth,
    /// Tasks queued in the stopped cfs_rq at throttle time. 0 is a real value (kernels before
    /// 6.6 throttle empty cfs_rqs too) and also what a kernel without the field reports.
    pub tasks: u32,
    /// `None` when the running task was not in the group (the kernel sends pid 0).
    pub task: Option<Task>,
    /// Tasks the stop parked (6.18's task-based throttle dequeues each task of the group when
    /// it next returns to user mode), as the tracepoint backend saw them; in an end, all of
    /// them, in a start, those parked by then. 0 on older kernels (the whole group is
    /// dequeued at once, nothing is parked) and from the kprobe and fentry backends.
    pub parked: u32,
    /// CLOCK_MONOTONIC ns when the first task was parked (tracepoint backend, 6.18); `None`
    /// if none was seen. On 6.18 the kernel's accounting (`kernel_ns`) starts there.
    pub park_ns: Option<u64>,
    /// The kernel's own start of the stop, `cfs_rq->throttled_clock`, on the kernel's
    /// `rq->clock` (sched_clock), not CLOCK_MONOTONIC: comparable only with other kernel
    /// clock readings. `None` if the backend did not read it or the kernel had not set it.
    pub kernel_start_clock: Option<u64>,
    /// The own cgroup of the task seen stopped (running on the CPU, or parked: 6.18
    /// tracepoint backend), when it is a *descendant* of `cgroup_id`: the quota that stopped
    /// it lives on an ancestor. `None` if no task was seen or it sat in `cgroup_id` itself.
    /// In a START it may still be unknown; the END carries the last word.
    pub descendant: Option<u64>,
    /// The direct children of `cgroup_id` this stop stopped too: those with tasks queued on
    /// the stopped CPU when the stop was recorded (at most `MAX_CHILDREN`). Empty when there
    /// were none or the kernel's fields did not resolve.
    pub children: Vec<u64>,
    /// Children that qualified but are not in `children` (a lower bound when the group has
    /// more children than the probe looks at).
    pub children_unlisted: u32,
    /// The threads of the group the stop held on the stopped CPU, as far as the backend saw
    /// them (at most `MAX_THREADS`); in a START, those held by then.
    pub threads: Vec<HeldThread>,
    /// Threads held but not in `threads`, a lower bound: those past the listed ones, or the
    /// tasks queued at the start that the probe did not name, whichever is more.
    pub threads_unlisted: u32,
}

impl Stop {
    /// The descendants this stop counts for: every child listed, and the descendant whose task
    /// was seen stopped (its group had that task queued, so the kernel stops its clock too).
    /// That one alone when nothing is listed (a kernel without the fields); it also covers a
    /// child the probe found momentarily empty (6.18 parks tasks one by one, and the
    /// tracepoint backend may look from another CPU while one is being parked).
    pub fn credited(&self) -> Vec<u64> {
        let mut ids = self.children.clone();
        if let Some(d) = self.descendant.filter(|d| !ids.contains(d)) {
            ids.push(d);
        }
        ids
    }
}

/// A per-CPU stop that ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedStop {
    pub stop: Stop,
    /// CLOCK_MONOTONIC ns when the unthrottle took effect; never before `stop.start_ns`.
    pub end_ns: u64,
    /// What the kernel added to cpu.stat `throttled_time` for this stop (its `rq->clock`
    /// difference); `None` when the probe could not read the kernel's clocks.
    pub kernel_ns: Option<u64>,
    pub reason: EndReason,
}

impl EndedStop {
    /// The stop as the tracer measured it: `end_ns - start_ns`, CLOCK_MONOTONIC ns.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.stop.start_ns
    }

    /// How long the stop held `thread`: from its wait's start to the stop's end, ns.
    pub fn held_ns(&self, thread: &HeldThread) -> u64 {
        self.end_ns
            .saturating_sub(thread.since_ns.max(self.stop.start_ns))
    }
}

/// One decoded ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A cfs_rq was throttled.
    Start(Stop),
    /// A cfs_rq whose start we saw was unthrottled.
    End(EndedStop),
    /// A cfs_rq throttled before tracing began was unthrottled. Only `kernel_ns` measures it; the
    /// kernel adds that to cpu.stat inside the tracing window, so the cross-check needs it.
    UnseenStartEnd {
        cgroup_id: u64,
        cpu: u32,
        end_ns: u64,
        kernel_ns: Option<u64>,
    },
}

impl Event {
    /// The cgroup the record is about: the one whose quota stopped the CPU.
    pub fn cgroup_id(&self) -> u64 {
        match self {
            Self::Start(stop) => stop.cgroup_id,
            Self::End(end) => end.stop.cgroup_id,
            Self::UnseenStartEnd { cgroup_id, .. } => *cgroup_id,
        }
    }

    /// Decodes one ring-buffer record, which must be exactly one `StopEvent`.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        let want = size_of::<StopEvent>();
        if bytes.len() != want {
            return Err(RecordError::Size {
                got: bytes.len(),
                want,
            });
        }
        let ptr = bytes.as_ptr().cast::<StopEvent>();
        if ptr.is_aligned() {
            // SAFETY: the length is exactly `size_of::<StopEvent>()` and the pointer aligned;
            // `StopEvent` is `#[repr(C)]` plain integers and bytes (`aya::Pod`), so every bit
            // pattern is a valid value. Read in place: a copy of its ~500 bytes was a tenth of
            // the ingest path's time.
            Self::from_raw(unsafe { &*ptr })
        } else {
            // SAFETY: as above; `read_unaligned` copes with a slot that is not 8-aligned.
            let raw: StopEvent = unsafe { std::ptr::read_unaligned(ptr) };
            Self::from_raw(&raw)
        }
    }

    fn from_raw(raw: &StopEvent) -> Result<Self, RecordError> {
        let kernel_ns = (raw.kernel_ns != KERNEL_NS_UNKNOWN).then_some(raw.kernel_ns);
        match raw.kind {
            EVENT_START => Ok(Self::Start(stop_of(raw))),
            EVENT_END => {
                if raw.end_ns < raw.start_ns {
                    return Err(RecordError::EndBeforeStart {
                        cpu: raw.cpu,
                        start_ns: raw.start_ns,
                        end_ns: raw.end_ns,
                    });
                }
                Ok(Self::End(EndedStop {
                    stop: stop_of(raw),
                    end_ns: raw.end_ns,
                    kernel_ns,
                    reason: EndReason::from_raw(raw.end_reason),
                }))
            }
            EVENT_UNSEEN_START_END => Ok(Self::UnseenStartEnd {
                cgroup_id: raw.cgroup_id,
                cpu: raw.cpu,
                end_ns: raw.end_ns,
                kernel_ns,
            }),
            other => Err(RecordError::UnknownKind(other)),
        }
    }
}

/// One period of a group with a quota, as the probes measure it at the expiry of the group's
/// period timer (docs/definitions.md, "demand"). Serialised as the NDJSON `period` line's
/// fields, where the cgroup id is the line's own.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Period {
    /// Not serialised: the line's `cgroup_id` is it (and so the generated ones are 0).
    #[serde(skip)]
    #[cfg_attr(test, proptest(value = "0"))]
    pub cgroup_id: u64,
    /// CLOCK_MONOTONIC ns of the previous expiry seen; `None` when the usage is unknown (the
    /// first expiry seen, or a CPU without the previous reading).
    pub start_ns: Option<u64>,
    /// CLOCK_MONOTONIC ns of the expiry that ends the period (a kernel period boundary).
    pub end_ns: u64,
    /// CPU time the group ran in the period, Σ over CPUs of its entities' exec time (ns).
    pub usage_ns: u64,
    /// The largest one CPU's share of `usage_ns`.
    pub max_cpu_ns: u64,
    /// CPUs the group ran on in the period.
    pub cpus_used: u32,
    /// cfs_rqs throttled at the expiry (0 = the period ended unthrottled).
    pub throttled_cpus: u32,
    #[serde(flatten)]
    pub bandwidth: Bandwidth,
    /// The group's runtime pool left at the expiry, before the refill (ns).
    pub runtime_ns: Option<u64>,
    /// Burst the period spent: what it ran beyond the quota out of runtime carried over from
    /// earlier periods, as the refill that ends it counts it into cpu.stat `burst_time` (ns;
    /// 5.16+, else `None`).
    pub burst_spent_ns: Option<u64>,
}

impl Period {
    fn from_raw(raw: &PeriodEvent) -> Self {
        Self {
            cgroup_id: raw.cgroup_id,
            end_ns: raw.end_ns,
            start_ns: (raw.start_ns != 0 && raw.start_ns <= raw.end_ns).then_some(raw.start_ns),
            usage_ns: raw.usage_ns,
            max_cpu_ns: raw.max_cpu_ns,
            cpus_used: raw.cpus_used,
            throttled_cpus: raw.throttled_cpus,
            bandwidth: Bandwidth {
                quota_ns: limit(raw.quota_ns),
                period_ns: limit(raw.period_ns),
                burst_ns: limit(raw.burst_ns),
            },
            runtime_ns: limit(raw.runtime_ns),
            burst_spent_ns: burst_spent(raw),
        }
    }
}

/// `__refill_cfs_bandwidth_runtime`'s own arithmetic: it adds the quota to the pool and counts
/// `runtime_snap - runtime` as burst when positive; none without a quota (it returns first).
fn burst_spent(raw: &PeriodEvent) -> Option<u64> {
    let (snap, runtime, quota) = (
        limit(raw.runtime_snap_ns)?,
        limit(raw.runtime_ns)?,
        limit(raw.quota_ns)?,
    );
    Some(snap.saturating_sub(runtime.saturating_add(quota)))
}

/// The work a stop deferred that one held thread ran (tracepoint backend): the CPU time from
/// its hold until it next blocked, or until a later stop held it again first (`continues`:
/// its next record goes on with the same work). Serialised as the NDJSON `deferred` line's
/// fields, where the cgroup id is the line's own.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deferred {
    /// Not serialised: the line's `cgroup_id` is it.
    #[serde(skip)]
    #[cfg_attr(test, proptest(value = "0"))]
    pub cgroup_id: u64,
    pub tid: u32,
    /// CLOCK_MONOTONIC ns when the stop began to hold it.
    pub since_ns: u64,
    /// Its CPU time from then to the block (or the next hold), ns.
    pub ran_ns: u64,
    pub continues: bool,
    /// The programs could not follow this hold (their map of held threads was full): the
    /// work it waited with is unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unfollowed: bool,
}

impl Deferred {
    fn from_raw(raw: &DeferredEvent) -> Self {
        Self {
            cgroup_id: raw.cgroup_id,
            tid: raw.tid,
            since_ns: raw.since_ns,
            ran_ns: raw.ran_ns,
            continues: raw.continues == DEFERRED_CONTINUES,
            unfollowed: raw.continues == DEFERRED_UNFOLLOWED,
        }
    }
}

/// Any ring-buffer record: a stop's ([`Event`]), a period's, or a held thread's deferred work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Stop(Event),
    Period(Period),
    Deferred(Deferred),
}

/// A plain `#[repr(C)]` record of exactly its size in `bytes`.
fn plain<T: Copy>(bytes: &[u8]) -> Result<T, RecordError> {
    let want = size_of::<T>();
    if bytes.len() != want {
        return Err(RecordError::Size {
            got: bytes.len(),
            want,
        });
    }
    // SAFETY: as in `Event::parse`: `T` is a plain `#[repr(C)]` record of integers, valid for
    // every bit pattern, and `bytes` is exactly its size.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

impl Record {
    /// Decodes one record; its first field (`kind`) says which type it is.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        let kind = bytes
            .get(..4)
            .map(|k| u32::from_ne_bytes([k[0], k[1], k[2], k[3]]));
        match kind {
            Some(EVENT_PERIOD) => Ok(Self::Period(Period::from_raw(&plain(bytes)?))),
            Some(EVENT_DEFERRED) => Ok(Self::Deferred(Deferred::from_raw(&plain(bytes)?))),
            _ => Event::parse(bytes).map(Self::Stop),
        }
    }
}

/// One cgroup's records that the kernel could not put in the ring buffer, by kind: what of its
/// figures is incomplete (docs/definitions.md, "lost").
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Starts (`stop_begin`): only the lines and the live view of open stops miss them; an
    /// end carries its whole stop.
    #[serde(default, rename = "lost_stop_begins", skip_serializing_if = "is_zero")]
    pub starts: u64,
    /// Ends (`stop`, `unseen_start_stop`): those stops are missing from every figure.
    #[serde(default, rename = "lost_stops", skip_serializing_if = "is_zero")]
    pub ends: u64,
    /// Periods: missing from the demand and the advice.
    #[serde(default, rename = "lost_periods", skip_serializing_if = "is_zero")]
    pub periods: u64,
    /// Deferred-work records: the advice cannot place the work of those stops.
    #[serde(default, rename = "lost_deferred", skip_serializing_if = "is_zero")]
    pub deferred: u64,
    /// Σ kernel time (ns) of the lost ends whose kernel time was read: what the cross-check
    /// falls short by, so that the traced kernel time plus this is cpu.stat's.
    #[serde(
        default,
        rename = "lost_stop_kernel_ns",
        skip_serializing_if = "is_zero"
    )]
    pub kernel_ns: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Lost {
    /// Counts `n` lost records of kind `kind` (`EVENT_*`), or `n` ns of lost ends' kernel time
    /// (`LOST_KERNEL_NS`); an unknown kind counts nowhere.
    pub fn add(&mut self, kind: u32, n: u64) {
        let slot = match kind {
            EVENT_START => &mut self.starts,
            EVENT_END | EVENT_UNSEEN_START_END => &mut self.ends,
            EVENT_PERIOD => &mut self.periods,
            EVENT_DEFERRED => &mut self.deferred,
            LOST_KERNEL_NS => &mut self.kernel_ns,
            _ => return,
        };
        *slot = slot.saturating_add(n);
    }

    /// The lost records.
    pub fn total(&self) -> u64 {
        self.starts
            .saturating_add(self.ends)
            .saturating_add(self.periods)
            .saturating_add(self.deferred)
    }
}

/// The kernel's "no value" for quota/period/burst is `u64::MAX` (quota: `RUNTIME_INF`).
fn limit(raw: u64) -> Option<u64> {
    (raw != u64::MAX).then_some(raw)
}

/// `task->comm` up to its first NUL, lossily decoded.
fn comm_of(comm: &[u8; 16]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..len]).into_owned()
}

fn stop_of(raw: &StopEvent) -> Stop {
    let task = (raw.pid != 0).then(|| Task {
        pid: raw.pid,
        tid: raw.tid,
        comm: comm_of(&raw.comm),
    });
    let threads: Vec<HeldThread> = raw
        .held
        .iter()
        .take((raw.threads as usize).min(MAX_THREADS))
        .map(|t| HeldThread {
            pid: t.pid,
            tid: t.tid,
            comm: comm_of(&t.comm),
            since_ns: t.since_ns,
        })
        .collect();
    let named = u32::try_from(threads.len()).unwrap_or(u32::MAX);
    Stop {
        cgroup_id: raw.cgroup_id,
        cpu: raw.cpu,
        start_ns: raw.start_ns,
        bandwidth: Bandwidth {
            quota_ns: limit(raw.quota_ns),
            period_ns: limit(raw.period_ns),
            burst_ns: limit(raw.burst_ns),
        },
        tasks: raw.tasks,
        task,
        parked: raw.parked,
        park_ns: (raw.park_ns != 0).then_some(raw.park_ns),
        kernel_start_clock: (raw.kernel_start_clock != 0).then_some(raw.kernel_start_clock),
        descendant: (raw.leaf_cgroup_id != 0 && raw.leaf_cgroup_id != raw.cgroup_id)
            .then_some(raw.leaf_cgroup_id),
        children: raw
            .child_cgroup_ids
            .iter()
            .take((raw.children as usize).min(MAX_CHILDREN))
            .copied()
            .collect(),
        children_unlisted: raw.children_unlisted,
        threads_unlisted: raw.threads_unlisted.max(raw.tasks.saturating_sub(named)),
        threads,
    }
}

/// CLOCK_MONOTONIC now, in ns: the clock of every `*_ns` timestamp the kernel sends.
pub fn monotonic_now_ns() -> u64 {
    tracer_common::clock::clock_ns(libc::CLOCK_MONOTONIC)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The bytes the kernel would put in the ring buffer for `ev`.
    pub(crate) fn bytes_of<T>(ev: &T) -> Vec<u8> {
        // SAFETY: test-only view of a plain `#[repr(C)]` value as its bytes.
        unsafe { std::slice::from_raw_parts((ev as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    pub(crate) fn raw(
        kind: u32,
        cgroup_id: u64,
        cpu: u32,
        start_ns: u64,
        end_ns: u64,
    ) -> StopEvent {
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"stress");
        StopEvent {
            kind,
            cpu,
            cgroup_id,
            cfs_rq: 0xffff_8880_0000_1000,
            start_ns,
            end_ns,
            kernel_ns: end_ns.saturating_sub(start_ns),
            quota_ns: 20_000_000,
            period_ns: 100_000_000,
            burst_ns: 0,
            tasks: 1,
            pid: 42,
            tid: 43,
            end_reason: END_REFILL,
            comm,
            ..StopEvent::default()
        }
    }

    #[test]
    fn start_decodes_fields_and_sentinels() {
        let mut ev = raw(EVENT_START, 7, 1, 1_000, 0);
        ev.quota_ns = u64::MAX;
        ev.burst_ns = u64::MAX;
        let Event::Start(stop) = Event::parse(&bytes_of(&ev)).unwrap() else {
            panic!("not a start");
        };
        assert_eq!(stop.cgroup_id, 7);
        assert_eq!(stop.cpu, 1);
        assert_eq!(stop.start_ns, 1_000);
        assert_eq!(stop.bandwidth.quota_ns, None);
        assert_eq!(stop.bandwidth.period_ns, Some(100_000_000));
        assert_eq!(stop.bandwidth.burst_ns, None);
        let task = stop.task.unwrap();
        assert_eq!((task.pid, task.tid, task.comm.as_str()), (42, 43, "stress"));
    }

    #[test]
    fn end_has_duration_reason_and_optional_kernel_ns() {
        let mut ev = raw(EVENT_END, 7, 1, 1_000, 81_000);
        ev.kernel_ns = KERNEL_NS_UNKNOWN;
        ev.end_reason = END_QUOTA_CHANGE;
        ev.pid = 0;
        let Event::End(end) = Event::parse(&bytes_of(&ev)).unwrap() else {
            panic!("not an end");
        };
        assert_eq!(end.duration_ns(), 80_000);
        assert_eq!(end.kernel_ns, None);
        assert_eq!(end.reason, EndReason::QuotaChange);
        assert_eq!(end.reason.as_str(), "quota_change");
        assert_eq!(end.stop.task, None);
        // No tracepoint-backend fields: nothing parked, no kernel start.
        assert_eq!(
            (
                end.stop.parked,
                end.stop.park_ns,
                end.stop.kernel_start_clock
            ),
            (0, None, None)
        );
    }

    #[test]
    fn end_carries_the_6_18_park_fields() {
        let mut ev = raw(EVENT_END, 7, 1, 1_000, 81_000);
        ev.parked = 3;
        ev.park_ns = 5_000;
        ev.kernel_start_clock = 123_456_789;
        ev.kernel_ns = 76_500;
        let Event::End(end) = Event::parse(&bytes_of(&ev)).unwrap() else {
            panic!("not an end");
        };
        assert_eq!(end.stop.parked, 3);
        assert_eq!(end.stop.park_ns, Some(5_000));
        assert_eq!(end.stop.kernel_start_clock, Some(123_456_789));
        assert_eq!(end.duration_ns(), 80_000);
        assert_eq!(end.kernel_ns, Some(76_500));
    }

    /// Only the `children` first ids are children; the leaf is the fallback without a list.
    #[test]
    fn children_decode_and_credit() {
        let mut ev = raw(EVENT_END, 7, 1, 1_000, 81_000);
        ev.leaf_cgroup_id = 11;
        ev.child_cgroup_ids = [11, 12, 99, 0, 0, 0, 0, 0];
        ev.children = 2;
        ev.children_unlisted = 3;
        let Event::End(end) = Event::parse(&bytes_of(&ev)).unwrap() else {
            panic!("not an end");
        };
        assert_eq!(end.stop.children, [11, 12]);
        assert_eq!(end.stop.children_unlisted, 3);
        assert_eq!(end.stop.credited(), [11, 12]);
        ev.children = 0;
        let Event::End(end) = Event::parse(&bytes_of(&ev)).unwrap() else {
            panic!("not an end");
        };
        assert_eq!(end.stop.credited(), [11]);
        // A seen task's group missing from the list is credited too.
        ev.children = 1;
        ev.leaf_cgroup_id = 12;
        ev.child_cgroup_ids = [11, 0, 0, 0, 0, 0, 0, 0];
        let Event::End(end) = Event::parse(&bytes_of(&ev)).unwrap() else {
            panic!("not an end");
        };
        assert_eq!(end.stop.credited(), [11, 12]);
        // A count the record cannot hold is cut to the array.
        ev.children = 100;
        let Event::End(end) = Event::parse(&bytes_of(&ev)).unwrap() else {
            panic!("not an end");
        };
        assert_eq!(end.stop.children.len(), MAX_CHILDREN);
    }

    #[test]
    fn end_reason_names_round_trip() {
        for reason in [
            EndReason::Refill,
            EndReason::QuotaChange,
            EndReason::CpuOffline,
            EndReason::CgroupGone,
            EndReason::Unknown,
        ] {
            let json = format!("\"{}\"", reason.as_str());
            assert_eq!(serde_json::to_string(&reason).unwrap(), json);
            assert_eq!(serde_json::from_str::<EndReason>(&json).unwrap(), reason);
        }
        assert_eq!(
            serde_json::from_str::<EndReason>("\"eviction\"").unwrap(),
            EndReason::Unknown
        );
    }

    #[test]
    fn comm_without_nul_uses_all_16_bytes() {
        let mut ev = raw(EVENT_START, 7, 0, 1, 0);
        ev.comm = *b"0123456789abcdef";
        let Event::Start(stop) = Event::parse(&bytes_of(&ev)).unwrap() else {
            panic!("not a start");
        };
        assert_eq!(stop.task.unwrap().comm, "0123456789abcdef");
    }

    #[test]
    fn unseen_start_end_keeps_only_its_fields() {
        let mut ev = raw(EVENT_UNSEEN_START_END, 9, 3, 0, 5_000);
        ev.kernel_ns = 4_000;
        assert_eq!(
            Event::parse(&bytes_of(&ev)).unwrap(),
            Event::UnseenStartEnd {
                cgroup_id: 9,
                cpu: 3,
                end_ns: 5_000,
                kernel_ns: Some(4_000)
            }
        );
    }

    #[test]
    fn malformed_records_are_typed_errors() {
        let ok = bytes_of(&raw(EVENT_START, 1, 0, 1, 0));
        let want = ok.len();
        assert_eq!(
            Event::parse(&ok[..want - 1]),
            Err(RecordError::Size {
                got: want - 1,
                want
            })
        );
        assert_eq!(Event::parse(&[]), Err(RecordError::Size { got: 0, want }));
        let mut long = ok.clone();
        long.push(0);
        assert!(matches!(Event::parse(&long), Err(RecordError::Size { .. })));
        assert_eq!(
            Event::parse(&bytes_of(&raw(0, 1, 0, 1, 0))),
            Err(RecordError::UnknownKind(0))
        );
        assert_eq!(
            Event::parse(&bytes_of(&raw(EVENT_END, 1, 2, 10, 9))),
            Err(RecordError::EndBeforeStart {
                cpu: 2,
                start_ns: 10,
                end_ns: 9
            })
        );
        let mut odd = raw(EVENT_END, 1, 0, 1, 2);
        odd.end_reason = 99;
        let Ok(Event::End(end)) = Event::parse(&bytes_of(&odd)) else {
            panic!("unknown reason must still decode");
        };
        assert_eq!(end.reason, EndReason::Unknown);
    }

    #[test]
    fn deferred_records_decode_and_count_when_lost() {
        let raw = DeferredEvent {
            kind: EVENT_DEFERRED,
            tid: 42,
            cgroup_id: 7,
            since_ns: 1_000,
            ran_ns: 31_000_000,
            continues: 1,
            _reserved: 0,
        };
        let bytes = bytes_of(&raw);
        assert_eq!(
            Record::parse(&bytes),
            Ok(Record::Deferred(Deferred {
                cgroup_id: 7,
                tid: 42,
                since_ns: 1_000,
                ran_ns: 31_000_000,
                continues: true,
                unfollowed: false,
            }))
        );
        assert_eq!(
            Record::parse(&bytes[..bytes.len() - 1]),
            Err(RecordError::Size {
                got: bytes.len() - 1,
                want: bytes.len()
            })
        );
        let mut lost = Lost::default();
        lost.add(EVENT_DEFERRED, 3);
        assert_eq!((lost.deferred, lost.total()), (3, 3));
    }

    #[test]
    fn period_records_decode_and_stop_records_still_do() {
        let period = PeriodEvent {
            kind: EVENT_PERIOD,
            cpus_used: 2,
            cgroup_id: 7,
            start_ns: 100,
            end_ns: 200,
            usage_ns: 90,
            max_cpu_ns: 50,
            quota_ns: 50,
            period_ns: 100,
            burst_ns: u64::MAX,
            runtime_ns: 3,
            throttled_cpus: 1,
            cpus_read: 2,
            runtime_snap_ns: 80,
        };
        let bytes = bytes_of(&period);
        let Ok(Record::Period(p)) = Record::parse(&bytes) else {
            panic!("not a period");
        };
        assert_eq!(
            (p.cgroup_id, p.start_ns, p.end_ns, p.usage_ns),
            (7, Some(100), 200, 90)
        );
        assert_eq!((p.cpus_used, p.throttled_cpus, p.max_cpu_ns), (2, 1, 50));
        assert_eq!(p.bandwidth.burst_ns, None);
        // The previous refill left 80; 3 left + a quota of 50 refills to 53: 27 of burst.
        assert_eq!(p.burst_spent_ns, Some(27));
        let within_quota = Period::from_raw(&PeriodEvent {
            runtime_snap_ns: 50,
            ..period
        });
        assert_eq!(within_quota.burst_spent_ns, Some(0));
        let before_5_16 = Period::from_raw(&PeriodEvent {
            runtime_snap_ns: u64::MAX,
            ..period
        });
        assert_eq!(before_5_16.burst_spent_ns, None);
        // A first expiry: no usage.
        let first = Period::from_raw(&PeriodEvent {
            start_ns: 0,
            ..period
        });
        assert_eq!(first.start_ns, None);
        assert!(matches!(
            Record::parse(&bytes[..bytes.len() - 1]),
            Err(RecordError::Size { .. })
        ));
        let stop = bytes_of(&raw(EVENT_START, 1, 0, 1, 0));
        assert!(matches!(
            Record::parse(&stop),
            Ok(Record::Stop(Event::Start(_)))
        ));
    }

    #[test]
    fn monotonic_clock_advances() {
        let a = monotonic_now_ns();
        let b = monotonic_now_ns();
        assert!(a > 0 && b >= a);
    }

    proptest::proptest! {
        /// Arbitrary bytes from the ring buffer: a typed error or a record, never a panic.
        #[test]
        fn any_bytes_decode_or_err(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..1024)) {
            let _ = Record::parse(&bytes);
        }

        /// A record of the right size with any content, kind forced to each known value.
        #[test]
        fn any_stop_sized_record_decodes_or_errs(
            mut bytes in proptest::collection::vec(proptest::num::u8::ANY, size_of::<StopEvent>()),
            kind in proptest::sample::select(vec![EVENT_START, EVENT_END, EVENT_UNSEEN_START_END, EVENT_PERIOD]),
        ) {
            bytes[..4].copy_from_slice(&kind.to_ne_bytes());
            let _ = Record::parse(&bytes);
        }
    }
}
