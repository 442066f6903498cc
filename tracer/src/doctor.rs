//! `throttle-tracer doctor`: one screen on what this machine allows. Kernel release and
//! architecture (with what tracing does differently on it), BTF and
//! the probe features it resolves, the cgroup mode and the cpu controller's hierarchy, the
//! capabilities, and every backend tried for real: the tracer's own programs are loaded and
//! attached exactly as tracing would, then detached. Nothing is guessed from kernel config.
use std::{fmt::Write as _, path::Path};

use serde::Serialize;
use tracer_common::Offsets;

use crate::{
    btf::{self, Feature, ThrottleReturn},
    cgroups::{self, Hierarchy, Version},
    error::{Exit, Failure},
    privileges::Capabilities,
    probes::{self, Backend},
    sys::{kernel_release, machine},
};

const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// Every optional probe feature, in the order the report lists them.
const FEATURES: [Feature; 14] = [
    Feature::KernelDuration,
    Feature::TaskCount,
    Feature::Bandwidth,
    Feature::Burst,
    Feature::RunningTask,
    Feature::Tracepoint,
    Feature::SelfTime,
    Feature::AsyncUnthrottle,
    Feature::ParkedTasks,
    Feature::StoppedChildren,
    Feature::Demand,
    Feature::BurstSpent,
    Feature::HeldThreads,
    Feature::QueuedThreads,
];

#[derive(Serialize)]
struct Diagnosis {
    kernel: String,
    /// The kernel's machine, as `uname -m` names it.
    arch: String,
    /// What tracing does differently on this architecture, one sentence each.
    arch_notes: &'static [&'static str],
    btf: BtfCheck,
    cgroups: CgroupCheck,
    privileges: Privileges,
    /// In `--backend auto`'s order.
    backends: Vec<BackendCheck>,
    /// What `--backend auto` would trace with; `null` when no backend works.
    auto: Option<&'static str>,
}

#[derive(Serialize)]
struct BtfCheck {
    path: &'static str,
    present: bool,
    /// Why the offsets could not be resolved; `null` when they were.
    error: Option<String>,
    /// `bool`, `void`, `not in BTF`, or what else BTF says `throttle_cfs_rq` returns.
    throttle_return: Option<String>,
    features: Vec<FeatureCheck>,
}

#[derive(Serialize)]
struct FeatureCheck {
    feature: String,
    resolved: bool,
    /// False when this kernel has no such fields (a feature of other kernel versions).
    in_kernel: bool,
    /// Why it is off; `null` when resolved.
    reason: Option<String>,
}

#[derive(Serialize)]
struct CgroupCheck {
    /// `v1`, `v2`, `hybrid` or `none`.
    mode: Option<&'static str>,
    /// `v1` or `v2`: the version of the hierarchy the cpu controller is bound to.
    cpu_controller_version: Option<&'static str>,
    cpu_controller_root: Option<String>,
    error: Option<String>,
}

#[derive(Serialize)]
struct Privileges {
    /// `CapEff` from /proc/self/status, hex as there.
    cap_eff: String,
    cap_sys_admin: bool,
    cap_bpf: bool,
    cap_perfmon: bool,
    /// Whether the capabilities are the initial user namespace's, where the kernel checks them.
    initial_user_namespace: bool,
    /// CAP_SYS_ADMIN, or CAP_BPF and CAP_PERFMON, in the initial user namespace.
    can_trace: bool,
}

#[derive(Serialize)]
struct BackendCheck {
    backend: &'static str,
    usable: bool,
    /// Why it is not usable; `null` when it is.
    reason: Option<String>,
    hint: Option<String>,
}

/// Runs every check and prints the diagnosis; exit status 1 when no backend works.
pub fn run(json: bool) -> Result<(), Exit> {
    let diagnosis = diagnose();
    if json {
        let line = serde_json::to_string(&diagnosis).map_err(|e| {
            Failure::environment_without_hint(format!("cannot encode the diagnosis: {e}"))
        })?;
        println!("{line}");
    } else {
        print!("{}", render(&diagnosis));
    }
    match diagnosis.auto {
        Some(_) => Ok(()),
        None => Err(Exit::Status(1)),
    }
}

fn diagnose() -> Diagnosis {
    let resolved = btf::resolve(Path::new(BTF_PATH));
    let btf = match &resolved {
        Ok(r) => BtfCheck {
            path: BTF_PATH,
            present: true,
            error: None,
            throttle_return: Some(match &r.throttle_return {
                ThrottleReturn::Bool => "bool".to_owned(),
                ThrottleReturn::Void => "void".to_owned(),
                ThrottleReturn::NotInBtf => "not in BTF".to_owned(),
                ThrottleReturn::Unexpected(what) => what.clone(),
            }),
            features: FEATURES
                .iter()
                .map(|&feature| {
                    let off = r.disabled.iter().find(|d| d.feature == feature);
                    FeatureCheck {
                        feature: feature.to_string(),
                        resolved: off.is_none(),
                        in_kernel: feature.in_kernel(&r.offsets),
                        reason: off.map(|d| d.reason.clone()),
                    }
                })
                .collect(),
        },
        Err(e) => BtfCheck {
            path: BTF_PATH,
            present: Path::new(BTF_PATH).exists(),
            error: Some(e.to_string()),
            throttle_return: None,
            features: Vec::new(),
        },
    };
    // The programs load the same with every offset absent; they would only record nothing.
    let offsets = resolved.map_or(Offsets::ABSENT, |r| r.offsets);

    let caps = Capabilities::of_self();
    let kernel_btf = probes::KernelBtf::parse(Path::new(BTF_PATH));
    let results: Vec<(Backend, Result<(), Failure>)> = Backend::AUTO_ORDER
        .iter()
        .map(|&b| {
            (
                b,
                probes::try_backend(
                    b,
                    &kernel_btf,
                    &offsets,
                    &[],
                    crate::cli::RING_BUFFER_DEFAULT,
                )
                .map(drop),
            )
        })
        .collect();
    // auto's rule: the first of AUTO_ORDER that works.
    let auto = results
        .iter()
        .find(|(_, r)| r.is_ok())
        .map(|(b, _)| b.name());
    let backends = results
        .into_iter()
        .map(|(backend, result)| {
            let (reason, hint) = match result {
                Ok(()) => (None, None),
                Err(Failure::Usage { message, hint } | Failure::Environment { message, hint }) => {
                    (Some(message), hint)
                }
            };
            BackendCheck {
                backend: backend.name(),
                usable: reason.is_none(),
                reason,
                hint,
            }
        })
        .collect();

    let arch = machine();
    Diagnosis {
        kernel: kernel_release(),
        arch_notes: arch_notes(&arch),
        arch,
        btf,
        cgroups: cgroup_check(),
        privileges: Privileges {
            cap_eff: format!("{:016x}", caps.effective),
            cap_sys_admin: caps.sys_admin(),
            cap_bpf: caps.bpf(),
            cap_perfmon: caps.perfmon(),
            initial_user_namespace: caps.initial_user_ns,
            can_trace: caps.can_trace(),
        },
        backends,
        auto,
    }
}

/// The kprobe backend reads the function's argument and return value from the registers of
/// the architecture its eBPF object was built for (aya's `pt_regs` accessors), and fentry
/// needs the kernel to attach BPF trampolines to kernel functions, which each architecture
/// gained in its own release.
fn arch_notes(machine: &str) -> &'static [&'static str] {
    match machine {
        "x86_64" => &[
            "kprobe reads the cfs_rq argument from rdi and return values from rax",
            "fentry: BPF trampolines on kernel functions since 5.5",
        ],
        "aarch64" => &[
            "kprobe reads the cfs_rq argument and return values from x0 (pt_regs regs[0])",
            "fentry: BPF trampolines on kernel functions only from 6.4, through ftrace direct \
             calls (CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS); older arm64 kernels refuse the \
             attach",
        ],
        _ => &["not an architecture throttle-tracer is built and tested for (x86_64, aarch64)"],
    }
}

fn cgroup_check() -> CgroupCheck {
    let mut errors = Vec::new();
    let mode = cgroups::mode()
        .map_err(|e| errors.push(e.to_string()))
        .ok()
        .map(cgroups::Mode::name);
    let (version, root) = match Hierarchy::discover() {
        Ok(h) => (
            Some(match h.version() {
                Version::V1 => "v1",
                Version::V2 => "v2",
            }),
            Some(h.root().display().to_string()),
        ),
        Err(e) => {
            errors.push(e.to_string());
            (None, None)
        }
    };
    CgroupCheck {
        mode,
        cpu_controller_version: version,
        cpu_controller_root: root,
        error: (!errors.is_empty()).then(|| errors.join("; ")),
    }
}

fn render(d: &Diagnosis) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut out = String::new();
    let _ = writeln!(out, "throttle-tracer doctor");
    let _ = writeln!(out, "kernel      {}", d.kernel);
    let _ = writeln!(out, "arch        {}", d.arch);
    for note in d.arch_notes {
        let _ = writeln!(out, "  {note}");
    }
    match &d.btf.error {
        None => {
            let _ = writeln!(
                out,
                "BTF         {}: offsets resolved; throttle_cfs_rq returns {}",
                d.btf.path,
                d.btf.throttle_return.as_deref().unwrap_or("?")
            );
            for f in &d.btf.features {
                let _ = match &f.reason {
                    None if !f.in_kernel => {
                        writeln!(out, "  {:<42}not in this kernel", f.feature)
                    }
                    None => writeln!(out, "  {:<42}on", f.feature),
                    Some(reason) => writeln!(out, "  {:<42}off: {reason}", f.feature),
                };
            }
        }
        Some(e) => {
            let _ = writeln!(
                out,
                "BTF         {}: {}; {e}",
                d.btf.path,
                if d.btf.present { "present" } else { "missing" }
            );
        }
    }
    let c = &d.cgroups;
    let _ = writeln!(
        out,
        "cgroups     {}; cpu controller: {}{}",
        c.mode.unwrap_or("unknown"),
        match (c.cpu_controller_version, &c.cpu_controller_root) {
            (Some(v), Some(root)) => format!("cgroup {v} at {root}"),
            _ => "not found".to_owned(),
        },
        c.error
            .as_ref()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    );
    let p = &d.privileges;
    let _ = writeln!(
        out,
        "privileges  CapEff {}: CAP_SYS_ADMIN {}, CAP_BPF {}, CAP_PERFMON {}; {}",
        p.cap_eff,
        yes(p.cap_sys_admin),
        yes(p.cap_bpf),
        yes(p.cap_perfmon),
        if p.can_trace {
            "enough to trace"
        } else if !p.initial_user_namespace {
            "not enough to trace: a user namespace of its own, where capabilities do not count \
             for eBPF"
        } else {
            "not enough to trace (needs CAP_SYS_ADMIN, or CAP_BPF and CAP_PERFMON)"
        }
    );
    let _ = writeln!(out, "backends    (each attached for real, then detached)");
    for b in &d.backends {
        match &b.reason {
            None => {
                let _ = writeln!(out, "  {:<12}usable", b.backend);
            }
            Some(reason) => {
                let _ = writeln!(out, "  {:<12}not usable: {reason}", b.backend);
            }
        }
    }
    let _ = match d.auto {
        Some(b) => writeln!(out, "auto        would trace with {b}"),
        None => writeln!(out, "auto        no backend works on this machine"),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_feature_is_listed() {
        for f in FEATURES {
            // A new Feature fails to compile here until it is added to FEATURES.
            match f {
                Feature::KernelDuration
                | Feature::TaskCount
                | Feature::Bandwidth
                | Feature::Burst
                | Feature::RunningTask
                | Feature::Tracepoint
                | Feature::SelfTime
                | Feature::AsyncUnthrottle
                | Feature::ParkedTasks
                | Feature::StoppedChildren
                | Feature::Demand
                | Feature::BurstSpent
                | Feature::HeldThreads
                | Feature::QueuedThreads => {}
            }
        }
    }

    #[test]
    fn every_architecture_built_for_has_notes() {
        for machine in ["x86_64", "aarch64"] {
            let notes = arch_notes(machine);
            assert!(
                notes.iter().any(|n| n.starts_with("kprobe reads")),
                "{machine}"
            );
            assert!(notes.iter().any(|n| n.starts_with("fentry:")), "{machine}");
        }
        assert!(arch_notes("riscv64")[0].contains("not an architecture"));
    }

    #[test]
    fn render_says_why_each_backend_is_not_usable() {
        let d = Diagnosis {
            kernel: "6.18.44".into(),
            arch: "aarch64".into(),
            arch_notes: arch_notes("aarch64"),
            btf: BtfCheck {
                path: BTF_PATH,
                present: true,
                error: None,
                throttle_return: Some("bool".into()),
                features: vec![FeatureCheck {
                    feature: "burst".into(),
                    resolved: false,
                    in_kernel: true,
                    reason: Some("struct cfs_bandwidth has no burst".into()),
                }],
            },
            cgroups: CgroupCheck {
                mode: Some("hybrid"),
                cpu_controller_version: Some("v1"),
                cpu_controller_root: Some("/sys/fs/cgroup/cpu".into()),
                error: None,
            },
            privileges: Privileges {
                cap_eff: "000001ffffffffff".into(),
                cap_sys_admin: true,
                cap_bpf: true,
                cap_perfmon: true,
                initial_user_namespace: true,
                can_trace: true,
            },
            backends: vec![
                BackendCheck {
                    backend: "fentry",
                    usable: false,
                    reason: Some("EPERM".into()),
                    hint: Some("h".into()),
                },
                BackendCheck {
                    backend: "tracepoint",
                    usable: true,
                    reason: None,
                    hint: None,
                },
            ],
            auto: Some("tracepoint"),
        };
        let text = render(&d);
        for needle in [
            "kernel      6.18.44",
            "arch        aarch64\n  kprobe reads the cfs_rq argument and return values from x0",
            "fentry: BPF trampolines on kernel functions only from 6.4",
            "burst                                     off: struct cfs_bandwidth has no burst",
            "cgroups     hybrid; cpu controller: cgroup v1 at /sys/fs/cgroup/cpu",
            "CAP_BPF yes",
            "fentry      not usable: EPERM",
            "tracepoint  usable",
            "auto        would trace with tracepoint",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
        }
    }
}
