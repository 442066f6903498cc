//! The JSON of `scan --json`: one [`Row`] per line. A stable interface like the tracer's NDJSON
//! (docs/ndjson.md, section `scan`): fields are added, never renamed or retyped; a missing
//! value is `null`. `name` objects are derived from the paths again when a row is read back.

use serde::{Deserialize, Serialize};

use crate::cpustat::CpuStat;
use crate::names::Name;
use crate::records::Bandwidth;
use crate::schema::CgroupRef;

/// One cgroup held by a CPU quota, its own or an ancestor's.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    #[serde(flatten)]
    pub cgroup: CgroupRef,
    pub status: Status,
    /// The window the counters cover (`--interval`); `null`: the counters' lifetime.
    pub window_ns: Option<u64>,
    /// Its own quota settings; `quota_ns: null` = none of its own.
    #[serde(flatten)]
    pub settings: Bandwidth,
    /// The tightest quota on its path to the root, which holds it.
    pub limit: Limit,
    /// Its own cpu.stat (and cpu.stat.local): the reading, or the window's deltas; `null`
    /// when it could not be read, or the cgroup was created or removed during the window.
    pub cpu_stat: Option<CpuStat>,
    /// CPU time its tasks used over the same span (v2 `usage_usec`, v1 `cpuacct.usage`).
    pub usage_ns: Option<u64>,
    /// Its own `nr_throttled / nr_periods`; `null` without periods of its own.
    #[cfg_attr(test, proptest(strategy = "proptest::option::of(0.0f64..=1.0)"))]
    pub throttled_ratio: Option<f64>,
    /// `usage_ns` as a fraction of what the limit allowed over the span (docs/definitions.md).
    #[cfg_attr(test, proptest(strategy = "proptest::option::of(0.0f64..1e6)"))]
    pub use_of_limit: Option<f64>,
}

/// Whether the cgroup existed through the whole window.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// In both readings (always, without `--interval`).
    Present,
    /// Only in the second reading: its counters are not the window's, and are left out.
    Created,
    /// Only in the first reading.
    Removed,
}

/// An effective limit: the quota with the fewest CPUs (quota / period) among the cgroup's own
/// and its ancestors', and whose it is.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    /// The cgroup whose quota it is.
    #[serde(flatten)]
    pub owner: CgroupRef,
    /// The row's own quota.
    pub own: bool,
    pub quota_ns: u64,
    pub period_ns: u64,
    /// `quota_ns / period_ns`.
    #[cfg_attr(test, proptest(strategy = "0.0f64..1e3"))]
    pub cpus: f64,
    /// The owner's `nr_throttled / nr_periods` over the same span.
    #[cfg_attr(test, proptest(strategy = "proptest::option::of(0.0f64..=1.0)"))]
    pub throttled_ratio: Option<f64>,
}

impl Row {
    /// The row as one line of JSON. A row holds strings, integers and finite floats only,
    /// which always serialize.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self)
            .unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}).to_string())
    }

    /// Reads a row back, naming its cgroups from their paths as [`Row::to_json`] wrote them.
    #[cfg(test)]
    pub fn parse(text: &str) -> serde_json::Result<Self> {
        let mut row: Self = serde_json::from_str(text)?;
        for cgroup in [&mut row.cgroup, &mut row.limit.owner] {
            cgroup.name = cgroup.path.as_deref().and_then(Name::of);
        }
        Ok(row)
    }

    /// What users call the cgroup, when its path says (`docker 0123456789ab`).
    pub fn label(&self) -> Option<String> {
        self.cgroup.name.as_ref().map(Name::to_string)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn rows_parse_back_to_themselves(mut row in any::<Row>()) {
            for cgroup in [&mut row.cgroup, &mut row.limit.owner] {
                cgroup.name = cgroup.path.as_deref().and_then(Name::of);
            }
            let text = row.to_json();
            prop_assert!(!text.contains('\n'));
            let back = Row::parse(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            prop_assert_eq!(&back, &row);
            prop_assert_eq!(back.to_json(), text);
        }
    }
}
