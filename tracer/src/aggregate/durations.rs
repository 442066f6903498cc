//! Distributions of durations: count, sum, exact max, percentiles from an HdrHistogram, and
//! bcc-style log2 buckets.

use hdrhistogram::Histogram;

/// Two significant digits: any recorded value is within 1% (1/128) of the truth.
const SIGFIG: u8 = 2;
const NS_PER_US: u64 = 1_000;
pub(super) const NS_PER_MS: u64 = 1_000_000;

/// A distribution of durations: count, sum, exact max, percentiles and bcc-style log2 buckets.
///
/// The first [`FEW`] values are kept as they are, so that a node's many rarely stopped cgroups
/// cost a few hundred bytes each; past that an HdrHistogram of µs in `u32` counters (no trace
/// saturates one; `u64` would double the memory) sized to the longest stop, a few KiB (test
/// `memory_per_stopped_cgroup`). The log2 buckets are kept exactly, apart: the HdrHistogram's
/// buckets straddle the ms powers of two.
#[derive(Debug, Default)]
pub(super) struct Durations {
    count: u64,
    sum_ns: u64,
    max_ns: u64,
    micros: Micros,
    /// `log2_ms[i]` counts durations in [2^i, 2^(i+1)) ms; slot 0 also holds [0, 1) ms.
    log2_ms: Vec<u32>,
}

/// Values kept one by one before a histogram takes them: 512 bytes, a tenth of the histogram.
const FEW: usize = 64;

/// The recorded durations in µs, for the percentiles.
#[derive(Debug)]
enum Micros {
    /// At most [`FEW`] values, as recorded.
    Few(Vec<u64>),
    Histogram(Histogram<u32>),
}

impl Default for Micros {
    fn default() -> Self {
        Self::Few(Vec::new())
    }
}

impl Micros {
    fn record(&mut self, us: u64) {
        match self {
            Self::Few(values) if values.len() < FEW => values.push(us),
            Self::Few(values) => {
                let mut hdr = histogram_of(values);
                add(&mut hdr, us);
                *self = Self::Histogram(hdr);
            }
            Self::Histogram(hdr) => add(hdr, us),
        }
    }
}

/// A histogram of `values` (µs).
fn histogram_of(values: &[u64]) -> Histogram<u32> {
    // `new` only fails for sigfig > 5.
    let mut hdr = Histogram::new(SIGFIG).expect("SIGFIG is at most 5");
    for &us in values {
        add(&mut hdr, us);
    }
    hdr
}

fn add(hdr: &mut Histogram<u32>, us: u64) {
    // `record` fails only past i64::MAX / 2 µs or when a counter is full; clamping then keeps
    // the count right without growing the histogram.
    if hdr.record(us).is_err() {
        hdr.saturating_record(us);
    }
}

impl Durations {
    pub(super) fn record(&mut self, ns: u64) {
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
        self.micros.record(ns / NS_PER_US);
        let slot = log2_slot(ns / NS_PER_MS);
        if self.log2_ms.len() <= slot {
            self.log2_ms.resize(slot + 1, 0);
        }
        self.log2_ms[slot] = self.log2_ms[slot].saturating_add(1);
    }

    pub(super) fn summary(&self) -> DurationSummary {
        let kept;
        let hdr = match &self.micros {
            Micros::Few(values) if values.is_empty() => None,
            Micros::Few(values) => {
                kept = histogram_of(values);
                Some(&kept)
            }
            Micros::Histogram(hdr) => Some(hdr),
        };
        let percentiles = hdr.map(|hdr| {
            // The upper edge of the (≤1% wide) bucket holding the quantile, in ns: never below
            // the true value, never above the exact max.
            let at = |q: f64| {
                hdr.value_at_quantile(q)
                    .saturating_mul(NS_PER_US)
                    .saturating_add(NS_PER_US - 1)
                    .min(self.max_ns)
            };
            Percentiles {
                p50_ns: at(0.50),
                p90_ns: at(0.90),
                p99_ns: at(0.99),
                max_ns: self.max_ns,
            }
        });
        DurationSummary {
            count: self.count,
            sum_ns: self.sum_ns,
            percentiles,
            log2_ms: self.log2_ms.clone(),
        }
    }

    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        let micros = match &self.micros {
            Micros::Few(values) => values.capacity() * std::mem::size_of::<u64>(),
            Micros::Histogram(h) => h.distinct_values() * std::mem::size_of::<u32>(),
        };
        micros + self.log2_ms.capacity() * std::mem::size_of::<u32>()
    }
}

/// The bcc/libbpf-tools log2 slot: 0 for 0 and 1, else floor(log2(v)).
fn log2_slot(v: u64) -> usize {
    if v <= 1 {
        0
    } else {
        (u64::BITS - 1 - v.leading_zeros()) as usize
    }
}

/// Percentiles of a distribution, ns. p50/p90/p99 come from the HdrHistogram (≤1% high, never
/// above max); max is exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Percentiles {
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

/// A finished distribution of durations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurationSummary {
    pub count: u64,
    /// Σ durations, ns.
    pub sum_ns: u64,
    /// `None` when `count` is 0.
    pub percentiles: Option<Percentiles>,
    /// `log2_ms[i]` counts durations in [2^i, 2^(i+1)) ms; slot 0 also holds [0, 1) ms. No
    /// trailing empty slots.
    pub log2_ms: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::tests::MS;

    /// The values kept before the histogram, and the switch to it, give the percentiles an
    /// HdrHistogram holding every value gives.
    #[test]
    fn kept_values_give_the_histograms_percentiles() {
        for n in [1, 2, FEW - 1, FEW, FEW + 1, 3 * FEW] {
            let mut d = Durations::default();
            let mut all = Histogram::<u32>::new(SIGFIG).unwrap();
            for i in 0..n as u64 {
                let ns = (1 + i.wrapping_mul(7919) % 997) * 137 * NS_PER_US + i;
                d.record(ns);
                all.record(ns / NS_PER_US).unwrap();
            }
            assert_eq!(matches!(d.micros, Micros::Few(_)), n <= FEW, "{n} values");
            let p = d.summary().percentiles.unwrap();
            let max = d.max_ns;
            let at = |q: f64| (all.value_at_quantile(q) * NS_PER_US + NS_PER_US - 1).min(max);
            assert_eq!(
                (p.p50_ns, p.p90_ns, p.p99_ns),
                (at(0.5), at(0.9), at(0.99)),
                "{n} values"
            );
        }
    }

    #[test]
    fn percentiles_within_one_percent_and_log2_buckets_exact() {
        let mut d = Durations::default();
        // 1..=100 ms in 1 ms steps, plus 1 µs and 1 hour.
        for ms in 1..=100 {
            d.record(ms * MS);
        }
        d.record(1_000);
        d.record(3_600_000 * MS);
        let s = d.summary();
        let p = s.percentiles.unwrap();
        let close = |got: u64, want: u64| {
            assert!(
                got >= want && got - want <= want / 100 + NS_PER_US,
                "{got} vs {want}"
            );
        };
        close(p.p50_ns, 50 * MS); // the 51st of 102 values
        close(p.p90_ns, 91 * MS);
        close(p.p99_ns, 100 * MS);
        assert_eq!(p.max_ns, 3_600_000 * MS);
        // [0,2) ms: 1 µs and 1 ms; [2,4): 2,3; [4,8): 4..7; ... [64,128): 64..100.
        assert_eq!(&s.log2_ms[..7], &[2, 2, 4, 8, 16, 32, 37]);
        assert_eq!(s.log2_ms.len(), 22); // 3.6e6 ms is in [2^21, 2^22)
        assert_eq!(s.log2_ms[21], 1);
        assert_eq!(
            s.log2_ms.iter().map(|&n| u64::from(n)).sum::<u64>(),
            s.count
        );
    }
}
