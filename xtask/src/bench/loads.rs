//! Loads that call one kind of hook many times a second, for the kernel-cost windows of the
//! hooks a context switch seldom reaches: under `perf bench sched pipe` a CSD runs a few dozen
//! times and an hrtimer a few thousand, so a program there is measured cold (its code and data
//! out of the caches), which says more about the cache than the program. Each runs in threads
//! of this process for a fixed time and returns how many calls it made.
use anyhow::{Result, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Cross-CPU function calls (CSDs): `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` in a loop
/// on one CPU while a second thread of this process spins on another. The kernel sends its
/// barrier to every other CPU running a thread of this mm, as a function call run from the IPI
/// (`csd_function_entry` / `_exit` on that CPU); with nobody else of this mm running there, it
/// sends none, hence the two threads pinned apart.
pub fn membarrier(length: Duration) -> Result<u64> {
    let [caller, spinning] = two_cpus()?;
    // SAFETY: a syscall without pointers.
    if unsafe { membarrier_call(libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) } != 0 {
        bail!(
            "membarrier(REGISTER_PRIVATE_EXPEDITED): {}",
            std::io::Error::last_os_error()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            pin(spinning)?;
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            Ok(())
        })
    };
    let barriers = thread::spawn(move || {
        pin(caller)?;
        let mut calls = 0u64;
        let end = Instant::now() + length;
        while Instant::now() < end {
            // SAFETY: a syscall without pointers.
            if unsafe { membarrier_call(libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED) } != 0 {
                bail!(
                    "membarrier(PRIVATE_EXPEDITED): {}",
                    std::io::Error::last_os_error()
                );
            }
            calls += 1;
        }
        Ok(calls)
    })
    .join()
    .expect("the membarrier thread panicked");
    stop.store(true, Ordering::Relaxed);
    let spun: Result<()> = spinner.join().expect("the spinning thread panicked");
    spun?;
    barriers
}

/// The first two CPUs this process may run on.
fn two_cpus() -> Result<[usize; 2]> {
    // SAFETY: a zeroed cpu_set_t is an empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a cpu_set_t of the size given.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
    }
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&cpu| {
        // SAFETY: `cpu` is below the set's size.
        unsafe { libc::CPU_ISSET(cpu, &set) }
    });
    match (cpus.next(), cpus.next()) {
        (Some(a), Some(b)) => Ok([a, b]),
        _ => bail!("a cross-CPU load needs two CPUs"),
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` comes from sched_getaffinity, below the set's size.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a cpu_set_t of the size given; 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        bail!(
            "sched_setaffinity({cpu}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// SAFETY: none of the commands used take a pointer.
unsafe fn membarrier_call(command: libc::c_int) -> libc::c_long {
    // SAFETY: see above.
    unsafe { libc::syscall(libc::SYS_membarrier, command, 0, 0) }
}

/// hrtimers: 10 µs sleeps in a loop, each an hrtimer armed and expired (`hrtimer_expire_entry`
/// / `_exit`), with this thread's timer slack at 1 ns so that each sleep is one timer of its
/// own, not a later expiry shared with others.
pub fn nanosleep(length: Duration) -> Result<u64> {
    thread::spawn(move || {
        // SAFETY: prctl with integer arguments, for this thread only.
        if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) } != 0 {
            bail!(
                "prctl(PR_SET_TIMERSLACK): {}",
                std::io::Error::last_os_error()
            );
        }
        let mut calls = 0u64;
        let end = Instant::now() + length;
        while Instant::now() < end {
            thread::sleep(Duration::from_micros(10));
            calls += 1;
        }
        Ok(calls)
    })
    .join()
    .expect("the sleeping thread panicked")
}
