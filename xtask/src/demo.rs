//! `cargo xtask demo`: the README's main command. Installs what building needs (nothing for
//! the tests or the VMs), builds the tracer and runs `throttle-tracer demo` natively: a throttled workload in a temporary cgroup, traced with
//! the best backend this kernel allows, explained, and cleaned up.
use crate::{cmd, paths, setup};
use anyhow::Result;
use std::process::Command;

pub fn run() -> Result<()> {
    setup::run(&[setup::Part::Build])?;
    cmd::run(paths::cargo().args(["build", "--release", "-p", "tracer"]))?;
    let tracer = paths::target().join("release").join("throttle-tracer");
    cmd::run(Command::new(tracer).arg("demo"))
}
