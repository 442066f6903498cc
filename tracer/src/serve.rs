//! `serve`: a tracing session that feeds the Prometheus exporter (`report::prometheus`), and the
//! HTTP server that exposes it (`/metrics`, `/healthz`). The server answers 503 from the start
//! until the probes are attached, and `/metrics` in the encoding the `Accept` header prefers
//! ([`Exposition::negotiate`], docs/prometheus.md). All but the attach runs on one thread, so a
//! scrape falls between two drains of the ring: docs/design.md ("`serve`: one thread").
use std::{
    collections::VecDeque,
    convert::Infallible,
    sync::{Arc, OnceLock},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode, body::Bytes, header, server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use log::debug;
use tokio::{net::TcpListener, task::AbortHandle};

use crate::{
    agent::{Ended, Interrupts, Session},
    cli::ServeArgs,
    error::{Failure, say},
    report::{
        Ndjson, Sink, Text,
        prometheus::{
            AdviceConfig, Config, Exporter, PROTOBUF_CONTENT_TYPE, REFRESH_EVERY, SWEEP_EVERY,
            Scraper,
        },
    },
    sampler::Sampler,
};

/// Allocations from this size up are mapped apart and given back when freed. glibc's default
/// threshold rises to the largest block freed, so after the first scrape (megabytes of text)
/// every later body came from the heap and its pages stayed resident: the agent's memory grew
/// with its scrapes' size instead of staying flat.
const MMAP_THRESHOLD: libc::c_int = 1 << 20;
/// One heap for every thread: glibc gives each thread that allocates while another holds the
/// heap's lock an arena of its own, and the runtime's threads take turns with the same data
/// (behind the exporter's one lock), so each arena kept free pages of its own and the agent's
/// memory crept up for as long as it ran.
const ARENAS: libc::c_int = 1;

pub async fn run(args: ServeArgs) -> Result<(), Failure> {
    // SAFETY: mallopt only sets parameters of the allocator, under its own lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
    if args.max_cgroups == 0 {
        return Err(Failure::usage(
            "--max-cgroups 0 would export no cgroup at all",
            "give the most cgroups to export, e.g. --max-cgroups 1000",
        ));
    }
    let listener = TcpListener::bind(args.listen).await.map_err(|e| {
        Failure::environment(
            format!("cannot listen on {}: {e}", args.listen),
            "choose another address or port with --listen, e.g. --listen 127.0.0.1:9465",
        )
    })?;
    let address = listener.local_addr().unwrap_or(args.listen);
    let attached = Attached::default();
    tokio::spawn(accept(listener, attached.clone()));
    say!("throttle-tracer: serving metrics on http://{address}/metrics");
    let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(Text::stdout())];
    if let Some(path) = &args.record {
        sinks.push(Box::new(Ndjson::recording(path)?));
    }
    let advice = (!args.no_advice).then_some(AdviceConfig {
        window: args.advice_window,
        every: args.advice_every,
        target: args.tracing.target,
    });
    let tracing = args.tracing;
    let (mut session, selected) =
        tokio::task::spawn_blocking(move || Session::start_selected(&tracing, sinks))
            .await
            .map_err(|e| {
                Failure::environment_without_hint(format!("attaching the probes: {e}"))
            })??;
    let exporter = Exporter::new(Config {
        max_cgroups: args.max_cgroups,
        gone_after: args.gone_after,
        named: selected.into_iter().map(|id| session.cgroup(id)).collect(),
        advice,
    });
    let scraper = exporter.scraper();
    session.add_sink(Box::new(exporter));
    // The exporter's rolling windows hold the demand; the whole run's is kept only for the
    // recording's `advice` lines.
    if args.record.is_none() {
        session.without_demand();
    }
    // Only the first set counts; there is no other.
    let _ = attached.set((scraper.clone(), session.sampler()));

    let mut interrupts = Interrupts::new()?;
    for ticks in 0.. {
        // The exporter's tick: the kernel's lost-record count and the tracked cgroups' cpu.stat
        // (those whose counters can have moved, and every one at a sweep).
        let due = scraper.due(ticks % SWEEP_EVERY == 0);
        if session.tick(due, &mut interrupts).await? == Ended::Interrupted {
            break;
        }
        session.forget(scraper.take_gone());
        let pause = tokio::time::sleep(REFRESH_EVERY);
        if session.trace_until(pause, &mut interrupts).await? == Ended::Interrupted {
            break;
        }
    }
    session.finish().map(|_| ())
}

/// What the server answers from once the probes are attached: unset until then.
type Attached = Arc<OnceLock<(Scraper, Sampler)>>;

/// Connections served at once; a new one past it closes the oldest, so a flood of clients
/// costs descriptors and memory for this many only, and the newest (a scrape, which is done in
/// milliseconds) is served while idle or slow ones hold the others.
const MAX_CONNECTIONS: usize = 64;
/// A request's line and headers must arrive within this (a client sending a byte a second is
/// closed), also between two requests of a kept-alive connection.
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a connection stays open: Prometheus reconnects at its next scrape.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Request headers accepted; a scrape sends about five.
const MAX_HEADERS: usize = 32;
/// Bytes of a request's line and headers (hyper's smallest buffer); more is refused (431).
const MAX_HEAD_BYTES: usize = 8192;

/// Serves each connection in a task of its own until the process ends, within the bounds
/// above.
async fn accept(listener: TcpListener, attached: Attached) {
    let mut open: VecDeque<AbortHandle> = VecDeque::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // E.g. EMFILE: keep serving the connections that are open.
                debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        open.retain(|c| !c.is_finished());
        if open.len() >= MAX_CONNECTIONS
            && let Some(oldest) = open.pop_front()
        {
            debug!("{MAX_CONNECTIONS} connections open: the oldest closed");
            oldest.abort();
        }
        let attached = attached.clone();
        let connection = tokio::spawn(async move {
            let service = service_fn(move |request: Request<_>| {
                let attached = attached.get().cloned();
                async move {
                    if let Some((scraper, sampler)) = &attached
                        && request.uri().path() == "/metrics"
                    {
                        scraper.refresh(sampler).await;
                    }
                    let scraper = attached.as_ref().map(|(scraper, _)| scraper);
                    Ok::<_, Infallible>(respond(&request, scraper))
                }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_headers(MAX_HEADERS)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_LIFETIME, served).await {
                Ok(Err(e)) => debug!("metrics connection: {e}"),
                Err(_) => debug!("metrics connection closed after {CONNECTION_LIFETIME:?}"),
                Ok(Ok(())) => {}
            }
        });
        open.push_back(connection.abort_handle());
    }
}

/// The answer to `request`; `scraper` is `None` while the probes are being attached.
fn respond<B>(request: &Request<B>, scraper: Option<&Scraper>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    let attaching = || {
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "attaching the probes; not tracing yet\n".into(),
        )
    };
    match (request.uri().path(), scraper) {
        ("/metrics", Some(scraper)) => {
            let accept = request.headers().get_all(header::ACCEPT);
            let accept = accept.iter().filter_map(|v| v.to_str().ok());
            metrics(Exposition::negotiate(accept), scraper)
        }
        ("/healthz", Some(_)) => plain(StatusCode::OK, "ok\n".into()),
        ("/metrics" | "/healthz", None) => attaching(),
        ("/", _) => plain(
            StatusCode::OK,
            "throttle-tracer: metrics at /metrics\n".into(),
        ),
        (_, _) => plain(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n".into(),
        ),
    }
}

/// The metrics now in `exposition`, or a 500 saying why they could not be encoded.
fn metrics(exposition: Exposition, scraper: &Scraper) -> Response<Full<Bytes>> {
    let encoded = match exposition {
        Exposition::Protobuf => scraper
            .protobuf()
            .map(|body| (PROTOBUF_CONTENT_TYPE, body))
            .map_err(|e| e.to_string()),
        Exposition::OpenMetrics | Exposition::Text => scraper
            .encode(exposition == Exposition::OpenMetrics)
            .map(|(content_type, body)| (content_type, body.into_bytes()))
            .map_err(|e| e.to_string()),
    };
    match encoded {
        Ok((content_type, body)) => Response::builder()
            .header(header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default(),
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the metrics: {e}\n"),
        ),
    }
}

/// The encodings `/metrics` offers, in the order it prefers them when a client accepts several
/// equally: the one with the most information first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exposition {
    /// Length-delimited `MetricFamily` messages: the only encoding with native histograms.
    Protobuf,
    /// OpenMetrics 1.0 text: classic histograms.
    OpenMetrics,
    /// The Prometheus text format 0.0.4: what curl and `promtool check metrics` read.
    Text,
}

impl Exposition {
    const PREFERENCE: [Self; 3] = [Self::Protobuf, Self::OpenMetrics, Self::Text];

    /// The encoding the `Accept` header values grant the highest quality (`q`), by the order
    /// of [`Self::PREFERENCE`] on a tie. Protobuf and OpenMetrics must be named: a wildcard
    /// (curl's `*/*`) and a missing or unsatisfiable header get the Prometheus text, so that
    /// what a person fetches stays readable.
    fn negotiate<'a>(accept: impl IntoIterator<Item = &'a str>) -> Self {
        let ranges: Vec<MediaRange> = accept
            .into_iter()
            .flat_map(|value| value.split(','))
            .map(MediaRange::parse)
            .collect();
        let quality = |exposition: Self| {
            ranges
                .iter()
                .filter(|range| range.names(exposition))
                .map(|range| range.q)
                .fold(0.0, f64::max)
        };
        let mut best = (Self::Text, 0.0);
        for exposition in Self::PREFERENCE {
            let q = quality(exposition);
            if q > best.1 {
                best = (exposition, q);
            }
        }
        best.0
    }
}

/// One media range of an `Accept` header, e.g. `text/plain;version=0.0.4;q=0.5`.
#[derive(Debug)]
struct MediaRange<'a> {
    /// `type/subtype`, possibly with wildcards.
    essence: &'a str,
    parameters: Vec<(&'a str, &'a str)>,
    /// The quality, 1 when not given; 0 means "not acceptable".
    q: f64,
}

impl<'a> MediaRange<'a> {
    /// Lenient: an unparsable `q` counts as 0, so a malformed range never wins.
    fn parse(range: &'a str) -> Self {
        let mut fields = range.split(';').map(str::trim);
        let essence = fields.next().unwrap_or_default();
        let parameters: Vec<(&str, &str)> = fields
            .filter_map(|p| p.split_once('='))
            .map(|(key, value)| (key.trim(), value.trim().trim_matches('"')))
            .collect();
        let q = parameters
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case("q"))
            .map_or(1.0, |(_, q)| q.parse().unwrap_or(0.0));
        Self {
            essence,
            parameters,
            q,
        }
    }

    fn parameter(&self, key: &str) -> Option<&'a str> {
        self.parameters
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, value)| *value)
    }

    /// Whether this range asks for `exposition`: protobuf only as delimited `MetricFamily`
    /// messages, the only framing the exporter writes.
    fn names(&self, exposition: Exposition) -> bool {
        let is = |essence: &str| self.essence.eq_ignore_ascii_case(essence);
        match exposition {
            Exposition::Protobuf => {
                is("application/vnd.google.protobuf")
                    && self.parameter("proto") == Some("io.prometheus.client.MetricFamily")
                    && self
                        .parameter("encoding")
                        .is_some_and(|e| e.eq_ignore_ascii_case("delimited"))
            }
            Exposition::OpenMetrics => is("application/openmetrics-text"),
            Exposition::Text => is("text/plain") || is("text/*") || is("*/*"),
        }
    }
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(text)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::report::prometheus::{OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, tests::families};

    /// What Prometheus 2.42 sends without and with `--enable-feature=native-histograms`.
    const PROMETHEUS: &str = "application/openmetrics-text;version=1.0.0,\
        application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    const PROMETHEUS_NATIVE: &str = "application/vnd.google.protobuf;\
        proto=io.prometheus.client.MetricFamily;encoding=delimited,\
        application/openmetrics-text;version=1.0.0;q=0.8,\
        application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

    #[test]
    fn the_accept_header_chooses_the_encoding() {
        for (accept, expected) in [
            (vec![PROMETHEUS_NATIVE], Exposition::Protobuf),
            (vec![PROMETHEUS], Exposition::OpenMetrics),
            (vec!["*/*"], Exposition::Text),
            (vec![], Exposition::Text),
            (vec!["application/json"], Exposition::Text),
            // Several header lines count as one list; case and spaces do not matter.
            (
                vec![
                    "text/plain",
                    "Application/Vnd.Google.Protobuf; proto=io.prometheus.client.MetricFamily; encoding=\"delimited\"",
                ],
                Exposition::Protobuf,
            ),
            // Quality decides, not the order or the mere mention.
            (
                vec!["application/openmetrics-text;q=0.3,text/plain;version=0.0.4"],
                Exposition::Text,
            ),
            (
                vec![
                    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,application/openmetrics-text",
                ],
                Exposition::OpenMetrics,
            ),
            (vec!["application/openmetrics-text;q=0"], Exposition::Text),
            (
                vec!["application/openmetrics-text;q=high"],
                Exposition::Text,
            ),
            // Protobuf only in the delimited MetricFamily framing.
            (
                vec![
                    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text",
                ],
                Exposition::Text,
            ),
            (vec!["application/vnd.google.protobuf"], Exposition::Text),
        ] {
            assert_eq!(
                Exposition::negotiate(accept.iter().copied()),
                expected,
                "{accept:?}"
            );
        }
    }

    /// The response to a GET of /metrics with `accept`: its content type and body.
    async fn scrape(accept: &str) -> (String, Bytes) {
        let exporter = Exporter::new(Config {
            max_cgroups: 10,
            gone_after: Duration::from_secs(300),
            named: Vec::new(),
            advice: Some(AdviceConfig::default()),
        });
        let request = Request::get("/metrics")
            .header(header::ACCEPT, accept)
            .body(())
            .unwrap();
        let response = respond(&request, Some(&exporter.scraper()));
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        (
            content_type,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    }

    #[test]
    fn healthz_and_metrics_answer_503_until_the_probes_are_attached() {
        let get = |path: &str| Request::get(path).body(()).unwrap();
        for path in ["/healthz", "/metrics"] {
            assert_eq!(
                respond(&get(path), None).status(),
                StatusCode::SERVICE_UNAVAILABLE
            );
        }
        assert_eq!(respond(&get("/"), None).status(), StatusCode::OK);
        let exporter = Exporter::new(Config {
            max_cgroups: 10,
            gone_after: Duration::from_secs(300),
            named: Vec::new(),
            advice: Some(AdviceConfig::default()),
        });
        let ready = respond(&get("/healthz"), Some(&exporter.scraper()));
        assert_eq!(ready.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_answer_in_the_negotiated_encoding() {
        let (content_type, body) = scrape(PROMETHEUS_NATIVE).await;
        assert_eq!(content_type, PROTOBUF_CONTENT_TYPE);
        let names: Vec<String> = families(&body).into_iter().map(|f| f.name).collect();
        assert!(
            names.contains(&"throttle_tracer_cgroups_tracked".to_owned()),
            "{names:?}"
        );

        let (content_type, body) = scrape(PROMETHEUS).await;
        assert_eq!(content_type, OPENMETRICS_CONTENT_TYPE);
        assert!(body.ends_with(b"# EOF\n"));

        let (content_type, _) = scrape("*/*").await;
        assert_eq!(content_type, TEXT_CONTENT_TYPE);
    }
}
