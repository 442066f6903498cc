//! What tracing costs the traced: `perf bench sched pipe` pinned to one CPU and `perf bench sched
//! messaging`, without a tracer, with throttle-tracer, with empty programs on its hooks (the floor)
//! and with bpftrace, in rotating rounds so that a drift of the host's load weighs on all alike:
//! the median slowdown over the rounds with its 95 % interval. Why pinned, and how a round is
//! taken: docs/performance.md ("The sections", slowdown).
use super::bpf::Floor;
use super::procs::{self, Traced};
use super::table::{Row, Summary, median_ci95};
use super::{BPFTRACE_CHECK, Bench, PerfBench, PerfRun, TRACEPOINT};
use anyhow::Result;

const SECTION: &str = "slowdown of the traced";

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Without,
    Floor,
    Tracer,
    Bpftrace,
}

const SIDES: [Side; 4] = [Side::Without, Side::Floor, Side::Tracer, Side::Bpftrace];

/// What a side holds attached while the workloads run: the floors detach when dropped, a
/// tracer is stopped.
struct Attached {
    _floors: Vec<Floor>,
    traced: Option<Traced>,
}

impl Side {
    fn attach(self, bench: &Bench, hooks: &[String]) -> Result<Attached> {
        let floors = match self {
            Side::Floor => hooks
                .iter()
                .map(|h| Floor::attach(h))
                .collect::<Result<_>>()?,
            _ => Vec::new(),
        };
        let traced = match self {
            Side::Tracer => Some(Traced::tracer(&bench.tracer, TRACEPOINT, &[])?),
            Side::Bpftrace => Some(Traced::bpftrace(&BPFTRACE_CHECK)?),
            Side::Without | Side::Floor => None,
        };
        Ok(Attached {
            _floors: floors,
            traced,
        })
    }
}

/// A benchmark as this section runs it.
struct Workload {
    bench: PerfBench,
    /// Runs per side and round, of which the round keeps the fastest: what disturbs a run here
    /// (the host, the previous side's exits) only ever adds time, in about one run of five.
    repeats: usize,
    /// Whether the rows use the CPU time rather than perf's own time (see [`PerfRun`]).
    cpu_time: bool,
    /// Whether its time is its context switches, so that the added time per switch means
    /// something (the pipe's; hackbench's is mostly its socket writes and reads).
    per_switch: bool,
}

impl Workload {
    /// The measure the rows use, of the run's fastest repeat; the other, for the notes.
    fn measures(&self, run: &[PerfRun]) -> (f64, f64) {
        let fastest = |m: fn(&PerfRun) -> f64| run.iter().map(m).fold(f64::INFINITY, f64::min);
        let (cpu, wall) = (fastest(|r| r.cpu), fastest(|r| r.wall));
        if self.cpu_time {
            (cpu, wall)
        } else {
            (wall, cpu)
        }
    }
}

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    let last_cpu = std::thread::available_parallelism().map_or(1, usize::from) - 1;
    let (loops, groups, messages, repeats) = if bench.smoke {
        (2_000, 1, 10, 1)
    } else {
        (10_000, 2, 50, 5)
    };
    let workloads = [
        // perf's own time: the CPU time would add perf's start-up (~8 ms, a sixth of this run)
        // to every side; on a CPU of their own the two tasks' time is the CPU's.
        Workload {
            bench: PerfBench::pipe(loops).on_cpu(last_cpu),
            repeats,
            cpu_time: false,
            per_switch: true,
        },
        // The CPU time: 80 tasks on 2 CPUs end when the last does, wherever the scheduler put
        // them (the wall time's interval was three times wider).
        Workload {
            bench: PerfBench::messaging(groups, messages),
            repeats: repeats.div_ceil(2),
            cpu_time: true,
            per_switch: false,
        },
    ];
    let hooks = procs::tracer_hooks(&bench.tracer)?;
    for w in &workloads {
        w.bench.run()?; // warm-up
    }
    // runs[workload][side][round]: the repeats.
    let mut runs: Vec<[Vec<Vec<PerfRun>>; 4]> =
        workloads.iter().map(|_| Default::default()).collect();
    for round in 0..bench.runs {
        for k in 0..SIDES.len() {
            let side = (round + k) % SIDES.len();
            let attached = SIDES[side].attach(bench, &hooks)?;
            for (w, workload) in workloads.iter().enumerate() {
                let repeats = (0..workload.repeats)
                    .map(|_| workload.bench.run())
                    .collect::<Result<_>>()?;
                runs[w][side].push(repeats);
            }
            if let Some(mut traced) = attached.traced {
                traced.stop()?;
            }
        }
        let this: Vec<String> = workloads
            .iter()
            .zip(&runs)
            .map(|(w, sides)| format!("{:.4?}", sides.each_ref().map(|s| w.measures(&s[round]).0)))
            .collect();
        eprintln!(
            "bench: slowdown: round {}/{}, no tracer / floor / tracer / bpftrace: {}",
            round + 1,
            bench.runs,
            this.join(" ")
        );
    }
    Ok(workloads
        .iter()
        .zip(&runs)
        .flat_map(|(w, runs)| workload_rows(w, runs, hooks.len()))
        .collect())
}

/// The rows of one workload from its runs per side (in [`SIDES`]' order), round by round.
fn workload_rows(workload: &Workload, runs: &[Vec<Vec<PerfRun>>; 4], programs: usize) -> Vec<Row> {
    let name = workload.bench.command_line();
    let (measure, other) = if workload.cpu_time {
        ("CPU time", "perf's time")
    } else {
        ("perf's time", "CPU time")
    };
    // [side][round]: (the rows' measure, the other), seconds.
    let measured: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|rounds| rounds.iter().map(|r| workload.measures(r)).collect())
        .collect();
    let without = &measured[0];
    let switches: Vec<f64> = runs[0]
        .iter()
        .flatten()
        .map(|r| r.switches as f64)
        .collect();
    let switches = Summary::of(&switches).median;
    let ms: Vec<f64> = without.iter().map(|m| m.0 * 1e3).collect();
    let mut rows = vec![
        Row::new(SECTION, format!("{name}, no tracer: {measure}"), "ms", &ms).note(format!(
            "the fastest of {} runs a round; {other} {:.1} ms (median); {switches:.0} context \
             switches a run",
            workload.repeats,
            Summary::of(&without.iter().map(|m| m.1 * 1e3).collect::<Vec<_>>()).median,
        )),
    ];
    // Per round, a side's slowdown against the run without, in the measure (`pick`) given.
    let slowdown = |side: usize, pick: fn(&(f64, f64)) -> f64| -> Vec<f64> {
        measured[side]
            .iter()
            .zip(without)
            .map(|(with, without)| (pick(with) / pick(without) - 1.0) * 100.0)
            .collect()
    };
    let floor = slowdown(1, |m| m.0);
    for (side, label) in [
        (1, format!("{programs} empty programs (floor)")),
        (2, "throttle-tracer".to_owned()),
        (3, "bpftrace".to_owned()),
    ] {
        let ours = slowdown(side, |m| m.0);
        let mut note = interval(&ours, " %");
        if workload.per_switch {
            let added: Vec<f64> = measured[side]
                .iter()
                .zip(without)
                .map(|(with, without)| (with.0 - without.0) / switches * 1e9)
                .collect();
            note += &format!(
                "; {:+.0} ns per context switch (median)",
                Summary::of(&added).median
            );
        }
        note += &format!("; {other}: {}", interval(&slowdown(side, |m| m.1), " %"));
        let row = Row::new(SECTION, format!("{name}: slowdown, {label}"), "%", &ours).note(note);
        rows.push(if side == 1 {
            row
        } else {
            row.against("floor's slowdown", Summary::of(&floor).median)
        });
    }
    // What the tracer's programs add to the dispatch: the paired difference of the two.
    let above: Vec<f64> = slowdown(2, |m| m.0)
        .iter()
        .zip(&floor)
        .map(|(tracer, floor)| tracer - floor)
        .collect();
    rows.push(
        Row::new(
            SECTION,
            format!("{name}: throttle-tracer − floor"),
            "pp",
            &above,
        )
        .note(interval(&above, " pp")),
    );
    rows
}

/// "median +5.62 % (95 % CI +5.31 to +5.94), mean +4.48 % ± 2.50, 30 rounds": the median's
/// interval is the sign test's, which a disturbed round moves by one place whatever its size;
/// the mean's is Student's, which it moves by its size over the rounds.
fn interval(values: &[f64], unit: &str) -> String {
    let s = Summary::of(values);
    let median = match median_ci95(values) {
        Some((lo, hi)) => format!("(95 % CI {lo:+.2} to {hi:+.2})"),
        None => "(too few rounds for an interval)".to_owned(),
    };
    format!(
        "median {:+.2}{unit} {median}, mean {:+.2}{unit} ± {:.2}, {} rounds",
        s.median,
        s.mean,
        s.ci95(),
        s.n
    )
}
