//! What tracing costs the traced: `perf bench sched pipe` (two tasks, a context switch per
//! message) and `perf bench sched messaging` (hackbench: groups of senders and receivers)
//! without a tracer, with throttle-tracer's tracepoint backend, and with bpftrace's check, in
//! rotating order so that a drift in the host's load weighs on all three alike. The slowdown is
//! taken per round (against that round's run without) and given with its 95 % interval.
use super::procs::Traced;
use super::table::{Row, Summary};
use super::{BPFTRACE_CHECK, Bench, messaging_run, pipe_run};
use anyhow::Result;

const SECTION: &str = "slowdown of the traced";

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Without,
    Tracer,
    Bpftrace,
}

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    let loops = if bench.smoke { 20_000 } else { 100_000 };
    let (groups, messages) = if bench.smoke { (2, 20) } else { (4, 100) };
    let pipe_name = format!("perf bench sched pipe -l {loops}");
    let messaging_name = format!("perf bench sched messaging -g {groups} -l {messages}");
    let mut rows = Vec::new();
    rows.extend(compare(bench, &pipe_name, "µs/op", || pipe_run(loops))?);
    rows.extend(compare(bench, &messaging_name, "s", || {
        messaging_run(groups, messages)
    })?);
    Ok(rows)
}

fn compare(
    bench: &Bench,
    name: &str,
    unit: &'static str,
    run: impl Fn() -> Result<f64>,
) -> Result<Vec<Row>> {
    run()?; // warm-up
    let sides = [Side::Without, Side::Tracer, Side::Bpftrace];
    let mut values: [Vec<f64>; 3] = Default::default();
    for round in 0..bench.runs {
        let mut this = [0.0; 3];
        for k in 0..3 {
            let side = sides[(round + k) % 3];
            let i = sides.iter().position(|s| *s == side).unwrap_or(0);
            let _tracing = match side {
                Side::Without => None,
                Side::Tracer => Some(Traced::tracer(
                    &bench.tracer,
                    &["--backend", "tracepoint", "--json"],
                    &[],
                )?),
                Side::Bpftrace => Some(Traced::bpftrace(&BPFTRACE_CHECK)?),
            };
            this[i] = run()?;
        }
        for i in 0..3 {
            values[i].push(this[i]);
        }
        eprintln!(
            "bench: {name}: round {}/{}: {this:?} {unit}",
            round + 1,
            bench.runs
        );
    }
    let slowdown = |i: usize| -> Vec<f64> {
        values[i]
            .iter()
            .zip(&values[0])
            .map(|(with, without)| (with / without - 1.0) * 100.0)
            .collect()
    };
    let without = Summary::of(&values[0]).median;
    let (ours, theirs) = (slowdown(1), slowdown(2));
    let interval = |v: &[f64]| {
        let s = Summary::of(v);
        format!(
            "mean {:+.1} % ± {:.1} (95 % CI, {} rounds)",
            s.mean,
            s.ci95(),
            s.n
        )
    };
    Ok(vec![
        Row::new(SECTION, format!("{name}, no tracer"), unit, &values[0]),
        Row::new(
            SECTION,
            format!("{name}, throttle-tracer"),
            unit,
            &values[1],
        )
        .against("no tracer", without),
        Row::new(SECTION, format!("{name}, bpftrace"), unit, &values[2])
            .against("no tracer", without),
        Row::new(
            SECTION,
            format!("{name}: slowdown, throttle-tracer"),
            "%",
            &ours,
        )
        .against("bpftrace's slowdown", Summary::of(&theirs).median)
        .note(interval(&ours)),
        Row::new(SECTION, format!("{name}: slowdown, bpftrace"), "%", &theirs)
            .note(interval(&theirs)),
    ])
}
