//! `serve` under a flood of bad clients on loopback: malformed, oversized, slow (a byte a
//! second) and many idle connections at once, while a well-behaved scrape keeps being answered
//! in its normal time and only GET and HEAD are served.
mod common;

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use common::Running;

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// The status of `request` sent whole, and how long the answer took; `None` if the server
/// closed without one.
fn send(port: u16, request: &[u8]) -> Option<(u16, Duration)> {
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
    Some((status, began.elapsed()))
}

const SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

#[test]
fn a_flood_of_bad_clients_leaves_scrapes_answered_in_normal_time() {
    let Some(_host) = common::require(common::host()) else {
        return;
    };
    let port = free_port();
    let _serve = Running::spawn(
        Command::new(TRACER)
            .args(["serve", "--backend", &common::backend(), "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::null()),
    );
    common::wait_until(Duration::from_secs(60), "serve answering /metrics", || {
        send(port, SCRAPE).is_some_and(|(s, _)| s == 200)
    });
    let mut quiet: Vec<Duration> = (0..5).map(|_| send(port, SCRAPE).unwrap().1).collect();
    quiet.sort();
    let normal = quiet[2];

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
    while Instant::now() < deadline {
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
    println!("{scrapes} scrapes during the flood, slowest {slowest:?}; quiet median {normal:?}");
    // Normal time: a scrape is milliseconds here; what a Prometheus would notice is seconds.
    assert!(
        slowest < Duration::from_secs(1).max(normal * 20),
        "slowest scrape {slowest:?} (quiet: {normal:?})"
    );
}
