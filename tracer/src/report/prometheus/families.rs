//! The metric families the run loop writes, as one table ([`TABLE`]): each family's name, help
//! and unit, and whether it has a series per tracked cgroup. Registration and the per-cgroup
//! creation and removal of series are all derived from it.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{
    Histogram, NativeHistogramConfig, exponential_buckets,
};
use prometheus_client::registry::{Metric, Registry, Unit};

use super::labels::{CgroupLabels, DropLabels};

/// Histogram bounds: 1 ms × 2^k for k = 0..=12, i.e. up to 4.096 s (then +Inf).
const BUCKET_START_S: f64 = 0.001;
const BUCKET_COUNT: u16 = 13;
/// The native buckets' growth factor: the crate picks the largest power-of-two schema whose
/// factor is at most this, schema 3 (2^(1/8) ≈ 1.09, 8 buckets per doubling). A bucket spans
/// 9% of its lower bound, so a quantile taken at its middle is off by at most (f − 1)/(f + 1)
/// ≈ 4.3%, against 33% for the classic ×2 buckets: ~80 ms and ~85 ms stops (quotas of 20 and
/// 15 ms at a 100 ms period)
/// fall in different buckets, where the classic ones share (64 ms, 128 ms]. It is also the
/// crate's default factor.
pub(super) const NATIVE_BUCKET_FACTOR: f64 = 1.1;
/// At most this many native buckets per series: 20 doublings at full resolution. Stops from
/// 1 µs to 4 s would need about 175; past the cap the crate halves the resolution rather than
/// grow. No reset after that (`min_reset_duration`): it would reset the classic buckets too.
const NATIVE_MAX_BUCKETS: usize = 160;

/// The per-period demand's classic bounds: 1 ms × 2^(k/8) for k = 0..=112, i.e. up to 16.4 s
/// (then +Inf), 8 per doubling: a quantile interpolated within one is off by at most 9 %, at a
/// bucket's middle by 4.3 %.
const DEMAND_BUCKETS_PER_DOUBLING: u16 = 8;
const DEMAND_BUCKET_COUNT: u16 = 113;
/// The per-period demand's native buckets: schema 4 (2^(1/16) ≈ 1.044, 16 per doubling), so
/// that a quantile is within 4.4 % anywhere in the bucket; 1 ms to 10 s takes about 213.
const DEMAND_NATIVE_FACTOR: f64 = 1.05;
const DEMAND_NATIVE_MAX_BUCKETS: usize = 240;

type HistogramFamily = Family<CgroupLabels, Histogram, fn() -> Histogram>;
type Seconds = Counter<f64, AtomicU64>;

/// Classic buckets for the text formats, native ones for the protobuf encoding: each scraper
/// reads the representation its format has.
fn stop_histogram() -> Histogram {
    Histogram::new_classic_and_native(
        exponential_buckets(BUCKET_START_S, 2.0, BUCKET_COUNT),
        NativeHistogramConfig::new(NATIVE_BUCKET_FACTOR).max_buckets(NATIVE_MAX_BUCKETS),
    )
}

fn demand_histogram() -> Histogram {
    Histogram::new_classic_and_native(
        exponential_buckets(
            BUCKET_START_S,
            2f64.powf(1.0 / f64::from(DEMAND_BUCKETS_PER_DOUBLING)),
            DEMAND_BUCKET_COUNT,
        ),
        NativeHistogramConfig::new(DEMAND_NATIVE_FACTOR).max_buckets(DEMAND_NATIVE_MAX_BUCKETS),
    )
}

/// The families; [`TABLE`] says how each is exported.
#[derive(Debug)]
pub(super) struct Families {
    pub(super) cpu_stop: HistogramFamily,
    pub(super) group_stop: HistogramFamily,
    pub(super) stops: Family<CgroupLabels, Counter>,
    pub(super) cpu_stopped: Family<CgroupLabels, Seconds>,
    pub(super) wall_stopped: Family<CgroupLabels, Seconds>,
    /// On a descendant: its ancestors' per-CPU stops that stopped it, and their length.
    pub(super) ancestor_stops: Family<CgroupLabels, Counter>,
    pub(super) ancestor_cpu_stopped: Family<CgroupLabels, Seconds>,
    /// Each measured period's arrived demand (a cgroup with a quota).
    pub(super) period_demand: HistogramFamily,
    pub(super) lost: Counter,
    pub(super) tracked: Gauge,
    dropped: Family<DropLabels, Counter>,
}

/// One exported family: its name under the registry's prefix, help and unit, and the field of
/// [`Families`] it is.
struct Spec {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    family: fn(&Families) -> Kind<'_>,
}

/// Whose series a family has.
enum Kind<'a> {
    /// One per tracked cgroup: zero-valued from its first sighting, so that rates start there,
    /// and removed with it.
    PerCgroup(&'a dyn PerCgroup),
    /// One per tracked cgroup with a quota whose periods are measured: from its first period,
    /// and removed with it.
    Measured(&'a dyn PerCgroup),
    /// The exporter's own.
    Own(&'a dyn Register),
}

/// Every family, in the order of the exposition.
static TABLE: [Spec; 11] = [
    Spec {
        name: "cpu_stop",
        help: "Length of each per-CPU CFS bandwidth stop (one cfs_rq throttled until unthrottled)",
        unit: Some(Unit::Seconds),
        family: |f| Kind::PerCgroup(&f.cpu_stop),
    },
    Spec {
        name: "group_stop",
        help: "Length of each group stop: the union of the cgroup's overlapping per-CPU stops, \
               counted once final (one episode late)",
        unit: Some(Unit::Seconds),
        family: |f| Kind::PerCgroup(&f.group_stop),
    },
    Spec {
        name: "stops",
        help: "Per-CPU stops that ended",
        unit: None,
        family: |f| Kind::PerCgroup(&f.stops),
    },
    Spec {
        name: "cpu_stopped",
        help: "Sum of per-CPU stop lengths (N CPUs stopped together count N times, as in cpu.stat)",
        unit: Some(Unit::Seconds),
        family: |f| Kind::PerCgroup(&f.cpu_stopped),
    },
    Spec {
        name: "wall_stopped",
        help: "Wall-clock time with at least one CPU of the cgroup stopped (sum of group stops)",
        unit: Some(Unit::Seconds),
        family: |f| Kind::PerCgroup(&f.wall_stopped),
    },
    Spec {
        name: "ancestor_stops",
        help: "Per-CPU stops of an ancestor's quota that stopped this cgroup (it had tasks queued \
               on that CPU)",
        unit: None,
        family: |f| Kind::PerCgroup(&f.ancestor_stops),
    },
    Spec {
        name: "ancestor_cpu_stopped",
        help: "Sum of the lengths of the per-CPU stops of an ancestor's quota that stopped this \
               cgroup",
        unit: Some(Unit::Seconds),
        family: |f| Kind::PerCgroup(&f.ancestor_cpu_stopped),
    },
    Spec {
        name: "period_demand",
        help: "CPU demand that arrived in each measured period of the group's quota, as the \
               advice replays it (docs/definitions.md, \"arrived demand\"); observed when the busy \
               run holding the period ends",
        unit: Some(Unit::Seconds),
        family: |f| Kind::Measured(&f.period_demand),
    },
    Spec {
        name: "lost_records",
        help: "Stop records the kernel side could not deliver (ring buffer full, or no room to \
               remember a start)",
        unit: None,
        family: |f| Kind::Own(&f.lost),
    },
    Spec {
        name: "cgroups_tracked",
        help: "Cgroups that have series now",
        unit: None,
        family: |f| Kind::Own(&f.tracked),
    },
    Spec {
        name: "cgroups_dropped",
        help: "Cgroups without series: beyond --max-cgroups (limit) or removed for longer than \
               --gone-after (gone)",
        unit: None,
        family: |f| Kind::Own(&f.dropped),
    },
];

/// A family the registry can hold a handle to.
trait Register {
    fn register(&self, registry: &mut Registry, spec: &Spec);
}

impl<T: Metric + Clone> Register for T {
    fn register(&self, registry: &mut Registry, spec: &Spec) {
        match &spec.unit {
            Some(unit) => {
                registry.register_with_unit(spec.name, spec.help, unit.clone(), self.clone())
            }
            None => registry.register(spec.name, spec.help, self.clone()),
        }
    }
}

/// A family with a series per tracked cgroup.
trait PerCgroup: Register {
    fn create(&self, labels: &CgroupLabels);
    fn remove(&self, labels: &CgroupLabels);
}

impl<M, C> PerCgroup for Family<CgroupLabels, M, C>
where
    Self: Register,
    M: Clone,
    C: MetricConstructor<M>,
{
    fn create(&self, labels: &CgroupLabels) {
        self.get_or_create_owned(labels);
    }

    fn remove(&self, labels: &CgroupLabels) {
        Family::remove(self, labels);
    }
}

impl Families {
    pub(super) fn new() -> Self {
        let families = Self {
            cpu_stop: Family::new_with_constructor(stop_histogram),
            group_stop: Family::new_with_constructor(stop_histogram),
            stops: Family::default(),
            cpu_stopped: Family::default(),
            wall_stopped: Family::default(),
            ancestor_stops: Family::default(),
            ancestor_cpu_stopped: Family::default(),
            period_demand: Family::new_with_constructor(demand_histogram),
            lost: Counter::default(),
            tracked: Gauge::default(),
            dropped: Family::default(),
        };
        for reason in ["limit", "gone"] {
            families.dropped.get_or_create_owned(&DropLabels { reason });
        }
        families
    }

    /// Registers every family of [`TABLE`].
    pub(super) fn register(&self, registry: &mut Registry) {
        for spec in &TABLE {
            match (spec.family)(self) {
                Kind::PerCgroup(family) | Kind::Measured(family) => family.register(registry, spec),
                Kind::Own(family) => family.register(registry, spec),
            }
        }
    }

    /// Zero-valued series for a new cgroup, so that rates start from its first sighting.
    pub(super) fn create(&self, labels: &CgroupLabels) {
        for spec in &TABLE {
            if let Kind::PerCgroup(family) = (spec.family)(self) {
                family.create(labels);
            }
        }
    }

    pub(super) fn remove(&self, labels: &CgroupLabels) {
        for spec in &TABLE {
            if let Kind::PerCgroup(family) | Kind::Measured(family) = (spec.family)(self) {
                family.remove(labels);
            }
        }
    }

    pub(super) fn dropped(&self, reason: &'static str) {
        self.dropped.get_or_create(&DropLabels { reason }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::BUCKET_COUNT;
    use crate::report::prometheus::Exporter;
    use crate::report::prometheus::tests::{config, families, feed, reporting, tree};

    #[test]
    fn protobuf_has_native_buckets_beside_the_classic_ones() {
        let (_dir, mut h, id) = tree();
        let (mut report, scraper) = reporting(Exporter::new(config(10)));
        feed(&mut report, &mut h, id);
        let families = families(&scraper.protobuf().unwrap());
        let histogram = |name: &str| {
            let family = families.iter().find(|f| f.name == name).unwrap();
            family.metric[0].histogram.clone().unwrap()
        };
        let cpu = histogram("throttle_tracer_cpu_stop_seconds");
        assert_eq!(cpu.schema, 3, "factor 2^(1/8), the largest <= 1.1");
        assert_eq!((cpu.sample_count, cpu.sample_sum), (3, 0.24));
        assert_eq!(
            cpu.bucket.len(),
            usize::from(BUCKET_COUNT) + 1,
            "classic kept"
        );
        // 80, 80 and 80 ms: one native bucket, ((2^(1/8))^-30, (2^(1/8))^-29] ∋ 0.08.
        assert_eq!(cpu.positive_span.len(), 1);
        assert_eq!(
            (cpu.positive_span[0].offset, cpu.positive_span[0].length),
            (-29, 1)
        );
        assert_eq!(cpu.positive_delta, [3]);
        let group = histogram("throttle_tracer_group_stop_seconds");
        assert_eq!(
            (group.schema, group.sample_count, group.sample_sum),
            (3, 1, 0.1)
        );
        assert_eq!(group.positive_delta, [1]);
        // The other families are there too.
        let stops = families
            .iter()
            .find(|f| f.name == "throttle_tracer_stops_total")
            .unwrap();
        assert_eq!(stops.metric[0].counter.clone().unwrap().value, 3.0);
    }
}
