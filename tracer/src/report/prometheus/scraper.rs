//! What the HTTP server encodes at each scrape: the registry in the format the client asked
//! for, with that format's content type.

use std::fmt;
use std::sync::Arc;

use prometheus_client::encoding::prometheus_protobuf;
use prometheus_client::registry::Registry;

use super::{OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};

/// The registry, shared with the HTTP server.
#[derive(Clone, Debug)]
pub struct Scraper(pub(super) Arc<Registry>);

impl Scraper {
    /// The metrics now, as OpenMetrics text (what Prometheus asks for) or else as the
    /// Prometheus text format 0.0.4 (what curl and `promtool check metrics` read); returns the
    /// content type with the body.
    pub fn encode(&self, openmetrics: bool) -> Result<(&'static str, String), fmt::Error> {
        let mut body = String::new();
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut body, &self.0)?;
            Ok((OPENMETRICS_CONTENT_TYPE, body))
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut body, &self.0)?;
            Ok((TEXT_CONTENT_TYPE, body))
        }
    }

    /// The metrics now in the Prometheus protobuf encoding ([`PROTOBUF_CONTENT_TYPE`](super::PROTOBUF_CONTENT_TYPE)), the
    /// only one that carries the native histogram buckets.
    pub fn protobuf(&self) -> Result<Vec<u8>, prometheus_protobuf::EncodeError> {
        prometheus_protobuf::encode_to_vec(&self.0)
    }
}
