//! `serve` takes the same selection options as tracing: a glob (`--cgroup '/x-*'`) and a
//! container id prefix (`--container`). Three real v1 groups with quotas, each throttled by a
//! busy thread: the two a selection names get series whose stop counts follow their own
//! cpu.stat `nr_throttled`, the third gets none although cpu.stat shows it throttled.
mod common;

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");
const WORKLOAD: &str = env!("CARGO_BIN_EXE_throttle-workload");

/// Test cgroups (removed last, deepest first) and processes; Drop cleans up.
#[derive(Default)]
struct Scene {
    cgroups: Vec<PathBuf>,
    children: Vec<Child>,
}

impl Scene {
    /// A cgroup with 20 ms of quota per 100 ms and one busy thread in it.
    fn throttled(&mut self, path: &str) -> PathBuf {
        let mut dir = PathBuf::from(common::CPU_ROOT);
        for part in path.split('/').filter(|p| !p.is_empty()) {
            dir.push(part);
            if !dir.exists() {
                fs::create_dir(&dir).unwrap();
                self.cgroups.push(dir.clone());
            }
        }
        fs::write(dir.join("cpu.cfs_quota_us"), "20000").unwrap();
        // Ahead of whatever else the machine runs, so the thread does use its quota.
        fs::write(dir.join("cpu.shares"), "262144").unwrap();
        let procs = dir.join("cgroup.procs");
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {} && exec {WORKLOAD} busy --threads 1 --seconds 60",
                procs.display()
            ))
            .spawn()
            .unwrap();
        self.children.push(child);
        dir
    }

    fn serve(&mut self, port: u16, selection: &[&str]) {
        let child = Command::new(TRACER)
            .args(["serve", "--backend", "tracepoint", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(selection)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in self.cgroups.iter().rev() {
            let deadline = Instant::now() + Duration::from_secs(2);
            while fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn nr_throttled(dir: &std::path::Path) -> u64 {
    let stat = fs::read_to_string(dir.join("cpu.stat")).unwrap();
    stat.lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|v| v.parse().ok())
        .unwrap()
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

/// Serves `selection` while three groups throttle; `selected` (paths) must have series that
/// count their stops, `other` none.
fn serve_selects(scene: &mut Scene, selection: &[&str], selected: &[(&str, PathBuf)], other: &str) {
    let throttled = || -> Vec<u64> { selected.iter().map(|(_, dir)| nr_throttled(dir)).collect() };
    let port = free_port();
    // The stops counted lie between two readings of cpu.stat: before serve starts and once
    // it answers (its probes are attached by then), and after the scrape.
    let before_start = throttled();
    scene.serve(port, selection);
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(port, "/healthz").is_none() {
        assert!(Instant::now() < deadline, "serve never answered /healthz");
        thread::sleep(Duration::from_millis(50));
    }
    let attached = throttled();
    // Each busy thread is throttled once per 100 ms period: ten periods or more.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let scrape = get(port, "/metrics").expect("a scrape");
        let counts: Vec<Option<u64>> = selected.iter().map(|(p, _)| stops(&scrape, p)).collect();
        if counts.iter().all(|c| c.is_some_and(|n| n >= 10)) {
            let after = throttled();
            for (i, (path, _)) in selected.iter().enumerate() {
                let count = counts[i].unwrap();
                // One stop per throttled period (one thread); a stop in progress at a reading
                // counts on one side only.
                let (most, least) = (after[i] - before_start[i], after[i] - attached[i]);
                assert!(
                    (least.saturating_sub(1)..=most + 1).contains(&count),
                    "{path}: {count} stops; cpu.stat nr_throttled rose by {least} from the \
                     attach and by {most} from before serve started"
                );
            }
            assert_eq!(
                stops(&scrape, other),
                None,
                "{other} was not selected:\n{scrape}"
            );
            // One tracer at a time: the next selection gets a server of its own.
            let mut serve = scene.children.pop().unwrap();
            let _ = serve.kill();
            let _ = serve.wait();
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no stops counted for {selected:?}:\n{scrape}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn serve_takes_globs_and_container_ids() {
    if let Some(reason) = common::skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let pid = std::process::id();
    let mut scene = Scene::default();
    let one = format!("/tt-serve-{pid}-sel1");
    let two = format!("/tt-serve-{pid}-sel2");
    let other = format!("/tt-serve-{pid}-other");
    // The cgroupfs driver's layout for a Docker container: /docker/<64 hex digits>.
    let id = format!("3f2a{pid:08x}{}", "0".repeat(52));
    let container = format!("/docker/{id}");
    let dirs: Vec<PathBuf> = [&one, &two, &other, &container]
        .iter()
        .map(|p| scene.throttled(p))
        .collect();
    let glob = format!("/tt-serve-{pid}-sel*");
    serve_selects(
        &mut scene,
        &["--cgroup", &glob],
        &[(&one, dirs[0].clone()), (&two, dirs[1].clone())],
        &other,
    );
    serve_selects(
        &mut scene,
        &["--container", &id[..12]],
        &[(&container, dirs[3].clone())],
        &other,
    );
    assert!(
        nr_throttled(&dirs[2]) >= 10,
        "the unselected group was throttled too"
    );
}
