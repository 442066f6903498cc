//! `throttle-workload arrivals`: requests of a known CPU cost arriving at random (Poisson), taken
//! by worker threads from one queue in arrival order, the shape of reference 003's lab. The gaps
//! come from a seeded generator, so that a rerun with the same seed is the same workload; [`run`]
//! prints what each request did by the workload's own clocks, the truth the advice tests judge by.
use std::io::{self, Write};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng as _};

use tracer_common::clock::clock_ns;

/// CPU time between two progress marks.
const MARK_NS: u64 = 1_000_000;

/// The shape of a random-arrivals run. Reference 003's lab is 20 ms of CPU a request, 10 a
/// second, 4 workers, and no queue of the application's own: a request waits for a free worker.
pub struct Arrivals {
    pub threads: usize,
    pub request_cpu: Duration,
    /// Mean arrivals per second.
    pub rate: f64,
    pub length: Duration,
    pub seed: u64,
    /// Wait before the first arrival: where the group's period boundaries fall among the
    /// arrivals (their phase), which is set when the cgroup's quota is written.
    pub delay: Duration,
}

/// One request as measured.
#[derive(Clone, Default)]
struct Request {
    arrival_ns: u64,
    start_ns: u64,
    end_ns: u64,
    cpu_ns: u64,
    /// (CLOCK_MONOTONIC, CPU burned so far) every `MARK_NS` of CPU.
    marks: Vec<(u64, u64)>,
}

/// Burns `ns` of this thread's CPU time; returns what it burned and its progress marks.
fn burn_marked(ns: u64) -> (u64, Vec<(u64, u64)>) {
    let start = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let mut marks = Vec::with_capacity(usize::try_from(ns / MARK_NS).unwrap_or(0) + 1);
    let mut used = 0;
    while used < ns {
        used = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(start);
        if used >= (marks.len() as u64 + 1) * MARK_NS {
            marks.push((clock_ns(libc::CLOCK_MONOTONIC), used));
        }
    }
    (used, marks)
}

/// The arrival offsets from the start: exponential gaps of mean 1 / rate, up to `length`.
fn offsets(shape: &Arrivals) -> Vec<Duration> {
    let mut rng = SmallRng::seed_from_u64(shape.seed);
    let mean_s = 1.0 / shape.rate.max(f64::MIN_POSITIVE);
    let mut at = 0.0;
    let mut out = Vec::new();
    loop {
        // 1 − U is in (0, 1]: its logarithm is finite.
        at += -(1.0 - rng.random::<f64>()).ln() * mean_s;
        let offset = Duration::from_secs_f64(at.min(shape.length.as_secs_f64()));
        if offset >= shape.length {
            return out;
        }
        out.push(offset);
    }
}

/// Runs the workload, then writes one line per request to `out`, CLOCK_MONOTONIC ns:
/// `request <i> arrival_ns <A> start_ns <S> end_ns <E> cpu_ns <C> marks <T>:<c>,<T>:<c>,...`.
/// A request burns its cost on its worker's CLOCK_THREAD_CPUTIME_ID (time stopped by the quota
/// does not count); a mark says it had burned `c` ns at `T`, one per ms of CPU, so that the CPU
/// it burned within any span (a period, a busy run) is known to 1 ms even across its ends.
pub fn run(shape: &Arrivals, out: &mut impl Write) -> io::Result<()> {
    let offsets = offsets(shape);
    let cost_ns = u64::try_from(shape.request_cpu.as_nanos()).unwrap_or(u64::MAX);
    let (queue_tx, queue_rx) = mpsc::channel::<(usize, u64)>();
    let queue = Arc::new(Mutex::new(queue_rx));
    let (done_tx, done_rx) = mpsc::channel::<(usize, Request)>();
    let workers: Vec<_> = (0..shape.threads.max(1))
        .map(|_| {
            let queue = Arc::clone(&queue);
            let done = done_tx.clone();
            thread::spawn(move || {
                loop {
                    // The lock is held only while waiting for the next request, as a worker
                    // blocked in accept(2) would be.
                    let next = queue.lock().map(|q| q.recv());
                    let Ok(Ok((index, arrival_ns))) = next else {
                        break;
                    };
                    let start_ns = clock_ns(libc::CLOCK_MONOTONIC);
                    let (cpu_ns, marks) = burn_marked(cost_ns);
                    let end_ns = clock_ns(libc::CLOCK_MONOTONIC);
                    let request = Request {
                        arrival_ns,
                        start_ns,
                        end_ns,
                        cpu_ns,
                        marks,
                    };
                    if done.send((index, request)).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    drop(done_tx);

    let start = Instant::now() + shape.delay;
    for (index, offset) in offsets.iter().enumerate() {
        if let Some(wait) = (start + *offset).checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        // The workers only stop receiving once the queue is closed, below.
        let _ = queue_tx.send((index, clock_ns(libc::CLOCK_MONOTONIC)));
    }
    drop(queue_tx);
    let mut requests = vec![Request::default(); offsets.len()];
    for (index, request) in done_rx {
        requests[index] = request;
    }
    for worker in workers {
        let _ = worker.join();
    }
    for (i, r) in requests.iter().enumerate() {
        let marks: Vec<String> = r.marks.iter().map(|(t, c)| format!("{t}:{c}")).collect();
        writeln!(
            out,
            "request {i} arrival_ns {} start_ns {} end_ns {} cpu_ns {} marks {}",
            r.arrival_ns,
            r.start_ns,
            r.end_ns,
            r.cpu_ns,
            marks.join(",")
        )?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(seed: u64, length: Duration) -> Arrivals {
        Arrivals {
            threads: 2,
            request_cpu: Duration::from_millis(1),
            rate: 100.0,
            length,
            seed,
            delay: Duration::ZERO,
        }
    }

    #[test]
    fn the_same_seed_is_the_same_arrivals_at_the_mean_rate() {
        let long = shape(7, Duration::from_secs(100));
        let a = offsets(&long);
        assert_eq!(a, offsets(&long));
        assert_ne!(a, offsets(&shape(8, Duration::from_secs(100))));
        // 10,000 expected; a Poisson count's standard deviation is 100.
        assert!((9_500..=10_500).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn every_request_is_done_and_reported_with_its_own_cpu() {
        let mut out = Vec::new();
        run(&shape(1, Duration::from_millis(100)), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().count() > 2, "{text}");
        for line in text.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            let v: Vec<u64> = words[3..10]
                .iter()
                .step_by(2)
                .map(|v| v.parse().unwrap())
                .collect();
            let [arrival, start, end, cpu] = v[..] else {
                panic!("{line}")
            };
            assert!(arrival <= start && start < end, "{line}");
            assert!(cpu >= 1_000_000, "{line}");
            // One mark per ms of CPU, in order, within the request.
            let marks: Vec<(u64, u64)> = words[11]
                .split(',')
                .map(|m| {
                    let (t, c) = m.split_once(':').unwrap();
                    (t.parse().unwrap(), c.parse().unwrap())
                })
                .collect();
            assert_eq!(marks.len() as u64, cpu / MARK_NS, "{line}");
            assert!(
                marks
                    .windows(2)
                    .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1)
            );
            assert!(
                marks
                    .iter()
                    .all(|&(t, c)| start <= t && t <= end && c <= cpu)
            );
        }
    }

    #[test]
    fn a_delay_holds_back_the_first_arrival() {
        let mut quick = shape(1, Duration::from_millis(50));
        let first_arrival = |shape: &Arrivals| {
            let before = clock_ns(libc::CLOCK_MONOTONIC);
            let mut out = Vec::new();
            run(shape, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            let first: u64 = text.split(' ').nth(3).unwrap().parse().unwrap();
            first - before
        };
        let offset = u64::try_from(offsets(&quick)[0].as_nanos()).unwrap();
        assert!(first_arrival(&quick) >= offset);
        quick.delay = Duration::from_millis(30);
        assert!(first_arrival(&quick) >= offset + 30_000_000);
    }
}
