//! `throttle-tracer bench-feed` (hidden): `cargo xtask bench`'s ingest and memory figures. A
//! session starts as the default command's does, then generated stop records go through
//! [`Session::feed`], the decode, aggregate and report path every ring-buffer record takes. The
//! time of the feeding alone goes to stderr as one JSON object (with `--exporter`, also the
//! exporter's encodings); with `--hold` the session then stays up, its state in memory, until stdin
//! closes.
use std::io::Read as _;
use std::time::{Duration, Instant};

use tracer_common::{END_REFILL, EVENT_END, EVENT_START, StopEvent};

use crate::advice::Target;
use crate::agent::{Request, Session};
use crate::cli::BenchFeedArgs;
use crate::error::{Failure, say};
use crate::records;
use crate::report::prometheus::{AdviceConfig, Config, Exporter, Scraper};
use crate::report::{Ndjson, Sink};

/// Generated cgroup ids start here, far above any inode number of a real cgroup.
const FIRST_ID: u64 = 1 << 48;
/// Simulated CPUs the stops are spread over.
const CPUS: u64 = 4;

pub fn run(args: &BenchFeedArgs) -> Result<(), Failure> {
    let sinks: Vec<Box<dyn Sink>> = if args.json {
        vec![Box::new(Ndjson::stdout(0))]
    } else {
        Vec::new()
    };
    let mut session = Session::start(Request {
        probes: &args.probes,
        cgroups: Vec::new(),
        pids: Vec::new(),
        sinks,
        target: Target::DEFAULT,
    })?;
    let scraper = args.exporter.then(|| {
        let exporter = Exporter::new(Config {
            max_cgroups: usize::try_from(args.cgroups).unwrap_or(usize::MAX).max(1),
            gone_after: Duration::from_secs(300),
            named: Vec::new(),
            advice: Some(AdviceConfig::default()),
        });
        let scraper = exporter.scraper();
        session.add_sink(Box::new(exporter));
        scraper
    });
    let cgroups = args.cgroups.max(1);
    let base_ns = records::monotonic_now_ns();
    let started = Instant::now();
    // Two records rewritten in place: building each anew was the generator's own memcpy of
    // ~500 bytes a record, timed with the path measured.
    let (mut start, mut end) = records_of_a_stop();
    for i in 0..args.stops {
        stop(i, cgroups, base_ns, &mut start, &mut end);
        session.feed(as_bytes(&start));
        session.feed(as_bytes(&end));
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut result = serde_json::json!({ "records": 2 * args.stops, "seconds": seconds });
    if let Some(scraper) = scraper {
        result["scrape"] = scrapes(&scraper)?;
    }
    say!("{result}");
    if args.hold {
        // Until the bench closes our stdin; what it reads meanwhile is this state.
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    }
    Ok(())
}

/// A start and an end record with what every generated stop shares.
fn records_of_a_stop() -> (StopEvent, StopEvent) {
    let mut comm = [0; 16];
    comm[..4].copy_from_slice(b"busy");
    let start = StopEvent {
        kind: EVENT_START,
        quota_ns: 50_000_000,
        period_ns: 100_000_000,
        tasks: 1,
        pid: 1000,
        tid: 1000,
        comm,
        ..StopEvent::default()
    };
    let end = StopEvent {
        kind: EVENT_END,
        end_reason: END_REFILL,
        ..start
    };
    (start, end)
}

/// Makes `start` and `end` the records of stop `i`: cgroups in turn, each on the CPUs in
/// turn, 1 to 100 ms long, so that every histogram bucket in between fills.
fn stop(i: u64, cgroups: u64, base_ns: u64, start: &mut StopEvent, end: &mut StopEvent) {
    let cgroup = i % cgroups;
    let cpu = (i / cgroups) % CPUS;
    let length_ns = (1 + (i.wrapping_mul(7919) % 100)) * 1_000_000;
    for record in [&mut *start, &mut *end] {
        record.cpu = cpu as u32;
        record.cgroup_id = FIRST_ID + cgroup;
        record.cfs_rq = (FIRST_ID + cgroup) * CPUS + cpu;
        record.start_ns = base_ns + i * 1_000;
    }
    end.end_ns = end.start_ns + length_ns;
    end.kernel_ns = length_ns;
}

/// Seconds and bytes of each encoding of the exporter's metrics, as `/metrics` serves them.
fn scrapes(scraper: &Scraper) -> Result<serde_json::Value, Failure> {
    let failed = |e: String| Failure::environment_without_hint(format!("cannot encode: {e}"));
    let t = Instant::now();
    let (_, text) = scraper.encode(false).map_err(|e| failed(e.to_string()))?;
    let text_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let protobuf = scraper.protobuf().map_err(|e| failed(e.to_string()))?;
    let protobuf_s = t.elapsed().as_secs_f64();
    Ok(serde_json::json!({
        "text_bytes": text.len(),
        "text_seconds": text_s,
        "protobuf_bytes": protobuf.len(),
        "protobuf_seconds": protobuf_s,
    }))
}

fn as_bytes(event: &StopEvent) -> &[u8] {
    // SAFETY: `StopEvent` is `#[repr(C)]` plain integers and bytes without padding (the
    // kernel writes the same bytes into the ring buffer).
    unsafe {
        std::slice::from_raw_parts(
            std::ptr::from_ref(event).cast::<u8>(),
            size_of::<StopEvent>(),
        )
    }
}
