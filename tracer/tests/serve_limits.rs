//! `serve` under a flood of bad clients on loopback: malformed, oversized, slow (a byte a
//! second) and many idle connections at once, while a well-behaved scrape keeps being answered
//! in its normal time, its memory stays bounded and only GET and HEAD are served; and what it
//! serves tells no more than cgroup names and counts.
use test_support as common;

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use common::{Cgroup, Running, http::free_port};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");

/// The status of `request` sent whole, and how long the answer took; `None` if the server
/// closed without one.
fn send(port: u16, request: &[u8]) -> Option<(u16, Duration)> {
    answer(port, request).map(|(status, took, _)| (status, took))
}

/// [`send`], with the whole response.
fn answer(port: u16, request: &[u8]) -> Option<(u16, Duration, Vec<u8>)> {
    let began = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    stream.write_all(request).ok()?;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let status = String::from_utf8_lossy(&response)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())?;
    Some((status, began.elapsed(), response))
}

/// The resident memory of process `pid` (VmRSS in /proc/PID/status), KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS: {status}"))
}

/// How much the flood may add to the resident memory of a quiet `serve`: it keeps 64
/// connections open at most (serve.rs MAX_CONNECTIONS), each with an 8 KiB head buffer, its
/// write buffer and its task; 128 KiB each is four times that, and 8 MiB in all is still far
/// below what an unbounded server would take from 100 idle, 40 slow and a stream of oversized
/// clients.
const FLOOD_RSS_KIB: u64 = 8 * 1024;

const SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

#[test]
fn a_flood_of_bad_clients_leaves_scrapes_answered_in_normal_time() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    // A group throttled throughout: its series are what a scrape holds.
    let cgroup = Cgroup::throttled(&host.cpu, "serve-flood", 20_000, 100_000);
    let port = free_port();
    let serve = Running::spawn(
        common::tracer::command()
            .args(["serve", "--backend", &common::backend(), "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--cgroup", cgroup.path()])
            .stdout(Stdio::null()),
    );
    let _workload = common::spawn_in(&mut common::busy(1, 60), &cgroup, None);
    common::wait_until(Duration::from_secs(60), "serve answering /metrics", || {
        send(port, SCRAPE).is_some_and(|(s, _)| s == 200)
    });
    let mut quiet: Vec<Duration> = (0..5).map(|_| send(port, SCRAPE).unwrap().1).collect();
    quiet.sort();
    let normal = quiet[2];
    let quiet_rss = rss_kib(serve.id());

    // What is refused, each on its own.
    let oversized = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    let many_headers: String = (0..100).map(|i| format!("X-{i}: y\r\n")).collect();
    let many_headers = format!("GET /metrics HTTP/1.1\r\n{many_headers}\r\n");
    for (what, request, allowed) in [
        (
            "POST",
            &b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"[..],
            &[405][..],
        ),
        ("DELETE", b"DELETE /metrics HTTP/1.1\r\n\r\n", &[405]),
        ("garbage", b"\x00\xff\x13garbage\r\n\r\n", &[400]),
        ("oversized head", oversized.as_bytes(), &[431, 400]),
        ("100 headers", many_headers.as_bytes(), &[431, 400]),
    ] {
        let got = send(port, request).map(|(s, _)| s);
        assert!(
            got.is_none_or(|s| allowed.contains(&s)),
            "{what}: answered {got:?}"
        );
    }

    // The flood: 100 idle connections, 40 sending a byte a second, and a stream of
    // malformed and oversized requests, all at once.
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    let idle: Vec<TcpStream> = (0..100)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    for _ in 0..40 {
        let stop = stop.clone();
        flood.push(thread::spawn(move || {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                return;
            };
            for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n".iter().cycle() {
                if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                    return;
                }
                thread::sleep(Duration::from_secs(1));
            }
        }));
    }
    for _ in 0..2 {
        let (stop, oversized) = (stop.clone(), oversized.clone());
        flood.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = send(port, b"\x16\x03\x01 not http\r\n\r\n");
                let _ = send(port, oversized.as_bytes());
            }
        }));
    }
    let mut slowest = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut scrapes = 0;
    let mut peak_rss = quiet_rss;
    while Instant::now() < deadline {
        peak_rss = peak_rss.max(rss_kib(serve.id()));
        let answer = send(port, SCRAPE);
        let (status, took) = answer.unwrap_or_else(|| panic!("scrape {scrapes}: no answer"));
        assert_eq!(status, 200, "scrape {scrapes}");
        slowest = slowest.max(took);
        scrapes += 1;
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        t.join().unwrap();
    }
    drop(idle);
    let after_rss = rss_kib(serve.id());
    println!(
        "{scrapes} scrapes during the flood, slowest {slowest:?}; quiet median {normal:?}; \
         VmRSS {quiet_rss} KiB quiet, {peak_rss} KiB at most during the flood, {after_rss} KiB \
         after"
    );
    assert!(
        peak_rss.max(after_rss) <= quiet_rss + FLOOD_RSS_KIB,
        "VmRSS grew from {quiet_rss} KiB to {peak_rss} KiB (after: {after_rss} KiB)"
    );
    // Normal time: a scrape is milliseconds here; what a Prometheus would notice is seconds.
    assert!(
        slowest < Duration::from_secs(1).max(normal * 20),
        "slowest scrape {slowest:?} (quiet: {normal:?})"
    );
}

/// HEAD is answered as GET without a body, an unknown path is a 404, and a scrape holds only
/// the exporter's own families: every line a `throttle_tracer_*` sample or its `# HELP` /
/// `# TYPE` / `# UNIT` (and OpenMetrics' `# EOF`), every label a cgroup's path or a part of its name, a
/// family's bucket or reason; nothing of the host beyond that: not its name, the tracer's
/// environment or working directory, nor a path outside the cgroup tree.
#[test]
fn head_unknown_paths_and_a_scrape_that_tells_only_cgroups_and_counts() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cgroup = Cgroup::throttled(&host.cpu, "serve-reveal", 20_000, 100_000);
    let port = free_port();
    let _serve = Running::spawn(
        common::tracer::command()
            .args(["serve", "--backend", &common::backend(), "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--cgroup", cgroup.path()])
            .stdout(Stdio::null()),
    );
    common::http::wait_ready(port, "/metrics", "serve");
    let workload = common::spawn_in(&mut common::busy(1, 1), &cgroup, None).wait();
    assert!(workload.expect("run throttle-workload").success());
    cgroup.wait_refilled();

    let head = b"HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let (status, _, response) = answer(port, head).expect("an answer to HEAD");
    let response = String::from_utf8_lossy(&response);
    assert_eq!(status, 200, "{response}");
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    assert!(body.is_empty(), "HEAD answered with a body: {response}");
    let (status, body) = common::http::get(port, "/no/such/path").expect("GET an unknown path");
    assert_eq!(status, 404, "{body}");

    let (status, scrape) = common::http::get(port, "/metrics").expect("scrape");
    assert_eq!(status, 200, "{scrape}");
    assert!(
        scrape.contains(&format!("cgroup=\"{}\"", cgroup.path())),
        "no series of the throttled group: {scrape}"
    );
    for line in scrape.lines().filter(|l| !l.is_empty()) {
        let family = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .or_else(|| line.strip_prefix("# UNIT "))
            .unwrap_or(line);
        assert!(
            family.starts_with("throttle_tracer_") || line == "# EOF",
            "not the exporter's own: {line}"
        );
    }
    // What the host would give away: its name, the environment the tracer ran in (the test's,
    // values long enough to be recognised), its working directory, paths beyond the cgroups.
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let cwd = std::env::current_dir().unwrap();
    let secrets: Vec<String> = std::env::vars()
        .map(|(_, v)| v)
        .chain([
            hostname.trim().to_owned(),
            cwd.display().to_string(),
            TRACER.to_owned(),
        ])
        .filter(|v| v.len() >= 8)
        .collect();
    for value in labels(&scrape) {
        assert!(
            !secrets.iter().any(|s| value.contains(s.as_str())),
            "a label tells of the host: {value:?}"
        );
        assert!(
            !value.starts_with('/') || value.starts_with(cgroup.path()),
            "a path beyond the traced cgroup: {value:?}"
        );
    }
    for forbidden in ["/sys/", "/proc/", "/home/", "/root", "/tmp/"] {
        assert!(
            !scrape.contains(forbidden),
            "{forbidden} in the scrape: {scrape}"
        );
    }
    println!(
        "{} lines, {} label values, all the exporter's own",
        scrape.lines().count(),
        labels(&scrape).len()
    );
}

/// Every label value of a text exposition's samples.
fn labels(scrape: &str) -> Vec<&str> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| Some(l.split_once('{')?.1.rsplit_once('}')?.0))
        .flat_map(|labels| labels.split("\","))
        .filter_map(|pair| Some(pair.split_once("=\"")?.1.trim_end_matches('"')))
        .collect()
}
