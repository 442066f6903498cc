//! What the kprobe and fentry backends cost, in the vm-test guests (the host has neither): ns per
//! invocation of every program the tracer attached, next to an empty program of the same type on
//! the same hooks, under a throttled load (guest/vm-cost.sh `cost_run`). The guest half (`xtask
//! guest-program-cost`, hidden) measures and prints JSON lines; the host half ([`judge`]) turns
//! them into vm-test rows. How: docs/performance.md ("The kprobe and fentry programs' cost").
use super::bpf::{self, Floor, Program};
use crate::console::Console;
use anyhow::{Context as _, Result, bail};
use aya_obj::generated::bpf_prog_type;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The guest's part of the measurement: the tracer, the floors and the load.
pub const GUEST_PART: &str = include_str!("../../guest/vm-cost.sh");
/// The backends measured here; the tracepoint backend's programs run per context switch and
/// are measured on the host (`cargo xtask bench`).
pub const BACKENDS: &[&str] = &["kprobe", "fentry"];
/// The tracer's log filter in the guest: its `attached` lines, nothing more from the eBPF side.
pub const TRACER_LOG: &str = "warn,throttle_tracer::probes=debug";
/// The functions that every throttled period calls (on the throttled CPUs): their programs
/// must have run if the load throttled.
const EVERY_THROTTLE: &[&str] = &["throttle_cfs_rq", "unthrottle_cfs_rq"];
/// How long the guest half waits for the measured load's start, and then its end, at most.
const WAIT_LIMIT: Duration = Duration::from_secs(900);

#[derive(clap::Args)]
pub struct GuestArgs {
    /// The tracer's stderr, its log filter [`TRACER_LOG`].
    #[arg(long)]
    log: PathBuf,
    /// Measure from when this file exists...
    #[arg(long)]
    begin: PathBuf,
    /// ...until this one does.
    #[arg(long)]
    end: PathBuf,
}

/// One program of the tracer, as its log names it.
#[derive(Debug, PartialEq)]
struct Attached {
    kind: String,
    name: String,
    id: u32,
    functions: Vec<String>,
}

impl Attached {
    fn hook(&self) -> String {
        format!("{} {}", self.kind, self.functions.join("+"))
    }
}

/// The tracer's `attached KIND PROGRAM (program id ID) to FUNCTION` lines, one entry per
/// program (the kprobe backend attaches one end-reason program to several functions).
fn parse_log(text: &str) -> Result<Vec<Attached>> {
    let mut programs: Vec<Attached> = Vec::new();
    for line in text.lines() {
        let Some((_, rest)) = line.split_once("] attached ") else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let [kind, name, "(program", "id", id, "to", function] = words[..] else {
            bail!("unexpected attach line in the tracer's log: {line:?}");
        };
        let id: u32 = id
            .strip_suffix(')')
            .and_then(|id| id.parse().ok())
            .with_context(|| format!("no program id in {line:?}"))?;
        match programs.iter_mut().find(|p| p.id == id) {
            Some(p) => p.functions.push(function.to_owned()),
            None => programs.push(Attached {
                kind: kind.to_owned(),
                name: name.to_owned(),
                id,
                functions: vec![function.to_owned()],
            }),
        }
    }
    Ok(programs)
}

/// The guest half: floors on the hooks of every program in the tracer's log, then the
/// statistics from `--begin` to `--end`, a JSON line per program. The floors are attached as
/// soon as the tracer runs, and the load warms both for a second before the window opens:
/// under TCG a program's first runs on a hook are slow (the emulator translates its code, and
/// an fentry attach rebuilds the trampoline).
pub fn guest(args: &GuestArgs) -> Result<()> {
    let log = std::fs::read_to_string(&args.log)
        .with_context(|| format!("reading {}", args.log.display()))?;
    let ours = parse_log(&log)?;
    if ours.is_empty() {
        bail!(
            "{} has no `attached` line: was the tracer run with RUST_LOG={TRACER_LOG}?",
            args.log.display()
        );
    }
    raise_memlock();
    let types: HashMap<u32, bpf_prog_type> = aya::programs::loaded_programs()
        .flatten()
        .map(|p| (p.id(), p.program_type()))
        .collect();
    let mut btf = None;
    let mut floors = Vec::new();
    for p in &ours {
        let expected = match p.kind.as_str() {
            "kprobe" | "kretprobe" => bpf_prog_type::BPF_PROG_TYPE_KPROBE,
            "fentry" | "fexit" => bpf_prog_type::BPF_PROG_TYPE_TRACING,
            other => bail!("{}: unknown program kind {other}", p.name),
        };
        match types.get(&p.id) {
            Some(&t) if t == expected => {}
            found => bail!(
                "the tracer's {} (program id {}) is {found:?} in the kernel, not {expected:?}",
                p.name,
                p.id
            ),
        }
        let floor = if expected == bpf_prog_type::BPF_PROG_TYPE_KPROBE {
            let ret = p.kind == "kretprobe";
            let probes: Vec<(bool, &str)> = p.functions.iter().map(|f| (ret, f.as_str())).collect();
            Floor::kprobe(&p.hook(), &probes)?
        } else {
            let [function] = &p.functions[..] else {
                bail!("{} is an fentry/fexit program on several functions", p.name);
            };
            if btf.is_none() {
                btf = Some(aya::Btf::from_sys_fs().context("the kernel's BTF")?);
            }
            let btf = btf.as_ref().context("the kernel's BTF")?;
            Floor::fentry(&p.hook(), p.kind == "fexit", function, btf)?
        };
        floors.push(floor);
    }
    let all: Vec<Program> = ours
        .iter()
        .map(|p| Program {
            hook: p.hook(),
            name: p.name.clone(),
            id: p.id,
        })
        .chain(floors.iter().map(|f| f.program.clone()))
        .collect();

    println!("attached");
    wait_for(&args.begin)?;
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("BPF_ENABLE_STATS (BPF run-time statistics)")?;
    let started = Instant::now();
    let before = bpf::snapshot(&all)?;
    println!("measuring");
    wait_for(&args.end)?;
    let window = bpf::delta(&before, &bpf::snapshot(&all)?);
    let seconds = started.elapsed().as_secs_f64();
    drop(stats);
    for (p, floor) in ours.iter().zip(&floors) {
        let (ns, runs) = window.get(&p.id).copied().unwrap_or_default();
        let (floor_ns, floor_runs) = window.get(&floor.program.id).copied().unwrap_or_default();
        println!(
            "{}",
            json!({
                "program": p.name, "kind": p.kind, "functions": p.functions,
                "ns": ns, "runs": runs, "floor_ns": floor_ns, "floor_runs": floor_runs,
                "window_s": seconds,
            })
        );
    }
    Ok(())
}

/// Before 5.11 the kernel charges BPF memory to the user's locked memory, up to RLIMIT_MEMLOCK
/// (8 MiB), and the tracer's maps hold most of root's: the empty programs' loads fail with
/// EPERM on 5.10 without this. Where it cannot be raised, that EPERM is the error shown.
fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a whole rlimit that lives through the call.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}

fn wait_for(file: &Path) -> Result<()> {
    let started = Instant::now();
    while !file.exists() {
        if started.elapsed() > WAIT_LIMIT {
            bail!("{} did not appear within {WAIT_LIMIT:?}", file.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The kernel command-line word that makes the guest measure `backend`.
pub fn flag(backend: &str) -> String {
    format!("tt.cost_{backend}")
}

/// The guest's calls: a measured run of each of [`BACKENDS`] whose [`flag`] its kernel has.
pub fn guest_calls() -> String {
    BACKENDS
        .iter()
        .map(|b| format!("grep -qw {} /proc/cmdline && cost_run {b}", flag(b)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A vm-test row.
pub struct CostRow {
    pub name: String,
    pub verdict: &'static str,
    pub figures: String,
}

/// The rows of `backend`'s measured run (see [`guest_calls`]), and its failures. A figure never
/// fails a row; a program that did not run although the load throttled does, and so does a
/// floor that did not run where its program did (they share every hook).
pub fn judge(console: &Console, backend: &str) -> (Vec<CostRow>, Vec<String>) {
    let run = format!("cost-{backend}");
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    let output = console.section(&run).unwrap_or_default();
    let status = console.mark("COST", &run);
    if status != Some("exit status 0") {
        problems.push(format!(
            "the cost measurement ended with {}: {}",
            status.unwrap_or("no exit status"),
            output.join(" | ")
        ));
        return (rows, problems);
    }
    let throttled = throttled_periods(console, &run);
    for line in output.iter().filter(|l| l.starts_with('{')) {
        let Ok(p) = serde_json::from_str::<Value>(line) else {
            problems.push(format!("unreadable cost line {line:?}"));
            continue;
        };
        let number = |key: &str| p[key].as_u64().unwrap_or(0);
        let (ns, runs, floor_ns, floor_runs) = (
            number("ns"),
            number("runs"),
            number("floor_ns"),
            number("floor_runs"),
        );
        let name = p["program"].as_str().unwrap_or("?");
        let kind = p["kind"].as_str().unwrap_or("?");
        let functions: Vec<&str> = p["functions"]
            .as_array()
            .map(|f| f.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let hook = format!("{kind} on {}", functions.join(" + "));
        let mut row = CostRow {
            name: format!("{run} cost {name}"),
            verdict: "PASS",
            figures: String::new(),
        };
        if runs == 0 {
            if throttled > 0 && functions.iter().any(|f| EVERY_THROTTLE.contains(f)) {
                row.verdict = "FAIL";
                problems.push(format!(
                    "{name} ({hook}) never ran although {run} throttled {throttled} periods"
                ));
            } else {
                row.verdict = "SKIP";
            }
            row.figures = format!("{hook}: not invoked during {run}, nothing to measure");
        } else if floor_runs == 0 {
            row.verdict = "FAIL";
            problems.push(format!(
                "{name} ran {runs} times on {hook}, the empty program there never"
            ));
            row.figures = format!("{hook}: {runs} runs, the empty program none");
        } else {
            let per = ns as f64 / runs as f64;
            let floor = floor_ns as f64 / floor_runs as f64;
            row.figures = format!(
                "{per:.0} ns per run ({runs} runs, {hook}); empty {kind} there {floor:.0} ns \
                 ({floor_runs} runs): {:.2}× the floor",
                per / floor
            );
        }
        rows.push(row);
    }
    if rows.is_empty() && problems.is_empty() {
        problems.push(format!(
            "the cost measurement printed no program: {}",
            output.join(" | ")
        ));
    }
    (rows, problems)
}

/// cpu.stat `nr_throttled` after minus before, from the run's sections (0 if unread).
fn throttled_periods(console: &Console, run: &str) -> u64 {
    let read = |when: &str| {
        console
            .section(&format!("{run}/cpu.stat.{when}"))
            .unwrap_or_default()
            .iter()
            .find_map(|l| l.strip_prefix("nr_throttled ")?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    read("after").saturating_sub(read("before"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_lines_group_by_program() {
        let log = "[2026-12-02T15:00:00Z DEBUG throttle_tracer::probes] startup: kprobe object loaded\n\
            [2026-12-02T15:00:00Z DEBUG throttle_tracer::probes] attached kprobe refill_enter (program id 7) to distribute_cfs_runtime\n\
            [2026-12-02T15:00:00Z DEBUG throttle_tracer::probes] attached kprobe refill_enter (program id 7) to __cfsb_csd_unthrottle\n\
            [2026-12-02T15:00:01Z DEBUG throttle_tracer::probes] attached kretprobe throttle_cfs_rq_ret (program id 9) to throttle_cfs_rq\n";
        let programs = parse_log(log).unwrap();
        assert_eq!(programs.len(), 2);
        assert_eq!(
            programs[0].functions,
            ["distribute_cfs_runtime", "__cfsb_csd_unthrottle"]
        );
        assert_eq!(programs[1].hook(), "kretprobe throttle_cfs_rq");
        assert!(parse_log("[x] attached kprobe p (program id unknown: EBADF) to f\n").is_err());
    }
}
