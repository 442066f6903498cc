//! The random arrivals' truth, measured once (`advise-check --measure-truth`) and kept in
//! docs/results/advise-check.md, where the check reads it back: reference 003's requests rerun
//! at a grid of quotas (period 100 ms), each sampled until its 95 % interval decides it against
//! 1 % or its rounds run out, then a bisection for the smallest quota whose reruns stop nothing.
//! A rerun's stopped share near 1 % is too uncertain for a bisection at each check (docs/advice.md,
//! "Random arrivals: what a bisection can decide"), so the check judges the advice against this.
use super::{Bandwidth, Outcome, PERIOD_US, Runner};
use crate::{paths, results};
use anyhow::{Context as _, Result, bail};

/// The quotas (ms) the truth samples: from where the share is well above 1 % to where nothing
/// stops, finer where the share crosses 1 %.
const GRID_MS: [u64; 10] = [80, 84, 88, 92, 96, 100, 110, 125, 140, 160];
/// Reruns of one round: four runs of 15 s, about 560 periods.
const ROUND: u64 = 4;
/// Rounds every value gets (eight phases of the boundaries, about 1,120 periods): what "its
/// reruns stop nothing" is judged on.
const MIN_ROUNDS: u64 = 2;
/// Rounds a value gets at most while its interval still holds 1 % (about 2,800 periods): a
/// share of 0.6 % is decided below 1 % within them; one nearer stays undecided.
const MAX_ROUNDS: u64 = 5;

/// How close the bisection for the no-stop quota goes (ms): about 1.5 % of it.
const BISECTION_MS: u64 = 2;

/// The results file's section, and the lines the check reads back.
pub const HEADING: &str = "random arrivals: the truth at 100 ms periods";
const TARGET_LINE: &str = "- stops ≤ 1 % of the periods: **";
const NO_STOP_LINE: &str = "- stops nothing: **";

/// The two quotas (ms, period 100 ms) the advice is judged against.
#[derive(Debug, PartialEq, Eq)]
pub struct Truth {
    /// The smallest quota from which every larger value tried is decided to stop ≤ 1 %.
    pub target_ms: u64,
    /// The smallest quota from which every larger value tried stopped nothing.
    pub no_stop_ms: u64,
}

/// A quota tried and cpu.stat's counts over all its reruns.
#[derive(Clone, Copy)]
struct Sample {
    ms: u64,
    outcome: Outcome,
}

impl Truth {
    fn of(samples: &[Sample]) -> Result<Self> {
        let smallest_from = |holds: &dyn Fn(&Outcome) -> bool| {
            let mut sorted = samples.to_vec();
            sorted.sort_by_key(|s| s.ms);
            let failing = sorted.iter().rposition(|s| !holds(&s.outcome));
            sorted.get(failing.map_or(0, |i| i + 1)).map(|s| s.ms)
        };
        Ok(Self {
            target_ms: smallest_from(&|o| o.decided() == Some(true))
                .context("the largest quota tried is not decided to stop ≤ 1 %")?,
            no_stop_ms: smallest_from(&|o| o.throttled == 0)
                .context("the largest quota tried still stops")?,
        })
    }

    fn lines(&self) -> String {
        format!(
            "{TARGET_LINE}{} ms** (from it up, every quota tried is decided to stop at most 1 %)\n\
             {NO_STOP_LINE}{} ms** (from it up, no rerun of a quota tried stopped)\n",
            self.target_ms, self.no_stop_ms
        )
    }

    fn parse(text: &str) -> Result<Self> {
        let ms = |prefix: &str| -> Result<u64> {
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .with_context(|| format!("no line starting {prefix:?}"))?;
            let (n, _) = line.split_once(" ms**").context("no \" ms**\"")?;
            n.parse()
                .with_context(|| format!("{n:?} is not a number of ms"))
        };
        Ok(Self {
            target_ms: ms(TARGET_LINE)?,
            no_stop_ms: ms(NO_STOP_LINE)?,
        })
    }
}

/// The truth as last measured, from docs/results/advise-check.md.
pub fn read() -> Result<Truth> {
    let path = paths::root().join("docs/results/advise-check.md");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let truth = Truth::parse(&text).with_context(|| {
        format!(
            "no truth in {}: measure it with `sudo cargo xtask advise-check --measure-truth`",
            path.display()
        )
    })?;
    if truth.target_ms == 0 || truth.no_stop_ms < truth.target_ms {
        bail!("the truth in {} is not one: {truth:?}", path.display());
    }
    Ok(truth)
}

/// Measures the truth and writes its section of docs/results/advise-check.md.
pub fn measure(runner: &Runner, provenance: &results::Provenance) -> Result<Truth> {
    let mut samples = Vec::new();
    for ms in GRID_MS {
        samples.push(sample(runner, ms, MAX_ROUNDS)?);
    }
    // The grid's top still stopping: higher, up to both CPUs' time, which nothing exceeds.
    let first = loop {
        match Truth::of(&samples) {
            Ok(truth) => break truth,
            Err(e) => {
                let top = samples.iter().map(|s| s.ms).max().unwrap_or(0);
                if top >= 2 * PERIOD_US / 1000 {
                    return Err(e);
                }
                samples.push(sample(runner, top + 20, MAX_ROUNDS)?);
            }
        }
    };
    // Between the largest value that stopped and the next, each value gets the rounds every
    // value had, so that all are judged on the same phases.
    let mut hi = first.no_stop_ms;
    let mut lo = samples
        .iter()
        .map(|s| s.ms)
        .filter(|&ms| ms < hi)
        .max()
        .unwrap_or(0);
    while hi > lo + BISECTION_MS {
        let mid = lo + (hi - lo) / 2;
        let s = sample(runner, mid, MIN_ROUNDS)?;
        samples.push(s);
        if s.outcome.throttled == 0 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let truth = Truth::of(&samples)?;
    let file = results::update(
        "advise-check.md",
        super::RESULTS_INTRO,
        provenance,
        &[(HEADING.to_owned(), section(&samples, &truth))],
    )?;
    eprintln!("advise-check: the truth written to {}", file.display());
    print!("{}", section(&samples, &truth));
    Ok(truth)
}

/// Reruns at `ms` in rounds, at least [`MIN_ROUNDS`], then until the interval decides it or
/// `max_rounds` have run.
fn sample(runner: &Runner, ms: u64, max_rounds: u64) -> Result<Sample> {
    let mut outcome = Outcome {
        periods: 0,
        throttled: 0,
    };
    for round in 0..max_rounds {
        let delays = (round * ROUND..(round + 1) * ROUND).map(phase_us);
        let more = runner.arrivals_at(Bandwidth::quota(ms), delays)?;
        outcome.periods += more.periods;
        outcome.throttled += more.throttled;
        if round + 1 >= MIN_ROUNDS && outcome.decided().is_some() {
            break;
        }
    }
    eprintln!("advise-check: truth at {ms} ms: {}", outcome.describe());
    Ok(Sample { ms, outcome })
}

/// The delay of rerun `i`'s requests: the van der Corput sequence over one period, so that
/// every prefix of the reruns meets the boundaries at evenly spread phases.
fn phase_us(i: u64) -> u64 {
    let (mut i, mut denominator, mut fraction) = (i, 1u64, 0u64);
    while i > 0 {
        fraction = fraction * 2 + (i & 1);
        denominator *= 2;
        i >>= 1;
    }
    PERIOD_US * fraction / denominator
}

fn section(samples: &[Sample], truth: &Truth) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort_by_key(|s| s.ms);
    let mut s = format!(
        "Reference 003's requests (20 ms each, 10 a second at random, seed 3, 4 workers, 15 s a \
         run) rerun in a fresh cgroup at each quota, period 100 ms, at the most CPU weight, their \
         start delayed to meet the period boundaries at phases spread over one period. Each \
         grid value: at least {MIN_ROUNDS} rounds of {ROUND} runs, then more (up to \
         {MAX_ROUNDS}) until the 95 % interval (Wilson) of cpu.stat's nr_throttled / \
         nr_periods lies on one side of 1 %; then values between the grid's last that stopped \
         and the next, {MIN_ROUNDS} rounds each, bisected to {BISECTION_MS} ms for the \
         smallest that stops nothing.\n\n\
         | quota | stopped of periods | share | 95 % interval | against 1 % |\n|---|---|---|---|---|\n"
    );
    for sample in sorted {
        let o = sample.outcome;
        let (lo, hi) = o.interval();
        let verdict = match o.decided() {
            Some(true) => "works",
            Some(false) => "stopped",
            None => "undecided",
        };
        s.push_str(&format!(
            "| {} ms | {} of {} | {:.2} % | {:.2}–{:.2} % | {verdict} |\n",
            sample.ms,
            o.throttled,
            o.periods,
            100.0 * o.throttled as f64 / o.periods.max(1) as f64,
            100.0 * lo,
            100.0 * hi
        ));
    }
    s.push('\n');
    s.push_str(&truth.lines());
    s
}

/// The check's verdict on one advised quota against its truth: within [`super::WASTE_LIMIT`]
/// either way.
pub fn near(advised_ms: u64, truth_ms: u64) -> bool {
    let ratio = advised_ms as f64 / truth_ms.max(1) as f64;
    (ratio - 1.0).abs() <= super::WASTE_LIMIT - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ms: u64, throttled: u64, periods: u64) -> Sample {
        Sample {
            ms,
            outcome: Outcome { periods, throttled },
        }
    }

    #[test]
    fn the_truth_is_the_smallest_value_from_which_every_larger_one_holds() {
        let samples = [
            sample(100, 2, 1120), // 0.18 %: decided, but stops
            sample(80, 25, 1120), // stopped
            sample(92, 17, 2800), // 0.61 %: decided
            sample(88, 28, 2800), // 1 %: undecided
            sample(96, 14, 2800), // decided
            sample(125, 0, 1120), // nothing
            sample(110, 0, 1120), // nothing
            sample(105, 1, 1120), // one
        ];
        assert_eq!(
            Truth::of(&samples).unwrap(),
            Truth {
                target_ms: 92,
                no_stop_ms: 110
            }
        );
        // The largest value tried undecided: no truth, the grid ends too low.
        let mut later = samples.to_vec();
        later.push(sample(140, 9, 800));
        assert!(Truth::of(&later).is_err());
    }

    #[test]
    fn the_check_reads_back_the_truth_the_measurement_wrote() {
        let truth = Truth {
            target_ms: 92,
            no_stop_ms: 131,
        };
        let text = format!(
            "# advise-check results\n\n## {HEADING}\n\n| 92 ms | 1 of 2 |\n\n{}",
            truth.lines()
        );
        assert_eq!(Truth::parse(&text).unwrap(), truth);
        assert!(Truth::parse("## nothing here\n").is_err());
    }

    #[test]
    fn every_prefix_of_the_reruns_spreads_its_phases_over_the_period() {
        let phases: Vec<u64> = (0..8).map(phase_us).collect();
        assert_eq!(
            phases,
            [0, 50_000, 25_000, 75_000, 12_500, 62_500, 37_500, 87_500]
        );
    }

    #[test]
    fn an_advised_value_is_near_its_truth_within_ten_percent_either_way() {
        assert!(near(101, 92) && near(83, 92) && near(92, 92));
        assert!(!near(102, 92) && !near(82, 92));
    }
}
