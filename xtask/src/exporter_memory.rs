//! `cargo xtask bench-exporter`: what `serve`'s cardinality bound (`--max-cgroups`, 1,000 by
//! default) costs in memory when it is reached.
//!
//! Two `serve` runs on real cgroups with quotas (1 ms per 100 ms): one selecting a single
//! cgroup (the reference, measured in the same run), one selecting `--cgroups` of them with a
//! glob. In each, one busy process is moved through the selected cgroups in turn, a few
//! milliseconds in each, so that every cgroup is throttled (stops of varying length, which fill
//! its native histogram buckets) and has its series; then one scrape, and the tracer's resident
//! memory (VmRSS, and its peak VmHWM) from /proc. The difference over the extra cgroups is the
//! cost of one exported cgroup. Figures only; needs root.
use crate::bench::procfs::Memory;
use crate::{binaries, setup};
use anyhow::{Context as _, Result, bail};
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

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
    let binaries = binaries::build()?;
    let tree = Tree::create(args.cgroups)?;
    let mut busy = Command::new(&binaries.workload)
        .args(["busy", "--threads", "1", "--seconds", "3600"])
        .stdout(Stdio::null())
        .spawn()
        .context("starting throttle-workload busy")?;
    let result = (|| {
        let one = measure(&binaries.tracer, &tree, 1, busy.id())?;
        let all = measure(&binaries.tracer, &tree, args.cgroups, busy.id())?;
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
    })();
    let _ = busy.kill();
    let _ = busy.wait();
    result
}

struct Measured {
    series: usize,
    rss_kib: u64,
    hwm_kib: u64,
    scrape_bytes: usize,
}

/// One `serve` over the first `count` cgroups of `tree`, with `pid` moved through them.
fn measure(tracer: &Path, tree: &Tree, count: usize, pid: u32) -> Result<Measured> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let selection = if count == 1 {
        format!("/{PARENT}/c0000")
    } else {
        format!("/{PARENT}/c*")
    };
    let mut serve = Serve(
        Command::new(tracer)
            .args(["serve", "--backend", "tracepoint", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--cgroup", &selection])
            .args(["--max-cgroups", &tree.cgroups.len().to_string()])
            .stdout(Stdio::null())
            .spawn()
            .context("starting throttle-tracer serve")?,
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while get(port, "/healthz").is_none_or(|(status, _)| status != 200) {
        if Instant::now() > deadline {
            bail!("serve did not become ready within 2 minutes");
        }
        thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..PASSES {
        for cgroup in tree.cgroups[..count].iter().cycle().take(count.max(100)) {
            std::fs::write(cgroup.join("cgroup.procs"), pid.to_string())
                .with_context(|| format!("moving the workload to {}", cgroup.display()))?;
            thread::sleep(VISIT);
        }
    }
    std::fs::write(tree.root.join("cgroup.procs"), pid.to_string())?;
    // The run loop drains every 100 ms; a second covers the last records.
    thread::sleep(Duration::from_secs(1));
    let (_, scrape) = get(port, "/metrics").context("scraping serve")?;
    let series = scrape
        .lines()
        .filter(|l| l.starts_with("throttle_tracer_stops_total{"))
        .count();
    let memory = Memory::of(serve.0.id())?;
    let measured = Measured {
        series,
        rss_kib: memory.rss / 1024,
        hwm_kib: memory.peak_rss / 1024,
        scrape_bytes: scrape.len(),
    };
    serve.stop();
    Ok(measured)
}

/// `serve`, interrupted (and reaped) on drop.
struct Serve(Child);

impl Serve {
    fn stop(&mut self) {
        // SAFETY: a signal to our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            self.stop();
        }
    }
}

/// A plain HTTP/1.0 GET: status and body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_owned()))
}

/// `<cpu root>/xtask-exporter-memory/cNNNN`, each with the quota; removed on drop.
struct Tree {
    root: PathBuf,
    parent: PathBuf,
    cgroups: Vec<PathBuf>,
}

impl Tree {
    fn create(count: usize) -> Result<Self> {
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let (root, v2) = if v1.join("cpu.cfs_quota_us").exists() {
            (v1.to_owned(), false)
        } else {
            let v2 = Path::new("/sys/fs/cgroup");
            std::fs::write(v2.join("cgroup.subtree_control"), "+cpu")
                .context("enabling the cpu controller (cgroup v2)")?;
            (v2.to_owned(), true)
        };
        let parent = root.join(PARENT);
        let mut tree = Self {
            root,
            parent: parent.clone(),
            cgroups: Vec::new(),
        };
        tree.remove();
        std::fs::create_dir(&parent).with_context(|| format!("creating {}", parent.display()))?;
        if v2 {
            std::fs::write(parent.join("cgroup.subtree_control"), "+cpu")?;
        }
        for i in 0..count {
            let dir = parent.join(format!("c{i:04}"));
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if v2 {
                std::fs::write(dir.join("cpu.max"), format!("{QUOTA_US} {PERIOD_US}"))?;
            } else {
                std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())?;
                std::fs::write(dir.join("cpu.cfs_quota_us"), QUOTA_US.to_string())?;
            }
            tree.cgroups.push(dir);
        }
        Ok(tree)
    }

    /// Removes the cgroups (empty by then), also those a killed run left.
    fn remove(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.parent) {
            for entry in entries.flatten() {
                if entry.path().is_dir() {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
        let _ = std::fs::remove_dir(&self.parent);
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        self.remove();
    }
}
