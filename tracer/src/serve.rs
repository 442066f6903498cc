//! `serve`: a tracing session that feeds the Prometheus exporter (`report::prometheus`), and
//! the HTTP server that exposes it: `/metrics` (OpenMetrics when the client asks for it, as
//! Prometheus does, else the Prometheus text format) and `/healthz` for probes.
//!
//! Everything runs on the one-threaded runtime of `main`: a scrape is encoded between two
//! drains of the ring buffer, never in the middle of one. SIGINT or SIGTERM ends the run with
//! the text summary, as for tracing.
use std::{convert::Infallible, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use log::debug;
use tokio::net::TcpListener;

use crate::{
    agent::{self, Ended, Interrupts, Session},
    cli::ServeArgs,
    error::Failure,
    report::prometheus::{Config, Exporter, Scraper},
};

/// How often the exporter's bookkeeping runs (lost records, removed cgroups).
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

pub async fn run(args: ServeArgs) -> Result<(), Failure> {
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
    let mut session = Session::start(&agent::Request {
        backend: args.backend,
        btf: &args.btf,
        cgroups: args.cgroups.clone(),
        json: false,
    })?;
    let exporter = Exporter::new(
        Config {
            max_cgroups: args.max_cgroups,
            gone_after: args.gone_after,
            named: args.cgroups.clone(),
        },
        session.cgroup_version(),
    );
    let scraper = exporter.scraper();
    session.export_to(exporter)?;
    let address = listener.local_addr().unwrap_or(args.listen);
    tokio::spawn(accept(listener, scraper));
    eprintln!("throttle-tracer: serving metrics on http://{address}/metrics");

    let mut interrupts = Interrupts::new()?;
    while session
        .trace_until(tokio::time::sleep(REFRESH_INTERVAL), &mut interrupts)
        .await?
        == Ended::Done
    {
        session.refresh_exporter()?;
    }
    session.finish().map(|_| ())
}

/// Serves each connection in a task of its own until the process ends.
async fn accept(listener: TcpListener, scraper: Scraper) {
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
        let scraper = scraper.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let scraper = scraper.clone();
                async move { Ok::<_, Infallible>(respond(&request, &scraper)) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!("metrics connection: {e}");
            }
        });
    }
}

fn respond(request: &Request<Incoming>, scraper: &Scraper) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            let openmetrics = request
                .headers()
                .get_all(header::ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| v.contains("application/openmetrics-text"));
            match scraper.encode(openmetrics) {
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
        "/healthz" => plain(StatusCode::OK, "ok\n".into()),
        "/" => plain(
            StatusCode::OK,
            "throttle-tracer: metrics at /metrics\n".into(),
        ),
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n".into(),
        ),
    }
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(text)))
        .unwrap_or_default()
}
