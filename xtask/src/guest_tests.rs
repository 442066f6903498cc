//! The host tests (tracer/tests) inside the VM guests, on their cgroup v2 cpu controller, which
//! this host cannot mount (its v1 hierarchy holds the controller): the one judge of what a
//! kernel does. Which tests run there and why the others do not, which of them judge a kernel
//! fact (run with each backend of each kernel's matrix), the guest's calls, and what each
//! test's run says.
use crate::arch::Arch;
use crate::cmd;
use crate::console::Console;
use crate::kernels::{self, BACKENDS, Matrix};
use anyhow::{Result, bail};
use std::path::PathBuf;

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
                 per-period demand it reads is checked against the workload's clocks and the \
                 group's usage counter by burst.rs on every guest kernel and backend (10 s a \
                 boot)",
            ),
            (
                "random_arrivals_are_measured_and_the_advised_quota_stops_them_in_at_most_1_percent_of_periods",
                "a statistical check over a hundred periods (24 s under TCG), of the same \
                 advice arithmetic; the demand it is built on is burst.rs's on every guest \
                 kernel and backend, and the advised quota, burst and period are applied here \
                 by a_spiky_burn_is_measured_and_the_advice_stops_it_no_more",
            ),
        ]),
    ),
    ("ancestor", Plan::Run(&[])),
    ("burst", Plan::Run(&[])),
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
                 doctor row, the kernel facts with fentry), so it would only say \"not \
                 applicable\"",
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
             demand it exports is burst.rs's and the advise tests' in the guests",
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
        "pair",
        Plan::HostOnly(
            "the workload's own check that its `pair` mode names its threads as /proc does: \
             the same userspace on every kernel, and the guest tests that use it check it too",
        ),
    ),
    (
        "prometheus",
        Plan::HostOnly(
            "needs a Prometheus server, promtool and Alertmanager, which the initramfs does \
             not hold; the exporter renders what every guest test's tracing records",
        ),
    ),
    ("offline", Plan::Run(&[])),
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

/// The tests every kernel's guest runs once, not only the one that runs the host tests (kernels.rs
/// `host_tests`), whatever the backends: deploy/daemonset.yaml's two capabilities must trace
/// with every backend root can use, and which backends a kernel lets them use is the kernel's
/// (Debian's 5.10, 6.1, 6.12 and 7.2 refuse the kprobe backend's perf events to them; 5.10
/// charges maps to RLIMIT_MEMLOCK); the test tries each backend itself.
const EVERY_KERNEL: &[&str] = &["doctor::bpf_and_perfmon_alone_use_every_backend_root_can"];

/// The kernel facts: what a backend must see of the kernel's bandwidth control, judged against
/// cpu.stat, cpu.stat.local, the workload's own clocks and quota arithmetic. Every guest runs
/// each of them with every backend of its kernel (kernels.rs `backends`): the hooks, the
/// offsets and the end reasons are each backend's own code on each kernel.
pub const KERNEL_FACTS: &[&str] = &[
    // One busy thread: a stop of period − quota each period, the thread held, group stops.
    "host_tracepoint::one_thread_stops_last_the_rest_of_the_period",
    // A busy thread on each CPU: Σ kernel time = cpu.stat, stops per period, wall < per-CPU.
    "host_tracepoint::kernel_accounted_time_matches_cpu_stat",
    // Spiky rounds at burst 0, 25 and 50 ms: quota + burst the ceiling, stopped time within
    // each round's wait, demand = the round's clock and the counter, burst spent = cpu.stat.
    "burst::quota_plus_burst_is_the_most_a_period_runs",
    // The quota on a parent: every stop credits the children queued, = cpu.stat.local.
    "ancestor::every_parent_stop_credits_both_children",
    // The threads each stop held, listed (at most 8) and counted.
    "threads::a_stop_holding_twelve_threads_lists_eight_and_counts_the_rest",
    // A CPU taken offline and back while stopped.
    "offline::a_stop_open_when_its_cpu_goes_offline_ends_with_it_and_the_cpu_is_traced_after",
];

/// The fault tests (issue 10) that the guests also run with the other backends than the host
/// tests' kprobe, each backend on the kernel whose `fault_backends` (kernels.rs) names it: what
/// a quota write, a cgroup's removal and a start in the middle of an incident end or count is
/// each backend's own code. One kernel per backend: each run is a tracer start more.
const FAULTS: &[&str] = &[
    "host_tracepoint::a_quota_written_while_stopped_ends_the_stop_as_a_quota_change",
    "host_tracepoint::started_in_the_middle_of_an_incident_the_cross_check_is_exact",
    "removed::a_cgroup_removed_while_stopped_keeps_its_summary_marked_gone_and_new_ones_are_their_own",
];

/// The only test binaries `arch`'s guests need, when they are cross-built for guests that run
/// the kernel facts only (kernels.rs `facts_only`): those of [`EVERY_KERNEL`] and
/// [`KERNEL_FACTS`], and `pair`, the workload's own test, whose compile makes cargo build the
/// workload beside them. `None`: every test binary.
pub fn guest_binaries(arch: Arch) -> Option<Vec<&'static str>> {
    (arch != Arch::HOST && kernels::facts_only(arch)).then(facts_binaries)
}

fn facts_binaries() -> Vec<&'static str> {
    let mut names: Vec<&str> = EVERY_KERNEL
        .iter()
        .chain(KERNEL_FACTS)
        .filter_map(|t| t.split_once("::").map(|(binary, _)| binary))
        .chain(["pair"])
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The tests the guest runs, and the ones it does not with why.
#[derive(Default)]
pub struct Selection {
    /// `binary::test` that every kernel's guest runs once ([`EVERY_KERNEL`]).
    pub every_kernel: Vec<String>,
    /// The [`KERNEL_FACTS`], run with each backend of each kernel.
    pub facts: Vec<String>,
    /// The rest, in the order the guest runs them, where the kernel runs the host tests (with
    /// [`HOST_TESTS_BACKEND`]).
    pub rest: Vec<String>,
    /// Those of `rest` that kernels with `fault_backends` run again with each of them
    /// ([`FAULTS`]).
    pub faults: Vec<String>,
    /// `binary::test: why`, or `binary: why` for a whole binary.
    pub not_run: Vec<String>,
}

/// Which tests of `tests` (name, file: the binaries cargo built for `arch`) the guest runs, from
/// each binary's own list of its tests. A binary or an excluded test [`PLANS`] does not know (or
/// knows but cargo did not build) is an error: the plan must follow the tests.
pub fn select(tests: &[(String, PathBuf)], arch: Arch) -> Result<Selection> {
    let mut selection = Selection::default();
    let mut run = Vec::new();
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
        let list = cmd::stdout(arch.command(file).args(["--list", "--format", "terse"]))?;
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
        run.extend(
            names
                .iter()
                .filter(|t| !except.iter().any(|(e, _)| e == *t))
                .map(|t| format!("{name}::{t}")),
        );
    }
    let built_only = guest_binaries(arch);
    for (name, _) in PLANS {
        if built_only.as_ref().is_none_or(|b| b.contains(name))
            && !tests.iter().any(|(n, _)| n == name)
        {
            bail!(
                "xtask/src/guest_tests.rs plans for tracer/tests/{name}.rs, which cargo did not build"
            );
        }
    }
    let listed = |list: &[&str], what: &str| -> Result<Vec<String>> {
        list.iter()
            .map(|test| {
                if run.iter().any(|t| t == test) {
                    Ok((*test).to_owned())
                } else {
                    bail!("xtask/src/guest_tests.rs runs {test} {what}, but not in the guests")
                }
            })
            .collect()
    };
    selection.every_kernel = listed(EVERY_KERNEL, "on every kernel")?;
    selection.facts = listed(KERNEL_FACTS, "with every backend")?;
    // Guests of facts only run no fault test, and their cross-build has none of its binaries.
    selection.faults = if built_only.is_some() {
        Vec::new()
    } else {
        listed(FAULTS, "with other backends")?
    };
    selection.rest = run
        .into_iter()
        .filter(|t| !selection.every_kernel.contains(t) && !selection.facts.contains(t))
        .collect();
    Ok(selection)
}

impl Selection {
    /// Keeps only the tests whose `binary::test` starts with one of `prefixes`.
    pub fn retain(&mut self, prefixes: &[String]) {
        let wanted = |t: &String| prefixes.iter().any(|p| t.starts_with(p.as_str()));
        self.every_kernel.retain(wanted);
        self.facts.retain(wanted);
        self.rest.retain(wanted);
        self.faults.retain(wanted);
    }

    pub fn is_empty(&self) -> bool {
        self.every_kernel.is_empty() && self.facts.is_empty() && self.rest.is_empty()
    }

    /// What a guest of a kernel of `matrix` (its architecture's) runs: the runs to judge, by
    /// name ([`with_backend`]), and the kernel command-line words that make its guest run them
    /// ([`Selection::guest_calls`]): the facts with `backends`, the rest where it runs the host
    /// tests, the faults with its `fault_backends`.
    pub fn for_kernel(&self, matrix: &Matrix, backends: &[&str]) -> (Vec<String>, Vec<String>) {
        let mut parts: Vec<(&[String], Option<&str>, String)> = backends
            .iter()
            .map(|b| (&self.facts[..], Some(*b), flag("facts", b)))
            .collect();
        if matrix.host_tests {
            parts.push((&self.rest, None, CMDLINE_FLAG.to_owned()));
        }
        parts.extend(
            matrix
                .fault_backends
                .iter()
                .map(|b| (&self.faults[..], Some(*b), flag("faults", b))),
        );
        let mut runs = self.every_kernel.clone();
        let mut flags = Vec::new();
        for (tests, backend, word) in parts.into_iter().filter(|(t, _, _)| !t.is_empty()) {
            runs.extend(tests.iter().map(|t| match backend {
                Some(b) => with_backend(t, b),
                None => t.clone(),
            }));
            flags.push(word);
        }
        (runs, flags)
    }

    /// The guest's calls (guest/vm-test.sh `host_test BINARY TEST [BACKEND]`): those of every
    /// kernel, then each flagged part where the kernel's command line has its word: the facts
    /// with each backend, the rest, the faults with each other backend.
    pub fn guest_calls(&self) -> String {
        let call = |t: &String, backend: Option<&str>| {
            let (binary, test) = t.split_once("::").expect("binary::test");
            format!("host_test {binary} {test} {}", backend.unwrap_or(""))
                .trim_end()
                .to_owned()
        };
        let block = |word: String, tests: &[String], backend: Option<&str>| {
            let calls: Vec<String> = tests
                .iter()
                .map(|t| format!("    {}", call(t, backend)))
                .collect();
            format!(
                "if grep -qw {word} /proc/cmdline; then\n{}\n    :\nfi",
                calls.join("\n")
            )
        };
        let mut parts: Vec<String> = self.every_kernel.iter().map(|t| call(t, None)).collect();
        parts.extend(
            BACKENDS
                .iter()
                .map(|b| block(flag("facts", b), &self.facts, Some(b))),
        );
        parts.push(block(CMDLINE_FLAG.to_owned(), &self.rest, None));
        parts.extend(
            BACKENDS
                .iter()
                .filter(|b| **b != HOST_TESTS_BACKEND)
                .map(|b| block(flag("faults", b), &self.faults, Some(b))),
        );
        parts.join("\n")
    }
}

/// The name of `test`'s run with `backend`: `binary::test@backend`, its table row and its
/// markers on the console.
pub fn with_backend(test: &str, backend: &str) -> String {
    format!("{test}@{backend}")
}

/// The kernel command-line word that makes the guest run the `part` (facts, faults) with
/// `backend`.
fn flag(part: &str, backend: &str) -> String {
    format!("tt.{part}_{backend}")
}

/// The backend the rest of the host tests trace with in the guests (guest/vm-test.sh
/// `host_test`).
pub const HOST_TESTS_BACKEND: &str = "kprobe";

/// The kernel command-line word that makes the guest run the rest of the host tests.
const CMDLINE_FLAG: &str = "tt.host_tests";

/// How a test's output line starts that the table shows beside its verdict (a kernel fact's
/// measure against its truth).
const FIGURE: &str = "figure: ";

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
    // The test's own account of what it measured against which truth.
    for figure in output.iter().filter_map(|l| l.strip_prefix(FIGURE)) {
        figures += &format!("; {figure}");
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
    fn each_part_runs_under_its_flag_and_each_backend_run_is_named_apart() {
        let selection = Selection {
            every_kernel: vec!["doctor::d".to_owned()],
            facts: vec!["host_tracepoint::f".to_owned()],
            rest: vec!["removed::r".to_owned()],
            faults: vec!["removed::r".to_owned()],
            not_run: Vec::new(),
        };
        let calls = selection.guest_calls();
        assert!(calls.starts_with("host_test doctor d\n"), "{calls}");
        for backend in BACKENDS {
            let block = format!(
                "if grep -qw tt.facts_{backend} /proc/cmdline; then\n    host_test \
                 host_tracepoint f {backend}\n    :\nfi"
            );
            assert!(calls.contains(&block), "{calls}");
        }
        assert!(calls.contains("tt.host_tests /proc/cmdline; then\n    host_test removed r\n"));
        assert!(
            calls.contains("tt.faults_fentry /proc/cmdline; then\n    host_test removed r fentry")
        );
        assert!(!calls.contains("tt.faults_kprobe"), "{calls}");
        let matrix = crate::kernels::KERNELS[0].matrix(Arch::X86_64);
        let (runs, flags) = selection.for_kernel(matrix, &["fentry"]);
        assert_eq!(runs[..2], ["doctor::d", "host_tracepoint::f@fentry"]);
        assert_eq!(flags[0], "tt.facts_fentry");
        // The runs' markers are apart: the fentry run's is not the plain one's.
        let run = with_backend("removed::r", "fentry");
        let console = console(&run, 0, "test result: ok. 1 passed; finished in 1.00s");
        assert!(judge(&console, &run).passed);
        assert!(!judge(&console, "removed::r").passed);
    }

    #[test]
    fn figures_the_test_printed_go_in_its_row() {
        let output = "figure: Σ kernel 12.0 ms vs cpu.stat 12.0 ms\n\
                      test result: ok. 1 passed; 0 failed; finished in 2.00s";
        let outcome = judge(&console("x::t", 0, output), "x::t");
        assert_eq!(
            outcome.figures,
            "2.00s; Σ kernel 12.0 ms vs cpu.stat 12.0 ms"
        );
    }
}
