//! Loading the eBPF object into the kernel and attaching a backend's programs: nothing else.
//!
//! The object is embedded at build time. Before load it receives the kernel offsets resolved
//! from BTF, the cgroup filter, and the log level; after load its maps are the agent's only
//! inputs (the ring buffer and the loss counters).

mod fentry;
mod kprobe;
mod tracepoint;

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
};
use aya_log::EbpfLogger;
use log::{LevelFilter, warn};
use tracer_common::Offsets;

use crate::error::Failure;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// How stops are observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// kprobe + kretprobe on throttle_cfs_rq / unthrottle_cfs_rq.
    Kprobe,
    /// fentry / fexit on the same functions.
    Fentry,
    /// Scheduler tracepoints only (tp_btf), for kernels without kprobes.
    Tracepoint,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kprobe => "kprobe",
            Self::Fentry => "fentry",
            Self::Tracepoint => "tracepoint",
        }
    }
}

/// What a backend's attach achieved.
pub struct Attached {
    /// End reasons the kernel does not let us tell apart (their stops report "unknown").
    pub blind_end_reasons: Vec<&'static str>,
}

/// The loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    pub backend: Backend,
    /// End reasons the kernel does not let us tell apart (their stops report "unknown").
    pub blind_end_reasons: Vec<&'static str>,
}

impl Probes {
    /// Loads the object with `offsets` and attaches `backend`.
    /// `cgroup_filter` empty means every cgroup.
    pub fn attach(
        backend: Backend,
        offsets: &Offsets,
        cgroup_filter: &[u64],
    ) -> Result<Self, Failure> {
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
            // Borrowed, not taken: a taken map's fd closes when it drops, and programs loaded
            // after that (every tp_btf/fentry program is loaded at attach) would reference it.
            let m = ebpf
                .map_mut("CGROUP_FILTER")
                .ok_or_else(|| internal("map CGROUP_FILTER missing from the eBPF object"))?;
            let mut filter: HashMap<_, u64, u8> = HashMap::try_from(m)
                .map_err(|e| internal(&format!("CGROUP_FILTER: {e}")))?;
            for id in cgroup_filter {
                filter
                    .insert(id, 1, 0)
                    .map_err(|e| internal(&format!("CGROUP_FILTER insert: {e}")))?;
            }
        }

        let attached = match backend {
            Backend::Kprobe => kprobe::attach(&mut ebpf)?,
            Backend::Fentry => fentry::attach(&mut ebpf)?,
            Backend::Tracepoint => tracepoint::attach(&mut ebpf, offsets)?,
        };
        Ok(Self {
            ebpf,
            backend,
            blind_end_reasons: attached.blind_end_reasons,
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

pub(crate) fn internal(what: &str) -> Failure {
    Failure::environment(
        format!("internal error: {what}"),
        "this is a bug in throttle-tracer; please report it with the kernel version",
    )
}
