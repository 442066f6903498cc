//! exec → the NDJSON `start` line (every probe attached), per backend the kernel allows and
//! for `auto`, against exec → bpftrace's program loaded (it says "Attaching" before it loads); then where
//! `auto`'s time goes, from the tracer's `startup:` debug lines (BTF, each backend refused
//! before the one chosen, the object's maps, each program's verification).
use super::procs::Traced;
use super::table::{Row, Summary};
use super::{BPFTRACE_CHECK, Bench};
use anyhow::Result;
use std::collections::BTreeMap;

const SECTION: &str = "startup";

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    let mut bpftrace = Vec::new();
    for _ in 0..bench.runs {
        bpftrace.push(ms(Traced::bpftrace(BPFTRACE_CHECK)?.ready_after));
    }
    let reference = Summary::of(&bpftrace).median;
    let mut rows = Vec::new();
    let mut auto_ms = f64::NAN;
    for backend in ["auto", "tracepoint", "kprobe", "fentry"] {
        let args = ["--backend", backend, "--json"];
        let mut times = Vec::new();
        let mut refused = None;
        for _ in 0..bench.runs {
            match Traced::tracer(&bench.tracer, &args, &[]) {
                Ok(mut t) => {
                    times.push(ms(t.ready_after));
                    t.stop()?;
                }
                Err(e) if backend == "kprobe" || backend == "fentry" => {
                    refused = Some(format!("{e:#}"));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(why) = refused {
            let why = why
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim();
            eprintln!("bench: startup: {backend} not measured: {why}");
            continue;
        }
        if backend == "auto" {
            auto_ms = Summary::of(&times).median;
        }
        rows.push(
            Row::new(
                SECTION,
                format!("exec → start line, --backend {backend}"),
                "ms",
                &times,
            )
            .against("bpftrace exec → program loaded", reference),
        );
    }
    rows.push(
        Row::new(SECTION, "bpftrace exec → program loaded", "ms", &bpftrace)
            .note(format!("`{BPFTRACE_CHECK}`")),
    );

    // Where it goes: the debug lines of separate runs (debug logging is not in the times
    // above), with `auto`, so that the backends it passes over are in them.
    let mut phases: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut order = Vec::new();
    for _ in 0..bench.runs.min(3) {
        let mut t = Traced::tracer(
            &bench.tracer,
            &["--backend", "auto", "--json"],
            &[("RUST_LOG", "throttle_tracer=debug")],
        )?;
        let (stderr, _) = t.stop()?;
        for (phase, value) in stderr.lines().filter_map(parse_phase) {
            if !order.contains(&phase) {
                order.push(phase.clone());
            }
            phases.entry(phase).or_default().push(value);
        }
    }
    for phase in order {
        rows.push(
            Row::new(SECTION, format!("auto: {phase}"), "ms", &phases[&phase])
                .against("auto exec → start line", auto_ms),
        );
    }
    Ok(rows)
}

/// `… startup: <phase> in <ms> ms` → (phase, ms).
fn parse_phase(line: &str) -> Option<(String, f64)> {
    let rest = line.split_once("startup: ")?.1;
    let (phase, value) = rest.rsplit_once(" in ")?;
    Some((phase.to_owned(), value.strip_suffix(" ms")?.parse().ok()?))
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_lines() {
        assert_eq!(
            parse_phase(
                "[DEBUG throttle_tracer::probes::tracepoint] startup: tp_sched_switch verified in 471.6 ms"
            ),
            Some(("tp_sched_switch verified".to_owned(), 471.6))
        );
        assert_eq!(parse_phase("[WARN x] something else"), None);
    }
}
