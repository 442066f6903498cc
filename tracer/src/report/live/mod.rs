//! The live view (`--interval`, `top`): every interval, one row per cgroup stopped in it, the
//! most wall-clock-stopped first. On a terminal ([`tui`]) the table is redrawn in place on the
//! alternate screen, with a selectable row and keys; piped ([`plain`]), each table is a plain
//! block under a UTC timestamp line, so logs keep them all. The rows themselves are [`rows`];
//! what each column means, a cgroup stopped by an ancestor's quota too, is docs/definitions.md's.
mod plain;
mod rows;
mod tui;

use std::io::{self, IsTerminal as _, Write as _};

use crossterm::event::Event;

use super::CgroupReport;
use super::sink::{Entry, Sink, Tick};
use crate::sampler::Snapshot;
use crate::schema::{End, Start};
use crate::terminal::{Keys, Screen};

use tui::View;

pub use rows::{Live, Table};

/// The live view as a sink of the report: a table at every tick, keys acted on at once.
pub struct LiveView {
    rows: Live,
    output: Output,
}

impl LiveView {
    /// Takes the terminal if stdout is one (and its keys, returned), plain blocks otherwise;
    /// `watched` is the selected cgroups' reading at the start, so that their first row already
    /// has deltas.
    pub fn stdout(watched: Snapshot) -> io::Result<(Self, Option<Keys>)> {
        let mut rows = Live::default();
        rows.watch(watched);
        let output = Output::stdout()?;
        let keys = matches!(output.0, Kind::Terminal(_)).then(Keys::default);
        Ok((Self { rows, output }, keys))
    }
}

impl Sink for LiveView {
    fn takes_lines(&self) -> bool {
        false
    }

    fn line(&mut self, _: &Entry) {}

    fn tick(&mut self, tick: &Tick) -> io::Result<()> {
        let table = self
            .rows
            .table(tick.at, &tick.intervals, tick.snapshot, tick.paths);
        self.output.show(table)
    }

    fn key(&mut self, key: &Event) -> io::Result<bool> {
        self.output.event(key)
    }

    /// Gives the terminal back (the report finishes this sink first, before the summary).
    fn finish(self: Box<Self>, _: &Start, _: &[CgroupReport], _: &End) -> io::Result<()> {
        Ok(())
    }
}

/// Where the tables go: the terminal, or plain blocks on stdout.
struct Output(Kind);

enum Kind {
    Plain(io::Stdout),
    /// Boxed: one per run, much larger than stdout's handle.
    Terminal(Box<(Screen, View)>),
}

impl Output {
    /// The terminal if stdout is one (taken until this drops), plain blocks otherwise.
    fn stdout() -> io::Result<Self> {
        if !io::stdout().is_terminal() {
            return Ok(Self(Kind::Plain(io::stdout())));
        }
        let (mut screen, mut view) = (Screen::open()?, View::default());
        screen.draw(|frame| view.draw(frame))?;
        Ok(Self(Kind::Terminal(Box::new((screen, view)))))
    }

    /// Shows the interval's table.
    fn show(&mut self, table: Table) -> io::Result<()> {
        match &mut self.0 {
            Kind::Plain(out) => {
                out.write_all(plain::render(&table).as_bytes())?;
                out.flush()
            }
            Kind::Terminal(terminal) => {
                let (screen, view) = &mut **terminal;
                view.show(table);
                screen.draw(|frame| view.draw(frame))
            }
        }
    }

    /// Acts on `event` and redraws; true when it ends the run.
    fn event(&mut self, event: &Event) -> io::Result<bool> {
        let Kind::Terminal(terminal) = &mut self.0 else {
            return Ok(false);
        };
        let (screen, view) = &mut **terminal;
        if view.event(event) {
            return Ok(true);
        }
        screen.draw(|frame| view.draw(frame)).map(|()| false)
    }
}
