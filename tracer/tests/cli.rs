//! The binary's answers to bad input and to machines that cannot trace: one `error:` line, one
//! `hint:` line, the documented exit code, no panic. Run on the real host (no kprobes here).
mod common;

use std::{
    path::Path,
    process::{Command, Output},
};

const BIN: &str = env!("CARGO_BIN_EXE_throttle-tracer");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
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
    let dir = tempfile::tempdir().unwrap();
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
        let closed = Command::new(BIN)
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
            &format!("umount -l {root} && exec {BIN} --duration 1s"),
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
                 test ! -e /sys/fs/bpf/x && exec {BIN} --json --duration 1s --cgroup /"
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
