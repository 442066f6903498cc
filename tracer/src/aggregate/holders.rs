//! Which processes and threads one cgroup's stops held, and for how long. A thread's wait runs from
//! when the stop held it to the stop's end ([`EndedStop::held_ns`]); a process's wait in a stop is
//! its longest thread's, since all of them resume together at the unthrottle. Sums and percentiles
//! are over those per-stop waits (docs/definitions.md, "Threads held").

use std::collections::{BTreeMap, HashMap};

use super::durations::{DurationSummary, Durations};
use crate::records::EndedStop;

/// The held threads of one cgroup's ended stops, by process.
#[derive(Debug, Default)]
pub(super) struct Holders {
    processes: HashMap<u32, ProcessState>,
    /// Σ over ended stops of the threads held but not named.
    unlisted: u64,
}

#[derive(Debug, Default)]
struct ProcessState {
    /// The main thread's comm once seen, else the first thread's.
    comm: String,
    waits: Durations,
    threads: HashMap<u32, ThreadHeld>,
}

/// One thread's stops and wait, in a [`ProcessHeld`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadHeld {
    pub tid: u32,
    pub comm: String,
    pub stops: u64,
    /// Σ of its waits, CLOCK_MONOTONIC ns.
    pub held_ns: u64,
}

/// One process's stops and wait (see the module doc), its threads most held first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessHeld {
    pub pid: u32,
    pub comm: String,
    /// `count` = stops that held any of its threads, `sum_ns` = its held time.
    pub waits: DurationSummary,
    pub threads: Vec<ThreadHeld>,
}

/// What [`Holders::finish`] hands to the summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldSummary {
    /// Most held first.
    pub processes: Vec<ProcessHeld>,
    /// Σ over the ended stops of threads held but not named (`Stop::threads_unlisted`).
    pub unlisted: u64,
}

impl Holders {
    pub(super) fn record(&mut self, end: &EndedStop) {
        self.unlisted = self
            .unlisted
            .saturating_add(u64::from(end.stop.threads_unlisted));
        let mut longest: BTreeMap<u32, u64> = BTreeMap::new();
        for t in &end.stop.threads {
            let held = end.held_ns(t);
            let process = self.processes.entry(t.pid).or_default();
            if process.comm.is_empty() || t.tid == t.pid {
                process.comm.clone_from(&t.comm);
            }
            let thread = process.threads.entry(t.tid).or_insert_with(|| ThreadHeld {
                tid: t.tid,
                comm: t.comm.clone(),
                ..ThreadHeld::default()
            });
            thread.stops += 1;
            thread.held_ns = thread.held_ns.saturating_add(held);
            let l = longest.entry(t.pid).or_default();
            *l = (*l).max(held);
        }
        for (pid, held) in longest {
            if let Some(p) = self.processes.get_mut(&pid) {
                p.waits.record(held);
            }
        }
    }

    pub(super) fn finish(&self) -> HeldSummary {
        let mut processes: Vec<ProcessHeld> = self
            .processes
            .iter()
            .map(|(&pid, p)| {
                let mut threads: Vec<ThreadHeld> = p.threads.values().cloned().collect();
                threads.sort_by(|a, b| b.held_ns.cmp(&a.held_ns).then(a.tid.cmp(&b.tid)));
                ProcessHeld {
                    pid,
                    comm: p.comm.clone(),
                    waits: p.waits.summary(),
                    threads,
                }
            })
            .collect();
        processes.sort_by(|a, b| b.waits.sum_ns.cmp(&a.waits.sum_ns).then(a.pid.cmp(&b.pid)));
        HeldSummary {
            processes,
            unlisted: self.unlisted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::tests::{MS, stop};
    use crate::records::{EndReason, HeldThread};

    fn held(pid: u32, tid: u32, since_ns: u64) -> HeldThread {
        HeldThread {
            pid,
            tid,
            comm: format!("t{tid}"),
            since_ns,
        }
    }

    fn ended(start: u64, end: u64, threads: Vec<HeldThread>, unlisted: u32) -> EndedStop {
        let mut s = stop(7, 0, start * MS);
        s.threads = threads;
        s.threads_unlisted = unlisted;
        EndedStop {
            stop: s,
            end_ns: end * MS,
            kernel_ns: None,
            reason: EndReason::Refill,
        }
    }

    #[test]
    fn a_process_waits_as_long_as_its_longest_held_thread_per_stop() {
        let mut h = Holders::default();
        // Stop 1: pid 10's main thread from the start, its thread 11 from 30 ms in.
        h.record(&ended(
            0,
            80,
            vec![held(10, 10, 0), held(10, 11, 30 * MS)],
            0,
        ));
        // Stop 2: only thread 11, and one unnamed thread.
        h.record(&ended(100, 170, vec![held(10, 11, 100 * MS)], 1));
        // A since before the start (a refill's walk saw it first) counts from the start.
        h.record(&ended(200, 240, vec![held(20, 21, 150 * MS)], 0));
        let s = h.finish();
        assert_eq!(s.unlisted, 1);
        let p10 = &s.processes[0];
        assert_eq!((p10.pid, p10.comm.as_str()), (10, "t10"));
        assert_eq!((p10.waits.count, p10.waits.sum_ns), (2, 150 * MS));
        let t: Vec<(u32, u64, u64)> = p10
            .threads
            .iter()
            .map(|t| (t.tid, t.stops, t.held_ns))
            .collect();
        assert_eq!(t, vec![(11, 2, 120 * MS), (10, 1, 80 * MS)]);
        assert_eq!(s.processes[1].waits.sum_ns, 40 * MS);
        assert_eq!(s.processes[1].comm, "t21");
    }
}
