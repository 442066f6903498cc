//! The live view (`--interval`, `top`): every interval, one row per cgroup stopped in it, the
//! most wall-clock-stopped first. On a terminal each table replaces the last (ANSI clear and
//! home); piped, each is a plain block under a UTC timestamp line, so logs keep them all.
//!
//! Rows read the aggregate's interval window ([`crate::aggregate::IntervalSummary`]: what ended
//! in the interval) and the cgroup's files: cpu.stat and the CPU usage (v2 `usage_usec`; v1
//! `cpuacct.usage` of the same path in the cpuacct hierarchy, which is the cpu hierarchy when
//! they are co-mounted `cpu,cpuacct`; `-` when that cgroup does not exist there) are diffed
//! against this view's previous reading of the same cgroup, so a cgroup's first row has `-`
//! there unless the run selected it at the start.
//!
//! Columns: STOPS/s and GROUP/s, per-CPU stops and group stops per second; P50/P99/MAX of the
//! interval's per-CPU stops; PER-CPU and WALL, per-CPU and wall-clock stopped time in the
//! interval (as in the summary); THROTTLED, cpu.stat nr_throttled / nr_periods over the
//! interval; QUOTA, quota/period(+burst) now; CPU, the group's CPU usage in CPUs; QUOTA OF,
//! whose quota stopped it. WALL can exceed PER-CPU by a stop at the edges: a group stop is final
//! one episode late.
//!
//! A cgroup stopped only by an ancestor's quota (a container in a pod with the limit) gets a
//! row too: its stop columns then count the ancestor's per-CPU stops that stopped its tasks
//! ([`IntervalSummary::ancestor_stops`]), GROUP/s and WALL are `-` (they are the owner's), and
//! QUOTA OF names the owner. A cgroup stopped by both shows its own stops, and QUOTA OF says
//! `own+` the ancestor.
//!
//! On a terminal the keys act at once: `s` cycles the sort key (wall, stops, p99, name), `/`
//! starts a filter (rows whose path or name contain the text; Enter ends it, Esc clears it),
//! Enter shows the log2 histograms of the first row's interval (Enter or Esc: back), `q` quits.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::aggregate::{DurationSummary, IntervalSummary};
use crate::cgroups::{self, Hierarchy, Version};
use crate::cpustat::{self, CpuStat};
use crate::names::Name;
use crate::records::Bandwidth;

use super::histogram::log2_rows;

/// Widest cgroup path column; longer paths push their row right.
const MAX_PATH_COLUMN: usize = 48;

/// One cgroup in one interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub cgroup_id: u64,
    pub path: Option<String>,
    /// What users call it (container, pod, unit), when the path says more than its last part.
    pub name: Option<String>,
    pub interval: IntervalSummary,
    /// cpu.stat (nr_throttled, nr_periods) deltas since the previous reading.
    pub periods: Option<(u64, u64)>,
    /// CPUs used on average since the previous reading.
    pub cpus: Option<f64>,
    pub settings: Option<Bandwidth>,
}

impl Row {
    fn wall_ns(&self) -> u64 {
        self.interval.group_stops.sum_ns
    }

    /// Only an ancestor's quota stopped it in the interval.
    fn by_ancestor_only(&self) -> bool {
        self.interval.stops.count == 0 && self.interval.ancestor_stops.count > 0
    }

    /// The per-CPU stops its stop columns show: its own, or the ancestors' when it has none.
    fn shown(&self) -> &DurationSummary {
        if self.by_ancestor_only() {
            &self.interval.ancestor_stops
        } else {
            &self.interval.stops
        }
    }

    /// `own`, the owner's path (`cgroup id N` unresolved; `+k` more owners), or both.
    fn quota_of(&self) -> String {
        let owners = &self.interval.by_ancestor;
        let first = owners.first().map(|a| {
            let path = a
                .path
                .clone()
                .unwrap_or_else(|| format!("cgroup id {}", a.cgroup_id));
            match owners.len() {
                1 => path,
                n => format!("{path}+{}", n - 1),
            }
        });
        match (self.interval.stops.count > 0, first) {
            (_, None) => "own".into(),
            (false, Some(owner)) => owner,
            (true, Some(owner)) => format!("own+{owner}"),
        }
    }

    /// nr_throttled / nr_periods over the interval.
    pub fn throttled_ratio(&self) -> Option<f64> {
        let (throttled, periods) = self.periods?;
        (periods > 0).then(|| throttled as f64 / periods as f64)
    }
}

/// What the rows are sorted by, largest first (names alphabetically).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    /// Wall-clock stopped time in the interval.
    #[default]
    Wall,
    /// Per-CPU stops in the interval.
    Stops,
    /// p99 of the interval's per-CPU stops.
    P99,
    /// The cgroup path.
    Name,
}

impl SortKey {
    fn next(self) -> Self {
        match self {
            Self::Wall => Self::Stops,
            Self::Stops => Self::P99,
            Self::P99 => Self::Name,
            Self::Name => Self::Wall,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Wall => "wall",
            Self::Stops => "stops",
            Self::P99 => "p99",
            Self::Name => "name",
        }
    }

    fn sort(self, rows: &mut [Row]) {
        let p99 = |r: &Row| r.shown().percentiles.map_or(0, |p| p.p99_ns);
        rows.sort_by(|a, b| {
            match self {
                Self::Wall => b.wall_ns().cmp(&a.wall_ns()),
                Self::Stops => b.shown().count.cmp(&a.shown().count),
                Self::P99 => p99(b).cmp(&p99(a)),
                Self::Name => a.path.cmp(&b.path),
            }
            .then(b.shown().sum_ns.cmp(&a.shown().sum_ns))
            .then(a.cgroup_id.cmp(&b.cgroup_id))
        });
    }
}

/// One refresh: the interval's rows, most wall-clock-stopped first.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub at: SystemTime,
    pub interval: Duration,
    pub rows: Vec<Row>,
}

/// A cgroup's counters at one moment, for the next interval's deltas.
#[derive(Clone, Debug)]
struct Reading {
    at: Instant,
    stat: CpuStat,
    usage_ns: Option<u64>,
}

/// The live view's state between refreshes.
pub struct Live<W: Write = io::Stdout> {
    out: W,
    /// Redraw in place (a terminal) rather than append blocks.
    redraw: bool,
    last_tick: Instant,
    readings: HashMap<u64, Reading>,
    sort: SortKey,
    /// The last table shown, for a redraw in another order.
    last: Option<Table>,
    /// `/` filter text: only rows whose path or name contain it.
    filter: String,
    /// The filter is being typed.
    typing: bool,
    /// The histogram view of the first row instead of the table.
    detail: bool,
    /// cgroup v1: the cpuacct hierarchy's mount (the cpu hierarchy's when co-mounted); `None`:
    /// look in the cgroup's own directory.
    cpuacct: Option<PathBuf>,
}

impl Live<io::Stdout> {
    /// Draws on stdout; in place if it is a terminal.
    pub fn stdout() -> Self {
        use std::io::IsTerminal as _;
        let mut live = Self::to(io::stdout(), io::stdout().is_terminal());
        live.cpuacct = cgroups::v1_mount_of("cpuacct");
        live
    }
}

impl<W: Write> Live<W> {
    fn to(out: W, redraw: bool) -> Self {
        Self {
            out,
            redraw,
            last_tick: Instant::now(),
            readings: HashMap::new(),
            cpuacct: None,
            sort: SortKey::default(),
            last: None,
            filter: String::new(),
            typing: false,
            detail: false,
        }
    }

    /// Takes the counters of `ids` now, so that their first row already has deltas.
    pub fn watch(&mut self, ids: &[u64], hierarchy: &mut Hierarchy) {
        let now = Instant::now();
        for &id in ids {
            if let Some(r) = read(id, hierarchy, self.cpuacct.as_deref(), now) {
                self.readings.insert(id, r);
            }
        }
    }

    /// Builds the interval's table from the aggregate's interval window and the cgroup files.
    pub fn table(&mut self, intervals: Vec<IntervalSummary>, hierarchy: &mut Hierarchy) -> Table {
        let now = Instant::now();
        let interval = now.duration_since(self.last_tick);
        self.last_tick = now;
        let mut rows: Vec<Row> = intervals
            .into_iter()
            .map(|mut interval| {
                let id = interval.cgroup_id;
                for a in &mut interval.by_ancestor {
                    a.path = hierarchy.path_of(a.cgroup_id).map(str::to_owned);
                }
                let path = hierarchy.path_of(id).map(str::to_owned);
                let reading = read(id, hierarchy, self.cpuacct.as_deref(), now);
                let (periods, cpus) = match (self.readings.get(&id), &reading) {
                    (Some(before), Some(after)) => deltas(before, after),
                    _ => (None, None),
                };
                match reading {
                    Some(r) => self.readings.insert(id, r),
                    None => self.readings.remove(&id),
                };
                let settings = path
                    .as_deref()
                    .and_then(|p| hierarchy.dir_of(p).ok())
                    .and_then(|dir| cpustat::read_bandwidth(&dir, hierarchy.version()).ok());
                Row {
                    cgroup_id: id,
                    name: path.as_deref().and_then(friendly_name),
                    path,
                    interval,
                    periods,
                    cpus,
                    settings,
                }
            })
            .collect();
        self.sort.sort(&mut rows);
        Table {
            at: SystemTime::now(),
            interval,
            rows,
        }
    }

    /// Prints the table: replacing the last one on a terminal, appended otherwise.
    pub fn show(&mut self, table: Table) -> io::Result<()> {
        if !self.redraw {
            self.out.write_all(render(&table).as_bytes())?;
            self.last = Some(table);
            return self.out.flush();
        }
        let filter = self.filter.as_str();
        let shown = Table {
            rows: table
                .rows
                .iter()
                .filter(|r| {
                    r.path.as_deref().is_some_and(|p| p.contains(filter))
                        || r.name.as_deref().is_some_and(|n| n.contains(filter))
                })
                .cloned()
                .collect(),
            ..table.clone()
        };
        let text = match shown.rows.first() {
            Some(row) if self.detail => detail(&shown, row),
            _ => render(&shown),
        };
        self.last = Some(table);
        // Home, clear the screen; the keys under the table.
        write!(self.out, "\x1b[H\x1b[2J")?;
        self.out.write_all(text.as_bytes())?;
        let cursor = if self.typing { "_" } else { "" };
        writeln!(
            self.out,
            "sort: {}  filter: {filter}{cursor}  (s: sort; /: filter; Enter: histograms of the \
             first row; q or Ctrl-C: quit with the summary)",
            self.sort.as_str()
        )?;
        self.out.flush()
    }

    /// Acts on a key pressed (see the module doc) and redraws; true when it is `q`.
    pub fn key(&mut self, key: u8) -> io::Result<bool> {
        const ESC: u8 = 0x1b;
        match (self.typing, key) {
            (true, b'\n' | b'\r') => self.typing = false,
            (true, ESC) => {
                self.typing = false;
                self.filter.clear();
            }
            (true, 0x7f | 0x08) => {
                self.filter.pop();
            }
            (true, c) if c.is_ascii_graphic() => self.filter.push(char::from(c)),
            (true, _) => return Ok(false),
            (false, b'q') => return Ok(true),
            (false, b's') => self.sort = self.sort.next(),
            (false, b'/') => {
                self.typing = true;
                self.filter.clear();
            }
            (false, b'\n' | b'\r') => self.detail = !self.detail,
            (false, ESC) => self.detail = false,
            (false, _) => return Ok(false),
        }
        if let Some(mut table) = self.last.take() {
            self.sort.sort(&mut table.rows);
            self.show(table)?;
        }
        Ok(false)
    }
}

/// The cgroup's cpu.stat and CPU usage now; `None` if it cannot be read (gone, or the root of
/// a v2 tree, which has no cpu.stat throttling fields).
fn read(
    id: u64,
    hierarchy: &mut Hierarchy,
    cpuacct: Option<&Path>,
    at: Instant,
) -> Option<Reading> {
    let version = hierarchy.version();
    let path = hierarchy.path_of(id)?.to_owned();
    let dir = hierarchy.dir_of(&path).ok()?;
    let stat = CpuStat::read(&dir, version).ok()?;
    let usage_ns = match version {
        Version::V2 => stat.usage_ns,
        Version::V1 => match cpuacct {
            Some(root) => cpuacct_usage(&root.join(path.trim_start_matches('/'))),
            None => cpuacct_usage(&dir),
        },
    };
    Some(Reading { at, stat, usage_ns })
}

/// v1 `cpuacct.usage` (ns) in the cgroup directory `dir` of the cpuacct hierarchy.
fn cpuacct_usage(dir: &Path) -> Option<u64> {
    fs::read_to_string(dir.join("cpuacct.usage"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn deltas(before: &Reading, after: &Reading) -> (Option<(u64, u64)>, Option<f64>) {
    let periods = after
        .stat
        .since(&before.stat)
        .ok()
        .map(|d| (d.nr_throttled, d.nr_periods));
    let secs = after.at.duration_since(before.at).as_secs_f64();
    let cpus = after
        .usage_ns
        .zip(before.usage_ns)
        .and_then(|(a, b)| a.checked_sub(b))
        .filter(|_| secs > 0.0)
        .map(|used| used as f64 / 1e9 / secs);
    (periods, cpus)
}

/// What users call the cgroup (`docker 0123456789ab`), unless its path's last component says
/// it already.
fn friendly_name(path: &str) -> Option<String> {
    let label = Name::of(path)?.to_string();
    (path.rsplit('/').next() != Some(label.as_str())).then_some(label)
}

/// One table as text: a timestamp line, the header, the rows.
pub fn render(table: &Table) -> String {
    let mut out = String::new();
    let secs = table.interval.as_secs_f64();
    let _ = writeln!(
        out,
        "--- {}  interval {secs:.2}s  {} stopped cgroup(s) ---",
        humantime::format_rfc3339_millis(table.at),
        table.rows.len(),
    );
    if table.rows.is_empty() {
        out.push_str("no cgroup was stopped by its CPU quota in this interval\n\n");
        return out;
    }
    let paths: Vec<String> = table
        .rows
        .iter()
        .map(|r| {
            r.path
                .clone()
                .unwrap_or_else(|| format!("cgroup id {}", r.cgroup_id))
        })
        .collect();
    let owners: Vec<String> = table.rows.iter().map(Row::quota_of).collect();
    let width = |texts: &[String], min| {
        texts
            .iter()
            .map(|t| t.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(min, MAX_PATH_COLUMN)
    };
    let w = width(&paths, 6);
    let ow = width(&owners, 8);
    let _ = writeln!(
        out,
        "{:<w$}  {:>7} {:>7}  {:>9} {:>9} {:>9}  {:>9} {:>9}  {:>9}  {:>18}  {:>5}  {:<ow$}  NAME",
        "CGROUP",
        "STOPS/s",
        "GROUP/s",
        "P50",
        "P99",
        "MAX",
        "PER-CPU",
        "WALL",
        "THROTTLED",
        "QUOTA/PERIOD",
        "CPU",
        "QUOTA OF",
    );
    let per_sec = |n: u64| {
        if secs > 0.0 {
            format!("{:.1}", n as f64 / secs)
        } else {
            "-".into()
        }
    };
    for ((r, path), owner) in table.rows.iter().zip(&paths).zip(&owners) {
        let (stops, groups) = (r.shown(), &r.interval.group_stops);
        let pct = |f: fn(&DurationSummary) -> Option<u64>| f(stops).map_or("-".into(), ns);
        // A group stop is the quota owner's: a row shown by its ancestors' stops has none.
        let group = |v: String| if r.by_ancestor_only() { "-".into() } else { v };
        let _ = writeln!(
            out,
            "{path:<w$}  {:>7} {:>7}  {:>9} {:>9} {:>9}  {:>9} {:>9}  {:>9}  {:>18}  {:>5}  {owner:<ow$}  {}",
            per_sec(stops.count),
            group(per_sec(groups.count)),
            pct(|d| d.percentiles.map(|p| p.p50_ns)),
            pct(|d| d.percentiles.map(|p| p.p99_ns)),
            pct(|d| d.percentiles.map(|p| p.max_ns)),
            ns(stops.sum_ns),
            group(ns(groups.sum_ns)),
            match (r.throttled_ratio(), r.periods) {
                (Some(ratio), Some((t, p))) => format!("{ratio:.2} {t}/{p}"),
                _ => "-".into(),
            },
            r.settings.as_ref().map_or("-".into(), quota),
            r.cpus.map_or("-".into(), |c| format!("{c:.2}")),
            r.name.as_deref().unwrap_or("-"),
        );
    }
    out.push('\n');
    out
}

/// A duration without spaces, so each column stays one word: `812ns`, `35µs`, `80.1ms`, `1.25s`.
fn ns(v: u64) -> String {
    let f = v as f64;
    match v {
        0..1_000 => format!("{v}ns"),
        1_000..1_000_000 => format!("{:.0}µs", f / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}ms", f / 1e6),
        _ => format!("{:.2}s", f / 1e9),
    }
}

/// The histogram view: one row's line of the table, then its interval's log2 histograms.
fn detail(table: &Table, row: &Row) -> String {
    let one = Table {
        rows: vec![row.clone()],
        ..table.clone()
    };
    let mut out = render(&one);
    let mut sections = vec![
        ("per-CPU stop lengths", &row.interval.stops),
        ("group stop lengths", &row.interval.group_stops),
    ];
    if row.interval.ancestor_stops.count > 0 {
        sections.push((
            "ancestors' per-CPU stops (that stopped it)",
            &row.interval.ancestor_stops,
        ));
    }
    for (title, d) in sections {
        let _ = writeln!(out, "{title} in the interval:");
        for line in log2_rows(&d.log2_ms, "ms") {
            let _ = writeln!(out, "{line}");
        }
        out.push('\n');
    }
    out
}

/// `20.0ms/100.0ms`, `+5.0ms` when a burst is set, `max/100.0ms` without a limit.
fn quota(b: &Bandwidth) -> String {
    let mut s = format!(
        "{}/{}",
        b.quota_ns.map_or("max".into(), ns),
        b.period_ns.map_or("?".into(), ns)
    );
    if let Some(burst) = b.burst_ns.filter(|&b| b > 0) {
        let _ = write!(s, "+{}", ns(burst));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Aggregate;
    use crate::records::Event;
    use crate::report::tests::{MS, ended};

    /// Two cgroups through the real aggregate: 4242 stopped 80 ms per 100 ms on one CPU, 7
    /// stopped less but more often.
    fn synthetic() -> Vec<IntervalSummary> {
        let mut agg = Aggregate::watching(&[]).with_intervals(0);
        for i in 0..10 {
            let e = ended(0, i * 100, i * 100 + 80);
            agg.ingest(&Event::Start(e.stop.clone()));
            agg.ingest(&Event::End(e));
        }
        for i in 0..20 {
            let mut e = ended(1, i * 50, i * 50 + 10);
            e.stop.cgroup_id = 7;
            agg.ingest(&Event::Start(e.stop.clone()));
            agg.ingest(&Event::End(e));
        }
        agg.take_interval()
    }

    fn table(rows: Vec<Row>) -> Table {
        Table {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            interval: Duration::from_secs(1),
            rows,
        }
    }

    #[test]
    fn rows_from_a_synthetic_aggregate_most_wall_stopped_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let mut live = Live::to(Vec::new(), false);
        live.last_tick = Instant::now() - Duration::from_secs(1);
        let t = live.table(synthetic(), &mut h);
        let ids: Vec<u64> = t.rows.iter().map(|r| r.cgroup_id).collect();
        assert_eq!(ids, [4242, 7]);
        let top = &t.rows[0];
        // 10 stops; the last group stop is still held back by the aggregate.
        assert_eq!(top.interval.stops.count, 10);
        assert_eq!(top.interval.stops.sum_ns, 800 * MS);
        assert_eq!(top.interval.group_stops.count, 9);
        assert_eq!(top.interval.group_stops.sum_ns, 720 * MS);
        let p = top.interval.stops.percentiles.unwrap();
        assert_eq!(p.max_ns, 80 * MS);
        assert!(p.p50_ns >= 80 * MS && p.p50_ns <= 81 * MS, "{p:?}");
        // No files for these ids: no path, no cpu.stat columns.
        assert_eq!(
            (top.path.as_ref(), top.periods, top.cpus),
            (None, None, None)
        );
    }

    #[test]
    fn cpu_stat_columns_are_deltas_between_readings() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir
            .path()
            .join("docker")
            .join("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
        fs::create_dir_all(&cg).unwrap();
        let write = |periods: u32, throttled: u32, usage: u64| {
            fs::write(
                cg.join("cpu.stat"),
                format!("nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time 0\n"),
            )
            .unwrap();
            fs::write(cg.join("cpuacct.usage"), format!("{usage}\n")).unwrap();
        };
        fs::write(cg.join("cpu.cfs_quota_us"), "20000\n").unwrap();
        fs::write(cg.join("cpu.cfs_period_us"), "100000\n").unwrap();
        write(5, 4, 1_000_000_000);
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let id = h
            .id_of(&format!(
                "/docker/{}",
                cg.file_name().unwrap().to_str().unwrap()
            ))
            .unwrap();
        let mut live = Live::to(Vec::new(), false);
        live.watch(&[id], &mut h);
        live.readings.get_mut(&id).unwrap().at -= Duration::from_secs(1);
        write(15, 14, 1_200_000_000);
        let mut interval = synthetic().remove(0);
        interval.cgroup_id = id;
        let t = live.table(vec![interval], &mut h);
        let r = &t.rows[0];
        assert_eq!(r.periods, Some((10, 10)));
        assert_eq!(r.throttled_ratio(), Some(1.0));
        let cpus = r.cpus.unwrap();
        assert!((0.19..=0.21).contains(&cpus), "{cpus}");
        assert_eq!(r.settings.unwrap().quota_ns, Some(20 * MS));
        assert_eq!(r.name.as_deref(), Some("docker 0123456789ab"));
    }

    #[test]
    fn plain_blocks_have_a_timestamp_header_and_one_line_per_row() {
        let mut rows: Vec<Row> = synthetic()
            .into_iter()
            .map(|interval| Row {
                cgroup_id: interval.cgroup_id,
                path: Some(format!("/cg{}", interval.cgroup_id)),
                name: None,
                interval,
                periods: Some((10, 10)),
                cpus: Some(0.2),
                settings: Some(Bandwidth {
                    quota_ns: Some(20 * MS),
                    period_ns: Some(100 * MS),
                    burst_ns: Some(5 * MS),
                }),
            })
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.interval.group_stops.sum_ns));
        let text = render(&table(rows));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "--- 2027-01-15T08:00:00.000Z  interval 1.00s  2 stopped cgroup(s) ---"
        );
        assert!(
            lines[1].starts_with("CGROUP") && lines[1].ends_with("NAME"),
            "{}",
            lines[1]
        );
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(row[..3], ["/cg4242", "10.0", "9.0"]);
        assert!(lines[2].contains("1.00 10/10"), "{}", lines[2]);
        assert!(lines[2].contains("20.0ms/100.0ms+5.0ms"), "{}", lines[2]);
        assert!(lines[2].contains(" 0.20  own       -"), "{}", lines[2]);
        assert!(lines[3].starts_with("/cg7 "), "{}", lines[3]);
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(lines[4], "");

        let empty = render(&table(Vec::new()));
        assert!(empty.contains("0 stopped cgroup(s)") && empty.contains("no cgroup was stopped"));

        let mut live = Live::to(Vec::new(), true);
        live.show(table(Vec::new())).unwrap();
        assert!(live.out.starts_with(b"\x1b[H\x1b[2J---"));
        assert!(String::from_utf8_lossy(&live.out).contains("sort: wall  filter:   (s: sort;"));
    }

    #[test]
    fn a_child_stopped_by_its_parents_quota_has_a_row_naming_the_parent() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("pod/ctr")).unwrap();
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let (pod, ctr) = (h.id_of("/pod").unwrap(), h.id_of("/pod/ctr").unwrap());
        let mut agg = Aggregate::watching(&[]).with_intervals(0);
        for i in 0..4u32 {
            let mut e = ended(i % 2, u64::from(i) * 100, u64::from(i) * 100 + 40);
            e.stop.cgroup_id = pod;
            e.stop.children = vec![ctr];
            agg.credit_only(&e, |d| d == ctr);
        }
        let mut live = Live::to(Vec::new(), true);
        live.last_tick = Instant::now() - Duration::from_secs(1);
        let t = live.table(agg.take_interval(), &mut h);
        assert_eq!(
            t.rows.len(),
            1,
            "no row for the parent, taken only for its child"
        );
        let r = &t.rows[0];
        assert_eq!((r.cgroup_id, r.quota_of().as_str()), (ctr, "/pod"));
        let text = render(&t);
        let row: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        // STOPS/s GROUP/s P50 P99 MAX PER-CPU WALL: the parent's stops that stopped it.
        assert_eq!(row[0], "/pod/ctr");
        assert_eq!(row[2], "-", "{text}");
        assert_eq!(row[5..8], ["40.0ms", "160.0ms", "-"], "{text}");
        assert!(text.contains(" /pod  "), "{text}");
        live.show(t).unwrap();
        live.key(b'\r').unwrap();
        let s = String::from_utf8_lossy(&live.out);
        assert!(
            s.contains("ancestors' per-CPU stops (that stopped it)"),
            "{s}"
        );
    }

    #[test]
    fn sort_keys_reorder_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let mut live = Live::to(Vec::new(), false);
        let t = live.table(synthetic(), &mut h);
        let order = |t: &Table| t.rows.iter().map(|r| r.cgroup_id).collect::<Vec<_>>();
        assert_eq!(order(&t), [4242, 7], "wall");
        live.show(t).unwrap();
        let mut orders = Vec::new();
        for _ in 0..4 {
            assert!(!live.key(b's').unwrap());
            orders.push((live.sort, order(live.last.as_ref().unwrap())));
        }
        assert_eq!(
            orders,
            [
                (SortKey::Stops, vec![7, 4242]),
                (SortKey::P99, vec![4242, 7]),
                (SortKey::Name, vec![4242, 7]), // no paths: by stopped time
                (SortKey::Wall, vec![4242, 7]),
            ]
        );
    }

    #[test]
    fn filter_and_histogram_keys_on_a_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let mut live = Live::to(Vec::new(), true);
        let mut t = live.table(synthetic(), &mut h);
        t.rows[0].path = Some("/web".into());
        t.rows[1].path = Some("/batch".into());
        live.show(t).unwrap();
        let screen = |live: &mut Live<Vec<u8>>| {
            let out = String::from_utf8(std::mem::take(&mut live.out)).unwrap();
            out.rsplit("\x1b[2J").next().unwrap().to_owned()
        };
        for k in *b"/bat" {
            assert!(!live.key(k).unwrap());
        }
        let s = screen(&mut live);
        assert!(
            s.contains("filter: bat_") && s.contains("/batch") && !s.contains("/web"),
            "{s}"
        );
        live.key(b'\r').unwrap();
        let s = screen(&mut live);
        assert!(
            s.contains("filter: bat ") && !s.contains("stop lengths"),
            "{s}"
        );
        live.key(b'\r').unwrap();
        let s = screen(&mut live);
        assert!(s.contains("per-CPU stop lengths in the interval:"), "{s}");
        assert!(s.contains("8 -> 15"), "the 10 ms stops of /batch: {s}");
        live.key(0x1b).unwrap();
        live.key(b'/').unwrap();
        live.key(0x1b).unwrap();
        let s = screen(&mut live);
        assert!(
            s.contains("/web") && s.contains("/batch") && !s.contains("lengths"),
            "{s}"
        );
        assert!(live.key(b'q').unwrap());
    }
}
