//! Per-cgroup state: stop histograms, sums, wall-clock unions, group stops, open stops.
//!
//! Fed one [`Event`] at a time by the run loop ([`Aggregate::ingest`], which also says which
//! group stop each record closed for good, for live readers), read once at the end
//! ([`Aggregate::finish`]). Definitions, all in CLOCK_MONOTONIC ns unless said otherwise:
//!
//! - **stop** (per-CPU stop): one cfs_rq throttled, from its START to its END record;
//!   duration = `end_ns - start_ns`.
//! - **cpu_stop_ns**: Σ stop durations. N CPUs stopped at once count N×, like cpu.stat does.
//! - **group stop**: one episode during which at least one CPU of the cgroup is stopped, i.e. the
//!   union of overlapping per-CPU stops; its bounds are the earliest start and the latest end of
//!   its members. **wall_stop_ns** = Σ group-stop lengths: the wall-clock time the group had
//!   at least one CPU stopped.
//! - **kernel_stop_ns**: Σ of what the kernel itself added to cpu.stat `throttled_time` for the
//!   stops above (its `rq->clock`, not CLOCK_MONOTONIC).
//! - **unseen-start stops**: stops that began before tracing and ended during it; only their
//!   kernel time is known. They are outside every figure above.
//! - **open stops**: STARTs without an END when the trace finished; reported with their elapsed
//!   time, never mixed into the histograms or sums.
//!
//! Open stops are tracked here from START/END rather than taken from the kernel's map of open
//! stops: they are then consistent with every other figure (a stop counts in exactly one of
//! "ended" or "open"), and they need no extra map read at exit. They are exact unless records were
//! lost (the `lost` count in the report says so): a lost END leaves a stale open stop until that
//! CPU's next START replaces it (counted as `restarted`).
//!
//! For live views, [`Aggregate::with_intervals`] also records every ended stop and every final
//! group stop into a per-interval window that [`Aggregate::take_interval`] hands out and empties:
//! the same stop logic feeds both, and an interval holds what *ended* in it (a stop spanning a
//! tick counts whole in the interval it ends in; a group stop in the one where it became final).
//!
//! Ancestor attribution: a per-CPU stop of the quota owner Q also stops every direct child D
//! of Q with tasks queued on that CPU (`Stop::children`, the kernel's own rule for
//! cpu.stat.local), so the ended stop counts for each pair (Q, D): Q's summary lists it under
//! `descendants`, D's under `stopped_by_ancestor` (D gets a summary even if its own quota never
//! stopped it). It also counts for the descendant whose task was seen stopped
//! (`Stop::descendant`), when that one is not listed (a grandchild, a kernel whose fields did
//! not resolve). Stops whose list was cut at `MAX_CHILDREN` are counted on Q
//! (`children_unlisted_stops`).
//!
//! Records from different CPUs reach the ring buffer slightly out of timestamp order. A closed
//! group stop is therefore held back until a later episode begins after its end, so a late START
//! (or END) that overlaps it still joins it; [`Aggregate::finish`] releases the last one.

use std::collections::HashMap;

use hdrhistogram::Histogram;

use crate::records::{EndReason, EndedStop, Event, Stop};

/// Two significant digits: any recorded value is within 1% (1/128) of the truth.
const SIGFIG: u8 = 2;
const NS_PER_US: u64 = 1_000;
const NS_PER_MS: u64 = 1_000_000;

/// A distribution of durations: count, sum, exact max, percentiles and bcc-style log2 buckets.
///
/// Memory: the HdrHistogram records µs in `u32` counters (4 billion equal stops per bucket before
/// a counter saturates, which no trace reaches; `u64` would double the memory for nothing). It
/// starts empty and auto-resizes to the largest value seen, so it costs 4 bytes × 128 counters per
/// power of two between 256 µs and the longest stop: ~5.5 KiB when the longest stop is ~100 ms,
/// ~13 KiB if one stop lasts an hour. The log2 buckets are exact (not derived from the HdrHistogram,
/// whose buckets straddle the ms powers of two) and cost 4 bytes per power of two of ms.
///
/// Measured (test `memory_per_stopped_cgroup`): one stopped cgroup whose stops last up to ~100 ms
/// costs 456 B of state + 11.1 KiB of histograms ≈ 11.6 KiB, so 1 000 stopped cgroups ≈ 12 MiB.
/// Cgroups that never stop cost nothing.
#[derive(Debug, Default)]
struct Durations {
    count: u64,
    sum_ns: u64,
    max_ns: u64,
    /// µs; allocated at the first value.
    hdr: Option<Histogram<u32>>,
    /// `log2_ms[i]` counts durations in [2^i, 2^(i+1)) ms; slot 0 also holds [0, 1) ms.
    log2_ms: Vec<u32>,
}

impl Durations {
    fn record(&mut self, ns: u64) {
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
        if self.hdr.is_none() {
            // `new` only fails for sigfig > 5.
            self.hdr = Histogram::new(SIGFIG).ok();
        }
        if let Some(hdr) = &mut self.hdr {
            let us = ns / NS_PER_US;
            // `record` fails only past i64::MAX / 2 µs or when a counter is full; clamping then
            // keeps the count right without growing the histogram.
            if hdr.record(us).is_err() {
                hdr.saturating_record(us);
            }
        }
        let slot = log2_slot(ns / NS_PER_MS);
        if self.log2_ms.len() <= slot {
            self.log2_ms.resize(slot + 1, 0);
        }
        self.log2_ms[slot] = self.log2_ms[slot].saturating_add(1);
    }

    fn summary(&self) -> DurationSummary {
        let percentiles = self.hdr.as_ref().filter(|h| !h.is_empty()).map(|hdr| {
            // The upper edge of the (≤1% wide) bucket holding the quantile, in ns: never below
            // the true value, never above the exact max.
            let at = |q: f64| {
                hdr.value_at_quantile(q)
                    .saturating_mul(NS_PER_US)
                    .saturating_add(NS_PER_US - 1)
                    .min(self.max_ns)
            };
            Percentiles {
                p50_ns: at(0.50),
                p90_ns: at(0.90),
                p99_ns: at(0.99),
                max_ns: self.max_ns,
            }
        });
        DurationSummary {
            count: self.count,
            sum_ns: self.sum_ns,
            percentiles,
            log2_ms: self.log2_ms.clone(),
        }
    }

    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        self.hdr
            .as_ref()
            .map_or(0, |h| h.distinct_values() * std::mem::size_of::<u32>())
            + self.log2_ms.capacity() * std::mem::size_of::<u32>()
    }
}

/// The bcc/libbpf-tools log2 slot: 0 for 0 and 1, else floor(log2(v)).
fn log2_slot(v: u64) -> usize {
    if v <= 1 {
        0
    } else {
        (u64::BITS - 1 - v.leading_zeros()) as usize
    }
}

/// Percentiles of a distribution, ns. p50/p90/p99 come from the HdrHistogram (≤1% high, never
/// above max); max is exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Percentiles {
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

/// A finished distribution of durations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurationSummary {
    pub count: u64,
    /// Σ durations, ns.
    pub sum_ns: u64,
    /// `None` when `count` is 0.
    pub percentiles: Option<Percentiles>,
    /// `log2_ms[i]` counts durations in [2^i, 2^(i+1)) ms; slot 0 also holds [0, 1) ms. No
    /// trailing empty slots.
    pub log2_ms: Vec<u32>,
}

/// A per-CPU stop still open when the trace finished.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpenStop {
    pub cpu: u32,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// `now_ns - start_ns` at [`Aggregate::finish`].
    pub elapsed_ns: u64,
}

/// Everything measured for one cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupSummary {
    pub cgroup_id: u64,
    /// Ended per-CPU stops; `sum_ns` is cpu_stop_ns.
    pub stops: DurationSummary,
    /// Closed group stops (episodes); `sum_ns` is wall_stop_ns.
    pub group_stops: DurationSummary,
    /// Σ kernel-accounted time of the ended stops whose `kernel_ns` was known.
    pub kernel_stop_ns: u64,
    /// Ended stops whose `kernel_ns` the probe could not read (missing from `kernel_stop_ns`).
    pub kernel_unknown_stops: u64,
    /// How the ended stops ended, in `EndReason` order, zero counts omitted.
    pub end_reasons: Vec<(EndReason, u64)>,
    pub open_stops: Vec<OpenStop>,
    pub unseen_start_stops: u64,
    /// Σ kernel_ns of the unseen-start stops whose `kernel_ns` was known.
    pub unseen_start_kernel_ns: u64,
    /// Unseen-start stops without a readable `kernel_ns`.
    pub unseen_start_kernel_unknown: u64,
    /// ENDs without a START we saw (the START record was lost). Their stop still counts: the END
    /// carries its start.
    pub unmatched_ends: u64,
    /// STARTs for a CPU that was already open: the earlier stop's END was lost and it is dropped.
    pub restarted: u64,
    /// For a quota owner: its ended stops attributed to each descendant whose task was stopped,
    /// most stopped first.
    pub descendants: Vec<Attributed>,
    /// For a descendant: the ended stops of each ancestor's quota that stopped its tasks, most
    /// stopped first. Not in any figure above (those are the group's own quota's stops).
    pub stopped_by_ancestor: Vec<Attributed>,
    /// For a quota owner: ended stops that stopped more children than a record lists, so some
    /// children in `descendants` miss them.
    pub children_unlisted_stops: u64,
}

/// Ended stops of a quota owner that stopped a descendant's task, seen from either side.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attributed {
    /// The other side: the descendant (in `descendants`) or the quota owner (in
    /// `stopped_by_ancestor`).
    pub cgroup_id: u64,
    /// Its path under the cpu hierarchy, filled in by the report; `None` if it did not resolve.
    #[serde(rename = "cgroup")]
    pub path: Option<String>,
    pub stops: u64,
    /// Σ per-CPU stop durations, CLOCK_MONOTONIC ns.
    pub stopped_ns: u64,
    /// Σ kernel time (`kernel_ns`) of those of the stops whose kernel time is known: on 6.6+
    /// what the stop added to the descendant's cpu.stat.local throttled time on that CPU.
    pub kernel_ns: u64,
}

impl Attributed {
    fn add(&mut self, end: &EndedStop) {
        self.stops += 1;
        self.stopped_ns = self.stopped_ns.saturating_add(end.duration_ns());
        self.kernel_ns = self.kernel_ns.saturating_add(end.kernel_ns.unwrap_or(0));
    }
}

impl CgroupSummary {
    /// What the kernel added to cpu.stat throttled time inside the window, as far as the trace
    /// saw it: the ended stops plus the unseen-start stops.
    pub fn kernel_accounted_ns(&self) -> u64 {
        self.kernel_stop_ns
            .saturating_add(self.unseen_start_kernel_ns)
    }
}

const REASONS: [EndReason; 5] = [
    EndReason::Refill,
    EndReason::QuotaChange,
    EndReason::CpuOffline,
    EndReason::CgroupGone,
    EndReason::Unknown,
];

#[derive(Clone, Copy, Debug)]
struct Interval {
    start_ns: u64,
    end_ns: u64,
}

impl Interval {
    fn widen(&mut self, start_ns: u64, end_ns: u64) {
        self.start_ns = self.start_ns.min(start_ns);
        self.end_ns = self.end_ns.max(end_ns);
    }
}

#[derive(Clone, Copy, Debug)]
struct OpenCpu {
    cpu: u32,
    start_ns: u64,
}

/// One cgroup's running state. Kept small: only cgroups that stopped get one.
#[derive(Debug, Default)]
struct CgroupState {
    stops: Durations,
    group_stops: Durations,
    kernel_stop_ns: u64,
    kernel_unknown_stops: u64,
    end_reasons: [u64; REASONS.len()],
    /// CPUs with a START and no END yet; usually empty or a handful.
    open: Vec<OpenCpu>,
    /// The group stop in progress (`open` is non-empty); `end_ns` is the latest end so far.
    current: Option<Interval>,
    /// The last closed group stop, not yet recorded: a late record may still widen it.
    closing: Option<Interval>,
    unseen_start_stops: u64,
    unseen_start_kernel_ns: u64,
    unseen_start_kernel_unknown: u64,
    unmatched_ends: u64,
    restarted: u64,
    /// (cpu, start_ns) of the last unmatched ENDs: their START may still come, overtaken in the
    /// ring buffer by an END reserved on another CPU while the starting CPU was still filling
    /// in its stop (the tracepoint backend opens a stop before it emits its START).
    early_ends: Vec<(u32, u64)>,
    children_unlisted_stops: u64,
}

/// Unmatched ENDs remembered for their late START; a late START is microseconds late.
const EARLY_ENDS: usize = 8;

impl CgroupState {
    /// Returns the length of the group stop this START closed for good, if any.
    fn start(&mut self, stop: &Stop) -> Option<u64> {
        let s = stop.start_ns;
        if let Some(i) = self.early_ends.iter().position(|&e| e == (stop.cpu, s)) {
            // The stop already ended and was counted whole: its END carried the start.
            self.early_ends.swap_remove(i);
            self.unmatched_ends -= 1;
            return None;
        }
        if let Some(open) = self.open.iter_mut().find(|o| o.cpu == stop.cpu) {
            self.restarted += 1;
            open.start_ns = s;
        } else {
            self.open.push(OpenCpu {
                cpu: stop.cpu,
                start_ns: s,
            });
        }
        if let Some(current) = &mut self.current {
            current.widen(s, s);
            return None;
        }
        let mut closed = None;
        self.current = Some(match self.closing.take() {
            // A START from before the last episode's end: it belongs to that episode.
            Some(mut closing) if s <= closing.end_ns => {
                closing.widen(s, s);
                closing
            }
            other => {
                closed = self.release(other);
                Interval {
                    start_ns: s,
                    end_ns: s,
                }
            }
        });
        closed
    }

    /// Returns the length of the group stop this END closed for good, if any.
    fn end(&mut self, end: &EndedStop) -> Option<u64> {
        let (s, e) = (end.stop.start_ns, end.end_ns);
        self.stops.record(end.duration_ns());
        match end.kernel_ns {
            Some(k) => self.kernel_stop_ns = self.kernel_stop_ns.saturating_add(k),
            None => self.kernel_unknown_stops += 1,
        }
        if let Some(i) = REASONS.iter().position(|r| *r == end.reason) {
            self.end_reasons[i] += 1;
        }
        if end.stop.children_unlisted != 0 {
            self.children_unlisted_stops += 1;
        }

        if let Some(i) = self.open.iter().position(|o| o.cpu == end.stop.cpu) {
            self.open.swap_remove(i);
        } else {
            self.unmatched_ends += 1;
            if self.early_ends.len() == EARLY_ENDS {
                self.early_ends.remove(0);
            }
            self.early_ends.push((end.stop.cpu, s));
        }
        let closed = match (&mut self.current, &mut self.closing) {
            (Some(current), _) => {
                current.widen(s, e);
                None
            }
            (None, Some(closing)) if s <= closing.end_ns => {
                closing.widen(s, e);
                None
            }
            // An unmatched END that starts a new episode of its own.
            (None, _) => {
                let previous = self.closing.take();
                self.closing = Some(Interval {
                    start_ns: s,
                    end_ns: e,
                });
                self.release(previous)
            }
        };
        // Only after the first arm above, which closed nothing.
        if self.open.is_empty() && self.current.is_some() {
            let previous = self.closing.take();
            self.closing = self.current.take();
            return self.release(previous);
        }
        closed
    }

    fn unseen_start_end(&mut self, kernel_ns: Option<u64>) {
        self.unseen_start_stops += 1;
        match kernel_ns {
            Some(k) => self.unseen_start_kernel_ns = self.unseen_start_kernel_ns.saturating_add(k),
            None => self.unseen_start_kernel_unknown += 1,
        }
    }

    /// Records a group stop that no later record can widen any more; returns its length.
    fn release(&mut self, episode: Option<Interval>) -> Option<u64> {
        let ep = episode?;
        let ns = ep.end_ns - ep.start_ns;
        self.group_stops.record(ns);
        Some(ns)
    }

    fn finish(mut self, cgroup_id: u64, now_ns: u64) -> CgroupSummary {
        let last = self.closing.take();
        self.release(last);
        let mut open_stops: Vec<OpenStop> = self
            .open
            .iter()
            .map(|o| OpenStop {
                cpu: o.cpu,
                start_ns: o.start_ns,
                elapsed_ns: now_ns.saturating_sub(o.start_ns),
            })
            .collect();
        open_stops.sort_by_key(|o| o.cpu);
        CgroupSummary {
            cgroup_id,
            stops: self.stops.summary(),
            group_stops: self.group_stops.summary(),
            kernel_stop_ns: self.kernel_stop_ns,
            kernel_unknown_stops: self.kernel_unknown_stops,
            end_reasons: REASONS
                .iter()
                .zip(self.end_reasons)
                .filter(|(_, n)| *n > 0)
                .map(|(r, n)| (*r, n))
                .collect(),
            open_stops,
            unseen_start_stops: self.unseen_start_stops,
            unseen_start_kernel_ns: self.unseen_start_kernel_ns,
            unseen_start_kernel_unknown: self.unseen_start_kernel_unknown,
            unmatched_ends: self.unmatched_ends,
            restarted: self.restarted,
            descendants: Vec::new(),
            stopped_by_ancestor: Vec::new(),
            children_unlisted_stops: self.children_unlisted_stops,
        }
    }
}

/// What one cgroup's stops did in one interval (see [`Aggregate::take_interval`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntervalSummary {
    pub cgroup_id: u64,
    /// Per-CPU stops that ended in the interval; `sum_ns` is their per-CPU stopped time.
    pub stops: DurationSummary,
    /// Group stops that became final in the interval; `sum_ns` is their wall-clock time.
    pub group_stops: DurationSummary,
    /// Ancestors' per-CPU stops that ended in the interval and stopped this cgroup's tasks
    /// (not in `stops`, which are its own quota's).
    pub ancestor_stops: DurationSummary,
    /// The same stops by quota owner, most stopped first (`path` left `None`).
    pub by_ancestor: Vec<Attributed>,
}

/// One cgroup's stops in the current interval.
#[derive(Debug, Default)]
struct InWindow {
    stops: Durations,
    group_stops: Durations,
    ancestor_stops: Durations,
    by_ancestor: HashMap<u64, Attributed>,
}

/// The current interval's per-CPU stops, group stops and ancestors' stops, per cgroup; only
/// those at least `min_ns` long.
#[derive(Debug, Default)]
struct Window {
    min_ns: u64,
    cgroups: HashMap<u64, InWindow>,
}

impl Window {
    fn record(&mut self, event: &Event, closed: Option<u64>) {
        let (cgroup_id, ended) = match event {
            Event::Start(stop) => (stop.cgroup_id, None),
            Event::End(end) => (end.stop.cgroup_id, Some(end.duration_ns())),
            Event::UnseenStartEnd { .. } => return,
        };
        let ended = ended.filter(|&ns| ns >= self.min_ns);
        let closed = closed.filter(|&ns| ns >= self.min_ns);
        if ended.is_none() && closed.is_none() {
            return;
        }
        let c = self.cgroups.entry(cgroup_id).or_default();
        if let Some(ns) = ended {
            c.stops.record(ns);
        }
        if let Some(ns) = closed {
            c.group_stops.record(ns);
        }
    }

    /// The ended stop `end` of an ancestor's quota, for `descendant`.
    fn credit(&mut self, end: &EndedStop, descendant: u64) {
        let ns = end.duration_ns();
        if ns < self.min_ns {
            return;
        }
        let c = self.cgroups.entry(descendant).or_default();
        c.ancestor_stops.record(ns);
        c.by_ancestor
            .entry(end.stop.cgroup_id)
            .or_insert_with(|| Attributed {
                cgroup_id: end.stop.cgroup_id,
                ..Attributed::default()
            })
            .add(end);
    }
}

/// All cgroups' state for one trace.
#[derive(Debug, Default)]
pub struct Aggregate {
    cgroups: HashMap<u64, CgroupState>,
    /// The current interval, kept only for live views ([`Aggregate::with_intervals`]).
    window: Option<Window>,
    /// (quota owner, descendant) → the owner's ended stops that stopped the descendant's task.
    attributed: HashMap<(u64, u64), Attributed>,
}

impl Aggregate {
    /// An aggregate that reports `cgroups` even if they never stop: a cgroup the user named
    /// gets a summary saying "0 stops" rather than silence.
    pub fn watching(cgroups: &[u64]) -> Self {
        Self {
            cgroups: cgroups
                .iter()
                .map(|&id| (id, CgroupState::default()))
                .collect(),
            attributed: HashMap::new(),
            window: None,
        }
    }

    /// Reports `cgroup_id` even if it never stops, as [`watching`](Self::watching) does, keeping
    /// whatever it has already taken: a replayed recording learns the watched cgroups at its end.
    pub fn watch(&mut self, cgroup_id: u64) {
        self.state(cgroup_id);
    }

    /// Also keeps the stops of the current interval for [`Aggregate::take_interval`], leaving
    /// out stops and group stops shorter than `min_stop_ns` (the whole-run figures keep them).
    pub fn with_intervals(mut self, min_stop_ns: u64) -> Self {
        self.window = Some(Window {
            min_ns: min_stop_ns,
            cgroups: HashMap::new(),
        });
        self
    }

    /// The stops of each cgroup since the last call (or the start); a new interval begins.
    /// Only cgroups with a stop or a group stop in the interval; always empty without
    /// [`Aggregate::with_intervals`].
    pub fn take_interval(&mut self) -> Vec<IntervalSummary> {
        let Some(window) = &mut self.window else {
            return Vec::new();
        };
        std::mem::take(&mut window.cgroups)
            .into_iter()
            .map(|(cgroup_id, c)| {
                let mut by_ancestor: Vec<Attributed> = c.by_ancestor.into_values().collect();
                sort_attributed(&mut by_ancestor);
                IntervalSummary {
                    cgroup_id,
                    stops: c.stops.summary(),
                    group_stops: c.group_stops.summary(),
                    ancestor_stops: c.ancestor_stops.summary(),
                    by_ancestor,
                }
            })
            .collect()
    }

    /// Takes one record. Returns the length (ns) of the group stop of the record's cgroup that it
    /// closed for good, if any: a group stop is final once a later episode begins after its end
    /// (see the module doc), so a live reader sees each one once, one episode late. The last
    /// one is only recorded by [`Aggregate::finish`].
    pub fn ingest(&mut self, event: &Event) -> Option<u64> {
        let closed = match event {
            Event::Start(stop) => self.state(stop.cgroup_id).start(stop),
            Event::End(end) => {
                self.credit(end, |_| true);
                self.state(end.stop.cgroup_id).end(end)
            }
            Event::UnseenStartEnd {
                cgroup_id,
                kernel_ns,
                ..
            } => {
                self.state(*cgroup_id).unseen_start_end(*kernel_ns);
                None
            }
        };
        if let Some(window) = &mut self.window {
            window.record(event, closed);
        }
        closed
    }

    /// Counts the ended stop `end` for each descendant it stopped that `keep` admits.
    fn credit(&mut self, end: &EndedStop, keep: impl Fn(u64) -> bool) {
        for d in end.stop.credited().into_iter().filter(|&d| keep(d)) {
            self.attributed
                .entry((end.stop.cgroup_id, d))
                .or_default()
                .add(end);
            if let Some(window) = &mut self.window {
                window.credit(end, d);
            }
        }
    }

    /// Takes the ended stop of an ancestor that is not reported itself (only a descendant was
    /// asked for): it counts for the descendants `keep` admits, and for nothing else.
    pub fn credit_only(&mut self, end: &EndedStop, keep: impl Fn(u64) -> bool) {
        self.credit(end, keep);
    }

    /// Drops what is known about a cgroup (a long `serve` run forgets cgroups that are gone).
    pub fn forget(&mut self, cgroup_id: u64) {
        self.cgroups.remove(&cgroup_id);
        self.attributed
            .retain(|&(owner, d), _| owner != cgroup_id && d != cgroup_id);
    }

    fn state(&mut self, cgroup_id: u64) -> &mut CgroupState {
        self.cgroups.entry(cgroup_id).or_default()
    }

    /// Ends the trace at `now_ns` (CLOCK_MONOTONIC, e.g. `records::monotonic_now_ns()`): records
    /// the held-back last group stops and measures the open stops. One summary per cgroup that
    /// sent any record, the most stopped (largest cpu_stop_ns) first.
    pub fn finish(mut self, now_ns: u64) -> Vec<CgroupSummary> {
        for &(_, d) in self.attributed.keys() {
            self.cgroups.entry(d).or_default();
        }
        let mut out: Vec<CgroupSummary> = self
            .cgroups
            .into_iter()
            .map(|(id, state)| state.finish(id, now_ns))
            .collect();
        let by_id: HashMap<u64, usize> = out
            .iter()
            .enumerate()
            .map(|(i, s)| (s.cgroup_id, i))
            .collect();
        for ((owner, d), a) in self.attributed {
            // An owner taken only for its descendants' sake (`credit_only`) has no summary.
            if let Some(&i) = by_id.get(&owner) {
                out[i].descendants.push(Attributed {
                    cgroup_id: d,
                    ..a.clone()
                });
            }
            out[by_id[&d]].stopped_by_ancestor.push(Attributed {
                cgroup_id: owner,
                ..a
            });
        }
        for s in &mut out {
            sort_attributed(&mut s.descendants);
            sort_attributed(&mut s.stopped_by_ancestor);
        }
        out.sort_by(|a, b| {
            b.stops
                .sum_ns
                .cmp(&a.stops.sum_ns)
                .then(b.open_stops.len().cmp(&a.open_stops.len()))
                .then(a.cgroup_id.cmp(&b.cgroup_id))
        });
        out
    }
}

/// Most stopped first, then by cgroup id.
fn sort_attributed(list: &mut [Attributed]) {
    list.sort_by(|a, b| {
        b.stopped_ns
            .cmp(&a.stopped_ns)
            .then(a.cgroup_id.cmp(&b.cgroup_id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{Bandwidth, EndedStop, Stop};

    const MS: u64 = NS_PER_MS;

    #[test]
    fn a_watched_cgroup_that_never_stopped_still_has_a_summary() {
        let summaries = Aggregate::watching(&[42]).finish(10 * MS);
        assert_eq!(summaries.len(), 1);
        assert_eq!(summaries[0].cgroup_id, 42);
        assert_eq!(summaries[0].stops.count, 0);
        assert_eq!(summaries[0].stops.percentiles, None);
        assert_eq!(summaries[0].group_stops.sum_ns, 0);
    }

    fn stop(cgroup_id: u64, cpu: u32, start_ns: u64) -> Stop {
        Stop {
            cgroup_id,
            cpu,
            start_ns,
            bandwidth: Bandwidth {
                quota_ns: Some(20 * MS),
                period_ns: Some(100 * MS),
                burst_ns: Some(0),
            },
            tasks: 1,
            task: None,
            parked: 0,
            park_ns: None,
            descendant: None,
            children: Vec::new(),
            children_unlisted: 0,
            kernel_start_clock: None,
        }
    }

    fn start(cg: u64, cpu: u32, s: u64) -> Event {
        Event::Start(stop(cg, cpu, s))
    }

    fn end(cg: u64, cpu: u32, s: u64, e: u64) -> Event {
        Event::End(EndedStop {
            stop: stop(cg, cpu, s),
            end_ns: e,
            kernel_ns: Some(e - s),
            reason: EndReason::Refill,
        })
    }

    /// An END of `owner`'s stop on `cpu` that stopped a task of `descendant`.
    fn end_of(owner: u64, descendant: Option<u64>, cpu: u32, s: u64, e: u64) -> Event {
        let Event::End(mut end) = end(owner, cpu, s, e) else {
            unreachable!()
        };
        end.stop.descendant = descendant;
        Event::End(end)
    }

    #[test]
    fn ancestor_stops_are_attributed_to_the_descendants_whose_tasks_stopped() {
        // Quota on 10; its children 11 (cpu 0) and 12 (cpu 1) run the work.
        let s = run(
            &[
                start(10, 0, 0),
                start(10, 1, 0),
                end_of(10, Some(11), 0, 0, 50 * MS),
                end_of(10, Some(12), 1, 0, 40 * MS),
                end_of(10, Some(11), 0, 100 * MS, 150 * MS),
                // No task of the group seen: the owner's only.
                end_of(10, None, 1, 100 * MS, 130 * MS),
            ],
            200 * MS,
        );
        let by = |id| s.iter().find(|x| x.cgroup_id == id).unwrap();
        let (owner, c1, c2) = (by(10), by(11), by(12));
        assert_eq!(owner.stops.count, 4);
        assert!(owner.stopped_by_ancestor.is_empty());
        let d: Vec<(u64, u64, u64)> = owner
            .descendants
            .iter()
            .map(|a| (a.cgroup_id, a.stops, a.kernel_ns))
            .collect();
        assert_eq!(d, [(11, 2, 100 * MS), (12, 1, 40 * MS)]);
        // The children's own quota never stopped them: no own stops, only the ancestor's.
        assert_eq!((c1.stops.count, c2.stops.count), (0, 0));
        assert!(c1.descendants.is_empty());
        let a = &c1.stopped_by_ancestor;
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].cgroup_id, a[0].stops), (10, 2));
        assert_eq!((a[0].stopped_ns, a[0].kernel_ns), (100 * MS, 100 * MS));
        assert_eq!(c2.stopped_by_ancestor[0].stopped_ns, 40 * MS);
    }

    /// An END of `owner`'s stop on `cpu` that stopped `children` (listed) and the task of
    /// `leaf`, with `unlisted` children past the list.
    fn end_with_children(
        owner: u64,
        (leaf, children, unlisted): (Option<u64>, &[u64], u32),
        cpu: u32,
        (s, e): (u64, u64),
    ) -> Event {
        let Event::End(mut end) = end_of(owner, leaf, cpu, s, e) else {
            unreachable!()
        };
        end.stop.children = children.to_vec();
        end.stop.children_unlisted = unlisted;
        Event::End(end)
    }

    #[test]
    fn every_listed_child_is_credited_with_each_stop() {
        // Quota on 10; children 11 and 12 both have tasks on both CPUs: each per-CPU stop
        // stops both, whichever task was seen. The last stop lists none (only a grandchild
        // 13 was seen): the seen one is credited.
        let s = run(
            &[
                start(10, 0, 0),
                start(10, 1, 0),
                end_with_children(10, (Some(11), &[11, 12], 0), 0, (0, 50 * MS)),
                end_with_children(10, (Some(12), &[12, 11], 0), 1, (0, 40 * MS)),
                end_with_children(10, (Some(13), &[], 0), 0, (100 * MS, 130 * MS)),
            ],
            200 * MS,
        );
        let by = |id| s.iter().find(|x| x.cgroup_id == id).unwrap();
        let d: Vec<(u64, u64, u64)> = by(10)
            .descendants
            .iter()
            .map(|a| (a.cgroup_id, a.stops, a.kernel_ns))
            .collect();
        assert_eq!(d, [(11, 2, 90 * MS), (12, 2, 90 * MS), (13, 1, 30 * MS)]);
        for child in [11, 12] {
            let a = &by(child).stopped_by_ancestor;
            assert_eq!((a.len(), a[0].cgroup_id, a[0].stops), (1, 10, 2));
            assert_eq!((a[0].stopped_ns, a[0].kernel_ns), (90 * MS, 90 * MS));
            assert_eq!(by(child).stops.count, 0);
        }
        assert_eq!(by(10).children_unlisted_stops, 0);
    }

    #[test]
    fn stops_with_unlisted_children_are_counted_on_the_owner() {
        let eight: Vec<u64> = (11..19).collect();
        let s = run(
            &[
                start(10, 0, 0),
                end_with_children(10, (None, &eight, 2), 0, (0, 10 * MS)),
                start(10, 0, 20 * MS),
                end_with_children(10, (None, &eight[..1], 0), 0, (20 * MS, 30 * MS)),
            ],
            40 * MS,
        );
        let owner = s.iter().find(|x| x.cgroup_id == 10).unwrap();
        assert_eq!(owner.children_unlisted_stops, 1);
        assert_eq!(owner.descendants.len(), 8);
        assert_eq!(owner.descendants[0].stops, 2);
    }

    #[test]
    fn an_ancestor_taken_for_its_descendants_has_no_row() {
        // Only child 11 was named: the ancestor's stops count for it, not for its sibling 12,
        // and the ancestor has no summary of its own.
        let mut agg = Aggregate::watching(&[11]);
        let Event::End(end) = end_with_children(10, (Some(12), &[11, 12], 0), 0, (0, 50 * MS))
        else {
            unreachable!()
        };
        agg.credit_only(&end, |d| d == 11);
        let s = agg.finish(100 * MS);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].cgroup_id, 11);
        let a = &s[0].stopped_by_ancestor;
        assert_eq!((a.len(), a[0].cgroup_id, a[0].kernel_ns), (1, 10, 50 * MS));
    }

    #[test]
    fn forgetting_a_cgroup_forgets_its_attributions() {
        let mut agg = Aggregate::watching(&[]);
        agg.ingest(&end_of(10, Some(11), 0, 0, MS));
        agg.forget(11);
        let s = agg.finish(2 * MS);
        assert_eq!(s.len(), 1);
        assert!(s[0].descendants.is_empty());
    }

    fn run(events: &[Event], now_ns: u64) -> Vec<CgroupSummary> {
        let mut agg = Aggregate::watching(&[]);
        for ev in events {
            agg.ingest(ev);
        }
        agg.finish(now_ns)
    }

    #[test]
    fn overlapping_cpus_make_one_group_stop() {
        // CPU0 [0, 80], CPU1 [10, 90], then CPU0 alone [200, 280].
        let s = run(
            &[
                start(1, 0, 0),
                start(1, 1, 10 * MS),
                end(1, 0, 0, 80 * MS),
                end(1, 1, 10 * MS, 90 * MS),
                start(1, 0, 200 * MS),
                end(1, 0, 200 * MS, 280 * MS),
            ],
            1_000 * MS,
        );
        let s = &s[0];
        assert_eq!(s.stops.count, 3);
        assert_eq!(s.stops.sum_ns, 240 * MS);
        assert_eq!(s.kernel_stop_ns, 240 * MS);
        assert_eq!(s.group_stops.count, 2);
        assert_eq!(s.group_stops.sum_ns, 170 * MS);
        assert_eq!(s.group_stops.percentiles.unwrap().max_ns, 90 * MS);
        assert!(s.open_stops.is_empty());
        assert_eq!(s.end_reasons, vec![(EndReason::Refill, 3)]);
        assert_eq!((s.unmatched_ends, s.restarted), (0, 0));
    }

    #[test]
    fn late_start_from_another_cpu_joins_the_closed_episode() {
        // CPU1's START (t=10) arrives after CPU0's END (t=80): still one group stop [0, 90].
        let s = run(
            &[
                start(1, 0, 0),
                end(1, 0, 0, 80 * MS),
                start(1, 1, 10 * MS),
                end(1, 1, 10 * MS, 90 * MS),
            ],
            1_000 * MS,
        );
        assert_eq!(s[0].group_stops.count, 1);
        assert_eq!(s[0].group_stops.sum_ns, 90 * MS);
        // An episode that begins after the last one ended is separate.
        let s = run(
            &[
                start(1, 0, 0),
                end(1, 0, 0, 80 * MS),
                start(1, 1, 81 * MS),
                end(1, 1, 81 * MS, 90 * MS),
            ],
            1_000 * MS,
        );
        assert_eq!(s[0].group_stops.count, 2);
        assert_eq!(s[0].group_stops.sum_ns, 89 * MS);
    }

    #[test]
    fn ingest_returns_each_group_stop_once_when_it_is_final() {
        let mut agg = Aggregate::watching(&[]);
        let closed: Vec<Option<u64>> = [
            start(1, 0, 0),
            start(1, 1, 10 * MS),
            end(1, 0, 0, 80 * MS),
            end(1, 1, 10 * MS, 90 * MS), // [0, 90] is held back: a late record may widen it
            start(1, 0, 200 * MS),       // a later episode: [0, 90] is final
            end(1, 0, 200 * MS, 280 * MS),
            end(1, 1, 300 * MS, 310 * MS), // unmatched END, an episode of its own
        ]
        .iter()
        .map(|e| agg.ingest(e))
        .collect();
        assert_eq!(
            closed,
            [None, None, None, None, Some(90 * MS), None, Some(80 * MS)]
        );
        // The ones returned plus the last, which only `finish` releases.
        let s = &agg.finish(1_000 * MS)[0];
        assert_eq!(s.group_stops.count, 3);
        assert_eq!(s.group_stops.sum_ns, (90 + 80 + 10) * MS);

        let mut agg = Aggregate::watching(&[]);
        agg.ingest(&start(2, 0, 0));
        agg.forget(2);
        assert!(agg.finish(MS).is_empty());
    }

    #[test]
    fn intervals_hold_what_ended_in_them_above_the_minimum() {
        let mut agg = Aggregate::watching(&[]).with_intervals(5 * MS);
        for e in [
            start(1, 0, 0),
            end(1, 0, 0, 80 * MS),
            start(1, 0, 100 * MS), // the episode [0, 80] is final here
            start(2, 0, 0),
            end(2, 0, 0, 2 * MS), // shorter than 5 ms: whole-run figures only
        ] {
            agg.ingest(&e);
        }
        let first = agg.take_interval();
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].cgroup_id, 1);
        assert_eq!((first[0].stops.count, first[0].stops.sum_ns), (1, 80 * MS));
        assert_eq!(first[0].group_stops.sum_ns, 80 * MS);
        // The stop open across the tick counts whole in the interval it ends in.
        agg.ingest(&end(1, 0, 100 * MS, 190 * MS));
        let second = agg.take_interval();
        assert_eq!(second[0].stops.sum_ns, 90 * MS);
        assert_eq!(second[0].stops.percentiles.unwrap().max_ns, 90 * MS);
        assert_eq!(second[0].group_stops.count, 0, "still held back");
        assert!(agg.take_interval().is_empty());
        let all = agg.finish(1_000 * MS);
        assert_eq!(all.iter().map(|s| s.stops.count).sum::<u64>(), 3);
        assert!(Aggregate::default().take_interval().is_empty());
    }

    #[test]
    fn intervals_hold_the_ancestors_stops_of_each_descendant() {
        let mut agg = Aggregate::watching(&[]).with_intervals(5 * MS);
        for (cpu, (s, e)) in [
            (0, (0, 50 * MS)),
            (1, (10 * MS, 40 * MS)),
            (0, (60 * MS, 62 * MS)),
        ] {
            let Event::End(end) = end_with_children(10, (None, &[11, 12], 0), cpu, (s, e)) else {
                unreachable!()
            };
            agg.credit_only(&end, |d| d == 11);
        }
        let interval = agg.take_interval();
        assert_eq!(interval.len(), 1, "only the credited child: {interval:?}");
        let c = &interval[0];
        assert_eq!(c.cgroup_id, 11);
        assert_eq!(
            (c.stops.count, c.group_stops.count),
            (0, 0),
            "no stop of its own"
        );
        // The 2 ms stop is under the minimum.
        assert_eq!(
            (c.ancestor_stops.count, c.ancestor_stops.sum_ns),
            (2, 80 * MS)
        );
        assert_eq!(c.ancestor_stops.percentiles.unwrap().max_ns, 50 * MS);
        let by = &c.by_ancestor;
        assert_eq!((by.len(), by[0].cgroup_id, by[0].stops), (1, 10, 2));
        assert_eq!(by[0].stopped_ns, 80 * MS);
        assert!(agg.take_interval().is_empty());
    }

    #[test]
    fn a_start_overtaken_by_its_end_is_no_anomaly() {
        let s = run(
            &[end(1, 0, 100 * MS, 150 * MS), start(1, 0, 100 * MS)],
            1_000 * MS,
        );
        let s = &s[0];
        assert_eq!((s.unmatched_ends, s.restarted), (0, 0));
        assert_eq!((s.stops.count, s.group_stops.count), (1, 1));
        assert_eq!(s.group_stops.sum_ns, 50 * MS);
        assert!(s.open_stops.is_empty());
    }

    #[test]
    fn unmatched_end_is_counted_and_does_not_underflow() {
        let s = run(
            &[
                end(1, 0, 0, 50 * MS),
                start(1, 1, 200 * MS),
                end(1, 0, 210 * MS, 220 * MS), // CPU0's START was lost, inside CPU1's episode
                end(1, 1, 200 * MS, 300 * MS),
            ],
            1_000 * MS,
        );
        let s = &s[0];
        assert_eq!(s.unmatched_ends, 2);
        assert_eq!(s.stops.count, 3);
        assert_eq!(s.group_stops.count, 2);
        assert_eq!(s.group_stops.sum_ns, 150 * MS);
        assert!(s.open_stops.is_empty());
    }

    #[test]
    fn open_stops_are_reported_not_recorded() {
        let s = run(
            &[
                start(1, 0, 0),
                end(1, 0, 0, 80 * MS),
                start(1, 0, 100 * MS),
                start(1, 1, 150 * MS),
            ],
            400 * MS,
        );
        let s = &s[0];
        assert_eq!(s.stops.count, 1);
        assert_eq!(s.group_stops.count, 1);
        assert_eq!(s.group_stops.sum_ns, 80 * MS);
        assert_eq!(
            s.open_stops,
            vec![
                OpenStop {
                    cpu: 0,
                    start_ns: 100 * MS,
                    elapsed_ns: 300 * MS
                },
                OpenStop {
                    cpu: 1,
                    start_ns: 150 * MS,
                    elapsed_ns: 250 * MS
                },
            ]
        );
    }

    #[test]
    fn repeated_start_on_a_cpu_replaces_the_lost_one() {
        let s = run(
            &[
                start(1, 0, 0),
                start(1, 0, 100 * MS),
                end(1, 0, 100 * MS, 180 * MS),
            ],
            1_000 * MS,
        );
        assert_eq!(s[0].restarted, 1);
        assert!(s[0].open_stops.is_empty());
        assert_eq!(s[0].stops.count, 1);
        // The group stop keeps the earliest start it saw: the lost END's stop was real.
        assert_eq!(s[0].group_stops.sum_ns, 180 * MS);
    }

    #[test]
    fn unseen_start_and_unknown_kernel_ns_are_kept_apart() {
        let mut agg = Aggregate::watching(&[]);
        agg.ingest(&Event::UnseenStartEnd {
            cgroup_id: 5,
            cpu: 0,
            end_ns: 10,
            kernel_ns: Some(7 * MS),
        });
        agg.ingest(&Event::UnseenStartEnd {
            cgroup_id: 5,
            cpu: 1,
            end_ns: 10,
            kernel_ns: None,
        });
        agg.ingest(&start(5, 0, 20 * MS));
        agg.ingest(&Event::End(EndedStop {
            stop: stop(5, 0, 20 * MS),
            end_ns: 30 * MS,
            kernel_ns: None,
            reason: EndReason::QuotaChange,
        }));
        let s = &agg.finish(100 * MS)[0];
        assert_eq!(s.unseen_start_stops, 2);
        assert_eq!(s.unseen_start_kernel_ns, 7 * MS);
        assert_eq!(s.unseen_start_kernel_unknown, 1);
        assert_eq!(s.kernel_stop_ns, 0);
        assert_eq!(s.kernel_unknown_stops, 1);
        assert_eq!(s.kernel_accounted_ns(), 7 * MS);
        assert_eq!(s.end_reasons, vec![(EndReason::QuotaChange, 1)]);
    }

    #[test]
    fn summaries_are_per_cgroup_most_stopped_first() {
        let s = run(
            &[
                start(1, 0, 0),
                end(1, 0, 0, 10 * MS),
                start(2, 0, 0),
                end(2, 0, 0, 50 * MS),
            ],
            100 * MS,
        );
        assert_eq!(s.iter().map(|c| c.cgroup_id).collect::<Vec<_>>(), [2, 1]);
    }

    #[test]
    fn percentiles_within_one_percent_and_log2_buckets_exact() {
        let mut d = Durations::default();
        // 1..=100 ms in 1 ms steps, plus 1 µs and 1 hour.
        for ms in 1..=100 {
            d.record(ms * MS);
        }
        d.record(1_000);
        d.record(3_600_000 * MS);
        let s = d.summary();
        let p = s.percentiles.unwrap();
        let close = |got: u64, want: u64| {
            assert!(
                got >= want && got - want <= want / 100 + NS_PER_US,
                "{got} vs {want}"
            );
        };
        close(p.p50_ns, 50 * MS); // the 51st of 102 values
        close(p.p90_ns, 91 * MS);
        close(p.p99_ns, 100 * MS);
        assert_eq!(p.max_ns, 3_600_000 * MS);
        // [0,2) ms: 1 µs and 1 ms; [2,4): 2,3; [4,8): 4..7; ... [64,128): 64..100.
        assert_eq!(&s.log2_ms[..7], &[2, 2, 4, 8, 16, 32, 37]);
        assert_eq!(s.log2_ms.len(), 22); // 3.6e6 ms is in [2^21, 2^22)
        assert_eq!(s.log2_ms[21], 1);
        assert_eq!(
            s.log2_ms.iter().map(|&n| u64::from(n)).sum::<u64>(),
            s.count
        );
    }

    #[test]
    fn memory_per_stopped_cgroup() {
        // A cgroup stopped 10 000 times for 1..100 ms on 4 CPUs, one by one.
        let mut st = CgroupState::default();
        let mut t = 0;
        for i in 0..10_000u64 {
            let d = (1 + i % 100) * MS;
            let cpu = (i % 4) as u32;
            st.start(&stop(1, cpu, t));
            if let Event::End(e) = end(1, cpu, t, t + d) {
                st.end(&e);
            }
            t += d + MS;
        }
        let heap = st.stops.heap_bytes() + st.group_stops.heap_bytes() + st.open.capacity() * 16;
        let total = std::mem::size_of::<CgroupState>() + heap;
        eprintln!(
            "per stopped cgroup: {} B struct + {} B heap = {} B",
            std::mem::size_of::<CgroupState>(),
            heap,
            total
        );
        // Two histograms reaching ~100 ms: 2 × 11 buckets × 128 × 4 B, plus the rest.
        assert!(total < 13 * 1024, "{total} B");
        // One stop of an hour grows one histogram to ~13 KiB, no more.
        st.stops.record(3_600_000 * MS);
        assert!(
            st.stops.heap_bytes() < 14 * 1024,
            "{}",
            st.stops.heap_bytes()
        );
    }
}
