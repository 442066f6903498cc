//! Per-cgroup state, fed one [`Event`] at a time by the run loop ([`Aggregate::ingest`], which also
//! says which group stop each record closed for good) and read once at the end
//! ([`Aggregate::finish`]); what each figure means is docs/definitions.md's. This module routes
//! records to [`durations`], [`episodes`], [`holders`], [`demand`], [`backlog`], [`rolling`] and
//! [`window`], each saying what it keeps, and joins the ancestors' credits.

mod backlog;
mod demand;
mod durations;
mod episodes;
mod holders;
mod rolling;
mod window;

use std::collections::HashMap;

use crate::FastMap;

pub use demand::{Calm, DemandSummary, Run, arrived_in};
pub use durations::{DurationSummary, Percentiles};
pub use episodes::{Attributed, CgroupSummary, OpenStop};
use episodes::{CgroupState, sort_attributed};
pub use holders::{HeldSummary, ProcessHeld};
pub use rolling::Rolling;
pub use window::IntervalSummary;
use window::Window;

use crate::records::{Deferred, EndedStop, Event, Period};

/// All cgroups' state for one trace.
#[derive(Debug, Default)]
pub struct Aggregate {
    cgroups: FastMap<u64, CgroupState>,
    /// The current interval, kept only for live views ([`Aggregate::with_intervals`]).
    window: Option<Window>,
    /// (quota owner, descendant) → the owner's ended stops that stopped the descendant's task.
    attributed: FastMap<(u64, u64), Attributed>,
    /// Per cgroup, its periods (tracepoint backend); reported only for cgroups with a summary.
    demand: FastMap<u64, demand::Demand>,
    /// Cgroups that never stopped whose periods were forgotten to stay bounded.
    forgotten_demand: u64,
    /// The machine's bandwidth slice, for the demand summaries.
    slice_ns: Option<u64>,
    /// Periods and deferred work are not taken ([`Aggregate::without_demand`]).
    no_demand: bool,
}

/// Cgroups that never stopped whose periods are kept (the latest to have one): a quota's
/// period timer runs whether or not the group has a task, so cgroups made and removed by the
/// hundred per second would otherwise each leave their periods behind.
const QUIET_DEMAND: usize = 1024;

impl Aggregate {
    /// An aggregate that reports `cgroups` even if they never stop: a cgroup the user named
    /// gets a summary saying "0 stops" rather than silence.
    pub fn watching(cgroups: &[u64]) -> Self {
        Self {
            cgroups: cgroups
                .iter()
                .map(|&id| (id, CgroupState::default()))
                .collect(),
            attributed: FastMap::default(),
            window: None,
            demand: FastMap::default(),
            forgotten_demand: 0,
            slice_ns: None,
            no_demand: false,
        }
    }

    /// Takes no periods and no deferred work, so that its summaries have no demand and no
    /// advice: for `serve`, whose exporter keeps each cgroup's demand over its rolling window,
    /// where the whole run's would keep up to 100,000 runs per cgroup for the summary at exit.
    pub fn without_demand(&mut self) {
        self.no_demand = true;
        self.demand.clear();
    }

    /// Reports `cgroup_id` even if it never stops, as [`watching`](Self::watching) does, keeping
    /// whatever it has already taken: a replayed recording learns the watched cgroups at its end.
    pub fn watch(&mut self, cgroup_id: u64) {
        self.state(cgroup_id);
    }

    /// Also keeps the stops of the current interval for [`Aggregate::take_interval`], leaving
    /// out stops and group stops shorter than `min_stop_ns` (the whole-run figures keep them).
    /// The machine's `sched_cfs_bandwidth_slice_us` (ns), which the demand summaries carry for
    /// the advice; `None`: not known.
    pub fn with_slice(mut self, slice_ns: Option<u64>) -> Self {
        self.set_slice(slice_ns);
        self
    }

    /// [`Aggregate::with_slice`], for a reader that learns it after it began (a recording's
    /// `start` line).
    pub fn set_slice(&mut self, slice_ns: Option<u64>) {
        self.slice_ns = slice_ns;
    }

    pub fn with_intervals(mut self, min_stop_ns: u64) -> Self {
        self.window = Some(Window::new(min_stop_ns));
        self
    }

    /// The stops of each cgroup since the last call (or the start); a new interval begins.
    /// Only cgroups with a stop or a group stop in the interval; always empty without
    /// [`Aggregate::with_intervals`].
    pub fn take_interval(&mut self) -> Vec<IntervalSummary> {
        self.window.as_mut().map_or_else(Vec::new, Window::take)
    }

    /// Takes one record. Returns the length (ns) of the group stop of the record's cgroup that it
    /// closed for good, if any: a group stop is final once a later episode begins after its end
    /// (docs/design.md, "Stops and group stops in userspace"), so a live reader sees each one
    /// once, one episode late. The last one is only recorded by [`Aggregate::finish`].
    pub fn ingest(&mut self, event: &Event) -> Option<u64> {
        let closed = match event {
            Event::Start(stop) => self.state(stop.cgroup_id).start(stop),
            Event::End(end) => {
                self.credit(end, |_| true);
                // Threads it held past those it lists: their deferred work is not known. Only
                // for a cgroup whose periods are measured (its period comes before the end):
                // an entry per stopped cgroup would cost every cgroup its demand's size.
                if end.stop.threads_unlisted > 0
                    && let Some(demand) = self.demand.get_mut(&end.stop.cgroup_id)
                {
                    demand.unknown_hold(end.stop.start_ns);
                }
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

    /// Takes one period record of a cgroup with a quota.
    pub fn ingest_period(&mut self, period: &Period) {
        if self.no_demand {
            return;
        }
        let ended = self
            .demand
            .entry(period.cgroup_id)
            .or_default()
            .period(period);
        if let (Some(window), Some(run)) = (&mut self.window, ended) {
            window.run(period.cgroup_id, run);
        }
        if self.demand.len() > self.cgroups.len() + 2 * QUIET_DEMAND {
            self.forget_quiet_demand();
        }
    }

    /// Takes one held thread's deferred work (a cgroup with a quota that stopped).
    pub fn ingest_deferred(&mut self, deferred: &Deferred) {
        if self.no_demand {
            return;
        }
        self.demand
            .entry(deferred.cgroup_id)
            .or_default()
            .deferred(deferred);
    }

    /// Forgets the periods of the cgroups that never stopped, all but the `QUIET_DEMAND` that
    /// had one last; amortised, since it runs once per `QUIET_DEMAND` new ones.
    fn forget_quiet_demand(&mut self) {
        let mut quiet: Vec<(u64, u64)> = self
            .demand
            .iter()
            .filter(|(id, _)| !self.cgroups.contains_key(id))
            .map(|(&id, d)| (d.last_end_ns(), id))
            .collect();
        quiet.sort_unstable();
        let excess = quiet.len().saturating_sub(QUIET_DEMAND);
        for &(_, id) in &quiet[..excess] {
            self.demand.remove(&id);
        }
        self.forgotten_demand += excess as u64;
    }

    /// Cgroups that never stopped whose periods were forgotten to stay bounded.
    pub fn forgotten_demand(&self) -> u64 {
        self.forgotten_demand
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
        self.demand.remove(&cgroup_id);
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
        let mut demand = std::mem::take(&mut self.demand);
        let mut out: Vec<CgroupSummary> = self
            .cgroups
            .into_iter()
            .map(|(id, state)| CgroupSummary {
                demand: demand.remove(&id).map(|d| d.finish(self.slice_ns)),
                ..state.finish(id, now_ns)
            })
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::records::{Bandwidth, EndReason, EndedStop, Stop};

    pub(super) const MS: u64 = durations::NS_PER_MS;

    #[test]
    fn a_watched_cgroup_that_never_stopped_still_has_a_summary() {
        let summaries = Aggregate::watching(&[42]).finish(10 * MS);
        assert_eq!(summaries.len(), 1);
        assert_eq!(summaries[0].cgroup_id, 42);
        assert_eq!(summaries[0].stops.count, 0);
        assert_eq!(summaries[0].stops.percentiles, None);
        assert_eq!(summaries[0].group_stops.sum_ns, 0);
    }

    pub(super) fn stop(cgroup_id: u64, cpu: u32, start_ns: u64) -> Stop {
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
            threads: Vec::new(),
            threads_unlisted: 0,
            kernel_start_clock: None,
        }
    }

    pub(crate) fn start(cg: u64, cpu: u32, s: u64) -> Event {
        Event::Start(stop(cg, cpu, s))
    }

    pub(crate) fn end(cg: u64, cpu: u32, s: u64, e: u64) -> Event {
        Event::End(EndedStop {
            stop: stop(cg, cpu, s),
            end_ns: e,
            kernel_ns: Some(e - s),
            reason: EndReason::Refill,
        })
    }

    /// An END of `owner`'s stop on `cpu` that stopped a task of `descendant`.
    pub(super) fn end_of(owner: u64, descendant: Option<u64>, cpu: u32, s: u64, e: u64) -> Event {
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
    pub(super) fn end_with_children(
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

    #[test]
    fn the_periods_of_cgroups_that_never_stop_are_bounded_and_the_forgotten_counted() {
        let mut agg = Aggregate::watching(&[]);
        // Cgroup 1 stops; 10,000 churned cgroups only send a period each, in turn.
        agg.ingest(&end(1, 0, 0, 10 * MS));
        for id in 2..10_002u64 {
            let mut p = crate::testing::period(200 + id, 10, 1, false);
            p.cgroup_id = id;
            agg.ingest_period(&p);
            let mut q = crate::testing::period(300 + id, 10, 1, false);
            q.cgroup_id = 1;
            agg.ingest_period(&q);
        }
        assert!(agg.demand.len() <= 1 + 2 * QUIET_DEMAND + 1);
        // Forgotten in batches, the oldest first: the latest ones and the stopped one remain.
        assert_eq!(agg.forgotten_demand() + agg.demand.len() as u64, 10_000 + 1);
        assert!(agg.demand.contains_key(&1) && agg.demand.contains_key(&10_001));
        assert!(!agg.demand.contains_key(&2));
        let s = agg.finish(20_000 * MS);
        assert_eq!(s[0].demand.as_ref().map(|d| d.periods), Some(10_000));
    }

    #[test]
    fn a_stop_with_threads_it_does_not_list_leaves_its_period_without_waiting_work() {
        let waiting = |unlisted: u32| {
            let mut agg = Aggregate::watching(&[]);
            let Event::End(mut stop) = end(1, 0, 150 * MS, 200 * MS) else {
                unreachable!()
            };
            stop.stop.threads_unlisted = unlisted;
            // The period's record comes at the timer's expiry, the stop's end after the refill.
            agg.ingest_period(&crate::testing::period(200, 50, 1, true));
            agg.ingest(&Event::End(stop));
            agg.ingest_period(&crate::testing::period(300, 20, 1, false));
            agg.ingest_deferred(&Deferred {
                cgroup_id: 1,
                tid: 7,
                since_ns: 150 * MS,
                ran_ns: 20 * MS,
                continues: false,
                unfollowed: false,
            });
            let s = agg.finish(300 * MS);
            s[0].demand.as_ref().map(|d| d.waiting.count)
        };
        assert_eq!(waiting(0), Some(1));
        assert_eq!(waiting(3), Some(0));
    }

    pub(super) fn run(events: &[Event], now_ns: u64) -> Vec<CgroupSummary> {
        let mut agg = Aggregate::watching(&[]);
        for ev in events {
            agg.ingest(ev);
        }
        agg.finish(now_ns)
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
}
