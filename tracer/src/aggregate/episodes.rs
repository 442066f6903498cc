//! One cgroup's stops as they come and go: the per-CPU stops still open, the union of overlapping
//! ones into group stops, the sums and reasons, and the cgroup's summary at the end. Open stops
//! come from the stop records, not the kernel's map, and a closed group stop is held back until a
//! later one begins after its end, since records from different CPUs come slightly out of order:
//! docs/design.md ("Stops and group stops in userspace").

use super::durations::{DurationSummary, Durations};
use crate::records::{EndReason, EndedStop, Stop};

/// A per-CPU stop still open when the trace finished.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpenStop {
    pub cpu: u32,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// `now_ns - start_ns` at [`finish`](super::Aggregate::finish).
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
    /// Its per-period CPU demand and busy runs; `None` when no period of it was measured.
    pub demand: Option<super::DemandSummary>,
    /// The processes and threads its stops held.
    pub held: super::HeldSummary,
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
    pub(super) fn add(&mut self, end: &EndedStop) {
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
pub(super) struct CgroupState {
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
    holders: super::holders::Holders,
}

/// Unmatched ENDs remembered for their late START; a late START is microseconds late.
const EARLY_ENDS: usize = 8;

impl CgroupState {
    /// Returns the length of the group stop this START closed for good, if any.
    pub(super) fn start(&mut self, stop: &Stop) -> Option<u64> {
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
    pub(super) fn end(&mut self, end: &EndedStop) -> Option<u64> {
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
        self.holders.record(end);

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

    pub(super) fn unseen_start_end(&mut self, kernel_ns: Option<u64>) {
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

    pub(super) fn finish(mut self, cgroup_id: u64, now_ns: u64) -> CgroupSummary {
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
            demand: None,
            held: self.holders.finish(),
        }
    }
}

/// Most stopped first, then by cgroup id.
pub(super) fn sort_attributed(list: &mut [Attributed]) {
    list.sort_by(|a, b| {
        b.stopped_ns
            .cmp(&a.stopped_ns)
            .then(a.cgroup_id.cmp(&b.cgroup_id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Aggregate;
    use crate::aggregate::tests::{MS, end, run, start, stop};
    use crate::records::Event;

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

    /// A cgroup stopped `stops` times for 1..100 ms on 4 CPUs, one by one, and its bytes.
    fn stopped(stops: u64) -> (CgroupState, usize) {
        let mut st = CgroupState::default();
        let mut t = 0;
        for i in 0..stops {
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
            "{stops} stops: {} B struct + {heap} B heap = {total} B",
            std::mem::size_of::<CgroupState>(),
        );
        (st, total)
    }

    #[test]
    fn memory_per_stopped_cgroup() {
        // Few stops are kept as they are: 2 × 32 × 8 B, plus the rest.
        let (_, total) = stopped(20);
        assert!(total < 1536, "{total} B");
        let (mut st, total) = stopped(10_000);
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
