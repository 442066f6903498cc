//! Per-period CPU demand and busy runs of each cgroup with a quota, from the period records, and
//! what arrived in each period, which the advice replays. The definitions (period, usage, busy run,
//! parallelism, deferred work, unknown usage, unfinished run) are docs/definitions.md's ("Demand,
//! busy runs and advice", "Deferred work"); a run with a period of unknown usage is dropped and
//! counted (`broken_runs`), never reported short.

use std::num::NonZeroU64;

use super::backlog::Backlog;
use super::durations::{DurationSummary, Durations};

use crate::records::{Bandwidth, Deferred, Period};

/// Largest runs kept with their times.
pub(super) const LARGEST: usize = 5;
/// Runs kept in order for the advice's replay of the refill (`DemandSummary::runs_in_order`);
/// ~3 hours of runs of one at 100 ms. Past it the advice covers the first ones only.
const MAX_IN_ORDER: usize = 100_000;

/// One busy run (or a run of one period).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
pub struct Run {
    /// CLOCK_MONOTONIC ns: the start of its first period and the end of its last.
    pub start_ns: u64,
    pub end_ns: u64,
    pub periods: u32,
    /// Of them, the periods that ended throttled.
    pub throttled_periods: u32,
    /// Σ usage of its periods, ns.
    pub demand_ns: u64,
    /// The most CPUs it ran on within one period.
    pub cpus: u32,
    /// What arrived in its first period: that period's usage and the work still waiting at
    /// its end, when the held threads' records told it by the run's end (tracepoint backend).
    /// Never 0 (the period ended throttled), which keeps a run at 48 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_arrived_ns: Option<NonZeroU64>,
}

// The rolling windows' bound (`WINDOW_RUNS`) is counted in runs of this size.
const _: () = assert!(std::mem::size_of::<Run>() == 48);

/// A cgroup's demand over the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemandSummary {
    /// Periods with a known usage.
    pub periods: u64,
    /// Periods whose usage was unknown.
    pub unknown_periods: u64,
    /// Known periods that ended throttled (the kernel's `nr_throttled` counts these).
    pub throttled_periods: u64,
    /// Σ usage of the known periods, ns.
    pub usage_ns: u64,
    /// Σ length of the known periods, ns: how long the measurement covers.
    pub covered_ns: u64,
    /// The distribution of run demand (`sum_ns` = the usage inside runs).
    pub runs: DurationSummary,
    /// The largest runs, largest first.
    pub largest: Vec<Run>,
    /// Every run in order (at most `MAX_IN_ORDER`), for the advice.
    pub runs_in_order: Vec<Run>,
    /// Runs that had a period of unknown usage, dropped.
    pub broken_runs: u64,
    /// The run still throttled at the end of the trace, if any (its demand a lower bound).
    pub unfinished: Option<Run>,
    /// The most CPUs the group ran on within one period.
    pub max_cpus: u32,
    /// The settings of the last period.
    pub bandwidth: Bandwidth,
    /// Σ burst spent over every period seen, as the refills counted it into cpu.stat
    /// `burst_time` (ns); `None` when the kernel does not say (before 5.16).
    pub burst_spent_ns: Option<u64>,
    /// The work waiting at the end of each throttled period whose held threads all finished
    /// it (docs/definitions.md, "deferred work"); `count` is how many such periods there were.
    pub waiting: DurationSummary,
    /// Holds whose record came for no throttled period still open to it (older than the
    /// last `RECENT`, or a refill between period boundaries): not counted anywhere.
    pub holds_unplaced: u64,
    /// The machine's `sched_cfs_bandwidth_slice_us` (ns) when the trace read it.
    pub slice_ns: Option<u64>,
}

/// One cgroup's periods so far.
#[derive(Debug, Default)]
pub(super) struct Demand {
    periods: u64,
    unknown_periods: u64,
    throttled_periods: u64,
    usage_ns: u64,
    covered_ns: u64,
    runs: Durations,
    largest: Vec<Run>,
    in_order: Vec<Run>,
    making: RunMaker,
    max_cpus: u32,
    bandwidth: Bandwidth,
    burst_spent_ns: Option<u64>,
    /// The end of the last period taken, ns.
    last_end_ns: u64,
    backlog: Backlog,
    waiting: Durations,
}

/// Makes busy runs of a cgroup's periods in order: the one definition the whole trace's demand
/// and the exporter's rolling window share.
#[derive(Debug, Default)]
pub(super) struct RunMaker {
    open: Option<Run>,
    /// A run with a period of unknown usage is still open: its periods are no run's.
    broken: bool,
    /// Runs that had a period of unknown usage, dropped.
    pub(super) broken_runs: u64,
}

impl RunMaker {
    /// Takes one period; returns the run it ended, if any, with usage or not.
    pub(super) fn period(&mut self, p: &Period) -> Option<Run> {
        let throttled = p.throttled_cpus > 0;
        let Some(start_ns) = p.start_ns else {
            let open = self.open.take().is_some();
            if (open || throttled) && !self.broken {
                self.broken_runs += 1;
            }
            // Ended throttled, the run goes on past the hole.
            self.broken = throttled;
            return None;
        };
        if self.broken {
            // The tail of a broken run: as a run of its own it would be reported short.
            self.broken = throttled;
            return None;
        }
        let run = self.open.get_or_insert(Run {
            start_ns,
            ..Run::default()
        });
        run.end_ns = p.end_ns;
        run.periods += 1;
        run.throttled_periods += u32::from(throttled);
        run.demand_ns = run.demand_ns.saturating_add(p.usage_ns);
        run.cpus = run.cpus.max(p.cpus_used);
        if throttled {
            return None;
        }
        self.open.take()
    }

    /// The run still throttled, if it has usage: a lower bound of its demand.
    pub(super) fn unfinished(&self) -> Option<Run> {
        self.open.filter(|r| r.demand_ns > 0)
    }
}

impl Demand {
    /// Takes one period; returns the run it ended, if any (with usage).
    pub(super) fn period(&mut self, p: &Period) -> Option<Run> {
        self.bandwidth = p.bandwidth;
        self.last_end_ns = p.end_ns;
        if let Some(spent) = p.burst_spent_ns {
            self.burst_spent_ns = Some(self.burst_spent_ns.unwrap_or(0).saturating_add(spent));
        }
        let throttled = p.throttled_cpus > 0;
        if let Some(waiting) = self.backlog.period(p) {
            self.waiting.record(waiting);
        }
        let Some(start_ns) = p.start_ns else {
            self.unknown_periods += 1;
            return self.making.period(p);
        };
        self.periods += 1;
        self.usage_ns = self.usage_ns.saturating_add(p.usage_ns);
        self.covered_ns = self.covered_ns.saturating_add(p.end_ns - start_ns);
        self.max_cpus = self.max_cpus.max(p.cpus_used);
        self.throttled_periods += u64::from(throttled);
        let mut run = self.making.period(p)?;
        run.first_arrived_ns = self
            .backlog
            .first_arrived(run.start_ns, run.throttled_periods);
        self.close(run)
    }

    /// The end of the last period taken, ns.
    pub(super) fn last_end_ns(&self) -> u64 {
        self.last_end_ns
    }

    fn close(&mut self, run: Run) -> Option<Run> {
        if run.demand_ns == 0 {
            return None;
        }
        self.runs.record(run.demand_ns);
        if self.in_order.len() < MAX_IN_ORDER {
            self.in_order.push(run);
        }
        let at = self
            .largest
            .iter()
            .position(|r| r.demand_ns < run.demand_ns)
            .unwrap_or(self.largest.len());
        if at < LARGEST {
            self.largest.insert(at, run);
            self.largest.truncate(LARGEST);
        }
        Some(run)
    }

    /// Takes one held thread's deferred work.
    pub(super) fn deferred(&mut self, d: &Deferred) {
        self.backlog.deferred(d);
    }

    /// A hold at `since_ns` whose work is unknown (see [`Backlog::unknown_hold`]).
    pub(super) fn unknown_hold(&mut self, since_ns: u64) {
        self.backlog.unknown_hold(since_ns);
    }

    pub(super) fn finish(mut self, slice_ns: Option<u64>) -> DemandSummary {
        for waiting in self.backlog.finish() {
            self.waiting.record(waiting);
        }
        DemandSummary {
            slice_ns,
            waiting: self.waiting.summary(),
            periods: self.periods,
            unknown_periods: self.unknown_periods,
            throttled_periods: self.throttled_periods,
            usage_ns: self.usage_ns,
            covered_ns: self.covered_ns,
            runs: self.runs.summary(),
            largest: self.largest,
            runs_in_order: self.in_order,
            broken_runs: self.making.broken_runs,
            unfinished: self.making.unfinished(),
            max_cpus: self.max_cpus,
            bandwidth: self.bandwidth,
            burst_spent_ns: self.burst_spent_ns,
            holds_unplaced: self.backlog.holds_unplaced,
        }
    }
}

/// The calm periods of a set of runs, for their mean usage: the runs of one period's usage, and
/// the periods the longer runs span (docs/definitions.md, "calm period").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calm {
    usage_ns: u64,
    in_long_runs: u64,
}

impl Calm {
    pub fn add(&mut self, run: &Run) {
        if run.periods > 1 {
            self.in_long_runs += u64::from(run.periods);
        } else {
            self.usage_ns = self.usage_ns.saturating_add(run.demand_ns);
        }
    }

    pub fn remove(&mut self, run: &Run) {
        if run.periods > 1 {
            self.in_long_runs = self.in_long_runs.saturating_sub(u64::from(run.periods));
        } else {
            self.usage_ns = self.usage_ns.saturating_sub(run.demand_ns);
        }
    }

    /// The mean usage of a calm period among `periods` measured (idle ones included).
    pub fn mean(&self, periods: u64) -> u64 {
        self.usage_ns
            .checked_div(periods.saturating_sub(self.in_long_runs))
            .unwrap_or(0)
    }
}

/// What arrived in `run`'s first period and in each later one, with calm periods of `calm` ns.
/// The first period's is what it ran plus what still waited at its end
/// (`Run::first_arrived_ns`) where the held threads' records told it, and the later periods
/// share the rest; otherwise the later ones get the calm mean each and the first the rest. The
/// first holds at least the quota it spent and at most the whole run. Not the calm mean alone:
/// a cluster of arrivals straddling a boundary would replay as one block, which put reference
/// 003's no-stop quota a fifth above the smallest that stops nothing.
pub fn arrived_in(run: &Run, calm: u64, quota: u64) -> (u64, u64) {
    let rest = u64::from(run.periods.saturating_sub(1));
    let first = run
        .first_arrived_ns
        .map(NonZeroU64::get)
        .unwrap_or_else(|| run.demand_ns.saturating_sub(rest.saturating_mul(calm)))
        .max(run.demand_ns.min(quota))
        .min(run.demand_ns);
    (
        first,
        (run.demand_ns - first).checked_div(rest).unwrap_or(0),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::aggregate::backlog::RECENT;
    use crate::aggregate::tests::MS;
    use crate::testing::period;

    fn demand(periods: &[Period]) -> DemandSummary {
        let mut d = Demand::default();
        for p in periods {
            d.period(p);
        }
        d.finish(None)
    }

    #[test]
    fn a_run_goes_from_the_first_throttled_period_through_the_first_unthrottled_one() {
        let s = demand(&[
            period(100, 10, 1, false),
            // 120 ms of work against a 50 ms quota: 50 + 50 + 20.
            period(200, 50, 2, true),
            period(300, 50, 1, true),
            period(400, 20, 1, false),
            // Idle: not a run.
            period(500, 0, 0, false),
            period(600, 30, 1, false),
        ]);
        assert_eq!((s.periods, s.throttled_periods), (6, 2));
        assert_eq!(s.usage_ns, 160 * MS);
        assert_eq!(s.covered_ns, 600 * MS);
        assert_eq!(s.runs.count, 3);
        let big = s.largest[0];
        assert_eq!(
            (big.start_ns, big.end_ns, big.periods, big.throttled_periods),
            (100 * MS, 400 * MS, 3, 2)
        );
        assert_eq!((big.demand_ns, big.cpus), (120 * MS, 2));
        assert_eq!(
            s.largest
                .iter()
                .map(|r| r.demand_ns / MS)
                .collect::<Vec<_>>(),
            [120, 30, 10]
        );
        assert_eq!(s.runs_in_order.len(), 3);
        assert_eq!(s.runs_in_order[0].demand_ns, 10 * MS);
        assert_eq!(s.max_cpus, 2);
        assert_eq!((s.broken_runs, s.unfinished), (0, None));
    }

    fn deferred(tid: u32, since_ms: u64, ran_ms: u64, continues: bool) -> Deferred {
        Deferred {
            cgroup_id: 1,
            tid,
            since_ns: since_ms * MS,
            ran_ns: ran_ms * MS,
            continues,
            unfollowed: false,
        }
    }

    #[test]
    fn the_work_waiting_at_a_throttled_end_is_what_its_held_threads_ran_before_they_slept() {
        let run = [
            period(100, 10, 1, false),
            period(200, 50, 2, true),
            period(300, 50, 1, true),
            period(400, 20, 1, false),
        ];
        let waiting = |records: &[Deferred]| {
            let mut d = Demand::default();
            for p in &run {
                d.period(p);
            }
            for r in records {
                d.deferred(r);
            }
            let w = d.finish(None).waiting;
            (w.count, w.sum_ns / MS, w.percentiles.map(|p| p.max_ns / MS))
        };
        // Thread 1, held at 150 ms, ran 40 ms after the refill and was held again at 260 ms
        // before it slept, then ran 15 ms more: all 55 ms were waiting at 200 ms, 15 at 300.
        // Thread 2, held at 180 ms, ran 10 ms and slept.
        let finished = [
            deferred(1, 150, 40, true),
            deferred(2, 180, 10, false),
            deferred(1, 260, 15, false),
        ];
        assert_eq!(waiting(&finished), (2, 65 + 15, Some(65)));
        // Thread 3, held at 290 ms, never slept before the trace ended: nothing is known of
        // what waited at 300 ms.
        let mut unfinished = finished.to_vec();
        unfinished.push(deferred(3, 290, 5, true));
        assert_eq!(waiting(&unfinished), (1, 65, Some(65)));
        // A hold in no throttled period (a refill outside a boundary) has no period.
        assert_eq!(waiting(&[deferred(4, 50, 9, false)]), (0, 0, None));
        // A hold the programs could not follow leaves its period without a figure.
        let mut unfollowed = finished.to_vec();
        unfollowed.push(Deferred {
            unfollowed: true,
            ..deferred(5, 120, 0, false)
        });
        assert_eq!(waiting(&unfollowed), (1, 15, Some(15)));
    }

    #[test]
    fn a_hold_whose_record_comes_before_its_period_counts_toward_that_period() {
        let mut d = Demand::default();
        d.period(&period(100, 10, 1, false));
        // Held at 150 ms, let run by a refill between boundaries and asleep at 170 ms, before
        // the period it was held in ends.
        d.deferred(&deferred(1, 150, 20, false));
        d.period(&period(200, 50, 2, true));
        d.deferred(&deferred(2, 180, 10, false));
        d.period(&period(300, 20, 1, false));
        let s = d.finish(None);
        assert_eq!((s.waiting.count, s.waiting.sum_ns), (1, 30 * MS));
        assert_eq!(s.holds_unplaced, 0);
        // A stop's thread past those it listed, held at 160 ms: the period has no figure.
        let mut d = Demand::default();
        d.period(&period(100, 10, 1, false));
        d.unknown_hold(160 * MS);
        d.deferred(&deferred(1, 150, 20, false));
        d.period(&period(200, 50, 2, true));
        let s = d.finish(None);
        assert_eq!((s.waiting.count, s.holds_unplaced), (0, 0));
    }

    #[test]
    fn a_run_carries_what_arrived_in_its_first_period_when_its_holds_told_it_by_its_end() {
        let first_arrived = |records: &[Deferred]| {
            let mut d = Demand::default();
            d.period(&period(100, 10, 1, false));
            d.period(&period(200, 50, 2, true));
            for r in records {
                d.deferred(r);
            }
            d.period(&period(300, 50, 1, true));
            d.period(&period(400, 20, 1, false));
            d.finish(None).largest[0]
                .first_arrived_ns
                .map(|ns| ns.get() / MS)
        };
        // Held at 150 ms and 180 ms, both slept by the run's end: 50 ms ran in the first
        // period, 25 + 10 waited at its end.
        let slept = [deferred(1, 150, 25, false), deferred(2, 180, 10, false)];
        assert_eq!(first_arrived(&slept), Some(85));
        // Thread 2 was held again at 260 ms and had not slept by the run's end: unknown.
        let held_on = [deferred(1, 150, 25, false), deferred(2, 180, 10, true)];
        assert_eq!(first_arrived(&held_on), None);
        // No hold of it seen: unknown, not nothing waiting.
        assert_eq!(first_arrived(&[]), None);
    }

    #[test]
    fn a_period_is_summed_up_once_no_hold_of_it_can_still_be_followed() {
        let mut d = Demand::default();
        d.period(&period(100, 10, 1, false));
        d.period(&period(200, 50, 1, true));
        d.deferred(&deferred(1, 150, 12, false));
        for end in (300..=100 * (RECENT as u64 + 2)).step_by(100) {
            d.period(&period(end, 50, 1, true));
        }
        // The first throttled period was summed up when the 129th ended: a record for it
        // now is counted, not placed.
        d.deferred(&deferred(2, 160, 7, false));
        let s = d.finish(None);
        assert_eq!((s.waiting.count, s.waiting.sum_ns), (1, 12 * MS));
        assert_eq!(s.holds_unplaced, 1);
    }

    #[test]
    fn a_period_of_unknown_usage_drops_its_run_and_a_run_at_the_end_is_unfinished() {
        let mut unknown = period(300, 0, 1, true);
        unknown.start_ns = None;
        let s = demand(&[
            period(200, 50, 1, true),
            unknown,
            period(400, 20, 1, false),
            period(450, 10, 1, false),
            period(500, 50, 1, true),
        ]);
        assert_eq!((s.periods, s.unknown_periods, s.broken_runs), (4, 1, 1));
        // The hole ended throttled: the period after it is the broken run's end, not a run of
        // 20 ms; the next one is a run of one.
        assert_eq!(s.runs.count, 1);
        assert_eq!(s.largest[0].demand_ns, 10 * MS);
        let open = s.unfinished.unwrap();
        assert_eq!((open.demand_ns, open.periods), (50 * MS, 1));
    }
}
