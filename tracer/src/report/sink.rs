//! Where the report's output goes: a [`Sink`] takes the run's [`Line`]s as they happen (each with
//! its [`Entry`]), the periodic [`Tick`]s and the terminal's keys, and writes its end. [`Ndjson`],
//! [`Text`] and [`AdviceOnly`] are here; the live view and the exporter are sinks too. A write
//! error does not end the run (a closed `| head` must not lose the recording): the sink keeps the
//! first, skips later writes and returns it from [`Sink::finish`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, LineWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crossterm::event::Event as Key;

use super::{CgroupReport, advice_text, text};
use crate::aggregate::IntervalSummary;
use crate::error::Failure;
use crate::sampler::Snapshot;
use crate::schema::{CgroupRef, End, Line, Start};

/// One record of the run as the sinks get it: its line, and what the aggregate made of it.
pub struct Entry<'a> {
    pub line: &'a Line,
    /// The length of the group stop (the union of the cgroup's overlapping per-CPU stops) that
    /// the aggregate closed for good on this record.
    pub group_stop_ns: Option<u64>,
    /// The traced descendants an ended stop stopped (a quota owner's children, or the
    /// descendants an `ancestor_stop` is kept for), with their paths.
    pub credited: &'a [CgroupRef],
}

/// A periodic reading of a run that shows itself as it goes: the live view's interval, `serve`'s
/// refresh.
pub struct Tick<'a> {
    pub at: Instant,
    /// The sampler's reading of the cgroups the tick is for.
    pub snapshot: &'a Snapshot,
    /// The aggregate's interval window, taken now (empty unless the aggregate keeps one).
    pub intervals: Vec<IntervalSummary>,
    /// The paths of the cgroups the intervals name (their own and their quota owners').
    pub paths: &'a HashMap<u64, String>,
    /// The kernel's count of records lost so far.
    pub lost: u64,
}

/// One destination of the report.
pub trait Sink: Send {
    /// Whether it takes the lines as they happen; the report makes a line only if a sink does.
    fn takes_lines(&self) -> bool;
    /// Whether it takes the `stop_begin` lines too, half of all records' lines, which only a
    /// rebuild of the report needs: they are made only if a sink does.
    fn takes_stop_begins(&self) -> bool {
        self.takes_lines()
    }
    /// One record's line.
    fn line(&mut self, entry: &Entry);
    /// The end of a batch of records (a drain of the ring buffer): a sink that holds their
    /// lines back writes them now.
    fn flush(&mut self) {}
    /// A periodic reading; most sinks only write at the end.
    fn tick(&mut self, _tick: &Tick) -> io::Result<()> {
        Ok(())
    }
    /// A key press or resize on the terminal; true when it ends the run.
    fn key(&mut self, _key: &Key) -> io::Result<bool> {
        Ok(false)
    }
    /// The end of the run; returns the first write error of the run.
    fn finish(
        self: Box<Self>,
        start: &Start,
        reports: &[CgroupReport],
        totals: &End,
    ) -> io::Result<()>;
}

/// The NDJSON stream (`--json` on stdout, or every line into a `--record` file), flushed as it
/// goes, so that a killed run leaves the lines it made.
pub struct Ndjson<W: Write> {
    out: W,
    /// The stream on stdout shows the ended stops not under `--min-stop` (ns) and leaves off
    /// the `stop_begin` lines, which only a rebuild of the report needs; `None`: a recording,
    /// which keeps every line so that it rebuilds the whole summary.
    shown: Option<u64>,
    /// The recording's file, named in its write errors.
    file: Option<PathBuf>,
    failed: Option<io::Error>,
    /// The line being written, kept for the next.
    buffer: Vec<u8>,
}

impl Ndjson<BufWriter<io::Stdout>> {
    /// `--json`: NDJSON on stdout, without stops shorter than `min_stop_ns`. The lines of a
    /// batch of records go out together at its end ([`Sink::flush`]), every other line at
    /// once: a write per line was a tenth of the time of a line.
    pub fn stdout(min_stop_ns: u64) -> Self {
        Self::to(
            BufWriter::with_capacity(64 * 1024, io::stdout()),
            Some(min_stop_ns),
        )
    }
}

impl Ndjson<LineWriter<File>> {
    /// `--record FILE`: creates `path` (or empties it), for every line of the run.
    pub fn recording(path: &Path) -> Result<Self, Failure> {
        let file = File::create(path).map_err(|e| {
            Failure::usage(
                format!("cannot create the recording {}: {e}", path.display()),
                "--record takes the path of a file to write, in a directory that exists",
            )
        })?;
        let mut sink = Self::to(LineWriter::new(file), None);
        sink.file = Some(path.to_owned());
        Ok(sink)
    }
}

impl<W: Write> Ndjson<W> {
    /// NDJSON into `out`: the lines a `--json` stream shows if `shown` is the minimum stop
    /// length, every line if it is `None`.
    pub fn to(out: W, shown: Option<u64>) -> Self {
        Self {
            out,
            shown,
            file: None,
            failed: None,
            buffer: Vec::new(),
        }
    }

    fn shows(&self, line: &Line) -> bool {
        let Some(min_stop_ns) = self.shown else {
            return true;
        };
        match line {
            Line::StopBegin(_) => false,
            Line::Stop(s) | Line::AncestorStop(crate::schema::AncestorStop { stop: s, .. }) => {
                s.end_ns.saturating_sub(s.started.start_ns) >= min_stop_ns
            }
            _ => true,
        }
    }
}

impl<W: Write + Send> Sink for Ndjson<W> {
    fn takes_lines(&self) -> bool {
        true
    }

    fn takes_stop_begins(&self) -> bool {
        self.shown.is_none()
    }

    fn line(&mut self, entry: &Entry) {
        if self.failed.is_some() || !self.shows(entry.line) {
            return;
        }
        self.buffer.clear();
        entry.line.write_json(&mut self.buffer);
        self.buffer.push(b'\n');
        let record = matches!(
            entry.line,
            Line::StopBegin(_)
                | Line::Stop(_)
                | Line::AncestorStop(_)
                | Line::UnseenStartStop(_)
                | Line::Period(_)
                | Line::Deferred(_)
        );
        let written = self.out.write_all(&self.buffer);
        if let Err(e) = written.and_then(|()| if record { Ok(()) } else { self.out.flush() }) {
            self.failed = Some(e);
        }
    }

    fn flush(&mut self) {
        if self.failed.is_none()
            && let Err(e) = self.out.flush()
        {
            self.failed = Some(e);
        }
    }

    fn finish(mut self: Box<Self>, _: &Start, _: &[CgroupReport], _: &End) -> io::Result<()> {
        let result = match self.failed.take() {
            Some(e) => Err(e),
            None => self.out.flush(),
        };
        match &self.file {
            Some(file) => result.map_err(|e| {
                io::Error::new(e.kind(), format!("the recording {}: {e}", file.display()))
            }),
            None => result,
        }
    }
}

/// The text summary, written at the end.
pub struct Text<W: Write> {
    out: W,
}

impl Text<io::Stdout> {
    pub fn stdout() -> Self {
        Self::to(io::stdout())
    }
}

impl<W: Write> Text<W> {
    pub fn to(out: W) -> Self {
        Self { out }
    }
}

impl<W: Write + Send> Sink for Text<W> {
    fn takes_lines(&self) -> bool {
        false
    }

    fn line(&mut self, _: &Entry) {}

    fn finish(
        mut self: Box<Self>,
        start: &Start,
        reports: &[CgroupReport],
        totals: &End,
    ) -> io::Result<()> {
        self.out
            .write_all(text::render(start, reports, totals).as_bytes())?;
        self.out.flush()
    }
}

/// `throttle-tracer advise`: only the advice, as its `advice` NDJSON lines (`json`) or as the
/// text report's advice blocks under a line that says what the trace covered.
pub struct AdviceOnly<W: Write> {
    out: W,
    json: bool,
    failed: Option<io::Error>,
}

impl AdviceOnly<io::Stdout> {
    pub fn stdout(json: bool) -> Self {
        Self::to(io::stdout(), json)
    }
}

impl<W: Write> AdviceOnly<W> {
    pub fn to(out: W, json: bool) -> Self {
        Self {
            out,
            json,
            failed: None,
        }
    }
}

impl<W: Write + Send> Sink for AdviceOnly<W> {
    fn takes_lines(&self) -> bool {
        self.json
    }

    fn line(&mut self, entry: &Entry) {
        if self.failed.is_none()
            && matches!(entry.line, Line::Advice(_))
            && let Err(e) = writeln!(self.out, "{}", entry.line.to_json())
        {
            self.failed = Some(e);
        }
    }

    fn finish(
        mut self: Box<Self>,
        start: &Start,
        reports: &[CgroupReport],
        totals: &End,
    ) -> io::Result<()> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if !self.json {
            let text = advice_text::standalone(start, reports, totals);
            self.out.write_all(text.as_bytes())?;
        }
        self.out.flush()
    }
}
