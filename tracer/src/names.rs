//! Names users recognise for cgroup paths: the container (short id and runtime), the Kubernetes
//! pod (uid and QoS class) and the systemd unit that hold a cgroup, for the report's names and the
//! exporter's labels. [`Name::of`] reads a path in one pass, root to leaf; the layouts it knows,
//! cgroup v1 and v2 alike, are listed in docs/deploy.md ("The cgroup layouts named").

use std::fmt;

use serde::{Serialize, Serializer};

/// Digits of a container id that tools show (`docker ps`, `crictl ps`).
const SHORT_ID: usize = 12;
/// Digits of a full container id.
const FULL_ID: usize = 64;

/// What the innermost recognised component of a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A container run by docker (dockerd, or dockershim in Kubernetes).
    Docker,
    /// A container run by containerd's CRI plugin.
    Containerd,
    /// A container run by cri-o.
    CriO,
    /// cri-o's monitor process (conmon) of a container.
    CriOConmon,
    /// A container run by podman.
    Podman,
    /// podman's monitor process (conmon) of a container.
    PodmanConmon,
    /// A container of the Kubernetes cgroupfs driver, whose directory is its bare id: the
    /// runtime is not in the path.
    Container,
    /// A Kubernetes pod.
    Pod,
    /// The cgroup of one Kubernetes QoS class (burstable or besteffort), holding its pods.
    QosClass,
    /// The Kubernetes cgroup that holds every pod.
    Kubepods,
    /// A systemd service (`*.service`).
    Service,
    /// A systemd scope (`*.scope`): a session, a user app, a VM.
    Scope,
    /// A systemd slice (`*.slice`): a group of units.
    Slice,
}

impl Kind {
    /// The stable name used in NDJSON (`"name":{"kind":…}`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Containerd => "containerd",
            Self::CriO => "cri-o",
            Self::CriOConmon => "cri-o-conmon",
            Self::Podman => "podman",
            Self::PodmanConmon => "podman-conmon",
            Self::Container => "container",
            Self::Pod => "pod",
            Self::QosClass => "qos-class",
            Self::Kubepods => "kubepods",
            Self::Service => "service",
            Self::Scope => "scope",
            Self::Slice => "slice",
        }
    }

    fn is_container(self) -> bool {
        matches!(
            self,
            Self::Docker
                | Self::Containerd
                | Self::CriO
                | Self::CriOConmon
                | Self::Podman
                | Self::PodmanConmon
                | Self::Container
        )
    }

    /// How a container of this kind is introduced in a label.
    fn container_label(self) -> &'static str {
        match self {
            Self::CriOConmon => "cri-o conmon",
            Self::PodmanConmon => "podman conmon",
            other => other.as_str(),
        }
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A Kubernetes pod's QoS class, as its cgroup placement says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    /// The stable name used in NDJSON: the class as the cgroup paths spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "guaranteed",
            Self::Burstable => "burstable",
            Self::BestEffort => "besteffort",
        }
    }

    /// The class of a `burstable` / `besteffort` path word; guaranteed pods have no such word.
    fn of_word(word: &str) -> Option<Self> {
        match word {
            "burstable" => Some(Self::Burstable),
            "besteffort" => Some(Self::BestEffort),
            _ => None,
        }
    }
}

impl Serialize for Qos {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// What a cgroup path means to a user. Serialized as the NDJSON `"name"` object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Name {
    /// The innermost recognised thing holding the cgroup.
    pub kind: Kind,
    /// The innermost container holding the cgroup: the first 12 hex digits of its id.
    pub container_id: Option<String>,
    /// The same container's id in full (64 hex digits), as the runtime and the Kubernetes API
    /// (`containerStatuses[].containerID`, after the `<runtime>://` prefix) spell it. Not in
    /// the NDJSON name, which keeps to what people read.
    #[serde(skip)]
    pub container_id_full: Option<String>,
    /// The Kubernetes pod holding the cgroup, its uid with dashes.
    pub pod_uid: Option<String>,
    /// That pod's QoS class.
    pub qos: Option<Qos>,
    /// The innermost systemd unit holding the cgroup (`docker-<id>.scope`, `nginx.service`).
    pub unit: Option<String>,
    /// Which kind of container `container_id` is (a systemd unit inside a container keeps it).
    #[serde(skip)]
    container_kind: Option<Kind>,
}

impl Name {
    /// The name of the cgroup at `path` (under the hierarchy's mount, or a full path through
    /// it); `None` if nothing on the path is recognised.
    pub fn of(path: &str) -> Option<Self> {
        parts(path).fold(None, |name, part| Some(part.apply(name)))
    }

    /// What users call the cgroup at `path` (`docker 0123456789ab`), unless that is its
    /// path's last component already (`/system.slice/nginx.service`).
    pub fn friendly(path: &str) -> Option<String> {
        let label = Self::of(path)?.to_string();
        (path.rsplit('/').next() != Some(label.as_str())).then_some(label)
    }

    fn empty(kind: Kind) -> Self {
        Self {
            kind,
            container_id: None,
            container_id_full: None,
            pod_uid: None,
            qos: None,
            unit: None,
            container_kind: None,
        }
    }
}

/// A short label for people, innermost first: `docker 0123456789ab`, `containerd 0123456789ab
/// in pod <uid> (burstable)`, `nginx.service`, `nginx.service in docker 0123456789ab`.
impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let container = self
            .container_kind
            .zip(self.container_id.as_deref())
            .map(|(kind, id)| format!("{} {id}", kind.container_label()));
        let pod = self.pod_uid.as_deref().map(|uid| match self.qos {
            Some(qos) => format!("pod {uid} ({})", qos.as_str()),
            None => format!("pod {uid}"),
        });
        let (own, within) = match self.kind {
            Kind::Service | Kind::Scope | Kind::Slice => (self.unit.clone(), container.or(pod)),
            kind if kind.is_container() => (container, pod),
            Kind::Pod => (pod, None),
            Kind::QosClass => (
                Some(format!("kubepods {}", self.qos.map_or("?", Qos::as_str))),
                None,
            ),
            _ => (Some("kubepods".to_owned()), None),
        };
        match (own, within) {
            (Some(own), Some(within)) => write!(f, "{own} in {within}"),
            (Some(own), None) => f.write_str(&own),
            (None, _) => f.write_str(self.kind.as_str()),
        }
    }
}

/// The ids (in full) of every container on `path`, outermost first: a cgroup inside a
/// container (a kind node's pods, docker in docker) is in each of them. The runtimes' monitor
/// processes (conmon) are not the container.
pub fn container_ids(path: &str) -> impl Iterator<Item = &str> {
    parts(path).filter_map(|part| match part {
        Part::Container { kind, id, .. }
            if !matches!(kind, Kind::CriOConmon | Kind::PodmanConmon) =>
        {
            Some(id)
        }
        _ => None,
    })
}

/// What each component of `path` that this module recognises is, root to leaf.
fn parts(path: &str) -> impl Iterator<Item = Part<'_>> {
    // What the previous component was, for the cgroupfs layouts that need their parent:
    // `/docker/<id>`, `/kubepods/<qos>/pod<uid>/<id>`.
    path.split('/')
        .filter(|c| !c.is_empty())
        .scan(Parent::Other, |parent, component| {
            let part = Part::of(component, *parent);
            *parent = match (&part, component) {
                (None, "docker") => Parent::DockerRoot,
                (Some(Part::Kubepods { unit: None }), _) => Parent::Kubepods,
                (Some(Part::Qos { qos, unit: None }), _) => Parent::Qos(*qos),
                (Some(Part::Pod { unit: None, .. }), _) => Parent::Pod,
                _ => Parent::Other,
            };
            Some(part)
        })
        .flatten()
}

/// The previous path component, as far as the cgroupfs layouts care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parent {
    DockerRoot,
    Kubepods,
    Qos(Qos),
    Pod,
    Other,
}

/// What one path component is. `unit` is the component when it is a systemd unit; the
/// Kubernetes parts without one are the cgroupfs driver's, whose children need their parent.
#[derive(Debug, PartialEq, Eq)]
enum Part<'a> {
    /// A container, with the systemd unit it is (if a scope) and the pod its name carries (in
    /// the `<pod slice>:cri-containerd:<id>` form).
    Container {
        kind: Kind,
        id: &'a str,
        unit: Option<&'a str>,
        pod: Option<(String, Qos)>,
    },
    Pod {
        uid: String,
        qos: Qos,
        unit: Option<&'a str>,
    },
    Qos {
        qos: Qos,
        unit: Option<&'a str>,
    },
    Kubepods {
        unit: Option<&'a str>,
    },
    Unit {
        kind: Kind,
        unit: &'a str,
    },
}

impl<'a> Part<'a> {
    /// What `c` is, below a `parent`; `None` if nothing this module knows.
    fn of(c: &'a str, parent: Parent) -> Option<Self> {
        if let Some((kind, base)) = unit_kind(c) {
            return Some(match kind {
                Kind::Scope => container(base)
                    .map(|(kind, id)| Part::Container {
                        kind,
                        id,
                        unit: Some(c),
                        pod: None,
                    })
                    .unwrap_or(Part::Unit { kind, unit: c }),
                Kind::Slice => kube_slice(base, c).unwrap_or(Part::Unit { kind, unit: c }),
                _ => Part::Unit { kind, unit: c },
            });
        }
        if let Some(part) = runc_systemd_path(c) {
            return Some(part);
        }
        let bare = |kind| Part::Container {
            kind,
            id: c,
            unit: None,
            pod: None,
        };
        if let Some((kind, id)) = container(c) {
            return Some(Part::Container {
                kind,
                id,
                unit: None,
                pod: None,
            });
        }
        if c == "kubepods" {
            return Some(Part::Kubepods { unit: None });
        }
        match parent {
            Parent::Kubepods if Qos::of_word(c).is_some() => {
                Qos::of_word(c).map(|qos| Part::Qos { qos, unit: None })
            }
            Parent::Kubepods | Parent::Qos(_) => {
                let uid = c.strip_prefix("pod").and_then(pod_uid)?;
                let qos = match parent {
                    Parent::Qos(qos) => qos,
                    _ => Qos::Guaranteed,
                };
                Some(Part::Pod {
                    uid,
                    qos,
                    unit: None,
                })
            }
            Parent::Pod if is_full_id(c) => Some(bare(Kind::Container)),
            Parent::DockerRoot if is_full_id(c) => Some(bare(Kind::Docker)),
            _ => None,
        }
    }

    /// The name of the path so far, extended by this component.
    fn apply(self, name: Option<Name>) -> Name {
        // The kind is set by every arm below.
        let mut n = name.unwrap_or_else(|| Name::empty(Kind::Slice));
        let set_unit = |n: &mut Name, unit: Option<&str>| {
            if let Some(unit) = unit {
                n.unit = Some(unit.to_owned());
            }
        };
        match self {
            Part::Container {
                kind,
                id,
                unit,
                pod,
            } => {
                n.kind = kind;
                n.container_kind = Some(kind);
                n.container_id = Some(id[..SHORT_ID].to_owned());
                n.container_id_full = Some(id.to_owned());
                set_unit(&mut n, unit);
                if let Some((uid, qos)) = pod {
                    n.pod_uid = Some(uid);
                    n.qos = Some(qos);
                }
            }
            Part::Pod { uid, qos, unit, .. } => {
                n.kind = Kind::Pod;
                n.pod_uid = Some(uid);
                n.qos = Some(qos);
                set_unit(&mut n, unit);
            }
            Part::Qos { qos, unit, .. } => {
                n.kind = Kind::QosClass;
                n.qos = Some(qos);
                set_unit(&mut n, unit);
            }
            Part::Kubepods { unit } => {
                n.kind = Kind::Kubepods;
                set_unit(&mut n, unit);
            }
            Part::Unit { kind, unit } => {
                n.kind = kind;
                n.unit = Some(unit.to_owned());
            }
        }
        n
    }
}

/// A systemd unit name with a cgroup of its own: its kind and the name without the suffix.
fn unit_kind(c: &str) -> Option<(Kind, &str)> {
    let (base, kind) = [
        (".service", Kind::Service),
        (".scope", Kind::Scope),
        (".slice", Kind::Slice),
    ]
    .into_iter()
    .find_map(|(suffix, kind)| Some((c.strip_suffix(suffix)?, kind)))?;
    // systemd.unit(5): ASCII letters, digits, ":-_.\" and "@" for templates, at most 255 bytes.
    let valid = !base.is_empty()
        && c.len() <= 255
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b));
    valid.then_some((kind, base))
}

/// `<runtime prefix>-<64 hex>`: the container scopes without `.scope`, or the cgroupfs
/// driver's own directory names. The conmon prefixes are checked before their runtime's.
fn container(base: &str) -> Option<(Kind, &str)> {
    [
        ("docker-", Kind::Docker),
        ("cri-containerd-", Kind::Containerd),
        ("crio-conmon-", Kind::CriOConmon),
        ("crio-", Kind::CriO),
        ("libpod-conmon-", Kind::PodmanConmon),
        ("libpod-", Kind::Podman),
    ]
    .into_iter()
    .find_map(|(prefix, kind)| {
        let id = base.strip_prefix(prefix)?;
        is_full_id(id).then_some((kind, id))
    })
}

/// A Kubernetes slice of the systemd driver, `base` without `.slice`: words joined by `-`, of
/// which one is `kubepods`, then the QoS class (if not guaranteed), then `pod<uid>`.
fn kube_slice<'a>(base: &str, unit: &'a str) -> Option<Part<'a>> {
    let mut words = base.split('-').skip_while(|w| *w != "kubepods");
    words.next()?;
    let rest: Vec<&str> = words.collect();
    let unit = Some(unit);
    match rest.as_slice() {
        [] => Some(Part::Kubepods { unit }),
        [word] => match Qos::of_word(word) {
            Some(qos) => Some(Part::Qos { qos, unit }),
            None => Some(Part::Pod {
                uid: word.strip_prefix("pod").and_then(pod_uid)?,
                qos: Qos::Guaranteed,
                unit,
            }),
        },
        [word, pod] => Some(Part::Pod {
            uid: pod.strip_prefix("pod").and_then(pod_uid)?,
            qos: Qos::of_word(word)?,
            unit,
        }),
        _ => None,
    }
}

/// runc's systemd cgroupsPath `<slice>:<prefix>:<id>` used as a directory name, as containerd
/// does when kubelet uses the systemd driver and containerd does not:
/// `kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`.
fn runc_systemd_path(c: &str) -> Option<Part<'_>> {
    let mut fields = c.split(':');
    let (slice, prefix, id) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() || !is_full_id(id) {
        return None;
    }
    let kind = match prefix {
        "cri-containerd" => Kind::Containerd,
        "crio" => Kind::CriO,
        "docker" => Kind::Docker,
        _ => return None,
    };
    let pod = match kube_slice(slice.strip_suffix(".slice")?, slice) {
        Some(Part::Pod { uid, qos, .. }) => Some((uid, qos)),
        _ => None,
    };
    Some(Part::Container {
        kind,
        id,
        unit: None,
        pod,
    })
}

/// A pod uid as a path spells it (`_` for `-` in systemd slice names), with its dashes: a UUID
/// (8-4-4-4-12 hex digits) or, for static pods, 32 hex digits.
fn pod_uid(spelled: &str) -> Option<String> {
    let uid = spelled.replace('_', "-");
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let groups: Vec<&str> = uid.split('-').collect();
    let uuid = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]) && groups.iter().all(|g| hex(g));
    let hash = uid.len() == 32 && hex(&uid);
    (uuid || hash).then_some(uid)
}

/// 64 lowercase hex digits: a container id as runtimes write it.
fn is_full_id(s: &str) -> bool {
    s.len() == FULL_ID && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e6a1b2c5d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f";
    const SHORT: &str = "3f4e6a1b2c5d";
    /// Another container: the one that holds the others (docker in docker, a kind node).
    const NODE: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "6f2d0c1f-3e21-4b6a-9a59-0d3c3b6f5f5e";
    const UID_: &str = "6f2d0c1f_3e21_4b6a_9a59_0d3c3b6f5f5e";
    const STATIC_UID: &str = "8f2d3a1e5b6c7d8e9f0a1b2c3d4e5f6a";
    /// Where a v1 host mounts the cpu controller; paths may be given through it.
    const V1_MOUNT: &str = "/sys/fs/cgroup/cpu,cpuacct";

    fn name(path: &str) -> Name {
        Name::of(path).unwrap_or_else(|| panic!("no name for {path}"))
    }

    /// Checks kind, short id, pod uid, QoS and unit, the same through the v1 mount point.
    #[track_caller]
    fn check(
        path: &str,
        kind: Kind,
        id: Option<&str>,
        pod_uid: Option<&str>,
        qos: Option<Qos>,
        unit: Option<&str>,
    ) -> Name {
        for full in [path.to_owned(), format!("{V1_MOUNT}{path}")] {
            let n = name(&full);
            assert_eq!(n.kind, kind, "{full}: {n:?}");
            assert_eq!(n.container_id.as_deref(), id, "{full}");
            // The full id is the 64 digits in the path that the short one begins.
            let full_id = n.container_id_full.as_deref();
            assert_eq!(full_id.map(|f| &f[..SHORT_ID]), id, "{full}");
            assert!(
                full_id.is_none_or(|f| is_full_id(f) && full.contains(f)),
                "{full}: {full_id:?}"
            );
            assert_eq!(n.pod_uid.as_deref(), pod_uid, "{full}");
            assert_eq!(n.qos, qos, "{full}");
            assert_eq!(n.unit.as_deref(), unit, "{full}");
        }
        name(path)
    }

    #[test]
    fn docker_systemd_and_cgroupfs_drivers() {
        let scope = format!("docker-{ID}.scope");
        let n = check(
            &format!("/system.slice/{scope}"),
            Kind::Docker,
            Some(SHORT),
            None,
            None,
            Some(&scope),
        );
        assert_eq!(n.to_string(), format!("docker {SHORT}"));
        let n = check(
            &format!("/docker/{ID}"),
            Kind::Docker,
            Some(SHORT),
            None,
            None,
            None,
        );
        assert_eq!(n.to_string(), format!("docker {SHORT}"));
        // The daemon itself is a service, not a container.
        check(
            "/system.slice/docker.service",
            Kind::Service,
            None,
            None,
            None,
            Some("docker.service"),
        );
        // Docker in docker: the innermost container names it.
        check(
            &format!("/docker/{NODE}/docker/{ID}"),
            Kind::Docker,
            Some(SHORT),
            None,
            None,
            None,
        );
    }

    #[test]
    fn containerd_cri_o_and_podman_scopes() {
        for (scope, kind, label) in [
            (
                format!("cri-containerd-{ID}.scope"),
                Kind::Containerd,
                "containerd",
            ),
            (format!("crio-{ID}.scope"), Kind::CriO, "cri-o"),
            (
                format!("crio-conmon-{ID}.scope"),
                Kind::CriOConmon,
                "cri-o conmon",
            ),
            (format!("libpod-{ID}.scope"), Kind::Podman, "podman"),
            (
                format!("libpod-conmon-{ID}.scope"),
                Kind::PodmanConmon,
                "podman conmon",
            ),
        ] {
            let n = check(
                &format!("/machine.slice/{scope}"),
                kind,
                Some(SHORT),
                None,
                None,
                Some(&scope),
            );
            assert_eq!(n.to_string(), format!("{label} {SHORT}"));
        }
        // podman, rootless on v2: in the user's manager, with an inner `container` cgroup.
        let scope = format!("libpod-{ID}.scope");
        check(
            &format!("/user.slice/user-1000.slice/user@1000.service/user.slice/{scope}/container"),
            Kind::Podman,
            Some(SHORT),
            None,
            None,
            Some(&scope),
        );
        // podman pods, and podman's cgroupfs manager.
        check(
            &format!("/machine.slice/machine-libpod_pod_{STATIC_UID}.slice/{scope}"),
            Kind::Podman,
            Some(SHORT),
            None,
            None,
            Some(&scope),
        );
        check(
            &format!("/libpod_parent/libpod-{ID}"),
            Kind::Podman,
            Some(SHORT),
            None,
            None,
            None,
        );
        check(
            &format!("/libpod_parent/libpod-conmon-{ID}"),
            Kind::PodmanConmon,
            Some(SHORT),
            None,
            None,
            None,
        );
    }

    #[test]
    fn kubernetes_systemd_driver() {
        let burstable =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
        let scope = format!("cri-containerd-{ID}.scope");
        let n = check(
            &format!("{burstable}/{scope}"),
            Kind::Containerd,
            Some(SHORT),
            Some(UID),
            Some(Qos::Burstable),
            Some(&scope),
        );
        assert_eq!(
            n.to_string(),
            format!("containerd {SHORT} in pod {UID} (burstable)")
        );
        let n = check(
            &burstable,
            Kind::Pod,
            None,
            Some(UID),
            Some(Qos::Burstable),
            Some(&format!("kubepods-burstable-pod{UID_}.slice")),
        );
        assert_eq!(n.to_string(), format!("pod {UID} (burstable)"));
        let n = check(
            "/kubepods.slice/kubepods-besteffort.slice",
            Kind::QosClass,
            None,
            None,
            Some(Qos::BestEffort),
            Some("kubepods-besteffort.slice"),
        );
        assert_eq!(n.to_string(), "kubepods besteffort");
        let n = check(
            "/kubepods.slice",
            Kind::Kubepods,
            None,
            None,
            None,
            Some("kubepods.slice"),
        );
        assert_eq!(n.to_string(), "kubepods");

        // besteffort with cri-o (its conmon next to the container); guaranteed: no QoS slice.
        let besteffort = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
        );
        check(
            &format!("{besteffort}/crio-{ID}.scope"),
            Kind::CriO,
            Some(SHORT),
            Some(UID),
            Some(Qos::BestEffort),
            Some(&format!("crio-{ID}.scope")),
        );
        check(
            &format!("{besteffort}/crio-conmon-{ID}.scope"),
            Kind::CriOConmon,
            Some(SHORT),
            Some(UID),
            Some(Qos::BestEffort),
            Some(&format!("crio-conmon-{ID}.scope")),
        );
        check(
            &format!("/kubepods.slice/kubepods-pod{UID_}.slice/docker-{ID}.scope"),
            Kind::Docker,
            Some(SHORT),
            Some(UID),
            Some(Qos::Guaranteed),
            Some(&format!("docker-{ID}.scope")),
        );
        // A static pod: its uid is a 32-digit hash.
        check(
            &format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice"
            ),
            Kind::Pod,
            None,
            Some(STATIC_UID),
            Some(Qos::Burstable),
            Some(&format!("kubepods-burstable-pod{STATIC_UID}.slice")),
        );
        // kind nodes: kubelet's cgroup root is /kubelet.slice, every slice prefixed `kubelet-`.
        check(
            &format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/\
                 kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
            ),
            Kind::Containerd,
            Some(SHORT),
            Some(UID),
            Some(Qos::Burstable),
            Some(&format!("cri-containerd-{ID}.scope")),
        );
        // containerd not using systemd under kubelet's systemd driver: runc's path as a directory.
        let n = check(
            &format!(
                "/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{ID}"
            ),
            Kind::Containerd,
            Some(SHORT),
            Some(UID),
            Some(Qos::Burstable),
            Some("containerd.service"),
        );
        assert_eq!(
            n.to_string(),
            format!("containerd {SHORT} in pod {UID} (burstable)")
        );
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        let n = check(
            &format!("/kubepods/burstable/pod{UID}/{ID}"),
            Kind::Container,
            Some(SHORT),
            Some(UID),
            Some(Qos::Burstable),
            None,
        );
        assert_eq!(
            n.to_string(),
            format!("container {SHORT} in pod {UID} (burstable)")
        );
        check(
            &format!("/kubepods/besteffort/pod{UID}/crio-{ID}"),
            Kind::CriO,
            Some(SHORT),
            Some(UID),
            Some(Qos::BestEffort),
            None,
        );
        check(
            &format!("/kubepods/pod{UID}/{ID}"),
            Kind::Container,
            Some(SHORT),
            Some(UID),
            Some(Qos::Guaranteed),
            None,
        );
        check(
            &format!("/kubepods/pod{UID}"),
            Kind::Pod,
            None,
            Some(UID),
            Some(Qos::Guaranteed),
            None,
        );
        check(
            "/kubepods/burstable",
            Kind::QosClass,
            None,
            None,
            Some(Qos::Burstable),
            None,
        );
        check("/kubepods", Kind::Kubepods, None, None, None, None);
        // kind nodes on v1: the node container's cgroup, then kubelet's root.
        check(
            &format!("/docker/{NODE}/kubelet/kubepods/besteffort/pod{UID}/{ID}"),
            Kind::Container,
            Some(SHORT),
            Some(UID),
            Some(Qos::BestEffort),
            None,
        );
    }

    #[test]
    fn systemd_services_slices_and_scopes() {
        for (path, kind, unit) in [
            (
                "/system.slice/nginx.service",
                Kind::Service,
                "nginx.service",
            ),
            (
                "/system.slice/getty@tty1.service",
                Kind::Service,
                "getty@tty1.service",
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service",
                Kind::Service,
                "user@1000.service",
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice",
                Kind::Slice,
                "app.slice",
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice/\
                 app-org.gnome.Terminal.slice/vte-spawn-1a2b.scope",
                Kind::Scope,
                "vte-spawn-1a2b.scope",
            ),
            (
                "/user.slice/user-1000.slice/session-3.scope",
                Kind::Scope,
                "session-3.scope",
            ),
            ("/system.slice", Kind::Slice, "system.slice"),
            ("/init.scope", Kind::Scope, "init.scope"),
            // v2 services with delegated sub-cgroups: the service still names them.
            (
                "/system.slice/app.service/workers",
                Kind::Service,
                "app.service",
            ),
        ] {
            let n = check(path, kind, None, None, None, Some(unit));
            assert_eq!(n.to_string(), unit);
        }
        // A service inside a container (systemd as the container's init).
        let n = name(&format!(
            "/system.slice/docker-{ID}.scope/system.slice/nginx.service"
        ));
        assert_eq!(
            (n.kind, n.unit.as_deref(), n.container_id.as_deref()),
            (Kind::Service, Some("nginx.service"), Some(SHORT))
        );
        assert_eq!(n.to_string(), format!("nginx.service in docker {SHORT}"));
    }

    #[test]
    fn unrecognised_paths_have_no_name() {
        for path in [
            "",
            "/",
            "/demo",
            "/tt-host-one-1234",
            V1_MOUNT,
            "/docker",
            "/docker/abc123",
            // 63 digits, upper case, not hex.
            &format!("/docker/{}", &ID[1..]),
            &format!("/docker/{}", ID.to_uppercase()),
            &format!("/docker/{}", ID.replace('a', "g")),
            // A bare id only names a container under /docker or a pod.
            &format!("/{ID}"),
            &format!("/lxc/{ID}"),
            "/podcast/episode-1",
            &format!("/pod{UID}"),
            "/system.slice.d",
            "/foo.service.d",
            "/.service",
            "/bad name.service",
        ] {
            assert_eq!(Name::of(path), None, "{path}");
        }
    }

    #[test]
    fn near_misses_fall_back_to_what_is_recognised() {
        // Short or malformed container ids: still systemd scopes, not containers.
        let n = name("/system.slice/docker-abc123.scope");
        assert_eq!((n.kind, n.container_id), (Kind::Scope, None));
        let n = name(&format!("/machine.slice/libpod-{}.scope", &ID[..63]));
        assert_eq!((n.kind, n.container_id), (Kind::Scope, None));
        // A pod slice whose uid is not one, a QoS word that is not a class.
        let n = name("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podxyz.slice");
        assert_eq!(
            (n.kind, n.pod_uid, n.unit.as_deref()),
            (Kind::Slice, None, Some("kubepods-burstable-podxyz.slice"))
        );
        assert_eq!(
            name("/kubepods.slice/kubepods-gold.slice").kind,
            Kind::Slice
        );
        // cgroupfs: `burstable` only after `kubepods`, a pod only after kubepods or its class, a
        // bare id only right under the pod.
        assert_eq!(Name::of("/burstable"), None);
        let n = name(&format!("/kubepods/burstable/extra/pod{UID}/{ID}"));
        assert_eq!(
            (n.kind, n.pod_uid, n.container_id),
            (Kind::QosClass, None, None)
        );
        let n = name(&format!("/kubepods/burstable/podnot-a-uid/{ID}"));
        assert_eq!((n.kind, n.container_id), (Kind::QosClass, None));
        let n = name(&format!("/kubepods/pod{UID}/extra/{ID}"));
        assert_eq!((n.kind, n.container_id), (Kind::Pod, None));
        // runc's form needs a known prefix and a full id.
        let n = name(&format!(
            "/system.slice/containerd.service/kubepods-pod{UID_}.slice:other:{ID}"
        ));
        assert_eq!((n.kind, n.container_id), (Kind::Service, None));
    }

    #[test]
    fn serializes_as_the_ndjson_name_object() {
        let n = name(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope"
        ));
        assert_eq!(
            serde_json::to_value(&n).unwrap(),
            serde_json::json!({
                "kind": "cri-o",
                "container_id": SHORT,
                "pod_uid": UID,
                "qos": "burstable",
                "unit": format!("crio-{ID}.scope"),
            })
        );
    }

    proptest::proptest! {
        /// Any path: a name or none, never a panic; container-shaped paths always name one.
        #[test]
        fn any_path_names_or_not(path in "(/[a-z0-9:_.@-]{0,80}){0,6}") {
            let _ = Name::of(&path);
        }

        #[test]
        fn docker_and_podman_paths_name_their_container(id in "[0-9a-f]{64}") {
            for path in [format!("/docker/{id}"), format!("/system.slice/docker-{id}.scope"),
                         format!("/machine.slice/libpod-{id}.scope")] {
                proptest::prop_assert!(Name::of(&path).is_some(), "{}", path);
            }
        }
    }
}
