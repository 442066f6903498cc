//! The live view as text: each table a plain block under a UTC timestamp line (what is printed
//! when stdout is not a terminal, so logs keep them all), the cells both views show, and a
//! row's log2 histograms.

use std::fmt::Write as _;

use crate::aggregate::DurationSummary;
use crate::records::Bandwidth;
use crate::report::histogram::log2_rows;
use crate::units::compact;

use super::rows::{Row, Table};

/// Widest cgroup path (and QUOTA OF) column; longer texts push their row right.
pub(super) const MAX_PATH_COLUMN: usize = 48;

/// The columns, in order; the text of each for a row is [`cells`].
pub(super) const HEADER: [&str; COLUMNS] = [
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
    "MAX RUN",
    "QUOTA OF",
    "NAME",
];
pub(super) const COLUMNS: usize = 14;
/// Where CGROUP and QUOTA OF are in [`HEADER`]: the columns whose width follows their text.
pub(super) const PATH: usize = 0;
pub(super) const OWNER: usize = 12;

/// `--- 2026-11-29T22:50:01.123Z  interval 1.00s  1 stopped cgroup(s)  23:50:01.123 local ---`
pub(super) fn title(table: &Table) -> String {
    format!(
        "--- {}  interval {:.2}s  {} stopped cgroup(s)  {} local ---",
        humantime::format_rfc3339_millis(table.at),
        table.interval.as_secs_f64(),
        table.rows.len(),
        local_time_of_day(table.at),
    )
}

fn local_time_of_day(at: std::time::SystemTime) -> String {
    let unix_ns = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    crate::wallclock::local_time_of_day_ms(unix_ns)
}

/// Shown instead of the header when nothing was stopped.
pub(super) const NOTHING_STOPPED: &str = "no cgroup was stopped by its CPU quota in this interval";

/// One row's text in each column of [`HEADER`], for an interval of `secs`.
pub(super) fn cells(r: &Row, secs: f64) -> [String; COLUMNS] {
    let per_sec = |n: u64| {
        if secs > 0.0 {
            format!("{:.1}", n as f64 / secs)
        } else {
            "-".into()
        }
    };
    let (stops, groups) = (r.shown(), &r.interval.group_stops);
    let pct = |f: fn(&DurationSummary) -> Option<u64>| f(stops).map_or("-".into(), compact);
    // A group stop is the quota owner's: a row shown by its ancestors' stops has none.
    let group = |v: String| if r.by_ancestor_only() { "-".into() } else { v };
    [
        r.path
            .clone()
            .unwrap_or_else(|| format!("cgroup id {}", r.cgroup_id)),
        per_sec(stops.count),
        group(per_sec(groups.count)),
        pct(|d| d.percentiles.map(|p| p.p50_ns)),
        pct(|d| d.percentiles.map(|p| p.p99_ns)),
        pct(|d| d.percentiles.map(|p| p.max_ns)),
        compact(stops.sum_ns),
        group(compact(groups.sum_ns)),
        match (r.throttled_ratio(), r.periods) {
            (Some(ratio), Some((t, p))) => format!("{ratio:.2} {t}/{p}"),
            _ => "-".into(),
        },
        r.settings.as_ref().map_or("-".into(), quota),
        r.cpus.map_or("-".into(), |c| format!("{c:.2}")),
        r.interval
            .largest_run
            .map_or("-".into(), |run| compact(run.demand_ns)),
        r.quota_of(),
        r.name.clone().unwrap_or_else(|| "-".into()),
    ]
}

/// The widest text of column `i` among `rows`, at least `min`, at most [`MAX_PATH_COLUMN`].
pub(super) fn width<const N: usize>(rows: &[[String; N]], i: usize, min: usize) -> usize {
    rows.iter()
        .map(|c| c[i].chars().count())
        .max()
        .unwrap_or(0)
        .clamp(min, MAX_PATH_COLUMN)
}

/// One table as text: a timestamp line, the header, the rows.
pub fn render(table: &Table) -> String {
    let mut out = title(table);
    out.push('\n');
    if table.rows.is_empty() {
        let _ = writeln!(out, "{NOTHING_STOPPED}\n");
        return out;
    }
    let secs = table.interval.as_secs_f64();
    let rows: Vec<[String; COLUMNS]> = table.rows.iter().map(|r| cells(r, secs)).collect();
    let w = width(&rows, PATH, 6);
    let ow = width(&rows, OWNER, 8);
    for c in std::iter::once(HEADER.map(String::from)).chain(rows) {
        let _ = writeln!(
            out,
            "{:<w$}  {:>7} {:>7}  {:>9} {:>9} {:>9}  {:>9} {:>9}  {:>9}  {:>18}  {:>5}  {:>7}  {:<ow$}  {}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13],
        );
    }
    out.push('\n');
    out
}

/// The per-process table of `rows` (the live view's `p` key): one line per process their
/// stops held in the interval, most held first, with its cgroup, stops, held time, p99 wait
/// and its threads (tid:held, most held first).
pub(super) fn processes(rows: &[&Row]) -> String {
    let mut lines: Vec<(u64, [String; 7])> = rows
        .iter()
        .flat_map(|r| {
            let path = cells(r, 0.0)[PATH].clone();
            r.interval.held.processes.iter().map(move |p| {
                let threads: Vec<String> = p
                    .threads
                    .iter()
                    .map(|t| format!("{}:{}", t.tid, compact(t.held_ns)))
                    .collect();
                let p99 = p
                    .waits
                    .percentiles
                    .map_or_else(|| "-".into(), |q| compact(q.p99_ns));
                (
                    p.waits.sum_ns,
                    [
                        p.pid.to_string(),
                        p.comm.clone(),
                        p.waits.count.to_string(),
                        compact(p.waits.sum_ns),
                        p99,
                        path.clone(),
                        threads.join(" "),
                    ],
                )
            })
        })
        .collect();
    if lines.is_empty() {
        return "no stop in the interval named a thread\n".to_owned();
    }
    lines.sort_by_key(|l| std::cmp::Reverse(l.0));
    let header = [
        "PID",
        "COMM",
        "STOPS",
        "HELD",
        "P99 WAIT",
        "CGROUP",
        "THREADS (tid:held)",
    ]
    .map(String::from);
    let cells: Vec<[String; 7]> = std::iter::once(header)
        .chain(lines.into_iter().map(|(_, c)| c))
        .collect();
    let cw = width(&cells, 1, 4);
    let gw = width(&cells, 5, 6);
    let mut out = String::new();
    for c in cells {
        let _ = writeln!(
            out,
            "{:>7}  {:<cw$}  {:>5}  {:>9}  {:>9}  {:<gw$}  {}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6]
        );
    }
    out
}

/// The log2 histograms of one row's interval: its per-CPU and group stop lengths, and the
/// ancestors' stops that stopped it when there were some.
pub(super) fn histograms(row: &Row) -> String {
    let mut out = String::new();
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
        b.quota_ns.map_or("max".into(), compact),
        b.period_ns.map_or("?".into(), compact)
    );
    if let Some(burst) = b.burst_ns.filter(|&b| b > 0) {
        let _ = write!(s, "+{}", compact(burst));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::live::rows::tests::{synthetic, table};
    use crate::testing::MS;

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
        rows[0].interval.largest_run = Some(crate::aggregate::Run {
            demand_ns: 80 * MS,
            ..crate::aggregate::Run::default()
        });
        let text = render(&table(rows));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            format!(
                "--- 2027-01-15T08:00:00.000Z  interval 1.00s  2 stopped cgroup(s)  {} local ---",
                local_time_of_day(table(vec![]).at)
            )
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
        assert!(
            lines[2].contains(" 0.20   80.0ms  own       -"),
            "{}",
            lines[2]
        );
        assert!(lines[3].starts_with("/cg7 "), "{}", lines[3]);
        assert!(lines[3].contains(" 0.20        -  own "), "{}", lines[3]);
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(lines[4], "");

        let empty = render(&table(Vec::new()));
        assert!(empty.contains("0 stopped cgroup(s)") && empty.contains("no cgroup was stopped"));
    }
}
