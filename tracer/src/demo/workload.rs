//! The request workload of `throttle-tracer demo` (its hidden `demo-workload` child): worker
//! threads that each handle requests of a fixed CPU cost, arriving in bursts, the shape of the
//! reference labs (4 workers, 20 ms of CPU per request, arrivals that fit the average but not
//! always one 100 ms period). [`run`] says what it prints.
use std::io::{self, Write};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tracer_common::clock::{burn, clock_ns};

/// The shape of a request workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requests {
    /// Worker threads; a burst never has more requests than this.
    pub threads: usize,
    /// CPU time each request burns.
    pub request_cpu: Duration,
    /// Time between burst arrivals.
    pub interval: Duration,
    /// Requests per burst, cycled.
    pub sizes: &'static [usize],
    /// How long bursts keep arriving.
    pub length: Duration,
}

impl Requests {
    /// The demo's workload: 4 workers, 20 ms requests, a burst every 230 ms of 4, 1, 3, 2
    /// requests (80, 20, 60, 40 ms of CPU; 0.22 CPU on average). 230 ms is no multiple of the
    /// 100 ms period, so a burst size arrives at a different point of the period each cycle:
    /// with 250 ms the 80 and 60 ms bursts always met the same phase, and a run whose phase
    /// split both across a refill (75-85 ms in, on two CPUs) was never stopped.
    pub const fn demo(length: Duration) -> Self {
        Self {
            threads: 4,
            request_cpu: Duration::from_millis(20),
            interval: Duration::from_millis(230),
            sizes: &[4, 1, 3, 2],
            length,
        }
    }
}

/// One request done: which burst, when it finished, the CPU it burned.
struct Done {
    burst: usize,
    end_ns: u64,
    cpu_ns: u64,
}

/// One burst as measured.
struct Burst {
    index: usize,
    size: usize,
    arrival_ns: u64,
    cpu_ns: u64,
    wall_ns: u64,
}

/// Runs the workload, then writes one line per burst to `out`: `burst <k> size <n> arrival_ns
/// <CLOCK_MONOTONIC> cpu_ns <Σ CPU of its requests> wall_ns <arrival → last request done>`.
/// Every `interval` a burst of `sizes[k % sizes.len()]` requests arrives, one per worker; each
/// burns its cost on its worker's CPU clock (CLOCK_THREAD_CPUTIME_ID: time stopped by the quota
/// does not count).
pub fn run(shape: &Requests, out: &mut impl Write) -> io::Result<()> {
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let cost_ns = u64::try_from(shape.request_cpu.as_nanos()).unwrap_or(u64::MAX);
    let workers: Vec<_> = (0..shape.threads.max(1))
        .map(|_| {
            let (tx, rx) = mpsc::channel::<usize>();
            let done = done_tx.clone();
            let handle = thread::spawn(move || {
                for burst in rx {
                    let cpu_ns = burn(cost_ns);
                    let end_ns = clock_ns(libc::CLOCK_MONOTONIC);
                    if done
                        .send(Done {
                            burst,
                            end_ns,
                            cpu_ns,
                        })
                        .is_err()
                    {
                        break;
                    }
                }
            });
            (tx, handle)
        })
        .collect();
    drop(done_tx);

    let start = Instant::now();
    let mut bursts = Vec::new();
    for k in 0.. {
        let offset = shape
            .interval
            .saturating_mul(u32::try_from(k).unwrap_or(u32::MAX));
        if offset >= shape.length {
            break;
        }
        if let Some(wait) = (start + offset).checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let size = shape
            .sizes
            .get(k % shape.sizes.len().max(1))
            .map_or(1, |&n| n.min(workers.len()));
        bursts.push(Burst {
            index: k,
            size,
            arrival_ns: clock_ns(libc::CLOCK_MONOTONIC),
            cpu_ns: 0,
            wall_ns: 0,
        });
        for (tx, _) in workers.iter().take(size) {
            // A worker only stops receiving when it could not report, i.e. never here.
            let _ = tx.send(k);
        }
    }
    let handles: Vec<_> = workers.into_iter().map(|(_, handle)| handle).collect();
    for done in done_rx {
        if let Some(b) = bursts.get_mut(done.burst) {
            b.cpu_ns += done.cpu_ns;
            b.wall_ns = b.wall_ns.max(done.end_ns.saturating_sub(b.arrival_ns));
        }
    }
    for handle in handles {
        let _ = handle.join();
    }
    for b in &bursts {
        writeln!(
            out,
            "burst {} size {} arrival_ns {} cpu_ns {} wall_ns {}",
            b.index, b.size, b.arrival_ns, b.cpu_ns, b.wall_ns
        )?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_reports_every_burst() {
        let shape = Requests {
            threads: 2,
            request_cpu: Duration::from_millis(2),
            interval: Duration::from_millis(20),
            sizes: &[2, 1],
            length: Duration::from_millis(70),
        };
        let mut out = Vec::new();
        run(&shape, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<Vec<u64>> = text
            .lines()
            .map(|l| {
                l.split(' ')
                    .skip(1)
                    .step_by(2)
                    .map(|v| v.parse().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(lines.len(), 4, "{text}");
        // [index, size, arrival_ns, cpu_ns, wall_ns]
        assert_eq!(lines.iter().map(|l| l[1]).collect::<Vec<_>>(), [2, 1, 2, 1]);
        for l in &lines {
            assert!(l[3] >= l[1] * 2_000_000, "{l:?}");
            assert!(l[4] >= 2_000_000, "{l:?}");
        }
    }
}
