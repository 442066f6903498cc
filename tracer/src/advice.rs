//! What to set: quota, burst and period values from a cgroup's measured busy runs
//! (`aggregate::DemandSummary`), its settings now and what the kernel has. One pure function,
//! [`advise`], so that every summary, `advise`, `serve` and `demo` give the same advice; its rules
//! and arithmetic are docs/definitions.md's ("Demand, busy runs and advice").

use serde::{Deserialize, Serialize};

use crate::aggregate::{Calm, DemandSummary, Run, arrived_in};
use crate::records::Bandwidth;

const MS: u64 = 1_000_000;
/// The kernel's longest period (`max_cfs_quota_period`).
pub const MAX_PERIOD_NS: u64 = 1_000 * MS;
/// The kernel's shortest period and quota (`min_cfs_quota_period`, 1 ms).
const MIN_NS: u64 = MS;

/// A quota at a period, and what it costs.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setting {
    pub quota_ns: u64,
    pub period_ns: u64,
    /// quota ÷ period in thousandths of a CPU: `docker --cpus` × 1000, Kubernetes millicores.
    pub millicpus: u64,
    /// The longest stop it allows a run on the CPUs the largest run used: period − quota ÷ n.
    pub longest_stop_ns: u64,
}

impl Setting {
    /// quota ÷ period in thousandths of a CPU, rounded up.
    pub fn millicpus_of(quota_ns: u64, period_ns: u64) -> u64 {
        (quota_ns.saturating_mul(1000)).div_ceil(period_ns.max(1))
    }

    fn new(quota_ns: u64, period_ns: u64, cpus: u32) -> Self {
        Self {
            quota_ns,
            period_ns,
            millicpus: Self::millicpus_of(quota_ns, period_ns),
            longest_stop_ns: period_ns.saturating_sub(quota_ns / u64::from(cpus.max(1))),
        }
    }
}

/// The burst part of the advice.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstAdvice {
    /// The smallest burst that lets the largest run through alone (quota + burst ≥ its need).
    pub for_largest_ns: Option<u64>,
    /// The burst advised: `for_largest_ns`, or more when the refill between runs needs it;
    /// `None` when none is needed or none can do it (`why_not`).
    pub burst_ns: Option<u64>,
    /// Runs the replay of the refill still stops with the largest allowed burst (= quota).
    pub stopped_with_ceiling: u64,
    /// Why no burst is advised, when one would be needed.
    pub why_not: Option<String>,
    /// A burst is configured, and with it no stopped run would have run through: it buys
    /// nothing.
    pub configured_useless: bool,
}

/// The throttling target the headline is for: the share of periods a recommended quota may
/// stop, in parts per million (exact integer arithmetic in the replay's comparisons).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "f64", try_from = "f64")]
pub struct Target {
    #[cfg_attr(test, proptest(strategy = "1u32..=500_000"))]
    ppm: u32,
}

impl Target {
    /// At most 1 % of the periods stopped.
    pub const DEFAULT: Self = Self { ppm: 10_000 };

    /// The share of periods in parts per million.
    pub fn ppm(self) -> u32 {
        self.ppm
    }

    /// The share of periods, 0 < share ≤ 0.5.
    pub fn share(self) -> f64 {
        f64::from(self.ppm) / 1e6
    }

    /// Whether `stopped` of `periods` meets the target with `room`: stopped × room ≤ share ×
    /// periods.
    fn met(self, stopped: u64, periods: u64, room: u64) -> bool {
        stopped <= self.most_stopped(periods, room)
    }

    /// The most of `periods` that may stop to meet the target with `room`.
    fn most_stopped(self, periods: u64, room: u64) -> u64 {
        let most = u128::from(periods) * u128::from(self.ppm) * 100
            / (u128::from(room.max(1)) * 1_000_000);
        u64::try_from(most).unwrap_or(u64::MAX)
    }
}

impl Default for Target {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl From<Target> for f64 {
    fn from(t: Target) -> f64 {
        t.share()
    }
}

impl TryFrom<f64> for Target {
    type Error = String;

    fn try_from(share: f64) -> Result<Self, String> {
        if share > 0.0 && share <= 0.5 {
            Ok(Self {
                ppm: ((share * 1e6).round() as u32).max(1),
            })
        } else {
            Err(format!(
                "a target is a share of periods above 0 and at most 50 %, not {share}"
            ))
        }
    }
}

impl std::str::FromStr for Target {
    type Err = String;

    /// `1%`, `0.5%` or a share, `0.01`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (number, scale) = match s.trim().strip_suffix('%') {
            Some(pct) => (pct, 100.0),
            None => (s.trim(), 1.0),
        };
        let share: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a share of periods (e.g. 1% or 0.01)"))?;
        Self::try_from(share / scale)
    }
}

/// A share of periods, to the millionth: a fraction in the JSON.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "f64", from = "f64")]
pub struct Share {
    #[cfg_attr(test, proptest(strategy = "0u32..=1_000_000"))]
    ppm: u32,
}

impl Share {
    /// `part` of `whole` (0 of nothing).
    pub fn of(part: u64, whole: u64) -> Self {
        let ppm = (u128::from(part) * 1_000_000)
            .checked_div(u128::from(whole))
            .unwrap_or(0);
        Self {
            ppm: u32::try_from(ppm).unwrap_or(u32::MAX),
        }
    }

    pub fn fraction(self) -> f64 {
        f64::from(self.ppm) / 1e6
    }
}

impl From<Share> for f64 {
    fn from(s: Share) -> f64 {
        s.fraction()
    }
}

impl From<f64> for Share {
    fn from(f: f64) -> Self {
        Self {
            ppm: (f.clamp(0.0, 1.0) * 1e6).round() as u32,
        }
    }
}

/// The advice for one cgroup.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advice {
    /// How long the measurement covers (ns of periods measured): the advice covers only what
    /// the trace saw.
    pub covered_ns: u64,
    pub runs: u64,
    /// The largest run's demand and CPUs, and the p99 run's demand.
    pub largest_run_ns: u64,
    pub largest_run_cpus: u32,
    pub p99_run_ns: u64,
    /// The target the headline is for.
    #[serde(default)]
    pub target: Target,
    /// The target period's demand: the smallest quota (1 ms steps) with which a replay of the
    /// periods' arrived demand, at every phase of the boundaries, stops at most the target's
    /// share of them (with [`REPLAY_ROOM`]), plus a runtime slice for each CPU but one.
    #[serde(default)]
    pub target_period_ns: u64,
    /// The same replay stopping no period, plus the slices.
    #[serde(default)]
    pub no_stop_period_ns: u64,
    /// The runtime slice allowed for in them: the machine's `sched_cfs_bandwidth_slice_us`;
    /// `None` when the trace did not read it (the kernel's default, 5 ms, was assumed).
    #[serde(default)]
    pub slice_ns: Option<u64>,
    /// The settings the advice starts from.
    #[serde(flatten)]
    pub current: Bandwidth,
    /// Whether the largest run already fits the quota in one period.
    pub fits: bool,
    /// The headline: the quota for the target at today's period, with the margin; up or down.
    #[serde(default)]
    pub recommended: Option<Setting>,
    /// The quota with which the replay stops no period, with the margin; up or down.
    #[serde(default)]
    pub no_stop: Option<Setting>,
    /// The share of the periods the replay stops at today's quota, and at the recommended one
    /// (each less the slices the replay's shared pool does not have): what the model predicts.
    #[serde(default)]
    pub stopped_now: Share,
    #[serde(default)]
    pub stopped_after: Share,
    /// The quota that fits the largest run in one period (`None` when it fits already).
    pub quota: Option<Setting>,
    pub burst: BurstAdvice,
    /// The period that fits the runs at today's ratio (`None` when it fits already, or no
    /// period up to 1 s does: `period_why_not`).
    pub period: Option<Setting>,
    pub period_why_not: Option<String>,
    /// The period in which at most the target's share of the windows hold more than its quota
    /// (`None` when the target period fits already, or no period up to 1 s does).
    #[serde(default)]
    pub period_target: Option<Setting>,
    /// The run still stopped when the trace ended is larger than every run that ended: the
    /// advice is a lower bound.
    pub unfinished_larger: bool,
}

/// What the kernel can set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// `cpu.max.burst` / `cpu.cfs_burst_us` exist (5.14+).
    pub burst: bool,
}

/// The advice for a cgroup whose runs are `demand`, with the settings `current`, for
/// `target`; `None` without a quota or a period, or without a single run.
pub fn advise(
    demand: &DemandSummary,
    current: Bandwidth,
    kernel: Kernel,
    target: Target,
) -> Option<Advice> {
    let quota = current.quota_ns?;
    let period = current.period_ns.filter(|&p| p > 0)?;
    let mut runs: Vec<Run> = demand.runs_in_order.clone();
    let largest = demand.largest.first().copied()?;
    let unfinished_larger = demand
        .unfinished
        .is_some_and(|u| u.demand_ns > largest.demand_ns);
    let top = demand
        .unfinished
        .filter(|_| unfinished_larger)
        .unwrap_or(largest);
    if let Some(u) = demand.unfinished {
        runs.push(u);
    }
    let need = need(&top, period);
    let p99 = demand
        .runs
        .percentiles
        .map_or(top.demand_ns, |p| p.p99_ns)
        .min(u64::from(demand.max_cpus.max(1)).saturating_mul(period));
    let fits = need <= quota;
    // A group cannot use more than its CPUs' time: that much never stops it.
    let all_cpus = u64::from(top.cpus.max(1)).saturating_mul(period);
    let quota_for = |n: u64| {
        let q = margin(n).min(all_cpus).max(MIN_NS);
        (q > quota).then(|| Setting::new(q, period, top.cpus))
    };
    let burst = burst(&runs, need, quota, period, current.burst_ns, kernel);
    let (period_advice, period_why_not) = if fits {
        (None, None)
    } else {
        longer_period(&runs, quota, period, top.cpus)
    };
    let arrived = arrived(&runs, demand.periods, quota, period);
    let replay = Replay {
        shape: Shape::of(&arrived),
        period,
        cpus: top.cpus,
        slice: demand.slice_ns.unwrap_or(SLICE_NS),
    };
    let target_period = replay.quota(|stopped, periods| target.met(stopped, periods, REPLAY_ROOM));
    let no_stop_period = replay.quota(|stopped, _| stopped == 0);
    // Up or down: a quota far above the demand is entitlement nobody uses.
    let setting = |n: u64| Setting::new(margin(n).min(all_cpus).max(MIN_NS), period, top.cpus);
    let recommended = setting(target_period);
    let period_target = (target_period > quota)
        .then(|| target_longer_period(&arrived, quota, period, top.cpus, target))
        .flatten();
    Some(Advice {
        covered_ns: demand.covered_ns,
        runs: demand.runs.count,
        largest_run_ns: top.demand_ns,
        largest_run_cpus: top.cpus,
        p99_run_ns: p99,
        target,
        target_period_ns: target_period,
        no_stop_period_ns: no_stop_period,
        slice_ns: demand.slice_ns,
        current,
        fits,
        recommended: Some(recommended),
        no_stop: Some(setting(no_stop_period)),
        stopped_now: replay.share(quota),
        stopped_after: replay.share(recommended.quota_ns),
        quota: quota_for(need),
        burst,
        period: period_advice,
        period_why_not,
        period_target,
        unfinished_larger,
    })
}

/// What `run` needs in one period of `period`: its demand, or all its CPUs' time.
fn need(run: &Run, period: u64) -> u64 {
    run.demand_ns
        .min(u64::from(run.cpus.max(1)).saturating_mul(period))
}

/// `ns` + 5 % (at least 1 ms), rounded up to a whole ms.
fn margin(ns: u64) -> u64 {
    let with = ns.saturating_add((ns / 20).max(MS));
    with.div_ceil(MS).saturating_mul(MS)
}

/// What a quota `q` holds with the margin kept free: `q` − 5 % (at least 1 ms).
fn less_margin(q: u64) -> u64 {
    q.saturating_sub((q / 20).max(MS))
}

fn burst(
    runs: &[Run],
    need: u64,
    quota: u64,
    period: u64,
    configured: Option<u64>,
    kernel: Kernel,
) -> BurstAdvice {
    let configured_useless = configured.is_some_and(|b| {
        b > 0 && {
            let stopped: Vec<u64> = runs
                .iter()
                .map(|r| self::need(r, period))
                .filter(|&n| n > quota)
                .collect();
            !stopped.is_empty() && stopped.iter().all(|&n| n > quota.saturating_add(b))
        }
    });
    let mut advice = BurstAdvice {
        configured_useless,
        ..BurstAdvice::default()
    };
    if need <= quota {
        return advice;
    }
    if !kernel.burst {
        advice.why_not = Some("this kernel has no burst (5.14+)".into());
        return advice;
    }
    // The margin is on the burst's own share (what the quota leaves of the need): a margin of
    // 5 % of the whole need would make the burst up to 5 % × need ÷ (need − quota) too large.
    let single = margin(need.saturating_sub(quota));
    advice.for_largest_ns = Some(single);
    if single > quota {
        advice.why_not = Some(format!(
            "the largest run needs a burst of {} ms, and the kernel refuses a burst above the \
             quota ({} ms): quota + burst is at most twice the quota",
            single / MS,
            quota / MS
        ));
        return advice;
    }
    let mut b = single;
    while stopped_by_replay(runs, quota, period, b) > 0 {
        b += MS;
        if b > quota {
            advice.stopped_with_ceiling = stopped_by_replay(runs, quota, period, quota);
            advice.why_not = Some(format!(
                "the quota the runs leave unused does not refill a burst in time: even the \
                 largest allowed burst ({} ms, the quota) still stops {} run(s)",
                quota / MS,
                advice.stopped_with_ceiling
            ));
            return advice;
        }
    }
    advice.burst_ns = Some(b);
    advice
}

/// Replays `runs` in order with the kernel's refill rule at `quota` + `burst`: each run's need
/// arrives in its first period, the pool is min(left + quota, quota + burst) at every period
/// boundary (idle periods between runs included), and a run that finds too little is stopped.
/// Returns the runs stopped.
fn stopped_by_replay(runs: &[Run], quota: u64, period: u64, burst: u64) -> u64 {
    let ceiling = quota.saturating_add(burst);
    let mut pool = ceiling;
    let mut stopped = 0;
    let mut last_end: Option<u64> = None;
    for run in runs {
        if let Some(end) = last_end {
            // The periods between the previous run's first one and this one's.
            let idle = run.start_ns.saturating_sub(end) / period.max(1);
            pool = refill(pool, idle, quota, ceiling);
        }
        let n = need(run, period);
        if n > pool {
            stopped += 1;
            pool = 0;
        } else {
            pool -= n;
        }
        // The rest of the run's periods hold no work of their own (it was the deferred work).
        pool = refill(pool, u64::from(run.periods.max(1)), quota, ceiling);
        last_end = Some(run.end_ns);
    }
    stopped
}

fn refill(pool: u64, periods: u64, quota: u64, ceiling: u64) -> u64 {
    pool.saturating_add(quota.saturating_mul(periods))
        .min(ceiling)
}

/// The shortest period up to 1 s in which every window of its length holds at most its quota
/// (at today's ratio) of demand, with the margin; runs count at their starts.
fn longer_period(
    runs: &[Run],
    quota: u64,
    period: u64,
    cpus: u32,
) -> (Option<Setting>, Option<String>) {
    let largest = runs.iter().map(|r| r.demand_ns).max().unwrap_or(0);
    // quota' = quota × period' / period ≥ margin(largest).
    let first =
        (u128::from(margin(largest)) * u128::from(period)).div_ceil(u128::from(quota.max(1)));
    let mut candidate = u64::try_from(first).unwrap_or(u64::MAX).div_ceil(MS) * MS;
    while candidate <= MAX_PERIOD_NS {
        let q = quota_at(quota, period, candidate);
        if max_window(runs, candidate) <= less_margin(q) {
            return (Some(Setting::new(q, candidate, cpus)), None);
        }
        candidate += MS;
    }
    (
        None,
        Some(format!(
            "at today's ratio the runs need a period longer than 1 s (the kernel's maximum); \
             the largest run alone needs {} ms",
            u64::try_from(first / u128::from(MS)).unwrap_or(u64::MAX)
        )),
    )
}

/// Each measured period's demand as it arrived, in order (docs/definitions.md, "arrived
/// demand"). A stopped period shows only the quota it spent, and a run's demand is the work
/// of every period it spans, so a run is split over its periods by [`arrived_in`]: by what its
/// held threads' records say arrived in its first period where they said it, else by the
/// **calm** periods' mean (periods outside every run of two or more). The periods between runs
/// (idle, or of a run left out) have none.
fn arrived(runs: &[Run], periods: u64, quota: u64, period: u64) -> Vec<u64> {
    let mut calm = Calm::default();
    runs.iter().for_each(|r| calm.add(r));
    let calm = calm.mean(periods);
    let mut out = Vec::new();
    let mut next_ns = runs.first().map_or(0, |r| r.start_ns);
    for run in runs {
        let idle = run.start_ns.saturating_sub(next_ns) / period.max(1);
        out.extend(std::iter::repeat_n(0, usize::try_from(idle).unwrap_or(0)));
        let (first, rest) = arrived_in(run, calm, quota);
        out.push(first);
        out.extend(std::iter::repeat_n(
            rest,
            run.periods.saturating_sub(1) as usize,
        ));
        next_ns = run.end_ns;
    }
    let short = usize::try_from(periods)
        .unwrap_or(0)
        .saturating_sub(out.len());
    out.extend(std::iter::repeat_n(0, short));
    out
}

/// Phases of the period boundaries a replay is run at, evenly spaced over one period: where
/// the kernel's boundaries fall among the arrivals is the trace's luck, and decides for a p99
/// which cluster of work splits over two periods and which stops one.
const PHASES: u64 = 10;
/// Steps each traced period's arrived demand is spread over in a replay.
const STEPS: u64 = 20;

/// Each traced period's arrived demand with what every replay of it asks first, found once for
/// all the trials of a bisection.
struct Shape<'a> {
    arrived: &'a [u64],
    /// The most three traced periods in a row hold: a replay period touches at most three (it
    /// is under two traced periods long), so with nothing waiting it receives at most that, and
    /// a quota above it, with no step above the CPUs' rate, stops nothing at any phase.
    most_in_three: u64,
    /// The most one step of the replay receives.
    most_in_a_step: u64,
    /// Where the stretches of traced periods of equal demand begin, by their first step.
    stretches: Vec<u64>,
}

impl<'a> Shape<'a> {
    fn of(arrived: &'a [u64]) -> Self {
        Self {
            arrived,
            most_in_three: arrived
                .windows(3.min(arrived.len()).max(1))
                .map(|w| w.iter().fold(0u64, |sum, &d| sum.saturating_add(d)))
                .max()
                .unwrap_or(0),
            most_in_a_step: arrived
                .iter()
                .map(|&d| d / STEPS + d % STEPS)
                .max()
                .unwrap_or(0),
            stretches: (0..arrived.len())
                .filter(|&k| k == 0 || arrived[k] != arrived[k - 1])
                .map(|k| k as u64 * STEPS)
                .collect(),
        }
    }
}

/// Periods stopped and periods replayed when `shape`'s arrived demand (one value per traced period of
/// `period` ns) is replayed at `quota` per period, summed over [`PHASES`] phases of the
/// boundaries: each period's demand comes in evenly over [`STEPS`] steps and runs on at most
/// `cpus` CPUs while the period has quota left; what cannot run waits (the kernel's deferral),
/// and a period whose quota ran out with work waiting is stopped. The last period of each
/// phase, cut by the trace's end, is not replayed. A period that starts with nothing waiting
/// and cannot exceed the quota or the CPUs is counted without stepping through it, and with
/// nothing waiting the periods inside a stretch of traced ones of equal demand that fits are
/// counted at once, as are those of a stretch that keeps more than the quota waiting (each
/// stops): the cost is in the changes of demand, not the window's length (an hour is 36,000 periods; a light load's are mostly idle, and a run's
/// arrived demand is one value over most of its periods). Once more than `most_stopped` periods
/// stopped it gives up with the counts so far: a bisection's trial is decided then, and most
/// of its trials fail.
fn replay_stops(
    shape: &Shape,
    period: u64,
    cpus: u32,
    quota: u64,
    most_stopped: u64,
) -> (u64, u64) {
    let arrived = shape.arrived;
    let step = (period / STEPS).max(1);
    let rate = u64::from(cpus.max(1)).saturating_mul(step);
    let steps = arrived.len() as u64 * STEPS;
    let demand = |g: u64| arrived[usize::try_from(g / STEPS).unwrap_or(usize::MAX)];
    let arrival = |g: u64| {
        demand(g) / STEPS
            + if g % STEPS == STEPS - 1 {
                demand(g) % STEPS
            } else {
                0
            }
    };
    // Σ arrivals over the steps [from, to), and the most one of them receives.
    let received = |from: u64, to: u64| {
        let (mut sum, mut most, mut g) = (0u64, 0, from);
        while g < to {
            let d = demand(g);
            let chunk_end = to.min((g / STEPS + 1) * STEPS);
            sum = sum.saturating_add((chunk_end - g) * (d / STEPS));
            most = most.max(d / STEPS);
            if chunk_end.is_multiple_of(STEPS) {
                sum = sum.saturating_add(d % STEPS);
                most = most.max(d / STEPS + d % STEPS);
            }
            g = chunk_end;
        }
        (sum, most)
    };
    if shape.most_in_three <= quota && shape.most_in_a_step <= rate {
        return (0, PeriodEnds::replayed(period, steps));
    }
    let stretches = &shape.stretches;
    // A period inside a stretch of `d` each receives at most `longest` steps of d ÷ STEPS and
    // two remainders, and no step more than one remainder: with nothing waiting, one that
    // fits the quota and the CPUs leaves nothing waiting for the next.
    let longest = period.div_ceil(step);
    let quiet = |d: u64| {
        longest
            .saturating_mul(d / STEPS)
            .saturating_add(2 * (d % STEPS))
            <= quota
            && d / STEPS + d % STEPS <= rate
    };
    // A period inside a stretch of `d` each, begun with more than the quota waiting, runs its
    // quota (if its steps can: it is at least `shortest` long) and stops; one that receives at
    // least its quota again leaves more than that waiting for the next.
    let shortest = period / step;
    let swamped = |d: u64| {
        shortest.saturating_mul(rate) >= quota && shortest.saturating_mul(d / STEPS) >= quota
    };
    let (mut stopped, mut periods) = (0, 0);
    for phase in 0..PHASES {
        let ends = PeriodEnds::new(period, steps, phase);
        let (mut waiting, mut start, mut j, mut next) = (0u64, 0, 0, 0);
        while j < ends.count {
            while stretches.get(next + 1).is_some_and(|&g| g <= start) {
                next += 1;
            }
            // The periods inside the stretch, counted at once where their outcome is known.
            let stretch_end = stretches.get(next + 1).copied().unwrap_or(steps);
            let inside = ends
                .first_after(stretch_end)
                .min(ends.count)
                .saturating_sub(j);
            if inside > 0 && waiting == 0 && quiet(demand(start)) {
                start = ends.end(j + inside - 1);
                j += inside;
                continue;
            }
            if inside > 0 && waiting > quota && swamped(demand(start)) {
                let k = inside.min(most_stopped.saturating_sub(stopped).saturating_add(1));
                let end = ends.end(j + k - 1);
                waiting =
                    (waiting + received(start, end).0).saturating_sub(k.saturating_mul(quota));
                stopped += k;
                j += k;
                start = end;
                if stopped > most_stopped {
                    return (stopped, periods + j);
                }
                continue;
            }
            let end = ends.end(j);
            j += 1;
            let (sum, most) = received(start, end);
            if waiting == 0 && sum <= quota && most <= rate {
                start = end;
                continue;
            }
            let (mut used, mut stops) = (0, false);
            for g in start..end {
                waiting += arrival(g);
                let ran = waiting.min(rate).min(quota.saturating_sub(used));
                used += ran;
                waiting -= ran;
                stops |= waiting > 0 && used >= quota;
            }
            stopped += u64::from(stops);
            if stopped > most_stopped {
                return (stopped, periods + j);
            }
            start = end;
        }
        periods += ends.count;
    }
    (stopped, periods)
}

/// The replay's period ends at `phase` of [`PHASES`], in steps of a `period` of [`STEPS`]: the
/// first a part of a period in, then one each period, before the trace's `steps` end.
struct PeriodEnds {
    /// The first end, in ns from the trace's start.
    first_ns: u64,
    period: u64,
    step: u64,
    /// How many end before the trace's last step.
    count: u64,
}

impl PeriodEnds {
    fn new(period: u64, steps: u64, phase: u64) -> Self {
        let step = (period / STEPS).max(1);
        let first_ns = period - period * phase / PHASES;
        // end(j) < steps ⇔ first + j × period ≤ (steps − 1) × step.
        let last_ns = steps.saturating_sub(1) * step;
        let count = if steps == 0 || last_ns < first_ns {
            0
        } else {
            (last_ns - first_ns) / period + 1
        };
        Self {
            first_ns,
            period,
            step,
            count,
        }
    }

    /// The periods replayed at all phases.
    fn replayed(period: u64, steps: u64) -> u64 {
        (0..PHASES)
            .map(|phase| Self::new(period, steps, phase).count)
            .sum()
    }

    /// The `j`th end, in steps.
    fn end(&self, j: u64) -> u64 {
        (self.first_ns + j * self.period).div_ceil(self.step)
    }

    /// The first period whose end is after step `g`: end(j) > g ⇔ first + j × period > g × step.
    fn first_after(&self, g: u64) -> u64 {
        match (g * self.step).checked_sub(self.first_ns) {
            None => 0,
            Some(ns) => ns / self.period + 1,
        }
    }
}

/// The kernel's default `sched_cfs_bandwidth_slice_us`: the runtime a CPU draws from the
/// group's pool at a time; the advice assumes it where the trace did not read the machine's.
const SLICE_NS: u64 = 5 * MS;

/// How much fewer stops a target's replay allows than the target: 3 (to 1 %, one period in
/// 300). The replay spreads each period's arrived demand evenly over it, where real work comes
/// in pieces that each run on one CPU: a request that arrives late in a period spills into the
/// next, and a cluster the trace's own boundaries split in two is never joined again by a
/// phase of the replay. So the replay stops fewer periods than the kernel does at the same
/// quota: on reference 003's random arrivals, a third of what cpu.stat counted at 80 to 92 ms
/// per 100 ms (docs/results/advise-check.md has the kernel's shares; docs/definitions.md,
/// "target period").
const REPLAY_ROOM: u64 = 300;

/// The periods' arrived demand replayed at today's period (docs/definitions.md, "target
/// period"): the quotas it advises, and the share of periods a quota stops in it.
struct Replay<'a> {
    shape: Shape<'a>,
    period: u64,
    cpus: u32,
    /// The machine's `sched_cfs_bandwidth_slice_us`, in ns.
    slice: u64,
}

impl Replay<'_> {
    /// The runtime the kernel's CPUs may hold back from the shared pool: a slice for each but
    /// one. The replay shares one pool, the kernel's CPUs draw from it a slice at a time, so
    /// the group stops that much before the pool's total is spent.
    fn slices(&self) -> u64 {
        u64::from(self.cpus.max(1) - 1) * self.slice
    }

    /// The smallest quota (1 ms steps) whose replay `meets(stopped, periods)`, plus
    /// [`Replay::slices`]. A bisection: more quota never stops more, and the CPUs cannot use
    /// more than their time, which stops nothing. It starts below that where it can: a quota
    /// above every period's arrived demand stops nothing either, which for a load far below
    /// its CPUs' time (most of a node's cgroups) leaves a few steps, not eight.
    fn quota(&self, meets: impl Fn(u64, u64) -> bool) -> u64 {
        let steps = self.shape.arrived.len() as u64 * STEPS;
        let periods = PeriodEnds::replayed(self.period, steps);
        // More stops never meet what fewer do not, so a trial is decided past this many.
        let most_stopped = (1..=periods)
            .take_while(|&s| meets(s, periods))
            .last()
            .unwrap_or(0);
        let works = |quota_ms: u64| {
            let (stopped, _) = replay_stops(
                &self.shape,
                self.period,
                self.cpus,
                quota_ms * MS,
                most_stopped,
            );
            stopped <= most_stopped
        };
        let all_ms = (u64::from(self.cpus.max(1)) * self.period).div_ceil(MS) + 1;
        let most_ms = self
            .shape
            .arrived
            .iter()
            .max()
            .map_or(0, |&ns| ns.div_ceil(MS) + 1);
        let (mut stops, mut works_ms) = (0, all_ms);
        if works(0) {
            return 0;
        }
        if most_ms < all_ms && works(most_ms) {
            works_ms = most_ms;
        }
        while works_ms > stops + 1 {
            let mid = stops + (works_ms - stops) / 2;
            if works(mid) {
                works_ms = mid;
            } else {
                stops = mid;
            }
        }
        works_ms * MS + self.slices()
    }

    /// The share of the replayed periods a kernel quota of `quota` stops (0 when none replay).
    fn share(&self, quota: u64) -> Share {
        let (stopped, periods) = replay_stops(
            &self.shape,
            self.period,
            self.cpus,
            quota.saturating_sub(self.slices()),
            u64::MAX,
        );
        Share::of(stopped, periods)
    }
}

/// The shortest period up to 1 s at today's ratio in which at most the target's share of the
/// windows of its length (with [`REPLAY_ROOM`]: windows over evenly spread arrived demand miss
/// the same spills and split clusters the replay does), one at every period boundary of
/// `arrived` (a partly covered period counting its covered share), hold more than its quota
/// less the margin.
fn target_longer_period(
    arrived: &[u64],
    quota: u64,
    period: u64,
    cpus: u32,
    target: Target,
) -> Option<Setting> {
    let mut sums = Vec::with_capacity(arrived.len() + 1);
    sums.push(0u128);
    for &u in arrived {
        sums.push(sums[sums.len() - 1] + u128::from(u));
    }
    let period_128 = u128::from(period);
    // Whether Σ arrived over `whole` periods from period i, and `part` ns of the next (its
    // share floored to the ns), exceeds `allowed`: multiplied through by the period, as
    // hundreds of thousands of windows per candidate are weighed.
    let over = |i: usize, whole: usize, part: u128, allowed: u128| {
        let last = arrived.get(i + whole).map_or(0, |&u| u128::from(u));
        (sums[i + whole] - sums[i]) * period_128 + last * part >= (allowed + 1) * period_128
    };
    let mut candidate = (period / MS + 1) * MS;
    while candidate <= MAX_PERIOD_NS {
        let q = quota_at(quota, period, candidate);
        let allowed = u128::from(less_margin(q));
        let whole = usize::try_from(candidate / period).ok()?;
        let part = u128::from(candidate % period);
        let windows = arrived.len().saturating_sub(whole);
        if windows == 0 {
            return None;
        }
        // Most candidates fail: each is decided once more windows are over than it allows.
        let most = target.most_stopped(windows as u64, REPLAY_ROOM);
        let mut seen = 0;
        let met = (0..windows).all(|i| {
            seen += u64::from(over(i, whole, part, allowed));
            seen <= most
        });
        if met {
            return Some(Setting::new(q, candidate, cpus));
        }
        candidate += MS;
    }
    None
}

/// The quota at `period_ns` with the ratio `quota` / `period`.
fn quota_at(quota: u64, period: u64, period_ns: u64) -> u64 {
    let q = u128::from(quota) * u128::from(period_ns) / u128::from(period.max(1));
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// The most demand of runs starting within any window of `len` ns.
fn max_window(runs: &[Run], len: u64) -> u64 {
    let mut best = 0;
    let mut sum = 0u64;
    let mut first = 0;
    for (i, run) in runs.iter().enumerate() {
        sum = sum.saturating_add(run.demand_ns);
        while runs[first].start_ns.saturating_add(len) <= run.start_ns && first < i {
            sum -= runs[first].demand_ns;
            first += 1;
        }
        best = best.max(sum);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::DurationSummary;
    use std::num::NonZeroU64;

    /// Runs of `demand_ms` each on `cpus` CPUs, one every `every_ms`, lasting `periods`.
    fn runs(demand_ms: &[u64], every_ms: u64, periods: u32, cpus: u32) -> Vec<Run> {
        demand_ms
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let start = i as u64 * every_ms * MS;
                Run {
                    start_ns: start,
                    end_ns: start + u64::from(periods) * 100 * MS,
                    periods,
                    throttled_periods: periods - 1,
                    demand_ns: d * MS,
                    cpus,
                    first_arrived_ns: None,
                }
            })
            .collect()
    }

    fn summary(runs: Vec<Run>) -> DemandSummary {
        let mut largest = runs.clone();
        largest.sort_by_key(|r| std::cmp::Reverse(r.demand_ns));
        let max = largest[0].demand_ns;
        DemandSummary {
            periods: 100,
            unknown_periods: 0,
            throttled_periods: 10,
            usage_ns: runs.iter().map(|r| r.demand_ns).sum(),
            covered_ns: 10_000 * MS,
            runs: DurationSummary {
                count: runs.len() as u64,
                sum_ns: 0,
                percentiles: Some(crate::aggregate::Percentiles {
                    p50_ns: max,
                    p90_ns: max,
                    p99_ns: max,
                    max_ns: max,
                }),
                log2_ms: vec![],
            },
            max_cpus: runs.iter().map(|r| r.cpus).max().unwrap_or(1),
            largest,
            runs_in_order: runs,
            broken_runs: 0,
            unfinished: None,
            bandwidth: Bandwidth::default(),
            burst_spent_ns: None,
            waiting: DurationSummary::default(),
            holds_unplaced: 0,
            slice_ns: None,
        }
    }

    fn bandwidth(quota_ms: u64, period_ms: u64, burst_ms: u64) -> Bandwidth {
        Bandwidth {
            quota_ns: Some(quota_ms * MS),
            period_ns: Some(period_ms * MS),
            burst_ns: Some(burst_ms * MS),
        }
    }

    const BURST: Kernel = Kernel { burst: true };

    fn replay(arrived: &[u64], cpus: u32, slice: u64) -> Replay<'_> {
        Replay {
            shape: Shape::of(arrived),
            period: 100 * MS,
            cpus,
            slice,
        }
    }

    #[test]
    fn a_spiky_load_gets_a_quota_a_burst_and_a_period_that_each_fit_its_run() {
        // 60 ms of CPU every 500 ms on one CPU, quota 40 ms / 100 ms.
        let s = summary(runs(&[60; 10], 500, 2, 1));
        let a = advise(&s, bandwidth(40, 100, 0), BURST, Target::DEFAULT).unwrap();
        assert!(!a.fits);
        // 60 ms + 3 ms margin.
        let q = a.quota.unwrap();
        assert_eq!(
            (q.quota_ns, q.period_ns, q.millicpus),
            (63 * MS, 100 * MS, 630)
        );
        assert_eq!(q.longest_stop_ns, 37 * MS);
        // Burst 20 ms + 1 ms margin: 400 ms of idle between runs refill it many times over.
        assert_eq!(a.burst.for_largest_ns, Some(21 * MS));
        assert_eq!(a.burst.burst_ns, Some(21 * MS));
        assert!(!a.burst.configured_useless);
        // Calm periods use nothing: the whole round arrived at once, and stopping 1 % of the
        // periods needs what the largest run does.
        assert_eq!(a.target_period_ns, 60 * MS);
        assert_eq!(a.recommended, a.quota);
        // Every round stops today (quota 40 ms), and the replay of the rounds through the
        // no-stop quota stops none of the 50 periods at any of ten phases.
        assert_eq!(a.no_stop, a.quota);
        assert_eq!(a.stopped_after, Share::default());
        assert!(a.stopped_now > Share::default());
        // Period: 40 % of p' ≥ 63 ms → 158 ms (quota 63.2 ms).
        let p = a.period.unwrap();
        assert_eq!(p.period_ns, 158 * MS);
        assert_eq!(p.quota_ns, 63_200_000);
        assert_eq!(p.longest_stop_ns, 158 * MS - 63_200_000);
    }

    #[test]
    fn runs_too_close_for_the_refill_need_more_burst_or_none() {
        // 70 ms runs every 100 ms (two periods each) at quota 40 ms: a burst of 30 + 1.5 → 32 ms
        // alone, but the next run arrives after one refill of 40 ms: the pool is never back to
        // 72 ms. Even a 40 ms burst (the ceiling) stops them.
        let s = summary(runs(&[70; 10], 100, 1, 1));
        let a = advise(&s, bandwidth(40, 100, 0), BURST, Target::DEFAULT).unwrap();
        assert_eq!(a.burst.for_largest_ns, Some(32 * MS));
        assert_eq!(a.burst.burst_ns, None);
        assert!(a.burst.stopped_with_ceiling > 0);
        assert!(a.burst.why_not.unwrap().contains("refill"));
        // At the same ratio no period fits a load above it on average (0.7 CPU > 0.4).
        assert_eq!(a.period, None);
        assert!(a.period_why_not.is_some());
    }

    #[test]
    fn the_ceiling_rule_and_a_useless_burst() {
        // 120 ms runs at quota 50 ms: burst 74 ms > quota, refused by the kernel.
        let s = summary(runs(&[120; 4], 1000, 3, 2));
        let a = advise(&s, bandwidth(50, 100, 25), BURST, Target::DEFAULT).unwrap();
        assert_eq!(a.burst.burst_ns, None);
        assert!(
            a.burst
                .why_not
                .unwrap()
                .contains("refuses a burst above the quota")
        );
        // 25 ms of burst makes a 75 ms ceiling, short of every run: it buys nothing.
        assert!(a.burst.configured_useless);
        // On two CPUs the 120 ms run needs 126 ms of quota per period.
        assert_eq!(a.quota.unwrap().quota_ns, 126 * MS);
        assert_eq!(a.quota.unwrap().longest_stop_ns, 100 * MS - 63 * MS);
        // A burst that would let them through is not useless.
        let a = advise(&s, bandwidth(100, 100, 25), BURST, Target::DEFAULT).unwrap();
        assert!(!a.burst.configured_useless);
    }

    #[test]
    fn what_the_kernel_lacks_is_not_advised_and_a_fit_needs_nothing() {
        let s = summary(runs(&[60; 3], 500, 2, 1));
        let a = advise(
            &s,
            bandwidth(40, 100, 0),
            Kernel { burst: false },
            Target::DEFAULT,
        )
        .unwrap();
        assert_eq!(a.burst.burst_ns, None);
        assert!(a.burst.why_not.unwrap().contains("5.14"));
        let a = advise(&s, bandwidth(80, 100, 0), BURST, Target::DEFAULT).unwrap();
        assert!(a.fits);
        assert_eq!((a.quota, a.period, a.burst.burst_ns), (None, None, None));
        // No quota, no advice.
        let none = Bandwidth {
            quota_ns: None,
            ..bandwidth(0, 100, 0)
        };
        assert_eq!(advise(&s, none, BURST, Target::DEFAULT), None);
    }

    #[test]
    fn a_single_thread_cannot_use_more_than_its_period() {
        // 250 ms of CPU on one thread: at 100 ms periods it needs all of each period (one
        // CPU), not 250 ms of quota.
        let s = summary(runs(&[250; 2], 2000, 3, 1));
        let a = advise(&s, bandwidth(50, 100, 0), BURST, Target::DEFAULT).unwrap();
        let q = a.quota.unwrap();
        assert_eq!(
            (q.quota_ns, q.millicpus, q.longest_stop_ns),
            (100 * MS, 1000, 0)
        );
    }

    #[test]
    fn random_arrivals_get_the_quota_and_period_that_stop_one_period_in_a_hundred() {
        // 197 periods of 100 ms at quota 50 ms: 191 calm ones hold 20 ms each; three runs of
        // two periods hold 150, 130 and 120 ms, of which 20 ms each arrived in their second
        // period at the calm rate.
        let mut all = Vec::new();
        let mut t = 0;
        let mut push = |periods: u32, demand_ms: u64| {
            all.push(Run {
                start_ns: t,
                end_ns: t + u64::from(periods) * 100 * MS,
                periods,
                throttled_periods: periods - 1,
                demand_ns: demand_ms * MS,
                cpus: 2,
                first_arrived_ns: None,
            });
            t += u64::from(periods) * 100 * MS;
        };
        for i in 0..194 {
            match i {
                50 => push(2, 150),
                100 => push(2, 130),
                150 => push(2, 120),
                _ => push(1, 20),
            }
        }
        let mut s = summary(all);
        s.periods = 197;
        let a = advise(&s, bandwidth(50, 100, 0), BURST, Target::DEFAULT).unwrap();
        // The arrived demand of the runs' first periods (130, 110 and 100 ms) is above the
        // quota traced at some phases of the boundaries (`the_p99_quota_is_the_one_…` has the
        // arithmetic), far below the largest run's need.
        let p99 = a.recommended.unwrap().quota_ns;
        assert!(p99 > 50 * MS && p99 < 130 * MS, "{p99}");
        assert!(a.stopped_after.fraction() <= 0.01 && a.stopped_now > a.stopped_after);
        // The largest run would need its whole demand in one period; the replay of what
        // arrived stops nothing once the largest first period (130 ms) fits with a slice for
        // the second CPU: 135 ms, 142 ms with the margin.
        assert_eq!(a.quota.unwrap().quota_ns, 158 * MS);
        assert_eq!(a.no_stop_period_ns, 135 * MS);
        assert_eq!(a.no_stop.unwrap().quota_ns, 142 * MS);
        // Windows over the arrived demand (… 20 20 130 20 20 …): at 400 ms (quota 200 ms, 190
        // with the margin) none holds more than 130 + 3 × 20 = 190 ms; at 399 ms three windows
        // hold 130 + 20 + 20 + 0.99 × 20 = 189.8 ms > 199.5 − 9.975, and a third of 1 % of 194
        // windows is none. The period fitting every run whole at its start is longer.
        let p = a.period_target.unwrap();
        assert_eq!((p.period_ns, p.quota_ns), (400 * MS, 200 * MS));
        assert_eq!(a.period.unwrap().period_ns, 485 * MS);
    }

    #[test]
    fn a_first_period_the_held_threads_measured_splits_its_run_instead_of_the_calm_mean() {
        let run = |first_ms: Option<u64>| Run {
            start_ns: 0,
            end_ns: 300 * MS,
            periods: 3,
            throttled_periods: 2,
            demand_ns: 150 * MS,
            cpus: 2,
            first_arrived_ns: first_ms.and_then(|ms| NonZeroU64::new(ms * MS)),
        };
        let split = |first_ms| {
            let (first, rest) = arrived_in(&run(first_ms), 20 * MS, 50 * MS);
            (first / MS, rest / MS)
        };
        // The calm mean: 20 ms in each later period, the rest (110 ms) in the first.
        assert_eq!(split(None), (110, 20));
        // Measured: 80 ms arrived in the first period, the later ones share the other 70.
        assert_eq!(split(Some(80)), (80, 35));
        // Never below the quota the first period spent, never above the run.
        assert_eq!(split(Some(30)), (50, 50));
        assert_eq!(split(Some(400)), (150, 0));

        // The largest first period is what the no-stop quota must hold. Forty runs of one
        // period every 400 ms (calm: 38 × 20 ms over 155 calm periods, 4.9 ms), a run of
        // 120 ms over two periods and one of 150 ms over three: by the calm mean their first
        // periods hold 115.1 and 140.2 ms, and the replay stops nothing from 141 ms (146 with
        // the slice); measured at 80 ms, the 150 ms run's is no longer the largest: 116 + 5.
        let mut runs: Vec<Run> = (0..40)
            .map(|i| Run {
                start_ns: i * 400 * MS,
                end_ns: i * 400 * MS + 100 * MS,
                periods: 1,
                throttled_periods: 0,
                demand_ns: 20 * MS,
                cpus: 2,
                first_arrived_ns: None,
            })
            .collect();
        runs[10] = Run {
            start_ns: 4_000 * MS,
            end_ns: 4_200 * MS,
            periods: 2,
            throttled_periods: 1,
            demand_ns: 120 * MS,
            ..runs[10]
        };
        runs[20] = Run {
            start_ns: 8_000 * MS,
            end_ns: 8_300 * MS,
            ..run(Some(80))
        };
        let no_stop = |runs: &[Run]| {
            let mut s = summary(runs.to_vec());
            s.periods = 160;
            let a = advise(&s, bandwidth(50, 100, 0), BURST, Target::DEFAULT).unwrap();
            a.no_stop_period_ns / MS
        };
        assert_eq!(no_stop(&runs), 121);
        runs[20].first_arrived_ns = None;
        assert_eq!(no_stop(&runs), 146);
    }

    #[test]
    fn a_quota_far_above_the_demand_is_advised_down_and_the_target_moves_the_headline() {
        // 100 periods of 10 ms on one CPU, and three of 45 ms: at 200 ms nothing stops.
        let mut demand = vec![10; 100];
        for i in [10, 40, 70] {
            demand[i] = 45;
        }
        let s = summary(runs(&demand, 100, 1, 1));
        let a = advise(&s, bandwidth(200, 100, 0), BURST, Target::DEFAULT).unwrap();
        // Three of 100 periods above 10 ms is more than 1 %, but at all but one phase of ten
        // the boundaries split a 45 ms period: 45 × 0.9 + 10 × 0.1 = 41.5 ms at most. At 42
        // ms the replay stops 3 of 999 periods, at most 3 (one in 300): the headline is 42 ms
        // and its margin, about a fifth of today's entitlement. Stopping none takes 45 ms.
        let r = a.recommended.unwrap();
        assert_eq!((r.quota_ns, r.millicpus), (45 * MS, 450));
        assert_eq!(a.target_period_ns, 42 * MS);
        assert_eq!(a.no_stop.unwrap().quota_ns, 48 * MS);
        assert_eq!(
            (a.stopped_now, a.stopped_after),
            (Share::default(), Share::default())
        );
        // A target of 5 % lets the three periods stop where the boundaries split them least
        // (at 35 ms: phases 0, 1, 2, 8 and 9, whose larger part is 45, 41.5 and 38 ms; 15 of
        // 999 replayed periods, below 5 % ÷ 3), for less quota; the model says what that
        // costs in stopped periods.
        let five: Target = "5%".parse().unwrap();
        let a = advise(&s, bandwidth(200, 100, 0), BURST, five).unwrap();
        assert_eq!(a.target_period_ns, 35 * MS);
        assert!(a.recommended.unwrap().quota_ns < 42 * MS);
        assert!(a.stopped_after > Share::default() && a.stopped_after.fraction() <= 0.05 / 3.0);
        assert_eq!(a.no_stop.unwrap().quota_ns, 48 * MS);
    }

    #[test]
    fn targets_parse_as_percent_or_share_and_bad_ones_say_why() {
        assert_eq!("1%".parse::<Target>(), Ok(Target::DEFAULT));
        assert_eq!("0.01".parse::<Target>(), Ok(Target::DEFAULT));
        assert_eq!("0.5%".parse::<Target>().unwrap().share(), 0.005);
        for bad in ["0", "60%", "-1%", "x"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
        assert_eq!(
            serde_json::to_string(&Target::DEFAULT).unwrap(),
            "0.01",
            "a share in the JSON"
        );
    }

    #[test]
    fn the_p99_quota_is_the_one_a_replay_at_every_phase_stops_in_one_period_in_300() {
        // 100 periods of 100 ms, two with 80 ms arriving evenly over them, on one CPU. At phase
        // k of 10 the boundaries split each into 80 × (1 − k/10) and 80 × k/10 ms: 80, 72 | 8,
        // 64 | 16, 56 | 24, … Replayed: 99 periods at phase 0 (the last never closes) and 100 at
        // each other phase, 999 in all, so at most 3 may stop (one in 300). At 72 ms the 80
        // ms shares stop (phase 0, 2 stops); below it the 72 ms ones too (phases 1 and 9, 6),
        // and below 64 ms the 64 ms ones (phases 2 and 8, 10).
        let mut arrived = vec![0; 100];
        arrived[20] = 80 * MS;
        arrived[60] = 80 * MS;
        assert_eq!(
            replay_stops(&Shape::of(&arrived), 100 * MS, 1, 72 * MS, u64::MAX),
            (2, 999)
        );
        assert_eq!(
            replay_stops(&Shape::of(&arrived), 100 * MS, 1, 64 * MS, u64::MAX),
            (6, 999)
        );
        assert_eq!(
            replay_stops(&Shape::of(&arrived), 100 * MS, 1, 63 * MS, u64::MAX),
            (10, 999)
        );
        let one_in_300 = |s, p| Target::DEFAULT.met(s, p, REPLAY_ROOM);
        assert_eq!(replay(&arrived, 1, SLICE_NS).quota(one_in_300), 72 * MS);
        // Its 4 ms a step never needs a second CPU, so on three the replay's quota is the
        // same; each CPU but one may hold a slice when the pool runs dry: 72 + 2 × 5 ms, or
        // on a machine whose slice is 1 ms, 72 + 2 × 1 ms.
        assert_eq!(replay(&arrived, 3, SLICE_NS).quota(one_in_300), 82 * MS);
        assert_eq!(replay(&arrived, 3, MS).quota(one_in_300), 74 * MS);
        // What a stopped period cannot run waits for the next: at 30 ms a cluster stops two
        // periods at every phase (phase 0: 80 ms, then 50 deferred; phase 5: 40, then 40 + 10)
        // but phase 7 (24 | 56: 26 ms deferred, which the third period runs): 2 × 19.
        assert_eq!(
            replay_stops(&Shape::of(&arrived), 100 * MS, 2, 30 * MS, u64::MAX),
            (38, 999)
        );
        // Nothing arrived: nothing stops, whatever the quota.
        assert_eq!(replay(&[0; 50], 4, SLICE_NS).quota(one_in_300), 0);
    }

    /// The replay stepped through every period: what [`replay_stops`] must count.
    fn replay_stepped(arrived: &[u64], period: u64, cpus: u32, quota: u64) -> (u64, u64) {
        let step = (period / STEPS).max(1);
        let rate = u64::from(cpus.max(1)).saturating_mul(step);
        let (mut stopped, mut periods) = (0, 0);
        for phase in 0..PHASES {
            let mut boundary = period - period * phase / PHASES;
            let (mut now, mut waiting, mut used, mut stops) = (0, 0u64, 0, false);
            for &demand in arrived {
                for s in 0..STEPS {
                    if now >= boundary {
                        periods += 1;
                        stopped += u64::from(stops);
                        (used, stops) = (0, false);
                        boundary += period;
                    }
                    waiting += demand / STEPS + if s + 1 == STEPS { demand % STEPS } else { 0 };
                    let ran = waiting.min(rate).min(quota.saturating_sub(used));
                    used += ran;
                    waiting -= ran;
                    stops |= waiting > 0 && used >= quota;
                    now += step;
                }
            }
        }
        (stopped, periods)
    }

    proptest::proptest! {
        /// The replay counts as stepping through every period does, and one that gives up
        /// past `most_stopped` decides as the whole one. Stretches of equal demand (idle, or
        /// a run's periods) are common: the replay counts those that fit at once.
        #[test]
        fn the_replay_counts_as_stepping_through_every_period(
            arrived in proptest::collection::vec(
                proptest::prop_oneof![
                    3 => proptest::strategy::Just(0u64),
                    2 => proptest::strategy::Just(5_000_017u64),
                    1 => proptest::strategy::Just(61_000_000u64),
                    2 => 0u64..300_000_000,
                ],
                0..60,
            ),
            period in 1_000_000u64..1_000_000_000,
            cpus in 1u32..4,
            quota in 0u64..400_000_000,
            most_stopped in 0u64..20,
        ) {
            let whole = replay_stops(&Shape::of(&arrived), period, cpus, quota, u64::MAX);
            proptest::prop_assert_eq!(whole, replay_stepped(&arrived, period, cpus, quota));
            let (given_up, _) = replay_stops(&Shape::of(&arrived), period, cpus, quota, most_stopped);
            proptest::prop_assert_eq!(given_up <= most_stopped, whole.0 <= most_stopped);
        }
    }
}
