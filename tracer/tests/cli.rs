//! The binary's answers to bad input and to machines that cannot trace: one `error:` line, one
//! `hint:` line, the documented exit code, no panic. Run on the real host (no kprobes here).
use test_support as common;

use std::{
    path::Path,
    process::{Command, Output},
};

const BIN: &str = env!("CARGO_BIN_EXE_throttle-tracer");

fn run(args: &[&str]) -> Output {
    common::tracer::command()
        .args(args)
        .output()
        .expect("run throttle-tracer")
}

fn assert_failure(out: &Output, code: i32, error: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("error: ") && l.contains(error)),
        "first line should be the error naming {error:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout before tracing starts"
    );
}

fn assert_hint(out: &Output, hint: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("hint: ") && l.contains(hint)),
        "second line should be a hint mentioning {hint:?}: {stderr}"
    );
}

#[test]
fn bad_duration_is_a_usage_error() {
    let out = run(&["--duration", "soon"]);
    assert_failure(&out, 2, "--duration");
}

#[test]
fn unknown_cgroup_is_a_usage_error() {
    let out = run(&["--cgroup", "/no/such/cgroup-here"]);
    assert_failure(&out, 2, "/no/such/cgroup-here");
    assert_hint(&out, "--cgroup");
}

#[test]
fn malformed_glob_is_a_usage_error_naming_it() {
    let out = run(&["--cgroup", "/demo-[12", "--duration", "1s"]);
    assert_failure(&out, 2, "\"/demo-[12\" is not a valid glob");
    assert_hint(&out, "[abc]");
}

#[test]
fn missing_btf_is_an_environment_error() {
    let out = run(&["--btf", "/nonexistent/vmlinux"]);
    assert_failure(&out, 1, "BTF");
    assert_hint(&out, "CONFIG_DEBUG_INFO_BTF");
}

#[test]
fn unprivileged_user_is_told_what_is_missing() {
    // Nobody, with no capabilities at all.
    let out = common::as_nobody(BIN, &[])
        .output()
        .expect("run the tracer as nobody");
    assert_failure(&out, 1, "CAP_BPF");
    assert_hint(&out, "sudo");
}

/// Root of a user namespace of its own (`unshare --user --map-root-user`, as rootless
/// containers run) has every capability there, which the kernel does not count for eBPF: the
/// tracer says so before it loads anything, not "needs root" to a process that is root.
#[test]
fn a_user_namespace_of_its_own_is_named_as_the_cause() {
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", BIN])
        .output();
    let Some(out) = common::require(out.map_err(|e| format!("no unshare (util-linux): {e}")))
    else {
        return;
    };
    assert_failure(&out, 1, "user namespace of its own");
    assert_hint(&out, "host's user namespace");
    // The truth the tracer's reading is judged against: that namespace maps one uid, and its
    // root has a full CapEff there.
    let probe = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "cat",
            "/proc/self/uid_map",
            "/proc/self/status",
        ])
        .output()
        .expect("unshare cat");
    let text = String::from_utf8_lossy(&probe.stdout);
    let map: Vec<&str> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!((map[0], map[2]), ("0", "1"), "{text}");
    let cap_eff = text
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(str::trim);
    assert_ne!(cap_eff, Some("0000000000000000"), "{text}");
}

#[test]
fn kernel_without_kprobes_is_refused_with_a_way_out() {
    // Only a kernel without CONFIG_KPROBES has no kprobe PMU (this host kind: see doctor.rs).
    let kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists();
    let fact = if kprobes {
        Err("this kernel has kprobes; the VM matrix covers tracing on it")
    } else {
        Ok(())
    };
    if !common::applies(fact) {
        return;
    }
    let out = run(&["--backend", "kprobe", "--duration", "1s"]);
    assert_failure(&out, 1, "kprobes are not available");
    assert_hint(&out, "CONFIG_KPROBES");
}

#[test]
fn a_scan_interval_of_nothing_is_a_usage_error() {
    let out = run(&["scan", "--interval", "0s"]);
    assert_failure(&out, 2, "--interval");
}

#[test]
fn advise_refuses_a_bad_or_empty_duration_and_an_unknown_cgroup() {
    for duration in ["soon", "0s"] {
        let out = run(&["advise", "--duration", duration]);
        assert_failure(&out, 2, "--duration");
    }
    let out = run(&[
        "advise",
        "--duration",
        "1s",
        "--cgroup",
        "/no/such/cgroup-here",
    ]);
    assert_failure(&out, 2, "/no/such/cgroup-here");
    assert_hint(&out, "--cgroup");
    let out = run(&["advise", "--interval", "1s"]);
    assert_failure(&out, 2, "--interval");
}

/// Kernel BTF that is not there or not BTF: a directory, a file of another kind, a vmlinux cut
/// short (as a partial copy would be). Each is one error line naming the file, exit 1; with
/// standard error a pipe closed at once (`2>&1 | head -0`) the exit status is still 1, not a
/// panic's 101.
#[test]
fn unusable_btf_files_are_environment_errors() {
    let dir = common::tracer::output_dir();
    let other = dir.path().join("hostname");
    std::fs::write(&other, "not btf\n").unwrap();
    let cut = dir.path().join("vmlinux-cut");
    let vmlinux = std::fs::read("/sys/kernel/btf/vmlinux").unwrap_or_default();
    std::fs::write(&cut, &vmlinux[..vmlinux.len().min(24)]).unwrap();
    for (path, error) in [
        (dir.path(), "cannot read kernel BTF"),
        (other.as_path(), "cannot parse kernel BTF"),
        (cut.as_path(), "cannot parse kernel BTF"),
    ] {
        let out = run(&["--btf", path.to_str().unwrap(), "--duration", "1s"]);
        assert_failure(&out, 1, error);
        assert_hint(&out, "--btf");
        let closed = common::tracer::command()
            .args(["--btf", path.to_str().unwrap(), "--duration", "1s"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                drop(child.stderr.take());
                child.wait()
            })
            .expect("run throttle-tracer");
        assert_eq!(closed.code(), Some(1), "{path:?} with stderr closed");
    }
}

/// A machine whose cpu controller is not mounted (here: a mount namespace with the host's cpu
/// hierarchy unmounted): one error line, exit 1. A read-only /sys/fs/bpf changes nothing: the
/// tracer pins nothing there, so it traces as usual.
#[test]
fn missing_cpu_hierarchy_and_read_only_bpffs() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let root = host.cpu.root.display().to_string();
    let unmounted = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            &format!(
                "umount -l {root} && exec {} --duration 1s",
                common::tracer::shell_command()
            ),
        ])
        .output()
        .expect("run unshare");
    assert_failure(
        &unmounted,
        1,
        "no mounted cgroup hierarchy has the cpu controller",
    );
    assert_hint(&unmounted, "mount cgroup v2");
    let read_only = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            &format!(
                "mount -t bpf -o ro bpf /sys/fs/bpf && touch /sys/fs/bpf/x 2>/dev/null; \
                 test ! -e /sys/fs/bpf/x && exec {} --json --duration 1s --cgroup /",
                common::tracer::shell_command()
            ),
        ])
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&read_only.stdout);
    assert!(
        read_only.status.success(),
        "{}",
        String::from_utf8_lossy(&read_only.stderr)
    );
    assert!(stdout.starts_with(r#"{"type":"start""#), "{stdout}");
    assert!(stdout.contains(r#""type":"end""#), "{stdout}");
}

/// The tracer in a mount namespace of its own where /sys/kernel/btf/vmlinux is hidden, as on a
/// kernel built without CONFIG_DEBUG_INFO_BTF: `Absent` mounts an empty tmpfs over
/// /sys/kernel/btf (no file at all), `Empty(file)` bind-mounts the empty `file` over vmlinux (a
/// file that is no BTF). The rest of the machine is the host's, and the host keeps its file.
#[derive(Clone)]
enum HiddenBtf {
    Absent,
    Empty(std::ffi::CString),
}

impl HiddenBtf {
    fn command(self, bin: &str) -> Command {
        use std::os::unix::process::CommandExt as _;
        let dir = c"/sys/kernel/btf";
        let vmlinux = c"/sys/kernel/btf/vmlinux";
        let mut cmd = Command::new(bin);
        let ok = |r: libc::c_int| {
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        // SAFETY: between fork and exec only system calls, on strings made before the fork.
        unsafe {
            cmd.pre_exec(move || {
                ok(libc::unshare(libc::CLONE_NEWNS))?;
                // Private, or the mounts below would propagate to the host's namespace.
                ok(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                match &self {
                    Self::Absent => ok(libc::mount(
                        c"tmpfs".as_ptr(),
                        dir.as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        std::ptr::null(),
                    )),
                    Self::Empty(file) => ok(libc::mount(
                        file.as_ptr(),
                        vmlinux.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    )),
                }
            });
        }
        cmd
    }
}

/// A kernel without /sys/kernel/btf/vmlinux (the file hidden in the tracer's own mount
/// namespace, absent or empty): without `--btf` the tracer exits 1 with one error line naming
/// the file and a hint naming `--btf`; with `--btf COPY` (the real file copied beforehand) it
/// traces a throttled cgroup whole: the tracepoint backend's tp_btf programs attach by the
/// kernel's own BTF, not by the file, and Σ kernel_ns equals the cpu.stat delta read here.
#[test]
fn a_kernel_without_sysfs_btf_is_named_and_btf_copy_traces() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let dir = common::tracer::output_dir();
    let copy = dir.path().join("vmlinux");
    std::fs::copy("/sys/kernel/btf/vmlinux", &copy).expect("copy the kernel's BTF");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let empty = || HiddenBtf::Empty(std::ffi::CString::new(empty.to_str().unwrap()).unwrap());
    for (what, hidden, error) in [
        ("absent", HiddenBtf::Absent, "kernel BTF is missing"),
        ("empty", empty(), "cannot parse kernel BTF"),
    ] {
        // The truth the tracer's answer is judged against: in such a namespace the file is
        // not there, or holds nothing (`test -s` fails for both).
        let seen = hidden
            .clone()
            .command("test")
            .args(["-s", "/sys/kernel/btf/vmlinux"])
            .status()
            .expect("run test in the namespace");
        assert_eq!(seen.code(), Some(1), "{what}: the file is still readable");
        let out = common::tracer::unprivileged(hidden.command(BIN))
            .args(["--duration", "1s"])
            .output()
            .expect("run the tracer in the namespace");
        assert_failure(&out, 1, error);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr
                .lines()
                .next()
                .is_some_and(|l| l.contains("/sys/kernel/btf/vmlinux")),
            "{what}: the error names the file: {stderr}"
        );
        assert_hint(&out, "--btf");
        println!("{what}: {}", stderr.trim_end());
    }

    let cgroup = common::Cgroup::throttled(&host.cpu, "cli-btf", 50_000, 100_000);
    let tracer = common::tracer::Tracer::start_as(
        common::tracer::unprivileged(HiddenBtf::Absent.command(BIN)),
        &["--btf", copy.to_str().unwrap(), "--cgroup", cgroup.path()],
    );
    let before = cgroup.stat().throttled_ns;
    let workload = common::spawn_in(&mut common::busy(2, 2), &cgroup, None).wait();
    assert!(workload.expect("run throttle-workload").success());
    cgroup.wait_refilled();
    let truth = cgroup.stat().throttled_ns - before;
    let lines = tracer.stop();
    let (traced, stops) = common::tracer::accounted_ns(&lines, cgroup.id());
    println!("--btf copy: {stops} stops, Σ kernel_ns {traced} vs cpu.stat {truth}");
    assert!(truth > 0, "the group was never throttled");
    assert_eq!(traced, truth);
}

#[test]
fn a_closed_standard_error_ends_in_the_exit_status_not_a_panic() {
    for (args, code) in [
        (&["--duration", "soon"][..], 2),
        (&["report", "/no/such/recording.ndjson"][..], 2),
    ] {
        // A pipe whose reader is gone, as under `2>&1 | head -1` once head exits: writes fail
        // with EPIPE (a closed descriptor's EBADF the standard library ignores by itself).
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let status = Command::new(BIN)
            .args(args)
            .stderr(writer)
            .status()
            .expect("run throttle-tracer");
        // A panic would exit 101.
        assert_eq!(status.code(), Some(code), "{args:?}: {status}");
    }
}
