//! Loading the eBPF object into the kernel and attaching the kprobe backend: nothing else.
//!
//! The object is embedded at build time. Before load it receives the kernel offsets resolved
//! from BTF, the cgroup filter, and the log level; after load its maps are the agent's only
//! inputs (the ring buffer, loss counters, and the stops still open).
use std::path::Path;

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::KProbe,
};
use aya_log::EbpfLogger;
use log::{LevelFilter, warn};
use tracer_common::Offsets;

use crate::error::Failure;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// Callers of `unthrottle_cfs_rq` whose entry and return mark why a stop ended, with every name
/// the kernel has used for them; the first that the running kernel has is probed.
const END_CONTEXTS: &[EndContext] = &[
    EndContext {
        reason: "refill",
        programs: ("refill_enter", "refill_leave"),
        // Period and slack timers refill in distribute; since 6.2 remote CPUs unthrottle in
        // the CSD callback. Both are probed.
        functions: &["distribute_cfs_runtime", "__cfsb_csd_unthrottle"],
    },
    EndContext {
        reason: "quota_change",
        programs: ("quota_change_enter", "quota_change_leave"),
        // tg_set_cfs_bandwidth is inlined into tg_set_bandwidth on 6.18.
        functions: &["tg_set_cfs_bandwidth", "tg_set_bandwidth"],
    },
    EndContext {
        reason: "cpu_offline",
        programs: ("cpu_offline_enter", "cpu_offline_leave"),
        functions: &["rq_offline_fair"],
    },
    EndContext {
        reason: "cgroup_gone",
        programs: ("cgroup_gone_enter", "cgroup_gone_leave"),
        functions: &["destroy_cfs_bandwidth"],
    },
];

struct EndContext {
    reason: &'static str,
    programs: (&'static str, &'static str),
    functions: &'static [&'static str],
}

/// The loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    /// End reasons the kernel does not let us tell apart (their stops report "unknown").
    pub blind_end_reasons: Vec<&'static str>,
}

impl Probes {
    /// Loads the object with `offsets` and attaches the kprobe backend.
    /// `cgroup_filter` empty means every cgroup.
    pub fn attach(offsets: &Offsets, cgroup_filter: &[u64]) -> Result<Self, Failure> {
        if !Path::new("/sys/bus/event_source/devices/kprobe").exists()
            && !Path::new("/sys/kernel/tracing/kprobe_events").exists()
            && !Path::new("/sys/kernel/debug/tracing/kprobe_events").exists()
        {
            return Err(Failure::environment(
                "kprobes are not available on this kernel (CONFIG_KPROBES is off)",
                "the kprobe backend needs a kernel built with CONFIG_KPROBES; \
                 `cargo xtask demo` shows the tracer on Debian kernels in QEMU",
            ));
        }
        let filter_on = u32::from(!cgroup_filter.is_empty());
        let log_level = match log::max_level() {
            LevelFilter::Off => 0u8,
            LevelFilter::Error => 1,
            LevelFilter::Warn => 2,
            LevelFilter::Info => 3,
            LevelFilter::Debug => 4,
            LevelFilter::Trace => 5,
        };
        let mut ebpf = EbpfLoader::new()
            .override_global("OFFSETS", offsets, true)
            .override_global("FILTER_CGROUPS", &filter_on, true)
            .override_global("AYA_LOG_LEVEL", &log_level, false)
            .load(OBJECT)
            .map_err(|e| load_failure(&e))?;
        match EbpfLogger::init(&mut ebpf) {
            Ok(logger) => spawn_logger(logger),
            Err(e) => warn!("eBPF diagnostics will not be shown: {e}"),
        }
        if filter_on != 0 {
            let mut filter: HashMap<_, u64, u8> =
                map(&mut ebpf, "CGROUP_FILTER").and_then(|m| {
                    HashMap::try_from(m).map_err(|e| internal(&format!("CGROUP_FILTER: {e}")))
                })?;
            for id in cgroup_filter {
                filter
                    .insert(id, 1, 0)
                    .map_err(|e| internal(&format!("CGROUP_FILTER insert: {e}")))?;
            }
        }

        // Context probes first: a stop that ends between the two attach steps is then never
        // reported with a reason we could have known.
        let mut blind_end_reasons = Vec::new();
        for ctx in END_CONTEXTS {
            let mut attached = false;
            for function in ctx.functions {
                let enter = attach_kprobe(&mut ebpf, ctx.programs.0, function);
                let leave = enter.and_then(|()| attach_kprobe(&mut ebpf, ctx.programs.1, function));
                match leave {
                    Ok(()) => attached = true,
                    Err(e) => log::debug!("{} not probed at {function}: {e}", ctx.reason),
                }
            }
            if !attached {
                warn!(
                    "cannot tell '{}' ends apart on this kernel (none of {} can be probed); \
                     they are reported as 'unknown'",
                    ctx.reason,
                    ctx.functions.join(", ")
                );
                blind_end_reasons.push(ctx.reason);
            }
        }
        for (program, function) in [
            ("unthrottle_cfs_rq", "unthrottle_cfs_rq"),
            ("unthrottle_cfs_rq_ret", "unthrottle_cfs_rq"),
            ("throttle_cfs_rq_ret", "throttle_cfs_rq"),
            ("throttle_cfs_rq", "throttle_cfs_rq"),
        ] {
            attach_kprobe(&mut ebpf, program, function).map_err(|e| {
                Failure::environment(
                    format!("cannot attach a kprobe to {function}: {e}"),
                    format!(
                        "the kernel must export {function} to kprobes \
                         (check `grep -w {function} /proc/kallsyms`)"
                    ),
                )
            })?;
        }
        Ok(Self {
            ebpf,
            blind_end_reasons,
        })
    }

    /// The ring buffer of START/END records; can be taken once.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, Failure> {
        let m = map(&mut self.ebpf, "EVENTS")?;
        RingBuf::try_from(m).map_err(|e| internal(&format!("EVENTS: {e}")))
    }

    /// Records lost so far: the ring buffer was full, or a start could not be remembered.
    pub fn lost(&self) -> Result<u64, Failure> {
        let mut total = 0;
        for name in ["LOST", "OPEN_FULL"] {
            let m = self
                .ebpf
                .map(name)
                .ok_or_else(|| internal(&format!("map {name} missing")))?;
            let counts: PerCpuArray<_, u64> =
                PerCpuArray::try_from(m).map_err(|e| internal(&format!("{name}: {e}")))?;
            let per_cpu = counts
                .get(&0, 0)
                .map_err(|e| internal(&format!("{name}: {e}")))?;
            total += per_cpu.iter().sum::<u64>();
        }
        Ok(total)
    }
}

fn map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map, Failure> {
    ebpf.take_map(name)
        .ok_or_else(|| internal(&format!("map {name} missing from the eBPF object")))
}

fn attach_kprobe(ebpf: &mut Ebpf, program: &str, function: &str) -> Result<(), String> {
    let probe: &mut KProbe = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
        .try_into()
        .map_err(|e| format!("{program}: {e}"))?;
    if probe.fd().is_err() {
        probe.load().map_err(|e| format!("load {program}: {e}"))?;
    }
    probe
        .attach(function, 0)
        .map(|_| ())
        .map_err(|e| format!("{e}"))
}

fn spawn_logger(logger: EbpfLogger<&'static dyn log::Log>) {
    // SAFETY: the logger owns its ring buffer's fd and lives inside the AsyncFd until both drop.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    };
    let Ok(mut fd) = registered else {
        warn!("eBPF diagnostics will not be shown: cannot poll their ring buffer");
        return;
    };
    tokio::spawn(async move {
        while let Ok(mut guard) = fd.readable_mut().await {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
}

fn load_failure(e: &aya::EbpfError) -> Failure {
    let text = format!("{e}");
    if text.contains("EPERM") || text.contains("Operation not permitted") {
        Failure::environment(
            format!("the kernel refused to load the eBPF programs: {text}"),
            "run as root, or grant CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN",
        )
    } else {
        Failure::environment(
            format!("the kernel refused to load the eBPF programs: {text}"),
            "run with RUST_LOG=debug and report the output",
        )
    }
}

fn internal(what: &str) -> Failure {
    Failure::environment(
        format!("internal error: {what}"),
        "this is a bug in throttle-tracer; please report it with the kernel version",
    )
}
