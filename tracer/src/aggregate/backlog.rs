//! The work waiting at a cgroup's throttled period ends (docs/definitions.md, "Deferred work"),
//! from the `Deferred` records of the threads its stops held, and what it tells of a busy run: what
//! arrived in its first period. The whole trace's demand and the rolling window share it, so that
//! both give a run the same figure from the same records. A thread held again before it blocked
//! counts what it ran after that hold toward each hold of its chain: all of it was waiting at each.
//! A record can come before the period its hold began in (a refill between boundaries lets the
//! thread run and sleep first): it waits for that period's record.

use std::collections::VecDeque;
use std::num::NonZeroU64;

use crate::FastMap;
use crate::records::{Deferred, Period};

/// Holds one thread's unfinished work is followed through (one per throttled period).
const MAX_CHAIN: usize = 64;
/// Throttled periods whose work waiting can still grow: a hold's record comes when its thread
/// next sleeps or is held again, so a period is summed up once this many newer throttled
/// periods have ended (past `MAX_CHAIN`, no hold of it can still be followed).
pub(super) const RECENT: usize = 2 * MAX_CHAIN;
/// Records kept waiting for their hold's period (they come only after a refill between
/// boundaries, before that period's end); past this the oldest is taken as it is.
const MAX_EARLY: usize = 256;

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

/// What is known of a hold: its thread's deferred work, or that its work is unknown.
#[derive(Debug)]
enum Hold {
    Deferred(Deferred),
    Unknown { since_ns: u64 },
}

impl Hold {
    fn since_ns(&self) -> u64 {
        match self {
            Self::Deferred(d) => d.since_ns,
            Self::Unknown { since_ns } => *since_ns,
        }
    }
}

/// One cgroup's recent throttled periods and the holds of them still followed.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// The last `RECENT` throttled periods, in order.
    recent: VecDeque<Throttled>,
    /// The end of the last period taken, throttled or not.
    last_end_ns: u64,
    /// Holds that began after `last_end_ns`, in the order they came (a thread's records stay
    /// in order behind them).
    early: VecDeque<Hold>,
    /// Per thread, its holds whose work it has not finished: (since, ran so far) each.
    chains: FastMap<u32, Vec<(u64, u64)>>,
    /// Holds whose record came for no throttled period still open to it (older than the
    /// last `RECENT`, or a refill between period boundaries): not counted anywhere.
    pub holds_unplaced: u64,
}

impl Backlog {
    /// Takes a period (they come in order). Returns the work waiting at the end of the oldest
    /// throttled one, summed up to make room, if it is known.
    pub(super) fn period(&mut self, p: &Period) -> Option<u64> {
        let mut summed = None;
        if let Some(start_ns) = p.start_ns.filter(|_| p.throttled_cpus > 0) {
            if self.recent.len() == RECENT {
                summed = self.sum_up_oldest();
            }
            self.recent.push_back(Throttled {
                start_ns,
                end_ns: p.end_ns,
                usage_ns: p.usage_ns,
                waiting_ns: 0,
                open: 0,
                seen: false,
                unknown: false,
            });
        }
        self.last_end_ns = p.end_ns;
        while let Some(hold) = self.early.pop_front_if(|h| h.since_ns() <= p.end_ns) {
            self.place(hold);
        }
        summed
    }

    /// Takes one held thread's deferred work.
    pub(super) fn deferred(&mut self, d: &Deferred) {
        self.take(Hold::Deferred(*d));
    }

    /// A hold at `since_ns` whose work is unknown: a thread past those a stop lists, a hold
    /// the programs could not follow, a chain too long to follow. Its period has no figure.
    pub(super) fn unknown_hold(&mut self, since_ns: u64) {
        self.take(Hold::Unknown { since_ns });
    }

    /// Places a hold now, or keeps it until its period is taken.
    fn take(&mut self, hold: Hold) {
        if self.early.is_empty() && hold.since_ns() <= self.last_end_ns {
            self.place(hold);
            return;
        }
        if self.early.len() == MAX_EARLY
            && let Some(oldest) = self.early.pop_front()
        {
            self.place(oldest);
        }
        self.early.push_back(hold);
    }

    fn place(&mut self, hold: Hold) {
        match hold {
            Hold::Deferred(d) if d.unfollowed => self.mark_unknown(d.since_ns),
            Hold::Deferred(d) => self.follow(&d),
            Hold::Unknown { since_ns } => self.mark_unknown(since_ns),
        }
    }

    fn follow(&mut self, d: &Deferred) {
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
            self.mark_unknown(since);
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

    fn mark_unknown(&mut self, since_ns: u64) {
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
        while let Some(hold) = self.early.pop_front() {
            self.place(hold);
        }
        std::iter::from_fn(|| (!self.recent.is_empty()).then(|| self.sum_up_oldest()))
            .flatten()
            .collect()
    }
}
