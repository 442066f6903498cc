//! Reading and diffing cpu.stat and cpu.stat.local, and reading a cgroup's quota settings; what
//! the kernel counts in them is docs/kernel.md §3. Every time is normalised to ns and keeps its
//! origin ([`TimeUnit`]): a v2 delta (µs, truncated) is only good to ±1 µs, and a cross-check
//! must allow that. The period counters are the kernel's 32-bit `int`s, printed with `%d`: they
//! wrap, so deltas are taken modulo 2^32.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cgroups::Version;
use crate::records::Bandwidth;

const NS_PER_US: u64 = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum CpuStatError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: cannot parse {line:?}")]
    Parse { path: PathBuf, line: String },
    #[error("{path}: no {field} (is the cpu controller enabled for this cgroup?)")]
    Missing { path: PathBuf, field: &'static str },
    #[error("cpu.stat {field} went backwards (was the cgroup recreated?)")]
    WentBackwards { field: &'static str },
    #[error("cpu.stat could not be read at the start of the trace")]
    NoBaseline,
}

impl CpuStatError {
    /// The file could not be read for want of permission (its mode, or its directory's).
    pub fn is_denied(&self) -> bool {
        matches!(self, Self::Read { source, .. } if source.kind() == io::ErrorKind::PermissionDenied)
    }
}

/// The unit the kernel printed a time in; values here are always ns. Serialized as its
/// resolution in ns (0 or 1000), which is what a reader of the figures needs to know.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "u64", into = "u64")]
pub enum TimeUnit {
    /// cgroup v1: exact ns.
    Nanos,
    /// cgroup v2: µs, truncated.
    Micros,
}

impl TimeUnit {
    fn of(version: Version) -> Self {
        match version {
            Version::V1 => Self::Nanos,
            Version::V2 => Self::Micros,
        }
    }

    /// How far a difference of two readings can be from the true difference: each reading is
    /// truncated by less than one unit, so |error| < this many ns (0 for exact ns).
    pub fn resolution_ns(self) -> u64 {
        match self {
            Self::Nanos => 0,
            Self::Micros => NS_PER_US,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Self::Nanos => "_time",
            Self::Micros => "_usec",
        }
    }

    fn to_ns(self, v: u64) -> u64 {
        match self {
            Self::Nanos => v,
            Self::Micros => v.saturating_mul(NS_PER_US),
        }
    }
}

impl From<TimeUnit> for u64 {
    fn from(unit: TimeUnit) -> Self {
        unit.resolution_ns()
    }
}

impl From<u64> for TimeUnit {
    fn from(resolution_ns: u64) -> Self {
        if resolution_ns == 0 {
            Self::Nanos
        } else {
            Self::Micros
        }
    }
}

/// A cgroup's cpu.stat (and cpu.stat.local where the kernel has it): one reading, or the
/// difference of two ([`CpuStat::since`]). Times in ns, good to ±`unit.resolution_ns()`.
/// Optional fields are `None` where the kernel lacks them (in a difference: unless both
/// readings had them). This is also the NDJSON `cpu_stat` object, field for field.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuStat {
    /// A reading: the raw 32-bit counter (the kernel's `int`, reinterpreted); a difference:
    /// taken modulo 2^32.
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
    /// Written as `resolution_ns`: 0 for v1 (exact ns), 1000 for v2, whose µs readings make
    /// every time delta ±1 µs.
    #[serde(rename = "resolution_ns")]
    pub unit: TimeUnit,
    /// 5.16+.
    pub nr_bursts: Option<u64>,
    pub burst_ns: Option<u64>,
    /// cpu.stat.local `throttled_*` (6.6+): own or ancestor's quota.
    #[serde(rename = "throttled_local_ns")]
    pub local_throttled_ns: Option<u64>,
    /// v2 only: CPU time used (total, user, system).
    pub usage_ns: Option<u64>,
    pub user_ns: Option<u64>,
    pub system_ns: Option<u64>,
    /// v1 only, with schedstats on: Σ time the group's tasks waited runnable.
    pub wait_sum_ns: Option<u64>,
}

impl CpuStat {
    /// The reading of a cgroup that did not exist yet: the kernel starts every counter at 0.
    pub fn zero(unit: TimeUnit) -> Self {
        Self {
            unit,
            nr_periods: 0,
            nr_throttled: 0,
            throttled_ns: 0,
            nr_bursts: None,
            burst_ns: None,
            wait_sum_ns: None,
            usage_ns: None,
            user_ns: None,
            system_ns: None,
            local_throttled_ns: None,
        }
    }

    /// Reads `cpu.stat` and, if present, `cpu.stat.local` in the cgroup directory `dir`.
    pub fn read(dir: &Path, version: Version) -> Result<Self, CpuStatError> {
        let unit = TimeUnit::of(version);
        let mut stat = Self::read_counters(dir, version)?;
        let local = dir.join("cpu.stat.local");
        match fs::read_to_string(&local) {
            Ok(text) => {
                let fields = Fields::parse(&text);
                stat.local_throttled_ns = fields.time(&format!("throttled{}", unit.suffix()), unit);
            }
            // Kernels before 6.6 have no cpu.stat.local.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(CpuStatError::Read {
                    path: local,
                    source,
                });
            }
        }
        Ok(stat)
    }

    /// `cpu.stat` alone, without cpu.stat.local's `local_throttled_ns`.
    pub fn read_counters(dir: &Path, version: Version) -> Result<Self, CpuStatError> {
        let path = dir.join("cpu.stat");
        Self::parse(&read(&path)?, TimeUnit::of(version), &path)
    }

    /// One `cpu.stat`'s text (`path` is the file's, for the errors).
    pub(crate) fn parse(text: &str, unit: TimeUnit, path: &Path) -> Result<Self, CpuStatError> {
        let f = Fields::parse(text);
        let suffix = unit.suffix();
        let missing = |field| CpuStatError::Missing {
            path: path.to_owned(),
            field,
        };
        let (throttled, throttled_name) = match unit {
            TimeUnit::Nanos => (f.time("throttled_time", unit), "throttled_time"),
            TimeUnit::Micros => (f.time("throttled_usec", unit), "throttled_usec"),
        };
        Ok(Self {
            unit,
            nr_periods: f
                .counter("nr_periods")
                .ok_or_else(|| missing("nr_periods"))?,
            nr_throttled: f
                .counter("nr_throttled")
                .ok_or_else(|| missing("nr_throttled"))?,
            throttled_ns: throttled.ok_or_else(|| missing(throttled_name))?,
            nr_bursts: f.counter("nr_bursts"),
            burst_ns: f.time(&format!("burst{suffix}"), unit),
            wait_sum_ns: f.time("wait_sum", TimeUnit::Nanos),
            usage_ns: f.time("usage_usec", TimeUnit::Micros),
            user_ns: f.time("user_usec", TimeUnit::Micros),
            system_ns: f.time("system_usec", TimeUnit::Micros),
            local_throttled_ns: None,
        })
    }

    /// What happened between `earlier` and this reading.
    pub fn since(&self, earlier: &Self) -> Result<Self, CpuStatError> {
        let time = |field, now: u64, then: u64| {
            now.checked_sub(then)
                .ok_or(CpuStatError::WentBackwards { field })
        };
        let opt = |field, now: Option<u64>, then: Option<u64>| match (now, then) {
            (Some(now), Some(then)) => time(field, now, then).map(Some),
            _ => Ok(None),
        };
        Ok(Self {
            unit: self.unit,
            nr_periods: counter_delta(self.nr_periods, earlier.nr_periods),
            nr_throttled: counter_delta(self.nr_throttled, earlier.nr_throttled),
            throttled_ns: time("throttled", self.throttled_ns, earlier.throttled_ns)?,
            nr_bursts: self
                .nr_bursts
                .zip(earlier.nr_bursts)
                .map(|(now, then)| counter_delta(now, then)),
            burst_ns: opt("burst", self.burst_ns, earlier.burst_ns)?,
            wait_sum_ns: opt("wait_sum", self.wait_sum_ns, earlier.wait_sum_ns)?,
            usage_ns: opt("usage_usec", self.usage_ns, earlier.usage_ns)?,
            user_ns: opt("user_usec", self.user_ns, earlier.user_ns)?,
            system_ns: opt("system_usec", self.system_ns, earlier.system_ns)?,
            local_throttled_ns: opt(
                "cpu.stat.local throttled",
                self.local_throttled_ns,
                earlier.local_throttled_ns,
            )?,
        })
    }
}

/// `key value` lines. Unknown keys, and lines that are not `key integer`, are ignored: kernels
/// keep adding fields, and a missing field we need is reported by name instead.
struct Fields<'a>(HashMap<&'a str, i128>);

impl<'a> Fields<'a> {
    fn parse(text: &'a str) -> Self {
        Self(
            text.lines()
                .filter_map(|line| {
                    let (key, value) = line.split_once(' ')?;
                    Some((key, value.trim().parse::<i128>().ok()?))
                })
                .collect(),
        )
    }

    /// A kernel `int` counter printed with `%d`: keep its 32-bit pattern so wraps diff right.
    fn counter(&self, key: &str) -> Option<u64> {
        self.0.get(key).map(|&v| u64::from(v as u32))
    }

    /// A `u64` time printed with `%llu`, converted to ns.
    fn time(&self, key: &str, unit: TimeUnit) -> Option<u64> {
        let v = u64::try_from(*self.0.get(key)?).ok()?;
        Some(unit.to_ns(v))
    }
}

fn read(path: &Path) -> Result<String, CpuStatError> {
    fs::read_to_string(path).map_err(|source| CpuStatError::Read {
        path: path.to_owned(),
        source,
    })
}

/// A counter's growth from `then` to `now`: the kernel's counters are 32-bit, so a wrap between
/// the readings diffs right.
pub fn counter_delta(now: u64, then: u64) -> u64 {
    u64::from((now as u32).wrapping_sub(then as u32))
}

/// cgroup v2 `cpu.stat` `usage_usec` alone, in ns: what a cgroup whose cpu controller is not
/// enabled still has (its tasks are scheduled in an ancestor's groups, under that one's quota),
/// where [`CpuStat::read`] finds no period counters.
pub fn read_v2_usage(dir: &Path) -> Result<u64, CpuStatError> {
    let path = dir.join("cpu.stat");
    Fields::parse(&read(&path)?)
        .time("usage_usec", TimeUnit::Micros)
        .ok_or(CpuStatError::Missing {
            path,
            field: "usage_usec",
        })
}

/// The cgroup's current quota, period and burst, from its control files, in ns.
/// v1: `cpu.cfs_quota_us` (-1 = no limit), `cpu.cfs_period_us`, `cpu.cfs_burst_us` (5.14+).
/// v2: `cpu.max` ("max 100000" or "20000 100000"), `cpu.max.burst` (5.14+). The v2 root cgroup
/// has neither (an error here).
pub fn read_bandwidth(dir: &Path, version: Version) -> Result<Bandwidth, CpuStatError> {
    let optional = |name: &str| -> Result<Option<u64>, CpuStatError> {
        let path = dir.join(name);
        match fs::read_to_string(&path) {
            Ok(text) => parse_us(&path, &text),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(CpuStatError::Read { path, source }),
        }
    };
    match version {
        Version::V1 => {
            let quota = dir.join("cpu.cfs_quota_us");
            let period = dir.join("cpu.cfs_period_us");
            Ok(Bandwidth {
                quota_ns: parse_us(&quota, &read(&quota)?)?,
                period_ns: parse_us(&period, &read(&period)?)?,
                burst_ns: optional("cpu.cfs_burst_us")?,
            })
        }
        Version::V2 => {
            let path = dir.join("cpu.max");
            let (quota_ns, period_ns) = parse_max(&path, &read(&path)?)?;
            Ok(Bandwidth {
                quota_ns,
                period_ns,
                burst_ns: optional("cpu.max.burst")?,
            })
        }
    }
}

/// One µs setting (`cpu.cfs_*_us`, a half of `cpu.max`, `cpu.max.burst`) in ns; `None` for
/// no limit (`max`, v1's `-1`). `path` is the file's, for the error.
pub(crate) fn parse_us(path: &Path, text: &str) -> Result<Option<u64>, CpuStatError> {
    match text.trim() {
        "max" | "-1" => Ok(None),
        v => v
            .parse::<u64>()
            .map(|v| Some(v.saturating_mul(NS_PER_US)))
            .map_err(|_| CpuStatError::Parse {
                path: path.to_owned(),
                line: text.trim().to_owned(),
            }),
    }
}

/// v2 `cpu.max`, `"<quota|max> <period>"`: the quota and period in ns.
pub(crate) fn parse_max(
    path: &Path,
    text: &str,
) -> Result<(Option<u64>, Option<u64>), CpuStatError> {
    let (quota, period) = text
        .trim()
        .split_once(' ')
        .ok_or_else(|| CpuStatError::Parse {
            path: path.to_owned(),
            line: text.trim().to_owned(),
        })?;
    Ok((parse_us(path, quota)?, parse_us(path, period)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 6.18 (this host), v1 child after a busy loop under 20 ms / 100 ms.
    const V1_BURST: &str = "\
nr_periods 21
nr_throttled 21
throttled_time 1679036211
nr_bursts 0
burst_time 0
";
    /// 5.4, v1 with schedstats on (wait_sum), no burst fields.
    const V1_OLD: &str = "\
nr_periods 4
nr_throttled -2147483647
throttled_time 300000000
wait_sum 12345
";
    /// 6.1, v2 child.
    const V2_BURST: &str = "\
usage_usec 10637208
user_usec 10600000
system_usec 37208
core_sched.force_idle_usec 0
nr_periods 33
nr_throttled 33
throttled_usec 4475123
nr_bursts 2
burst_usec 1500
";
    /// 5.10, v2 child, no burst fields.
    const V2_OLD: &str = "\
usage_usec 2000
user_usec 1500
system_usec 500
nr_periods 5
nr_throttled 1
throttled_usec 80001
";

    fn p() -> PathBuf {
        PathBuf::from("cpu.stat")
    }

    #[test]
    fn v1_with_and_without_burst() {
        let s = CpuStat::parse(V1_BURST, TimeUnit::Nanos, &p()).unwrap();
        assert_eq!((s.nr_periods, s.nr_throttled), (21, 21));
        assert_eq!(s.throttled_ns, 1_679_036_211);
        assert_eq!((s.nr_bursts, s.burst_ns), (Some(0), Some(0)));
        assert_eq!((s.usage_ns, s.wait_sum_ns), (None, None));

        let s = CpuStat::parse(V1_OLD, TimeUnit::Nanos, &p()).unwrap();
        assert_eq!(
            s.nr_throttled, 0x8000_0001,
            "negative %d keeps its bit pattern"
        );
        assert_eq!((s.nr_bursts, s.burst_ns), (None, None));
        assert_eq!(s.wait_sum_ns, Some(12_345));
    }

    #[test]
    fn v2_normalised_to_ns() {
        let s = CpuStat::parse(V2_BURST, TimeUnit::Micros, &p()).unwrap();
        assert_eq!(s.throttled_ns, 4_475_123_000);
        assert_eq!((s.nr_bursts, s.burst_ns), (Some(2), Some(1_500_000)));
        assert_eq!(s.usage_ns, Some(10_637_208_000));
        assert_eq!(
            (s.user_ns, s.system_ns),
            (Some(10_600_000_000), Some(37_208_000))
        );
        assert_eq!(s.unit.resolution_ns(), 1_000);

        let s = CpuStat::parse(V2_OLD, TimeUnit::Micros, &p()).unwrap();
        assert_eq!(
            (s.nr_periods, s.nr_throttled, s.throttled_ns),
            (5, 1, 80_001_000)
        );
        assert_eq!((s.nr_bursts, s.burst_ns), (None, None));
    }

    #[test]
    fn wrong_version_or_garbage_is_an_error() {
        assert!(matches!(
            CpuStat::parse(V2_OLD, TimeUnit::Nanos, &p()),
            Err(CpuStatError::Missing {
                field: "throttled_time",
                ..
            })
        ));
        // The v2 root (or a cgroup without the cpu controller) has only usage.
        assert!(matches!(
            CpuStat::parse(
                "usage_usec 1\nuser_usec 1\nsystem_usec 0\n",
                TimeUnit::Micros,
                &p()
            ),
            Err(CpuStatError::Missing {
                field: "nr_periods",
                ..
            })
        ));
        assert!(matches!(
            CpuStat::parse("nr_periods x\nnr_throttled 1\n", TimeUnit::Nanos, &p()),
            Err(CpuStatError::Missing {
                field: "nr_periods",
                ..
            })
        ));
    }

    #[test]
    fn delta_wraps_counters_and_rejects_time_going_back() {
        let before = CpuStat::parse(V1_OLD, TimeUnit::Nanos, &p()).unwrap();
        let mut after = before.clone();
        after.nr_periods = before.nr_periods.wrapping_add(10);
        after.nr_throttled = 0xFFFF_FFFF; // -1 as %d
        after.throttled_ns += 5_000;
        after.wait_sum_ns = None;
        let d = after.since(&before).unwrap();
        assert_eq!(d.nr_periods, 10);
        assert_eq!(d.nr_throttled, 0x7FFF_FFFE);
        assert_eq!(d.throttled_ns, 5_000);
        assert_eq!(d.wait_sum_ns, None, "needs both readings");

        let mut wrapped = before.clone();
        wrapped.nr_periods = u64::from(u32::MAX - 1);
        let mut next = wrapped.clone();
        next.nr_periods = 3; // past i32::MAX -> negative -> past u32::MAX
        assert_eq!(next.since(&wrapped).unwrap().nr_periods, 5);

        assert!(matches!(
            before.since(&after),
            Err(CpuStatError::WentBackwards { .. })
        ));
    }

    #[test]
    fn files_in_a_cgroup_directory() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("cpu.stat"), V1_BURST).unwrap();
        fs::write(d.join("cpu.cfs_quota_us"), "20000\n").unwrap();
        fs::write(d.join("cpu.cfs_period_us"), "100000\n").unwrap();
        let s = CpuStat::read(d, Version::V1).unwrap();
        assert_eq!(s.local_throttled_ns, None);
        fs::write(d.join("cpu.stat.local"), "throttled_time 1679000000\n").unwrap();
        let s = CpuStat::read(d, Version::V1).unwrap();
        assert_eq!(s.local_throttled_ns, Some(1_679_000_000));
        let bw = read_bandwidth(d, Version::V1).unwrap();
        assert_eq!(
            bw,
            Bandwidth {
                quota_ns: Some(20_000_000),
                period_ns: Some(100_000_000),
                burst_ns: None
            }
        );
        fs::write(d.join("cpu.cfs_quota_us"), "-1\n").unwrap();
        fs::write(d.join("cpu.cfs_burst_us"), "5000\n").unwrap();
        let bw = read_bandwidth(d, Version::V1).unwrap();
        assert_eq!((bw.quota_ns, bw.burst_ns), (None, Some(5_000_000)));

        fs::write(d.join("cpu.stat"), V2_BURST).unwrap();
        fs::write(d.join("cpu.stat.local"), "throttled_usec 4475000\n").unwrap();
        fs::write(d.join("cpu.max"), "max 100000\n").unwrap();
        let s = CpuStat::read(d, Version::V2).unwrap();
        assert_eq!(s.local_throttled_ns, Some(4_475_000_000));
        let bw = read_bandwidth(d, Version::V2).unwrap();
        assert_eq!(
            (bw.quota_ns, bw.period_ns, bw.burst_ns),
            (None, Some(100_000_000), None)
        );
        fs::write(d.join("cpu.max"), "20000 100000\n").unwrap();
        fs::write(d.join("cpu.max.burst"), "0\n").unwrap();
        let bw = read_bandwidth(d, Version::V2).unwrap();
        assert_eq!((bw.quota_ns, bw.burst_ns), (Some(20_000_000), Some(0)));
        fs::write(
            d.join("cpu.stat"),
            "usage_usec 7\nuser_usec 5\nsystem_usec 2\n",
        )
        .unwrap();
        assert_eq!(read_v2_usage(d).unwrap(), 7_000);
        assert!(CpuStat::read(d, Version::V2).is_err());
        fs::write(d.join("cpu.max"), "20000\n").unwrap();
        assert!(matches!(
            read_bandwidth(d, Version::V2),
            Err(CpuStatError::Parse { .. })
        ));
    }

    proptest::proptest! {
        /// Whatever a cpu.stat holds: an error or a reading, never a panic; and a well-formed
        /// one reads back its own numbers (the kernel's counters are 32-bit).
        #[test]
        fn any_cpu_stat_text_parses_or_errs(text in "\\PC*", unit: TimeUnit) {
            let _ = CpuStat::parse(&text, unit, Path::new("cpu.stat"));
        }

        #[test]
        fn well_formed_cpu_stat_reads_its_numbers(
            periods: u32, throttled: u32, time in 0u64..u64::MAX / 1000, junk in "[a-z_]{1,12} -?[0-9]{1,20}"
        ) {
            let text = format!(
                "nr_periods {periods}\n{junk}\nnr_throttled {throttled}\nthrottled_usec {time}\n"
            );
            let s = CpuStat::parse(&text, TimeUnit::Micros, Path::new("cpu.stat")).unwrap();
            proptest::prop_assert_eq!(s.nr_periods, u64::from(periods));
            proptest::prop_assert_eq!(s.nr_throttled, u64::from(throttled));
            proptest::prop_assert_eq!(s.throttled_ns, time * 1000);
        }

        /// Whatever cpu.max / cpu.cfs_quota_us hold: an error or settings, never a panic.
        #[test]
        fn any_bandwidth_file_reads_or_errs(quota in "\\PC{0,40}", period in "\\PC{0,24}") {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            fs::write(d.join("cpu.max"), format!("{quota} {period}")).unwrap();
            fs::write(d.join("cpu.cfs_quota_us"), &quota).unwrap();
            fs::write(d.join("cpu.cfs_period_us"), &period).unwrap();
            let _ = read_bandwidth(d, Version::V2);
            let _ = read_bandwidth(d, Version::V1);
        }
    }
}
