//! The work waiting at a cgroup's throttled period ends (docs/definitions.md, "Deferred work"),
//! from the `Deferred` records of the threads its stops held, and what it tells of a busy run: what
//! arrived in its first period. The whole trace's demand and the rolling window share it, so that
//! both give a run the same figure from the same records. A thread held again before it blocked
//! counts what it ran after that hold toward each hold of its chain: all of it was waiting at each.

use std::collections::VecDeque;
use std::num::NonZeroU64;

use crate::FastMap;
use crate::records::Deferred;

/// Holds one thread's unfinished work is followed through (one per throttled period).
const MAX_CHAIN: usize = 64;
/// Throttled periods whose work waiting can still grow: a hold's record comes when its thread
/// next sleeps or is held again, so a period is summed up once this many newer throttled
/// periods have ended (past `MAX_CHAIN`, no hold of it can still be followed).
pub(super) const RECENT: usize = 2 * MAX_CHAIN;

/// A throttled period, while holds of it may still report.
#[derive(Debug)]
struct Throttled {
    start_ns: u64,
    end_ns: u64,
    usage_ns: u64,
    /// Σ deferred work of its finished holds.
    waiting_ns: u64,
    /// Its holds seen and not finished.
    open: u32,
    /// A hold of it finished.
    seen: bool,
    /// A hold of it will never be known.
    unknown: bool,
}

impl Throttled {
    /// The work waiting at its end, if known: a hold of it finished and every one did.
    fn waiting(&self) -> Option<u64> {
        (self.seen && self.open == 0 && !self.unknown).then_some(self.waiting_ns)
    }
}

/// One cgroup's recent throttled periods and the holds of them still followed.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// The last `RECENT` throttled periods, in order.
    recent: VecDeque<Throttled>,
    /// Per thread, its holds whose work it has not finished: (since, ran so far) each.
    chains: FastMap<u32, Vec<(u64, u64)>>,
    /// Holds whose record came for no throttled period still open to it (older than the
    /// last `RECENT`, or a refill between period boundaries): not counted anywhere.
    pub holds_unplaced: u64,
}

impl Backlog {
    /// Takes a period of known usage that ended throttled; returns the work waiting at the end
    /// of the oldest one, summed up to make room, if it is known.
    pub(super) fn throttled(&mut self, start_ns: u64, end_ns: u64, usage_ns: u64) -> Option<u64> {
        let summed = if self.recent.len() == RECENT {
            self.sum_up_oldest()
        } else {
            None
        };
        self.recent.push_back(Throttled {
            start_ns,
            end_ns,
            usage_ns,
            waiting_ns: 0,
            open: 0,
            seen: false,
            unknown: false,
        });
        summed
    }

    /// Takes one held thread's deferred work.
    pub(super) fn deferred(&mut self, d: &Deferred) {
        if d.unfollowed {
            self.unknown_hold(d.since_ns);
            return;
        }
        if let Some(t) = self.throttled_at(d.since_ns) {
            t.open += 1;
        }
        let chain = self.chains.entry(d.tid).or_default();
        for (_, ran) in chain.iter_mut() {
            *ran = ran.saturating_add(d.ran_ns);
        }
        // A thread that never blocks (a CPU-bound loop) has no end to its deferred work: its
        // oldest hold's figure stays unknown.
        let oldest = (chain.len() == MAX_CHAIN).then(|| chain.remove(0).0);
        chain.push((d.since_ns, d.ran_ns));
        if let Some(since) = oldest {
            self.unknown_hold(since);
            if let Some(t) = self.throttled_at(since) {
                t.open = t.open.saturating_sub(1);
            }
        }
        if d.continues {
            return;
        }
        for (since, ns) in self.chains.remove(&d.tid).unwrap_or_default() {
            match self.throttled_at(since) {
                Some(t) => {
                    t.waiting_ns = t.waiting_ns.saturating_add(ns);
                    t.open = t.open.saturating_sub(1);
                    t.seen = true;
                }
                None => self.holds_unplaced += 1,
            }
        }
    }

    /// A hold at `since_ns` whose work is unknown: a thread past those a stop lists, a hold
    /// the programs could not follow, a chain too long to follow. Its period has no figure.
    pub(super) fn unknown_hold(&mut self, since_ns: u64) {
        match self.throttled_at(since_ns) {
            Some(t) => t.unknown = true,
            None => self.holds_unplaced += 1,
        }
    }

    /// What arrived in the first period of a run that has just ended, started at `start_ns`
    /// with `throttled_periods`: that period's usage and the work waiting at its end, when the
    /// latter is known by now (the run's throttled periods are the last ones taken).
    pub(super) fn first_arrived(
        &self,
        start_ns: u64,
        throttled_periods: u32,
    ) -> Option<NonZeroU64> {
        let back = usize::try_from(throttled_periods).ok()?;
        let first = self.recent.get(self.recent.len().checked_sub(back)?)?;
        if first.start_ns != start_ns {
            return None;
        }
        first
            .waiting()
            .and_then(|waiting| NonZeroU64::new(first.usage_ns.saturating_add(waiting)))
    }

    /// The recent throttled period a hold at `since_ns` began in.
    fn throttled_at(&mut self, since_ns: u64) -> Option<&mut Throttled> {
        let i = self.recent.partition_point(|t| t.end_ns < since_ns);
        self.recent.get_mut(i).filter(|t| t.start_ns < since_ns)
    }

    /// Sums up the oldest recent throttled period: the work waiting at its end, if known.
    fn sum_up_oldest(&mut self) -> Option<u64> {
        self.recent.pop_front()?.waiting()
    }

    /// Sums up every throttled period still recent: the work waiting at the end of each, where
    /// known, oldest first.
    pub(super) fn finish(&mut self) -> Vec<u64> {
        std::iter::from_fn(|| (!self.recent.is_empty()).then(|| self.sum_up_oldest()))
            .flatten()
            .collect()
    }
}
