//! A cgroup's demand over a rolling window (`serve --advice-window`): the busy runs and period
//! counts of the last window, made by the whole trace's own [`RunMaker`] and summed into a
//! [`DemandSummary`] for `advice::advise` when asked. Bounded in memory whatever the window: at
//! most `max_runs` runs, the oldest leaving first (`dropped_runs`), the period counts in sixtieths
//! of it, and the held threads' records ([`Rolling::deferred`]) only for a run's first period.

use std::collections::VecDeque;

use super::backlog::Backlog;
use super::demand::{Calm, DemandSummary, LARGEST, Run, RunMaker, arrived_in};
use super::durations::Durations;
use crate::records::{Bandwidth, Deferred, Period};

/// Slices of the window its period counts are kept in: the window holds between 59 and 60 of
/// them, and a run belongs to it while its end is inside.
const SLICES: u64 = 60;

/// The period counts of one slice of the window.
#[derive(Clone, Copy, Debug, Default)]
struct Slice {
    /// Its index: CLOCK_MONOTONIC ns ÷ the slice's length.
    index: u64,
    periods: u64,
    unknown_periods: u64,
    throttled_periods: u64,
    usage_ns: u64,
    covered_ns: u64,
    max_cpus: u32,
    burst_spent_ns: Option<u64>,
}

/// What one period added to the window: its arrived demand per period, once the run it belongs
/// to has ended (the exporter's demand histogram takes these).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Arrived {
    /// `(ns, periods)`: `periods` periods of `ns` arrived demand each.
    pub periods: Vec<(u64, u32)>,
}

/// One cgroup's demand over the window.
#[derive(Debug)]
pub struct Rolling {
    slice_ns: u64,
    max_runs: usize,
    making: RunMaker,
    backlog: Backlog,
    runs: VecDeque<Run>,
    slices: VecDeque<Slice>,
    calm: Calm,
    bandwidth: Bandwidth,
    /// Runs that left before their end left the window, for the bound.
    pub dropped_runs: u64,
    /// The end of the last run that left for the bound: the window's summary counts the
    /// periods of the slices after its slice only, so that the periods whose runs are gone do
    /// not dilute the share of those kept.
    dropped_until_ns: u64,
}

impl Rolling {
    /// A window of `window_ns` (at least a second) keeping at most `max_runs` runs.
    pub fn new(window_ns: u64, max_runs: usize) -> Self {
        Self {
            slice_ns: (window_ns / SLICES).max(1_000_000_000 / SLICES),
            max_runs: max_runs.max(1),
            making: RunMaker::default(),
            backlog: Backlog::default(),
            runs: VecDeque::new(),
            slices: VecDeque::new(),
            calm: Calm::default(),
            bandwidth: Bandwidth::default(),
            dropped_runs: 0,
            dropped_until_ns: 0,
        }
    }

    /// The most runs it keeps from now on; the oldest beyond it leave at once.
    pub fn bound(&mut self, max_runs: usize) {
        self.max_runs = max_runs.max(1);
        self.trim();
        // A share reserved while the windows were fewer gives back what it no longer may fill.
        if self.runs.capacity() > 2 * self.max_runs {
            self.runs.shrink_to(self.max_runs);
        }
    }

    /// Takes one period (they come in order); returns what arrived in the periods of a run it
    /// ended, or in it if it is idle.
    pub fn period(&mut self, p: &Period) -> Arrived {
        self.bandwidth = p.bandwidth;
        self.backlog.period(p);
        let index = p.end_ns / self.slice_ns;
        if self.slices.back().is_none_or(|s| s.index < index) {
            self.slices.push_back(Slice {
                index,
                ..Slice::default()
            });
        }
        let oldest = index.saturating_sub(SLICES - 1);
        while self.slices.front().is_some_and(|s| s.index < oldest) {
            self.slices.pop_front();
        }
        let start = oldest * self.slice_ns;
        while self.runs.front().is_some_and(|r| r.end_ns < start) {
            self.pop();
        }
        let Some(slice) = self.slices.back_mut() else {
            return Arrived::default();
        };
        let Some(start_ns) = p.start_ns else {
            slice.unknown_periods += 1;
            self.making.period(p);
            return Arrived::default();
        };
        slice.periods += 1;
        slice.throttled_periods += u64::from(p.throttled_cpus > 0);
        slice.usage_ns = slice.usage_ns.saturating_add(p.usage_ns);
        slice.covered_ns = slice.covered_ns.saturating_add(p.end_ns - start_ns);
        slice.max_cpus = slice.max_cpus.max(p.cpus_used);
        if let Some(spent) = p.burst_spent_ns {
            slice.burst_spent_ns = Some(slice.burst_spent_ns.unwrap_or(0).saturating_add(spent));
        }
        match self.making.period(p) {
            Some(mut run) if run.demand_ns > 0 => {
                run.first_arrived_ns = self
                    .backlog
                    .first_arrived(run.start_ns, run.throttled_periods);
                self.calm.add(&run);
                // The first run sizes the window at its share of the bound: a deque that
                // doubles as it fills grows every window of a fleet of alike cgroups at once,
                // each into a new buffer with the old one left to the allocator (a step of
                // megabytes); reserved once, memory grows by one run at a time to the bound.
                if self.runs.capacity() == 0 {
                    self.runs.reserve_exact(self.max_runs);
                }
                self.runs.push_back(run);
                self.trim();
                let quota = p.bandwidth.quota_ns.unwrap_or(u64::MAX);
                let (first, rest) = arrived_in(&run, self.calm.mean(self.periods()), quota);
                let mut periods = vec![(first, 1)];
                if run.periods > 1 {
                    periods.push((rest, run.periods - 1));
                }
                Arrived { periods }
            }
            // An idle period (or a run of no usage): nothing arrived.
            Some(run) => Arrived {
                periods: vec![(0, run.periods)],
            },
            // A period of a run still going, or the tail of a run broken by an unknown one.
            None => Arrived::default(),
        }
    }

    /// Takes one held thread's deferred work.
    pub fn deferred(&mut self, d: &Deferred) {
        self.backlog.deferred(d);
    }

    /// A hold at `since_ns` whose work is unknown (threads a stop held past those it lists).
    pub fn unknown_hold(&mut self, since_ns: u64) {
        self.backlog.unknown_hold(since_ns);
    }

    fn pop(&mut self) {
        if let Some(run) = self.runs.pop_front() {
            self.calm.remove(&run);
        }
    }

    fn trim(&mut self) {
        while self.runs.len() > self.max_runs {
            if let Some(run) = self.runs.front() {
                self.dropped_until_ns = self.dropped_until_ns.max(run.end_ns);
            }
            self.pop();
            self.dropped_runs += 1;
        }
    }

    /// The slices the summary counts: those after the last run dropped for the bound.
    fn counted(&self) -> impl Iterator<Item = &Slice> {
        let after = (self.dropped_runs > 0).then(|| self.dropped_until_ns / self.slice_ns);
        self.slices
            .iter()
            .filter(move |s| after.is_none_or(|a| s.index > a))
    }

    fn periods(&self) -> u64 {
        self.counted().map(|s| s.periods).sum()
    }

    /// The run still going, if it has usage (its demand so far a lower bound).
    pub fn unfinished(&self) -> Option<Run> {
        self.making.unfinished()
    }

    /// The settings of the last period taken.
    pub fn bandwidth(&self) -> Bandwidth {
        self.bandwidth
    }

    /// The window's demand, as the whole trace's summary has it (no deferred work: the advice
    /// does not use it).
    pub fn summary(&self, slice_ns: Option<u64>) -> DemandSummary {
        let mut runs = Durations::default();
        self.runs.iter().for_each(|r| runs.record(r.demand_ns));
        // The whole trace's order: larger first, the earlier of two alike (runs are in order).
        // Selected, not sorted: a window holds tens of thousands of runs.
        let key = |r: &Run| (std::cmp::Reverse(r.demand_ns), r.start_ns);
        let mut largest: Vec<Run> = self.runs.iter().copied().collect();
        if largest.len() > LARGEST {
            largest.select_nth_unstable_by_key(LARGEST - 1, key);
            largest.truncate(LARGEST);
        }
        largest.sort_unstable_by_key(key);
        let sum = |f: fn(&Slice) -> u64| self.counted().map(f).sum::<u64>();
        DemandSummary {
            periods: sum(|s| s.periods),
            unknown_periods: sum(|s| s.unknown_periods),
            throttled_periods: sum(|s| s.throttled_periods),
            usage_ns: sum(|s| s.usage_ns),
            covered_ns: sum(|s| s.covered_ns),
            runs: runs.summary(),
            largest,
            runs_in_order: self.runs.iter().copied().collect(),
            broken_runs: self.making.broken_runs,
            unfinished: self.making.unfinished(),
            max_cpus: self.counted().map(|s| s.max_cpus).max().unwrap_or(0),
            bandwidth: self.bandwidth,
            burst_spent_ns: self
                .counted()
                .filter_map(|s| s.burst_spent_ns)
                .reduce(u64::saturating_add),
            waiting: Durations::default().summary(),
            holds_unplaced: 0,
            slice_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;
    use crate::aggregate::Aggregate;
    use crate::aggregate::tests::MS;
    use crate::testing::period;

    /// Calm periods of 20 ms, a run of three (50 + 50 + 30 ms) every tenth.
    fn periods(n: u64) -> Vec<Period> {
        (1..=n)
            .flat_map(|i| {
                let end = i * 1000;
                if i % 10 == 0 {
                    vec![
                        period(end - 200, 50, 2, true),
                        period(end - 100, 50, 2, true),
                        period(end, 30, 2, false),
                    ]
                } else {
                    (0..10)
                        .map(|k| period(end - 900 + k * 100, 20, 1, false))
                        .collect()
                }
            })
            .collect()
    }

    #[test]
    fn a_window_holding_every_period_sums_up_as_the_whole_trace() {
        let all = periods(40);
        let mut rolling = Rolling::new(3_600_000 * MS, 100_000);
        let mut agg = Aggregate::watching(&[1]);
        for p in &all {
            rolling.period(p);
            agg.ingest_period(p);
            // Every other run's first period held a thread that ran 40 ms more before it
            // slept: that run carries what arrived in its first period, in both.
            if p.throttled_cpus > 0 && p.end_ns % (20_000 * MS) == 9_800 * MS {
                let held = Deferred {
                    cgroup_id: 1,
                    tid: 7,
                    since_ns: p.end_ns - 50 * MS,
                    ran_ns: 40 * MS,
                    continues: false,
                    unfollowed: false,
                };
                rolling.deferred(&held);
                agg.ingest_deferred(&held);
            }
        }
        let whole = agg.finish(all.last().unwrap().end_ns).remove(0);
        let summary = rolling.summary(None);
        // The window keeps no distribution of the work waiting: the advice does not use it.
        let whole = DemandSummary {
            waiting: Durations::default().summary(),
            ..whole.demand.unwrap()
        };
        assert_eq!(summary, whole);
        let measured: Vec<u64> = summary
            .runs_in_order
            .iter()
            .filter_map(|r| r.first_arrived_ns)
            .map(NonZeroU64::get)
            .collect();
        assert_eq!(measured, [90 * MS; 2]);
    }

    #[test]
    fn old_runs_and_periods_leave_the_window_and_the_bound_holds() {
        // A 60 s window: after 200 s only the last 59-60 s of periods are in it, 93 in each
        // 10 s (9 s of calm periods, then a run of three).
        let all = periods(200);
        let mut rolling = Rolling::new(60_000 * MS, 100_000);
        for p in &all {
            rolling.period(p);
        }
        // Sized once at the bound by its first run: no buffer grown in steps.
        assert_eq!(rolling.runs.capacity(), 100_000);
        let s = rolling.summary(None);
        assert!((548..=558).contains(&s.periods), "{}", s.periods);
        assert!(s.covered_ns <= 60_000 * MS);
        assert!(s.runs_in_order.first().unwrap().end_ns >= (200_000 - 60_000) * MS);
        rolling.bound(50);
        assert!(rolling.runs.capacity() < 100, "{}", rolling.runs.capacity());
        let s = rolling.summary(None);
        assert_eq!(s.runs_in_order.len(), 50);
        assert!(rolling.dropped_runs > 0);
        // The periods counted are those of the kept runs' time, not the whole window's: 50
        // runs of one 100 ms period, the last 5 s, about 46 of them.
        assert!((40..=50).contains(&s.periods), "{}", s.periods);
    }

    #[test]
    fn each_period_arrives_once_as_its_run_ends() {
        let mut rolling = Rolling::new(3_600_000 * MS, 100_000);
        let mut arrived = Vec::new();
        for p in periods(10) {
            arrived.extend(rolling.period(&p).periods);
        }
        let count: u32 = arrived.iter().map(|&(_, n)| n).sum();
        assert_eq!(count, 93, "9 × 10 calm periods and the run's three");
        // The run's 130 ms: its later periods receive the calm mean, 20 ms each, the first
        // the rest (90 ms).
        assert_eq!(arrived.last(), Some(&(20 * MS, 2)));
        assert_eq!(arrived[arrived.len() - 2], (90 * MS, 1));
    }
}
