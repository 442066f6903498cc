//! Wall-clock time for the trace's CLOCK_MONOTONIC timestamps: UTC for the NDJSON lines, local time
//! of day for people. UTC is monotonic plus an offset read from both clocks together; the
//! [`Tracker`] reads it again before every drain and takes the new one when it moved by more than
//! [`STEP_BOUND_NS`] (a step of the wall clock). Why that holds, and how a step is reported:
//! docs/definitions.md ("Wall-clock time").

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How far the offset may move before it is a step: far above the reading's own error, far
/// below the 1 ms the wall-clock times are good to.
pub const STEP_BOUND_NS: i64 = 100_000;
/// A reading whose two monotonic reads are further apart than this (the thread was preempted
/// between them) is read again.
const READ_GAP_NS: u64 = 20_000;

/// One clock's reading, ns (both clocks read here are past 1970 and far from i64's end).
fn now_ns(clock: libc::clockid_t) -> i64 {
    i64::try_from(tracer_common::clock::clock_ns(clock)).unwrap_or(i64::MAX)
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// CLOCK_MONOTONIC ns when it was read.
    pub at_ns: u64,
    pub offset_ns: i64,
}

impl Reading {
    /// Reads the two clocks together: of three (monotonic, realtime, monotonic) triples, the
    /// one whose monotonic reads are closest; up to three more tries if even that one was
    /// preempted.
    pub fn now() -> Self {
        let triple = || {
            let before = now_ns(libc::CLOCK_MONOTONIC);
            let real = now_ns(libc::CLOCK_REALTIME);
            let after = now_ns(libc::CLOCK_MONOTONIC);
            let mid = before + (after - before) / 2;
            ((after - before).unsigned_abs(), mid, real - mid)
        };
        let mut best = triple();
        for attempt in 1..12 {
            if attempt >= 3 && best.0 <= READ_GAP_NS {
                break;
            }
            let next = triple();
            if next.0 < best.0 {
                best = next;
            }
        }
        Self {
            at_ns: best.1.unsigned_abs(),
            offset_ns: best.2,
        }
    }

    /// The Unix time (ns) of CLOCK_MONOTONIC `ns` at this offset.
    pub fn unix_ns(self, monotonic_ns: u64) -> i64 {
        i64::try_from(monotonic_ns)
            .unwrap_or(i64::MAX)
            .saturating_add(self.offset_ns)
    }
}

/// The wall clock's offset step the tracker saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub previous: Reading,
    pub now: Reading,
}

/// The offset in use for a run, re-read as it goes with `read` ([`Reading::now`] but in the
/// tests, which step a clock of their own).
pub struct Tracker<R = fn() -> Reading> {
    in_use: Reading,
    read: R,
}

impl Tracker {
    /// Reads the offset now: the one the run starts with.
    pub fn start() -> Self {
        Tracker::reading(Reading::now)
    }
}

impl<R: FnMut() -> Reading> Tracker<R> {
    /// Reads the offset with `read` now, and again at each [`Tracker::check`].
    pub fn reading(mut read: R) -> Self {
        Self {
            in_use: read(),
            read,
        }
    }

    pub fn in_use(&self) -> Reading {
        self.in_use
    }

    /// Reads the offset again; a [`Step`] (and the new offset in use) if it moved by more
    /// than [`STEP_BOUND_NS`].
    pub fn check(&mut self) -> Option<Step> {
        let now = (self.read)();
        if (now.offset_ns - self.in_use.offset_ns).abs() <= STEP_BOUND_NS {
            return None;
        }
        let step = Step {
            previous: self.in_use,
            now,
        };
        self.in_use = now;
        Some(step)
    }
}

/// A Unix time to the µs (ns truncated, as the NDJSON writes it), written as RFC 3339 UTC:
/// `2026-12-02T09:14:03.123456Z`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Utc(i64);

impl Utc {
    pub fn of_unix_ns(ns: i64) -> Self {
        Self(ns.div_euclid(1_000) * 1_000)
    }

    fn timestamp(self) -> Option<jiff::Timestamp> {
        jiff::Timestamp::from_nanosecond(i128::from(self.0)).ok()
    }
}

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.timestamp() {
            Some(t) => write!(f, "{t:.6}"),
            // Unix times jiff cannot hold (past the year 9999) never come from the clocks.
            None => write!(f, "unix {} ns", self.0),
        }
    }
}

impl Serialize for Utc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Utc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let t: jiff::Timestamp = text.parse().map_err(|e| {
            serde::de::Error::custom(format!("{text:?} is not an RFC 3339 time: {e}"))
        })?;
        i64::try_from(t.as_nanosecond())
            .map(Self::of_unix_ns)
            .map_err(|_| serde::de::Error::custom(format!("{text:?} is out of range")))
    }
}

#[cfg(test)]
impl proptest::arbitrary::Arbitrary for Utc {
    type Parameters = ();
    type Strategy = proptest::strategy::Map<std::ops::Range<i64>, fn(i64) -> Self>;

    fn arbitrary_with((): ()) -> Self::Strategy {
        // 1970 to 2100.
        proptest::strategy::Strategy::prop_map(0..4_102_444_800_000_000_000, Self::of_unix_ns)
    }
}

/// This machine's offset from UTC at Unix time `unix_ns`, in seconds (its time zone:
/// `TZ`, else /etc/localtime; UTC if neither says).
pub fn local_utc_offset_s(unix_ns: i64) -> i32 {
    Utc(unix_ns)
        .timestamp()
        .map_or(0, |t| jiff::tz::TimeZone::system().to_offset(t).seconds())
}

/// The local time of day of `unix_ns` at `utc_offset_s`, to the µs, with its date and offset:
/// `10:14:03.123456 (2026-12-02, UTC+01:00)`.
pub fn local_time(unix_ns: i64, utc_offset_s: i32) -> String {
    let zoned = jiff::tz::Offset::from_seconds(utc_offset_s)
        .ok()
        .zip(Utc(unix_ns).timestamp())
        .map(|(offset, t)| t.to_zoned_datetime(jiff::tz::TimeZone::fixed(offset)));
    match zoned {
        Some(z) => z.strftime("%H:%M:%S%.6f (%Y-%m-%d, UTC%:z)").to_string(),
        None => Utc(unix_ns).to_string(),
    }
}

/// The local time of day of `unix_ns` in this machine's time zone, to the ms: `10:14:03.123`.
pub fn local_time_of_day_ms(unix_ns: i64) -> String {
    match Utc(unix_ns).timestamp() {
        Some(t) => t
            .to_zoned_datetime(jiff::tz::TimeZone::system())
            .strftime("%H:%M:%S%.3f")
            .to_string(),
        None => Utc(unix_ns).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_is_rfc3339_to_the_microsecond_both_ways() {
        let t = Utc::of_unix_ns(1_764_666_843_123_456_789);
        assert_eq!(t, Utc(1_764_666_843_123_456_000));
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#""2025-12-02T09:14:03.123456Z""#);
        assert_eq!(serde_json::from_str::<Utc>(&json).unwrap(), t);
        assert_eq!(
            serde_json::to_string(&Utc::of_unix_ns(1_764_666_843_000_000_000)).unwrap(),
            r#""2025-12-02T09:14:03.000000Z""#
        );
        assert!(serde_json::from_str::<Utc>(r#""yesterday""#).is_err());
    }

    #[test]
    fn local_time_at_a_fixed_offset() {
        let ns = 1_764_666_843_123_456_789;
        assert_eq!(
            local_time(ns, 3600),
            "10:14:03.123456 (2025-12-02, UTC+01:00)"
        );
        assert_eq!(local_time(ns, 0), "09:14:03.123456 (2025-12-02, UTC+00:00)");
    }

    #[test]
    fn the_offset_is_the_realtime_clock_minus_the_monotonic_one() {
        let r = Reading::now();
        let real = now_ns(libc::CLOCK_REALTIME);
        let mono = now_ns(libc::CLOCK_MONOTONIC);
        // Read a moment later: the same offset, but for the clock reads' own spacing.
        assert!((real - mono - r.offset_ns).abs() < 1_000_000, "{r:?}");
        assert!(r.unix_ns(r.at_ns) > 1_700_000_000_000_000_000);
        // No step between two readings of a machine whose clock nobody sets.
        let mut tracker = Tracker::start();
        assert_eq!(tracker.check(), None);
    }

    /// The tracker on a clock the test steps itself: one reading at the start and one per
    /// check, 100 ms apart, at these offsets from 2025-12-02T09:14:03Z (ns).
    #[test]
    fn a_step_past_100_us_is_a_step_and_a_clock_step_line() {
        use crate::report::{Ndjson, Report};
        use crate::schema::Start;
        use crate::testing::MS;
        const BASE: i64 = 1_764_666_843_000_000_000;
        let offsets = [0, 50_000, -100_000, 100_001, 200_001, -2_000_000_000];
        let mut readings = (1..).zip(offsets).map(|(i, offset)| Reading {
            at_ns: i * 100 * MS,
            offset_ns: BASE + offset,
        });
        let mut tracker = Tracker::reading(move || readings.next().expect("a reading"));
        assert_eq!(tracker.in_use().offset_ns, BASE);
        // Up to 100 µs either way from the offset in use: NTP's slewing, not a step.
        assert_eq!(tracker.check(), None);
        assert_eq!(tracker.check(), None);
        assert_eq!(tracker.in_use().offset_ns, BASE);
        // 100.001 µs ahead: a step, and its offset in use from then on.
        let ahead = tracker.check().expect("a step of 100.001 µs");
        assert_eq!(
            (
                ahead.previous.offset_ns,
                ahead.now.offset_ns,
                ahead.now.at_ns
            ),
            (BASE, BASE + 100_001, 400 * MS)
        );
        assert_eq!(tracker.in_use(), ahead.now);
        // 100 µs past the new offset is within the bound of it.
        assert_eq!(tracker.check(), None);
        // 2 s back (settime): a step from the offset in use.
        let back = tracker.check().expect("a step of 2 s back");
        assert_eq!(back.previous, ahead.now);
        assert_eq!(back.now.offset_ns, BASE - 2_000_000_000);
        assert_eq!(tracker.in_use(), back.now);

        // What the run writes of it: a `clock_step` line after `start`.
        let mut out = Vec::new();
        let start = Start {
            start_ns: Some(100 * MS),
            realtime_offset_ns: Some(BASE),
            ..Start::default()
        };
        let mut report = Report::new(start, vec![Box::new(Ndjson::to(&mut out, None))]);
        report.clock_step(back);
        drop(report);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let [start, step] = &lines[..] else {
            panic!("{text}");
        };
        assert_eq!(start["start_utc"], "2025-12-02T09:14:03.100000Z");
        assert_eq!(step["type"], "clock_step");
        assert_eq!(step["at_ns"], 600 * MS);
        assert_eq!(step["realtime_offset_ns"], BASE - 2_000_000_000);
        assert_eq!(step["previous_realtime_offset_ns"], BASE + 100_001);
        assert_eq!(step["step_ns"], -2_000_100_001_i64);
        // 600 ms after the start of the monotonic clock, at the new offset.
        assert_eq!(step["at_unix_ns"], BASE - 1_400_000_000);
        assert_eq!(step["at_utc"], "2025-12-02T09:14:01.600000Z");
    }
}
