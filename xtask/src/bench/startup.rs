//! exec → the NDJSON `start` line (every probe attached), for `auto` and each backend the kernel
//! allows, against exec → bpftrace's programs loaded (it says "Attaching" before it loads) for
//! the one-liner that attaches as the backend does ([`check_for`]); then where each backend's
//! time goes, from the tracer's `startup:` debug lines (BTF, each backend refused before the one
//! chosen, the object's maps, each program's verification). [`measure`] runs on this host and,
//! as `xtask guest-startup`, in vm-startup's guests.
use super::procs::Traced;
use super::table::{Row, Summary};
use super::{Bench, Check, check_for};
use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const SECTION: &str = "startup";
/// `auto` first: it is the one every other row's backend may be refused beside.
const BACKENDS: &[&str] = &["auto", "tracepoint", "kprobe", "fentry"];

/// What [`measure`] took on one kernel.
#[derive(Serialize, Deserialize)]
pub struct Measured {
    pub tracer: Vec<Startups>,
    pub bpftrace: Vec<Peer>,
    /// Per backend: its `startup:` phases.
    pub phases: Vec<(String, Phases)>,
}

/// `startup:` phases in the order they came: (phase, ms per run).
type Phases = Vec<(String, Vec<f64>)>;

/// One backend's starts, or why the kernel refused it.
#[derive(Serialize, Deserialize)]
pub struct Startups {
    pub backend: String,
    /// The backend it traced with (its `start` line's): `auto`'s choice.
    pub chose: String,
    pub ms: Vec<f64>,
    pub refused: Option<String>,
}

/// A bpftrace check's loads, or why it failed.
#[derive(Serialize, Deserialize)]
pub struct Peer {
    /// The backend it attaches as ([`check_for`]).
    pub backend: String,
    pub ms: Vec<f64>,
    pub failed: Option<String>,
}

#[derive(clap::Args)]
pub struct GuestArgs {
    /// The tracer to start.
    #[arg(long)]
    tracer: PathBuf,
    /// Starts of each.
    #[arg(long)]
    runs: usize,
}

/// `xtask guest-startup`: [`measure`] in a guest, its result as one JSON line on stdout.
pub fn guest(args: &GuestArgs) -> Result<()> {
    let measured = measure(&args.tracer, args.runs)?;
    println!("{}", serde_json::to_string(&measured)?);
    Ok(())
}

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    Ok(table_rows(
        SECTION,
        "",
        &measure(&bench.tracer, bench.runs)?,
    ))
}

/// `runs` starts of each backend and of each backend's bpftrace check, in rounds whose order
/// rotates (a drift of the machine's speed falls on all of them alike); a backend the kernel
/// refuses at its first start is not started again. Then the phases of `auto` and of each
/// backend `auto` did not choose, from separate runs with debug logging (not in the times).
pub fn measure(tracer: &Path, runs: usize) -> Result<Measured> {
    let mut starts: Vec<Startups> = BACKENDS
        .iter()
        .map(|b| Startups {
            backend: (*b).to_owned(),
            chose: (*b).to_owned(),
            ms: Vec::new(),
            refused: None,
        })
        .collect();
    let mut peers: Vec<Peer> = Vec::new();
    for round in 0..runs {
        let subjects = starts.len() + peers.len();
        for k in 0..subjects {
            let i = (round + k) % subjects;
            match starts.get_mut(i) {
                Some(s) => s.once(tracer)?,
                None => peers[i - starts.len()].once()?,
            }
        }
        // After the first round: the checks of the backends the kernel took, measured from
        // the second round on, and once now.
        if round == 0 {
            for s in starts.iter().filter(|s| s.refused.is_none()) {
                if !peers.iter().any(|p| p.backend == s.chose) && check_for(&s.chose).is_some() {
                    peers.push(Peer {
                        backend: s.chose.clone(),
                        ms: Vec::new(),
                        failed: None,
                    });
                }
            }
            for p in &mut peers {
                p.once()?;
            }
        }
    }

    let auto_chose = starts[0].chose.clone();
    let mut phases = Vec::new();
    for s in starts
        .iter()
        .filter(|s| s.refused.is_none() && (s.backend == "auto" || s.backend != auto_chose))
    {
        let mut by_phase = Phases::new();
        for _ in 0..runs.min(3) {
            let (ms, _, stderr) =
                start(tracer, &s.backend, &[("RUST_LOG", "throttle_tracer=debug")])?;
            eprintln!(
                "startup: --backend {} with its phases logged: {ms:.0} ms",
                s.backend
            );
            for (phase, value) in stderr.lines().filter_map(parse_phase) {
                match by_phase.iter_mut().find(|(p, _)| *p == phase) {
                    Some((_, values)) => values.push(value),
                    None => by_phase.push((phase, vec![value])),
                }
            }
        }
        phases.push((s.backend.clone(), by_phase));
    }
    Ok(Measured {
        tracer: starts,
        bpftrace: peers,
        phases,
    })
}

impl Startups {
    /// One more start, unless the kernel refused the backend. `auto` must find a backend; any
    /// other may be refused.
    fn once(&mut self, tracer: &Path) -> Result<()> {
        if self.refused.is_some() {
            return Ok(());
        }
        match start(tracer, &self.backend, &[]) {
            Ok((ms, chose, _)) => {
                eprintln!("startup: --backend {} ({chose}): {ms:.0} ms", self.backend);
                self.ms.push(ms);
                self.chose = chose;
            }
            Err(e) if self.backend != "auto" => {
                let why = reason(&format!("{e:#}"));
                eprintln!("startup: --backend {} refused: {why}", self.backend);
                self.refused = Some(why);
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

impl Peer {
    /// One more load of the check, unless it failed before (bpftrace may not support a probe
    /// type on an old kernel: that is said in its row, and its backend's row has no ratio).
    fn once(&mut self) -> Result<()> {
        if self.failed.is_some() {
            return Ok(());
        }
        let check = check_for(&self.backend).context("a peer without a check")?;
        match Traced::bpftrace(check) {
            Ok(t) => {
                let ms = ms(t.ready_after);
                t.kill();
                eprintln!("startup: bpftrace's {} check: {ms:.0} ms", self.backend);
                self.ms.push(ms);
            }
            Err(e) => {
                let why = reason(&format!("{e:#}"));
                eprintln!("startup: bpftrace's {} check failed: {why}", self.backend);
                self.failed = Some(why);
            }
        }
        Ok(())
    }
}

/// One start of the tracer with `--backend backend`: exec → `start` line in ms, the backend
/// the line names, and the tracer's stderr.
fn start(tracer: &Path, backend: &str, env: &[(&str, &str)]) -> Result<(f64, String, String)> {
    let mut t = Traced::tracer(tracer, &["--backend", backend, "--json"], env)?;
    let line: serde_json::Value =
        serde_json::from_str(&t.ready_line).context("the tracer's start line")?;
    let chose = line["backend"]
        .as_str()
        .context("no backend in the start line")?
        .to_owned();
    let (stderr, _) = t.stop()?;
    Ok((ms(t.ready_after), chose, stderr))
}

/// The table's rows of `measured`, their names prefixed with `prefix` (vm-startup's kernel):
/// each backend against its peer's median, bpftrace's checks, then the phases against their
/// backend's median.
pub fn table_rows(section: &'static str, prefix: &str, measured: &Measured) -> Vec<Row> {
    let peer_name = |backend: &str| {
        let probe = check_for(backend).map_or("?", Check::probe);
        format!("{prefix}bpftrace {probe} check exec → programs loaded")
    };
    let mut rows = Vec::new();
    let mut medians = Vec::new();
    for s in &measured.tracer {
        let name = format!("{prefix}exec → start line, --backend {}", s.backend);
        if let Some(why) = &s.refused {
            rows.push(Row::new(section, name, "ms", &[]).note(format!("refused: {why}")));
            continue;
        }
        let median = Summary::of(&s.ms).median;
        medians.push((s.backend.as_str(), median));
        let mut row = Row::new(section, name, "ms", &s.ms);
        match measured.bpftrace.iter().find(|p| p.backend == s.chose) {
            Some(p) if p.failed.is_none() => {
                row = row.against(peer_name(&p.backend), Summary::of(&p.ms).median);
            }
            _ => row = row.note("no bpftrace check to compare with"),
        }
        if s.chose != s.backend {
            row = row.note(format!("chose {}", s.chose));
        }
        rows.push(row);
    }
    for p in &measured.bpftrace {
        let check = check_for(&p.backend).map_or("?", |c| c.script);
        let row = Row::new(section, peer_name(&p.backend), "ms", &p.ms);
        rows.push(match &p.failed {
            Some(why) => row.note(format!("failed: {why}; `{check}`")),
            None => row.note(format!("`{check}`")),
        });
    }
    for (backend, phases) in &measured.phases {
        let whole = medians
            .iter()
            .find(|(b, _)| b == backend)
            .map_or(f64::NAN, |(_, m)| *m);
        for (phase, values) in phases {
            rows.push(
                Row::new(section, format!("{prefix}{backend}: {phase}"), "ms", values)
                    .against(format!("{backend} exec → start line"), whole),
            );
        }
    }
    rows
}

/// The line of an error chain that says why: the first `error:` line of the tracer or
/// `ERROR:` line of bpftrace (which follows it with the script and a line of carets, and with
/// the errors it led to), else the last non-empty line.
fn reason(text: &str) -> String {
    let lines = text.lines().map(str::trim);
    lines
        .clone()
        .find(|l| l.starts_with("error:") || l.contains("ERROR:"))
        .or_else(|| lines.rev().find(|l| !l.is_empty()))
        .unwrap_or("")
        .to_owned()
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
    fn reasons() {
        let bpftrace = "bpftrace loaded 0 of its 2 programs:\n\
            stdin:1:1-22: ERROR: kfunc/kretfunc not available for your kernel version.\n\
            kfunc:throttle_cfs_rq { @start[args->cfs_rq] = nsecs; }\n\
            ~~~~~~~~~~~~~~~~~~~~~\n\
            stdin:1:25-44: ERROR: Can't find function parameter cfs_rq\n";
        assert_eq!(
            reason(bpftrace),
            "stdin:1:1-22: ERROR: kfunc/kretfunc not available for your kernel version."
        );
        assert_eq!(
            reason("error: no kprobes\nhint: use x\n"),
            "error: no kprobes"
        );
        assert_eq!(reason("EPERM\n\n"), "EPERM");
    }

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
