//! Running external programs: show the command line, fail with its exit status.
use anyhow::{Context as _, Result, bail};
use std::process::{Command, Stdio};

/// Runs `cmd` with inherited stdio; an unsuccessful exit is an error.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", show(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {}", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", show(cmd));
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout; an unsuccessful exit is an error carrying stderr.
pub fn stdout(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", show(cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}\n{}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{}: output is not UTF-8", show(cmd)))
}

/// Whether `cmd` runs and exits successfully; its output is discarded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
