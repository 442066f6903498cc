//! The image `cargo xtask image` built (target/image/throttle-tracer-<version>.tar, a `docker
//! save` archive), run the way deploy/daemonset.yaml runs it, on containerd, the runtime the
//! kubelet talks to: `ctr image import`, then `ctr run` with flags derived from the manifest
//! itself (parsed as YAML), so that the two cannot disagree. The privileges the container got
//! are read from the host's /proc/PID/status and mountinfo (capability sets, seccomp,
//! no_new_privs, read-only mounts), not taken from the flags.
//!
//! With exactly those privileges `doctor` finds the tracepoint backend usable, and the
//! containerised `serve`, scraped by a real Prometheus on loopback while a throttled container
//! (placed as the kubelet's cgroupfs driver places a pod's container) runs beside it, stores
//! that container's own cpu.stat counters.
//!
//! Needs root, kernel BTF, a cpu hierarchy, containerd, Prometheus and the image archive
//! (`cargo xtask image`; `cargo xtask test` builds it first); otherwise it says why it cannot
//! run (a failure under `CI=true`).
use test_support as common;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, SystemTime},
};

use common::containers::{self, Containerd, MAX_SHARES, WORKLOAD_IN_IMAGE};
use common::http::{self, PROMETHEUS, free_port, get, query, sample, wait_ready};
use common::{CpuHierarchy, Host};
use yaml_rust2::{Yaml, YamlLoader};

const TAG: &str = concat!(
    "docker.io/library/throttle-tracer:",
    env!("CARGO_PKG_VERSION")
);
/// Every capability of the kernel (include/uapi/linux/capability.h, 0 to 40): what "drop ALL"
/// means. `ctr --cap-drop` takes names only, and ctr 1.6's default set has 14 of them.
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

fn repo_file(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn archive() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    target.join(format!(
        "image/throttle-tracer-{}.tar",
        env!("CARGO_PKG_VERSION")
    ))
}

/// The host with containerd, Prometheus and the image archive.
fn machine() -> Result<(Host, Containerd), String> {
    let archive = archive();
    if !archive.exists() {
        return Err(format!(
            "no {} (`cargo xtask image` builds it)",
            archive.display()
        ));
    }
    containers::missing(&[PROMETHEUS])?;
    let host = common::host()?;
    let containerd = Containerd::start()?;
    containerd.import(&archive);
    Ok((host, containerd))
}

/// How deploy/daemonset.yaml runs the tracer, as `ctr run` flags and the process's arguments.
struct Pod {
    /// Privileges and mounts: `--cap-drop`/`--cap-add`, `--seccomp`, `--read-only`, `--mount`,
    /// `--memory-limit`.
    flags: Vec<String>,
    /// The capabilities added, as the kernel names them (`CAP_BPF`).
    added: Vec<String>,
    /// The host paths mounted read-only, and where.
    mounts: Vec<(String, String)>,
    /// The image's entrypoint and the manifest's args.
    args: Vec<String>,
}

impl Pod {
    /// Reads the manifest's pod template. Refuses what ctr cannot do as the kubelet would
    /// (host PID namespace, privileged), rather than silently running something else.
    fn from_manifest(manifest: &str, dockerfile: &str) -> Self {
        let docs = YamlLoader::load_from_str(manifest).expect("daemonset.yaml is YAML");
        let pod = &docs[0]["spec"]["template"]["spec"];
        assert_ne!(
            pod["hostPID"].as_bool(),
            Some(true),
            "the manifest asks for hostPID: ctr 1.6 has no flag for the host's PID namespace; \
             run this test with one that has"
        );
        let containers = pod["containers"].as_vec().expect("containers");
        assert_eq!(containers.len(), 1);
        let c = &containers[0];
        let sc = &c["securityContext"];
        assert_ne!(sc["privileged"].as_bool(), Some(true), "privileged");
        let names = |y: &Yaml| -> Vec<String> {
            y.as_vec()
                .map(|v| {
                    v.iter()
                        .filter_map(|s| s.as_str())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        // Kubernetes drops first and then adds; ctr applies its --cap-drop after its
        // --cap-add, so "drop ALL" is a drop of every capability the manifest does not add.
        let added: Vec<String> = names(&sc["capabilities"]["add"])
            .iter()
            .map(|cap| format!("CAP_{cap}"))
            .collect();
        let mut dropped = Vec::new();
        for drop in names(&sc["capabilities"]["drop"]) {
            if drop == "ALL" {
                dropped.extend(CAPABILITIES.iter().map(|cap| format!("CAP_{cap}")));
            } else {
                dropped.push(format!("CAP_{drop}"));
            }
        }
        let mut flags = Vec::new();
        for cap in dropped.iter().filter(|cap| !added.contains(cap)) {
            flags.extend(["--cap-drop".into(), cap.clone()]);
        }
        for cap in &added {
            flags.extend(["--cap-add".into(), cap.clone()]);
        }
        match sc["seccompProfile"]["type"].as_str() {
            Some("RuntimeDefault") => flags.push("--seccomp".into()),
            other => panic!("seccompProfile {other:?}: the test runs RuntimeDefault only"),
        }
        if sc["readOnlyRootFilesystem"].as_bool() == Some(true) {
            flags.push("--read-only".into());
        }
        let volumes = pod["volumes"].as_vec().expect("volumes");
        let mut mounts = Vec::new();
        for m in c["volumeMounts"].as_vec().expect("volumeMounts") {
            let name = m["name"].as_str().expect("a mount's name");
            let volume = volumes
                .iter()
                .find(|v| v["name"].as_str() == Some(name))
                .unwrap_or_else(|| panic!("no volume {name}"));
            let src = volume["hostPath"]["path"].as_str().expect("a hostPath");
            let dst = m["mountPath"].as_str().expect("a mountPath");
            let mode = if m["readOnly"].as_bool() == Some(true) {
                "ro"
            } else {
                "rw"
            };
            flags.extend([
                "--mount".into(),
                format!("type=bind,src={src},dst={dst},options=rbind:{mode}"),
            ]);
            if mode == "ro" {
                mounts.push((src.to_owned(), dst.to_owned()));
            }
        }
        if let Some(memory) = c["resources"]["limits"]["memory"].as_str() {
            let mib: u64 = memory
                .strip_suffix("Mi")
                .and_then(|m| m.parse().ok())
                .unwrap_or_else(|| panic!("memory limit {memory}: Mi expected"));
            flags.extend(["--memory-limit".into(), (mib << 20).to_string()]);
        }
        // ctr replaces the image's entrypoint with the arguments it is given; the kubelet
        // appends `args` to it. The entrypoint is the Dockerfile's.
        let entrypoint = dockerfile
            .lines()
            .find_map(|l| l.strip_prefix("ENTRYPOINT "))
            .expect("an ENTRYPOINT");
        let mut args: Vec<String> = serde_json::from_str(entrypoint).expect("ENTRYPOINT [...]");
        args.extend(names(&c["args"]));
        Self {
            flags,
            added,
            mounts,
            args,
        }
    }

    /// The manifest's args with `--listen` moved to a loopback port: the test shares the
    /// host's network namespace (`--net-host`: no bridge may be made here), where the pod's
    /// 0.0.0.0 would listen on every host address.
    fn args_listening_on(&self, port: u16) -> Vec<String> {
        let mut args = self.args.clone();
        let at = args.iter().position(|a| a == "--listen").expect("--listen");
        args[at + 1] = format!("127.0.0.1:{port}");
        args
    }

    /// `ctr run` of the image as `id` with the pod's flags, and `args`.
    fn ctr_run(
        &self,
        containerd: &Containerd,
        mode: &str,
        id: &str,
        args: &[String],
    ) -> std::process::Command {
        let mut ctr = containerd.ctr();
        ctr.args(["run", mode, "--snapshotter", "native", "--net-host"])
            .args(&self.flags)
            .args([TAG, id])
            .args(args);
        ctr
    }
}

fn pod() -> Pod {
    Pod::from_manifest(
        &repo_file("deploy/daemonset.yaml"),
        &repo_file("deploy/Dockerfile"),
    )
}

/// The capability set `field` (CapEff, CapBnd, …) of /proc/PID/status, as names.
fn capabilities(status: &str, field: &str) -> Vec<String> {
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(":\t"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    CAPABILITIES
        .iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1 << bit) != 0)
        .map(|(_, cap)| format!("CAP_{cap}"))
        .collect()
}

fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(":\t"))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
}

/// The privileges process `pid` really has: exactly the pod's capabilities (effective and
/// bounding), the runtime's seccomp filter, no_new_privs, its own PID namespace, and the
/// pod's host mounts read-only.
fn assert_privileges(pid: u32, pod: &Pod) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mut want = pod.added.clone();
    want.sort();
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        let mut got = capabilities(&status, set);
        got.sort();
        assert_eq!(got, want, "{set} of the tracer's container");
    }
    assert_eq!(field(&status, "CapAmb"), "0000000000000000");
    assert_eq!(field(&status, "Seccomp"), "2", "a seccomp filter");
    assert_eq!(field(&status, "NoNewPrivs"), "1");
    let ns = |p: &str| fs::read_link(format!("/proc/{p}/ns/pid")).unwrap();
    assert_ne!(ns(&pid.to_string()), ns("self"), "its own PID namespace");
    let mountinfo = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    for (src, dst) in &pod.mounts {
        let line = mountinfo
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(dst.as_str()))
            .unwrap_or_else(|| panic!("{src} is not mounted at {dst}"));
        let options = line.split(' ').nth(5).unwrap();
        assert!(
            options.split(',').any(|o| o == "ro"),
            "{dst} read-only: {line}"
        );
    }
    println!(
        "container pid {pid}: CapEff/CapBnd {want:?}, Seccomp 2, NoNewPrivs 1, own PID \
         namespace, read-only {:?}",
        pod.mounts
    );
}

#[test]
fn the_daemonset_s_privileges_find_the_tracepoint_backend_usable() {
    let Some((_host, mut containerd)) = common::require(machine()) else {
        return;
    };
    let pod = pod();
    println!(
        "ctr run flags from deploy/daemonset.yaml: {}",
        pod.flags.join(" ")
    );
    let out = pod
        .ctr_run(
            &containerd,
            "--rm",
            "doctor",
            &[pod.args[0].clone(), "doctor".into()],
        )
        .output()
        .expect("ctr run doctor");
    let said = String::from_utf8_lossy(&out.stdout);
    println!("doctor in the container ({}):\n{said}", out.status);
    assert!(
        said.lines()
            .any(|l| l.trim_start().starts_with("tracepoint") && l.trim_end().ends_with(" usable")),
        "doctor in the container: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "doctor: {}", containers::text(&out));
    let left = containerd.shut_down();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// A 64-hex container id of this run.
fn container_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:032x}{:032x}", nanos, u128::from(std::process::id()))
}

/// The cgroup is made after `serve` started, and its first stop comes within a second of it:
/// the stops must carry its path and what the path names (issue 11 found them all labelled
/// `cgroup="id:<n>"`: the lookup of a cgroup made since the last walk of the hierarchy waited
/// for the next one, and the exporter kept the label of the first lookup).
#[test]
fn prometheus_stores_the_containerised_serve_s_series_of_a_throttled_container() {
    let Some((host, mut containerd)) = common::require(machine()) else {
        return;
    };
    let pod = pod();
    let dir = tempfile::tempdir().unwrap();

    let port = free_port();
    let status = pod
        .ctr_run(&containerd, "-d", "tracer", &pod.args_listening_on(port))
        .stdout(Stdio::null())
        .status()
        .expect("ctr run");
    assert!(status.success(), "ctr run tracer: {status}");
    wait_ready(port, "/healthz", "the containerised serve");
    assert_privileges(containerd.pid("tracer"), &pod);
    let (_prometheus, prom) = http::start_prometheus(dir.path(), "prometheus", port, &[], "");

    // The throttled container where the kubelet's cgroupfs driver puts a burstable pod's.
    let uid = "0c8f5a2e-1d3b-4c5a-9e7f-6b2a1c3d4e5f";
    let id = container_id();
    let parent = if host.cpu.root.join("kubepods").exists() {
        None
    } else {
        Some("kubepods")
    };
    if let Some(p) = parent {
        containerd.owns_cgroups(p);
    }
    let rootfs = containers::workload_rootfs(&dir.path().join("rootfs"));
    let cgroup = format!("/kubepods/burstable/pod{uid}/{id}");
    containerd.ctr_ok(&[
        "run",
        "-d",
        "--cpu-quota",
        "20000",
        "--cpu-period",
        "100000",
        "--cpu-shares",
        MAX_SHARES,
        "--cgroup",
        &cgroup,
        "--rootfs",
        &rootfs.display().to_string(),
        &id,
        WORKLOAD_IN_IMAGE,
        "idle",
        "--seconds",
        "600",
    ]);
    let cg = containers::Container::of(&host.cpu, id.clone(), containerd.pid(&id));
    assert_eq!(cg.cgroup, cgroup);
    favour_path(&host.cpu, &format!("kubepods/burstable/pod{uid}"));

    let before = host.cpu.stat(&cg.dir);
    containerd.ctr_ok(&[
        "task",
        "exec",
        "--exec-id",
        "busy",
        &id,
        WORKLOAD_IN_IMAGE,
        "busy",
        "--threads",
        "1",
        "--seconds",
        "5",
    ]);
    host.cpu.wait_refilled(&cg.dir);
    let frozen = SystemTime::now();
    let after = host.cpu.stat(&cg.dir);
    // The exporter's lines of the container's pod, said if Prometheus never stores its series.
    let pod_lines = || {
        let (_, scrape) = get(port, "/metrics").unwrap_or_default();
        let lines: Vec<String> = scrape
            .lines()
            .filter(|l| l.contains(uid) || l.contains("id:"))
            .map(str::to_owned)
            .collect();
        lines.join("\n")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !http::series_scraped_since(prom, &cgroup, frozen) {
        assert!(
            std::time::Instant::now() < deadline,
            "no scrape of {cgroup} after its counters froze ({after:?}); the exporter's \
             lines of its pod:\n{}",
            pod_lines()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Every label the path names, in the order the exporter writes them.
    let l = format!(
        "{{cgroup=\"{cgroup}\",container_id=\"{}\",container_id_full=\"{id}\",\
         pod_uid=\"{uid}\",qos=\"burstable\"}}",
        cg.short_id()
    );
    let (_, scrape) = get(port, "/metrics").expect("scrape");
    let stored = |family: &str| query(prom, &format!("{family}{l}"));
    // The exporter mirrors cpu.stat as the file says it, not as a delta: the counters
    // themselves (the idle first process may have run a period before `before` was read).
    let pairs = [
        (
            "throttle_tracer_cpustat_nr_throttled_total",
            after.nr_throttled as f64,
        ),
        (
            "throttle_tracer_cpustat_nr_periods_total",
            after.nr_periods as f64,
        ),
        (
            "throttle_tracer_cpustat_throttled_seconds_total",
            after.throttled_ns as f64 / 1e9,
        ),
    ];
    for (family, counter) in pairs {
        let got = stored(family);
        println!("{family}{l}: prometheus {got}, cpu.stat {counter}");
        assert!(
            (got - counter).abs() <= counter * 1e-9,
            "{family}: {got} vs {counter}"
        );
        assert_eq!(
            got,
            sample(&scrape, &format!("{family}{l}")),
            "stored = served"
        );
    }
    let stops = stored("throttle_tracer_stops_total");
    let periods = (after.nr_throttled - before.nr_throttled) as f64;
    println!("throttle_tracer_stops_total {stops} vs nr_throttled delta {periods}");
    assert!(periods >= 20.0, "hardly throttled: {periods}");
    assert!((stops - periods).abs() <= 2.0, "stops {stops} vs {periods}");

    let left = containerd.shut_down();
    assert!(left.is_empty(), "left behind: {left:#?}");
    assert!(!cg.dir.exists(), "{} is still there", cg.dir.display());
}

/// The most CPU weight for each cgroup on the way down to `path` (see
/// [`CpuHierarchy::favour`]): the kubepods levels runc made are weighted as one task each.
fn favour_path(cpu: &CpuHierarchy, path: &str) {
    let mut dir = cpu.root.clone();
    for part in path.split('/') {
        dir.push(part);
        cpu.favour(&dir);
    }
}
