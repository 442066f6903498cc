//! `throttle-tracer recommend --prometheus URL`: what to set for every workload of a fleet,
//! from the demand and advice series `serve` exports on every node, read back from Prometheus
//! over `--window`. Every figure is an instant query over the window ([`read`]; the p99 of
//! period demand one more per workload, pooled over its pods: [`p99_demand`]); `fleet` joins
//! the series into workloads and does the arithmetic, `render` prints it. A workload with less
//! than `--min-data` of measured periods, or without advice, is listed without a number.

mod api;
mod fleet;
mod render;

use std::io::{self, Write as _};
use std::time::Duration;

use crate::cli::{RecommendArgs, RecommendOutput};
use crate::error::Failure;
use api::{ApiError, Client, Sample};
use fleet::{Reading, Recommendation};

/// `throttle-tracer recommend`.
pub async fn run(args: RecommendArgs) -> Result<(), Failure> {
    let client = Client::new(&args.prometheus).map_err(|e| {
        Failure::usage(
            e,
            "give Prometheus' base URL, e.g. --prometheus http://127.0.0.1:9090",
        )
    })?;
    let window = range(args.window);
    let failure = |e: ApiError| unanswered(&client, e);
    let now = client.now().await.map_err(failure)?;
    let reading = read(&client, &window, now).await.map_err(failure)?;
    if reading.period.is_empty() {
        return Err(Failure::environment(
            format!(
                "Prometheus at {} holds no throttle_tracer_period_seconds series in the last {}",
                client.url(),
                humantime::format_duration(args.window)
            ),
            "recommend reads the demand and advice series of `throttle-tracer serve` \
             (docs/prometheus.md): check that this Prometheus scrapes serve (its /targets page), \
             that serve is a version that exports them, and that --window reaches back to when \
             it did",
        ));
    }
    let kube = fleet::Kubernetes::of(&reading);
    let mut rows = Vec::new();
    for (identity, members) in fleet::workloads(fleet::members(&reading), &kube) {
        let cgroups: Vec<&str> = members.iter().map(|m| m.cgroup.as_str()).collect();
        let p99 = p99_demand(&client, &cgroups, &window, now)
            .await
            .map_err(failure)?;
        rows.push(Recommendation::of(
            &identity,
            &members,
            p99,
            args.min_data.as_secs_f64(),
        ));
    }
    let output = if args.json {
        RecommendOutput::Json
    } else {
        args.output
    };
    let text = match output {
        RecommendOutput::Table => render::table(
            &rows,
            &render::Source {
                url: client.url(),
                window: &humantime::format_duration(args.window).to_string(),
            },
        ),
        RecommendOutput::Json => render::json(&rows),
        RecommendOutput::Patch => render::patch(&rows),
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Failure::stdout("the recommendation", &e))
}

/// The window as a PromQL range: milliseconds (at least one), which every Prometheus 2 reads.
fn range(window: Duration) -> String {
    format!("{}ms", window.as_millis().max(1))
}

/// Every series `recommend` needs, each an instant query over `window` up to `now`: the
/// settings' last values, the counters' increase, the advice's largest value (what the busiest
/// stretch needed), and kube-state-metrics' pods and containers as they last were.
async fn read(client: &Client, window: &str, now: f64) -> Result<Reading, ApiError> {
    let mut r = Reading::default();
    let over = |function: &str, series: &str| format!("{function}({series}[{window}])");
    let queries: [(&mut Vec<Sample>, String); 12] = [
        (
            &mut r.quota,
            over("last_over_time", "throttle_tracer_quota_seconds"),
        ),
        (
            &mut r.period,
            over("last_over_time", "throttle_tracer_period_seconds"),
        ),
        (
            &mut r.periods,
            over("increase", "throttle_tracer_periods_total"),
        ),
        (
            &mut r.throttled,
            over("increase", "throttle_tracer_throttled_periods_total"),
        ),
        (
            &mut r.advised,
            over(
                "max_over_time",
                "throttle_tracer_advised_quota_seconds{fit=\"target\"}",
            ),
        ),
        (
            &mut r.burst,
            over("max_over_time", "throttle_tracer_advised_burst_seconds"),
        ),
        (
            &mut r.after,
            over(
                "max_over_time",
                "throttle_tracer_advice_stopped_ratio{setting=\"advised\"}",
            ),
        ),
        (
            &mut r.target,
            over("max_over_time", "throttle_tracer_advice_target_ratio"),
        ),
        (
            &mut r.missing,
            over("last_over_time", "throttle_tracer_advice_missing"),
        ),
        (&mut r.pod_info, over("last_over_time", "kube_pod_info")),
        (&mut r.pod_owner, over("last_over_time", "kube_pod_owner")),
        (
            &mut r.container_info,
            over("last_over_time", "kube_pod_container_info"),
        ),
    ];
    for (into, query) in queries {
        *into = client.query(&query, now).await?;
    }
    Ok(r)
}

/// The 99th percentile of one period's demand (seconds) over the window up to `now`, pooled
/// over the workload's `cgroups` on every node: from the classic buckets, or from the native
/// histogram where Prometheus stores only that; `None` without observations.
async fn p99_demand(
    client: &Client,
    cgroups: &[&str],
    window: &str,
    now: f64,
) -> Result<Option<f64>, ApiError> {
    let query = p99_query(cgroups, window);
    Ok(client.query(&query, now).await?.first().map(|s| s.value))
}

fn p99_query(cgroups: &[&str], window: &str) -> String {
    let mut paths: Vec<String> = cgroups.iter().map(|c| regex_quote(c)).collect();
    paths.sort();
    paths.dedup();
    let selector = format!("cgroup=~\"{}\"", promql_quote(&paths.join("|")));
    let series = "throttle_tracer_period_demand_seconds";
    format!(
        "histogram_quantile(0.99, sum by (le) (increase({series}_bucket{{{selector}}}[{window}]))) \
         or histogram_quantile(0.99, sum(increase({series}{{{selector}}}[{window}])))"
    )
}

/// `s` as an RE2 regular expression that matches only itself.
fn regex_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `s` inside a double-quoted PromQL string.
fn promql_quote(s: &str) -> String {
    s.replace('\\', r"\\").replace('"', "\\\"")
}

/// The failure a query's error is, with the way out.
fn unanswered(client: &Client, e: ApiError) -> Failure {
    let base = "--prometheus must be Prometheus' base URL (its API is that URL + /api/v1, with \
                the --web.route-prefix or a proxy's path in it, if any)";
    let hint = match &e {
        ApiError::Unreachable { .. } | ApiError::Timeout { .. } => format!(
            "check that Prometheus runs at {} and this machine reaches it (plain http; \
             `kubectl port-forward svc/prometheus 9090` reaches one in a cluster)",
            client.url()
        ),
        ApiError::Status { .. } | ApiError::Malformed { .. } => base.to_owned(),
        ApiError::Query { .. } => "Prometheus' own words say what it refused: a --window \
                                   longer than it reads (duration out of range), a query that \
                                   timed out or loaded too many samples (a shorter --window), \
                                   or a version before 2.26 (no last_over_time)"
            .to_owned(),
    };
    Failure::environment(e.to_string(), hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_selector_names_each_cgroup_path_exactly() {
        assert_eq!(
            regex_quote("/system.slice/a+b.service"),
            r"/system\.slice/a\+b\.service"
        );
        let q = p99_query(&["/a.slice/x", "/b", "/a.slice/x"], "60000ms");
        assert!(
            q.starts_with(
                "histogram_quantile(0.99, sum by (le) (increase(\
                 throttle_tracer_period_demand_seconds_bucket{cgroup=~\"/a\\\\.slice/x|/b\"}\
                 [60000ms]))) or "
            ),
            "{q}"
        );
    }
}
