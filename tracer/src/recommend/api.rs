//! The client of Prometheus' HTTP API that `recommend` needs: instant queries
//! (`POST /api/v1/query`, form-encoded, so that a selector naming many cgroups fits) over plain
//! HTTP/1.1 with hyper's own client connection, one connection per query. No TLS: a Prometheus
//! behind HTTPS is reached through a port-forward or a proxy on loopback.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode, Uri, header};
use hyper_util::rt::TokioIo;
use serde::Deserialize;

/// How long one query may take, connection included: Prometheus' own default query timeout
/// (2 min), and a little for the answer to travel.
const QUERY_TIMEOUT: Duration = Duration::from_secs(130);

/// One series of an instant vector: its labels (without `__name__`) and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// The label's value; "" when it is absent, as PromQL has it.
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot reach Prometheus at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("Prometheus at {url} did not answer within {} s", QUERY_TIMEOUT.as_secs())]
    Timeout { url: String },
    #[error("{url} answered HTTP {status} to {path}{}", said(.body))]
    Status {
        url: String,
        path: String,
        status: StatusCode,
        body: String,
    },
    #[error("Prometheus at {url} refused the query `{query}`: {kind}: {message}")]
    Query {
        url: String,
        query: String,
        kind: String,
        message: String,
    },
    #[error("{url} did not answer as Prometheus' API does ({reason})")]
    Malformed { url: String, reason: String },
}

/// The first line of an error page, if it has one: what the server said, not its whole page.
fn said(body: &str) -> String {
    match body.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(line) => format!(": {}", line.chars().take(200).collect::<String>()),
        None => String::new(),
    }
}

/// A Prometheus server's API.
#[derive(Clone, Debug)]
pub struct Client {
    /// The URL as given, for messages.
    url: String,
    host: String,
    port: u16,
    /// `host:port` as the Host header names it.
    authority: String,
    /// The path Prometheus serves under, without a trailing `/` ("" at the root).
    prefix: String,
}

impl Client {
    /// The client of the Prometheus at `url` (`http://HOST[:PORT][/PREFIX]`), or why `url` is
    /// not one it can use.
    pub fn new(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--prometheus {url}: not a URL ({e})"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "--prometheus {url}: {other} is not supported, only plain http"
                ));
            }
            None => return Err(format!("--prometheus {url}: no scheme (http://…)")),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("--prometheus {url}: no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "--prometheus {url}: credentials in the URL are not supported"
            ));
        }
        // IPv6 literals keep their brackets in the authority, not in the address to connect to.
        let host = authority.host().trim_matches(['[', ']']).to_owned();
        Ok(Self {
            url: url.to_owned(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_owned(),
            host,
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Prometheus' present (Unix seconds, by its own clock): the time every query of one
    /// reading is evaluated at, so that their windows are the same.
    pub async fn now(&self) -> Result<f64, ApiError> {
        let data = self.evaluate("time()", None).await?;
        let malformed = |reason: String| ApiError::Malformed {
            url: self.url.clone(),
            reason,
        };
        if data.result_type != "scalar" {
            return Err(malformed(format!("time() gave a {}", data.result_type)));
        }
        let (time, _): (f64, String) =
            serde_json::from_value(data.result).map_err(|e| malformed(format!("time(): {e}")))?;
        Ok(time)
    }

    /// The instant vector `promql` evaluates to at `time` (Unix seconds). A non-finite value
    /// (a quantile of no observations, a ratio of none) is left out.
    pub async fn query(&self, promql: &str, time: f64) -> Result<Vec<Sample>, ApiError> {
        let data = self.evaluate(promql, Some(time)).await?;
        if data.result_type != "vector" {
            return Err(ApiError::Malformed {
                url: self.url.clone(),
                reason: format!(
                    "a {} where an instant vector was asked for",
                    data.result_type
                ),
            });
        }
        let samples: Vec<VectorSample> =
            serde_json::from_value(data.result).map_err(|e| ApiError::Malformed {
                url: self.url.clone(),
                reason: format!("the vector's samples: {e}"),
            })?;
        Ok(samples
            .into_iter()
            .filter_map(|s| {
                let value: f64 = s.value.1.parse().ok()?;
                let mut labels = s.metric;
                labels.remove("__name__");
                value.is_finite().then_some(Sample { labels, value })
            })
            .collect())
    }

    /// The `data` of an instant query of `promql`, at `time` or Prometheus' present.
    async fn evaluate(&self, promql: &str, time: Option<f64>) -> Result<Data, ApiError> {
        let path = format!("{}/api/v1/query", self.prefix);
        let mut body = format!("query={}", form_encode(promql));
        if let Some(time) = time {
            body += &format!("&time={time:.3}");
        }
        let (status, answer) = tokio::time::timeout(QUERY_TIMEOUT, self.post(&path, body))
            .await
            .map_err(|_| ApiError::Timeout {
                url: self.url.clone(),
            })??;
        let malformed = |reason: String| ApiError::Malformed {
            url: self.url.clone(),
            reason,
        };
        // The API answers errors as JSON with 400, 422 or 503; anything else that is not
        // 2xx is a page of some other server (a proxy, a wrong path).
        let parsed: Result<Answer, _> = serde_json::from_slice(&answer);
        let answer = match parsed {
            Ok(answer) => answer,
            Err(_) if !status.is_success() => {
                return Err(ApiError::Status {
                    url: self.url.clone(),
                    path,
                    status,
                    body: String::from_utf8_lossy(&answer).into_owned(),
                });
            }
            Err(e) => return Err(malformed(e.to_string())),
        };
        if answer.status != "success" {
            return Err(ApiError::Query {
                url: self.url.clone(),
                query: promql.to_owned(),
                kind: answer.error_type.unwrap_or_default(),
                message: answer.error.unwrap_or_default(),
            });
        }
        answer
            .data
            .ok_or_else(|| malformed("a success without data".into()))
    }

    /// POSTs the form `body` to `path`: the status and the whole answer.
    async fn post(&self, path: &str, body: String) -> Result<(StatusCode, Bytes), ApiError> {
        let unreachable = |reason: String| ApiError::Unreachable {
            url: self.url.clone(),
            reason,
        };
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        // The connection is driven beside the request; it ends when the answer is read.
        tokio::spawn(connection);
        let request = Request::post(path)
            .header(header::HOST, &self.authority)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| unreachable(e.to_string()))?;
        let answer = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = answer.status();
        let body = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    }
}

/// `application/x-www-form-urlencoded`: unreserved bytes as they are, every other byte as
/// `%XX` (a space too: `+` would do, `%20` always does).
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The envelope of every API answer.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    status: String,
    data: Option<Data>,
    error_type: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct VectorSample {
    metric: BTreeMap<String, String>,
    /// `[unix time, "value"]`: the value is a string, so that NaN and ±Inf travel.
    value: (f64, String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_gives_the_address_the_host_header_and_the_prefix() {
        let c = Client::new("http://127.0.0.1:9090/prom/").unwrap();
        assert_eq!(
            (
                c.host.as_str(),
                c.port,
                c.authority.as_str(),
                c.prefix.as_str()
            ),
            ("127.0.0.1", 9090, "127.0.0.1:9090", "/prom")
        );
        let c = Client::new("http://[::1]:9090").unwrap();
        assert_eq!((c.host.as_str(), c.prefix.as_str()), ("::1", ""));
        assert_eq!(Client::new("http://prometheus").unwrap().port, 80);
        for (url, why) in [
            ("https://p:9090", "https is not supported, only plain http"),
            ("p:9090", "no scheme"),
            ("http://user:pw@p:9090", "credentials"),
        ] {
            let e = Client::new(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn a_query_is_form_encoded_whole() {
        assert_eq!(
            form_encode("max_over_time(x{fit=\"target\"}[7d]) / 1"),
            "max_over_time%28x%7Bfit%3D%22target%22%7D%5B7d%5D%29%20%2F%201"
        );
    }

    #[test]
    fn an_error_page_is_named_by_its_first_line() {
        assert_eq!(said("\n  404 page not found\nmore"), ": 404 page not found");
        assert_eq!(said(""), "");
    }
}
