//! What to set, continuously: each tracked cgroup's demand over the rolling window ([`Rolling`])
//! and the advice `advice::advise` makes of it, the same code as `advise` over the same periods.
//! The run loop feeds the periods ([`Measured::period`]) and makes the advice again every
//! `--advice-every` ([`Measured::refresh`]); a scrape reads what is stored ([`DemandCollector`]),
//! never the kernel or the files. The families: docs/prometheus.md ("What to set").

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::labels::CgroupLabels;
use super::{NS_PER_S, SharedRef, lock};
use crate::advice::{self, Advice, Share, Target};
use crate::aggregate::{Rolling, Run};
use crate::cpustat::{CpuStat, counter_delta};
use crate::records::{Deferred, Period};

/// Runs the windows of every measured cgroup keep together (48 bytes each): each keeps an equal
/// part, the oldest leaving first, so memory stays bounded however many cgroups there are.
pub(super) const WINDOW_RUNS: usize = 400_000;

/// How the advice is made.
#[derive(Clone, Copy, Debug)]
pub struct AdviceConfig {
    pub window: Duration,
    /// How often each cgroup's advice is made again (when new periods came).
    pub every: Duration,
    pub target: Target,
}

impl Default for AdviceConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(3600),
            every: Duration::from_secs(60),
            target: Target::DEFAULT,
        }
    }
}

/// Why a measured cgroup has no advice now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Missing {
    /// Fewer periods in the window than the target can be judged on: one stop allowed needs
    /// 1.5 ÷ target of them (150 at 1 %).
    TooFewPeriods,
    /// No busy run ended in the window, and none is going on (an idle group).
    NoRuns,
    /// No busy run ended in the window, and one is still going on: a group stopped in every
    /// period since that run began (a busy loop over its quota), whose demand is known only
    /// once the run ends; its lower bound so far is exported instead (`unfinished_run_*`).
    RunNotEnded,
    /// The group has no quota now.
    NoQuota,
}

impl Missing {
    fn reason(self) -> &'static str {
        match self {
            Self::TooFewPeriods => "too_few_periods",
            Self::NoRuns => "no_runs",
            Self::RunNotEnded => "run_not_ended",
            Self::NoQuota => "no_quota",
        }
    }
}

/// One measured cgroup: its window, counts and advice.
#[derive(Debug)]
pub(super) struct Measured {
    rolling: Rolling,
    periods: u64,
    throttled_periods: u64,
    advice: Result<Advice, Missing>,
    /// When the advice was made, and whether periods came since.
    advised_at: Option<Instant>,
    changed: bool,
    /// cpu.stat's (when, nr_periods, nr_throttled) at most a sixtieth of the window apart,
    /// over the window: its share of throttled periods in the same window. The two counters
    /// alone, not the whole reading (a tenth of its size, for 60 readings a cgroup).
    readings: VecDeque<(Instant, u64, u64)>,
}

impl Measured {
    pub(super) fn new(config: &AdviceConfig, max_runs: usize) -> Self {
        Self {
            rolling: Rolling::new(config.window.as_nanos() as u64, max_runs),
            periods: 0,
            throttled_periods: 0,
            advice: Err(Missing::TooFewPeriods),
            advised_at: None,
            changed: false,
            readings: VecDeque::new(),
        }
    }

    pub(super) fn bound(&mut self, max_runs: usize) {
        self.rolling.bound(max_runs);
    }

    /// Takes one period; returns the arrived demand of the periods it completed, `(ns, count)`.
    pub(super) fn period(&mut self, p: &Period) -> Vec<(u64, u32)> {
        if p.start_ns.is_some() {
            self.periods += 1;
            self.throttled_periods += u64::from(p.throttled_cpus > 0);
        }
        self.changed = true;
        self.rolling.period(p).periods
    }

    /// Takes one held thread's deferred work.
    pub(super) fn deferred(&mut self, d: &Deferred) {
        self.rolling.deferred(d);
    }

    /// A stop of `start_ns` held threads past those it lists: their work is unknown.
    pub(super) fn unknown_hold(&mut self, start_ns: u64) {
        self.rolling.unknown_hold(start_ns);
    }

    /// Keeps cpu.stat's reading of `now` for the window's share.
    pub(super) fn read(&mut self, stat: Option<&CpuStat>, now: Instant, config: &AdviceConfig) {
        let Some(stat) = stat else {
            return;
        };
        let step = config.window / 60;
        if self
            .readings
            .back()
            .is_none_or(|(at, ..)| now.duration_since(*at) >= step)
        {
            self.readings
                .push_back((now, stat.nr_periods, stat.nr_throttled));
        }
        while self
            .readings
            .front()
            .is_some_and(|(at, ..)| now.duration_since(*at) > config.window)
        {
            self.readings.pop_front();
        }
    }

    /// Makes the advice again if it is due and periods came since; returns whether it did.
    pub(super) fn refresh(
        &mut self,
        now: Instant,
        slice_ns: Option<u64>,
        config: &AdviceConfig,
    ) -> bool {
        let due = self
            .advised_at
            .is_none_or(|at| now.duration_since(at) >= config.every);
        if !(due && self.changed) {
            return false;
        }
        self.advised_at = Some(now);
        self.changed = false;
        self.advice = self.advise(slice_ns, config.target);
        true
    }

    fn advise(&self, slice_ns: Option<u64>, target: Target) -> Result<Advice, Missing> {
        let demand = self.rolling.summary(slice_ns);
        let bandwidth = self.rolling.bandwidth();
        if bandwidth.quota_ns.is_none() {
            return Err(Missing::NoQuota);
        }
        if demand.periods.saturating_mul(u64::from(target.ppm())) < 1_500_000 {
            return Err(Missing::TooFewPeriods);
        }
        let kernel = advice::Kernel {
            burst: bandwidth.burst_ns.is_some(),
        };
        advice::advise(&demand, bandwidth, kernel, target).ok_or(match demand.unfinished {
            Some(_) => Missing::RunNotEnded,
            None => Missing::NoRuns,
        })
    }

    /// The run still going while the advice waits for it to end ([`Missing::RunNotEnded`]).
    fn unfinished(&self) -> Option<Run> {
        self.rolling
            .unfinished()
            .filter(|_| matches!(self.advice, Err(Missing::RunNotEnded)))
    }

    /// cpu.stat's share of throttled periods between the window's first reading and `now`'s.
    fn cpustat_share(&self, now: Option<&CpuStat>) -> Option<Share> {
        let &(_, periods, throttled) = self.readings.front()?;
        let now = now?;
        Some(Share::of(
            counter_delta(now.nr_throttled, throttled),
            counter_delta(now.nr_periods, periods),
        ))
    }
}

/// A cgroup's labels and one more.
struct With<'a> {
    cgroup: &'a CgroupLabels,
    label: Option<(&'static str, &'static str)>,
}

impl EncodeLabelSet for With<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        self.cgroup.encode(encoder)?;
        if let Some(label) = self.label {
            label.encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// One series' value.
enum Value {
    Seconds(u64),
    Ratio(f64),
    Count(u64),
}

/// A series of a cgroup: its one more label, if any, and its value.
type Series = (Option<(&'static str, &'static str)>, Value);

/// One family the collector writes: its name, help, unit, type, and its series of a cgroup.
struct Family {
    name: &'static str,
    help: &'static str,
    /// The unit its name ends with (`seconds`, `ratio`).
    unit: Option<&'static str>,
    counter: bool,
    series: fn(&Measured, Option<&CpuStat>) -> Vec<Series>,
}

fn seconds(ns: Option<u64>) -> Vec<Series> {
    ns.map(|ns| (None, Value::Seconds(ns)))
        .into_iter()
        .collect()
}

/// The families, in the order of the exposition.
static FAMILIES: [Family; 15] = [
    Family {
        name: "periods",
        help: "Periods of the group's quota the trace measured (the expiries of its period timer)",
        unit: None,
        counter: true,
        series: |m, _| vec![(None, Value::Count(m.periods))],
    },
    Family {
        name: "throttled_periods",
        help: "Measured periods that ended throttled (what cpu.stat nr_throttled counts)",
        unit: None,
        counter: true,
        series: |m, _| vec![(None, Value::Count(m.throttled_periods))],
    },
    Family {
        name: "quota",
        help: "The group's quota now (the last period's): CPU time per period",
        unit: Some("seconds"),
        counter: false,
        series: |m, _| seconds(m.rolling.bandwidth().quota_ns),
    },
    Family {
        name: "period",
        help: "The group's period now (the last period's)",
        unit: Some("seconds"),
        counter: false,
        series: |m, _| seconds(m.rolling.bandwidth().period_ns),
    },
    Family {
        name: "burst",
        help: "The group's burst now (the last period's); absent on kernels without burst",
        unit: Some("seconds"),
        counter: false,
        series: |m, _| seconds(m.rolling.bandwidth().burst_ns),
    },
    Family {
        name: "advised_quota",
        help: "The advised quota at today's period over the advice window: fit=\"target\" stops \
               at most the target's share of periods, fit=\"all\" none (docs/definitions.md)",
        unit: Some("seconds"),
        counter: false,
        series: |m, _| match &m.advice {
            Ok(a) => [("target", a.recommended), ("all", a.no_stop)]
                .into_iter()
                .filter_map(|(fit, s)| Some((Some(("fit", fit)), Value::Seconds(s?.quota_ns))))
                .collect(),
            Err(_) => Vec::new(),
        },
    },
    Family {
        name: "advised_burst",
        help: "The advised burst with today's quota; absent when none is needed or none can do it",
        unit: Some("seconds"),
        counter: false,
        series: |m, _| seconds(m.advice.as_ref().ok().and_then(|a| a.burst.burst_ns)),
    },
    Family {
        name: "advised_period",
        help: "The advised period at today's quota/period ratio for the target; absent when the \
               target period fits today's or no period up to 1 s does",
        unit: Some("seconds"),
        counter: false,
        series: |m, _| {
            seconds(
                m.advice
                    .as_ref()
                    .ok()
                    .and_then(|a| a.period_target)
                    .map(|p| p.period_ns),
            )
        },
    },
    Family {
        name: "advice_target",
        help: "The share of periods the advised quota for the target may stop",
        unit: Some("ratio"),
        counter: false,
        series: |m, _| match &m.advice {
            Ok(a) => vec![(None, Value::Ratio(a.target.share()))],
            Err(_) => Vec::new(),
        },
    },
    Family {
        name: "advice_window",
        help: "Measured time (the periods' lengths) the advice covers",
        unit: Some("seconds"),
        counter: false,
        series: |m, _| seconds(m.advice.as_ref().ok().map(|a| a.covered_ns)),
    },
    Family {
        name: "advice_missing",
        help: "1 where a measured cgroup has no advice, with the reason",
        unit: None,
        counter: false,
        series: |m, _| match &m.advice {
            Ok(_) => Vec::new(),
            Err(why) => vec![(Some(("reason", why.reason())), Value::Count(1))],
        },
    },
    Family {
        name: "unfinished_run_demand",
        help: "Where the advice waits for a run that has not ended (advice_missing \
               reason=\"run_not_ended\"): the CPU time the run has used so far, a lower bound \
               of its demand",
        unit: Some("seconds"),
        counter: false,
        series: |m, _| seconds(m.unfinished().map(|r| r.demand_ns)),
    },
    Family {
        name: "unfinished_run_periods",
        help: "Where the advice waits for a run that has not ended: the periods it has spanned, \
               each of which ended throttled",
        unit: None,
        counter: false,
        series: |m, _| {
            m.unfinished()
                .map(|r| (None, Value::Count(u64::from(r.periods))))
                .into_iter()
                .collect()
        },
    },
    Family {
        name: "advice_stopped",
        help: "Share of the window's periods the advice's replay of the arrived demand stops \
               with today's quota (setting=\"current\") and with the advised one (\"advised\")",
        unit: Some("ratio"),
        counter: false,
        series: |m, _| match &m.advice {
            Ok(a) => vec![
                (
                    Some(("setting", "current")),
                    Value::Ratio(a.stopped_now.fraction()),
                ),
                (
                    Some(("setting", "advised")),
                    Value::Ratio(a.stopped_after.fraction()),
                ),
            ],
            Err(_) => Vec::new(),
        },
    },
    Family {
        name: "cpustat_throttled",
        help: "cpu.stat nr_throttled / nr_periods over the advice window (the kernel's count)",
        unit: Some("ratio"),
        counter: false,
        series: |m, stat| {
            m.cpustat_share(stat)
                .map(|s| (None, Value::Ratio(s.fraction())))
                .into_iter()
                .collect()
        },
    },
];

/// Encodes the stored figures at scrape time.
#[derive(Debug)]
pub(super) struct DemandCollector {
    pub(super) shared: SharedRef,
}

impl Collector for DemandCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let shared = lock(&self.shared);
        for family in &FAMILIES {
            let kind = if family.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let unit = family.unit.map(|u| Unit::Other(u.to_owned()));
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, unit.as_ref(), kind)?;
            for t in shared.cgroups.values() {
                let Some(measured) = &t.measured else {
                    continue;
                };
                for (label, value) in (family.series)(measured, t.stat.as_ref()) {
                    let labels = With {
                        cgroup: &t.labels,
                        label,
                    };
                    let series = metric.encode_family(&labels)?;
                    match (value, family.counter) {
                        (Value::Count(n), true) => ConstCounter::new(n).encode(series)?,
                        (Value::Count(n), false) => ConstGauge::new(n as i64).encode(series)?,
                        (Value::Seconds(ns), _) => {
                            ConstGauge::new(ns as f64 / NS_PER_S).encode(series)?
                        }
                        (Value::Ratio(r), _) => ConstGauge::new(r).encode(series)?,
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::advice::{self, Target};
    use crate::aggregate::Aggregate;
    use crate::report::prometheus::Exporter;
    use crate::report::prometheus::tests::{config, reporting, sample, ticked, tree};
    use crate::testing::period;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_exported_advice_is_advise_over_the_same_periods() {
        let (_dir, h, id) = tree();
        let (mut report, scraper) = reporting(Exporter::new(config(10)));
        let mut agg = Aggregate::watching(&[id]);
        // 300 calm periods of 20 ms on 2 CPUs at quota 50 ms, and every 30th a run of three.
        let mut end = 0;
        for i in 0..300 {
            let mut periods = vec![(20, false)];
            if i % 30 == 29 {
                periods = vec![(50, true), (50, true), (30, false)];
            }
            for (usage, throttled) in periods {
                end += 100;
                let mut p = period(end, usage, 2, throttled);
                p.cgroup_id = id;
                report.period(&p, Some("/demo"));
                agg.ingest_period(&p);
            }
        }
        ticked(&mut report, &scraper, &h, 0, Instant::now());
        let (_, text) = scraper.encode(false).unwrap();
        let demand = agg.finish(end * MS).remove(0).demand.unwrap();
        let bandwidth = demand.bandwidth;
        let a = advice::advise(
            &demand,
            bandwidth,
            advice::Kernel { burst: true },
            Target::DEFAULT,
        )
        .unwrap();
        let l = r#"{cgroup="/demo"}"#;
        let seconds = |ns: u64| ns as f64 / 1e9;
        let value = |series: &str| sample(&text, series);
        assert_eq!(
            value(r#"throttle_tracer_advised_quota_seconds{cgroup="/demo",fit="target"}"#),
            seconds(a.recommended.unwrap().quota_ns)
        );
        assert_eq!(
            value(r#"throttle_tracer_advised_quota_seconds{cgroup="/demo",fit="all"}"#),
            seconds(a.no_stop.unwrap().quota_ns)
        );
        assert_eq!(
            value(&format!("throttle_tracer_periods_total{l}")),
            demand.periods as f64
        );
        assert_eq!(
            value(&format!("throttle_tracer_throttled_periods_total{l}")),
            demand.throttled_periods as f64
        );
        assert_eq!(value(&format!("throttle_tracer_quota_seconds{l}")), 0.05);
        assert_eq!(
            value(&format!("throttle_tracer_advice_window_seconds{l}")),
            seconds(demand.covered_ns)
        );
        assert_eq!(
            value(r#"throttle_tracer_advice_stopped_ratio{cgroup="/demo",setting="current"}"#),
            a.stopped_now.fraction()
        );
        // Every period arrived once into the histogram: 290 calm ones and ten runs of three.
        assert_eq!(
            value(&format!("throttle_tracer_period_demand_seconds_count{l}")),
            320.0
        );
        // The run's first period received 90 ms (130 less two calm periods of 20 ms), the
        // largest of all: below it 99 % or more of the periods.
        assert_eq!(
            value(r#"throttle_tracer_period_demand_seconds_bucket{cgroup="/demo",le="+Inf"}"#),
            320.0
        );
        assert!(a.recommended.unwrap().quota_ns > 50 * MS);
    }

    #[test]
    fn too_few_periods_leave_the_advice_absent_with_the_reason() {
        let (_dir, h, id) = tree();
        let (mut report, scraper) = reporting(Exporter::new(config(10)));
        for end in 1..=100 {
            let mut p = period(end * 100, 20, 1, false);
            p.cgroup_id = id;
            report.period(&p, Some("/demo"));
        }
        ticked(&mut report, &scraper, &h, 0, Instant::now());
        let (_, text) = scraper.encode(false).unwrap();
        assert_eq!(
            sample(
                &text,
                r#"throttle_tracer_advice_missing{cgroup="/demo",reason="too_few_periods"}"#
            ),
            1.0
        );
        assert!(!text.contains("throttle_tracer_advised_quota_seconds{"));
        assert!(!text.contains("throttle_tracer_unfinished_run_periods{"));
        // The settings and counts are there all the same.
        assert_eq!(
            sample(&text, r#"throttle_tracer_periods_total{cgroup="/demo"}"#),
            100.0
        );
    }

    /// A busy loop over its quota (1 ms every 100 ms period, each one throttled) never ends
    /// its run: the advice says it waits for it, with the run's usage so far.
    #[test]
    fn a_group_stopped_in_every_period_says_its_advice_waits_for_the_run() {
        let (_dir, h, id) = tree();
        let (mut report, scraper) = reporting(Exporter::new(config(10)));
        for end in 1..=200 {
            let mut p = period(end * 100, 1, 1, true);
            p.bandwidth.quota_ns = Some(MS);
            p.cgroup_id = id;
            report.period(&p, Some("/demo"));
        }
        ticked(&mut report, &scraper, &h, 0, Instant::now());
        let (_, text) = scraper.encode(false).unwrap();
        let l = r#"{cgroup="/demo"}"#;
        assert_eq!(
            sample(
                &text,
                r#"throttle_tracer_advice_missing{cgroup="/demo",reason="run_not_ended"}"#
            ),
            1.0
        );
        assert_eq!(
            sample(&text, &format!("throttle_tracer_unfinished_run_periods{l}")),
            200.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("throttle_tracer_unfinished_run_demand_seconds{l}")
            ),
            0.2
        );
        assert_eq!(
            sample(
                &text,
                &format!("throttle_tracer_throttled_periods_total{l}")
            ),
            200.0
        );
        // No period's arrived demand is known until the run ends: no histogram series yet.
        assert!(!text.contains("throttle_tracer_period_demand_seconds_count{"));
    }
}
