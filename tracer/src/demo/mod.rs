//! `throttle-tracer demo`: the problem and the tool on the user's own machine, in about 15 seconds,
//! with no set-up: a cgroup with 0.5 CPU of quota (earlier demos' leftovers removed first), traced
//! while this binary, re-executed as the hidden `demo-workload`, runs bursts of requests in it
//! ([`workload`]), then the report in the demo's words. The cgroup and its tasks are removed on
//! errors too ([`cgroup::DemoCgroup`]'s Drop) and on signals, caught from the first moment so that
//! none ends it before the cleanup.
mod cgroup;
mod workload;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Read as _};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::advice::Target;
use crate::agent::{Ended, Interrupts, Request, Session};
use crate::cgroups::{Hierarchy, Version};
use crate::cli::{DemoArgs, DemoWorkloadArgs};
use crate::error::{Exit, Failure, say};
use crate::privileges;
use crate::report::{CgroupReport, Text};
use crate::units::ms;
use cgroup::{DemoCgroup, Found, Quota};
use workload::Requests;

/// Half a CPU, the reference labs' `--cpus 0.5`.
const QUOTA: Quota = Quota {
    quota_us: 50_000,
    period_us: 100_000,
    burst_us: 0,
};

/// After the workload exits, time for the last period timer to end every stop, so the report
/// holds no open stops.
const SETTLE: Duration = Duration::from_millis(300);

/// How often the demo looks whether the workload has exited.
const POLL: Duration = Duration::from_millis(50);

/// How long past its duration the workload may take (it is throttled, and the machine may be
/// busy) before the demo gives up on it.
const GRACE: Duration = Duration::from_secs(10);

/// The exit code after Ctrl-C / SIGTERM, as shells report a SIGINT death.
const INTERRUPTED: i32 = 130;

const NS_PER_US: u64 = 1_000;

/// Runs the demo; exit status 130 when interrupted.
pub async fn run(args: DemoArgs) -> Result<(), Exit> {
    // First, so that no SIGINT/SIGTERM can end the process before the cgroup is removed.
    let mut interrupts = Interrupts::new()?;
    privileges::check()?;
    let hierarchy = Hierarchy::discover().map_err(|e| {
        Failure::environment(
            e.to_string(),
            "the demo needs the cpu controller: cgroup v2 with cpu enabled, or the cgroup v1 cpu \
             hierarchy",
        )
    })?;
    for found in cgroup::clean_leftovers(&hierarchy)? {
        match found {
            Found::Removed { path, pid, removal } => say!(
                "throttle-tracer demo: removed {path}, left behind by an earlier demo (pid {pid}) \
                 that did not finish{}",
                match removal.killed {
                    0 => String::new(),
                    n => format!("; killed {n} task(s) still in it"),
                }
            ),
            Found::Running { path, pid } => say!(
                "throttle-tracer demo: another demo is running (pid {pid}, {path}); both will \
                 share the CPUs"
            ),
        }
    }

    let shape = Requests::demo(args.duration);
    let (mut demo, enabled) = DemoCgroup::create(&hierarchy, QUOTA)?;
    if enabled {
        say!(
            "throttle-tracer demo: enabled the cpu controller in {}/cgroup.subtree_control (left on)",
            hierarchy.root().display()
        );
    }
    // Attached before anything is printed, so a machine that cannot trace gets only the error.
    let mut session = Session::start(Request {
        probes: &args.probes,
        cgroups: vec![demo.path.clone()],
        pids: Vec::new(),
        sinks: vec![Box::new(Text::stdout())],
        target: Target::DEFAULT,
    })?;
    print!("{}", intro(&shape, &demo, hierarchy.version()));
    demo.workload = Some(spawn_workload(&demo, args.duration)?);
    let limit = args.duration + GRACE;
    let ended = session
        .trace_until(workload_exit(&mut demo.workload, limit), &mut interrupts)
        .await?;

    if ended == Ended::Done
        && let Err(failure) = workload_status(&mut demo.workload)
    {
        // Nothing worth reporting: detach, clean up, say why.
        drop(session);
        demo.remove()?;
        return Err(failure.into());
    }
    let bursts = match demo.workload.as_mut().and_then(|c| c.stdout.take()) {
        // The workload has exited: this read ends at EOF.
        Some(mut out) if ended == Ended::Done => {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text.lines().filter_map(parse_burst).collect()
        }
        _ => Vec::new(),
    };
    let (reports, totals) = session.finish()?;
    let path = demo.path.clone();
    let dir = demo.dir.clone();
    let removal = demo.remove()?;
    if ended == Ended::Interrupted {
        say!(
            "throttle-tracer demo: interrupted; stopped the workload and removed {}",
            dir.display()
        );
        return Err(Exit::Status(INTERRUPTED));
    }
    print!(
        "{}",
        explain(&Context {
            shape: &shape,
            // A named cgroup gets a summary even without stops; for the demo that is "none".
            report: reports
                .iter()
                .find(|r| r.path.as_deref() == Some(&path) && r.summary.stops.count > 0),
            bursts: &bursts,
            elapsed_ns: totals.elapsed_ns,
            version: hierarchy.version(),
        })
    );
    println!(
        "\nCleaned up: the workload is gone and {} was removed{}.",
        dir.display(),
        match removal.killed {
            0 => String::new(),
            n => format!(" ({n} task(s) had to be killed)"),
        }
    );
    Ok(())
}

/// Starts this binary again as the workload, in its own process group, told which cgroup to
/// join.
fn spawn_workload(demo: &DemoCgroup, length: Duration) -> Result<Child, Failure> {
    Command::new("/proc/self/exe")
        .arg("demo-workload")
        .arg("--procs")
        .arg(demo.dir.join("cgroup.procs"))
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--duration")
        .arg(humantime::format_duration(length).to_string())
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            Failure::environment(
                format!("cannot start the demo workload (/proc/self/exe): {e}"),
                "the demo runs its workload from its own binary; check that /proc is mounted",
            )
        })
}

/// Completes when the workload has exited (or `limit` passed), plus [`SETTLE`].
async fn workload_exit(child: &mut Option<Child>, limit: Duration) {
    let deadline = Instant::now() + limit;
    while let Some(Ok(None)) = child.as_mut().map(Child::try_wait) {
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    tokio::time::sleep(SETTLE).await;
}

/// Whether the workload exited successfully (it did exit, unless the time limit passed).
fn workload_status(child: &mut Option<Child>) -> Result<(), Failure> {
    let Some(child) = child else {
        return Ok(());
    };
    let status: Option<ExitStatus> = child.try_wait().map_err(|e| {
        Failure::environment_without_hint(format!("cannot wait for the demo workload: {e}"))
    })?;
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(Failure::environment(
            format!("the demo workload failed ({s})"),
            "its own error is above; `throttle-tracer doctor` checks what this machine allows",
        )),
        None => Err(Failure::environment(
            "the demo workload did not finish in time",
            "the machine may be very busy; try again, or a shorter --duration",
        )),
    }
}

/// The hidden `demo-workload` subcommand: joins the cgroup, runs the requests, prints one line
/// per burst. Ends with 1, saying nothing, when the demo that started it is gone.
pub fn workload_main(args: DemoWorkloadArgs) -> Result<(), Exit> {
    // SAFETY: PR_SET_PDEATHSIG with a valid signal only changes this process's settings.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // The demo may have died before the setting took effect.
    if std::os::unix::process::parent_id() != args.parent {
        return Err(Exit::Status(1));
    }
    std::fs::write(&args.procs, std::process::id().to_string()).map_err(|e| {
        Failure::environment_without_hint(format!(
            "the demo workload cannot join its cgroup ({}): {e}",
            args.procs.display()
        ))
    })?;
    workload::run(&Requests::demo(args.duration), &mut io::stdout().lock()).map_err(|e| {
        Failure::environment_without_hint(format!(
            "the demo workload cannot write its results: {e}"
        ))
    })?;
    Ok(())
}

/// One burst line of the workload (`workload::run`'s format).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Burst {
    size: usize,
    cpu_ns: u64,
    wall_ns: u64,
}

fn parse_burst(line: &str) -> Option<Burst> {
    let mut words = line.split_whitespace();
    let mut field = |name: &str| -> Option<u64> {
        (words.next()? == name).then_some(())?;
        words.next()?.parse().ok()
    };
    field("burst")?;
    let size = usize::try_from(field("size")?).ok()?;
    field("arrival_ns")?;
    Some(Burst {
        size,
        cpu_ns: field("cpu_ns")?,
        wall_ns: field("wall_ns")?,
    })
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The control files' names on this cgroup version: (quota, burst).
fn files(version: Version) -> (&'static str, &'static str) {
    match version {
        Version::V1 => ("cpu.cfs_quota_us", "cpu.cfs_burst_us"),
        Version::V2 => ("cpu.max", "cpu.max.burst"),
    }
}

fn intro(shape: &Requests, demo: &DemoCgroup, version: Version) -> String {
    let quota = QUOTA.quota_us as f64 / QUOTA.period_us as f64;
    let sizes: Vec<String> = shape.sizes.iter().map(ToString::to_string).collect();
    let average = average_cpus(shape);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "throttle-tracer demo: a CPU quota, a bursty workload that fits it on average, and every \
         stop traced ({} of work).",
        humantime::format_duration(shape.length)
    );
    let _ = writeln!(
        out,
        "  cgroup    {} ({}), quota {} per {} period = {quota:.2} CPU, burst 0",
        demo.dir.display(),
        match version {
            Version::V1 => "cgroup v1",
            Version::V2 => "cgroup v2",
        },
        ms(QUOTA.quota_us * NS_PER_US),
        ms(QUOTA.period_us * NS_PER_US),
    );
    let _ = writeln!(
        out,
        "  workload  {} worker threads; every {} a burst of {} requests arrives (cycling), {} of \
         CPU each",
        shape.threads,
        ms(duration_ns(shape.interval)),
        sizes.join(", "),
        ms(duration_ns(shape.request_cpu)),
    );
    let _ = writeln!(
        out,
        "            = {average:.2} CPU on average, {:.0}% of the quota; the largest burst needs {} \
         in one period\n",
        100.0 * average / quota,
        ms(duration_ns(peak_burst_cpu(shape))),
    );
    out
}

/// Average CPUs the workload asks for.
fn average_cpus(shape: &Requests) -> f64 {
    let per_cycle: usize = shape.sizes.iter().sum();
    let cpu = per_cycle as f64 * shape.request_cpu.as_secs_f64();
    cpu / (shape.sizes.len() as f64 * shape.interval.as_secs_f64())
}

/// The largest burst's CPU time, as designed.
fn peak_burst_cpu(shape: &Requests) -> Duration {
    let largest = shape.sizes.iter().copied().max().unwrap_or(0);
    shape
        .request_cpu
        .saturating_mul(u32::try_from(largest).unwrap_or(u32::MAX))
}

/// What [`explain`] reads.
struct Context<'a> {
    shape: &'a Requests,
    /// The demo cgroup's report; `None` if it was never stopped.
    report: Option<&'a CgroupReport>,
    bursts: &'a [Burst],
    elapsed_ns: u64,
    version: Version,
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The closing section: what the report above means for this workload.
fn explain(c: &Context<'_>) -> String {
    let mut out = String::new();
    let quota_ns = QUOTA.quota_us * NS_PER_US;
    let period_ns = QUOTA.period_us * NS_PER_US;
    let quota_cpus = quota_ns as f64 / period_ns as f64;
    let _ = writeln!(out, "\nWhat the demo shows");

    let used_ns: u64 = c.bursts.iter().map(|b| b.cpu_ns).sum();
    if used_ns > 0 && c.elapsed_ns > 0 {
        let average = used_ns as f64 / c.elapsed_ns as f64;
        let _ = writeln!(
            out,
            "  average use    {average:.2} CPU ({:.2} s of CPU in {:.1} s traced) = {:.0}% of the \
             {quota_cpus:.2} CPU quota: a usage graph shows room to spare",
            used_ns as f64 / 1e9,
            c.elapsed_ns as f64 / 1e9,
            100.0 * average / quota_cpus,
        );
    }

    let Some(r) = c.report else {
        out.push_str(
            "  stops          none were traced for the demo cgroup: the bursts never used up the \
             quota here (is the machine so busy that they were spread out?)\n",
        );
        return out;
    };
    let s = &r.summary;
    let _ = write!(
        out,
        "  stopped anyway {} per-CPU stops in {} group stops",
        s.stops.count, s.group_stops.count
    );
    if let Some(d) = &r.cpu_stat
        && d.nr_periods > 0
    {
        let _ = write!(
            out,
            "; cpu.stat: throttled in {} of {} periods ({:.0}%)",
            d.nr_throttled,
            d.nr_periods,
            100.0 * d.nr_throttled as f64 / d.nr_periods as f64
        );
    }
    out.push('\n');
    if let (Some(g), Some(p)) = (s.group_stops.percentiles, s.stops.percentiles) {
        let _ = writeln!(
            out,
            "  real stops     p50 {}, max {} of wall-clock time (group stops); each CPU's stop: \
             p50 {}, max {}",
            ms(g.p50_ns),
            ms(g.max_ns),
            ms(p.p50_ns),
            ms(p.max_ns)
        );
    }
    if let Some(d) = &r.cpu_stat
        && d.nr_throttled > 0
    {
        let per = d.throttled_ns / d.nr_throttled;
        let _ = write!(
            out,
            "  cpu.stat says  throttled {} / nr_throttled {} = {} \"per throttle\"",
            ms(d.throttled_ns),
            d.nr_throttled,
            ms(per)
        );
        if let Some(o) = r.overcount() {
            let _ = write!(
                out,
                ": {o:.2}x the {} the group was really stopped (overcount),\n                 \
                 because the kernel adds each CPU's stop separately ({:.1} CPUs per group stop)",
                ms(s.group_stops.sum_ns),
                s.stops.count as f64 / s.group_stops.count.max(1) as f64
            );
        }
        out.push('\n');
    }

    let mut by_size: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for b in c.bursts {
        by_size.entry(b.size).or_default().push(b.wall_ns);
    }
    let mut first = true;
    for (size, walls) in by_size {
        let cpu = c
            .shape
            .request_cpu
            .saturating_mul(u32::try_from(size).unwrap_or(1));
        let _ = writeln!(
            out,
            "  {:<14} bursts of {size} ({} of CPU): {} of them, done after median {}, max {}",
            if first { "requests" } else { "" },
            ms(duration_ns(cpu)),
            walls.len(),
            ms(median(walls.clone())),
            ms(walls.iter().copied().max().unwrap_or(0)),
        );
        first = false;
    }

    what_to_set(&mut out, r, c.version, quota_cpus);
    out
}

/// The advice `advice::advise` made from the runs the trace measured (every summary's advice
/// block, above, is the same), in the demo's words; no second calculation.
fn what_to_set(out: &mut String, r: &CgroupReport, version: Version, quota_cpus: f64) {
    let (quota_file, burst_file) = files(version);
    let Some(a) = r.advice(Target::DEFAULT) else {
        out.push_str(
            "  what to set    the advice comes from the CPU demand of each period, which this \
             kernel did not let\n                 the tracer measure (the warning at the start \
             says why)\n",
        );
        return;
    };
    let _ = writeln!(
        out,
        "  what to set    the advice above (advice::advise, from {} of measured periods): the \
         largest run of work used {} of CPU in one go",
        ms(a.covered_ns),
        ms(a.largest_run_ns)
    );
    if a.fits {
        out.push_str("                 and fits the quota in one period: nothing to change\n");
    }
    if let Some(q) = a.quota {
        let _ = writeln!(
            out,
            "  quota to fit   {quota_file} for >= {} per {} ({:.2} CPU): one period holds it",
            ms(q.quota_ns),
            ms(q.period_ns),
            q.millicpus as f64 / 1000.0
        );
    }
    let (Some(quota_ns), Some(need)) = (a.current.quota_ns, a.burst.for_largest_ns) else {
        return;
    };
    match a.burst.burst_ns {
        Some(burst) => {
            let _ = writeln!(
                out,
                "  or a burst     a period may spend at most quota + burst: {burst_file} >= {} \
                 (ceiling {}) lets it through\n                 at the same {quota_cpus:.2} CPU, \
                 refilled by the quota the runs leave unused. Less than {} buys nothing for it.",
                ms(burst),
                ms(quota_ns + burst),
                ms(need)
            );
        }
        None => {
            if let Some(why) = &a.burst.why_not {
                let _ = writeln!(out, "  or a burst     none: {why}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::demo_report;

    #[test]
    fn demo_shape_fits_the_average_not_the_peak() {
        let shape = Requests::demo(Duration::from_secs(10));
        assert!(
            (average_cpus(&shape) - 0.2 / 0.92).abs() < 1e-9,
            "200 ms of CPU per 920 ms"
        );
        assert_eq!(peak_burst_cpu(&shape), Duration::from_millis(80));
        assert!(average_cpus(&shape) < 0.5 && peak_burst_cpu(&shape) > Duration::from_millis(50));
    }

    #[test]
    fn burst_lines() {
        assert_eq!(
            parse_burst("burst 3 size 4 arrival_ns 10 cpu_ns 80000000 wall_ns 150000000"),
            Some(Burst {
                size: 4,
                cpu_ns: 80_000_000,
                wall_ns: 150_000_000
            })
        );
        assert_eq!(parse_burst("burst 3 size x"), None);
        assert_eq!(parse_burst("round 1 size 2"), None);
    }

    /// Two runs of 80 ms (50 ms ended throttled, then 30 ms) at 50 ms / 100 ms, 500 ms apart,
    /// the demo's own quota.
    fn measured(report: &mut CgroupReport) {
        const MS: u64 = 1_000_000;
        let mut agg = crate::aggregate::Aggregate::watching(&[report.summary.cgroup_id]);
        for (end_ms, usage_ms, throttled) in [
            (100, 50, true),
            (200, 30, false),
            (600, 50, true),
            (700, 30, false),
        ] {
            agg.ingest_period(&crate::records::Period {
                cgroup_id: report.summary.cgroup_id,
                end_ns: end_ms * MS,
                start_ns: Some((end_ms - 100) * MS),
                usage_ns: usage_ms * MS,
                max_cpu_ns: usage_ms * MS,
                cpus_used: 1,
                throttled_cpus: u32::from(throttled),
                bandwidth: crate::records::Bandwidth {
                    quota_ns: Some(50 * MS),
                    period_ns: Some(100 * MS),
                    burst_ns: Some(0),
                },
                runtime_ns: None,
                burst_spent_ns: None,
            });
        }
        report.summary.demand = agg.finish(800 * MS).remove(0).demand;
        report.settings = Some(crate::records::Bandwidth {
            quota_ns: Some(50 * MS),
            period_ns: Some(100 * MS),
            burst_ns: Some(0),
        });
    }

    #[test]
    fn explanation_has_every_figure() {
        let shape = Requests::demo(Duration::from_secs(10));
        let mut report = demo_report();
        let bursts = [
            Burst {
                size: 1,
                cpu_ns: 20_000_000,
                wall_ns: 21_000_000,
            },
            Burst {
                size: 4,
                cpu_ns: 80_000_000,
                wall_ns: 150_000_000,
            },
        ];
        let without = explain(&Context {
            shape: &shape,
            report: Some(&report),
            bursts: &bursts,
            elapsed_ns: 1_000_000_000,
            version: Version::V1,
        });
        assert!(
            without.contains("did not let\n                 the tracer measure"),
            "{without}"
        );
        measured(&mut report);
        let text = explain(&Context {
            shape: &shape,
            report: Some(&report),
            bursts: &bursts,
            elapsed_ns: 1_000_000_000,
            version: Version::V1,
        });
        println!("{text}");
        for needle in [
            "average use    0.10 CPU (0.10 s of CPU in 1.0 s traced) = 20% of the 0.50 CPU quota",
            "stopped anyway 3 per-CPU stops in 2 group stops; cpu.stat: throttled in 3 of 4 periods",
            "real stops     p50 ",
            "throttled 270.0 ms / nr_throttled 3 = 90.0 ms \"per throttle\": 1.50x the 180.0 ms",
            "bursts of 1 (20.0 ms of CPU): 1 of them, done after median 21.0 ms, max 21.0 ms",
            "bursts of 4 (80.0 ms of CPU): 1 of them, done after median 150.0 ms",
            "the largest run of work used 80.0 ms of CPU in one go",
            "cpu.cfs_quota_us for >= 84.0 ms per 100.0 ms (0.84 CPU)",
            "cpu.cfs_burst_us >= 32.0 ms (ceiling 82.0 ms)",
            "Less than 32.0 ms buys nothing for it",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }

        let text = explain(&Context {
            shape: &shape,
            report: None,
            bursts: &[],
            elapsed_ns: 0,
            version: Version::V2,
        });
        assert!(text.contains("none were traced"), "{text}");
    }
}
