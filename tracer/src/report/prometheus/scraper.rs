//! What the HTTP server encodes at each scrape: the registry in the format the client asked
//! for, with that format's content type, after the sampler has read the tracked cgroups'
//! cpu.stat for it ([`Scraper::refresh`]).

use std::fmt;
use std::sync::Arc;

use prometheus_client::encoding::prometheus_protobuf;
use prometheus_client::registry::Registry;

use super::{OPENMETRICS_CONTENT_TYPE, SharedRef, TEXT_CONTENT_TYPE, lock};
use crate::sampler::{Files, Sampler, Target};

/// The registry and the tracked cgroups, shared with the HTTP server.
#[derive(Clone, Debug)]
pub struct Scraper {
    pub(super) registry: Arc<Registry>,
    pub(super) shared: SharedRef,
}

impl Scraper {
    /// Has `sampler` read the tracked cgroups' cpu.stat now, on a blocking thread (the run loop
    /// drains the ring buffer meanwhile), so that the scrape that follows mirrors the counters
    /// as they are, not as they were at the run loop's last refresh.
    pub async fn refresh(&self, sampler: &Sampler) {
        let snapshot = sampler.read(self.due(false)).await;
        for (id, t) in &mut lock(&self.shared).cgroups {
            if let Some(sample) = snapshot.get(id) {
                t.stat.clone_from(&sample.stat);
            }
        }
    }

    /// The tracked cgroups whose path is known and whose cpu.stat can have changed since it
    /// was last asked for (a record of theirs came, or it was never read or found missing),
    /// or with `all` every one, for the sampler to read: a node's idle cgroups are not read
    /// at every tick. `serve` asks for `all` every [`SWEEP_EVERY`](super::SWEEP_EVERY) ticks,
    /// which finds the removed ones and any change whose record was lost.
    pub fn due(&self, all: bool) -> Vec<Target> {
        lock(&self.shared)
            .cgroups
            .iter_mut()
            .filter(|(_, t)| all || t.changed || t.stat.is_none() || t.gone_since.is_some())
            .filter_map(|(&id, t)| {
                t.changed = false;
                let path = t.path.clone()?;
                Some(Target {
                    id,
                    path,
                    files: Files::CpuStat,
                })
            })
            .collect()
    }

    /// The cgroups the exporter dropped as gone since the last call.
    pub fn take_gone(&self) -> Vec<u64> {
        std::mem::take(&mut lock(&self.shared).gone)
    }

    /// The metrics now, as OpenMetrics text (what Prometheus asks for) or else as the
    /// Prometheus text format 0.0.4 (what curl and `promtool check metrics` read); returns the
    /// content type with the body.
    pub fn encode(&self, openmetrics: bool) -> Result<(&'static str, String), fmt::Error> {
        let mut body = String::new();
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut body, &self.registry)?;
            Ok((OPENMETRICS_CONTENT_TYPE, body))
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut body, &self.registry)?;
            Ok((TEXT_CONTENT_TYPE, body))
        }
    }

    /// The metrics now in the Prometheus protobuf encoding ([`PROTOBUF_CONTENT_TYPE`](super::PROTOBUF_CONTENT_TYPE)), the
    /// only one that carries the native histogram buckets.
    pub fn protobuf(&self) -> Result<Vec<u8>, prometheus_protobuf::EncodeError> {
        prometheus_protobuf::encode_to_vec(&self.registry)
    }
}
