//! Project tasks for throttle-tracer: `cargo xtask setup | demo | test | vm-test | vm-demo | bench |
//! bench-exporter | image | advise-check | soak | fuzz`.
mod advise_check;
mod apt;
mod arch;
mod bench;
mod binaries;
mod cgroup;
mod cmd;
mod console;
mod cpio;
mod demo;
mod exporter_memory;
mod fuzz;
mod guest;
mod guest_tests;
mod image;
mod kernels;
mod paths;
mod process;
mod qemu;
#[cfg(test)]
mod readme;
mod results;
mod setup;
mod soak;
mod vm_demo;
mod vm_test;

use arch::Arch;
use clap::Parser;

#[derive(Parser)]
#[command(about = "throttle-tracer's project tasks")]
enum Cli {
    /// Install what the tasks need (all of it, or the parts named); fast when nothing is missing.
    Setup {
        /// Only these parts (none named: all of them).
        #[arg(value_enum)]
        parts: Vec<setup::Part>,
    },
    /// Boot Debian kernels under QEMU and check the tracer against cpu.stat.
    VmTest(vm_test::Args),
    /// Build the tracer and run `throttle-tracer demo` on this machine (the README's main command).
    Demo,
    /// The kprobe backend on a Debian 6.12 kernel in QEMU: a throttled workload, traced.
    VmDemo,
    /// Formatting, lints, unit and host tests, then vm-test on every kernel of both
    /// architectures.
    Test,
    /// What the tracer costs on this host, next to bpftrace and an empty program, in one table
    /// (and target/bench/bench.json): kernel cost, slowdown, startup, ingest, memory, load.
    Bench(bench::Args),
    /// The container image throttle-tracer:<version> (deploy/Dockerfile, FROM scratch) from the
    /// static build, into the local Docker daemon (a private one if none answers), saved as
    /// target/image/throttle-tracer-<version>.tar; prints its size.
    Image,
    /// What `serve` holds in memory per exported cgroup, at its 1,000-cgroup bound.
    BenchExporter(exporter_memory::Args),
    /// Is the advice not wasteful? Traces workloads of known demand, then bisects the smallest
    /// quota, burst and period that stop them no more, against the advised ones (minutes).
    AdviseCheck(advise_check::Args),
    /// In a vm-test guest: the running tracer's kprobe/fentry programs' cost (bench/vm_cost.rs).
    #[command(hide = true)]
    GuestProgramCost(bench::vm_cost::GuestArgs),
    /// In a vm-startup guest: exec → start line per backend, and bpftrace's (bench/startup.rs).
    #[command(hide = true)]
    GuestStartup(bench::startup::GuestArgs),
    /// The tracer left running over throttling groups for `--minutes`: its memory, CPU time
    /// and descriptors sampled, its totals against cpu.stat (root; not part of `test`).
    Soak(soak::Args),
    /// The fuzz targets (fuzz/), each for `--seconds` from its kept corpus, which is then
    /// minimised (cargo-fuzz; not part of `test`, whose unit tests replay the corpora).
    Fuzz(fuzz::Args),
}

/// A failed task prints its cause chain on one line, without the backtrace anyhow would add
/// when RUST_BACKTRACE is set: the chain says what failed, the frames would only bury it.
fn main() -> std::process::ExitCode {
    let result = match Cli::parse() {
        Cli::Setup { parts } if parts.is_empty() => setup::run(&setup::Part::ALL),
        Cli::Setup { parts } => setup::run(&parts),
        Cli::VmTest(args) => vm_test::run(&args),
        Cli::Demo => demo::run(),
        Cli::VmDemo => vm_demo::run(),
        Cli::Test => test(),
        Cli::Bench(args) => bench::run(&args),
        Cli::Image => image::run(),
        Cli::BenchExporter(args) => exporter_memory::run(&args),
        Cli::AdviseCheck(args) => advise_check::run(&args),
        Cli::GuestProgramCost(args) => bench::vm_cost::guest(&args),
        Cli::GuestStartup(args) => bench::startup::guest(&args),
        Cli::Soak(args) => soak::run(&args),
        Cli::Fuzz(args) => fuzz::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The README's test command: everything CI checks, host first, then the kernels of both
/// architectures in one pool of boots.
fn test() -> anyhow::Result<()> {
    use setup::Part;
    timed("setup", || setup::run(&[Part::Build]))?;
    // What only the later steps need (QEMU of both architectures, the host tests' servers and
    // runtimes, the bench's peers, arm64's cross linker and Rust target) and both matrices'
    // kernels (apt lists, downloads, unpacking: most of it waiting on the network) come beside
    // the lints and the build.
    let installed = std::thread::spawn(|| {
        let started = std::time::Instant::now();
        setup::run(&[Part::Vm, Part::HostTests, Part::Bench, Part::Arm64])?;
        vm_test::fetch_kernels(Arch::X86_64)?;
        vm_test::fetch_kernels(Arch::Arm64)?;
        eprintln!(
            "the rest of the set-up and the kernels beside the build in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        anyhow::Ok(())
    });
    timed("fmt and clippy", || {
        cmd::run(paths::cargo().args(["fmt", "--all", "--check"]))?;
        // The lints need no eBPF object, whose build is most of a minute.
        cmd::run(paths::cargo().env("AYA_BUILD_SKIP", "1").args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    // The tests' compile: the image, the host tests, the soak and the guests all run it.
    let binaries = timed("build", || binaries::build_with_tests(Arch::HOST))?;
    installed.join().expect("the set-up's thread panicked")?;
    // tracer/tests/image.rs runs the image this saves.
    timed("image", || image::build(&[&binaries]))?;
    // CI's rules whoever runs it: a host test that cannot run for want of something this
    // machine could have (root, BTF, a cpu controller, Prometheus) fails instead of passing.
    timed("host tests", || {
        // The churn test runs beside the soak instead, for its minute (see soak.rs).
        cmd::run(binaries::tests(Arch::HOST).env("CI", "true").args([
            "--",
            "--skip",
            soak::CHURN_TEST,
        ]))
    })?;
    // Not beside the host tests, even at the idle scheduling class: a CPU running any task
    // when a stopped group's quota refills leaves the group waiting for the next tick (the
    // kernel reschedules at an unthrottle only a CPU that is idle), up to 4 ms a period of
    // stop length the host tests judge. The arm64 guests' compile (three minutes on two cores)
    // runs beside the soak, whose judgements (memory, counts) a busy machine does not move.
    let arm64 = std::thread::spawn(|| {
        let started = std::time::Instant::now();
        let built = binaries::build_quietly(Arch::Arm64);
        eprintln!(
            "arm64 tests cross-built beside the soak in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        built
    });
    // xtask's own tests (a compile, and tests of parsers and tables) need neither cgroups nor a
    // quiet host: they run beside the soak, whose minute is mostly waiting and whose groups
    // are favoured over them, their output held back until it is done.
    let xtask_tests = std::thread::spawn(|| {
        let mut cargo = paths::cargo();
        cargo
            .args(["test", "-p", "xtask"])
            .stdin(std::process::Stdio::null());
        cargo.output()
    });
    timed("soak (1 minute)", || soak::short(&binaries))?;
    // The smoke bench (that every figure can still be taken, on the programs the host tests
    // ran; a tenth of the fleet, no figure kept) after the host tests, whose timings a bench
    // beside them would disturb, and after the soak: its fleet's cgroups would be traced by
    // the churn test's tracers beside the soak, which judge their memory by the cgroups they
    // make. Beside what is left of the arm64 compile and xtask's tests.
    timed("bench --smoke", || bench::smoke(&binaries))?;
    timed("xtask's tests (beside the soak)", || {
        let out = xtask_tests
            .join()
            .expect("the thread of xtask's tests panicked")?;
        std::io::Write::write_all(&mut std::io::stderr(), &out.stderr)?;
        std::io::Write::write_all(&mut std::io::stdout(), &out.stdout)?;
        if !out.status.success() {
            anyhow::bail!("`cargo test -p xtask` failed: {}", out.status);
        }
        print_ignored()
    })?;
    arm64.join().expect("the arm64 build's thread panicked")?;
    // vm-test prints its own wall time, after each architecture's boot time.
    vm_test::run(&vm_test::Args::ci())
}

/// Runs one step of `test`, printing its wall time (for CI's 25-minute budget).
fn timed<T>(step: &str, run: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let started = std::time::Instant::now();
    let result = run();
    eprintln!("{step} took {:.0} s", started.elapsed().as_secs_f64());
    result
}

/// Names the tests that `#[ignore]` kept from running, so that none is forgotten.
fn print_ignored() -> anyhow::Result<()> {
    let mut list = cmd::stdout(binaries::tests(Arch::HOST).args(["--", "--list", "--ignored"]))?;
    list +=
        &cmd::stdout(paths::cargo().args(["test", "-p", "xtask", "--", "--list", "--ignored"]))?;
    let ignored: Vec<&str> = list
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .collect();
    if ignored.is_empty() {
        eprintln!("no test is #[ignore]d");
    } else {
        eprintln!("#[ignore]d, not run: {}", ignored.join(", "));
    }
    Ok(())
}
