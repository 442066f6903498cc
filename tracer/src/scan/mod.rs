//! `throttle-tracer scan`: which of this machine's cgroups a CPU quota holds, and how hard, in
//! one reading of the cgroup tree: no eBPF, nothing but read access to cgroupfs (it runs
//! unprivileged wherever the tree is readable). Every cgroup with a quota of its own or under an
//! ancestor's gets a row ([`rows`]) with its effective limit and its cpu.stat counters, over
//! their lifetime or, with `--interval`, as the deltas of a window; the text is a table, `--json`
//! one [`json::Row`] per line. The sampler makes every read.

mod json;
mod rows;

use std::fmt::Write as _;
use std::io::{self, Write as _};

use crate::cgroups::{Hierarchy, Version};
use crate::cli::ScanArgs;
use crate::error::{Failure, say};
use crate::sampler::Sampler;
use crate::units::exact_ms;
use json::{Row, Status};
use rows::Reading;

/// `throttle-tracer scan`.
pub fn run(args: &ScanArgs) -> Result<(), Failure> {
    let hierarchy = Hierarchy::discover().map_err(|e| {
        Failure::environment(
            e.to_string(),
            "scan reads the cgroup hierarchy that holds the cpu controller (cgroup v2 with the \
             cpu controller, or the cgroup v1 cpu hierarchy): mount it, or run where it is",
        )
    })?;
    let sampler = Sampler::of(&hierarchy);
    let read = || {
        // A fresh walk each time: a hierarchy keeps the paths of removed cgroups, and a path
        // made again would have two ids.
        let mut tree = Hierarchy::at(hierarchy.root().to_owned(), hierarchy.version());
        let targets = Sampler::all(&mut tree);
        let snapshot = sampler.read_now(&targets);
        Reading::new(targets, snapshot)
    };
    let first = read();
    let (rows, last) = match args.interval {
        None => (rows::lifetime(&first), first),
        Some(window) => {
            std::thread::sleep(window);
            let second = read();
            (rows::window(&first, &second), second)
        }
    };
    let unreadable = last.unreadable();
    let text = if args.json {
        if !unreadable.is_empty() {
            say!("warning: {}", unreadable_note(&unreadable));
        }
        rows.iter().map(|r| r.to_json() + "\n").collect()
    } else {
        render(&rows, &hierarchy, args.interval.is_some(), &unreadable)
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Failure::stdout("the scan", &e))
}

/// Names the first few of `paths`: a tree can hold thousands, the fix is the same for all.
fn unreadable_note(paths: &[&str]) -> String {
    const NAMED: usize = 3;
    let mut named = paths[..paths.len().min(NAMED)].join(", ");
    if paths.len() > NAMED {
        named += &format!(" and {} more", paths.len() - NAMED);
    }
    format!(
        "{} cgroup(s) could not be read, so their own quota and counters are unknown and any \
         cgroups below them are missing ({named}): run with read access to the whole cgroup tree",
        paths.len()
    )
}

/// The table: the rows present throughout, most throttled first, then the cgroups made or
/// removed during the window, then what the columns mean.
fn render(rows: &[Row], hierarchy: &Hierarchy, window: bool, unreadable: &[&str]) -> String {
    let version = match hierarchy.version() {
        Version::V1 => "cgroup v1",
        Version::V2 => "cgroup v2",
    };
    let span = match rows.first().and_then(|r| r.window_ns) {
        Some(ns) => format!("deltas over {:.2} s", ns as f64 / 1e9),
        None if window => "deltas over the window".to_owned(),
        None => "counters over each cgroup's lifetime".to_owned(),
    };
    let (present, changed): (Vec<&Row>, Vec<&Row>) =
        rows.iter().partition(|r| r.status == Status::Present);
    let mut out = format!(
        "throttle-tracer scan: {} cgroup(s) held by a CPU quota ({version} at {}); {span}\n",
        present.len(),
        hierarchy.root().display()
    );
    if present.is_empty() {
        out.push_str("No cgroup is held by a CPU quota.\n");
    } else {
        table(&mut out, &present);
    }
    for (status, what) in [
        (
            Status::Created,
            "created during the window (not in the figures)",
        ),
        (
            Status::Removed,
            "removed during the window (not in the figures)",
        ),
    ] {
        let list: Vec<String> = changed
            .iter()
            .filter(|r| r.status == status)
            .map(|r| cgroup(r))
            .collect();
        if !list.is_empty() {
            let _ = writeln!(out, "{what}: {}", list.join(", "));
        }
    }
    if !unreadable.is_empty() {
        let _ = writeln!(out, "{}", unreadable_note(unreadable));
    }
    if !present.is_empty() {
        out.push_str(
            "RATE throttled periods / periods of its own quota, or (of its limit's owner); \
             THROTTLED s its cpu.stat throttled time;\n\
             LOCAL s cpu.stat.local: stopped by its own quota or an ancestor's (6.6+); \
             USE its CPU time / what its limit allowed;\n\
             LIMIT the fewest CPUs (quota / period) of a quota on its path to the root, \
             LIMIT OF whose it is. Definitions: docs/definitions.md\n",
        );
    }
    out
}

const HEADER: [&str; 12] = [
    "RATE",
    "PERIODS",
    "THROTTLED",
    "THROTTLED s",
    "LOCAL s",
    "BURSTS",
    "BURST s",
    "USE",
    "QUOTA/PERIOD",
    "LIMIT",
    "LIMIT OF",
    "CGROUP",
];

fn table(out: &mut String, rows: &[&Row]) {
    let cells: Vec<[String; 12]> = std::iter::once(HEADER.map(String::from))
        .chain(rows.iter().map(|r| cells(r)))
        .collect();
    let width = |i: usize| {
        cells
            .iter()
            .map(|c| c[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..HEADER.len()).map(width).collect();
    for c in &cells {
        let mut line = String::new();
        for (i, cell) in c.iter().enumerate() {
            let w = widths[i];
            // Numbers right-aligned, the quota and the paths left.
            let _ = if i < 8 || i == 9 {
                write!(line, "{cell:>w$}  ")
            } else {
                write!(line, "{cell:<w$}  ")
            };
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

fn cells(r: &Row) -> [String; 12] {
    let stat = r.cpu_stat.as_ref();
    let count = |f: fn(&crate::cpustat::CpuStat) -> Option<u64>| {
        stat.and_then(f).map_or("-".into(), |v| v.to_string())
    };
    let secs = |f: fn(&crate::cpustat::CpuStat) -> Option<u64>| {
        stat.and_then(f)
            .map_or("-".into(), |v| format!("{:.3}", v as f64 / 1e9))
    };
    let rate = match (r.throttled_ratio, r.limit.throttled_ratio) {
        (Some(own), _) => format!("{own:.2}"),
        (None, Some(owner)) if !r.limit.own => format!("({owner:.2})"),
        _ => "-".into(),
    };
    let quota = match (r.settings.quota_ns, r.settings.period_ns) {
        (Some(q), Some(p)) => {
            let burst = r.settings.burst_ns.filter(|b| *b > 0);
            format!(
                "{}/{}{}",
                exact_ms(q),
                exact_ms(p),
                burst.map_or(String::new(), |b| format!("+{}", exact_ms(b)))
            )
        }
        _ => "-".into(),
    };
    [
        rate,
        count(|s| Some(s.nr_periods)),
        count(|s| Some(s.nr_throttled)),
        secs(|s| Some(s.throttled_ns)),
        secs(|s| s.local_throttled_ns),
        count(|s| s.nr_bursts),
        secs(|s| s.burst_ns),
        r.use_of_limit.map_or("-".into(), |u| format!("{u:.2}")),
        quota,
        format!("{:.2}", r.limit.cpus),
        if r.limit.own {
            "own".into()
        } else {
            r.limit
                .owner
                .path
                .clone()
                .unwrap_or_else(|| format!("cgroup id {}", r.limit.owner.id))
        },
        cgroup(r),
    ]
}

/// The cgroup's path, with the name users know it by when the path holds one.
fn cgroup(r: &Row) -> String {
    let path = r.cgroup.path.as_deref().unwrap_or("?");
    match r.label() {
        Some(label) if path.rsplit('/').next() != Some(label.as_str()) => {
            format!("{path} ({label})")
        }
        _ => path.to_owned(),
    }
}

/// A quota setting in ms, as short as it is exact: `20ms`, `12.5ms`.
#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use rows::tests::{changed, reading};

    #[test]
    fn the_table_has_a_row_per_held_cgroup_and_lists_what_came_and_went() {
        let h = Hierarchy::at("/sys/fs/cgroup/cpu".into(), Version::V1);
        let text = render(
            &rows::lifetime(&reading(Instant::now(), 1)),
            &h,
            false,
            &["/a", "/b", "/c", "/d"],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("throttle-tracer scan: 4 cgroup(s) held"),
            "{text}"
        );
        assert!(
            lines[0].ends_with("counters over each cgroup's lifetime"),
            "{text}"
        );
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(words(lines[1])[0], "RATE");
        assert_eq!(
            words(lines[2]),
            [
                "0.90",
                "10",
                "9",
                "0.700",
                "-",
                "0",
                "0.000",
                "1.00",
                "20ms/100ms",
                "0.20",
                "own",
                "/tight"
            ]
        );
        // A child without a quota shows its limit owner's rate, in parentheses.
        assert_eq!(
            words(lines[4]),
            [
                "(0.40)", "0", "0", "0.000", "0.060", "0", "0.000", "0.60", "-", "0.50", "/pod",
                "/pod/a"
            ]
        );
        assert!(
            text.contains(
                "4 cgroup(s) could not be read, so their own quota and counters are unknown and \
                 any cgroups below them are missing (/a, /b, /c and 1 more)"
            ),
            "{text}"
        );

        let t0 = Instant::now();
        let text = render(&rows::window(&reading(t0, 1), &changed(t0)), &h, true, &[]);
        assert!(
            text.lines().next().unwrap().ends_with("deltas over 2.00 s"),
            "{text}"
        );
        for line in [
            "created during the window (not in the figures): /pod/new, /tight",
            "removed during the window (not in the figures): /pod/b, /tight",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
        assert!(!text.contains("could not be read"), "{text}");
    }
}
