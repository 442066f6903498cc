//! `cargo xtask advise-check`: is the advice not wasteful? Each workload of known demand is traced
//! at 50 ms / 100 ms for its `advice` line; then a bisection finds the smallest quota, burst and
//! period with which reruns are not throttled, each in a fresh cgroup judged by its cpu.stat (the
//! random arrivals' quotas against a truth measured once, [`truth`]). Fails when an advised value
//! does not do it or is more than 10 % above the smallest. Minutes; root. docs/testing.md ("Is the
//! advice wasteful?").
mod truth;

use crate::arch::Arch;
use crate::cgroup;
use crate::process::{die_with_parent, signal, wait_timeout};
use crate::{bench, binaries, results, setup};
use anyhow::{Context as _, Result, bail};
use serde_json::Value;
use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use test_support::{Cgroup, Running};

const MS: u64 = 1_000_000;
const QUOTA_US: u64 = 50_000;
const PERIOD_US: u64 = 100_000;
const CGROUP_NAME: &str = "xtask-advise-check";
/// Round spacing of the spiky workloads: a multiple of the period, with idle time to refill.
const EVERY_MS: u64 = 500;
/// Rounds of a traced spiky workload before the ones traced: the tracer's start (seconds).
const LEAD_ROUNDS: u32 = 20;
/// How far above the smallest value that works an advised one may be.
const WASTE_LIMIT: f64 = 1.10;
/// Periods of random arrivals per value tried, at least. One run of 15 s has too few periods
/// for 1 % of them to be more than luck (at 350 ms, one of 43 may stop, or none): the value
/// must keep Σ nr_throttled within 1 % of Σ nr_periods over enough reruns that 1 % is several
/// periods (four reruns at 100 ms). The reruns are the traced requests (the same seed) met at
/// as many phases of the period boundaries, spread evenly over one period (see `arrivals`).
/// Even 560 leave a share near 1 % uncertain by about half itself ([`Outcome::interval`]):
/// deciding one 0.2 points from 1 % takes about 9,500 (docs/advice.md).
const ARRIVAL_PERIODS: u64 = 560;
/// Random arrivals may be stopped in one period of this many (`Workload::allowed`).
const ALLOWED_ONE_IN: u64 = 100;

#[derive(clap::Args)]
pub struct Args {
    /// Rounds of each spiky workload run.
    #[arg(long, default_value_t = 8)]
    rounds: u32,
    /// Seconds of each random-arrivals run.
    #[arg(long, default_value_t = 15)]
    arrivals_seconds: u32,
    /// Runs of the random arrivals the advice is traced over, met at as many phases of the
    /// period, spread evenly over it: one run's single phase is no sample of how the requests
    /// meet the boundaries. Eight are the phases every value of the truth is measured at (its
    /// first two rounds): with four, the largest period the trace saw was smaller than the
    /// truth's phases meet, and the no-stop quota came out 12 % below it.
    #[arg(long, default_value_t = 8)]
    traced_runs: u64,
    /// Check only these workloads, repeatable (default: all).
    #[arg(long = "workload", value_enum)]
    workloads: Vec<Kind>,
    /// Periods of random-arrival reruns per value, at least.
    #[arg(long, default_value_t = ARRIVAL_PERIODS)]
    arrival_periods: u64,
    /// Instead of the check: the random arrivals' stopped share at this period (ms, at the
    /// ratio 50 / 100), with its 95 % interval; repeatable.
    #[arg(long = "at-period", value_name = "MS")]
    at_periods: Vec<u64>,
    /// Instead of the check: the random arrivals' stopped share at this quota (ms, period
    /// 100 ms), with its 95 % interval; repeatable.
    #[arg(long = "at-quota", value_name = "MS")]
    at_quotas: Vec<u64>,
    /// Instead of the check: measure the random arrivals' truth the check judges their quotas
    /// against (about 40 minutes) and write it to docs/results/advise-check.md.
    #[arg(long)]
    measure_truth: bool,
}

/// The workloads by name, for `--workload`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Kind {
    Spiky,
    Burst,
    Arrivals,
}

/// A workload of known demand.
#[derive(Clone, Copy)]
enum Workload {
    /// Every `EVERY_MS`, `threads` threads each burn `burn_ms` of CPU at once.
    Spiky { burn_ms: u32, threads: u32 },
    /// Reference 003: 20 ms requests, 10 per second at random (seed 3), 4 workers.
    Arrivals,
}

impl Workload {
    fn kind(self) -> Kind {
        match self {
            Self::Spiky { threads: 1, .. } => Kind::Spiky,
            Self::Spiky { .. } => Kind::Burst,
            Self::Arrivals => Kind::Arrivals,
        }
    }

    fn label(self) -> String {
        match self {
            Self::Spiky {
                burn_ms,
                threads: 1,
            } => format!("spiky: {burn_ms} ms every {EVERY_MS} ms"),
            Self::Spiky { burn_ms, threads } => {
                format!("burst: {threads} requests of {burn_ms} ms on {threads} threads")
            }
            Self::Arrivals => "random arrivals: 20 ms at 10/s, 4 workers".into(),
        }
    }

    /// What a rerun may be stopped: none, or 1 % of its periods for random arrivals.
    fn allowed(self, periods: u64) -> u64 {
        match self {
            Self::Spiky { .. } => 0,
            Self::Arrivals => periods / ALLOWED_ONE_IN,
        }
    }
}

const WORKLOADS: [Workload; 3] = [
    Workload::Spiky {
        burn_ms: 80,
        threads: 1,
    },
    Workload::Spiky {
        burn_ms: 40,
        threads: 2,
    },
    Workload::Arrivals,
];

/// Settings of a rerun, µs.
#[derive(Clone, Copy)]
struct Bandwidth {
    quota_us: u64,
    period_us: u64,
    burst_us: u64,
}

impl Bandwidth {
    /// A quota of `ms` at the traced period.
    fn quota(ms: u64) -> Self {
        Self {
            quota_us: ms * 1000,
            period_us: PERIOD_US,
            burst_us: 0,
        }
    }

    /// A period of `ms` at the traced ratio, its quota to the µs.
    fn period(ms: u64) -> Self {
        Self {
            quota_us: (ms * 1000 * QUOTA_US + PERIOD_US / 2) / PERIOD_US,
            period_us: ms * 1000,
            burst_us: 0,
        }
    }
}

/// cpu.stat's deltas over a workload run's measured part.
#[derive(Clone, Copy)]
struct Outcome {
    periods: u64,
    throttled: u64,
}

impl Outcome {
    /// The stopped share's 95 % interval (Wilson's score interval for a binomial share):
    /// reruns of random arrivals are a sample of how the requests meet the period boundaries,
    /// and near 1 % a few hundred periods leave the share uncertain by about half itself.
    fn interval(self) -> (f64, f64) {
        const Z: f64 = 1.96;
        let n = self.periods.max(1) as f64;
        let share = self.throttled as f64 / n;
        let denominator = 1.0 + Z * Z / n;
        let centre = (share + Z * Z / (2.0 * n)) / denominator;
        let half = Z * (share * (1.0 - share) / n + Z * Z / (4.0 * n * n)).sqrt() / denominator;
        ((centre - half).max(0.0), (centre + half).min(1.0))
    }

    /// Whether the interval lies wholly on one side of the allowed share: `Some(true)` below
    /// it (the value works), `Some(false)` above (it is stopped), `None` undecided at this
    /// sample.
    fn decided(self) -> Option<bool> {
        let share = 1.0 / ALLOWED_ONE_IN as f64;
        match self.interval() {
            (_, hi) if hi < share => Some(true),
            (lo, _) if lo > share => Some(false),
            _ => None,
        }
    }

    fn describe(self) -> String {
        let (lo, hi) = self.interval();
        format!(
            "{} of {} periods ({:.2} %, 95 % interval {:.2}–{:.2} %)",
            self.throttled,
            self.periods,
            100.0 * self.throttled as f64 / self.periods.max(1) as f64,
            100.0 * lo,
            100.0 * hi
        )
    }
}

pub fn run(args: &Args) -> Result<()> {
    setup::run(&[setup::Part::Build])?;
    let binaries = binaries::build(Arch::HOST)?;
    let runner = Runner {
        workload_bin: &binaries.workload,
        rounds: args.rounds,
        arrivals_seconds: args.arrivals_seconds,
        arrival_periods: args.arrival_periods,
        traced_runs: args.traced_runs.max(1),
    };
    let _lock = bench::host_lock()?;
    // Taken before the runs: the commit the binaries were built from, not the one checked
    // out when a run of forty minutes ends.
    let provenance = results::Provenance::here();
    if args.measure_truth {
        return truth::measure(&runner, &provenance).map(drop);
    }
    if !args.at_periods.is_empty() || !args.at_quotas.is_empty() {
        return runner.shares(&args.at_quotas, &args.at_periods);
    }
    let mut rows = Vec::new();
    for workload in WORKLOADS
        .into_iter()
        .filter(|w| args.workloads.is_empty() || args.workloads.contains(&w.kind()))
    {
        eprintln!("advise-check: tracing {}", workload.label());
        let advice = runner.trace(&binaries.tracer, workload)?;
        eprintln!(
            "advise-check: largest run {:.1} ms on {} CPU(s), {} runs",
            num(&advice["largest_run_ns"]) as f64 / MS as f64,
            advice["largest_run_cpus"],
            advice["runs"]
        );
        rows.extend(runner.check(workload, &advice)?);
    }
    print!("{}", table(&rows));
    write_results(&rows, &provenance)?;
    let bad: Vec<&Row> = rows.iter().filter(|r| !r.ok()).collect();
    if !bad.is_empty() {
        bail!(
            "{} advised value(s) do not work or are more than {:.0} % above the smallest that does",
            bad.len(),
            (WASTE_LIMIT - 1.0) * 100.0
        );
    }
    Ok(())
}

/// One line of the table: a setting of a workload, advised and smallest (ms), or why none.
struct Row {
    workload: String,
    setting: &'static str,
    result: std::result::Result<Bisected, String>,
}

struct Bisected {
    advised_ms: u64,
    smallest_ms: u64,
    /// The advised value itself was stopped on its rerun.
    advised_failed: bool,
    /// Random arrivals: the smallest value that works lies in (from, to] as far as the tried
    /// values' 95 % intervals decide (`to` none: no value tried was decided working).
    decided: Option<(u64, Option<u64>)>,
}

impl Bisected {
    /// "(decided only outside 250–452 ms)", or nothing for a workload stopped never or always.
    fn decided_note(&self) -> String {
        match self.decided {
            None => String::new(),
            Some((from, Some(to))) => format!(" (decided only outside {from}–{to} ms)"),
            Some((from, None)) => {
                format!(" (decided only up to {from} ms: no value tried was decided working)")
            }
        }
    }
}

impl Row {
    /// Not stopped, and within [`WASTE_LIMIT`] of the smallest that works (a bisection's is
    /// never above the advised value; the truth's may be).
    fn ok(&self) -> bool {
        self.result.as_ref().map_or(true, |b| {
            !b.advised_failed && truth::near(b.advised_ms, b.smallest_ms)
        })
    }
}

/// The rows as a markdown table.
fn table<'a>(rows: impl IntoIterator<Item = &'a Row>) -> String {
    let mut s = String::from(
        "| workload | setting | advised | smallest that works | advised ÷ smallest |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        let line = match &r.result {
            Ok(b) if b.advised_failed => format!(
                "| {} | {} | {} ms | (the advised value was stopped){} | — |",
                r.workload,
                r.setting,
                b.advised_ms,
                b.decided_note()
            ),
            Ok(b) => format!(
                "| {} | {} | {} ms | {} ms{} | {:.2} |",
                r.workload,
                r.setting,
                b.advised_ms,
                b.smallest_ms,
                b.decided_note(),
                b.advised_ms as f64 / b.smallest_ms.max(1) as f64
            ),
            Err(why) => format!("| {} | {} | none: {why} | — | — |", r.workload, r.setting),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s
}

/// One section of docs/results/advise-check.md per workload checked, so that a run of one
/// (`--workload arrivals`) keeps the others' last figures.
fn write_results(rows: &[Row], provenance: &results::Provenance) -> Result<()> {
    let file = results::update(
        "advise-check.md",
        RESULTS_INTRO,
        provenance,
        &sections(rows),
    )?;
    eprintln!("advise-check: written to {}", file.display());
    Ok(())
}

/// One (workload, table of its rows) per workload, in the order they were checked.
fn sections(rows: &[Row]) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for r in rows {
        if !sections.iter().any(|(w, _)| *w == r.workload) {
            let workload_rows = rows.iter().filter(|o| o.workload == r.workload);
            sections.push((r.workload.clone(), table(workload_rows)));
        }
    }
    sections
}

/// The top of docs/results/advise-check.md.
const RESULTS_INTRO: &str = "# advise-check results\n\n\
Written by `sudo cargo xtask advise-check` (not by hand): per workload, the advised quota, \
burst and period against the smallest that works, found by bisection, from the last run that \
checked it. How the check judges: [testing.md](../testing.md#is-the-advice-wasteful-cargo-xtask-advise-check); \
what the advice is: [advice.md](../advice.md).";

struct Runner<'a> {
    workload_bin: &'a Path,
    rounds: u32,
    arrivals_seconds: u32,
    arrival_periods: u64,
    traced_runs: u64,
}

impl Runner<'_> {
    /// The workload traced at `QUOTA_US` / `PERIOD_US`: its `advice` line.
    fn trace(&self, tracer: &Path, workload: Workload) -> Result<Value> {
        let start = Bandwidth {
            quota_us: QUOTA_US,
            period_us: PERIOD_US,
            burst_us: 0,
        };
        let cgroup = cgroup::with_quota(CGROUP_NAME, start.quota_us, start.period_us)?;
        cgroup.favour();
        // A spiky workload finds a period boundary by burning until stopped, a run that is
        // no round's (more than one quota when it missed a short first stop): the tracer starts
        // after it, and the workload has rounds enough for the tracer's start and
        // `self.rounds` more.
        let mut spiky = match workload {
            Workload::Spiky { burn_ms, threads } => {
                let mut cmd = self.spiky_command(burn_ms, threads, self.rounds + LEAD_ROUNDS);
                let mut child = spawn_in(&mut cmd, &cgroup, pin(threads));
                let lines = lines_of(&mut child)?;
                let synced = lines
                    .recv_timeout(Duration::from_secs(30))
                    .context("the workload printed no synced line in 30 s")?;
                if !synced.starts_with("synced") {
                    bail!("the workload's first line is not its synced line: {synced}");
                }
                // Its round lines keep coming: the reader keeps reading them until it exits.
                Some((child, lines))
            }
            Workload::Arrivals => None,
        };
        let mut cmd = Command::new(tracer);
        cmd.args([
            "--backend",
            "tracepoint",
            "--json",
            "--cgroup",
            cgroup.path(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
        // SAFETY: prctl is async-signal-safe.
        unsafe { cmd.pre_exec(|| die_with_parent(libc::SIGINT)) };
        let mut child = Running::spawn(&mut cmd);
        let lines = lines_of(&mut child)?;
        let first = lines
            .recv_timeout(Duration::from_secs(60))
            .context("the tracer printed nothing in 60 s (see its stderr above)")?;
        if !first.contains(r#""type":"start""#) {
            bail!("the tracer's first line is not its start line: {first}");
        }
        match &mut spiky {
            Some((workload, _lines)) => {
                let status = workload.wait()?;
                if !status.success() {
                    bail!("throttle-workload spiky: {status}");
                }
            }
            None => {
                for k in 0..self.traced_runs {
                    self.arrivals(&cgroup, PERIOD_US * k / self.traced_runs)?;
                }
            }
        }
        signal(child.id(), libc::SIGINT)?;
        match wait_timeout(&mut child, Duration::from_secs(30))? {
            Some(status) if status.success() => {}
            Some(status) => bail!("the tracer exited with {status}"),
            None => bail!("the tracer did not end within 30 s of SIGINT"),
        }
        lines
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .find(|v| v["type"] == "advice" && v["cgroup"] == cgroup.path())
            .with_context(|| format!("no advice line for {}", cgroup.path()))
    }

    /// The table's rows for `workload`: each setting's advised value against the smallest.
    fn check(&self, workload: Workload, advice: &Value) -> Result<Vec<Row>> {
        let label = workload.label();
        let row = |setting, result| Row {
            workload: label.clone(),
            setting,
            result,
        };
        // Random arrivals may be stopped in 1 % of their periods: the quota and period for them
        // are the ones that stop at most that; every other workload must not be stopped at all.
        let (period_setting, period_key) = match workload {
            Workload::Arrivals => ("period (target)", "period_target"),
            Workload::Spiky { .. } => ("period", "period"),
        };
        let quotas = match workload {
            Workload::Arrivals => self.against_truth(advice)?,
            Workload::Spiky { .. } => vec![(
                "quota",
                match advice["quota"]["quota_ns"].as_u64() {
                    None => Err("the largest run fits today's quota".to_string()),
                    Some(ns) => {
                        Ok(self.bisect(workload, QUOTA_US / 1000, ns / MS, Bandwidth::quota)?)
                    }
                },
            )],
        };
        let burst = match advice["burst"]["burst_ns"].as_u64() {
            None => Err(advice["burst"]["why_not"]
                .as_str()
                .unwrap_or("none needed")
                .to_string()),
            Some(ns) => Ok(self.bisect(workload, 0, ns / MS, |ms| Bandwidth {
                quota_us: QUOTA_US,
                period_us: PERIOD_US,
                burst_us: ms * 1000,
            })?),
        };
        let period = match advice[period_key]["period_ns"].as_u64() {
            None => Err(advice["period_why_not"]
                .as_str()
                .unwrap_or("none needed")
                .to_string()),
            Some(ns) => Ok(self.bisect(workload, PERIOD_US / 1000, ns / MS, Bandwidth::period)?),
        };
        let mut rows: Vec<Row> = quotas.into_iter().map(|(s, r)| row(s, r)).collect();
        rows.push(row("burst", burst));
        rows.push(row(period_setting, period));
        Ok(rows)
    }

    /// The random arrivals' recommended and no-stop quotas against the truth
    /// ([`truth::read`]): the recommended one rerun, and stopped only if its interval decides it.
    fn against_truth(
        &self,
        advice: &Value,
    ) -> Result<Vec<(&'static str, std::result::Result<Bisected, String>)>> {
        let truth = truth::read()?;
        let advised_ms = |key: &str| {
            advice[key]["quota_ns"]
                .as_u64()
                .map(|ns| ns / MS)
                .with_context(|| format!("the advice has no {key} quota: {advice}"))
        };
        let recommended_ms = advised_ms("recommended")?;
        let (_, outcome) = self.passes(Workload::Arrivals, Bandwidth::quota(recommended_ms))?;
        let no_stop_ms = advised_ms("no_stop")?;
        eprintln!(
            "advise-check: no-stop quota {no_stop_ms} ms at 100 ms = {:.2} CPUs (reference 003: \
             1.0 CPU stopped 0.38 % of its periods, 1.5 CPUs none)",
            no_stop_ms as f64 / (PERIOD_US / 1000) as f64
        );
        let judged = |advised_ms, truth_ms, advised_failed| {
            Ok(Bisected {
                advised_ms,
                smallest_ms: truth_ms,
                advised_failed,
                decided: None,
            })
        };
        Ok(vec![
            (
                "quota (target) against the truth",
                judged(
                    recommended_ms,
                    truth.target_ms,
                    outcome.decided() == Some(false),
                ),
            ),
            (
                "quota (no stop) against the truth",
                judged(no_stop_ms, truth.no_stop_ms, false),
            ),
        ])
    }

    /// The smallest value in (`failing_ms`, `advised_ms`] (1 ms steps) whose settings let a
    /// rerun through, taking `failing_ms` as stopped and checking `advised_ms` first.
    fn bisect(
        &self,
        workload: Workload,
        failing_ms: u64,
        advised_ms: u64,
        settings: impl Fn(u64) -> Bandwidth,
    ) -> Result<Bisected> {
        let mut tried = Vec::new();
        let mut trial = |ms| -> Result<bool> {
            let (pass, outcome) = self.passes(workload, settings(ms))?;
            tried.push((ms, outcome));
            Ok(pass)
        };
        let advised_failed = !trial(advised_ms)?;
        let (mut lo, mut hi) = (failing_ms, advised_ms);
        while !advised_failed && hi > lo + 1 {
            let mid = lo + (hi - lo) / 2;
            if trial(mid)? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Ok(Bisected {
            advised_ms,
            smallest_ms: hi,
            advised_failed,
            decided: matches!(workload, Workload::Arrivals)
                .then(|| decided_between(&tried, failing_ms)),
        })
    }

    /// The random arrivals' stopped share at each quota (period 100 ms) and each period (at the
    /// ratio 50 / 100), with its 95 % interval: how sharply the share crosses 1 %.
    fn shares(&self, quotas_ms: &[u64], periods_ms: &[u64]) -> Result<()> {
        let settings = quotas_ms
            .iter()
            .map(|&ms| ("quota", ms, Bandwidth::quota(ms)))
            .chain(
                periods_ms
                    .iter()
                    .map(|&ms| ("period", ms, Bandwidth::period(ms))),
            );
        let mut lines = Vec::new();
        for (setting, ms, b) in settings {
            let (_, outcome) = self.passes(Workload::Arrivals, b)?;
            let verdict = match outcome.decided() {
                Some(true) => "works",
                Some(false) => "stopped",
                None => "undecided",
            };
            lines.push(format!(
                "| {setting} | {ms} ms | {} | {verdict} |",
                outcome.describe()
            ));
        }
        println!(
            "| setting | value | nr_throttled of nr_periods | against 1 % |\n|---|---|---|---|"
        );
        for line in lines {
            println!("{line}");
        }
        Ok(())
    }

    /// Whether a rerun of `workload` at `b` in a fresh cgroup is stopped no more than allowed,
    /// and cpu.stat's counts.
    fn passes(&self, workload: Workload, b: Bandwidth) -> Result<(bool, Outcome)> {
        let outcome = match workload {
            Workload::Spiky { burn_ms, threads } => {
                // The workload finds the period boundary by a stop of 30 ms or more, which a
                // quota above 70 % of the period does not make: it syncs at half the period,
                // and `b`'s quota is written once it has (the period timer keeps its phase).
                let cgroup = cgroup::with_quota(CGROUP_NAME, b.period_us / 2, b.period_us)?;
                cgroup.favour();
                if b.burst_us > 0 {
                    cgroup.set_burst(b.burst_us);
                }
                self.spiky(&cgroup, b, burn_ms, threads, self.rounds)?
            }
            Workload::Arrivals => {
                let run_us = u64::from(self.arrivals_seconds) * 1_000_000;
                let reruns = (self.arrival_periods * b.period_us).div_ceil(run_us.max(1));
                self.arrivals_at(b, (0..reruns).map(|k| b.period_us * k / reruns))?
            }
        };
        let pass = outcome.throttled <= workload.allowed(outcome.periods);
        eprintln!(
            "advise-check: {} at quota {} µs / period {} µs, burst {} µs: nr_throttled {}{}",
            workload.label(),
            b.quota_us,
            b.period_us,
            b.burst_us,
            outcome.describe(),
            if pass { "" } else { " (stopped)" }
        );
        Ok((pass, outcome))
    }

    /// `throttle-workload spiky` in `cgroup` (see [`pin`]), synced at the cgroup's quota and then
    /// run at `b`'s: cpu.stat from 50 ms before its first round (the stops that found the
    /// boundary over) to its exit.
    fn spiky(
        &self,
        cgroup: &Cgroup,
        b: Bandwidth,
        burn_ms: u32,
        threads: u32,
        rounds: u32,
    ) -> Result<Outcome> {
        let mut cmd = self.spiky_command(burn_ms, threads, rounds);
        let mut child = spawn_in(&mut cmd, cgroup, pin(threads));
        let stdout = BufReader::new(child.stdout.take().context("workload stdout")?);
        let mut from = None;
        for line in stdout.lines() {
            let line = line.context("reading the workload's lines")?;
            if let Some(r) = line.strip_prefix("synced refill_ns ") {
                let refill_ns: u64 = r.trim().parse().context("refill_ns")?;
                cgroup.set_quota(Some(b.quota_us), b.period_us);
                if rounds > 0 {
                    let due = refill_ns + EVERY_MS * MS - 50 * MS;
                    thread::sleep(Duration::from_nanos(due.saturating_sub(monotonic_ns())));
                }
                from = Some((cgroup.stat().nr_periods, cgroup.stat().nr_throttled));
            }
        }
        let status = child.wait()?;
        if !status.success() {
            bail!("throttle-workload spiky: {status}");
        }
        let (periods, throttled) = from.context("the workload printed no synced line")?;
        Ok(Outcome {
            periods: cgroup.stat().nr_periods - periods,
            throttled: cgroup.stat().nr_throttled - throttled,
        })
    }

    /// cpu.stat summed over reruns of the random arrivals at `b`, one in a fresh cgroup per
    /// delay of the first request (µs; see [`Runner::arrivals`]).
    fn arrivals_at(&self, b: Bandwidth, delays_us: impl Iterator<Item = u64>) -> Result<Outcome> {
        let mut all = Outcome {
            periods: 0,
            throttled: 0,
        };
        for delay_us in delays_us {
            let cgroup = cgroup::with_quota(CGROUP_NAME, b.quota_us, b.period_us)?;
            cgroup.favour();
            if b.burst_us > 0 {
                cgroup.set_burst(b.burst_us);
            }
            let one = self.arrivals(&cgroup, delay_us)?;
            all.periods += one.periods;
            all.throttled += one.throttled;
        }
        Ok(all)
    }

    fn spiky_command(&self, burn_ms: u32, threads: u32, rounds: u32) -> Command {
        let mut cmd = Command::new(self.workload_bin);
        cmd.args(["spiky", "--every-ms", &EVERY_MS.to_string()])
            .args(["--burn-ms", &burn_ms.to_string()])
            .args(["--rounds", &rounds.to_string()])
            .args(["--threads", &threads.to_string()]);
        cmd
    }

    /// `throttle-workload arrivals` in `cgroup`, unpinned, its first request `delay_us` later
    /// than it would come: cpu.stat over the whole run.
    ///
    /// A fresh cgroup's period boundaries fall at nearly the same offset from its workload's
    /// start every time (its quota is written just before it), and the seeded requests come at
    /// the same offsets too, so without the delay every rerun would meet the requests at
    /// nearly one phase of the boundaries: whether 1 % of the periods stop is decided by which
    /// requests share a period, which the phase decides, and the advice is for every phase.
    fn arrivals(&self, cgroup: &Cgroup, delay_us: u64) -> Result<Outcome> {
        let mut cmd = Command::new(self.workload_bin);
        cmd.args([
            "arrivals",
            "--rate",
            "10",
            "--cost-ms",
            "20",
            "--threads",
            "4",
        ])
        .args([
            "--seconds",
            &self.arrivals_seconds.to_string(),
            "--seed",
            "3",
            "--delay-us",
            &delay_us.to_string(),
        ]);
        let (periods, throttled) = (cgroup.stat().nr_periods, cgroup.stat().nr_throttled);
        let child = spawn_in(&mut cmd, cgroup, None);
        let out = child.wait_with_output();
        if !out.status.success() {
            bail!("throttle-workload arrivals: {}", out.status);
        }
        Ok(Outcome {
            periods: cgroup.stat().nr_periods - periods,
            throttled: cgroup.stat().nr_throttled - throttled,
        })
    }
}

/// Where the tried values' 95 % intervals leave the smallest value that works: above the
/// largest decided stopped (`failing_ms`, taken as stopped, if none) and at or below the smallest
/// decided working, if any. A bisection's answer between them is the sample's luck.
fn decided_between(tried: &[(u64, Outcome)], failing_ms: u64) -> (u64, Option<u64>) {
    let verdicts = || {
        tried
            .iter()
            .filter_map(|&(ms, o)| o.decided().map(|works| (ms, works)))
    };
    let from = verdicts()
        .filter(|&(_, works)| !works)
        .map(|(ms, _)| ms)
        .fold(failing_ms, u64::max);
    let to = verdicts()
        .filter(|&(ms, works)| works && ms > from)
        .map(|(ms, _)| ms)
        .min();
    (from, to)
}

/// One thread is pinned to the last CPU, so that one cfs_rq spends the quota; more threads are
/// not pinned.
fn pin(threads: u32) -> Option<usize> {
    (threads == 1).then(test_support::last_cpu)
}

/// Starts `cmd` inside `cgroup` as the host tests do, its stdout piped, killed with xtask.
fn spawn_in(cmd: &mut Command, cgroup: &Cgroup, cpu: Option<usize>) -> Running {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    // SAFETY: prctl is async-signal-safe.
    unsafe { cmd.pre_exec(|| die_with_parent(libc::SIGKILL)) };
    test_support::spawn_in(cmd, cgroup, cpu)
}

/// `child`'s stdout lines, read on a thread of their own.
fn lines_of(child: &mut Child) -> Result<mpsc::Receiver<String>> {
    let stdout = child.stdout.take().context("the tracer's stdout")?;
    Ok(test_support::stdout_lines(stdout))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(throttled: u64, periods: u64) -> Outcome {
        Outcome { periods, throttled }
    }

    #[test]
    fn the_share_has_wilsons_interval() {
        // 20 of 100: Wilson's 95 % interval is 13.3–28.9 %.
        let (lo, hi) = outcome(20, 100).interval();
        assert!(
            (lo - 0.1333).abs() < 1e-3 && (hi - 0.2893).abs() < 1e-3,
            "{lo} {hi}"
        );
        // None stopped still leaves an upper bound above 0.
        let (lo, hi) = outcome(0, 560).interval();
        assert!(lo == 0.0 && (hi - 0.00681).abs() < 1e-4, "{lo} {hi}");
        // Five of 587 (advise-check's 282 ms) decides nothing against 1 %.
        assert_eq!(outcome(5, 587).decided(), None);
        assert_eq!(outcome(0, 560).decided(), Some(true));
        assert_eq!(outcome(20, 560).decided(), Some(false));
    }

    #[test]
    fn a_bisection_is_decided_only_where_the_intervals_exclude_one_percent() {
        let tried = [
            (452, outcome(0, 560)),
            (276, outcome(9, 600)),
            (364, outcome(1, 580)),
            (320, outcome(7, 570)),
            (250, outcome(25, 620)),
            (298, outcome(6, 590)),
        ];
        assert_eq!(decided_between(&tried, 100), (250, Some(364)));
        assert_eq!(decided_between(&tried[1..2], 100), (100, None));
    }

    #[test]
    fn the_results_have_a_section_per_workload_with_its_rows() {
        let row = |workload: &str, setting, result| Row {
            workload: workload.into(),
            setting,
            result,
        };
        let bisected = |advised_ms, smallest_ms| Bisected {
            advised_ms,
            smallest_ms,
            advised_failed: false,
            decided: None,
        };
        let rows = [
            row("spiky", "quota", Ok(bisected(85, 80))),
            row("arrivals", "burst", Err("no burst".into())),
            row("spiky", "period", Ok(bisected(170, 161))),
        ];
        let sections = sections(&rows);
        let headings: Vec<&str> = sections.iter().map(|(w, _)| w.as_str()).collect();
        assert_eq!(headings, ["spiky", "arrivals"]);
        assert_eq!(
            sections[0].1,
            "| workload | setting | advised | smallest that works | advised ÷ smallest |\n\
             |---|---|---|---|---|\n\
             | spiky | quota | 85 ms | 80 ms | 1.06 |\n\
             | spiky | period | 170 ms | 161 ms | 1.06 |\n"
        );
        assert!(
            sections[1]
                .1
                .ends_with("| arrivals | burst | none: no burst | — | — |\n")
        );
    }
}
