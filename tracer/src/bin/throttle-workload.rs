//! `throttle-workload`: the CPU load the VM tests put under a quota.
//!
//! ```text
//! throttle-workload busy --threads N --seconds S
//! throttle-workload spiky --idle-ms MS --burn-ms MS --rounds R
//! throttle-workload requests --seconds S
//! ```
//!
//! `busy` spins N threads for S seconds of wall time. `spiky` sleeps, then burns MS of its own
//! CPU time (CLOCK_THREAD_CPUTIME_ID, so time spent stopped does not count), R times, and prints
//! one line per round with CLOCK_MONOTONIC timestamps and the CPU time burned — the clock the tracer's `start_ns` and
//! `end_ns` use — so that stops can be matched to rounds. `requests` is the workload of
//! `throttle-tracer demo` (4 workers, bursts of 20 ms requests; see `workload.rs`), for S seconds.
use std::collections::HashMap;
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

#[path = "../workload.rs"]
mod workload;

const USAGE: &str = "usage: throttle-workload busy --threads N --seconds S\n       \
                     throttle-workload spiky --idle-ms MS --burn-ms MS --rounds R\n       \
                     throttle-workload requests --seconds S";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("throttle-workload: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let (mode, rest) = args.split_first().ok_or("no mode given")?;
    let mut options = Options::parse(rest)?;
    match mode.as_str() {
        "busy" => {
            let threads = options.take("threads")?;
            let seconds = options.take("seconds")?;
            options.finish()?;
            busy(threads, Duration::from_secs(seconds));
        }
        "spiky" => {
            let idle = Duration::from_millis(options.take("idle-ms")?);
            let burn_ns = options.take::<u64>("burn-ms")? * 1_000_000;
            let rounds = options.take("rounds")?;
            options.finish()?;
            spiky(idle, burn_ns, rounds);
        }
        "requests" => {
            let seconds = options.take("seconds")?;
            options.finish()?;
            let shape = workload::Requests::demo(Duration::from_secs(seconds));
            workload::run(&shape, &mut std::io::stdout().lock())
                .map_err(|e| format!("cannot write the burst lines: {e}"))?;
        }
        other => return Err(format!("unknown mode `{other}`")),
    }
    Ok(())
}

/// `--name value` pairs, each a non-negative integer.
struct Options(HashMap<String, u64>);

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let name = flag
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument `{flag}`"))?;
            let value = it.next().ok_or_else(|| format!("`{flag}` needs a value"))?;
            let value = value
                .parse()
                .map_err(|_| format!("`{flag} {value}`: not a non-negative integer"))?;
            map.insert(name.to_owned(), value);
        }
        Ok(Self(map))
    }

    fn take<T: TryFrom<u64>>(&mut self, name: &str) -> Result<T, String> {
        let value = self
            .0
            .remove(name)
            .ok_or_else(|| format!("--{name} is required"))?;
        T::try_from(value).map_err(|_| format!("--{name} {value} is out of range"))
    }

    fn finish(self) -> Result<(), String> {
        match self.0.keys().next() {
            Some(name) => Err(format!("unknown option --{name}")),
            None => Ok(()),
        }
    }
}

fn busy(threads: usize, length: Duration) {
    let deadline = Instant::now() + length;
    let spinners: Vec<_> = (0..threads)
        .map(|_| {
            thread::spawn(move || {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            })
        })
        .collect();
    for spinner in spinners {
        spinner.join().expect("a busy thread panicked");
    }
}

fn spiky(idle: Duration, burn_ns: u64, rounds: u32) {
    for round in 0..rounds {
        thread::sleep(idle);
        let start_ns = workload::clock_ns(libc::CLOCK_MONOTONIC);
        let cpu_ns = workload::burn(burn_ns);
        let end_ns = workload::clock_ns(libc::CLOCK_MONOTONIC);
        println!(
            "round {round} start_ns {start_ns} end_ns {end_ns} cpu_ns {cpu_ns} wall_ms {:.1}",
            (end_ns - start_ns) as f64 / 1e6
        );
    }
}
