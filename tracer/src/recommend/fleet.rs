//! From the series Prometheus holds to one [`Recommendation`] per workload. Each cgroup on each
//! node (a [`Member`]) is named through kube-state-metrics, else by its path; the members of one
//! name are one workload, whose limit and advice are the largest any member has (a replica busier
//! than the others needs the larger limit too) and whose data and stopped periods are the sums
//! (docs/prometheus.md, "Workloads").

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::api::Sample;

/// Every instant vector `recommend` reads, each over the window (the queries: recommend.rs).
#[derive(Debug, Default)]
pub struct Reading {
    /// Each series' last `throttle_tracer_quota_seconds` and `…_period_seconds`.
    pub quota: Vec<Sample>,
    pub period: Vec<Sample>,
    /// `increase()` of `throttle_tracer_periods_total` and `…_throttled_periods_total`.
    pub periods: Vec<Sample>,
    pub throttled: Vec<Sample>,
    /// The largest `throttle_tracer_advised_quota_seconds{fit="target"}`, and burst.
    pub advised: Vec<Sample>,
    pub burst: Vec<Sample>,
    /// The largest `throttle_tracer_advice_stopped_ratio{setting="advised"}`.
    pub after: Vec<Sample>,
    /// `throttle_tracer_advice_target_ratio`, and `…_advice_missing` (its `reason` label).
    pub target: Vec<Sample>,
    pub missing: Vec<Sample>,
    /// kube-state-metrics' `kube_pod_info`, `kube_pod_owner`, `kube_pod_container_info`.
    pub pod_info: Vec<Sample>,
    pub pod_owner: Vec<Sample>,
    pub container_info: Vec<Sample>,
}

/// One cgroup on one node, and its figures over the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Member {
    pub instance: String,
    pub cgroup: String,
    pub pod_uid: String,
    pub container_id: String,
    pub container_id_full: String,
    pub quota: Option<f64>,
    pub period: Option<f64>,
    pub periods: Option<f64>,
    pub throttled: Option<f64>,
    pub advised: Option<f64>,
    pub burst: Option<f64>,
    pub after: Option<f64>,
    pub target: Option<f64>,
    pub missing: BTreeSet<String>,
}

/// What a row is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Identity {
    /// A container of a Kubernetes workload; `container` is its name, or its id when
    /// kube-state-metrics did not list it (`named` false).
    Kubernetes {
        namespace: String,
        kind: String,
        name: String,
        container: String,
        named: bool,
    },
    /// A cgroup path (a container's, with its id, or any other), on every node that has it.
    Cgroup { path: String, container_id: String },
}

impl Identity {
    /// The row's name: `namespace/Kind/name:container`, `container:<12 hex>` or the path.
    pub fn display(&self) -> String {
        match self {
            Self::Kubernetes {
                namespace,
                kind,
                name,
                container,
                named,
            } => {
                let id = if *named { "" } else { "id=" };
                format!("{namespace}/{kind}/{name}:{id}{container}")
            }
            Self::Cgroup { container_id, .. } if !container_id.is_empty() => {
                format!("container:{container_id}")
            }
            Self::Cgroup { path, .. } => path.clone(),
        }
    }
}

/// Where a query's sample goes in its member.
type Setter = fn(&mut Member, &Sample);

/// The members of the reading, by (`instance`, `cgroup`), with every figure each query gave.
pub fn members(reading: &Reading) -> Vec<Member> {
    let mut by_key: BTreeMap<(String, String), Member> = BTreeMap::new();
    let figures: [(&[Sample], Setter); 9] = [
        (&reading.quota, |m, s| m.quota = Some(s.value)),
        (&reading.period, |m, s| m.period = Some(s.value)),
        (&reading.periods, |m, s| m.periods = Some(s.value)),
        (&reading.throttled, |m, s| m.throttled = Some(s.value)),
        (&reading.advised, |m, s| m.advised = Some(s.value)),
        (&reading.burst, |m, s| m.burst = Some(s.value)),
        (&reading.after, |m, s| m.after = Some(s.value)),
        (&reading.target, |m, s| m.target = Some(s.value)),
        (&reading.missing, |m, s| {
            m.missing.insert(s.label("reason").to_owned());
        }),
    ];
    for (samples, set) in figures {
        for s in samples {
            let key = (s.label("instance").to_owned(), s.label("cgroup").to_owned());
            let member = by_key.entry(key).or_insert_with(|| Member {
                instance: s.label("instance").to_owned(),
                cgroup: s.label("cgroup").to_owned(),
                pod_uid: s.label("pod_uid").to_owned(),
                container_id: s.label("container_id").to_owned(),
                container_id_full: s.label("container_id_full").to_owned(),
                ..Member::default()
            });
            set(member, s);
        }
    }
    by_key.into_values().collect()
}

/// What kube-state-metrics says about pods and containers.
pub struct Kubernetes {
    /// Pod uid → (namespace, pod name).
    pods: BTreeMap<String, (String, String)>,
    /// Pod uid → (owner kind, owner name), the controller's where there are several.
    owners: BTreeMap<String, (String, String)>,
    /// Container id (64 hex, without the `runtime://`) → container name.
    containers: BTreeMap<String, String>,
}

impl Kubernetes {
    pub fn of(reading: &Reading) -> Self {
        let pods = reading
            .pod_info
            .iter()
            .map(|s| {
                let named = (s.label("namespace").to_owned(), s.label("pod").to_owned());
                (s.label("uid").to_owned(), named)
            })
            .collect();
        let mut owners = BTreeMap::new();
        // Non-controllers first, so that a controller's row, inserted later, wins.
        let mut rows: Vec<&Sample> = reading.pod_owner.iter().collect();
        rows.sort_by_key(|s| s.label("owner_is_controller") == "true");
        for s in rows {
            owners.insert(
                s.label("uid").to_owned(),
                (
                    s.label("owner_kind").to_owned(),
                    s.label("owner_name").to_owned(),
                ),
            );
        }
        let containers = reading
            .container_info
            .iter()
            .filter_map(|s| {
                let (_, id) = s.label("container_id").split_once("://")?;
                Some((id.to_owned(), s.label("container").to_owned()))
            })
            .collect();
        Self {
            pods,
            owners,
            containers,
        }
    }

    /// The member's row, or `None` for a pod's own cgroup (its quota is the sum of its
    /// containers' limits, which the kubelet sets: the containers are the rows).
    pub fn identity(&self, m: &Member) -> Option<Identity> {
        let Some((namespace, pod)) = self.pods.get(&m.pod_uid).filter(|_| !m.pod_uid.is_empty())
        else {
            return Some(Identity::Cgroup {
                path: m.cgroup.clone(),
                container_id: m.container_id.clone(),
            });
        };
        if m.container_id.is_empty() {
            return None;
        }
        let (kind, name) = match self.owners.get(&m.pod_uid) {
            Some((kind, name)) if kind == "ReplicaSet" => match deployment_of(name) {
                Some(deployment) => ("Deployment".to_owned(), deployment.to_owned()),
                None => (kind.clone(), name.clone()),
            },
            Some((kind, name)) if !kind.is_empty() && kind != "<none>" => {
                (kind.clone(), name.clone())
            }
            _ => ("Pod".to_owned(), pod.clone()),
        };
        let (container, named) = match self.containers.get(&m.container_id_full) {
            Some(container) => (container.clone(), true),
            None => (m.container_id.clone(), false),
        };
        Some(Identity::Kubernetes {
            namespace: namespace.clone(),
            kind,
            name,
            container,
            named,
        })
    }
}

/// The Deployment a ReplicaSet belongs to: its name less the `-<pod-template-hash>` the
/// Deployment controller adds, written in Kubernetes' safe alphabet (no vowels, no 0, 1, 3).
fn deployment_of(replica_set: &str) -> Option<&str> {
    let (deployment, hash) = replica_set.rsplit_once('-')?;
    let safe = |c: char| "bcdfghjklmnpqrstvwxz2456789".contains(c);
    (!deployment.is_empty() && (1..=10).contains(&hash.len()) && hash.chars().all(safe))
        .then_some(deployment)
}

/// The workloads of `members`, each with its members, in order of their names.
pub fn workloads(members: Vec<Member>, kube: &Kubernetes) -> Vec<(Identity, Vec<Member>)> {
    let mut by_identity: BTreeMap<Identity, Vec<Member>> = BTreeMap::new();
    for m in members {
        if let Some(identity) = kube.identity(&m) {
            by_identity.entry(identity).or_default().push(m);
        }
    }
    let mut rows: Vec<(Identity, Vec<Member>)> = by_identity.into_iter().collect();
    rows.sort_by_cached_key(|(identity, _)| identity.display());
    rows
}

/// A workload's row: `recommend --json` prints one per line. Every CPU figure is CPUs (quota ÷
/// period, Kubernetes' `limits.cpu`), every share a fraction of periods (0.01 = 1 %); `null`
/// where there is no figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    pub workload: String,
    pub kubernetes: Option<KubernetesRef>,
    /// The container's id (12 hex) for a container outside Kubernetes.
    pub container_id: Option<String>,
    pub cgroups: Vec<String>,
    pub pods: usize,
    pub nodes: usize,
    /// Measured time over the window: Σ periods measured × period, over the members.
    pub data_seconds: f64,
    pub period_seconds: Option<f64>,
    pub limit_cpus: Option<f64>,
    pub limit_millicores: Option<i64>,
    pub p99_demand_seconds: Option<f64>,
    pub p99_demand_cpus: Option<f64>,
    pub advised_cpus: Option<f64>,
    /// `advised_cpus` rounded up to a whole millicore.
    pub advised_millicores: Option<i64>,
    pub advised_burst_seconds: Option<f64>,
    /// Whether the runtime can set a burst: Kubernetes cannot.
    pub burst_settable: bool,
    pub stopped_ratio_now: Option<f64>,
    pub stopped_ratio_after: Option<f64>,
    /// `advised_millicores - limit_millicores`: negative frees that much.
    pub change_millicores: Option<i64>,
    pub target_ratio: Option<f64>,
    /// Why there is no advice (then every `advised_*` and the change are `null`).
    pub refused: Option<Refusal>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KubernetesRef {
    pub namespace: String,
    pub kind: String,
    pub name: String,
    /// `null` when kube-state-metrics did not name it (no `kube_pod_container_info`).
    pub container: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Refusal {
    /// Less measured time than `--min-data`.
    TooLittleData {
        has_seconds: f64,
        needs_seconds: f64,
    },
    /// No member had advice in the window; what `serve` said instead
    /// (`throttle_tracer_advice_missing`'s reasons).
    NoAdvice { serve_said: Vec<String> },
}

/// Millicores: CPUs × 1000, to the nearest.
fn millicores(cpus: f64) -> i64 {
    (cpus * 1000.0).round() as i64
}

impl Recommendation {
    /// The row of `identity` from its members' figures, its p99 period demand (seconds, from
    /// the pooled histogram), and the least data to advise on.
    pub fn of(
        identity: &Identity,
        members: &[Member],
        p99_demand_seconds: Option<f64>,
        min_data_seconds: f64,
    ) -> Self {
        let max = |values: &mut dyn Iterator<Item = f64>| values.reduce(f64::max);
        let instances: BTreeSet<&str> = members.iter().map(|m| m.instance.as_str()).collect();
        let pods = match identity {
            Identity::Kubernetes { .. } => {
                let uids: BTreeSet<&str> = members.iter().map(|m| m.pod_uid.as_str()).collect();
                uids.len()
            }
            Identity::Cgroup { .. } => members.len(),
        };
        let data_seconds = members
            .iter()
            .filter_map(|m| Some(m.periods? * m.period?))
            .sum::<f64>();
        // Today's limit: the largest; its period is the one demand and advice are read at.
        let limit = members
            .iter()
            .filter_map(|m| Some((m.quota? / m.period?, m.period?)))
            .reduce(|a, b| if b.0 > a.0 { b } else { a });
        let periods: f64 = members.iter().filter_map(|m| m.periods).sum();
        let throttled: f64 = members.iter().filter_map(|m| m.throttled).sum();
        let advised = max(&mut members.iter().filter_map(|m| Some(m.advised? / m.period?)));
        let refused = if data_seconds < min_data_seconds {
            Some(Refusal::TooLittleData {
                has_seconds: data_seconds,
                needs_seconds: min_data_seconds,
            })
        } else if advised.is_none() {
            let said: BTreeSet<&String> = members.iter().flat_map(|m| &m.missing).collect();
            Some(Refusal::NoAdvice {
                serve_said: said.into_iter().cloned().collect(),
            })
        } else {
            None
        };
        let advised = advised.filter(|_| refused.is_none());
        // Rounded up: a limit below the advice stops more periods than the target. The
        // margin keeps 2.5000000000000004 CPUs (0.25 s / 0.1 s in floating point) at 2500m.
        let advised_millicores = advised.map(|cpus| (cpus * 1000.0 - 1e-6).ceil() as i64);
        let limit_millicores = limit.map(|(cpus, _)| millicores(cpus));
        let period_seconds = limit.map(|(_, period)| period);
        let kubernetes = match identity {
            Identity::Kubernetes {
                namespace,
                kind,
                name,
                container,
                named,
            } => Some(KubernetesRef {
                namespace: namespace.clone(),
                kind: kind.clone(),
                name: name.clone(),
                container: named.then(|| container.clone()),
            }),
            Identity::Cgroup { .. } => None,
        };
        let container_id = match identity {
            Identity::Cgroup { container_id, .. } if !container_id.is_empty() => {
                Some(container_id.clone())
            }
            _ => None,
        };
        Self {
            workload: identity.display(),
            burst_settable: kubernetes.is_none(),
            kubernetes,
            container_id,
            cgroups: members
                .iter()
                .map(|m| m.cgroup.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            pods,
            nodes: instances.len(),
            data_seconds,
            period_seconds,
            limit_cpus: limit.map(|(cpus, _)| cpus),
            limit_millicores,
            p99_demand_seconds,
            p99_demand_cpus: p99_demand_seconds.zip(period_seconds).map(|(d, p)| d / p),
            advised_cpus: advised,
            advised_millicores,
            advised_burst_seconds: max(&mut members.iter().filter_map(|m| m.burst))
                .filter(|_| refused.is_none()),
            stopped_ratio_now: (periods > 0.0).then(|| throttled / periods),
            stopped_ratio_after: max(&mut members.iter().filter_map(|m| m.after))
                .filter(|_| refused.is_none()),
            change_millicores: advised_millicores.zip(limit_millicores).map(|(a, l)| a - l),
            target_ratio: max(&mut members.iter().filter_map(|m| m.target)),
            refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            value,
        }
    }

    #[test]
    fn a_replica_sets_hash_is_dropped_only_when_it_is_one() {
        assert_eq!(deployment_of("web-7c9d8f6b5d"), Some("web"));
        assert_eq!(deployment_of("my-api-5b8c4"), Some("my-api"));
        // A vowel, a 0, a 1 or a 3 is no pod-template-hash: a ReplicaSet of its own.
        assert_eq!(deployment_of("frontend-canary"), None);
        assert_eq!(deployment_of("web-1234"), None);
        assert_eq!(deployment_of("web"), None);
    }

    #[test]
    fn pods_are_named_by_kube_state_metrics_and_their_own_cgroup_is_no_row() {
        let full = "a".repeat(64);
        let reading = Reading {
            pod_info: vec![sample(
                &[("uid", "u1"), ("namespace", "shop"), ("pod", "p")],
                1.0,
            )],
            pod_owner: vec![
                sample(
                    &[
                        ("uid", "u1"),
                        ("owner_kind", "ReplicaSet"),
                        ("owner_name", "web-7c9d8f6b5d"),
                        ("owner_is_controller", "true"),
                    ],
                    1.0,
                ),
                sample(
                    &[
                        ("uid", "u1"),
                        ("owner_kind", "Node"),
                        ("owner_name", "n"),
                        ("owner_is_controller", "false"),
                    ],
                    1.0,
                ),
            ],
            container_info: vec![sample(
                &[
                    ("uid", "u1"),
                    ("container", "app"),
                    ("container_id", &format!("containerd://{full}")),
                ],
                1.0,
            )],
            ..Reading::default()
        };
        let kube = Kubernetes::of(&reading);
        let container = Member {
            pod_uid: "u1".into(),
            container_id: full[..12].into(),
            container_id_full: full.clone(),
            ..Member::default()
        };
        assert_eq!(
            kube.identity(&container).unwrap().display(),
            "shop/Deployment/web:app"
        );
        let pod_cgroup = Member {
            pod_uid: "u1".into(),
            ..Member::default()
        };
        assert_eq!(kube.identity(&pod_cgroup), None);
        let unlisted = Member {
            container_id_full: "b".repeat(64),
            container_id: "b".repeat(12),
            ..container.clone()
        };
        assert_eq!(
            kube.identity(&unlisted).unwrap().display(),
            "shop/Deployment/web:id=bbbbbbbbbbbb"
        );
        // A pod kube-state-metrics does not know is named by its cgroup.
        let unknown = Member {
            pod_uid: "u2".into(),
            cgroup: "/kubepods/podu2/x".into(),
            ..Member::default()
        };
        assert_eq!(
            kube.identity(&unknown).unwrap().display(),
            "/kubepods/podu2/x"
        );
    }

    fn member(instance: &str, quota: f64, advised: Option<f64>, periods: f64) -> Member {
        Member {
            instance: instance.into(),
            cgroup: "/system.slice/batch.service".into(),
            quota: Some(quota),
            period: Some(0.1),
            periods: Some(periods),
            throttled: Some(periods / 10.0),
            advised,
            after: advised.map(|_| 0.005),
            target: Some(0.01),
            ..Member::default()
        }
    }

    #[test]
    fn replicas_get_the_larger_advice_and_the_change_is_in_whole_millicores() {
        let identity = Identity::Cgroup {
            path: "/system.slice/batch.service".into(),
            container_id: String::new(),
        };
        let members = [
            member("a", 0.2, Some(0.15), 300.0),
            member("b", 0.2, Some(0.25), 100.0),
        ];
        let r = Recommendation::of(&identity, &members, Some(0.18), 30.0);
        assert_eq!((r.pods, r.nodes), (2, 2));
        assert!((r.data_seconds - 40.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r.limit_millicores, Some(2000));
        assert_eq!(r.advised_millicores, Some(2500));
        assert_eq!(r.change_millicores, Some(500));
        assert_eq!(r.stopped_ratio_now, Some(0.1));
        assert!((r.p99_demand_cpus.unwrap() - 1.8).abs() < 1e-9);
        assert!(r.burst_settable && r.refused.is_none());
    }

    #[test]
    fn too_little_data_or_no_advice_is_a_refusal_without_a_number() {
        let identity = Identity::Cgroup {
            path: "/x".into(),
            container_id: String::new(),
        };
        let r = Recommendation::of(
            &identity,
            &[member("a", 0.2, Some(0.15), 10.0)],
            None,
            3600.0,
        );
        assert_eq!(
            r.refused,
            Some(Refusal::TooLittleData {
                has_seconds: 1.0,
                needs_seconds: 3600.0
            })
        );
        assert_eq!((r.advised_cpus, r.change_millicores), (None, None));
        let mut without = member("a", 0.2, None, 1e5);
        without.missing.insert("too_few_periods".into());
        let r = Recommendation::of(&identity, &[without], None, 3600.0);
        assert_eq!(
            r.refused,
            Some(Refusal::NoAdvice {
                serve_said: vec!["too_few_periods".into()]
            })
        );
    }
}
