//! The label sets of the exported series: a cgroup's (its path and what the path names) and a
//! drop reason's.

use std::fmt;

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};

use crate::names::{Name, Qos};

/// `cgroup` = the path under the cpu hierarchy (`id:<n>` if it never resolved), and, when the
/// path names them, what a cluster's other series join on: `container_id` (12 hex digits, as
/// `docker ps` and `crictl ps` show), `container_id_full` (64, as the Kubernetes API and
/// kube-state-metrics' `kube_pod_container_info` carry after `<runtime>://`), `pod_uid`
/// (kube-state-metrics' `uid`), `qos` (`guaranteed`, `burstable`, `besteffort`) and `unit`
/// (systemd). The names `container` and `pod` are left to what Kubernetes means by them (names,
/// which a cgroup path does not hold) and to the scrape's own target labels. All are functions
/// of the path: they add no series.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub(super) struct CgroupLabels {
    cgroup: String,
    container_id: Option<String>,
    container_id_full: Option<String>,
    pod_uid: Option<String>,
    qos: Option<&'static str>,
    unit: Option<String>,
}

impl CgroupLabels {
    pub(super) fn of(cgroup: String) -> Self {
        let name = Name::of(&cgroup).map(|n| Self {
            container_id: n.container_id,
            container_id_full: n.container_id_full,
            pod_uid: n.pod_uid,
            qos: n.qos.map(Qos::as_str),
            unit: n.unit,
            cgroup: String::new(),
        });
        Self {
            cgroup,
            ..name.unwrap_or_default()
        }
    }
}

/// The names a path does not have are left out, not exported as empty labels.
impl EncodeLabelSet for CgroupLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        ("cgroup", self.cgroup.as_str()).encode(encoder.encode_label())?;
        for (key, value) in [
            ("container_id", self.container_id.as_deref()),
            ("container_id_full", self.container_id_full.as_deref()),
            ("pod_uid", self.pod_uid.as_deref()),
            ("qos", self.qos),
            ("unit", self.unit.as_deref()),
        ] {
            if let Some(value) = value {
                (key, value).encode(encoder.encode_label())?;
            }
        }
        Ok(())
    }
}

/// Why a cgroup has no series: `limit` (beyond `max_cgroups`) or `gone` (removed).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DropLabels {
    pub(super) reason: &'static str,
}

#[cfg(test)]
mod tests {
    use crate::cgroups::{Hierarchy, Version};
    use crate::report::prometheus::Exporter;
    use crate::report::prometheus::tests::{config, feed, reporting, sample, tree};

    #[test]
    fn container_pod_qos_and_unit_labels_when_the_path_names_them() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let dir = tempfile::tempdir().unwrap();
        let pod = "kubepods.slice/kubepods-burstable.slice/\
                   kubepods-burstable-pod1b2c3d4e_0000_4000_8000_123456789abc.slice";
        let leaf = format!("{pod}/cri-containerd-{id}.scope");
        std::fs::create_dir_all(dir.path().join(&leaf)).unwrap();
        let mut h = Hierarchy::at(dir.path().to_owned(), Version::V1);
        let cg = h.id_of(&format!("/{leaf}")).unwrap();
        let (mut report, scraper) = reporting(Exporter::new(config(10)));
        feed(&mut report, &mut h, cg);
        let (_, text) = scraper.encode(false).unwrap();
        let series = format!(
            "throttle_tracer_stops_total{{cgroup=\"/{leaf}\",container_id=\"0123456789ab\",\
             container_id_full=\"{id}\",pod_uid=\"1b2c3d4e-0000-4000-8000-123456789abc\",\
             qos=\"burstable\",unit=\"cri-containerd-{id}.scope\"}}"
        );
        assert_eq!(sample(&text, &series), 3.0);
        // A path that names nothing has the cgroup label alone.
        let (_dir, mut h, demo) = tree();
        feed(&mut report, &mut h, demo);
        let (_, text) = scraper.encode(false).unwrap();
        assert_eq!(
            sample(&text, r#"throttle_tracer_stops_total{cgroup="/demo"}"#),
            3.0
        );
    }
}
