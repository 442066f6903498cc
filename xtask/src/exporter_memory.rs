//! `cargo xtask bench-exporter`: what `serve`'s cardinality bound (`--max-cgroups`) costs in memory
//! when it is reached: one `serve` selecting a single quota'd cgroup (the reference) and one many,
//! by a glob, with a busy process moved through them so that each is throttled and has its series;
//! then a scrape and the resident memory. The difference over the extra cgroups is one exported
//! cgroup's cost: docs/prometheus.md ("Memory at the bound"). Figures only; needs root.
use crate::arch::Arch;
use crate::bench::procfs::Memory;
use crate::bench::procs::Workload;
use crate::bench::scrape::{self, Serve};
use crate::cgroup::Tree;
use crate::{binaries, setup};
use anyhow::{Result, bail};
use std::path::Path;
use std::thread;
use std::time::Duration;

const PARENT: &str = "xtask-exporter-memory";
/// Each cgroup's quota: used up within its first millisecond there, so each visit stops it.
const QUOTA_US: u64 = 1_000;
const PERIOD_US: u64 = 100_000;
/// How long the busy process stays in each cgroup per pass.
const VISIT: Duration = Duration::from_millis(3);
const PASSES: usize = 3;

#[derive(clap::Args)]
pub struct Args {
    /// Cgroups to export in the measured run (the default `--max-cgroups`).
    #[arg(long, default_value_t = 1000)]
    cgroups: usize,
}

pub fn run(args: &Args) -> Result<()> {
    if args.cgroups < 2 {
        bail!("--cgroups must be at least 2: one is the reference");
    }
    setup::run(&[setup::Part::Build])?;
    let binaries = binaries::build(Arch::HOST)?;
    let tree = Tree::create(PARENT, args.cgroups, QUOTA_US, PERIOD_US)?;
    let busy = Workload::busy(&binaries.workload, 1, 3600)?;
    let one = measure(&binaries.tracer, &tree, 1, busy.pid())?;
    let all = measure(&binaries.tracer, &tree, args.cgroups, busy.pid())?;
    let extra = (args.cgroups - 1) as f64;
    let per = |a: u64, b: u64| (a as f64 - b as f64) / extra;
    println!(
        "exporter memory, {} cgroups vs 1 (each throttled, {PASSES} visit(s) of {VISIT:?}):",
        args.cgroups
    );
    for (name, m) in [("1", &one), ("all", &all)] {
        println!(
            "  {name:>3}: {} series of stops, VmRSS {} KiB, VmHWM {} KiB, scrape {} bytes",
            m.series, m.rss_kib, m.hwm_kib, m.scrape_bytes
        );
    }
    println!(
        "  per extra cgroup: VmRSS {:.1} KiB, VmHWM {:.1} KiB, scrape {:.0} bytes; \
         at {} cgroups: +{:.1} MiB resident",
        per(all.rss_kib, one.rss_kib),
        per(all.hwm_kib, one.hwm_kib),
        per(all.scrape_bytes as u64, one.scrape_bytes as u64),
        args.cgroups,
        (all.rss_kib as f64 - one.rss_kib as f64) / 1024.0
    );
    Ok(())
}

struct Measured {
    series: usize,
    rss_kib: u64,
    hwm_kib: u64,
    scrape_bytes: usize,
}

/// One `serve` over the first `count` cgroups of `tree`, with `pid` moved through them.
fn measure(tracer: &Path, tree: &Tree, count: usize, pid: u32) -> Result<Measured> {
    let selection = if count == 1 {
        tree.children[0].path().to_owned()
    } else {
        format!("/{PARENT}/c*")
    };
    let mut serve = Serve::start(
        tracer,
        &[
            "--backend",
            "tracepoint",
            "--cgroup",
            &selection,
            "--max-cgroups",
            &tree.children.len().to_string(),
        ],
    )?;
    for _ in 0..PASSES {
        for cgroup in tree.children[..count].iter().cycle().take(count.max(100)) {
            cgroup.add(pid);
            thread::sleep(VISIT);
        }
    }
    tree.release(pid)?;
    // The run loop drains every 100 ms; a second covers the last records.
    thread::sleep(Duration::from_secs(1));
    let scrape = serve.scrape(scrape::TEXT)?.body;
    let series = String::from_utf8_lossy(&scrape)
        .lines()
        .filter(|l| l.starts_with("throttle_tracer_stops_total{"))
        .count();
    let memory = Memory::of(serve.pid())?;
    let measured = Measured {
        series,
        rss_kib: memory.rss / 1024,
        hwm_kib: memory.peak_rss / 1024,
        scrape_bytes: scrape.len(),
    };
    serve.stop()?;
    Ok(measured)
}
