//! Records per second through the tracer's own decode → aggregate → report path
//! (`throttle-tracer bench-feed`: generated stops fed to a real session, one core), without
//! output and with NDJSON, and the exporter's encoding of 1,000 cgroups; then memory: the agent's resident set plus its BPF maps'
//! `memlock`, idle and holding 1,000 and 10,000 stopped cgroups, next to bpftrace's idle.
use super::procfs::Memory;
use super::procs::{self, Held, Traced};
use super::table::{Row, Summary};
use super::{BPFTRACE_CHECK, Bench};
use anyhow::{Context as _, Result};
use std::thread;
use std::time::Duration;

const INGEST: &str = "ingest (one core)";
const MEMORY: &str = "memory (RSS + BPF maps' memlock)";
const MIB: f64 = 1024.0 * 1024.0;

pub fn rows(bench: &Bench) -> Result<Vec<Row>> {
    let stops = if bench.smoke { 200_000 } else { 2_000_000 };
    let stops_arg = stops.to_string();
    let rate = |json: bool| -> Result<Vec<f64>> {
        let mut args = vec![
            "--backend",
            "tracepoint",
            "--cgroups",
            "1000",
            "--stops",
            &stops_arg,
        ];
        if json {
            args.push("--json");
        }
        (0..bench.runs)
            .map(|_| {
                let r = procs::feed(&bench.tracer, &args)?;
                let records = r["records"].as_f64().context("records")?;
                Ok(records / r["seconds"].as_f64().context("seconds")? / 1e6)
            })
            .collect()
    };
    let bare = rate(false)?;
    let ndjson = rate(true)?;
    let bare_median = Summary::of(&bare).median;
    let mut rows = vec![
        Row::new(
            INGEST,
            "records decoded and aggregated",
            "M records/s",
            &bare,
        )
        .note(format!(
            "{stops} generated stops over 1,000 cgroups, no output"
        )),
        Row::new(
            INGEST,
            "… with NDJSON output (to /dev/null)",
            "M records/s",
            &ndjson,
        )
        .against("without output", bare_median)
        .note(format!(
            "a `stop` line per stop (2 records): {:.2} M lines/s",
            Summary::of(&ndjson).median / 2.0
        )),
    ];

    // The exporter's encodings of 1,000 cgroups' series, as /metrics serves them.
    let mut scrapes = Vec::new();
    for _ in 0..bench.runs.min(3) {
        let args = [
            "--backend",
            "tracepoint",
            "--cgroups",
            "1000",
            "--stops",
            "20000",
            "--exporter",
        ];
        scrapes.push(procs::feed(&bench.tracer, &args)?["scrape"].clone());
    }
    let scrape =
        |key: &str| -> Vec<f64> { scrapes.iter().filter_map(|s| s[key].as_f64()).collect() };
    let protobuf_ms: Vec<f64> = scrape("protobuf_seconds").iter().map(|s| s * 1e3).collect();
    let text_ms: Vec<f64> = scrape("text_seconds").iter().map(|s| s * 1e3).collect();
    let size = |key: &str| Summary::of(&scrape(key)).median / MIB;
    rows.extend([
        Row::new(
            INGEST,
            "exporter scrape, 1,000 cgroups, protobuf",
            "ms",
            &protobuf_ms,
        )
        .note(format!("{:.2} MiB, 20 stops each", size("protobuf_bytes"))),
        Row::new(
            INGEST,
            "exporter scrape, 1,000 cgroups, text",
            "ms",
            &text_ms,
        )
        .against("protobuf", Summary::of(&protobuf_ms).median)
        .note(format!("{:.2} MiB", size("text_bytes"))),
    ]);

    let settle = Duration::from_millis(if bench.smoke { 200 } else { 1000 });
    let mut idle = Vec::new();
    for _ in 0..bench.runs.min(3) {
        let t = Traced::tracer(&bench.tracer, super::TRACEPOINT, &[])?;
        thread::sleep(settle);
        idle.push(Memory::of(t.pid())?);
    }
    let bpftrace = {
        let t = Traced::bpftrace(&BPFTRACE_CHECK)?;
        thread::sleep(settle);
        Memory::of(t.pid())?
    };
    let total = |m: &Memory| (m.rss + m.maps) as f64 / MIB;
    let idle_total = Summary::of(&idle.iter().map(total).collect::<Vec<_>>()).median;
    let bpftrace_total = total(&bpftrace);
    rows.extend([
        Row::new(
            MEMORY,
            "idle agent, RSS + maps",
            "MiB",
            &idle.iter().map(total).collect::<Vec<_>>(),
        )
        .against("bpftrace idle, RSS + maps", bpftrace_total),
        Row::new(MEMORY, "idle agent, RSS", "MiB", &mib(&idle, |m| m.rss)),
        Row::new(
            MEMORY,
            "idle agent, peak RSS (VmHWM)",
            "MiB",
            &mib(&idle, |m| m.peak_rss),
        ),
        Row::new(
            MEMORY,
            "idle agent, BPF maps' memlock",
            "MiB",
            &mib(&idle, |m| m.maps),
        ),
        Row::new(
            MEMORY,
            "bpftrace idle, RSS + maps",
            "MiB",
            &[bpftrace_total],
        )
        .note(format!(
            "RSS {:.1}, maps {:.1}",
            bpftrace.rss as f64 / MIB,
            bpftrace.maps as f64 / MIB
        )),
    ]);
    for cgroups in [1_000u64, 10_000] {
        let n = cgroups.to_string();
        let stops = (cgroups * 20).to_string();
        let held = Held::start(
            &bench.tracer,
            &[
                "--backend",
                "tracepoint",
                "--cgroups",
                &n,
                "--stops",
                &stops,
            ],
        )?;
        let m = Memory::of(held.pid())?;
        rows.push(
            Row::new(
                MEMORY,
                format!("{cgroups} stopped cgroups, RSS + maps"),
                "MiB",
                &[total(&m)],
            )
            .against("idle agent", idle_total)
            .note(format!(
                "20 stops each (generated); RSS {:.1}, maps {:.1}",
                m.rss as f64 / MIB,
                m.maps as f64 / MIB
            )),
        );
    }
    Ok(rows)
}

fn mib(memory: &[Memory], field: fn(&Memory) -> u64) -> Vec<f64> {
    memory.iter().map(|m| field(m) as f64 / MIB).collect()
}
