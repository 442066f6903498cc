//! `cargo xtask vm-test`: every scenario on every kernel, and the host tests on the kernels that
//! run them, in one boot per kernel, one VM at a time (or `--jobs`), then a table; with `--cost`,
//! the kprobe and fentry programs' cost measured during one scenario each (bench/vm_cost.rs).
use crate::arch::Arch;
use crate::bench::vm_cost;
use crate::checks::{self, Verdict};
use crate::console::Console;
use crate::kernels::{self, Fetched, KERNELS, Kernel};
use crate::qemu::{self, Ending};
use crate::scenarios::{BACKENDS, SCENARIOS};
use crate::{binaries, guest, guest_tests, paths, setup};
use anyhow::{Result, bail};
use std::path::Path;
use std::time::{Duration, Instant};

/// The guest's scenario runner; the calls come from scenarios.rs.
const GUEST_PART: &str = include_str!("../guest/vm-test.sh");
/// Per boot: a hang guard. Under single-threaded TCG the scenarios take one to three minutes
/// per backend on a quiet host, several times that on a loaded one.
const BOOT_LIMIT: Duration = Duration::from_secs(1200);

#[derive(clap::Args, Default)]
pub struct Args {
    /// Kernel series to boot, repeatable: 5.10, 6.1, 6.12, 7 (default: all of them).
    #[arg(long = "kernel", value_name = "SERIES")]
    kernels: Vec<String>,
    /// The guests' architecture: Debian's kernels of that architecture, and the programs
    /// cross-built for it (arm64 under emulation, several times slower than x86-64).
    #[arg(long, value_enum, default_value_t)]
    arch: Arch,
    /// Kernels booted at once (default 1: a VM that shares its host CPU sees its scheduler
    /// ticks stretched, and the quota arithmetic the scenarios check with them).
    #[arg(long, value_name = "N", default_value_t = 1)]
    jobs: usize,
    /// Backend to run the scenarios with, repeatable: kprobe, fentry, tracepoint (default: all).
    #[arg(long = "backend", value_name = "BACKEND", value_parser = clap::builder::PossibleValuesParser::new(BACKENDS))]
    backends: Vec<String>,
    /// Leave out the host tests (tracer/tests) that the 7.x guest otherwise runs after the
    /// scenarios, and the few that every guest runs (guest_tests.rs `EVERY_KERNEL`).
    #[arg(long)]
    no_host_tests: bool,
    /// Run only the host tests whose `binary::test` name starts with this, repeatable (e.g.
    /// `advise` or `ancestor::a_child_named_alone_sees_its_ancestors_stops`); the reasons the
    /// others do not run are printed as always.
    #[arg(
        long = "host-test",
        value_name = "PREFIX",
        conflicts_with = "no_host_tests"
    )]
    host_test: Vec<String>,
    /// Also measure the kprobe and fentry programs' cost per invocation during s2, next to
    /// empty programs on the same hooks, in the same boots. Not in `cargo xtask test`: it
    /// builds a static xtask for the guest (minutes from cold, over CI's 20-minute budget).
    #[arg(long)]
    cost: bool,
}

struct Row {
    kernel: String,
    scenario: String,
    verdict: &'static str,
    figures: String,
}

/// Downloads every kernel of the matrix not yet in the cache ([`Kernel::fetch`]).
pub fn fetch_kernels() -> Result<()> {
    for kernel in KERNELS {
        kernel.fetch(Arch::X86_64)?;
    }
    Ok(())
}

pub fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let arch = args.arch;
    let mut parts = vec![setup::Part::Build, setup::Part::Vm];
    if arch == Arch::Arm64 {
        parts.push(setup::Part::Arm64);
    }
    setup::run(&parts)?;
    let kernels: Vec<&Kernel> = if args.kernels.is_empty() {
        KERNELS.iter().collect()
    } else {
        args.kernels
            .iter()
            .map(|s| kernels::by_series(s))
            .collect::<Result<_>>()?
    };
    let mut fetched = Vec::new();
    for kernel in &kernels {
        let f = kernel.fetch(arch)?;
        eprintln!("kernel {}: {} {}", kernel.series, f.package, f.version);
        fetched.push(f);
    }
    let backends: Vec<&str> = if args.backends.is_empty() {
        BACKENDS.to_vec()
    } else {
        args.backends.iter().map(String::as_str).collect()
    };
    let host_tests = !args.no_host_tests;
    if host_tests && arch != Arch::HOST {
        // guest_tests::select lists each test binary's tests by running it here.
        bail!(
            "the host tests run in {arch:?} guests only from this machine's; add --no-host-tests"
        );
    }
    let binaries = if host_tests {
        binaries::build_with_tests()?
    } else {
        binaries::build(arch)?
    };
    let cost = args.cost;
    // One tracer per backend traces all its scenarios (a start takes seconds under TCG).
    let mut calls: Vec<String> = backends
        .iter()
        .flat_map(|b| {
            let names: Vec<String> = SCENARIOS.iter().map(|s| s.run_name(b)).collect();
            let names = names.join(" ");
            std::iter::once(format!("tracer_start {b} {names}"))
                .chain(vm_cost::after_tracer_start(b).filter(|_| cost))
                .chain(SCENARIOS.iter().flat_map(move |s| {
                    if cost {
                        vm_cost::guest_calls(s.name, b, &s.run_name(b), s.guest_call(b))
                    } else {
                        vec![s.guest_call(b)]
                    }
                }))
                .chain(std::iter::once(format!("tracer_stop {b} {names}")))
        })
        .collect();
    // The tracers' log filter: bench/vm_cost.rs reads their `attached` lines.
    calls.insert(0, format!("tracer_log='{}'", vm_cost::TRACER_LOG));
    let selection = if host_tests {
        let mut selection = guest_tests::select(&binaries.tests)?;
        if !args.host_test.is_empty() {
            let wanted = |t: &String| args.host_test.iter().any(|p| t.starts_with(p.as_str()));
            selection.run.retain(wanted);
            selection.every_kernel.retain(wanted);
            selection.faults.retain(wanted);
            if selection.run.is_empty() {
                bail!(
                    "no host test the guest runs starts with {}: see `cargo test -p tracer -- --list`",
                    args.host_test.join(" or ")
                );
            }
        }
        calls.push(guest_tests::guest_calls(&selection));
        selection
    } else {
        guest_tests::Selection::default()
    };
    let init = guest::init_script(&format!("{GUEST_PART}\n{}", calls.join("\n")));
    let vm = paths::vm();
    let initrd = vm.join(format!("vm-test-{}.cpio", arch.debian()));
    let xtask = cost.then(|| binaries::xtask(arch)).transpose()?;
    std::fs::write(
        &initrd,
        guest::initramfs(&init, &binaries, xtask.as_deref(), &[])?,
    )?;
    std::fs::create_dir_all(vm.join("logs"))?;

    let jobs = args.jobs.clamp(1, kernels.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<_> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(kernel) = kernels.get(i) else {
                            return done;
                        };
                        let matrix = kernel.matrix(arch);
                        let mut tests = if matrix.host_tests {
                            selection.run.clone()
                        } else {
                            selection.every_kernel.clone()
                        };
                        tests.extend(matrix.fault_backends.iter().flat_map(|b| {
                            selection
                                .faults
                                .iter()
                                .map(|t| guest_tests::with_backend(t, b))
                        }));
                        done.push((
                            i,
                            test_kernel(
                                arch,
                                kernel,
                                &fetched[i],
                                &initrd,
                                &backends,
                                !args.backends.is_empty(),
                                &tests,
                                cost,
                            ),
                        ));
                    }
                })
            })
            .collect();
        let mut all: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("a vm-test worker panicked"))
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all
    });
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (_, result) in results {
        let (kernel_rows, kernel_failures) = result?;
        rows.extend(kernel_rows);
        failures.extend(kernel_failures);
    }

    print_table(&rows);
    for not_run in &selection.not_run {
        println!("host test not run in the guests: {not_run}");
    }
    for failure in &failures {
        println!("FAIL {failure}");
    }
    println!("vm-test took {:.0} s", started.elapsed().as_secs_f64());
    if !failures.is_empty() {
        bail!("{} failure(s)", failures.len());
    }
    Ok(())
}

/// Boots one kernel with every scenario call in `initrd` (and the host `tests`, if any, the
/// fault tests' runs with its `fault_backends` among them) and judges what it printed: its
/// table rows and its failures. The kernel's own matrix leaves backends out unless they were
/// `chosen` by `--backend`.
fn test_kernel(
    arch: Arch,
    kernel: &Kernel,
    fetched: &Fetched,
    initrd: &Path,
    backends: &[&str],
    chosen: bool,
    tests: &[String],
    cost: bool,
) -> Result<(Vec<Row>, Vec<String>)> {
    let vm = paths::vm();
    let matrix = kernel.matrix(arch);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let log = vm
        .join("logs")
        .join(format!("vm-test-{}-{}.log", arch.debian(), kernel.series));
    eprintln!(
        "booting {} ({}), console → {}",
        kernel.series,
        fetched.version,
        log.display()
    );
    let booted = Instant::now();
    let progress = |line: &str| {
        if let Some(rest) = line.strip_prefix("@@TT ")
            && ["SCENARIO", "SKIP", "FAIL", "UNAME", "TRACER", "TEST"]
                .iter()
                .any(|k| rest.starts_with(k))
        {
            let at = booted.elapsed().as_secs();
            eprintln!("  [{} +{at}s] {rest}", kernel.series);
        }
    };
    let unable = |b: &&str| matrix.unable.iter().any(|(u, _)| u == b);
    let (run, left_out): (Vec<&str>, Vec<&str>) = backends
        .iter()
        .filter(|b| !unable(b))
        .partition(|b| chosen || matrix.backends.contains(b));
    let mut append: Vec<String> = backends
        .iter()
        .filter(|b| !run.contains(b))
        .map(|b| format!("tt.skip_{b}"))
        .collect();
    if matrix.host_tests && !tests.is_empty() {
        append.push(guest_tests::CMDLINE_FLAG.to_owned());
    }
    // The fault tests' runs with a backend, where `tests` has them (`--host-test` may leave
    // them out).
    append.extend(
        matrix
            .fault_backends
            .iter()
            .filter(|b| {
                let suffix = guest_tests::with_backend("", b);
                tests.iter().any(|t| t.ends_with(&suffix))
            })
            .map(|b| guest_tests::faults_flag(b)),
    );
    let boot = qemu::boot(
        arch,
        &fetched.vmlinuz,
        initrd,
        &append.join(" "),
        &log,
        BOOT_LIMIT,
        &progress,
    )?;
    let console = Console::parse(&boot.console);
    let release = console.mark("UNAME", "").unwrap_or("?");
    let label = format!("{} {release} ({})", kernel.series, fetched.version);
    let trouble = console.kernel_trouble();
    let booted_clean = boot.ending == Ending::Finished && trouble.is_empty();
    if !booted_clean {
        failures.push(format!(
            "{label}: boot {:?}; see {}{}",
            boot.ending,
            log.display(),
            trouble
                .iter()
                .fold(String::new(), |text, line| text + "\n    | " + line)
        ));
    }
    rows.push(doctor_row(&console, &label, &mut failures));
    for (backend, why) in matrix.unable.iter().filter(|(b, _)| backends.contains(b)) {
        rows.push(unable_row(&console, &label, backend, why, &mut failures));
    }
    rows.push(Row {
        kernel: label.clone(),
        scenario: "boot".to_owned(),
        verdict: if booted_clean { "PASS" } else { "FAIL" },
        figures: format!(
            "{:?} after {:.0} s{}",
            boot.ending,
            boot.elapsed.as_secs_f64(),
            if trouble.is_empty() {
                ""
            } else {
                ", the kernel reported trouble"
            }
        ),
    });
    for backend in &left_out {
        rows.push(Row {
            kernel: label.clone(),
            scenario: format!("{backend} scenarios"),
            verdict: "SKIP",
            figures: "not in this kernel's matrix (kernels.rs: the oldest and newest run them)"
                .to_owned(),
        });
    }
    for (backend, scenario) in run
        .iter()
        .flat_map(|b| SCENARIOS.iter().map(move |s| (*b, s)))
    {
        let run = scenario.run_name(backend);
        let outcome = checks::judge(&console, scenario, &run, backend);
        let verdict = match outcome.verdict {
            Verdict::Pass => "PASS",
            Verdict::Skip(reason) => {
                rows.push(Row {
                    kernel: label.clone(),
                    scenario: run.clone(),
                    verdict: "SKIP",
                    figures: reason,
                });
                continue;
            }
            Verdict::Fail(problems) => {
                failures.push(format!(
                    "{label} {run}:\n    {}\n    (console: {})",
                    problems.join("\n    "),
                    log.display()
                ));
                "FAIL"
            }
        };
        rows.push(Row {
            kernel: label.clone(),
            scenario: run.clone(),
            verdict,
            figures: outcome.figures,
        });
        if cost && scenario.name == vm_cost::SCENARIO && vm_cost::BACKENDS.contains(&backend) {
            let (cost_rows, problems) = vm_cost::judge(&console, &run);
            if !problems.is_empty() {
                failures.push(format!(
                    "{label} {run} cost:\n    {}\n    (console: {})",
                    problems.join("\n    "),
                    log.display()
                ));
            }
            rows.extend(cost_rows.into_iter().map(|r| Row {
                kernel: label.clone(),
                scenario: r.name,
                verdict: r.verdict,
                figures: r.figures,
            }));
        }
    }
    for test in tests {
        let outcome = guest_tests::judge(&console, test);
        if !outcome.passed {
            failures.push(format!(
                "{label} {test}:\n    {}\n    (console: {})",
                outcome.problem.join("\n    "),
                log.display()
            ));
        }
        rows.push(Row {
            kernel: label.clone(),
            scenario: test.clone(),
            verdict: if outcome.passed { "PASS" } else { "FAIL" },
            figures: outcome.figures,
        });
    }
    Ok((rows, failures))
}

/// A backend the kernel cannot run on this architecture (kernels.rs `unable`): a SKIP whose
/// figures are the guest's doctor's reason, the kernel's refusal, and a failure if the doctor
/// found it usable, or said nothing of it.
fn unable_row(
    console: &Console,
    label: &str,
    backend: &str,
    why: &str,
    failures: &mut Vec<String>,
) -> Row {
    let reason = doctor_report(console).and_then(|d| {
        let check = d["backends"]
            .as_array()?
            .iter()
            .find(|b| b["backend"] == backend)?
            .clone();
        Some(check["reason"].as_str().map(str::to_owned))
    });
    let (verdict, figures) = match reason {
        Some(Some(reason)) => ("SKIP", format!("{why}; doctor: {reason}")),
        Some(None) => {
            failures.push(format!(
                "{label}: kernels.rs says {backend} cannot run here ({why}), but the doctor \
                 attached it: run its scenarios"
            ));
            ("FAIL", "the doctor found it usable".to_owned())
        }
        None => {
            failures.push(format!("{label}: the doctor said nothing of {backend}"));
            ("FAIL", "not in the doctor's report".to_owned())
        }
    };
    Row {
        kernel: label.to_owned(),
        scenario: format!("{backend} scenarios"),
        verdict,
        figures,
    }
}

/// The doctor must find a usable backend on every kernel; its choice goes in the table.
fn doctor_row(console: &Console, label: &str, failures: &mut Vec<String>) -> Row {
    let report = console.section("doctor").unwrap_or_default();
    let choice = doctor_report(console).map_or("no doctor --json output".to_owned(), |v| {
        match v["auto"].as_str() {
            Some(backend) => format!("would trace with {backend}"),
            None => "no backend works".to_owned(),
        }
    });
    let ok = console.mark("DOCTOR", "") == Some("exit status 0");
    if !ok {
        failures.push(format!(
            "{label}: doctor found no usable backend:\n    {}",
            report.join("\n    ")
        ));
    }
    Row {
        kernel: label.to_owned(),
        scenario: "doctor".to_owned(),
        verdict: if ok { "PASS" } else { "FAIL" },
        figures: choice,
    }
}

/// The guest's `doctor --json` object, from its doctor section.
fn doctor_report(console: &Console) -> Option<serde_json::Value> {
    console
        .section("doctor")?
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(serde_json::Value::is_object)
}

fn print_table(rows: &[Row]) {
    let kernel_width = rows.iter().map(|r| r.kernel.len()).max().unwrap_or(0);
    let scenario_width = rows.iter().map(|r| r.scenario.len()).max().unwrap_or(0);
    println!();
    for row in rows {
        println!(
            "{:kernel_width$}  {:scenario_width$}  {}  {}",
            row.kernel, row.scenario, row.verdict, row.figures
        );
    }
    println!();
}
