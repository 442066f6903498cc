//! `cargo xtask vm-test`: the host tests that judge kernel facts on every kernel with every
//! backend, and the rest of the host tests on the kernels that run them (guest_tests.rs), in
//! one boot per kernel, one VM at a time (or `--jobs`), then a table; with `--cost`, the kprobe
//! and fentry programs' cost measured beside a throttled load (bench/vm_cost.rs).
use crate::arch::Arch;
use crate::bench::vm_cost;
use crate::console::Console;
use crate::guest_tests::Selection;
use crate::kernels::{self, BACKENDS, Fetched, KERNELS, Kernel, Matrix};
use crate::qemu::{self, Ending};
use crate::{binaries, guest, guest_tests, paths, setup};
use anyhow::{Result, bail};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The guest's test runner; the calls come from guest_tests.rs.
const GUEST_PART: &str = include_str!("../guest/vm-test.sh");
/// Per boot: a hang guard. Under single-threaded TCG a kernel's tests take a few minutes on a
/// quiet host, several times that on a loaded one.
const BOOT_LIMIT: Duration = Duration::from_secs(1800);

#[derive(clap::Args, Default)]
pub struct Args {
    /// Kernel series to boot, repeatable: 5.10, 6.1, 6.12, 7 (default: all of them).
    #[arg(long = "kernel", value_name = "SERIES")]
    kernels: Vec<String>,
    /// The guests' architecture, repeatable (default: x86-64): Debian's kernels of that
    /// architecture, booted under its emulator, and the tests and programs cross-built for it
    /// (kernels.rs names each architecture's backends per kernel). The boots of all of them
    /// share the `--jobs`.
    #[arg(long = "arch", value_enum, value_name = "ARCH")]
    arches: Vec<Arch>,
    /// Kernels booted at once (default 1: a VM that shares its host CPU sees its scheduler
    /// ticks stretched, and the quota arithmetic the tests check with them; one per host CPU
    /// leaves each its own).
    #[arg(long, value_name = "N", default_value_t = 1)]
    jobs: usize,
    /// Backend to run the kernel facts with, repeatable: kprobe, fentry, tracepoint (default:
    /// each kernel's, kernels.rs).
    #[arg(long = "backend", value_name = "BACKEND", value_parser = clap::builder::PossibleValuesParser::new(BACKENDS))]
    backends: Vec<String>,
    /// Only the kernel facts and the tests every kernel runs: leave out the rest of the host
    /// tests, which the newest kernel's guest runs, and the fault tests' runs with other
    /// backends.
    #[arg(long)]
    facts_only: bool,
    /// Run only the host tests whose `binary::test` name starts with this, repeatable (e.g.
    /// `advise` or `ancestor::every_parent_stop_credits_both_children`); the reasons the others
    /// do not run are printed as always.
    #[arg(long = "host-test", value_name = "PREFIX")]
    host_test: Vec<String>,
    /// Also measure the kprobe and fentry programs' cost per invocation beside a throttled
    /// load, next to empty programs on the same hooks, in the same boots. Not in `cargo xtask
    /// test`: it builds a static xtask for the guest (minutes from cold).
    #[arg(long)]
    cost: bool,
}

impl Args {
    /// `cargo xtask test`'s: every kernel of both architectures (kernels.rs), two boots at a
    /// time, one per host CPU of CI's two (each VM is one emulator thread), in one pool.
    pub fn ci() -> Self {
        Self {
            arches: vec![Arch::X86_64, Arch::Arm64],
            jobs: 2,
            ..Self::default()
        }
    }
}

struct Row {
    kernel: String,
    name: String,
    verdict: &'static str,
    figures: String,
}

/// Downloads every kernel of `arch`'s matrix not yet in the cache ([`Kernel::fetch`]).
pub fn fetch_kernels(arch: Arch) -> Result<()> {
    for kernel in KERNELS {
        kernel.fetch(arch)?;
    }
    Ok(())
}

/// What one boot runs: the host tests' runs to judge and the command-line words that select
/// them, the backends its kernel cannot run (SKIP rows) and those whose cost it measures.
struct Plan<'a> {
    arch: Arch,
    /// Its architecture's initramfs.
    initrd: PathBuf,
    kernel: &'a Kernel,
    matrix: &'a Matrix,
    fetched: Fetched,
    unable: Vec<(&'static str, &'static str)>,
    runs: Vec<String>,
    flags: Vec<String>,
    cost: Vec<&'static str>,
}

pub fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let arches = if args.arches.is_empty() {
        vec![Arch::X86_64]
    } else {
        args.arches.clone()
    };
    let mut parts = vec![setup::Part::Build, setup::Part::Vm];
    if arches.contains(&Arch::Arm64) {
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
    let mut plans = Vec::new();
    let mut not_run = Vec::new();
    for &arch in &arches {
        let (arch_plans, selection) = plan(args, arch, &kernels)?;
        plans.extend(arch_plans);
        // The same tests on every architecture, from the same plan.
        not_run = selection.not_run;
    }

    let jobs = args.jobs.clamp(1, plans.len().max(1));
    // The longest boots first (the one that runs the rest of the host tests, then those with
    // the most runs, then the newer kernel: more of it runs under the emulator), so that two
    // workers end together; the table keeps the matrix's order (oldest kernel first).
    let mut order: Vec<usize> = (0..plans.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse((plans[i].matrix.host_tests, plans[i].runs.len(), i)));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<_> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&i) = order.get(k) else {
                            return done;
                        };
                        let booted = Instant::now();
                        let result = test_kernel(&plans[i]);
                        done.push((i, booted.elapsed(), result));
                    }
                })
            })
            .collect();
        let mut all: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("a vm-test worker panicked"))
            .collect();
        all.sort_by_key(|(i, _, _)| *i);
        all
    });
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut boots: Vec<(Arch, Duration)> = Vec::new();
    for (i, took, result) in results {
        let (kernel_rows, kernel_failures) = result?;
        rows.extend(kernel_rows);
        failures.extend(kernel_failures);
        boots.push((plans[i].arch, took));
    }

    print_table(&rows);
    // What each architecture costs CI: its boots' time, shared by the `--jobs` workers.
    for arch in &arches {
        let (n, took) = boots
            .iter()
            .filter(|(a, _)| a == arch)
            .fold((0, Duration::ZERO), |(n, sum), (_, t)| (n + 1, sum + *t));
        println!(
            "{}: {n} boot(s), {:.0} s of boot time",
            arch.debian(),
            took.as_secs_f64()
        );
    }
    for not_run in &not_run {
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

/// `arch`'s boots of `kernels`: its programs and tests built, the tests the guests run selected
/// from their own lists, the initramfs written, and what each kernel's guest runs.
fn plan<'a>(args: &Args, arch: Arch, kernels: &[&'a Kernel]) -> Result<(Vec<Plan<'a>>, Selection)> {
    let binaries = binaries::build_with_tests(arch)?;
    let mut selection = guest_tests::select(&binaries.tests, arch)?;
    if args.facts_only {
        selection.rest.clear();
        selection.faults.clear();
    }
    if !args.host_test.is_empty() {
        selection.retain(&args.host_test);
        if selection.is_empty() {
            bail!(
                "no host test the guest runs starts with {}: see `cargo test -p tracer -- --list`",
                args.host_test.join(" or ")
            );
        }
    }
    let vm = paths::vm();
    let initrd = vm.join(format!("vm-test-{}.cpio", arch.debian()));
    let mut plans = Vec::new();
    for &kernel in kernels {
        let fetched = kernel.fetch(arch)?;
        let matrix = kernel.matrix(arch);
        eprintln!(
            "kernel {} {}: {} {}",
            arch.debian(),
            kernel.series,
            fetched.package,
            fetched.version
        );
        let chosen = |b: &str| args.backends.iter().any(|c| c == b);
        // Those the kernel cannot run on this architecture are shown, never run.
        let unable: Vec<_> = matrix
            .unable
            .iter()
            .copied()
            .filter(|(b, _)| args.backends.is_empty() || chosen(b))
            .collect();
        let backends: Vec<&'static str> = BACKENDS
            .iter()
            .copied()
            .filter(|b| {
                if args.backends.is_empty() {
                    matrix.backends.contains(b)
                } else {
                    chosen(b)
                }
            })
            .filter(|b| !unable.iter().any(|(u, _)| u == b))
            .collect();
        let (runs, mut flags) = selection.for_kernel(matrix, &backends);
        let cost: Vec<&'static str> = backends
            .iter()
            .copied()
            .filter(|b| args.cost && vm_cost::BACKENDS.contains(b))
            .collect();
        flags.extend(cost.iter().map(|b| vm_cost::flag(b)));
        plans.push(Plan {
            arch,
            initrd: initrd.clone(),
            kernel,
            matrix,
            fetched,
            unable,
            runs,
            flags,
            cost,
        });
    }

    let mut script = format!("{GUEST_PART}\n{}", selection.guest_calls());
    if args.cost {
        script += &format!("\n{}\n{}", vm_cost::GUEST_PART, vm_cost::guest_calls());
    }
    let xtask = args.cost.then(|| binaries::xtask(arch)).transpose()?;
    std::fs::write(
        &initrd,
        guest::initramfs(
            &guest::init_script(&script),
            &binaries,
            xtask.as_deref(),
            &[],
        )?,
    )?;
    std::fs::create_dir_all(vm.join("logs"))?;
    Ok((plans, selection))
}

/// Boots one kernel with its initramfs, its guest running what `plan`'s command-line words
/// select, and judges what it printed: its table rows and its failures.
fn test_kernel(plan: &Plan) -> Result<(Vec<Row>, Vec<String>)> {
    let (kernel, fetched) = (plan.kernel, &plan.fetched);
    let log = paths::vm().join("logs").join(format!(
        "vm-test-{}-{}.log",
        plan.arch.debian(),
        kernel.series
    ));
    eprintln!(
        "booting {} {} ({}), console → {}",
        plan.arch.debian(),
        kernel.series,
        fetched.version,
        log.display()
    );
    let booted = Instant::now();
    let progress = |line: &str| {
        if let Some(rest) = line.strip_prefix("@@TT ")
            && ["UNAME", "TEST", "COST"]
                .iter()
                .any(|k| rest.starts_with(k))
        {
            let at = booted.elapsed().as_secs();
            eprintln!("  [{} {} +{at}s] {rest}", plan.arch.debian(), kernel.series);
        }
    };
    let boot = qemu::boot(
        plan.arch,
        &fetched.vmlinuz,
        &plan.initrd,
        &plan.flags.join(" "),
        &log,
        BOOT_LIMIT,
        &progress,
    )?;
    let console = Console::parse(&boot.console);
    let release = console.mark("UNAME", "").unwrap_or("?");
    let label = format!("{} {release} ({})", kernel.series, fetched.version);
    let mut failures = Vec::new();
    let row = |name: String, verdict: &'static str, figures: String| Row {
        kernel: label.clone(),
        name,
        verdict,
        figures,
    };
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
    let (doctor_verdict, doctor_figures) = doctor(&console, &label, &mut failures);
    let mut rows = vec![
        row("doctor".to_owned(), doctor_verdict, doctor_figures),
        row(
            "boot".to_owned(),
            if booted_clean { "PASS" } else { "FAIL" },
            format!(
                "{:?} after {:.0} s{}",
                boot.ending,
                boot.elapsed.as_secs_f64(),
                if trouble.is_empty() {
                    ""
                } else {
                    ", the kernel reported trouble"
                }
            ),
        ),
    ];
    for (backend, why) in &plan.unable {
        let (verdict, figures) = unable(&console, &label, backend, why, &mut failures);
        rows.push(row(format!("{backend}: kernel facts"), verdict, figures));
    }
    for test in &plan.runs {
        let outcome = guest_tests::judge(&console, test);
        if !outcome.passed {
            failures.push(format!(
                "{label} {test}:\n    {}\n    (console: {})",
                outcome.problem.join("\n    "),
                log.display()
            ));
        }
        rows.push(row(
            test.clone(),
            if outcome.passed { "PASS" } else { "FAIL" },
            outcome.figures,
        ));
    }
    for backend in &plan.cost {
        let (cost_rows, problems) = vm_cost::judge(&console, backend);
        if !problems.is_empty() {
            failures.push(format!(
                "{label} {backend} cost:\n    {}\n    (console: {})",
                problems.join("\n    "),
                log.display()
            ));
        }
        rows.extend(
            cost_rows
                .into_iter()
                .map(|r| row(r.name, r.verdict, r.figures)),
        );
    }
    Ok((rows, failures))
}

/// The doctor must find a usable backend on every kernel; its choice goes in the table.
fn doctor(console: &Console, label: &str, failures: &mut Vec<String>) -> (&'static str, String) {
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
    (if ok { "PASS" } else { "FAIL" }, choice)
}

/// A backend the kernel cannot run on this architecture (kernels.rs `unable`): a SKIP whose
/// figures are the guest's doctor's reason, the kernel's refusal; a failure if the doctor
/// found it usable, or said nothing of it.
fn unable(
    console: &Console,
    label: &str,
    backend: &str,
    why: &str,
    failures: &mut Vec<String>,
) -> (&'static str, String) {
    let check = doctor_report(console).and_then(|d| {
        d["backends"]
            .as_array()?
            .iter()
            .find(|b| b["backend"] == backend)
            .cloned()
    });
    match check.as_ref().map(|c| c["reason"].as_str()) {
        Some(Some(reason)) => ("SKIP", format!("{why}; doctor: {reason}")),
        Some(None) => {
            failures.push(format!(
                "{label}: kernels.rs says {backend} cannot run here ({why}), but the doctor \
                 attached it: run its kernel facts"
            ));
            ("FAIL", "the doctor found it usable".to_owned())
        }
        None => {
            failures.push(format!("{label}: the doctor said nothing of {backend}"));
            ("FAIL", "not in the doctor's report".to_owned())
        }
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
    let name_width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    println!();
    for row in rows {
        println!(
            "{:kernel_width$}  {:name_width$}  {}  {}",
            row.kernel, row.name, row.verdict, row.figures
        );
    }
    println!();
}
