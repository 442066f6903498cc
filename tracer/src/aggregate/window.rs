//! The live interval: what ended since the last tick, for live views. With
//! `Aggregate::with_intervals` the same stop logic also puts every ended stop and final group stop
//! into a window that `Aggregate::take_interval` hands out and empties: a stop counts whole in the
//! interval it ends in, a group stop in the one it became final in. It also keeps each cgroup's
//! largest busy run that ended in the interval, for the MAX RUN column.

use std::collections::HashMap;

use super::demand::Run;
use super::durations::{DurationSummary, Durations};
use super::episodes::{Attributed, sort_attributed};
use super::holders::{HeldSummary, Holders};
use crate::records::{EndedStop, Event};

/// What one cgroup's stops did in one interval (see
/// [`Aggregate::take_interval`](super::Aggregate::take_interval)).
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
    /// The processes and threads its own stops that ended in the interval held.
    pub held: HeldSummary,
    /// The largest busy run (by demand) that ended in the interval; `None` when none did or
    /// the backend does not measure periods.
    pub largest_run: Option<Run>,
}

/// One cgroup's stops in the current interval.
#[derive(Debug, Default)]
struct InWindow {
    stops: Durations,
    group_stops: Durations,
    ancestor_stops: Durations,
    by_ancestor: HashMap<u64, Attributed>,
    holders: Holders,
}

/// The current interval's per-CPU stops, group stops and ancestors' stops, per cgroup; only
/// those at least `min_ns` long.
#[derive(Debug, Default)]
pub(super) struct Window {
    min_ns: u64,
    cgroups: HashMap<u64, InWindow>,
    /// Per cgroup, the largest run that ended in the interval; a cgroup gets no interval
    /// summary from its runs alone (the rows are the stopped cgroups).
    runs: HashMap<u64, Run>,
}

impl Window {
    pub(super) fn new(min_ns: u64) -> Self {
        Self {
            min_ns,
            cgroups: HashMap::new(),
            runs: HashMap::new(),
        }
    }

    /// Each cgroup's stops in the interval; the next one begins empty.
    pub(super) fn take(&mut self) -> Vec<IntervalSummary> {
        let mut runs = std::mem::take(&mut self.runs);
        std::mem::take(&mut self.cgroups)
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
                    held: c.holders.finish(),
                    largest_run: runs.remove(&cgroup_id),
                }
            })
            .collect()
    }

    pub(super) fn record(&mut self, event: &Event, closed: Option<u64>) {
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
        if let (Some(ns), Event::End(end)) = (ended, event) {
            c.stops.record(ns);
            c.holders.record(end);
        }
        if let Some(ns) = closed {
            c.group_stops.record(ns);
        }
    }

    /// A busy run of `cgroup_id` that ended.
    pub(super) fn run(&mut self, cgroup_id: u64, run: Run) {
        let largest = self.runs.entry(cgroup_id).or_insert(run);
        if run.demand_ns > largest.demand_ns {
            *largest = run;
        }
    }

    /// The ended stop `end` of an ancestor's quota, for `descendant`.
    pub(super) fn credit(&mut self, end: &EndedStop, descendant: u64) {
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

#[cfg(test)]
mod tests {
    use crate::aggregate::Aggregate;
    use crate::aggregate::tests::{MS, end, end_with_children, start};
    use crate::records::Event;

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
    fn intervals_hold_the_largest_run_that_ended_in_them_on_the_stopped_cgroups_rows() {
        use crate::testing::period;
        let mut agg = Aggregate::watching(&[]).with_intervals(0);
        // Cgroup 1: a run of 80 ms (throttled, then 30 ms) and a run of one of 20 ms; cgroup 2
        // runs without a stop.
        for p in [
            period(100, 0, 1, false), // no usage: no run
            period(200, 50, 1, true),
            period(300, 30, 1, false),
            period(400, 20, 1, false),
        ] {
            agg.ingest_period(&p);
        }
        let mut other = period(300, 10, 1, false);
        other.cgroup_id = 2;
        agg.ingest_period(&other);
        agg.ingest(&start(1, 0, 150 * MS));
        agg.ingest(&end(1, 0, 150 * MS, 200 * MS));
        let interval = agg.take_interval();
        assert_eq!(interval.len(), 1, "only the stopped cgroup: {interval:?}");
        let run = interval[0].largest_run.unwrap();
        assert_eq!((run.demand_ns, run.periods), (80 * MS, 2));
        // A new interval starts without runs.
        agg.ingest(&start(1, 0, 450 * MS));
        agg.ingest(&end(1, 0, 450 * MS, 500 * MS));
        assert_eq!(agg.take_interval()[0].largest_run, None);
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
}
