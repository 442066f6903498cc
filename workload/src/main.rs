//! `throttle-workload`: the CPU loads the tracer's tests put under a quota, each printing what it
//! saw by its own clocks (CLOCK_MONOTONIC like the tracer's records, the CPU-time clocks, and
//! CLOCK_REALTIME for `held`): a truth the tests hold the tracer to that the tracer does not make.
//! Modes `busy`, `spiky`, `arrivals`, `held`, `pair` and `idle`: each one's doc comment below (and
//! `--help`) says what it runs and prints.
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use tracer_common::{
    clock::{burn, clock_ns},
    round::Round,
};

mod arrivals;

/// The CPU load the tests put under a quota.
#[derive(Parser)]
#[command(name = "throttle-workload")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

// Times are u32, so that none overflows a u64 of nanoseconds or an Instant.
#[derive(Subcommand)]
enum Mode {
    /// Spins N threads for S seconds of wall time.
    Busy {
        /// Spinning threads.
        #[arg(long, value_name = "N")]
        threads: usize,
        /// Wall time to run for.
        #[arg(long, value_name = "S")]
        seconds: u32,
    },
    /// Phase-locked rounds: a round every MS after a refill, each burning the given CPU time,
    /// one line per round.
    Spiky {
        /// Time from one round's start to the next (a multiple of the period).
        #[arg(long, value_name = "MS")]
        every_ms: u32,
        /// CPU time each round burns.
        #[arg(long, value_name = "MS")]
        burn_ms: u32,
        /// Rounds to run.
        #[arg(long, value_name = "R")]
        rounds: u32,
        /// Threads that each burn `--burn-ms` in a round, all at once.
        #[arg(long, value_name = "K", default_value_t = 1)]
        threads: u32,
        /// The group's CPU usage counter (v1 `cpuacct.usage`, ns; v2 `cpu.stat`, its
        /// `usage_usec`), read around each round.
        #[arg(long, value_name = "FILE")]
        usage_file: Option<std::path::PathBuf>,
        /// The group's cpu.stat (v1 or v2), whose `nr_throttled` is read around each round.
        #[arg(long, value_name = "FILE")]
        stat_file: Option<std::path::PathBuf>,
    },
    /// Requests of D ms of CPU arriving at random (Poisson, R per second) for K workers, for S
    /// seconds; one line per request.
    Arrivals {
        /// Mean arrivals per second.
        #[arg(long, value_name = "R")]
        rate: f64,
        /// CPU time each request burns.
        #[arg(long, value_name = "D")]
        cost_ms: u32,
        /// Worker threads taking requests from one queue.
        #[arg(long, value_name = "K", default_value_t = 4)]
        threads: u32,
        /// Time arrivals keep coming.
        #[arg(long, value_name = "S")]
        seconds: u32,
        /// Seed of the arrival times: the same seed, the same workload.
        #[arg(long, value_name = "N", default_value_t = 3)]
        seed: u64,
        /// Wait before the first arrival, µs: moves the period boundaries among the arrivals.
        #[arg(long, value_name = "US", default_value_t = 0)]
        delay_us: u64,
    },
    /// Spins for S seconds, then prints its CLOCK_REALTIME around each time it was held, one
    /// line each.
    Held {
        /// Wall time to run for.
        #[arg(long, value_name = "S")]
        seconds: u32,
    },
    /// A spinning and a sleeping thread for S seconds; prints their thread ids.
    Pair {
        /// Wall time to run for.
        #[arg(long, value_name = "S")]
        seconds: u32,
    },
    /// Sleeps for S seconds (a container's first process, holding its cgroup open).
    Idle {
        /// Wall time to sleep for.
        #[arg(long, value_name = "S")]
        seconds: u32,
    },
}

fn main() -> ExitCode {
    match Cli::parse().mode {
        Mode::Busy { threads, seconds } => busy(threads, Duration::from_secs(seconds.into())),
        Mode::Spiky {
            every_ms,
            burn_ms,
            rounds,
            threads,
            usage_file,
            stat_file,
        } => {
            let usage = usage_file
                .as_deref()
                .map(|file| move || group_usage_ns(file));
            let throttled = stat_file
                .as_deref()
                .map(|file| move || group_throttled(file));
            spiky(
                ms_to_ns(every_ms),
                ms_to_ns(burn_ms),
                rounds,
                threads,
                Counters { usage, throttled },
            )
        }
        Mode::Arrivals {
            rate,
            cost_ms,
            threads,
            seconds,
            seed,
            delay_us,
        } => {
            let shape = arrivals::Arrivals {
                threads: threads as usize,
                request_cpu: Duration::from_millis(cost_ms.into()),
                rate,
                length: Duration::from_secs(seconds.into()),
                seed,
                delay: Duration::from_micros(delay_us),
            };
            if let Err(e) = arrivals::run(&shape, &mut std::io::stdout().lock()) {
                eprintln!("throttle-workload: cannot write the request lines: {e}");
                return ExitCode::FAILURE;
            }
        }
        Mode::Held { seconds } => held(u64::from(seconds) * 1_000_000_000),
        Mode::Pair { seconds } => pair(Duration::from_secs(seconds.into())),
        Mode::Idle { seconds } => thread::sleep(Duration::from_secs(seconds.into())),
    }
    ExitCode::SUCCESS
}

fn ms_to_ns(ms: u32) -> u64 {
    u64::from(ms) * 1_000_000
}

/// Spins until the group is stopped and returns the CLOCK_MONOTONIC time it ran again (a
/// refill, a period boundary), or the time it gave up (no quota stopped it).
fn resume_after_stop() -> u64 {
    let cpu_start = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let mut last = clock_ns(libc::CLOCK_MONOTONIC);
    loop {
        let now = clock_ns(libc::CLOCK_MONOTONIC);
        if now - last >= STOP_GAP_NS {
            return now;
        }
        last = now;
        if clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - cpu_start >= SYNC_BURN_NS {
            return now;
        }
    }
}

/// Sleeps until CLOCK_MONOTONIC reaches `ns` (at once if it has).
fn sleep_until_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a valid timespec and no remainder pointer (unused with TIMER_ABSTIME). An
    // interruption (EINTR) is retried; any other failure cannot happen with these arguments.
    while unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    } == libc::EINTR
    {}
}

/// N spinning threads for `length`; once all run, prints their thread ids (`tids A B …`) and
/// the CLOCK_MONOTONIC span in which every one of them is runnable (`spinning from_ns S
/// until_ns D`: they never sleep), so a check can tell which threads a stop held.
fn busy(threads: usize, length: Duration) {
    // Read before the deadline's clock (Instant is CLOCK_MONOTONIC too): the span printed
    // ends no later than the threads do.
    let until_ns = clock_ns(libc::CLOCK_MONOTONIC) + length.as_nanos() as u64;
    let deadline = Instant::now() + length;
    let (tx, rx) = std::sync::mpsc::channel();
    let spinners: Vec<_> = (0..threads)
        .map(|_| {
            let tx = tx.clone();
            thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                let _ = tx.send(unsafe { libc::gettid() });
                let mut n = 0u64;
                while Instant::now() < deadline {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            })
        })
        .collect();
    let tids: Vec<String> = rx.iter().take(threads).map(|t| t.to_string()).collect();
    let from_ns = clock_ns(libc::CLOCK_MONOTONIC);
    println!("tids {}", tids.join(" "));
    println!("spinning from_ns {from_ns} until_ns {until_ns}");
    for spinner in spinners {
        spinner.join().expect("a busy thread panicked");
    }
}

/// A spinning thread and a sleeping one, each named, for `length`.
fn pair(length: Duration) {
    let deadline = Instant::now() + length;
    let (tx, rx) = std::sync::mpsc::channel();
    let start = |name: &'static str, work: fn(Instant)| {
        let tx = tx.clone();
        thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let _ = tx.send((name, unsafe { libc::gettid() }));
                work(deadline);
            })
            .expect("cannot start a thread")
    };
    let threads = [
        start("spinner", |deadline| {
            let mut n = 0u64;
            while Instant::now() < deadline {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }),
        start("sleeper", |deadline| {
            thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }),
    ];
    let ids: std::collections::HashMap<&str, i32> = rx.iter().take(2).collect();
    println!("tids spinner {} sleeper {}", ids["spinner"], ids["sleeper"]);
    for t in threads {
        t.join().expect("a thread of the pair panicked");
    }
}

/// A pause this long in a spinning thread's clock reads is a stop, not a preemption: the
/// quotas of the tests stop a group for 50 ms a period.
const STOP_GAP_NS: u64 = 30_000_000;
/// CPU time that gets stopped under every quota + burst the tests use (at most 100 ms a period).
const SYNC_BURN_NS: u64 = 400_000_000;

/// Spins for `length_ns` reading CLOCK_REALTIME, then prints the reads around each hold. A
/// hold is found on the one clock it is reported in: with a second clock read in the loop, a
/// hold between the two reads of one turn would show in one clock's gap and not the other's.
fn held(length_ns: u64) {
    let realtime = || clock_ns(libc::CLOCK_REALTIME);
    let deadline = Instant::now() + Duration::from_nanos(length_ns);
    let mut holds = Vec::new();
    let mut last = realtime();
    while Instant::now() < deadline {
        let now = realtime();
        if now.saturating_sub(last) >= STOP_GAP_NS {
            holds.push((last, now));
        }
        last = now;
    }
    for (held, resumed) in holds {
        println!("held realtime_ns {held} resumed_realtime_ns {resumed}");
    }
}

/// Phase-locked rounds. With a plain sleep between rounds (the reference's lab), a round is
/// stopped or not depending on where in the period it starts, and wake-up delays move that
/// point from round to round; starting every round at a fixed distance from a refill makes the
/// quota's arithmetic the only thing that decides. Prints `synced refill_ns N` once it found
/// the boundary (by burning until stopped), then one line per round
/// ([`tracer_common::round::Round`]); it exits a round's spacing after the last round, so that
/// its exit is no round's CPU.
fn spiky(
    every_ns: u64,
    burn_ns: u64,
    rounds: u32,
    threads: u32,
    group: Counters<impl Fn() -> u64, impl Fn() -> u64>,
) {
    let refill_ns = resume_after_stop();
    // The group's counter runs on from one round's close to the next's: a period that spans
    // the idle time before a round (its timer idled) holds the group's CPU since the last
    // expiry, the wake-ups and prints between rounds too.
    let mut usage_start = group.usage.as_ref().map(|read| read());
    println!("synced refill_ns {refill_ns}");
    let due_ns =
        |round: u32| refill_ns.saturating_add((u64::from(round) + 1).saturating_mul(every_ns));
    for round in 0..rounds {
        sleep_until_ns(due_ns(round));
        let throttled_start = group.throttled.as_ref().map(|read| read());
        let start_ns = clock_ns(libc::CLOCK_MONOTONIC);
        let cpu_start = clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
        if threads <= 1 {
            burn(burn_ns);
        } else {
            thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| burn(burn_ns));
                }
            });
        }
        let cpu_ns = clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu_start;
        let end_ns = clock_ns(libc::CLOCK_MONOTONIC);
        // The round's threads finish exiting after the join, and the process's clock no longer
        // counts them then: the group's counter is read again just before the next round.
        sleep_until_ns(due_ns(round + 1).saturating_sub(GROUP_SETTLE_NS));
        let usage_end = group.usage.as_ref().map(|read| read());
        let group_ns = usage_end.zip(usage_start).map(|(end, start)| end - start);
        usage_start = usage_end;
        let throttled = grown(throttled_start, group.throttled.as_ref());
        println!(
            "{}",
            Round {
                index: round,
                start_ns,
                end_ns,
                cpu_ns,
                group_ns,
                throttled,
            }
        );
    }
    // The process's exit (unmapping, freeing) is CPU of its cgroup too: a period of its own,
    // not one of the last round's.
    if rounds > 0 {
        sleep_until_ns(due_ns(rounds));
    }
}

/// The group's counters a round is read against: its CPU usage and its throttled periods.
struct Counters<U, T> {
    usage: Option<U>,
    throttled: Option<T>,
}

/// How much a counter read at the start (`start`) has grown since, if it is read at all.
fn grown(start: Option<u64>, read: Option<&impl Fn() -> u64>) -> Option<u64> {
    Some(read?() - start?)
}

/// The group's throttled periods, cpu.stat `nr_throttled` (v1 and v2 alike), from `file`. A
/// file that cannot be read ends the workload with that said.
fn group_throttled(file: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("nr_throttled ")?.trim().parse().ok())
        .unwrap_or_else(|| {
            eprintln!("throttle-workload: no nr_throttled in {}", file.display());
            std::process::exit(1)
        })
}

/// How long before the next round the group's counter closes a round: the wake-up's margin.
const GROUP_SETTLE_NS: u64 = 20_000_000;

/// The group's CPU usage counter, ns, from `file`: v2 `cpu.stat`'s `usage_usec`, or v1
/// `cpuacct.usage` (ns). A counter that cannot be read ends the workload with that said.
fn group_usage_ns(file: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let parsed = if file.ends_with("cpu.stat") {
        text.lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())
            .map(|usec| usec * 1_000)
    } else {
        text.trim().parse().ok()
    };
    parsed.unwrap_or_else(|| {
        eprintln!("throttle-workload: no usage counter in {}", file.display());
        std::process::exit(1)
    })
}
