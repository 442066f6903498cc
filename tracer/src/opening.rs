//! Where the trace's window opens: at each cgroup's cpu.stat baseline, not at the attach. The
//! kernel adds a stop's time to cpu.stat when it ends, so a stop that ended before its group's
//! reading is in the baseline already: its records are dropped here, so that the window's
//! figures and its cpu.stat deltas hold the same stops (it matters when the tracer starts in the
//! middle of an incident). An end stamped within [`LAG_NS`] of the reading may lie on either
//! side of it (the stamp follows the unthrottle a little): that group is read again.
use std::collections::HashSet;

use aya::maps::{MapData, RingBuf};
use log::debug;

use crate::{
    cgroups::Hierarchy,
    records::{self, Event, Record, RecordError},
    sampler::{Baseline, Sampler},
};

/// How long after the kernel's unthrottle an end record may be stamped: the rest of the refill
/// callback (`distribute_cfs_runtime` over every stopped CPU) before its exit tracepoint.
pub const LAG_NS: u64 = 5_000_000;

/// Readings of a group retried before its ambiguous end is taken as after it.
const ATTEMPTS: usize = 8;

/// A record with its decoding result, as drained.
pub type Drained = Result<Record, RecordError>;

/// Reads what the ring buffer holds once every end stamped up to [`LAG_NS`] after the baseline
/// can be in it, re-reading the groups with an end too close to their reading; returns every
/// record drained, in order, for [`before_window`] to sort.
pub fn settle(
    ring: &mut RingBuf<MapData>,
    baseline: &mut Baseline,
    sampler: &Sampler,
    hierarchy: &mut Hierarchy,
) -> Vec<Drained> {
    let mut drained = Vec::new();
    for _ in 0..ATTEMPTS {
        let ready = baseline.read_until_ns().saturating_add(LAG_NS);
        let now = records::monotonic_now_ns();
        if ready > now {
            std::thread::sleep(std::time::Duration::from_nanos(ready - now));
        }
        while let Some(item) = ring.next() {
            drained.push(Record::parse(&item));
        }
        let again = ambiguous(&drained, baseline);
        if again.is_empty() {
            break;
        }
        debug!("cpu.stat read again for {again:?}: a stop ended while it was read");
        baseline.read(sampler, &Sampler::targets(hierarchy, again));
    }
    drained
}

/// A stop's end: its group and its stamp.
fn end_of(record: &Drained) -> Option<(u64, u64)> {
    match record {
        Ok(Record::Stop(Event::End(end))) => Some((end.stop.cgroup_id, end.end_ns)),
        Ok(Record::Stop(Event::UnseenStartEnd {
            cgroup_id, end_ns, ..
        })) => Some((*cgroup_id, *end_ns)),
        _ => None,
    }
}

/// Groups with an end stamped from the start of their reading to [`LAG_NS`] after its end.
fn ambiguous(drained: &[Drained], baseline: &Baseline) -> Vec<u64> {
    let mut groups: Vec<u64> = drained
        .iter()
        .filter_map(end_of)
        .filter(|&(id, end_ns)| {
            baseline
                .read_ns(id)
                .is_some_and(|(from, to)| end_ns > from && end_ns <= to.saturating_add(LAG_NS))
        })
        .map(|(id, _)| id)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// For each record of `drained`, whether it belongs before the window: an end stamped before
/// its group's reading began, and the start of that same stop.
pub fn before_window(drained: &[Drained], baseline: &Baseline) -> Vec<bool> {
    let before =
        |id: u64, end_ns: u64| baseline.read_ns(id).is_some_and(|(from, _)| end_ns <= from);
    let ended: HashSet<(u64, u32, u64)> = drained
        .iter()
        .filter_map(|r| match r {
            Ok(Record::Stop(Event::End(end))) if before(end.stop.cgroup_id, end.end_ns) => {
                Some((end.stop.cgroup_id, end.stop.cpu, end.stop.start_ns))
            }
            _ => None,
        })
        .collect();
    let dropped: Vec<bool> = drained
        .iter()
        .map(|r| match r {
            Ok(Record::Stop(Event::Start(s))) => ended.contains(&(s.cgroup_id, s.cpu, s.start_ns)),
            _ => end_of(r).is_some_and(|(id, end_ns)| before(id, end_ns)),
        })
        .collect();
    debug!(
        "{} record(s) of stops that ended before their group's cpu.stat baseline left out",
        dropped.iter().filter(|&&d| d).count()
    );
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::tests::{end, start};

    const MS: u64 = 1_000_000;

    fn baseline_read_at(id: u64, from: u64, to: u64) -> Baseline {
        let mut b = Baseline::default();
        b.set_read_ns(id, from, to);
        b
    }

    fn unseen(cgroup_id: u64, end_ns: u64) -> Drained {
        Ok(Record::Stop(Event::UnseenStartEnd {
            cgroup_id,
            cpu: 0,
            end_ns,
            kernel_ns: Some(end_ns),
        }))
    }

    #[test]
    fn stops_ended_before_the_reading_are_left_out_with_their_starts() {
        // Group 7 read from 100 to 101 ms; group 9 never read (created later).
        let b = baseline_read_at(7, 100 * MS, 101 * MS);
        let drained: Vec<Drained> = vec![
            unseen(7, 50 * MS),
            Ok(Record::Stop(start(7, 1, 60 * MS))),
            Ok(Record::Stop(end(7, 1, 60 * MS, 90 * MS))),
            Ok(Record::Stop(start(7, 0, 95 * MS))),
            unseen(7, 120 * MS),
            Ok(Record::Stop(end(9, 0, 10 * MS, 20 * MS))),
            Ok(Record::Stop(end(7, 0, 95 * MS, 180 * MS))),
            Err(RecordError::UnknownKind(9)),
        ];
        assert_eq!(
            before_window(&drained, &b),
            [true, true, true, false, false, false, false, false]
        );
    }

    #[test]
    fn an_end_during_or_just_after_the_reading_makes_it_read_again() {
        let b = baseline_read_at(7, 100 * MS, 101 * MS);
        for (end_ns, again) in [
            (100 * MS, false),
            (100 * MS + 1, true),
            (101 * MS + LAG_NS, true),
            (101 * MS + LAG_NS + 1, false),
        ] {
            assert_eq!(
                ambiguous(&[unseen(7, end_ns)], &b).len(),
                usize::from(again),
                "{end_ns}"
            );
        }
    }
}
