//! The tracing session: checks the machine, attaches the probes, moves records from the ring
//! buffer into the aggregate until Ctrl-C, SIGTERM or --duration, then hands the result to the
//! report with the cpu.stat deltas of the same window.
use std::{fs, time::Duration};

use aya::maps::{MapData, RingBuf};
use log::{debug, warn};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::SignalKind,
};

use crate::{
    aggregate::Aggregate,
    btf,
    cgroups::Hierarchy,
    cli::Options,
    cpustat::Baseline,
    error::Failure,
    probes::Probes,
    records::{self, Event},
    report::{self, RefusedBackend, Report, StartInfo, Totals},
};

/// How often the ring buffer is drained when no wakeup came (records are written without one).
const DRAIN_INTERVAL: Duration = Duration::from_millis(100);

pub async fn run(options: Options) -> Result<(), Failure> {
    check_privileges()?;
    let resolved = btf::resolve(&options.btf).map_err(|e| {
        Failure::environment(
            e.to_string(),
            "the tracer needs kernel BTF (CONFIG_DEBUG_INFO_BTF=y) at /sys/kernel/btf/vmlinux, \
             or a BTF file given with --btf",
        )
    })?;
    match &resolved.throttle_return {
        btf::ThrottleReturn::Bool | btf::ThrottleReturn::Void => {}
        btf::ThrottleReturn::NotInBtf => {
            warn!("BTF has no record of throttle_cfs_rq; assuming it returns bool (5.8+)");
        }
        btf::ThrottleReturn::Unexpected(what) => {
            return Err(Failure::environment(
                format!("throttle_cfs_rq has an unexpected signature on this kernel: {what}"),
                "this kernel is not supported yet; please report it with `uname -r`",
            ));
        }
    }
    debug!(
        "task counts from cfs_rq.{}; probe targets with BTF records: {:?}",
        resolved.nr_tasks_field.unwrap_or("(none)"),
        resolved.functions
    );
    for disabled in &resolved.disabled {
        warn!("{disabled}; that part of the report is left empty");
    }
    let mut hierarchy = Hierarchy::discover().map_err(|e| {
        Failure::environment(
            e.to_string(),
            "mount cgroup v2 with the cpu controller, or the cgroup v1 cpu hierarchy",
        )
    })?;
    let filter = options
        .cgroups
        .iter()
        .map(|path| hierarchy.id_of(path))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            Failure::usage(
                e.to_string(),
                format!(
                    "--cgroup takes a path under {}, such as /system.slice or /demo",
                    hierarchy.root().display()
                ),
            )
        })?;

    let mut probes = Probes::attach(options.backend, &resolved.offsets, &filter)?;
    if !probes.refused.is_empty() {
        eprintln!(
            "throttle-tracer: using the {} backend; {}",
            probes.backend.name(),
            probes
                .refused
                .iter()
                .map(|r| format!("{} refused: {}", r.backend.name(), r.reason))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let ring = probes.take_events()?;
    let baseline = Baseline::take(&mut hierarchy);
    let started_ns = records::monotonic_now_ns();
    let mut report = Report::new(options.json);
    report.start(StartInfo {
        backend: probes.backend.name(),
        backend_requested: options.backend.name(),
        backend_refused: probes
            .refused
            .iter()
            .map(|r| RefusedBackend {
                backend: r.backend.name(),
                reason: r.reason.clone(),
            })
            .collect(),
        kernel: kernel_release(),
        cgroup_version: Some(hierarchy.version()),
        cgroup_root: hierarchy.root().to_owned(),
        cgroups: options.cgroups.clone(),
        disabled: resolved.disabled.iter().map(ToString::to_string).collect(),
        blind_end_reasons: probes.blind_end_reasons.clone(),
    });

    let mut reader = Reader::new(ring)?;
    let mut aggregate = Aggregate::new();
    wait_for_end(
        options.duration,
        &mut reader,
        &mut aggregate,
        &mut report,
        &mut hierarchy,
    )
    .await?;
    reader.drain(&mut aggregate, &mut report, &mut hierarchy);
    let now_ns = records::monotonic_now_ns();
    // cpu.stat is read while the probes are still attached, right after the last drain, so a
    // stop is in one and not the other only if it ended in the microseconds between the two.
    let reports = report::collect(aggregate, now_ns, &mut hierarchy, &baseline);
    let totals = Totals {
        lost: probes.lost()?,
        malformed: reader.malformed,
        elapsed_ns: now_ns.saturating_sub(started_ns),
    };
    drop(probes);
    report.finish(&reports, &totals).map_err(|e| {
        Failure::environment(
            format!("cannot write the report: {e}"),
            "check that standard output is writable",
        )
    })
}

async fn wait_for_end(
    duration: Option<Duration>,
    reader: &mut Reader,
    aggregate: &mut Aggregate,
    report: &mut Report,
    hierarchy: &mut Hierarchy,
) -> Result<(), Failure> {
    let signal = |kind| {
        tokio::signal::unix::signal(kind)
            .map_err(|e| Failure::environment(format!("cannot handle signals: {e}"), "none"))
    };
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let deadline = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(DRAIN_INTERVAL);
    loop {
        tokio::select! {
            guard = reader.fd.readable_mut() => {
                let mut guard = guard.map_err(|e| Failure::environment(
                    format!("cannot poll the ring buffer: {e}"), "none"))?;
                guard.clear_ready();
            }
            _ = tick.tick() => {}
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            () = &mut deadline => return Ok(()),
        }
        reader.drain(aggregate, report, hierarchy);
    }
}

/// The ring buffer and what was wrong with its records.
struct Reader {
    fd: AsyncFd<RingBuf<MapData>>,
    malformed: u64,
}

impl Reader {
    fn new(ring: RingBuf<MapData>) -> Result<Self, Failure> {
        // SAFETY: the ring buffer owns its map fd and lives inside the AsyncFd until both drop.
        let fd =
            unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }.map_err(|e| {
                Failure::environment(format!("cannot poll the ring buffer: {e}"), "none")
            })?;
        Ok(Self { fd, malformed: 0 })
    }

    fn drain(&mut self, aggregate: &mut Aggregate, report: &mut Report, hierarchy: &mut Hierarchy) {
        let ring = self.fd.get_mut();
        while let Some(item) = ring.next() {
            match Event::parse(&item) {
                Ok(event) => {
                    if let Event::End(stop) = &event {
                        report.stop(stop, hierarchy.path_of(stop.stop.cgroup_id));
                    }
                    aggregate.ingest(&event);
                }
                Err(e) => {
                    self.malformed += 1;
                    warn!("malformed record: {e}");
                }
            }
        }
    }
}

/// The capabilities that decide whether tracing programs may load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The `CapEff:` mask of /proc/self/status.
    pub effective: u64,
}

impl Capabilities {
    const SYS_ADMIN: u32 = 21;
    const PERFMON: u32 = 38;
    const BPF: u32 = 39;

    pub fn of_self() -> Self {
        let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
        let effective = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or(0);
        Self { effective }
    }

    fn has(self, cap: u32) -> bool {
        self.effective & (1 << cap) != 0
    }

    pub fn sys_admin(self) -> bool {
        self.has(Self::SYS_ADMIN)
    }

    pub fn bpf(self) -> bool {
        self.has(Self::BPF)
    }

    pub fn perfmon(self) -> bool {
        self.has(Self::PERFMON)
    }

    /// CAP_BPF and CAP_PERFMON (5.8+), or CAP_SYS_ADMIN, which covers both.
    pub fn can_trace(self) -> bool {
        self.sys_admin() || (self.bpf() && self.perfmon())
    }
}

/// Loading tracing programs needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN before 5.8);
/// checking first turns the kernel's bare EPERM into advice.
fn check_privileges() -> Result<(), Failure> {
    if Capabilities::of_self().can_trace() {
        Ok(())
    } else {
        Err(Failure::environment(
            "tracing needs root, or the capabilities CAP_BPF and CAP_PERFMON",
            "run it with sudo, or grant them: setcap cap_bpf,cap_perfmon+ep throttle-tracer",
        ))
    }
}

pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}
