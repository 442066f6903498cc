//! What the tests that talk HTTP share: a free loopback port, a plain GET, a readiness poll,
//! and a real Prometheus server (Debian's) scraping an exporter on loopback, queried through its
//! HTTP API.
use std::{
    fs,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use super::Running;

pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const PROMTOOL: &str = "/usr/bin/promtool";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A plain HTTP/1.0 GET: the status code and the body.
pub fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// Polls until `port` answers `path` with 200 (a guard against hanging, not a timing check).
pub fn wait_ready(port: u16, path: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if matches!(get(port, path), Ok((200, _))) {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    panic!("{what} did not answer {path} on port {port}");
}

pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Starts a Prometheus (its files under `name` in `parent`) that scrapes the exporter on
/// loopback every second, with `features` enabled and `more_config` (top-level keys: rule
/// files, alerting) added to its configuration; returns it and its port once it is ready.
pub fn start_prometheus(
    parent: &Path,
    name: &str,
    exporter_port: u16,
    features: &[&str],
    more_config: &str,
) -> (Running, u16) {
    let jobs: [(&str, &[u16]); 1] = [("throttle-tracer", &[exporter_port])];
    start_prometheus_scraping(parent, name, &jobs, features, more_config)
}

/// [`start_prometheus`] with scrape jobs of its own: (job name, the loopback ports of its
/// targets), each scraped every second.
pub fn start_prometheus_scraping(
    parent: &Path,
    name: &str,
    jobs: &[(&str, &[u16])],
    features: &[&str],
    more_config: &str,
) -> (Running, u16) {
    let dir = parent.join(name);
    fs::create_dir(&dir).expect("create the Prometheus directory");
    let config = dir.join("prometheus.yml");
    let mut scrape_configs = String::new();
    for (job, ports) in jobs {
        let targets: Vec<String> = ports.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        scrape_configs += &format!(
            "  - job_name: {job}\n    scrape_timeout: 900ms\n    static_configs:\n      \
             - targets: [{}]\n",
            targets.join(", ")
        );
    }
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n\
             {scrape_configs}{more_config}"
        ),
    )
    .unwrap();
    let log = fs::File::create(dir.join("prometheus.log")).unwrap();
    let port = free_port();
    let mut cmd = Command::new(PROMETHEUS);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        // Sends a firing alert again after 1 s, not 1 min, should the first send miss.
        .arg("--rules.alert.resend-delay=1s")
        .stdout(Stdio::null())
        .stderr(log);
    for feature in features {
        cmd.arg(format!("--enable-feature={feature}"));
    }
    let server = Running::spawn(&mut cmd);
    wait_ready(port, "/-/ready", &format!("prometheus ({name})"));
    (server, port)
}

/// Whether `port`'s Prometheus holds a sample of `cgroup` scraped after `time`.
pub fn scraped_since(port: u16, cgroup: &str, time: SystemTime) -> bool {
    let at = time.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    query(
        port,
        &format!("timestamp(throttle_tracer_stops_total{{cgroup=\"{cgroup}\"}})"),
    ) > at
}

/// [`scraped_since`], false also while Prometheus has no such series yet.
pub fn series_scraped_since(port: u16, cgroup: &str, time: SystemTime) -> bool {
    let at = time.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let promql = format!("timestamp(throttle_tracer_stops_total{{cgroup=\"{cgroup}\"}})");
    let Ok((200, body)) = get(
        port,
        &format!("/api/v1/query?query={}", percent_encode(&promql)),
    ) else {
        return false;
    };
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .is_some_and(|t| t > at)
}

/// The value of an instant query that must return exactly one series.
pub fn query(port: u16, promql: &str) -> f64 {
    let (status, body) = get(
        port,
        &format!("/api/v1/query?query={}", percent_encode(promql)),
    )
    .unwrap_or_else(|e| panic!("query {promql}: {e}"));
    assert_eq!(status, 200, "{promql}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let result = v["data"]["result"].as_array().expect("result array");
    assert_eq!(result.len(), 1, "{promql}: {body}");
    result[0]["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{promql}: {body}"))
}

/// The value of the sample `series` (name and labels, exactly as printed) in a scrape.
pub fn sample(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in the scrape:\n{scrape}"))
}
