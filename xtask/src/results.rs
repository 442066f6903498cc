//! The results files under docs/results/ that `cargo xtask bench` and `advise-check` write: one
//! markdown file per task, one `## section` per thing measured, each headed with when, at which
//! commit, on which machine and by which command it was measured. A run replaces the sections
//! it measured and keeps the others, so that `bench --only kernel` leaves the slowdown's
//! figures as they were (and says, in their heading, when those were taken).
use crate::{cmd, paths};
use anyhow::{Context as _, Result};
use std::path::PathBuf;
use std::process::Command;

/// Where, when and how a run measured: the heading line of each section it writes.
pub struct Provenance {
    line: String,
}

impl Provenance {
    /// This run, on this machine, at the workspace's checked-out commit.
    pub fn here() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Self::new(
            &utc_now(),
            &commit(),
            &machine(),
            &format!("cargo xtask {}", args.join(" ")),
        )
    }

    pub fn new(when: &str, commit: &str, machine: &str, command: &str) -> Self {
        Self {
            line: format!("Measured {when} at commit {commit} on {machine}, by `{command}`."),
        }
    }
}

/// Replaces (or adds) `sections` (heading, body) in docs/results/`file`, keeping the file's
/// other sections, and puts `intro` at its top. Returns the file's path.
pub fn update(
    file: &str,
    intro: &str,
    provenance: &Provenance,
    sections: &[(String, String)],
) -> Result<PathBuf> {
    let path = paths::root().join("docs/results").join(file);
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let new: Vec<(String, String)> = sections
        .iter()
        .map(|(heading, body)| {
            (
                heading.clone(),
                format!("{}\n\n{}", provenance.line, body.trim_end()),
            )
        })
        .collect();
    std::fs::create_dir_all(path.parent().expect("docs/results has a parent"))?;
    std::fs::write(&path, merge(&existing, intro, &new))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// `existing` with `intro` above its first `## ` heading and each of `sections` in place of
/// the section of the same heading, or after the others when it has none.
fn merge(existing: &str, intro: &str, sections: &[(String, String)]) -> String {
    let mut kept: Vec<(String, String)> = Vec::new();
    for block in existing.split("\n## ").skip(1) {
        let (heading, body) = block.split_once('\n').unwrap_or((block, ""));
        kept.push((heading.trim().to_owned(), body.trim().to_owned()));
    }
    for (heading, body) in sections {
        match kept.iter_mut().find(|(h, _)| h == heading) {
            Some(slot) => slot.1.clone_from(body),
            None => kept.push((heading.clone(), body.clone())),
        }
    }
    let mut out = intro.trim_end().to_owned();
    out.push('\n');
    for (heading, body) in kept {
        out.push_str(&format!("\n## {heading}\n\n{}\n", body.trim()));
    }
    out
}

/// "2026-12-07 04:10 UTC".
fn utc_now() -> String {
    cmd::stdout(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
        .map_or_else(|_| "at an unknown time".into(), |s| s.trim().to_owned())
}

/// The short hash of the checked-out commit, and whether tracked files differ from it.
fn commit() -> String {
    let git =
        |args: &[&str]| cmd::stdout(Command::new("git").arg("-C").arg(paths::root()).args(args));
    let Ok(hash) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown (no git)".into();
    };
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_ok_and(|s| !s.trim().is_empty());
    format!(
        "{}{}",
        hash.trim(),
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    )
}

/// "kernel 6.18.44, 2 CPUs (Intel(R) Xeon(R) …)".
fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map_or("model unknown", |(_, m)| m.trim());
    format!(
        "kernel {}, {} CPUs ({model})",
        kernel.trim(),
        std::thread::available_parallelism().map_or(0, usize::from)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(heading: &str, body: &str) -> (String, String) {
        (heading.into(), body.into())
    }

    #[test]
    fn a_run_replaces_its_sections_and_keeps_the_others() {
        let existing = "# Old title\n\nold intro\n\n## kernel\n\nold kernel\n\n## slowdown\n\n\
                        old slowdown\n| a | b |\n";
        let merged = merge(
            existing,
            "# Bench\n\nintro",
            &[
                section("kernel", "new kernel"),
                section("startup", "new startup"),
            ],
        );
        assert_eq!(
            merged,
            "# Bench\n\nintro\n\n## kernel\n\nnew kernel\n\n## slowdown\n\nold slowdown\n\
             | a | b |\n\n## startup\n\nnew startup\n"
        );
        // Merging the result again with nothing new changes nothing.
        assert_eq!(merge(&merged, "# Bench\n\nintro", &[]), merged);
    }

    #[test]
    fn a_first_run_writes_the_intro_and_its_sections() {
        assert_eq!(
            merge("", "# Bench", &[section("kernel", "figures")]),
            "# Bench\n\n## kernel\n\nfigures\n"
        );
    }

    #[test]
    fn the_provenance_says_when_where_and_how() {
        let p = Provenance::new(
            "2026-12-07 04:10 UTC",
            "abc1234",
            "kernel 6.18.44, 2 CPUs (model unknown)",
            "cargo xtask bench --only kernel",
        );
        assert_eq!(
            p.line,
            "Measured 2026-12-07 04:10 UTC at commit abc1234 on kernel 6.18.44, 2 CPUs \
             (model unknown), by `cargo xtask bench --only kernel`."
        );
    }
}
