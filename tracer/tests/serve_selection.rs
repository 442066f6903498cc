//! `serve` takes the same selection options as tracing: a glob (`--cgroup '/x-*'`), container id
//! prefixes (`--container`, in the Docker and the Kubernetes cgroupfs layouts) and a process
//! (`--pid`). Real groups with quotas, each throttled by a busy thread: the ones a selection
//! names get series whose stop counts follow their own cpu.stat `nr_throttled`, another gets
//! none although cpu.stat shows it throttled. The containers' series carry the ids, pod uid and
//! QoS class of the paths the test made. `/healthz` and `/metrics` answer 503 until the probes
//! are attached and 200 from then on.
use test_support as common;

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::Stdio,
    time::Duration,
};

use common::{Cgroup, Running};

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

    fn pid(&self) -> u32 {
        self._workload.id()
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// The status and body of a GET, if the server answered.
fn answer(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The body of a GET, if the server answered 200.
fn get(port: u16, path: &str) -> Option<String> {
    answer(port, path).and_then(|(status, body)| (status == 200).then_some(body))
}

/// `throttle_tracer_stops_total` of `cgroup`, if it has a series.
fn stops(scrape: &str, cgroup: &str) -> Option<u64> {
    let series = format!("throttle_tracer_group_stop_seconds_count{{cgroup=\"{cgroup}\"");
    scrape
        .lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Serves `selection` while the groups throttle; `selected` must have series that count their
/// stops, `other` none. Returns the last scrape.
fn serve_selects(selection: &[&str], selected: &[&Throttled], other: &Throttled) -> String {
    let throttled = || -> Vec<u64> { selected.iter().map(|t| t.nr_throttled()).collect() };
    let port = free_port();
    // The stops counted lie between two readings of cpu.stat: before serve starts and once
    // it answers (its probes are attached by then), and after the scrape.
    let before_start = throttled();
    let _serve = Running::spawn(
        common::tracer::command()
            .args(["serve", "--backend", &common::backend(), "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(selection)
            .stdout(Stdio::null()),
    );
    // Every answer is a 503 (attaching), for /metrics too, until the first 200; once ready it
    // stays ready. Readiness may come between a 503 of /healthz and the /metrics request after
    // it (the 7.x guest: [.., 503, 200, 200]).
    let mut statuses = Vec::new();
    common::wait_until(Duration::from_secs(60), "serve answering /healthz", || {
        let status = answer(port, "/healthz").map(|(status, _)| status);
        statuses.extend(status);
        if status == Some(503) {
            statuses.extend(answer(port, "/metrics").map(|(status, _)| status));
        }
        status == Some(200)
    });
    let attached = throttled();
    let attaching = statuses.iter().take_while(|s| **s == 503).count();
    assert!(
        attaching < statuses.len() && statuses[attaching..].iter().all(|s| *s == 200),
        "/healthz and /metrics answered {statuses:?}"
    );
    println!("{selection:?}: {attaching} answer(s) of 503 while attaching, then 200");
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
        // One group stop per throttled period (the per-CPU stops of one period, which a thread
        // that moves between CPUs can make two of, are one); a stop in progress at a reading
        // counts on one side only, the exporter counts a stop when the run loop drains its
        // record (every 100 ms, one period), and a group stop once the next one begins: up to
        // three behind cpu.stat at the scrape.
        let (most, least) = (after[i] - before_start[i], after[i] - attached[i]);
        assert!(
            (least.saturating_sub(3)..=most + 1).contains(&count),
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
    assert_eq!(answer(port, "/healthz").map(|a| a.0), Some(200));
    scrape
}

/// The labels of `cgroup`'s `throttle_tracer_stops_total` series, as served.
fn labels<'a>(scrape: &'a str, cgroup: &str) -> &'a str {
    let series = format!("throttle_tracer_stops_total{{cgroup=\"{cgroup}\"");
    let line = scrape.lines().find(|l| l.starts_with(&series)).unwrap();
    &line[line.find('{').unwrap()..=line.find('}').unwrap()]
}

#[test]
fn serve_takes_globs_container_ids_and_pids() {
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
    // The kubelet's cgroupfs layout: .../kubepods/burstable/pod<uid>/<64 hex digits>.
    let uid = format!("{:08x}-0000-4000-8000-0123456789ab", std::process::id());
    let kube_id = format!("6b7c{:08x}{}", std::process::id(), "1".repeat(52));
    let node = Cgroup::new(&host.cpu, "serve-node");
    let kubepods = node.child("kubepods");
    let burstable = kubepods.child("burstable");
    let pod = burstable.child(&format!("pod{uid}"));
    let kube = Throttled::in_cgroup(pod.child(&kube_id));

    let glob = format!("/tt-serve-sel*-{}", std::process::id());
    serve_selects(&["--cgroup", &glob], &[&one, &two], &other);
    let scrape = serve_selects(
        &["--container", &id[..12], "--container", &kube_id[..8]],
        &[&container, &kube],
        &other,
    );
    let pid = two.pid().to_string();
    serve_selects(&["--pid", &pid], &[&two], &other);

    let docker_labels = labels(&scrape, container.cgroup.path());
    println!("{docker_labels}");
    assert!(
        docker_labels.contains(&format!(
            "container_id=\"{}\",container_id_full=\"{id}\"",
            &id[..12]
        )) && !docker_labels.contains("pod_uid"),
        "{docker_labels}"
    );
    let kube_labels = labels(&scrape, kube.cgroup.path());
    println!("{kube_labels}");
    assert!(
        kube_labels.contains(&format!(
            "container_id=\"{}\",container_id_full=\"{kube_id}\",pod_uid=\"{uid}\",qos=\"burstable\"",
            &kube_id[..12]
        )),
        "{kube_labels}"
    );
    assert!(
        other.nr_throttled() >= 10,
        "the unselected group was throttled too"
    );
}
