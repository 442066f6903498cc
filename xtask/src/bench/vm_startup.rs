//! Startup in the vm-test kernels' guests, where the kprobe and fentry backends exist (this host
//! has neither): [`super::startup::measure`] run by a static xtask (`xtask
//! guest-startup`, hidden) in one boot per kernel, each backend against the bpftrace one-liner that
//! attaches as it does, under the same emulator in the same boot. bpftrace and its libraries go
//! into this measurement's initramfs only: docs/performance.md ("The sections", vm-startup).
use super::Bench;
use super::startup::{self, Measured};
use super::table::Row;
use crate::arch::Arch;
use crate::binaries::{self, Binaries};
use crate::console::Console;
use crate::kernels::{self, KERNELS, Kernel};
use crate::qemu::{self, Ending};
use crate::{cmd, guest, paths};
use anyhow::{Context as _, Result, bail};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const SECTION: &str = "startup in the VM guests (QEMU TCG)";
/// Debian's bpftrace, as `cargo xtask setup bench` installs it.
const BPFTRACE: &str = "/usr/bin/bpftrace";
/// Starts of each backend and check per boot at most: under TCG a start takes seconds (the
/// tracepoint backend's and bpftrace's tens of seconds on some kernels).
const MAX_RUNS: usize = 5;
/// A hang guard per boot.
const BOOT_LIMIT: Duration = Duration::from_secs(2400);

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    if bench.smoke {
        let why = "not in --smoke: a guest boot per kernel with bpftrace in it takes minutes";
        eprintln!("bench: vm-startup skipped: {why}");
        return Ok(vec![Row::new(SECTION, "skipped", "-", &[]).note(why)]);
    }
    let kernels: Vec<&Kernel> = if bench.kernels.is_empty() {
        KERNELS.iter().collect()
    } else {
        bench
            .kernels
            .iter()
            .map(|s| kernels::by_series(s))
            .collect::<Result<_>>()?
    };
    let runs = bench.runs.min(MAX_RUNS);
    let binaries = Binaries {
        arch: Arch::X86_64,
        tracer: bench.tracer.clone(),
        workload: bench.workload.clone(),
        tests: Vec::new(),
    };
    let xtask = binaries::xtask(Arch::X86_64)?;
    // The measurement, its exit status and its JSON line; its progress on the console.
    // bpftrace 0.17 finds no BTF on 5.10 by itself (`bpftrace --info`: "btf: no"; it then
    // wants the kernel headers, which the guest does not have): there the file is named in
    // BPFTRACE_BTF, and parses. Only there: with it, bpftrace refuses kfunc probes on 6.12.
    let init = guest::init_script(&format!(
        "bpftrace --info 2>&1 | grep -q 'btf: yes' || export BPFTRACE_BTF=/sys/kernel/btf/vmlinux\n\
         echo \"startup: BPFTRACE_BTF=${{BPFTRACE_BTF:-(unset: bpftrace finds the BTF)}}\"\n\
         xtask guest-startup --tracer /bin/throttle-tracer --runs {runs} > /tmp/startup\n\
         mark \"STARTUP exit status $?\"\n\
         section startup /tmp/startup"
    ));
    let initrd = paths::vm().join("vm-startup.cpio");
    std::fs::write(
        &initrd,
        guest::initramfs(&init, &binaries, Some(&xtask), &bpftrace_closure()?)?,
    )
    .with_context(|| format!("writing {}", initrd.display()))?;
    std::fs::create_dir_all(paths::vm().join("logs"))?;

    let mut rows = Vec::new();
    for kernel in kernels {
        // A kernel whose boot or measurement failed has a row saying why; the others are
        // still measured.
        match boot(kernel, &initrd) {
            Ok((label, measured)) => {
                rows.extend(startup::table_rows(
                    SECTION,
                    &format!("{label}: "),
                    &measured,
                ));
            }
            Err(e) => {
                eprintln!("bench: vm-startup on {} failed: {e:#}", kernel.series);
                rows.push(
                    Row::new(
                        "failed",
                        format!("vm-startup on {}", kernel.series),
                        "-",
                        &[],
                    )
                    .note(format!("{e:#}")),
                );
            }
        }
    }
    Ok(rows)
}

/// One boot of `kernel` with the measurement: the kernel's label and what was measured.
fn boot(kernel: &Kernel, initrd: &std::path::Path) -> Result<(String, Measured)> {
    let fetched = kernel.fetch(Arch::X86_64)?;
    let log = paths::vm()
        .join("logs")
        .join(format!("vm-startup-{}.log", kernel.series));
    eprintln!(
        "bench: vm-startup: booting {} ({}), console → {}",
        kernel.series,
        fetched.version,
        log.display()
    );
    let booted = Instant::now();
    let progress = |line: &str| {
        if line.starts_with("startup: ") {
            let at = booted.elapsed().as_secs();
            eprintln!("  [{} +{at}s] {line}", kernel.series);
        }
    };
    let boot = qemu::boot(
        Arch::X86_64,
        &fetched.vmlinuz,
        initrd,
        "",
        &log,
        BOOT_LIMIT,
        &progress,
    )?;
    let console = Console::parse(&boot.console);
    if boot.ending != Ending::Finished || !console.kernel_trouble().is_empty() {
        bail!(
            "boot {:?} after {:.0} s; see {}{}",
            boot.ending,
            boot.elapsed.as_secs_f64(),
            log.display(),
            console
                .kernel_trouble()
                .iter()
                .fold(String::new(), |text, line| text + "\n    | " + line)
        );
    }
    let output = console.section("startup").unwrap_or_default();
    if console.mark("STARTUP", "") != Some("exit status 0") {
        bail!(
            "xtask guest-startup failed; see {} ({})",
            log.display(),
            output.join(" | ")
        );
    }
    let line = output
        .iter()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no measurement on the console; see {}", log.display()))?;
    let measured = serde_json::from_str(line).context("the guest's measurement")?;
    // The upstream version of Debian's package (`6.12.118` of `6.12.118-1~deb12u1`): the
    // kernel's release string names no patch level on 5.10 and 6.1.
    let upstream = fetched
        .version
        .split('-')
        .next()
        .unwrap_or(&fetched.version);
    Ok((upstream.to_owned(), measured))
}

/// bpftrace as /bin/bpftrace, and each library `ldd` names (and the loader) at its own path.
fn bpftrace_closure() -> Result<Vec<(String, PathBuf)>> {
    let ldd = cmd::stdout(Command::new("ldd").arg(BPFTRACE))
        .with_context(|| format!("{BPFTRACE} (run `cargo xtask setup bench`)"))?;
    let mut files = vec![("bin/bpftrace".to_owned(), PathBuf::from(BPFTRACE))];
    for path in parse_ldd(&ldd) {
        files.push((path.trim_start_matches('/').to_owned(), PathBuf::from(path)));
    }
    Ok(files)
}

/// The absolute paths in ldd's output: `name => /path (0x…)` and the loader's `/path (0x…)`.
fn parse_ldd(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = l.split_once(" => ").map_or(l, |(_, p)| p);
            let path = path.split_whitespace().next()?;
            path.starts_with('/').then_some(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_paths() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f10)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f10)\n";
        assert_eq!(
            parse_ldd(out),
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
    }
}
