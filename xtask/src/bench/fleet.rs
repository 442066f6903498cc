//! What `serve` costs over a node's worth of quota'd cgroups: 1,000 cgroups (150 stopped every few
//! periods, 350 lightly loaded, 500 idle), traced at once by the default `serve` and its reference
//! `serve --no-advice`, side by side so that both see the same load, each scraped every
//! [`Fleet::every`]. The fleet, the figures and why: docs/performance.md ("The sections", serve
//! over a fleet).
use super::Bench;
use super::procfs::{self, Memory};
use super::procs::Workload;
use super::scrape::{self, Serve};
use super::table::Row;
use crate::cgroup::Tree;
use anyhow::Result;
use std::thread;
use std::time::{Duration, Instant};
use test_support::Cgroup;

const SECTION: &str = "serve over a fleet of quota'd cgroups (100 ms periods)";
/// The same measured after a warm-up longer than the first minute (`--warm-minutes`): a
/// section of its own, so that the results file keeps the ten minutes beside it.
const SECTION_WARMED: &str =
    "serve over a fleet of quota'd cgroups (100 ms periods), after a long warm-up";
const PARENT: &str = "xtask-bench-fleet";
const PERIOD_US: u64 = 100_000;
/// The stopped cgroups' quota: a busy loop uses it up at once, and overruns it by up to a tick.
const STOPPED_QUOTA_US: u64 = 1_000;
/// The light and idle cgroups' quota, well above the light task's bursts.
const LIGHT_QUOTA_US: u64 = 10_000;
/// The light task: `throttle-workload spiky`, a 1 ms burn every second (its first burn runs
/// until its quota stops it once, to find the period's boundary).
const LIGHT_EVERY_MS: u64 = 1_000;
const LIGHT_BURN_MS: u64 = 1;

/// Targets of issue 23: the agent's CPU, its resident memory and a scrape's time.
const CPU_TARGET_PERCENT: f64 = 2.0;
const RSS_TARGET_MIB: f64 = 64.0;
const SCRAPE_TARGET_MS: f64 = 100.0;

/// The fleet and how long it is traced.
struct Fleet {
    stopped: usize,
    light: usize,
    idle: usize,
    length: Duration,
    /// The warm-up: figures are taken from its end (a multiple of `every`).
    warm: Duration,
    /// Between two scrapes (and samples of the agents' processes).
    every: Duration,
}

impl Fleet {
    /// Issue 23's fleet for `minutes`, the first `warm_minutes` warming up, leaving at least a
    /// minute (half a shorter run) measured.
    fn full((minutes, warm_minutes): (u64, u64)) -> Self {
        let every = Duration::from_secs(15);
        let length = Duration::from_secs(minutes.max(1) * 60);
        let measured = (length / 2).min(Duration::from_secs(60));
        Self {
            stopped: 150,
            light: 350,
            idle: 500,
            length,
            warm: Duration::from_secs(warm_minutes.max(1) * 60).min(length - measured),
            every,
        }
    }

    /// A tenth of the fleet for 20 seconds: that every figure can still be taken.
    fn smoke() -> Self {
        Self {
            stopped: 15,
            light: 35,
            idle: 50,
            length: Duration::from_secs(20),
            warm: Duration::from_secs(10),
            every: Duration::from_secs(5),
        }
    }

    fn cgroups(&self) -> usize {
        self.stopped + self.light + self.idle
    }
}

/// What one agent showed over the run.
#[derive(Default)]
struct Agent {
    /// (minutes since the start, MiB) from the warm-up's end on.
    rss: Vec<(f64, f64)>,
    /// (seconds since the start, CPU seconds) at the warm-up's end and at the end.
    cpu_warm: (f64, f64),
    cpu_end: (f64, f64),
    /// (bytes, ms) of each scrape from the warm-up's end on, by encoding.
    text: Vec<(f64, f64)>,
    protobuf: Vec<(f64, f64)>,
    /// The last text scrape.
    last_text: String,
}

impl Agent {
    fn cpu_percent(&self) -> f64 {
        (self.cpu_end.1 - self.cpu_warm.1) / (self.cpu_end.0 - self.cpu_warm.0) * 100.0
    }

    /// The value of the unlabelled counter `family` in the last text scrape.
    fn counter(&self, family: &str) -> f64 {
        self.last_text
            .lines()
            .find_map(|l| l.strip_prefix(family)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Series of `family` (a counter's name) in the last text scrape: one per cgroup.
    fn series(&self, family: &str) -> usize {
        let prefix = format!("{family}{{");
        self.last_text
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .count()
    }
}

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    let fleet = if bench.smoke {
        Fleet::smoke()
    } else {
        Fleet::full(bench.fleet_minutes)
    };
    let tree = Tree::create(PARENT, fleet.cgroups(), STOPPED_QUOTA_US, PERIOD_US)?;
    tree.yield_to_others();
    let (stopped, rest) = tree.children.split_at(fleet.stopped);
    let light = &rest[..fleet.light];
    for cgroup in rest {
        cgroup.set_quota(Some(LIGHT_QUOTA_US), PERIOD_US);
    }
    let selection = format!("/{PARENT}/c*");
    let traced = ["--backend", "tracepoint", "--cgroup", &selection];
    let serves = [
        Serve::start(&bench.tracer, &traced)?,
        Serve::start(&bench.tracer, &[&traced[..], &["--no-advice"]].concat())?,
    ];
    // Dropped (killed) before the serves and the tree.
    let seconds = fleet.length.as_secs() + 60;
    let mut loads = Vec::new();
    for cgroup in stopped {
        loads.push(Workload::busy(&bench.workload, 1, seconds)?);
        cgroup.add(loads.last().expect("pushed").pid());
    }
    let rounds = (seconds * 1000 / LIGHT_EVERY_MS).to_string();
    let (every_ms, burn_ms) = (LIGHT_EVERY_MS.to_string(), LIGHT_BURN_MS.to_string());
    for cgroup in light {
        loads.push(Workload::spawn(
            &bench.workload,
            &[
                "spiky",
                "--every-ms",
                &every_ms,
                "--burn-ms",
                &burn_ms,
                "--rounds",
                &rounds,
            ],
        )?);
        cgroup.add(loads.last().expect("pushed").pid());
    }
    let started = Instant::now();
    let ticks = (fleet.length.as_secs() / fleet.every.as_secs()) as u32;
    let warm_tick = (fleet.warm.as_secs() / fleet.every.as_secs()) as u32;
    let mut agents = [Agent::default(), Agent::default()];
    let mut periods = [(0, 0); 2];
    for tick in 1..=ticks {
        thread::sleep((started + fleet.every * tick).saturating_duration_since(Instant::now()));
        let accept = if tick % 2 == 0 {
            scrape::TEXT
        } else {
            scrape::PROTOBUF
        };
        let mut line = format!("serve-fleet: {:>4.0} s", started.elapsed().as_secs_f64());
        for ((agent, serve), name) in agents.iter_mut().zip(&serves).zip(["advice", "reference"]) {
            // Read before the scrape: the CPU between two readings holds one scrape.
            let cpu = (
                started.elapsed().as_secs_f64(),
                procfs::cpu_seconds(serve.pid())?,
            );
            let rss = Memory::of(serve.pid())?.rss as f64 / f64::from(1 << 20);
            let answer = serve.scrape(accept)?;
            line += &format!(
                ", {name}: RSS {rss:.1} MiB, scrape {:.2} MB in {:.0} ms",
                answer.body.len() as f64 / 1e6,
                answer.took.as_secs_f64() * 1e3
            );
            if tick < warm_tick {
                continue;
            }
            if tick == warm_tick {
                agent.cpu_warm = cpu;
            }
            agent.cpu_end = cpu;
            agent.rss.push((cpu.0 / 60.0, rss));
            let figures = (answer.body.len() as f64, answer.took.as_secs_f64() * 1e3);
            if accept == scrape::TEXT {
                agent.text.push(figures);
                agent.last_text = String::from_utf8_lossy(&answer.body).into_owned();
            } else {
                agent.protobuf.push(figures);
            }
        }
        // Each scrape as it comes: a slow one can be placed in the run.
        eprintln!("{line}");
        if tick == warm_tick {
            periods[0] = fleet_periods(&tree.children)?;
        }
        periods[1] = fleet_periods(&tree.children)?;
    }
    drop(loads);
    for mut serve in serves {
        serve.stop()?;
    }
    let seconds = (fleet.length - fleet.warm).as_secs_f64();
    Ok(table(&fleet, &agents, seconds, periods))
}

/// Σ over the fleet of cpu.stat's (nr_periods, nr_throttled).
fn fleet_periods(cgroups: &[Cgroup]) -> Result<(u64, u64)> {
    let mut sum = (0, 0);
    for cgroup in cgroups {
        let stat = cgroup.stat();
        sum.0 += stat.nr_periods;
        sum.1 += stat.nr_throttled;
    }
    Ok(sum)
}

/// The rows: each figure of the measured agent against its reference's.
fn table(fleet: &Fleet, agents: &[Agent; 2], seconds: f64, periods: [(u64, u64); 2]) -> Vec<Row> {
    let section = if fleet.warm > Duration::from_secs(60) {
        SECTION_WARMED
    } else {
        SECTION
    };
    const REFERENCE: &str = "serve --no-advice";
    let [advice, reference] = agents;
    let median = |values: &[f64]| super::table::Summary::of(values).median;
    let judged = |value: f64, target: f64, unit: &str| {
        let verdict = if value <= target { "met" } else { "MISSED" };
        format!("target ≤ {target} {unit}: {verdict}")
    };
    let mut rows = Vec::new();
    let cpu = advice.cpu_percent();
    rows.push(
        Row::new(section, "agent CPU (utime + stime)", "% of a CPU", &[cpu])
            .against(REFERENCE, reference.cpu_percent())
            .note(format!(
                "{} cgroups ({} stopped, {} light, {} idle), {:.1} min after {:.0} s of warm-up; {}",
                fleet.cgroups(),
                fleet.stopped,
                fleet.light,
                fleet.idle,
                seconds / 60.0,
                fleet.warm.as_secs_f64(),
                judged(cpu, CPU_TARGET_PERCENT, "%")
            )),
    );
    let first = |a: &Agent| a.rss.first().map_or(f64::NAN, |&(_, m)| m);
    let last = |a: &Agent| a.rss.last().map_or(f64::NAN, |&(_, m)| m);
    rows.push(
        Row::new(section, "RSS once warm", "MiB", &[first(advice)])
            .against(REFERENCE, first(reference)),
    );
    rows.push(
        Row::new(section, "RSS at the end", "MiB", &[last(advice)])
            .against(REFERENCE, last(reference))
            .note(judged(last(advice), RSS_TARGET_MIB, "MiB")),
    );
    rows.push(
        Row::new(
            section,
            "RSS slope once warm",
            "MiB/h",
            &[slope(&advice.rss) * 60.0],
        )
        .against(REFERENCE, slope(&reference.rss) * 60.0)
        .note(format!(
            "least squares over {} samples, one every {} s",
            advice.rss.len(),
            fleet.every.as_secs()
        )),
    );
    let formats = [
        ("text format", &advice.text, &reference.text, "`*/*`"),
        (
            "protobuf",
            &advice.protobuf,
            &reference.protobuf,
            "delimited protobuf `Accept`",
        ),
    ];
    for (format, measured, referenced, accept) in formats {
        let sizes = |s: &[(f64, f64)]| s.iter().map(|&(b, _)| b / 1e6).collect::<Vec<_>>();
        let times = |s: &[(f64, f64)]| s.iter().map(|&(_, ms)| ms).collect::<Vec<_>>();
        rows.push(
            Row::new(
                section,
                format!("scrape size, {format}"),
                "MB",
                &sizes(measured),
            )
            .against(REFERENCE, median(&sizes(referenced)))
            .note(accept),
        );
        let slowest = |s: &[(f64, f64)]| times(s).into_iter().fold(f64::NAN, f64::max);
        rows.push(
            Row::new(
                section,
                format!("scrape time, {format}"),
                "ms",
                &times(measured),
            )
            .against(REFERENCE, median(&times(referenced)))
            .note(format!(
                "connect to last byte; the reference's slowest {:.0} ms; {}",
                slowest(referenced),
                judged(slowest(measured), SCRAPE_TARGET_MS, "ms (the slowest)")
            )),
        );
    }
    rows.push(
        Row::new(
            section,
            "cgroups with stop series",
            "cgroups",
            &[advice.series("throttle_tracer_stops_total") as f64],
        )
        .against(
            REFERENCE,
            reference.series("throttle_tracer_stops_total") as f64,
        )
        .note(format!(
            "{} with demand series (throttle_tracer_periods_total)",
            advice.series("throttle_tracer_periods_total")
        )),
    );
    const LOST: &str = "throttle_tracer_lost_records_total";
    rows.push(
        Row::new(section, "records lost", "records", &[advice.counter(LOST)])
            .against(REFERENCE, reference.counter(LOST))
            .note(format!("{LOST} at the last text scrape")),
    );
    let [(periods0, throttled0), (periods1, throttled1)] = periods;
    rows.push(
        Row::new(
            section,
            "the fleet's throttled periods (cpu.stat)",
            "/s",
            &[(throttled1 - throttled0) as f64 / seconds],
        )
        .against("its periods", (periods1 - periods0) as f64 / seconds)
        .note("the load both agents traced, Σ nr_throttled and nr_periods over the fleet"),
    );
    rows
}

/// The least-squares slope of `points` (y per x); NaN below two points.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(x, y), &(px, py)| (x + px / n, y + py / n));
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), &(x, y)| {
        (sxy + (x - mx) * (y - my), sxx + (x - mx).powi(2))
    });
    if points.len() < 2 || sxx == 0.0 {
        f64::NAN
    } else {
        sxy / sxx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_too_few_points() {
        let line: Vec<(f64, f64)> = (0..5)
            .map(|x| (f64::from(x), 3.0 + 0.5 * f64::from(x)))
            .collect();
        assert!((slope(&line) - 0.5).abs() < 1e-12);
        assert!(slope(&[(1.0, 2.0), (1.0, 3.0)]).is_nan());
        assert!(slope(&line[..1]).is_nan());
    }

    #[test]
    fn the_full_fleet_warms_up_as_asked_or_half_a_short_run() {
        let ten = Fleet::full((10, 1));
        assert_eq!((ten.cgroups(), ten.warm), (1000, Duration::from_secs(60)));
        assert_eq!(Fleet::full((1, 1)).warm, Duration::from_secs(30));
        assert_eq!(Fleet::full((20, 15)).warm, Duration::from_secs(900));
        assert_eq!(Fleet::full((5, 9)).warm, Duration::from_secs(240));
    }
}
