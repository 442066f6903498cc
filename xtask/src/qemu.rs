//! Booting a kernel + initramfs under QEMU (TCG: KVM fails on this machine kind) and
//! capturing its serial console, with a time limit and a stop on kernel panic.
use crate::arch::Arch;
use anyhow::{Context as _, Result};
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How a boot ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ending {
    /// The guest printed its last marker and QEMU exited.
    Finished,
    /// QEMU exited without the guest's last marker (init died, or QEMU failed).
    Died,
    Panicked,
    TimedOut,
}

pub struct Boot {
    pub console: String,
    pub ending: Ending,
    pub elapsed: Duration,
}

/// Boots `arch`'s kernel and returns the console once QEMU exits or is killed; `append` adds
/// words to the kernel's command line (for /init to read in /proc/cmdline). Every console line
/// is also written to `log` as it arrives and handed to `on_line` (for progress output).
pub fn boot(
    arch: Arch,
    vmlinuz: &Path,
    initrd: &Path,
    append: &str,
    log: &Path,
    limit: Duration,
    on_line: &dyn Fn(&str),
) -> Result<Boot> {
    let started = Instant::now();
    let mut child = Command::new(arch.qemu())
        // One host thread for both vCPUs: multi-threaded TCG sometimes runs a stale int3 after
        // another vCPU patched a static key (every tracepoint attach and detach does), and the
        // guest dies ("Oops: int3" in ttwu_do_activate on 6.12, a soft lockup at detach on 6.1).
        // Four vCPUs of which `maxcpus=2` brings up two: the tests are judged on two, and the
        // CPU-offline test brings 2 and 3 online for itself; a vCPU never brought up costs the
        // single thread nothing. arm64 runs the same way.
        .args(["-accel", "tcg,thread=single"])
        .args(arch.machine())
        .args(["-smp", "4", "-m", "1024"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console={} quiet loglevel=5 panic=-1 maxcpus=2 {append}",
            arch.console()
        ))
        // No NIC: nothing uses it, and its iPXE option ROM waits for a keypress at every boot.
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} (run `cargo xtask setup`)", arch.qemu()))?;

    let (lines, received) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().expect("piped")) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().expect("piped")),
    ] {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line)
                    .trim_end_matches('\r')
                    .to_owned();
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(lines);

    let mut log =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut console = String::new();
    let mut ending = Ending::Died;
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match received.recv_timeout(left) {
            Ok(line) => {
                writeln!(log, "{line}")?;
                on_line(&line);
                console.push_str(&line);
                console.push('\n');
                if line.contains("Kernel panic") {
                    ending = Ending::Panicked;
                    // Keep the panic's own lines: they say what happened.
                    std::thread::sleep(Duration::from_millis(500));
                    while let Ok(line) = received.try_recv() {
                        writeln!(log, "{line}")?;
                        console.push_str(&line);
                        console.push('\n');
                    }
                    break;
                }
                if line.starts_with(crate::guest::DONE) {
                    ending = Ending::Finished;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                ending = Ending::TimedOut;
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Already exited unless it panicked or hung; kill() on an exited child is harmless.
    let _ = child.kill();
    child.wait()?;
    Ok(Boot {
        console,
        ending,
        elapsed: started.elapsed(),
    })
}
