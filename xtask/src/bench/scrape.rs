//! `throttle-tracer serve` in the background on a loopback port, and its endpoints read over
//! plain HTTP/1.0 (one connection per request), timed.
use crate::process::{die_with_parent, signal, wait_timeout};
use anyhow::{Context as _, Result, bail};
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The protobuf encoding's `Accept`, as a Prometheus with native histograms asks for it
/// (docs/prometheus.md, "Encodings and native histograms").
pub const PROTOBUF: &str =
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";
/// What curl sends: the Prometheus text format 0.0.4.
pub const TEXT: &str = "*/*";

/// A hang guard: the programs load and the cgroup hierarchy is walked before /healthz says 200.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// One answer: its status, its body, and the time from connecting to its last byte.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    pub took: Duration,
}

/// `serve` on `127.0.0.1:<a free port>`, ready (/healthz answers 200); interrupted and reaped
/// on drop.
pub struct Serve {
    child: Child,
    port: u16,
}

impl Serve {
    /// `throttle-tracer serve --listen 127.0.0.1:<port> ARGS…`.
    pub fn start(tracer: &Path, args: &[&str]) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut command = Command::new(tracer);
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: prctl is async-signal-safe. If this task dies, the tracer detaches.
        unsafe { command.pre_exec(|| die_with_parent(libc::SIGINT)) };
        let child = command
            .spawn()
            .with_context(|| format!("cannot run {} serve", tracer.display()))?;
        let mut serve = Self { child, port };
        let deadline = Instant::now() + READY_TIMEOUT;
        while !serve.get("/healthz", TEXT).is_ok_and(|a| a.status == 200) {
            if let Some(status) = serve.child.try_wait()? {
                bail!("serve {args:?} exited with {status} before it was ready");
            }
            if Instant::now() > deadline {
                bail!("serve {args:?} was not ready within {READY_TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(serve)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `GET path` with `Accept: accept`.
    pub fn get(&self, path: &str, accept: &str) -> Result<Answer> {
        let started = Instant::now();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        write!(stream, "GET {path} HTTP/1.0\r\nAccept: {accept}\r\n\r\n")?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let took = started.elapsed();
        let end = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("an HTTP answer without a blank line")?;
        let head = String::from_utf8_lossy(&response[..end]);
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no status in {head:?}"))?;
        Ok(Answer {
            status,
            body: response[end + 4..].to_vec(),
            took,
        })
    }

    /// `GET /metrics` with `Accept: accept`, which must answer 200.
    pub fn scrape(&self, accept: &str) -> Result<Answer> {
        let answer = self.get("/metrics", accept)?;
        if answer.status != 200 {
            bail!("/metrics answered {}", answer.status);
        }
        Ok(answer)
    }

    /// SIGINT and a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        signal(self.child.id(), libc::SIGINT)?;
        match wait_timeout(&mut self.child, STOP_TIMEOUT)? {
            Some(status) if status.success() => Ok(()),
            Some(status) => bail!("serve exited with {status}"),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("serve did not exit within {STOP_TIMEOUT:?} of SIGINT")
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
