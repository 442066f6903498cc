//! Choosing a backend, loading the eBPF object into the kernel and attaching the backend's
//! programs: nothing else. The object is embedded at build time; before load it receives the BTF
//! offsets, the cgroup filter and the log level, and after load its maps (the ring buffer and the
//! loss counters) are the agent's only inputs. `--backend auto` tries fentry, kprobe, tracepoint
//! ([`select`]); each attempt loads a fresh copy of the object and a failed one drops it,
//! detaching what it attached, so that the next backend starts from nothing.

mod concurrent;
mod end_contexts;
mod errno;
mod fentry;
mod kprobe;
mod removal;
mod tracepoint;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
};
use aya_log::EbpfLogger;
use log::{debug, warn};
use tracer_common::{LOST_KEY_ID_MASK, Offsets};

use crate::{
    error::Failure,
    privileges::{self, Capabilities},
    records::Lost,
};
use errno::Cause;
use std::os::fd::AsRawFd as _;
use std::path::Path;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// What `--backend` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// The first of fentry, kprobe, tracepoint that works on this kernel.
    Auto,
    /// kprobe + kretprobe on throttle_cfs_rq / unthrottle_cfs_rq.
    Kprobe,
    /// fentry / fexit on the same functions (cheapest; needs BPF trampolines).
    Fentry,
    /// Scheduler tracepoints only (tp_btf), for kernels without kprobes.
    Tracepoint,
}

impl BackendChoice {
    /// The backends to try, in order.
    pub fn candidates(self) -> &'static [Backend] {
        match self {
            Self::Auto => &Backend::AUTO_ORDER,
            Self::Kprobe => &[Backend::Kprobe],
            Self::Fentry => &[Backend::Fentry],
            Self::Tracepoint => &[Backend::Tracepoint],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Kprobe => Backend::Kprobe.name(),
            Self::Fentry => Backend::Fentry.name(),
            Self::Tracepoint => Backend::Tracepoint.name(),
        }
    }
}

/// How stops are observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// kprobe + kretprobe on throttle_cfs_rq / unthrottle_cfs_rq.
    Kprobe,
    /// fentry / fexit on the same functions.
    Fentry,
    /// Scheduler tracepoints only (tp_btf), for kernels without kprobes.
    Tracepoint,
}

impl Backend {
    /// `--backend auto`'s order: cheapest first (fentry: no breakpoint, return values with the
    /// arguments), then kprobe, then the tracepoint approximation.
    pub const AUTO_ORDER: [Self; 3] = [Self::Fentry, Self::Kprobe, Self::Tracepoint];

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

/// A backend that was tried and could not be used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub backend: Backend,
    /// The one-line cause, as the error line would say it.
    pub reason: String,
    pub hint: Option<String>,
}

/// The outcome of [`select`]: the first backend that worked, what it gave, and every backend
/// tried before it.
#[derive(Debug)]
pub struct Selected<T> {
    pub backend: Backend,
    pub value: T,
    pub refused: Vec<Refusal>,
}

/// Tries `candidates` in order with `attempt` and keeps the first that works. With one
/// candidate (an explicit `--backend`) its failure is returned as it is; when several were
/// tried and all failed, one line names each backend's reason.
pub fn select<T>(
    candidates: &[Backend],
    mut attempt: impl FnMut(Backend) -> Result<T, Failure>,
) -> Result<Selected<T>, Failure> {
    let mut refused = Vec::new();
    let mut last = None;
    for &backend in candidates {
        match attempt(backend) {
            Ok(value) => {
                return Ok(Selected {
                    backend,
                    value,
                    refused,
                });
            }
            Err(failure) => {
                let failure = one_line(failure);
                let (Failure::Usage { message, hint } | Failure::Environment { message, hint }) =
                    &failure;
                refused.push(Refusal {
                    backend,
                    reason: message.clone(),
                    hint: hint.clone(),
                });
                last = Some(failure);
            }
        }
    }
    match (refused.len(), last) {
        (1, Some(only)) => Err(only),
        (0, _) | (_, None) => Err(internal("no backend to try")),
        _ => Err(Failure::environment(
            format!(
                "no backend can trace stops on this kernel: {}",
                refused
                    .iter()
                    .map(|r| format!("{}: {}", r.backend.name(), r.reason))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            "`throttle-tracer doctor` shows what this kernel allows",
        )),
    }
}

/// The failure with its message cut to the first line: a verifier log quoted in a load error
/// goes to the debug log instead of the error line.
fn one_line(failure: Failure) -> Failure {
    let cut = |message: String| match message.split_once('\n') {
        Some((first, _)) => {
            log::debug!("full error: {message}");
            first.to_owned()
        }
        None => message,
    };
    match failure {
        Failure::Usage { message, hint } => Failure::Usage {
            message: cut(message),
            hint,
        },
        Failure::Environment { message, hint } => Failure::Environment {
            message: cut(message),
            hint,
        },
    }
}

/// The loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    pub backend: Backend,
    /// The backends `--backend auto` tried before this one, and why each was refused.
    pub refused: Vec<Refusal>,
    /// End reasons the kernel does not let us tell apart (their stops report "unknown").
    pub blind_end_reasons: Vec<&'static str>,
}

impl Probes {
    /// Loads the object with `offsets` and attaches the first backend of `choice` that works.
    /// `cgroup_filter` empty means every cgroup. `btf` is freed on return.
    pub fn attach(
        choice: BackendChoice,
        btf: KernelBtf,
        offsets: &Offsets,
        cgroup_filter: &[u64],
        ring_bytes: u32,
    ) -> Result<Self, Failure> {
        let selected = select(choice.candidates(), |backend| {
            let phase = std::time::Instant::now();
            let attempt = try_backend(backend, &btf, offsets, cgroup_filter, ring_bytes);
            if attempt.is_err() {
                debug!(
                    "startup: {} refused in {:.1} ms",
                    backend.name(),
                    crate::sys::ms(phase)
                );
            }
            attempt
        })?;
        let (mut ebpf, attached) = selected.value;
        // The logger only for the copy that stays: a failed attempt leaves nothing behind.
        match EbpfLogger::init(&mut ebpf) {
            Ok(logger) => spawn_logger(logger),
            Err(e) => warn!("eBPF diagnostics will not be shown: {e}"),
        }
        for reason in &attached.blind_end_reasons {
            let why = match selected.backend {
                Backend::Tracepoint => tracepoint::why_blind(reason).to_owned(),
                Backend::Kprobe | Backend::Fentry if *reason == "cgroup_gone" => {
                    removal::WHY_BLIND.to_owned()
                }
                Backend::Kprobe | Backend::Fentry => format!(
                    "none of {} can be traced",
                    end_contexts::functions_of(reason)
                ),
            };
            warn!(
                "cannot tell '{reason}' ends apart on this kernel ({why}); they are reported as \
                 'unknown'"
            );
        }
        Ok(Self {
            ebpf,
            backend: selected.backend,
            refused: selected.refused,
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

    /// Runs of the loaded programs the kernel skipped so far (`recursion_misses` in each
    /// program's fdinfo, 5.12+), summed; each program with misses is named in a warning.
    /// `None` where the kernel does not count them.
    pub fn missed_runs(&self) -> Option<u64> {
        let mut total = None;
        for (name, program) in self.ebpf.programs() {
            let Ok(fd) = program.fd() else { continue };
            let path = format!(
                "/proc/self/fdinfo/{}",
                std::os::fd::AsFd::as_fd(fd).as_raw_fd()
            );
            let misses = std::fs::read_to_string(path).ok().and_then(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("recursion_misses:"))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            });
            if let Some(n) = misses {
                if n > 0 {
                    warn!("the kernel skipped {n} run(s) of {name} (its recursion guard)");
                }
                *total.get_or_insert(0) += n;
            }
        }
        total
    }

    /// Removed cgroups that the programs' map of them (`GONE`, an LRU map of 1024, every
    /// backend's) evicted so far: its new entries less the entries it holds, as nothing deletes
    /// from it.
    pub fn evicted_removed_cgroups(&self) -> Result<Option<u64>, Failure> {
        let inserted = {
            let name = "GONE_INSERTED";
            let m = self
                .ebpf
                .map(name)
                .ok_or_else(|| internal(&format!("map {name} missing")))?;
            let count: aya::maps::Array<_, u64> =
                aya::maps::Array::try_from(m).map_err(|e| internal(&format!("{name}: {e}")))?;
            count
                .get(&0, 0)
                .map_err(|e| internal(&format!("{name}: {e}")))?
        };
        let name = "GONE";
        let m = self
            .ebpf
            .map(name)
            .ok_or_else(|| internal(&format!("map {name} missing")))?;
        // The key is the eBPF side's `Gone`: a `struct cgroup *` and a cgroup id.
        let gone: HashMap<_, [u64; 2], u8> =
            HashMap::try_from(m).map_err(|e| internal(&format!("{name}: {e}")))?;
        let entries = gone.keys().filter(Result::is_ok).count() as u64;
        Ok(Some(inserted.saturating_sub(entries)))
    }

    /// Records lost so far by cgroup (those the kernel could attribute: see `LOST_BY_CGROUP`).
    pub fn lost_by_cgroup(&self) -> Result<std::collections::HashMap<u64, Lost>, Failure> {
        let name = "LOST_BY_CGROUP";
        let m = self
            .ebpf
            .map(name)
            .ok_or_else(|| internal(&format!("map {name} missing")))?;
        let counts: HashMap<_, u64, u64> =
            HashMap::try_from(m).map_err(|e| internal(&format!("{name}: {e}")))?;
        let mut lost = std::collections::HashMap::<u64, Lost>::new();
        for entry in counts.iter() {
            let (key, n) = entry.map_err(|e| internal(&format!("{name}: {e}")))?;
            let kind = u32::try_from(key >> 60).unwrap_or(u32::MAX);
            lost.entry(key & LOST_KEY_ID_MASK).or_default().add(kind, n);
        }
        Ok(lost)
    }
}

/// The running kernel's BTF, parsed once for every backend tried: aya's loader, the tp_btf and
/// the fentry programs need it (each parse is ~10 ms), the kprobe backend does without.
pub struct KernelBtf(Result<Btf, String>);

impl KernelBtf {
    /// Parses `path`: /sys/kernel/btf/vmlinux, or the copy `--btf` names where that file is
    /// missing. The kernel resolves the programs' attach points in its own vmlinux BTF, not in
    /// the file, so a copy made from the running kernel loads and attaches them the same
    /// (tracer/tests/cli.rs proves it with sysfs's file hidden).
    pub fn parse(path: &Path) -> Self {
        let phase = std::time::Instant::now();
        let btf = Btf::parse_file(path, aya::Endianness::default())
            .map_err(|e| format!("{}: {e}", path.display()));
        debug!(
            "startup: kernel BTF parsed in {:.1} ms",
            crate::sys::ms(phase)
        );
        Self(btf)
    }

    /// The BTF, or why it could not be read.
    pub fn get(&self) -> Result<&Btf, &str> {
        self.0.as_ref().map_err(String::as_str)
    }
}

/// Loads a fresh copy of the object, its ring buffer `ring_bytes` long, and attaches `backend`
/// to it. On failure the copy is dropped here, which detaches and unloads all it had.
pub fn try_backend(
    backend: Backend,
    btf: &KernelBtf,
    offsets: &Offsets,
    cgroup_filter: &[u64],
    ring_bytes: u32,
) -> Result<(Ebpf, Attached), Failure> {
    // Before the object is loaded: creating its maps is most of a refused attempt's time.
    match backend {
        Backend::Kprobe => kprobe::available()?,
        Backend::Fentry => fentry::loadable(btf)?,
        Backend::Tracepoint => {}
    }
    let filter_on = u32::from(!cgroup_filter.is_empty());
    let log_level = ebpf_log_level();
    // The tracepoint backend's sweep at a cgroup's removal looks at every possible CPU's stop
    // of the group; the verifier walks the loop for this count.
    let nr_cpus = aya::util::nr_cpus().map_or(1024, |n| n as u64);
    let phase = std::time::Instant::now();
    // A record wakes the reader once a sixteenth of the ring is pending (64 KiB of the default
    // 1 MiB); below that the reader's 100 ms tick drains it.
    let wakeup_bytes = u64::from(ring_bytes / 16);
    // Only the tracepoint backend sees a held thread block, which ends its deferred work.
    let deferred_on = u32::from(backend == Backend::Tracepoint);
    let mut loader = EbpfLoader::new();
    loader
        .btf(btf.get().ok())
        .map_max_entries("EVENTS", ring_bytes)
        .override_global("WAKEUP_BYTES", &wakeup_bytes, true)
        .override_global("OFFSETS", offsets, true)
        .override_global("FILTER_CGROUPS", &filter_on, true)
        .override_global("NR_CPUS", &nr_cpus, true)
        .override_global("DEFERRED_ON", &deferred_on, true)
        .override_global("AYA_LOG_LEVEL", &log_level, false);
    for (name, entries) in map_sizes(backend, nr_cpus) {
        loader.map_max_entries(name, entries);
    }
    let mut ebpf = loader.load(OBJECT).map_err(|e| load_failure(&e))?;
    debug!(
        "startup: {} object loaded (maps) in {:.1} ms",
        backend.name(),
        crate::sys::ms(phase)
    );
    if filter_on != 0 {
        // Borrowed, not taken: a taken map's fd closes when it drops, and programs loaded
        // after that (every tp_btf/fentry program is loaded at attach) would reference it.
        let m = ebpf
            .map_mut("CGROUP_FILTER")
            .ok_or_else(|| internal("map CGROUP_FILTER missing from the eBPF object"))?;
        let mut filter: HashMap<_, u64, u8> =
            HashMap::try_from(m).map_err(|e| internal(&format!("CGROUP_FILTER: {e}")))?;
        for id in cgroup_filter {
            filter
                .insert(id, 1, 0)
                .map_err(|e| internal(&format!("CGROUP_FILTER insert: {e}")))?;
        }
    }
    let attached = match backend {
        Backend::Kprobe => kprobe::attach(&mut ebpf)?,
        Backend::Fentry => fentry::attach(&mut ebpf, btf)?,
        Backend::Tracepoint => tracepoint::attach(&mut ebpf, btf, offsets)?,
    };
    Ok((ebpf, attached))
}

/// The most verbose level the logger shows for the eBPF object's records (`AYA_LOG_LEVEL`):
/// their targets are its modules, `tracer::kprobe` and `tracer::fentry` (its crate is named
/// `tracer`), and a record the filter drops still costs its program a ring buffer write. So
/// `RUST_LOG=throttle_tracer::probes=debug` shows what was attached without the eBPF programs
/// paying for debug records, and `RUST_LOG=debug` shows both.
fn ebpf_log_level() -> u8 {
    use log::Level;
    [
        Level::Trace,
        Level::Debug,
        Level::Info,
        Level::Warn,
        Level::Error,
    ]
    .into_iter()
    .find(|&level| {
        ["tracer::kprobe", "tracer::fentry"]
            .into_iter()
            .any(|target| log::log_enabled!(target: target, level))
    })
    .map_or(0, |level| level as u8)
}

/// Logs, at debug level, that `program` (of `kind`: kprobe, kretprobe, fentry, fexit) is
/// attached to `function`, with its kernel program id: the kernel truncates program names to
/// 15 bytes and keeps no function for a kprobe link before 6.6, so this line is how a
/// measurement (`cargo xtask vm-test`) finds each program's hook.
pub(crate) fn log_attached(
    kind: &str,
    program: &str,
    info: Result<aya::programs::ProgramInfo, aya::programs::ProgramError>,
    function: &str,
) {
    match info {
        Ok(info) => debug!(
            "attached {kind} {program} (program id {}) to {function}",
            info.id()
        ),
        Err(e) => debug!("attached {kind} {program} (program id unknown: {e}) to {function}"),
    }
}

/// Open stops each CPU can hold at once, in the maps keyed by cfs_rq (one per cgroup and CPU).
const OPEN_PER_CPU: u32 = 8192;
/// The object's largest maps' sizes for `backend` on `nr_cpus` CPUs: every map is created at
/// load (the programs of all backends reference them), so those of the other backends get
/// the fewest entries the kernel takes; the per-cfs_rq ones scale with the CPUs, up to the
/// object's own size.
fn map_sizes(backend: Backend, nr_cpus: u64) -> Vec<(&'static str, u32)> {
    let cpus = u32::try_from(nr_cpus).unwrap_or(u32::MAX).max(1);
    let per_cfs_rq = |max: u32| cpus.saturating_mul(OPEN_PER_CPU).min(max);
    // An LRU map's free lists are per CPU: no fewer entries than CPUs.
    let unused_lru = cpus;
    match backend {
        Backend::Tracepoint => vec![("OPEN", 1), ("DEMAND_CPU", per_cfs_rq(65536))],
        Backend::Kprobe | Backend::Fentry => vec![
            ("OPEN", per_cfs_rq(65536)),
            ("OPEN_BY_GROUP", per_cfs_rq(65536)),
            ("PENDING", 1),
            ("TP_OPEN", 1),
            ("TP_ENDED", unused_lru),
            // Every backend measures the per-period demand.
            ("DEMAND_CPU", per_cfs_rq(65536)),
        ],
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

/// Loading creates the maps first: without the capabilities that is where the kernel says
/// EPERM, and the failure names what is missing.
fn load_failure(e: &aya::EbpfError) -> Failure {
    let errno = errno::of(e);
    let message = match errno {
        Some(n) => format!(
            "the kernel refused to load the eBPF programs: {e}: {}",
            errno::describe(n)
        ),
        None => format!("the kernel refused to load the eBPF programs: {e}"),
    };
    match Cause::of(errno, Capabilities::of_self()) {
        Cause::Unprivileged => privileges::missing(Some(&message)),
        Cause::Forbidden => Failure::environment(
            message,
            "the capabilities are there, so a limit refused it: before 5.11 maps count against \
             the locked-memory limit (raise it: ulimit -l unlimited), and a security module \
             (lockdown, SELinux) can refuse bpf() even to root",
        ),
        Cause::Other => {
            Failure::environment(message, "run with RUST_LOG=debug and report the output")
        }
    }
}

/// What the kernel took to verify and to attach a function-probe backend's programs (kprobe,
/// fentry), summed over them for the `startup:` debug lines: they load and attach one at a
/// time, and under an emulator their attaches are a large part of a start.
#[derive(Default)]
pub(crate) struct Spent {
    loads: u32,
    loading: std::time::Duration,
    attaches: u32,
    attaching: std::time::Duration,
}

impl Spent {
    /// `load()`, timed as a program's load (its verification).
    pub(crate) fn load<T>(&mut self, load: impl FnOnce() -> T) -> T {
        timed(&mut self.loads, &mut self.loading, load)
    }

    /// `attach()`, timed as one attach.
    pub(crate) fn attach<T>(&mut self, attach: impl FnOnce() -> T) -> T {
        timed(&mut self.attaches, &mut self.attaching, attach)
    }

    pub(crate) fn log(&self, backend: &str) {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        debug!(
            "startup: {} {backend} programs verified in {:.1} ms",
            self.loads,
            ms(self.loading)
        );
        debug!(
            "startup: {} {backend} attaches in {:.1} ms",
            self.attaches,
            ms(self.attaching)
        );
    }
}

/// `f()`, counted in `count` and its time added to `total`.
fn timed<T>(count: &mut u32, total: &mut std::time::Duration, f: impl FnOnce() -> T) -> T {
    let started = std::time::Instant::now();
    let result = f();
    *count += 1;
    *total += started.elapsed();
    result
}

/// The per-period demand program did not attach to `hook`: stops are traced as before, but
/// nothing measures demand, so no advice is given.
pub(crate) fn warn_no_demand(hook: &str, error: &dyn std::fmt::Display) {
    log::warn!(
        "cannot attach the per-period demand program to {hook} ({error}); no CPU demand is \
         measured, so no quota advice is given"
    );
}

pub(crate) fn internal(what: &str) -> Failure {
    Failure::environment(
        format!("internal error: {what}"),
        "this is a bug in throttle-tracer; please report it with the kernel version",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuse(why: &str) -> Failure {
        Failure::environment(why, format!("hint for {why}"))
    }

    /// `select` over canned attempt results; also returns the order of the attempts.
    fn run(
        choice: BackendChoice,
        works: &[Backend],
    ) -> (Result<Selected<&'static str>, Failure>, Vec<Backend>) {
        let mut tried = Vec::new();
        let result = select(choice.candidates(), |b| {
            tried.push(b);
            if works.contains(&b) {
                Ok(b.name())
            } else {
                Err(refuse(&format!("{} refused", b.name())))
            }
        });
        (result, tried)
    }

    #[test]
    fn auto_takes_fentry_first_and_tries_nothing_after() {
        let (selected, tried) = run(BackendChoice::Auto, &Backend::AUTO_ORDER);
        let selected = selected.unwrap();
        assert_eq!(selected.backend, Backend::Fentry);
        assert_eq!(selected.value, "fentry");
        assert!(selected.refused.is_empty());
        assert_eq!(tried, [Backend::Fentry]);
    }

    #[test]
    fn auto_falls_back_in_order_and_says_why() {
        let (selected, tried) = run(BackendChoice::Auto, &[Backend::Tracepoint]);
        let selected = selected.unwrap();
        assert_eq!(selected.backend, Backend::Tracepoint);
        assert_eq!(tried, Backend::AUTO_ORDER);
        assert_eq!(
            selected.refused,
            [
                Refusal {
                    backend: Backend::Fentry,
                    reason: "fentry refused".into(),
                    hint: Some("hint for fentry refused".into()),
                },
                Refusal {
                    backend: Backend::Kprobe,
                    reason: "kprobe refused".into(),
                    hint: Some("hint for kprobe refused".into()),
                },
            ]
        );
        let (selected, _) = run(BackendChoice::Auto, &[Backend::Kprobe, Backend::Tracepoint]);
        let selected = selected.unwrap();
        assert_eq!(selected.backend, Backend::Kprobe);
        assert_eq!(selected.refused.len(), 1);
    }

    #[test]
    fn auto_with_nothing_working_names_every_reason_on_one_line() {
        let (selected, _) = run(BackendChoice::Auto, &[]);
        let failure = selected.unwrap_err();
        assert_eq!(failure.exit_code(), 1);
        let text = failure.to_string();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "error: no backend can trace stops on this kernel: fentry: fentry refused; \
                 kprobe: kprobe refused; tracepoint: tracepoint refused"
            )
        );
        assert!(lines.next().is_some_and(|l| l.contains("doctor")));
    }

    #[test]
    fn a_verifier_log_in_a_reason_is_cut_to_its_first_line() {
        let selected = select(&[Backend::Kprobe], |_| -> Result<(), _> {
            Err(refuse(
                "load failed. Verifier output: stack too large\nprocessed 9 insns",
            ))
        });
        assert_eq!(
            selected.unwrap_err().to_string(),
            "error: load failed. Verifier output: stack too large\n\
             hint: hint for load failed. Verifier output: stack too large\nprocessed 9 insns"
        );
    }

    #[test]
    fn an_explicit_backend_is_the_only_one_tried_and_its_failure_is_kept() {
        let (selected, tried) = run(BackendChoice::Kprobe, &[Backend::Fentry]);
        assert_eq!(tried, [Backend::Kprobe]);
        let text = selected.unwrap_err().to_string();
        assert_eq!(text, "error: kprobe refused\nhint: hint for kprobe refused");
        let (selected, _) = run(BackendChoice::Fentry, &[Backend::Fentry]);
        assert_eq!(selected.unwrap().backend, Backend::Fentry);
    }
}
