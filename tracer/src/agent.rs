//! The tracing session: checks the machine, attaches the probes, moves records from the ring buffer
//! into the aggregate until Ctrl-C, SIGTERM or --duration, then hands the result to the report with
//! the cpu.stat deltas of the same window. [`run`] is the command line's session, [`advise`] the
//! same with the advice alone; `demo` and `serve` drive a [`Session`] themselves. Every output is a
//! sink of the one report ([`Session::add_sink`]), fed records, [`Session::tick`]s and
//! [`Session::key`]s.
use std::{
    collections::HashMap,
    fs,
    future::Future,
    path::Path,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use log::{debug, warn};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{Signal, SignalKind},
};

use crate::{
    advice,
    aggregate::Aggregate,
    btf,
    cgroups::Hierarchy,
    cli::{AdviseArgs, ProbeArgs, RunArgs, TracingArgs},
    error::{Failure, say},
    filter::{Ancestors, Selection, Traced},
    opening, privileges,
    probes::{KernelBtf, Probes},
    records::{self, Event, Record},
    report::{self, AdviceOnly, CgroupReport, Ndjson, Report, Sink, Text, Tick, live::LiveView},
    sampler::{Baseline, Sampler, Snapshot, Target},
    schema::{CgroupRef, End, PidComm, RefusedBackend, Start},
    sys::{kernel_release, ms},
    terminal::Keys,
    wallclock::{self, Tracker},
};

/// How often the ring buffer is drained when no wakeup came (records are written without one).
const DRAIN_INTERVAL: Duration = Duration::from_millis(100);

pub async fn run(options: RunArgs) -> Result<(), Failure> {
    let min_stop_ns = options
        .min_stop
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let mut sinks: Vec<Box<dyn Sink>> = vec![if options.json {
        Box::new(Ndjson::stdout(min_stop_ns))
    } else {
        Box::new(Text::stdout())
    }];
    // Before anything is attached: a --record path that cannot be written is a usage error.
    if let Some(path) = &options.record {
        sinks.push(Box::new(Ndjson::recording(path)?));
    }
    // Before the probes: a SIGINT or SIGTERM right after the `start` line (a script that only
    // waited for it) still ends the trace with its report, not the process.
    let mut interrupts = Interrupts::new()?;
    let (mut session, selected) = Session::start_selected(&options.tracing, sinks)?;
    let deadline = options.duration.map(|d| tokio::time::Instant::now() + d);
    match options.interval {
        Some(every) => {
            live(
                &mut session,
                every,
                deadline,
                &selected,
                min_stop_ns,
                &mut interrupts,
            )
            .await?;
        }
        None => {
            let until = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            session.trace_until(until, &mut interrupts).await?;
        }
    }
    session.finish().map(|_| ())
}

/// `throttle-tracer advise`: traces for `--duration` (or until a signal), then prints only the
/// advice.
pub async fn advise(options: AdviseArgs) -> Result<(), Failure> {
    let sinks: Vec<Box<dyn Sink>> = vec![Box::new(AdviceOnly::stdout(options.json))];
    let mut interrupts = Interrupts::new()?;
    let (mut session, _) = Session::start_selected(&options.tracing, sinks)?;
    let until = tokio::time::sleep(options.duration);
    session.trace_until(until, &mut interrupts).await?;
    session.finish().map(|_| ())
}

fn write_failed(e: std::io::Error) -> Failure {
    Failure::environment(
        format!("cannot write the report: {e}"),
        "check that standard output (and the --record file, if any) can be written",
    )
}

/// The live view: a table every `every` until `deadline` or a signal. A table is printed at
/// every tick, and at the deadline if at least half an interval passed since the last tick;
/// the rest of the run, and an interrupted interval, are in the summary only. On a terminal, keys
/// act at once (`report::live`); `q` or Ctrl-C ends the run like SIGINT. The view is the
/// report's first sink, so the terminal is given back before the summary is printed.
async fn live(
    session: &mut Session,
    every: Duration,
    deadline: Option<tokio::time::Instant>,
    selected: &[u64],
    min_stop_ns: u64,
    interrupts: &mut Interrupts,
) -> Result<(), Failure> {
    session.aggregate = std::mem::take(&mut session.aggregate).with_intervals(min_stop_ns);
    let Some(watched) = session.sample(selected.to_vec(), interrupts).await? else {
        return Ok(());
    };
    let (view, mut keys) = LiveView::stdout(watched).map_err(|e| {
        Failure::environment(
            format!("cannot take the terminal for the live view: {e}"),
            "pipe the output (| cat) for plain timestamped tables",
        )
    })?;
    session.add_sink(Box::new(view));
    let mut next = tokio::time::Instant::now() + every;
    loop {
        let until = deadline.map_or(next, |d| d.min(next));
        let mut key = None;
        let wait = async {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                k = next_key(&mut keys) => key = Some(k),
            }
        };
        let ended = session.trace_until(wait, interrupts).await?;
        if ended == Ended::Interrupted {
            return Ok(());
        }
        if let Some(key) = key {
            let key = key.map_err(|e| {
                Failure::environment(
                    format!("cannot read keys from the terminal: {e}"),
                    "pipe the output (| cat) for plain timestamped tables",
                )
            })?;
            if session.key(&key)? {
                return Ok(());
            }
            continue;
        }
        let last = deadline == Some(until);
        if until == next || (last && next - until <= every / 2) {
            if session.tick(Vec::new(), interrupts).await? == Ended::Interrupted {
                return Ok(());
            }
            next += every;
        }
        if last {
            return Ok(());
        }
    }
}

/// The next key on the terminal; never when the view is not on one.
async fn next_key(keys: &mut Option<Keys>) -> std::io::Result<crossterm::event::Event> {
    match keys {
        Some(keys) => keys.next().await,
        None => std::future::pending().await,
    }
}

/// What to trace: the part of the command line a [`Session`] needs (`demo` makes its own).
pub struct Request<'a> {
    pub probes: &'a ProbeArgs,
    /// Cgroup paths under the cpu hierarchy; empty = all.
    pub cgroups: Vec<String>,
    /// Processes asked for with `--pid`: the report says what the stops held of each.
    pub pids: Vec<u32>,
    /// Where the report goes; each gets the `start` line as soon as the probes are attached.
    pub sinks: Vec<Box<dyn Sink>>,
    /// The throttling target the advice is for.
    pub target: advice::Target,
}

/// Why [`Session::trace_until`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The `until` future completed.
    Done,
    /// SIGINT, SIGTERM or SIGHUP, or the reader of standard output went away.
    Interrupted,
}

/// What ends a run early: SIGINT, SIGTERM and SIGHUP (a dropped ssh session), caught from the
/// moment this is made until the process exits (tokio keeps its handler installed), so a signal
/// that arrives between two waits is not lost and does not kill the process before it cleans
/// up; and standard output's pipe losing its reader (`| head -1`), seen at once rather than at
/// the next write, which may never come when nothing stops.
pub struct Interrupts {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    /// Standard output, watched for the error a pipe without reader reports; `None` when it
    /// cannot be watched (a regular file, which never loses its reader).
    output: Option<AsyncFd<StdoutFd>>,
}

/// Standard output's descriptor, borrowed for epoll (never closed here).
struct StdoutFd;

impl std::os::fd::AsRawFd for StdoutFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        libc::STDOUT_FILENO
    }
}

impl Interrupts {
    pub fn new() -> Result<Self, Failure> {
        let signal = |kind| {
            tokio::signal::unix::signal(kind).map_err(|e| {
                Failure::environment_without_hint(format!("cannot handle signals: {e}"))
            })
        };
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            // SAFETY: standard output stays open for the life of the process.
            output: unsafe { AsyncFd::register_with_interest(StdoutFd, Interest::ERROR) }.ok(),
        })
    }

    /// The next signal, or the end of standard output's reader.
    pub async fn recv(&mut self) {
        let closed = async {
            match &self.output {
                Some(fd) => loop {
                    match fd.ready(Interest::ERROR).await {
                        Ok(guard) if guard.ready().is_error() => return,
                        Ok(mut guard) => guard.clear_ready(),
                        // Not watchable after all: only the signals end the run.
                        Err(_) => std::future::pending::<()>().await,
                    }
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
            _ = self.hangup.recv() => {}
            () = closed => {}
        }
    }
}

/// One tracing run: probes attached, records flowing into the aggregate, the report started.
pub struct Session {
    probes: Probes,
    reader: Reader,
    aggregate: Aggregate,
    report: Report<'static>,
    hierarchy: Hierarchy,
    sampler: Sampler,
    baseline: Baseline,
    started_ns: u64,
    /// The wall-clock offset the lines are stamped with, checked for steps before each drain.
    clock: Tracker,
}

impl Session {
    /// Checks the machine, attaches the probes, takes the cpu.stat baseline and starts the
    /// report (NDJSON prints its `start` line here).
    pub fn start(request: Request<'_>) -> Result<Self, Failure> {
        privileges::check()?;
        // The loads need aya's parse of the whole kernel BTF: it runs beside the offsets'
        // resolution, which reads the same file for the few types the probes use.
        let path = request.probes.btf.clone();
        let parsing = std::thread::Builder::new()
            .name("kernel BTF".into())
            .spawn(move || KernelBtf::parse(&path));
        let resolved = resolve_offsets(&request.probes.btf)?;
        let mut hierarchy = Hierarchy::discover().map_err(|e| {
            Failure::environment(
                e.to_string(),
                "mount cgroup v2 with the cpu controller, or the cgroup v1 cpu hierarchy",
            )
        })?;
        let filter = cgroup_ids(&hierarchy, &request.cgroups)?;
        let ancestors = Ancestors::of(&hierarchy, &request.cgroups, &filter);
        let kernel_filter: Vec<u64> = filter.iter().copied().chain(ancestors.ids()).collect();
        let kernel_btf = match parsing {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => KernelBtf::parse(&request.probes.btf),
        };
        let mut probes = attach(request.probes, kernel_btf, &resolved, &kernel_filter)?;
        let mut ring = probes.take_events()?;
        let sampler = Sampler::of(&hierarchy);
        let mut baseline = Baseline::take(&sampler, &mut hierarchy);
        let opened = opening::settle(&mut ring, &mut baseline, &sampler, &mut hierarchy);
        let clock = Tracker::start();
        let started_ns = records::monotonic_now_ns();
        let start = describe(&request, &probes, &resolved, &hierarchy, &clock, started_ns);
        let slice_ns = start.bandwidth_slice_ns;
        let report = Report::new(start, request.sinks);
        let mut reader = Reader::new(ring)?;
        reader.intake.traced.ancestors = ancestors;
        let mut session = Self {
            probes,
            reader,
            aggregate: Aggregate::watching(&filter).with_slice(slice_ns),
            report,
            hierarchy,
            sampler,
            baseline,
            started_ns,
            clock,
        };
        session.take_opened(opened);
        Ok(session)
    }

    /// Takes the records drained while the baseline was read, but those of stops the baseline
    /// already holds (`opening`).
    fn take_opened(&mut self, opened: Vec<opening::Drained>) {
        let before = opening::before_window(&opened, &self.baseline);
        for (record, before) in opened.into_iter().zip(before) {
            if !before {
                self.reader.intake.take(
                    record,
                    &mut self.aggregate,
                    &mut self.report,
                    &mut self.hierarchy,
                );
            }
        }
    }

    /// Starts tracing what `tracing` selects (as [`Session::start`]); returns the session and
    /// the cgroups selected now (none when every cgroup is traced).
    pub fn start_selected(
        tracing: &TracingArgs,
        sinks: Vec<Box<dyn Sink>>,
    ) -> Result<(Self, Vec<u64>), Failure> {
        // A machine without a cpu hierarchy selects nothing here; `Session::start` says why.
        let selection = match Hierarchy::discover() {
            Ok(h) => Selection::parse(&h, &tracing.cgroups, &tracing.containers, &tracing.pids)?,
            Err(_) => Selection::default(),
        };
        let mut session = Self::start(Request {
            probes: &tracing.probes,
            cgroups: selection.exact_paths().unwrap_or_default(),
            pids: tracing.pids.clone(),
            sinks,
            target: tracing.target,
        })?;
        let selected = session.select(selection);
        Ok((session, selected))
    }

    /// Applies `selection` in userspace when the kernel-side filter could not (globs, container
    /// ids). Returns the cgroups selected now (none when every cgroup is traced).
    fn select(&mut self, selection: Selection) -> Vec<u64> {
        if selection.is_all() {
            return Vec::new();
        }
        if let Some(paths) = selection.exact_paths() {
            return paths
                .iter()
                .filter_map(|p| self.hierarchy.id_of(p).ok())
                .collect();
        }
        let (filter, selected) = selection.into_filter(&mut self.hierarchy);
        self.reader.intake.traced.filter = Some(filter);
        selected
    }

    /// Keeps no demand for the summary at the end ([`Aggregate::without_demand`]).
    pub fn without_demand(&mut self) {
        self.aggregate.without_demand();
    }

    /// Where this session reads the cgroups' files.
    pub fn sampler(&self) -> Sampler {
        self.sampler.clone()
    }

    /// Adds a sink to the report once the run is under way; it finishes before the others.
    pub fn add_sink(&mut self, sink: Box<dyn Sink>) {
        self.report.add(sink);
    }

    /// Cgroup `id` with its path, if it resolves.
    pub fn cgroup(&mut self, id: u64) -> CgroupRef {
        CgroupRef::new(id, self.hierarchy.path_of(id))
    }

    /// Drops what the aggregate keeps of cgroups `ids` (gone for good), so that a long run's
    /// memory stays bounded.
    pub fn forget(&mut self, ids: Vec<u64>) {
        for id in ids {
            self.aggregate.forget(id);
        }
    }

    /// A key on the terminal, to the report's sinks; true when one of them ends the run.
    pub fn key(&mut self, key: &crossterm::event::Event) -> Result<bool, Failure> {
        self.report.key(key).map_err(write_failed)
    }

    /// A periodic reading for the sinks that show the run as it goes: the aggregate's interval
    /// window, taken now, and the sampler's reading (draining meanwhile) of the cgroups it
    /// names and of `also`.
    pub async fn tick(
        &mut self,
        also: Vec<Target>,
        interrupts: &mut Interrupts,
    ) -> Result<Ended, Failure> {
        self.drain();
        let intervals = self.aggregate.take_interval();
        let mut targets =
            Sampler::targets(&mut self.hierarchy, intervals.iter().map(|i| i.cgroup_id));
        targets.extend(also);
        let Some(snapshot) = self.sample_targets(targets, interrupts).await? else {
            return Ok(Ended::Interrupted);
        };
        let mut paths = HashMap::new();
        for id in intervals.iter().flat_map(|i| {
            std::iter::once(i.cgroup_id).chain(i.by_ancestor.iter().map(|a| a.cgroup_id))
        }) {
            if let Some(path) = self.hierarchy.path_of(id) {
                paths.insert(id, path.to_owned());
            }
        }
        let tick = Tick {
            at: Instant::now(),
            snapshot: &snapshot,
            intervals,
            paths: &paths,
            lost: self.probes.lost()?,
        };
        self.report.tick(&tick).map_err(write_failed)?;
        Ok(Ended::Done)
    }

    /// Reads the files of cgroups `ids` on a blocking thread, draining the ring buffer
    /// meanwhile; `None` if a signal came first.
    pub async fn sample(
        &mut self,
        ids: Vec<u64>,
        interrupts: &mut Interrupts,
    ) -> Result<Option<Snapshot>, Failure> {
        let targets = Sampler::targets(&mut self.hierarchy, ids);
        self.sample_targets(targets, interrupts).await
    }

    async fn sample_targets(
        &mut self,
        targets: Vec<Target>,
        interrupts: &mut Interrupts,
    ) -> Result<Option<Snapshot>, Failure> {
        let sampler = self.sampler.clone();
        let mut snapshot = None;
        let read = async { snapshot = Some(sampler.read(targets).await) };
        let ended = self.trace_until(read, interrupts).await?;
        Ok(snapshot.filter(|_| ended == Ended::Done))
    }

    /// Moves records into the aggregate until `until` completes or a signal arrives.
    pub async fn trace_until(
        &mut self,
        until: impl Future<Output = ()>,
        interrupts: &mut Interrupts,
    ) -> Result<Ended, Failure> {
        tokio::pin!(until);
        let mut tick = tokio::time::interval(DRAIN_INTERVAL);
        loop {
            tokio::select! {
                guard = self.reader.fd.readable_mut() => {
                    let mut guard = guard.map_err(poll_failure)?;
                    guard.clear_ready();
                }
                _ = tick.tick() => {}
                () = interrupts.recv() => return Ok(Ended::Interrupted),
                () = &mut until => return Ok(Ended::Done),
            }
            self.drain();
        }
    }

    /// Takes `bytes` as if the ring buffer had returned them, through the same decode and
    /// aggregate path: `bench-feed`'s generated records.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.reader.intake.take(
            Record::parse(bytes),
            &mut self.aggregate,
            &mut self.report,
            &mut self.hierarchy,
        );
    }

    fn drain(&mut self) {
        if let Some(step) = self.clock.check() {
            warn!(
                "the wall clock was stepped by {:+.6} s: UTC times from now on use the new offset",
                (step.now.offset_ns - step.previous.offset_ns) as f64 / 1e9
            );
            self.report.clock_step(step);
        }
        self.reader
            .drain(&mut self.aggregate, &mut self.report, &mut self.hierarchy);
        self.report.flush();
    }

    /// Ends the trace: the last drain, cpu.stat deltas, the report written. Returns the
    /// per-cgroup reports and totals it printed.
    pub fn finish(mut self) -> Result<(Vec<CgroupReport>, End), Failure> {
        self.drain();
        let now_ns = records::monotonic_now_ns();
        // cpu.stat is read while the probes are still attached, right after the last drain, so a
        // stop is in one and not the other only if it ended in the microseconds between the two.
        let forgotten_demand = self.aggregate.forgotten_demand();
        let summaries = self.aggregate.finish(now_ns);
        let ids = summaries.iter().map(|s| s.cgroup_id);
        let end = self
            .sampler
            .read_now(&Sampler::targets(&mut self.hierarchy, ids));
        let lost = self.probes.lost_by_cgroup()?;
        let reports = report::collect(summaries, &mut self.hierarchy, &self.baseline, &end, &lost);
        let totals = End {
            lost: self.probes.lost()?,
            malformed: self.reader.intake.malformed,
            elapsed_ns: now_ns.saturating_sub(self.started_ns),
            missed_runs: self.probes.missed_runs(),
            evicted_removed_cgroups: self.probes.evicted_removed_cgroups()?,
            forgotten_paths: Some(self.hierarchy.forgotten()),
            forgotten_demand: Some(forgotten_demand),
        };
        drop(self.reader);
        // The report before the programs are detached: a detach can wait on the kernel for
        // tens of seconds (docs/kernel.md §10).
        match self.report.finish(&reports, &totals) {
            // The reader of standard output went away (`| head`): nobody is left to tell, and
            // every other sink (the --record file) has finished.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            result => result.map_err(write_failed)?,
        }
        drop(self.probes);
        Ok((reports, totals))
    }
}

/// The ring buffer and where its records go.
struct Reader {
    fd: AsyncFd<RingBuf<MapData>>,
    intake: Intake,
}

/// What decides where each record goes, and what was wrong with them.
#[derive(Default)]
struct Intake {
    malformed: u64,
    /// Which cgroups' records are kept, and for whom.
    traced: Traced,
}

/// Registering the ring buffer's fd with epoll (or waiting on it) failed. The one cause the
/// user can remove is a full epoll budget; the others (ENOMEM, a runtime shutting down) have
/// no way out to suggest.
fn poll_failure(e: std::io::Error) -> Failure {
    let message = format!("cannot poll the ring buffer: {e}");
    if e.raw_os_error() == Some(libc::ENOSPC) {
        Failure::environment(
            message,
            "this user's epoll watches are used up: raise the sysctl fs.epoll.max_user_watches",
        )
    } else {
        Failure::environment_without_hint(message)
    }
}

impl Reader {
    fn new(ring: RingBuf<MapData>) -> Result<Self, Failure> {
        // SAFETY: the ring buffer owns its map fd and lives inside the AsyncFd until both drop.
        let fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| poll_failure(e.into_parts().1))?;
        Ok(Self {
            fd,
            intake: Intake::default(),
        })
    }

    fn drain(&mut self, aggregate: &mut Aggregate, report: &mut Report, hierarchy: &mut Hierarchy) {
        let ring = self.fd.get_mut();
        while let Some(item) = ring.next() {
            self.intake
                .take(Record::parse(&item), aggregate, report, hierarchy);
        }
    }
}

impl Intake {
    fn take(
        &mut self,
        record: Result<Record, records::RecordError>,
        aggregate: &mut Aggregate,
        report: &mut Report,
        hierarchy: &mut Hierarchy,
    ) {
        match record {
            Ok(Record::Period(period)) => {
                if self.traced.for_itself(period.cgroup_id, hierarchy) {
                    report.period(&period, hierarchy.path_of(period.cgroup_id));
                    aggregate.ingest_period(&period);
                }
            }
            Ok(Record::Deferred(deferred)) => {
                if self.traced.for_itself(deferred.cgroup_id, hierarchy) {
                    report.deferred(&deferred, hierarchy.path_of(deferred.cgroup_id));
                    aggregate.ingest_deferred(&deferred);
                }
            }
            Ok(Record::Stop(event)) => {
                let cgroup_id = event.cgroup_id();
                let resolve = |ids: Vec<u64>, hierarchy: &mut Hierarchy| -> Vec<CgroupRef> {
                    ids.into_iter()
                        .map(|d| CgroupRef::new(d, hierarchy.path_of(d)))
                        .collect()
                };
                if !self.traced.for_itself(cgroup_id, hierarchy) {
                    // No row and no `stop` line: a stop of an ancestor that is not traced
                    // itself counts only for the traced descendants it stopped. Its
                    // `ancestor_stop` line lets a recording rebuild the same report.
                    if let Event::End(end) = &event {
                        let credited = self.traced.credited_descendants(end, hierarchy);
                        if !credited.is_empty() {
                            aggregate.credit_only(end, |d| credited.contains(&d));
                            let credited = resolve(credited, hierarchy);
                            report.ancestor_stop(end, hierarchy.path_of(cgroup_id), &credited);
                        }
                    }
                    return;
                }
                let closed = aggregate.ingest(&event);
                let credited = match &event {
                    Event::End(end) => resolve(end.stop.credited(), hierarchy),
                    _ => Vec::new(),
                };
                report.event(&event, hierarchy.path_of(cgroup_id), closed, &credited);
            }
            Err(e) => {
                self.malformed += 1;
                warn!("malformed record: {e}");
            }
        }
    }
}

/// The kernel offsets the probes need, from the BTF at `path`; refuses a kernel whose
/// `throttle_cfs_rq` the probes cannot read.
fn resolve_offsets(path: &Path) -> Result<btf::Resolved, Failure> {
    let phase = Instant::now();
    let resolved = btf::resolve(path).map_err(|e| {
        Failure::environment(
            e.to_string(),
            "the tracer needs kernel BTF (CONFIG_DEBUG_INFO_BTF=y) at /sys/kernel/btf/vmlinux, \
             or a BTF file given with --btf",
        )
    })?;
    debug!("startup: BTF offsets resolved in {:.1} ms", ms(phase));
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
        "task counts from cfs_rq.{}, queued children from cfs_rq.{}; probe targets with \
         BTF records: {:?}",
        resolved.nr_tasks_field.unwrap_or("(none)"),
        resolved.nr_queued_field.unwrap_or("(none)"),
        resolved.functions
    );
    for disabled in &resolved.disabled {
        warn!("{disabled}; that part of the report is left empty");
    }
    Ok(resolved)
}

/// The ids of the cgroups `--cgroup` named.
fn cgroup_ids(hierarchy: &Hierarchy, paths: &[String]) -> Result<Vec<u64>, Failure> {
    paths
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
        })
}

/// Loads and attaches the programs of the first backend this kernel takes, and says on
/// standard error which backends it refused.
fn attach(
    args: &ProbeArgs,
    kernel_btf: KernelBtf,
    resolved: &btf::Resolved,
    kernel_filter: &[u64],
) -> Result<Probes, Failure> {
    let phase = Instant::now();
    let probes = Probes::attach(
        args.backend,
        kernel_btf,
        &resolved.offsets,
        kernel_filter,
        args.ring_buffer_size,
    )?;
    debug!("startup: probes attached in {:.1} ms", ms(phase));
    // The kernel BTF parsed for the loads is freed now, below the objects that stay: give
    // its pages back, or the idle agent keeps ~8 MB it no longer uses.
    // SAFETY: glibc's malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    if !probes.refused.is_empty() {
        say!(
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
    Ok(probes)
}

/// The `start` line: what is traced, how, and the clocks to read its times by.
fn describe(
    request: &Request<'_>,
    probes: &Probes,
    resolved: &btf::Resolved,
    hierarchy: &Hierarchy,
    clock: &Tracker,
    started_ns: u64,
) -> Start {
    Start {
        tracer_version: env!("CARGO_PKG_VERSION").to_owned(),
        backend: probes.backend.name().to_owned(),
        backend_requested: request.probes.backend.name().to_owned(),
        backend_refused: probes
            .refused
            .iter()
            .map(|r| RefusedBackend {
                backend: r.backend.name().to_owned(),
                reason: r.reason.clone(),
            })
            .collect(),
        kernel: kernel_release(),
        cgroup_version: Some(hierarchy.version()),
        cgroup_root: hierarchy.root().to_owned(),
        cgroups: request.cgroups.clone(),
        pids: request.pids.clone(),
        pid_comms: request
            .pids
            .iter()
            .filter_map(|&pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                Some(PidComm {
                    pid,
                    comm: comm.trim_end().to_owned(),
                })
            })
            .collect(),
        disabled: resolved.disabled.iter().map(ToString::to_string).collect(),
        blind_end_reasons: probes
            .blind_end_reasons
            .iter()
            .map(|r| (*r).to_owned())
            .collect(),
        start_ns: Some(started_ns),
        realtime_offset_ns: Some(clock.in_use().offset_ns),
        utc_offset_s: Some(wallclock::local_utc_offset_s(
            clock.in_use().unix_ns(started_ns),
        )),
        bandwidth_slice_ns: bandwidth_slice_ns(),
        advice_target: Some(request.target),
        ..Start::default()
    }
}

/// `sched_cfs_bandwidth_slice_us` in ns; `None` when unreadable (no CFS bandwidth control).
fn bandwidth_slice_ns() -> Option<u64> {
    let us = fs::read_to_string("/proc/sys/kernel/sched_cfs_bandwidth_slice_us").ok()?;
    us.trim().parse::<u64>().ok()?.checked_mul(1000)
}
