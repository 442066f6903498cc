//! `cargo xtask fuzz [--seconds N] [TARGET...]`: cargo-fuzz's targets (fuzz/), each run for N
//! seconds from its kept corpus (`fuzz/corpus/<target>/`), which is then minimised again
//! (`cargo fuzz cmin`) so that what the run found stays small enough to keep in the
//! repository. A crash stops the task with libFuzzer's report and the input in
//! `fuzz/artifacts/<target>/.` Not part of `test`: `cargo test` replays the kept corpora.
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{cmd, paths};

#[derive(clap::Args)]
pub struct Args {
    /// How long each target runs, in seconds.
    #[arg(long, default_value_t = 180)]
    seconds: u64,
    /// Only these targets (none named: every one `cargo fuzz list` names).
    targets: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    if !cmd::succeeds(cargo_fuzz().arg("--version")) {
        bail!("cargo-fuzz is not installed: `cargo install cargo-fuzz --locked`");
    }
    let targets = if args.targets.is_empty() {
        cmd::stdout(cargo_fuzz().arg("list"))?
            .lines()
            .map(str::to_owned)
            .collect()
    } else {
        args.targets.clone()
    };
    let max_time = format!("-max_total_time={}", args.seconds);
    for target in &targets {
        // Inputs of at most 2 KiB: larger ones find little more and make the kept corpus
        // large (4 KiB ones made the recordings' 800 KB, 2 KiB ones 480 KB).
        cmd::run(cargo_fuzz().args(["run", target, "--", &max_time, "-max_len=2048"]))
            .with_context(|| format!("fuzz target {target}"))?;
        // The inputs that reach new edges; hit counts too would keep thousands.
        cmd::run(cargo_fuzz().args(["cmin", target, "--", "-use_counters=0"]))?;
    }
    Ok(())
}

/// `cargo fuzz` at the lowest CPU priority: a fuzzer takes a whole CPU for as long as it runs,
/// and the host tests (and CI) on the same machine measure time. Its sanitizer and coverage
/// flags are nightly's; RUSTC_BOOTSTRAP=1 lets the stable toolchain take them, as it does
/// for the eBPF build, so that no nightly toolchain is needed.
fn cargo_fuzz() -> Command {
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "19"])
        .arg(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .arg("fuzz")
        .current_dir(paths::root())
        .env("RUSTC_BOOTSTRAP", "1");
    cmd
}
