//! The host tests (tracer/tests) inside the VM guests, on their cgroup v2 cpu controller, which
//! this host cannot mount (its v1 hierarchy holds the controller): which tests run there and why
//! the others do not, the guest's calls, and what each test's run says.
use crate::cmd;
use crate::console::Console;
use anyhow::{Result, bail};
use std::path::PathBuf;
use std::process::Command;

/// What one test binary (tracer/tests/NAME.rs) does in the guest.
enum Plan {
    /// Every test runs, except these: (test, why it cannot run in the guest).
    Run(&'static [(&'static str, &'static str)]),
    /// None runs: no test of it touches a cgroup, so the host run covers it (why).
    HostOnly(&'static str),
}

/// A test of what the tracer does with the records, not of what a kernel does.
const USERSPACE: &str = "the same userspace code on every kernel (selection, rendering, \
                         replay), run by the host; left out of the guest for CI's 20 minutes";

/// Every test binary cargo builds must be here: a new one is a decision, not a default.
const PLANS: &[(&str, Plan)] = &[
    (
        "advise",
        Plan::Run(&[
            (
                "advise_prints_only_the_advice_and_measures_the_rounds",
                "the `advise` subcommand's output, the same userspace on every kernel; the \
                 per-period demand it reads is checked against the group's usage counter by the \
                 s3 scenarios on every guest kernel and backend (10 s of CI's 20 minutes)",
            ),
            (
                "a_burst_below_demand_minus_quota_is_flagged_as_buying_nothing",
                "the flag is quota arithmetic in userspace; that such a burst buys nothing in the \
                 kernel is s3-burst-25ms's check on every guest kernel with burst (10 s)",
            ),
            (
                "random_arrivals_are_measured_and_the_advised_quota_stops_them_in_at_most_1_percent_of_periods",
                "a statistical check over a hundred periods (24 s under TCG), of the same \
                 advice arithmetic; the demand it is built on is the s3 scenarios' on every \
                 guest kernel and backend, and the advised quota and burst are applied here by \
                 a_spiky_burn_is_measured_and_the_advice_stops_it_no_more",
            ),
        ]),
    ),
    ("ancestor", Plan::Run(&[])),
    (
        "containers",
        Plan::HostOnly(
            "starts dockerd and podman, which the initramfs does not hold (and the guest's \
             busybox has no ldd or tar for the image); the naming of their cgroup layouts is \
             unit-tested, and the guest's v2 cgroups are exercised by every other test",
        ),
    ),
    (
        "cli",
        Plan::HostOnly(
            "argument parsing, usage errors and machines that cannot trace (made on the host in \
             mount namespaces of their own: the cpu hierarchy unmounted, the kernel's BTF file \
             hidden), the same userspace checks on every kernel",
        ),
    ),
    (
        "cpu_files",
        Plan::HostOnly(
            "the v1 and v2 file formats in temporary directories; the real v2 files are what \
             every test run in the guest reads and writes",
        ),
    ),
    (
        "demo",
        Plan::Run(&[(
            "a_killed_demo_is_cleaned_up_by_the_next_one",
            "removing a killed demo's leftovers is the same rmdir on every kernel, and the \
             guest's v2 removal is demo_traces_explains_and_cleans_up's (12 s of CI's 20 minutes)",
        )]),
    ),
    (
        "deploy",
        Plan::HostOnly("the repository's deployment files, no cgroup"),
    ),
    (
        "doctor",
        Plan::Run(&[
            (
                "fentry_refusal_is_one_line_with_the_cause_and_a_hint",
                "applies where fentry is refused (this host); every VM kernel attaches it (the \
                 doctor row, the fentry scenarios), so it would only say \"not applicable\"",
            ),
            (
                "doctor_agrees_with_the_machine",
                "the boot's doctor row runs it on every kernel, and \
                 bpf_and_perfmon_alone_use_every_backend_root_can runs root's doctor here and \
                 compares (19 s of CI's 20 minutes)",
            ),
        ]),
    ),
    (
        "churn",
        Plan::Run(&[(
            "churning_cgroups_leave_the_live_ones_traced_whole_and_nothing_behind",
            "moves one thread at a time between cgroups (v1 `tasks`), which cgroup v2 allows \
             only in threaded subtrees; the host runs it",
        )]),
    ),
    (
        "endings",
        Plan::Run(&[
            (
                "signals_end_the_run_with_its_summary_and_a_complete_recording",
                "the agent's signal handling and recording, the same on every kernel; \
                 a_closed_output_pipe_ends_the_run_at_once detaches the probes there (12 s of \
                 CI's 20 minutes)",
            ),
            (
                "report_of_a_killed_recording_says_how_far_it_got",
                USERSPACE,
            ),
            (
                "two_tracers_at_once_each_trace_their_whole_window",
                "not run in a guest yet: checked on the host's tracepoint backend only; two \
                 kprobe or fentry tracers on one function under TCG are still to be run",
            ),
        ]),
    ),
    (
        "image",
        Plan::HostOnly(
            "runs the image on containerd and scrapes it with Prometheus, neither of which the \
             initramfs holds (nor the image archive, which cargo xtask image builds on the host)",
        ),
    ),
    (
        "golden",
        Plan::HostOnly("recordings in tracer/tests/data, no cgroup"),
    ),
    (
        "host_tracepoint",
        Plan::Run(&[(
            "a_cgroup_it_may_not_read_is_traced_and_its_missing_cpu_stat_explained",
            "not run in a guest yet: checked on the host (v1, tracepoint as `auto` picks it) \
             only; the guests' v2 hierarchy and their `auto` backends are still to be run",
        )]),
    ),
    (
        "fleet",
        Plan::HostOnly(
            "starts dockerd and a Prometheus server, which the initramfs does not hold; the \
             demand it exports is the advise tests' and the scenarios' on every guest kernel",
        ),
    ),
    (
        "live",
        Plan::Run(&[
            (
                "terminal_live_view_selects_scrolls_resizes_and_gives_the_terminal_back",
                "needs tmux, which the initramfs does not hold",
            ),
            (
                "terminal_live_view_shows_the_largest_run_demand_of_the_interval",
                "needs tmux, which the initramfs does not hold",
            ),
            (
                "terminal_live_view_p_shows_the_held_process_by_pid_and_comm",
                "needs tmux, which the initramfs does not hold",
            ),
            (
                "piped_live_view_prints_timestamped_blocks_of_the_throttled_cgroup",
                USERSPACE,
            ),
        ]),
    ),
    (
        "prometheus",
        Plan::HostOnly(
            "needs a Prometheus server, promtool and Alertmanager, which the initramfs does \
             not hold; the exporter renders what every guest test's tracing records",
        ),
    ),
    (
        "overflow",
        Plan::Run(&[(
            "an_overflowing_ring_loses_counted_records_and_the_trace_recovers",
            "not run in a guest yet: its bounds were checked on the host's tracepoint backend \
             only, and a run of it under TCG with the kprobe backend is still to be made",
        )]),
    ),
    (
        "recommend",
        Plan::HostOnly(
            "reads a Prometheus server, which the initramfs does not hold; no cgroup, the same \
             userspace on every kernel",
        ),
    ),
    ("recording", Plan::HostOnly(USERSPACE)),
    ("removed", Plan::Run(&[])),
    ("scan", Plan::Run(&[])),
    (
        "serve_limits",
        Plan::HostOnly(
            "the exporter's connection handling on loopback, the same code on every kernel",
        ),
    ),
    ("serve_selection", Plan::HostOnly(USERSPACE)),
    ("threads", Plan::Run(&[])),
];

/// The tests every kernel's guest runs, not only the one that runs the host tests (kernels.rs
/// `host_tests`): what differs from kernel to kernel. deploy/daemonset.yaml's two capabilities
/// must trace with every backend root can use, and which backends a kernel lets them use is the
/// kernel's (Debian's 5.10, 6.1, 6.12 and 7.2 refuse the kprobe backend's perf events to them;
/// 5.10 charges maps to RLIMIT_MEMLOCK); 8 to 16 s a boot under TCG.
const EVERY_KERNEL: &[&str] = &["doctor::bpf_and_perfmon_alone_use_every_backend_root_can"];

/// The fault tests (issue 10) that the guests also run with the other backends than the host
/// tests' kprobe, each backend on the kernel whose `fault_backends` (kernels.rs) names it: what
/// a quota write, a cgroup's removal and a start in the middle of an incident end or count is
/// each backend's own code. Each run is a tracer start more: the tracepoint backend's takes 30
/// to 40 s under TCG, so one kernel per backend.
const FAULTS: &[&str] = &[
    "host_tracepoint::a_quota_written_while_stopped_ends_the_stop_as_a_quota_change",
    "host_tracepoint::started_in_the_middle_of_an_incident_the_cross_check_is_exact",
    "removed::a_cgroup_removed_while_stopped_keeps_its_summary_marked_gone_and_new_ones_are_their_own",
];

/// The tests the guest runs, and the ones it does not with why.
#[derive(Default)]
pub struct Selection {
    /// `binary::test`, in the order the guest runs them.
    pub run: Vec<String>,
    /// Those of `run` that every kernel's guest runs ([`EVERY_KERNEL`]); the rest run where the
    /// kernel's command line has [`CMDLINE_FLAG`].
    pub every_kernel: Vec<String>,
    /// Those of `run` that kernels with `fault_backends` run again with each of them
    /// ([`FAULTS`]); [`with_backend`] names such a run.
    pub faults: Vec<String>,
    /// `binary::test: why`, or `binary: why` for a whole binary.
    pub not_run: Vec<String>,
}

/// Which tests of `tests` (name, file: the binaries cargo built) the guest runs, from each
/// binary's own list of its tests. A binary or an excluded test [`PLANS`] does not know (or
/// knows but cargo did not build) is an error: the plan must follow the tests.
pub fn select(tests: &[(String, PathBuf)]) -> Result<Selection> {
    let mut selection = Selection::default();
    for (name, file) in tests {
        let Some((_, plan)) = PLANS.iter().find(|(n, _)| n == name) else {
            bail!(
                "tracer/tests/{name}.rs is new: say in xtask/src/guest_tests.rs whether its tests \
                 run in the VM guests"
            );
        };
        let except = match plan {
            Plan::HostOnly(why) => {
                selection.not_run.push(format!("{name}: {why}"));
                continue;
            }
            Plan::Run(except) => except,
        };
        let list = cmd::stdout(Command::new(file).args(["--list", "--format", "terse"]))?;
        let names: Vec<&str> = list
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .collect();
        for (test, why) in *except {
            if !names.contains(test) {
                bail!("xtask/src/guest_tests.rs excludes {name}::{test}, which does not exist");
            }
            selection.not_run.push(format!("{name}::{test}: {why}"));
        }
        selection.run.extend(
            names
                .iter()
                .filter(|t| !except.iter().any(|(e, _)| e == *t))
                .map(|t| format!("{name}::{t}")),
        );
    }
    for (name, _) in PLANS {
        if !tests.iter().any(|(n, _)| n == name) {
            bail!(
                "xtask/src/guest_tests.rs plans for tracer/tests/{name}.rs, which cargo did not build"
            );
        }
    }
    for test in EVERY_KERNEL {
        if !selection.run.iter().any(|t| t == test) {
            bail!("xtask/src/guest_tests.rs runs {test} on every kernel, but not in the guests");
        }
    }
    selection.every_kernel = EVERY_KERNEL.iter().map(|t| (*t).to_owned()).collect();
    for test in FAULTS {
        if !selection.run.iter().any(|t| t == test) {
            bail!("xtask/src/guest_tests.rs runs {test} with every backend, but not in the guests");
        }
    }
    selection.faults = FAULTS.iter().map(|t| (*t).to_owned()).collect();
    Ok(selection)
}

/// The name of `test`'s run with `backend` (not the host tests' kprobe): `binary::test@backend`,
/// its table row and its markers on the console.
pub fn with_backend(test: &str, backend: &str) -> String {
    format!("{test}@{backend}")
}

/// The kernel command-line word that makes the guest run the fault tests with `backend`.
pub fn faults_flag(backend: &str) -> String {
    format!("tt.faults_{backend}")
}

/// The guest's calls (guest/vm-test.sh `host_test BINARY TEST [BACKEND]`): those of every
/// kernel, then the rest where the kernel's command line asks for them, then the fault tests
/// with each backend whose flag ([`faults_flag`]) it has.
pub fn guest_calls(selection: &Selection) -> String {
    let call = |t: &String| {
        let (binary, test) = t.split_once("::").expect("binary::test");
        format!("host_test {binary} {test}")
    };
    let faults: String = crate::scenarios::BACKENDS
        .iter()
        .filter(|b| !selection.faults.is_empty() && **b != HOST_TESTS_BACKEND)
        .map(|b| {
            let calls: Vec<String> = selection
                .faults
                .iter()
                .map(|t| format!("    {} {b}", call(t)))
                .collect();
            format!(
                "\nif grep -qw {} /proc/cmdline; then\n{}\nfi",
                faults_flag(b),
                calls.join("\n")
            )
        })
        .collect();
    let (every, flagged): (Vec<&String>, Vec<&String>) = selection
        .run
        .iter()
        .partition(|t| selection.every_kernel.contains(t));
    let every: Vec<String> = every.into_iter().map(call).collect();
    let flagged: Vec<String> = flagged
        .into_iter()
        .map(|t| format!("    {}", call(t)))
        .collect();
    format!(
        "{}\nif grep -qw {CMDLINE_FLAG} /proc/cmdline; then\n{}\n:\nfi{faults}",
        every.join("\n"),
        flagged.join("\n")
    )
}

/// The backend the host tests trace with in the guests (guest/vm-test.sh `host_test`).
pub const HOST_TESTS_BACKEND: &str = "kprobe";

/// The kernel command-line word that makes the guest run the host tests.
pub const CMDLINE_FLAG: &str = "tt.host_tests";

/// What the console says of one test.
pub struct Outcome {
    pub passed: bool,
    /// Its time, and why it did not apply if it said so.
    pub figures: String,
    /// Why it failed: the panic and what follows it, or the end of its output.
    pub problem: Vec<String>,
}

/// The outcome of `test` (`binary::test`) from the console.
pub fn judge(console: &Console, test: &str) -> Outcome {
    let status = console.mark("TESTED", test);
    let output = console.section(&format!("test/{test}")).unwrap_or_default();
    // "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; finished in
    // 12.34s": exactly one test ran (a filter that matches nothing passes with 0).
    let result = output.iter().find_map(|l| l.strip_prefix("test result: "));
    let ran_one = result.is_some_and(|r| r.starts_with("ok. 1 passed;"));
    let passed = status == Some("exit status 0") && ran_one;
    let mut figures = result
        .and_then(|r| r.rsplit_once("finished in "))
        .map_or("no result printed".to_owned(), |(_, time)| time.to_owned());
    if let Some(why) = output
        .iter()
        .find_map(|l| l.split_once(": not applicable here: "))
    {
        figures += &format!(", not applicable here: {}", why.1);
    }
    let problem = if passed {
        Vec::new()
    } else {
        let panic = output.iter().position(|l| l.contains("panicked at"));
        let from = panic.unwrap_or(output.len().saturating_sub(20));
        std::iter::once(format!(
            "{}, {}",
            status.unwrap_or("no exit status printed"),
            result.unwrap_or("no test result printed")
        ))
        .chain(output[from..].iter().take(20).cloned())
        .collect()
    };
    Outcome {
        passed,
        figures,
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn console(name: &str, status: u8, output: &str) -> Console {
        Console::parse(&format!(
            "@@TT TEST {name}\n@@TT TESTED {name} exit status {status}\n\
             @@TT BEGIN test/{name}\n{output}\n@@TT END test/{name}\n"
        ))
    }

    #[test]
    fn one_test_passed_with_its_time_and_what_did_not_apply() {
        let output = "running 1 test\n\
                      x::t: not applicable here: no cpu.stat.local (6.6+)\n\
                      test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 2 filtered \
                      out; finished in 7.06s";
        let outcome = judge(&console("x::t", 0, output), "x::t");
        assert!(outcome.passed);
        assert_eq!(
            outcome.figures,
            "7.06s, not applicable here: no cpu.stat.local (6.6+)"
        );
    }

    #[test]
    fn a_panic_or_no_test_run_fails() {
        let output = "thread 't' panicked at tracer/tests/x.rs:1:1:\nboom\n\
                      test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 \
                      filtered out; finished in 1.00s";
        let outcome = judge(&console("x::t", 101, output), "x::t");
        assert!(!outcome.passed);
        assert!(outcome.problem[0].starts_with("exit status 101, FAILED."));
        assert_eq!(outcome.problem[2], "boom");
        // A name that matches no test passes with 0 tests: that is a failure too.
        let output = "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 3 filtered \
                      out; finished in 0.00s";
        assert!(!judge(&console("x::t", 0, output), "x::t").passed);
        assert!(!judge(&Console::parse(""), "x::t").passed);
    }

    #[test]
    fn the_fault_tests_run_again_with_each_other_backend_under_its_flag() {
        let test = "removed::a_test".to_owned();
        let selection = Selection {
            run: vec![test.clone()],
            faults: vec![test.clone()],
            ..Selection::default()
        };
        let calls = guest_calls(&selection);
        for backend in ["fentry", "tracepoint"] {
            let block = format!(
                "if grep -qw {} /proc/cmdline; then\n    host_test removed a_test {backend}\nfi",
                faults_flag(backend)
            );
            assert!(calls.contains(&block), "{calls}");
        }
        assert!(!calls.contains("a_test kprobe"), "{calls}");
        // The runs' markers are apart: the kprobe run's is not the fentry run's.
        let run = with_backend(&test, "fentry");
        let console = console(&run, 0, "test result: ok. 1 passed; finished in 1.00s");
        assert!(judge(&console, &run).passed);
        assert!(!judge(&console, &test).passed);
    }
}
