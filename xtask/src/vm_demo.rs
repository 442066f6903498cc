//! `cargo xtask vm-demo`: the kprobe backend on a real Debian 6.12 kernel: a throttled
//! workload in a VM, traced for five seconds; the tracer's own report as the user would see it.
use crate::arch::Arch;
use crate::console::Console;
use crate::qemu::{self, Ending};
use crate::{binaries, guest, kernels, paths, setup};
use anyhow::{Result, bail};
use std::time::Duration;

const GUEST_PART: &str = include_str!("../guest/vm-demo.sh");
const KERNEL: &str = "6.12";
const BOOT_LIMIT: Duration = Duration::from_secs(180);

pub fn run() -> Result<()> {
    setup::run(&[setup::Part::Build, setup::Part::Vm])?;
    let kernel = kernels::by_series(KERNEL)?.fetch(Arch::X86_64)?;
    let binaries = binaries::build(Arch::X86_64)?;
    let vm = paths::vm();
    let initrd = vm.join("demo.cpio");
    std::fs::write(
        &initrd,
        guest::initramfs(&guest::init_script(GUEST_PART), &binaries, None, &[])?,
    )?;
    std::fs::create_dir_all(vm.join("logs"))?;
    let log = vm.join("logs").join("demo.log");
    eprintln!(
        "booting {} {} under QEMU; the workload is two busy threads under cpu.max \"50000 100000\"",
        kernel.package, kernel.version
    );
    let boot = qemu::boot(
        Arch::X86_64,
        &kernel.vmlinuz,
        &initrd,
        "",
        &log,
        BOOT_LIMIT,
        &|_| {},
    )?;
    let console = Console::parse(&boot.console);
    let status = console.mark("TRACER", "demo").unwrap_or("not printed");
    if boot.ending != Ending::Finished || status != "exit status 0" {
        for line in console.section("demo/stderr").unwrap_or_default() {
            eprintln!("tracer: {line}");
        }
        bail!(
            "the demo failed (boot {:?}, tracer {status}); console: {}",
            boot.ending,
            log.display()
        );
    }
    println!("$ throttle-tracer --backend kprobe --cgroup /demo --duration 5s");
    for line in console.section("demo/report").unwrap_or_default() {
        println!("{line}");
    }
    Ok(())
}
