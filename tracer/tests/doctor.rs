//! `throttle-tracer doctor --json` on the real host, checked against what the machine says
//! without the tracer: osrelease, the kprobe PMU in sysfs, the cgroup mounts in mountinfo, and
//! the exit code against the backends it found usable. Also `--backend fentry` refused the
//! way doctor says it is, and an unprivileged doctor naming the capabilities it lacks.
use test_support as common;

use std::{fs, path::Path, process::Command};

use common::{CpuHierarchy, Version};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_throttle-tracer");

/// Root's doctor: these tests are about what each privilege allows, and root's answer is the
/// reference the unprivileged ones are judged against (root is what the README's first line
/// says runs every backend).
fn doctor() -> (Value, Option<i32>) {
    doctor_as(&mut Command::new(BIN))
}

/// Root's `doctor --json` on this machine. In a vm-test guest the boot has just run it (its
/// doctor row) and `TT_ROOT_DOCTOR` names that output: under TCG a doctor run, which loads every
/// backend's programs, takes about 20 s.
fn root_doctor() -> Value {
    let Some(path) = std::env::var_os("TT_ROOT_DOCTOR") else {
        return doctor().0;
    };
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}: {text}"))
}

/// `doctor --json` through `command`, which runs BIN (as root or as nobody).
fn doctor_as(command: &mut Command) -> (Value, Option<i32>) {
    let out = command
        .args(["doctor", "--json"])
        .output()
        .expect("run throttle-tracer doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    let v = serde_json::from_str(&stdout).expect("doctor --json prints JSON");
    (v, out.status.code())
}

fn backend<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["backend"] == name))
        .unwrap_or_else(|| panic!("no {name} in {v}"))
}

#[test]
fn doctor_agrees_with_the_machine() {
    let (v, code) = doctor();

    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(v["kernel"], release.trim());
    let machine = Command::new("uname").arg("-m").output().unwrap();
    assert_eq!(v["arch"], String::from_utf8_lossy(&machine.stdout).trim());
    assert!(!v["arch_notes"].as_array().unwrap().is_empty(), "{v}");

    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    assert_eq!(v["btf"]["present"], btf);

    // Without the kprobe PMU no kprobe can attach; with it, doctor must have really tried.
    let kprobe = backend(&v, "kprobe");
    if !Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        assert_eq!(kprobe["usable"], false);
        assert!(
            kprobe["reason"]
                .as_str()
                .is_some_and(|r| r.contains("CONFIG_KPROBES")),
            "{kprobe}"
        );
    }

    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let fstypes: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split_once(" - ")?.1.split(' ').next())
        .collect();
    let v1 = fstypes.contains(&"cgroup");
    let v2 = fstypes.contains(&"cgroup2");
    let mode = match (v1, v2) {
        (true, true) => "hybrid",
        (true, false) => "v1",
        (false, true) => "v2",
        (false, false) => "none",
    };
    assert_eq!(v["cgroups"]["mode"], mode);
    // The cpu controller's hierarchy: the v1 mount with the `cpu` super option, or the v2
    // mount whose cgroup.controllers lists cpu.
    if let Ok(cpu) = CpuHierarchy::find() {
        let version = match cpu.version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        };
        assert_eq!(v["cgroups"]["cpu_controller_version"], version);
        assert_eq!(
            v["cgroups"]["cpu_controller_root"],
            cpu.root.to_str().unwrap()
        );
    }

    let status = fs::read_to_string("/proc/self/status").unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    assert_eq!(v["privileges"]["cap_eff"], cap_eff);

    let usable: Vec<&str> = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["usable"] == true)
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    for b in v["backends"].as_array().unwrap() {
        assert_eq!(b["usable"] == true, b["reason"].is_null(), "{b}");
    }
    assert_eq!(code, Some(if usable.is_empty() { 1 } else { 0 }));
    assert_eq!(v["auto"].as_str(), usable.first().copied());
}

#[test]
fn fentry_refusal_is_one_line_with_the_cause_and_a_hint() {
    let (v, _) = doctor();
    // Whether fentry loads is known only by loading one, which is what doctor does.
    let fact = if backend(&v, "fentry")["usable"] == true {
        Err("fentry works on this kernel; the VM matrix covers tracing with it")
    } else {
        Ok(())
    };
    if !common::applies(fact) {
        return;
    }
    // As root, as doctor() ran: the refusal is the kernel's even to root here.
    let out = Command::new(BIN)
        .args(["--backend", "fentry", "--duration", "1s"])
        .output()
        .expect("run throttle-tracer");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "an error line and a hint line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    // The same reason doctor gives, which on this machine kind is EPERM at load.
    let reason = backend(&v, "fentry")["reason"].as_str().unwrap();
    assert!(lines[0].contains(reason), "{stderr}");
    if reason.contains("EPERM") {
        assert!(
            lines[0].contains("EPERM (Operation not permitted)"),
            "{stderr}"
        );
    }
    assert!(
        lines[1].starts_with("hint: ") && lines[1].contains("--backend"),
        "{stderr}"
    );
}

#[test]
fn unprivileged_doctor_names_the_missing_capabilities() {
    // Nobody, with no capabilities at all: the kernel answers EPERM to the first map the
    // load creates.
    let (v, code) = doctor_as(&mut common::as_nobody(BIN, &[]));
    assert_eq!(v["privileges"]["cap_eff"], "0000000000000000", "{v}");
    assert_eq!(v["privileges"]["can_trace"], false, "{v}");
    assert_eq!(code, Some(1));
    assert!(v["auto"].is_null(), "{v}");
    for b in v["backends"].as_array().unwrap() {
        assert_eq!(b["usable"], false, "{b}");
        let reason = b["reason"].as_str().unwrap();
        // A backend this kernel lacks whatever the privileges (no kprobes: checked before any
        // load) says that instead; no capability would make it usable.
        if reason.contains("not available on this kernel") {
            continue;
        }
        for needed in [
            "root",
            "CAP_BPF",
            "CAP_PERFMON",
            "EPERM (Operation not permitted)",
        ] {
            assert!(reason.contains(needed), "{needed} in {b}");
        }
        assert!(
            b["hint"].as_str().is_some_and(|h| h.contains("sudo")),
            "{b}"
        );
    }
}

/// CAP_BPF + CAP_PERFMON (bits 39 and 38) as nobody, what deploy/daemonset.yaml grants: such a
/// process reads /proc/kallsyms as zeros, and yet every backend root can use is usable (the
/// tracepoint backend needs no kernel symbol address, so no CAP_SYSLOG), but kprobe where the
/// kernel refuses its perf event to them, and `auto` picks the first of those.
#[test]
fn bpf_and_perfmon_alone_use_every_backend_root_can() {
    // SAFETY: no preconditions.
    let root_here = if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err("not root: cannot grant capabilities")
    };
    if common::require(root_here).is_none() {
        return;
    }
    // Such a process sees no kernel symbol address.
    let out = common::with_bpf_perfmon_only("/bin/cat")
        .arg("/proc/kallsyms")
        .output()
        .expect("run cat");
    let kallsyms = String::from_utf8_lossy(&out.stdout);
    let period_timer = kallsyms
        .lines()
        .find(|l| l.ends_with(" sched_cfs_period_timer"))
        .expect("sched_cfs_period_timer in /proc/kallsyms");
    let hidden = if period_timer.starts_with("0000000000000000 ") {
        Ok(())
    } else {
        Err(format!(
            "kernel.kptr_restrict shows addresses to such a process: {period_timer}"
        ))
    };
    common::applies(hidden);

    let root = root_doctor();
    let (v, code) = doctor_as(&mut common::with_bpf_perfmon_only(BIN));
    assert_eq!(v["privileges"]["cap_eff"], "000000c000000000", "{v}");
    assert_eq!(v["privileges"]["can_trace"], true, "{v}");
    // Root's usable backends, in auto's order, less those the kernel refuses to the two.
    let mut theirs = Vec::new();
    for b in root["backends"].as_array().unwrap() {
        let name = b["backend"].as_str().unwrap();
        let alone = backend(&v, name);
        println!(
            "{name}: as root {}, with the two alone {alone}",
            b["usable"]
        );
        // Found on 7.2 (VM guest): the kernel refuses a kprobe's perf event to the two
        // alone, which root's doctor opens. fentry and the tracepoint backend need no perf
        // event, and auto takes one of them.
        let refused_perf_event = name == "kprobe"
            && alone["reason"]
                .as_str()
                .is_some_and(|r| r.contains("`perf_event_open` failed"));
        if !refused_perf_event {
            assert_eq!(alone["usable"], b["usable"], "{name}: {v}");
        }
        if b["usable"] == true && !refused_perf_event {
            theirs.push(name);
        }
    }
    // Where root's auto is kprobe (arm64 before 6.4 attaches no fentry) and the kernel refuses
    // it to the two, auto goes on to the next that root can use.
    assert_eq!(v["auto"].as_str(), theirs.first().copied(), "{v}");
    if root["auto"].is_string() {
        assert_eq!(code, Some(0));
    }
    let fact = if backend(&root, "tracepoint")["usable"] == true {
        Ok(())
    } else {
        Err("the tracepoint backend does not work here even as root")
    };
    if common::applies(fact) {
        assert_eq!(backend(&v, "tracepoint")["usable"], true, "{v}");
    }
}
