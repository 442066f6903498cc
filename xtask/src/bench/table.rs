//! The bench's one table: every figure with its unit, its number of runs, min / median / max,
//! and its ratio to a reference measured in the same run; printed, and written as JSON.
use serde_json::{Value, json};
use std::fmt::Write as _;

/// min / median / max (and mean, stddev) of some runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub mean: f64,
    pub stddev: f64,
}

impl Summary {
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => v[n / 2],
            _ => f64::midpoint(v[n / 2 - 1], v[n / 2]),
        };
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n.max(2) - 1) as f64;
        Self {
            n,
            min: v.first().copied().unwrap_or(f64::NAN),
            median,
            max: v.last().copied().unwrap_or(f64::NAN),
            mean,
            stddev: var.sqrt(),
        }
    }

    /// The half-width of the mean's 95 % confidence interval (Student's t).
    pub fn ci95(&self) -> f64 {
        if self.n < 2 {
            return f64::NAN;
        }
        t975(self.n - 1) * self.stddev / (self.n as f64).sqrt()
    }
}

/// The 95 % confidence interval of the median of `values` that needs no assumption on their
/// distribution (the sign test's): the k-th smallest and the k-th largest, k the largest for
/// which fewer than k of n values fall below the median with probability at most 2.5 %. None
/// below 6 values, where no such k exists.
pub fn median_ci95(values: &[f64]) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    // P(B < k) for B ~ Binomial(n, 1/2), summed term by term.
    let (mut term, mut below, mut k) = (0.5_f64.powi(i32::try_from(n).ok()?), 0.0, 0);
    while k < n / 2 && below + term <= 0.025 {
        below += term;
        term *= (n - k) as f64 / (k + 1) as f64;
        k += 1;
    }
    (k > 0).then(|| (v[k - 1], v[n - k]))
}

/// Student's t two-sided 95 % quantile for `df` degrees of freedom: a table up to 10, then the
/// Cornish-Fisher expansion around the normal's 1.96 (within 0.0002 of the exact value there;
/// the normal's alone would make 20 rounds' interval 6 % too narrow).
fn t975(df: usize) -> f64 {
    const T: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    if let Some(&t) = T.get(df.wrapping_sub(1)) {
        return t;
    }
    let (z, v) = (1.959_964_f64, df as f64);
    z + (z.powi(3) + z) / (4.0 * v)
        + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * v.powi(2))
        + (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / (384.0 * v.powi(3))
}

/// One line of the table.
pub struct Row {
    pub section: &'static str,
    pub name: String,
    pub unit: &'static str,
    pub value: Summary,
    /// What the figure is compared with, and its median from the same run.
    pub reference: Option<(String, f64)>,
    pub note: String,
}

impl Row {
    pub fn new(
        section: &'static str,
        name: impl Into<String>,
        unit: &'static str,
        values: &[f64],
    ) -> Self {
        Self {
            section,
            name: name.into(),
            unit,
            value: Summary::of(values),
            reference: None,
            note: String::new(),
        }
    }

    pub fn against(mut self, reference: impl Into<String>, median: f64) -> Self {
        self.reference = Some((reference.into(), median));
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    fn ratio(&self) -> Option<f64> {
        self.reference
            .as_ref()
            .map(|(_, r)| self.value.median / r)
            .filter(|r| r.is_finite())
    }
}

pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Row>,
}

impl Table {
    /// Markdown: the run's header lines, then every row.
    pub fn render(&self) -> String {
        markdown(&self.json())
    }

    pub fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "section": r.section,
                    "figure": r.name,
                    "unit": r.unit,
                    "runs": r.value.n,
                    "min": finite(r.value.min),
                    "median": finite(r.value.median),
                    "max": finite(r.value.max),
                    "reference": r.reference.as_ref().map(|(n, _)| n),
                    "reference_median": r.reference.as_ref().map(|(_, m)| finite(*m)),
                    "ratio": r.ratio(),
                    "note": r.note,
                })
            })
            .collect();
        json!({ "header": self.header, "rows": rows })
    }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// A table's JSON (what [`Table::json`] wrote, or target/bench/bench.json) as markdown: its
/// header lines, then every row.
pub fn markdown(table: &Value) -> String {
    let rows: Vec<&Value> = table["rows"].as_array().into_iter().flatten().collect();
    header(table) + "\n" + &rows_markdown(&rows)
}

/// The run's header lines (its command, machine and load), each ending in a markdown break.
fn header(table: &Value) -> String {
    let mut s = String::new();
    for line in table["header"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "{}  ", line.as_str().unwrap_or_default());
    }
    s
}

/// A table's JSON as one (heading, markdown) per section, in the order the rows come, each
/// with the run's header lines, and without the rows of a section that failed: what
/// docs/results/bench.md holds.
pub fn sections(table: &Value) -> Vec<(String, String)> {
    let mut sections: Vec<(String, Vec<&Value>)> = Vec::new();
    for row in table["rows"].as_array().into_iter().flatten() {
        let section = row["section"].as_str().unwrap_or_default();
        if section == "failed" {
            continue;
        }
        match sections.iter_mut().find(|(s, _)| s == section) {
            Some((_, rows)) => rows.push(row),
            None => sections.push((section.to_owned(), vec![row])),
        }
    }
    sections
        .into_iter()
        .map(|(section, rows)| (section, header(table) + "\n" + &rows_markdown(&rows)))
        .collect()
}

/// The rows as a markdown table, a bold line at the start of each section.
fn rows_markdown(rows: &[&Value]) -> String {
    let mut s = String::from(
        "| figure | unit | runs | min | median | max | reference (same run) | ratio | note |\n\
         |---|---|---:|---:|---:|---:|---|---:|---|\n",
    );
    let mut section = "";
    for row in rows {
        let text = |key: &str| row[key].as_str().unwrap_or_default();
        let number = |key: &str| row[key].as_f64().map_or_else(|| "-".into(), num);
        if text("section") != section {
            section = text("section");
            let _ = writeln!(s, "| **{section}** | | | | | | | | |");
        }
        let reference = match row["reference"].as_str() {
            Some(name) => format!("{name}: {}", number("reference_median")),
            None => "-".into(),
        };
        let ratio = row["ratio"]
            .as_f64()
            .map_or_else(|| "-".into(), |r| format!("{r:.2}×"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {reference} | {ratio} | {} |",
            text("figure"),
            text("unit"),
            row["runs"],
            number("min"),
            number("median"),
            number("max"),
            text("note"),
        );
    }
    s
}

/// Three significant digits, without exponents.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary() {
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!(
            (s.n, s.median, s.mean, s.min, s.max),
            (4, 2.5, 4.0, 1.0, 10.0)
        );
        assert!((s.stddev - 4.0825).abs() < 1e-3);
        assert!((s.ci95() - 3.182 * 4.0825 / 2.0).abs() < 1e-2);
        assert_eq!(Summary::of(&[5.0]).median, 5.0);
        assert!(Summary::of(&[5.0]).ci95().is_nan());
        // Exact values at 11, 20 and 100 degrees of freedom.
        for (df, t) in [(11, 2.200_985), (20, 2.085_963), (100, 1.983_972)] {
            assert!((t975(df) - t).abs() < 2e-4, "t975({df}) = {}", t975(df));
        }
    }

    #[test]
    fn median_interval() {
        let v: Vec<f64> = (1..=30).map(f64::from).collect();
        // n = 30: P(B ≤ 9) = 0.021, P(B ≤ 10) = 0.049: the 10th smallest and largest.
        assert_eq!(median_ci95(&v), Some((10.0, 21.0)));
        // n = 6: P(B = 0) = 0.016: the extremes.
        assert_eq!(median_ci95(&v[..6]), Some((1.0, 6.0)));
        assert_eq!(median_ci95(&v[..5]), None);
    }

    #[test]
    fn ratio_in_the_table() {
        let t = Table {
            header: vec!["h".into()],
            rows: vec![Row::new("s", "x", "ns", &[2.0, 4.0, 6.0]).against("floor", 2.0)],
        };
        assert!(
            t.render()
                .contains("| x | ns | 3 | 2.00 | 4.00 | 6.00 | floor: 2.00 | 2.00× |")
        );
        assert_eq!(t.json()["rows"][0]["ratio"], 2.0);
    }

    /// A bench.json as `cargo xtask bench` writes it: two sections and a failed one.
    const SAMPLE: &str = r#"{
      "header": ["`cargo xtask bench`: kernel 6.18.44, 2 CPUs", "measured in 110 s"],
      "rows": [
        {"section": "kernel cost, ns per invocation", "figure": "tp_sched_switch on sched_switch",
         "unit": "ns", "runs": 3, "min": 69.7, "median": 71.1, "max": 72.8,
         "reference": "empty program on sched_switch", "reference_median": 51.7,
         "ratio": 1.3752, "note": "1123949 invocations"},
        {"section": "startup", "figure": "exec → start line, --backend auto", "unit": "ms",
         "runs": 3, "min": 130.0, "median": 137.0, "max": 142.0, "reference": null,
         "reference_median": null, "ratio": null, "note": ""},
        {"section": "failed", "figure": "vm-startup", "unit": "-", "runs": 0, "min": null,
         "median": null, "max": null, "reference": null, "reference_median": null,
         "ratio": null, "note": "no kernel"}
      ]
    }"#;

    #[test]
    fn the_results_sections_come_from_the_runs_json() {
        let json: Value = serde_json::from_str(SAMPLE).unwrap();
        let sections = sections(&json);
        let headings: Vec<&str> = sections.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(headings, ["kernel cost, ns per invocation", "startup"]);
        assert!(sections[0].1.contains(
            "| tp_sched_switch on sched_switch | ns | 3 | 69.7 | 71.1 | 72.8 | \
             empty program on sched_switch: 51.7 | 1.38× | 1123949 invocations |"
        ));
        assert!(sections[1].1.contains(
            "| exec → start line, --backend auto | ms | 3 | 130 | 137 | 142 | - | - |  |"
        ));
        // The printed table has the header lines and the failed row too.
        let all = markdown(&json);
        assert!(
            all.starts_with("`cargo xtask bench`: kernel 6.18.44, 2 CPUs  \nmeasured in 110 s  \n")
        );
        assert!(all.contains("| vm-startup | - | 0 | - | - | - | - | - | no kernel |"));
    }
}
