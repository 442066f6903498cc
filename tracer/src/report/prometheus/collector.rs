//! The scrape-time cpu.stat collector: it serves the sampler's last reading of every tracked
//! cgroup's cpu.stat, raw (what the file said, not a delta since the start), beside the
//! tracer's own figures.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Unit;

use super::labels::CgroupLabels;
use super::{NS_PER_S, SharedRef, lock};
use crate::cpustat::CpuStat;

/// A mirrored cpu.stat value: counts stay integers, times are seconds.
enum Counted {
    Int(u64),
    Float(f64),
}

/// One mirrored cpu.stat field: a counter family named under the registry's prefix.
struct Field {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    value: fn(&CpuStat) -> Counted,
}

/// The mirrored fields, in the order of the exposition.
static FIELDS: [Field; 3] = [
    Field {
        name: "cpustat_nr_periods",
        help: "cpu.stat nr_periods of the cgroup, as the kernel prints it now (32-bit, wraps)",
        unit: None,
        value: |s| Counted::Int(s.nr_periods),
    },
    Field {
        name: "cpustat_nr_throttled",
        help: "cpu.stat nr_throttled of the cgroup: periods that found a CPU stopped, not stops",
        unit: None,
        value: |s| Counted::Int(s.nr_throttled),
    },
    Field {
        name: "cpustat_throttled",
        help: "cpu.stat throttled time of the cgroup (Σ per-CPU stops on the kernel's clock)",
        unit: Some(Unit::Seconds),
        value: |s| Counted::Float(s.throttled_ns as f64 / NS_PER_S),
    },
];

/// Reads the stored readings only: no I/O under the lock, nor on the task that drains the ring
/// buffer (the sampler reads cpu.stat; `Exporter::update` stores it).
#[derive(Debug)]
pub(super) struct CpuStatCollector {
    pub(super) shared: SharedRef,
}

impl Collector for CpuStatCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let stats: Vec<(CgroupLabels, CpuStat)> = lock(&self.shared)
            .cgroups
            .values()
            .filter_map(|t| Some((t.labels.clone(), t.stat.clone()?)))
            .collect();
        for field in &FIELDS {
            let mut metric = encoder.encode_descriptor(
                field.name,
                field.help,
                field.unit.as_ref(),
                MetricType::Counter,
            )?;
            for (labels, stat) in &stats {
                let series = metric.encode_family(labels)?;
                match (field.value)(stat) {
                    Counted::Int(v) => ConstCounter::new(v).encode(series)?,
                    Counted::Float(v) => ConstCounter::new(v).encode(series)?,
                }
            }
        }
        Ok(())
    }
}
