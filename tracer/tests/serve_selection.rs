//! `serve` takes the same selection options as tracing: a glob (`--cgroup '/x-*'`) and a
//! container id prefix (`--container`). Three real v1 groups with quotas, each throttled by a
//! busy thread: the two a selection names get series whose stop counts follow their own
//! cpu.stat `nr_throttled`, the third gets none although cpu.stat shows it throttled.
mod common;

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    time::Duration,
};

use common::{Cgroup, Running};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");

/// A cgroup with 20 ms of quota per 100 ms and one busy thread in it, throttled until dropped.
struct Throttled {
    cgroup: Cgroup,
    _workload: Running,
}

impl Throttled {
    fn in_cgroup(cgroup: Cgroup) -> Self {
        cgroup.set_quota(Some(20_000), 100_000);
        cgroup.favour();
        // Dropping kills it. It must outlast both serves, whose start alone took 30 to 50 s each
        // under emulation with the tracepoint backend: a 60 s workload had ended before the
        // second serve counted a stop.
        let workload = common::spawn_in(&mut common::busy(1, 600), &cgroup, None);
        Self {
            cgroup,
            _workload: workload,
        }
    }

    fn nr_throttled(&self) -> u64 {
        self.cgroup.stat().nr_throttled
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// The body of a GET, if the server answered 200.
fn get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    (head.split(' ').nth(1) == Some("200")).then(|| body.to_owned())
}

/// `throttle_tracer_stops_total` of `cgroup`, if it has a series.
fn stops(scrape: &str, cgroup: &str) -> Option<u64> {
    let series = format!("throttle_tracer_stops_total{{cgroup=\"{cgroup}\"");
    scrape
        .lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Serves `selection` while the groups throttle; `selected` must have series that count their
/// stops, `other` none.
fn serve_selects(selection: &[&str], selected: &[&Throttled], other: &Throttled) {
    let throttled = || -> Vec<u64> { selected.iter().map(|t| t.nr_throttled()).collect() };
    let port = free_port();
    // The stops counted lie between two readings of cpu.stat: before serve starts and once
    // it answers (its probes are attached by then), and after the scrape.
    let before_start = throttled();
    let _serve = Running::spawn(
        Command::new(TRACER)
            .args(["serve", "--backend", &common::backend(), "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(selection)
            .stdout(Stdio::null()),
    );
    common::wait_until(Duration::from_secs(60), "serve answering /healthz", || {
        get(port, "/healthz").is_some()
    });
    let attached = throttled();
    // Each busy thread is throttled once per 100 ms period: ten periods or more.
    let mut scrape = String::new();
    common::wait_until(
        Duration::from_secs(30),
        "ten stops of each selected group",
        || {
            scrape = get(port, "/metrics").unwrap_or_default();
            selected
                .iter()
                .all(|t| stops(&scrape, t.cgroup.path()).is_some_and(|n| n >= 10))
        },
    );
    let after = throttled();
    for (i, t) in selected.iter().enumerate() {
        let path = t.cgroup.path();
        let count = stops(&scrape, path).unwrap();
        // One stop per throttled period (one thread); a stop in progress at a reading counts
        // on one side only, and the exporter counts a stop when the run loop drains its record
        // (every 100 ms, one period): up to two behind cpu.stat at the scrape.
        let (most, least) = (after[i] - before_start[i], after[i] - attached[i]);
        assert!(
            (least.saturating_sub(2)..=most + 1).contains(&count),
            "{path}: {count} stops; cpu.stat nr_throttled rose by {least} from the attach and \
             by {most} from before serve started"
        );
    }
    let other = other.cgroup.path();
    assert_eq!(
        stops(&scrape, other),
        None,
        "{other} was not selected:\n{scrape}"
    );
}

#[test]
fn serve_takes_globs_and_container_ids() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let one = Throttled::in_cgroup(Cgroup::new(&host.cpu, "serve-sel1"));
    let two = Throttled::in_cgroup(Cgroup::new(&host.cpu, "serve-sel2"));
    let other = Throttled::in_cgroup(Cgroup::new(&host.cpu, "serve-other"));
    // The cgroupfs driver's layout for a Docker container: .../docker/<64 hex digits>.
    let id = format!("3f2a{:08x}{}", std::process::id(), "0".repeat(52));
    let parent = Cgroup::new(&host.cpu, "serve-docker");
    let docker = parent.child("docker");
    let container = Throttled::in_cgroup(docker.child(&id));
    let glob = format!("/tt-serve-sel*-{}", std::process::id());
    serve_selects(&["--cgroup", &glob], &[&one, &two], &other);
    serve_selects(&["--container", &id[..12]], &[&container], &other);
    assert!(
        other.nr_throttled() >= 10,
        "the unselected group was throttled too"
    );
}
