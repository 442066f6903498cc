//! Resolves, from the running kernel's BTF, every kernel struct offset the probes read.
//!
//! This module owns the translation from a BTF file (normally `/sys/kernel/btf/vmlinux`) to
//! [`tracer_common::Offsets`]. Rust eBPF cannot emit CO-RE relocations, so the agent does here
//! what libbpf would do at load time: find each field by name, follow anonymous structs and
//! unions, pre-add nested paths, locate bit fields, check that each field still has the shape
//! the probe reads (a pointer to the expected struct, an integer of the expected width), and
//! tell whether `throttle_cfs_rq` returns `bool` or `void`.
//!
//! It never guesses: a field that cannot be resolved exactly is `ABSENT`. A missing required
//! field is an error; a missing optional one turns its feature off, with the reason in
//! [`Resolved::disabled`]. Field names and their history are in docs/kernel.md §6.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use btf_rs::{Btf, BtfType, Struct, Type};
use tracer_common::{BitField, Offsets};

/// The kernel functions the probes care about; [`Resolved::functions`] says which have a BTF
/// `FUNC` record.
pub const PROBE_FUNCTIONS: [&str; 8] = [
    "throttle_cfs_rq",
    "unthrottle_cfs_rq",
    "distribute_cfs_runtime",
    "__cfsb_csd_unthrottle",
    "tg_set_cfs_bandwidth",
    "tg_set_bandwidth",
    "rq_offline_fair",
    "destroy_cfs_bandwidth",
];

/// BTF describes no pointer size; every kernel the eBPF side runs on has 64-bit pointers and
/// the probes read them as `u64`.
const POINTER_BYTES: u32 = 8;

/// Why the BTF could not be turned into offsets at all.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error(
        "kernel BTF is missing: {} does not exist; the kernel must be built with \
         CONFIG_DEBUG_INFO_BTF=y (or give the path of a BTF file for the running kernel)",
        path.display()
    )]
    Missing { path: PathBuf },
    #[error("cannot read kernel BTF {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse kernel BTF {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("kernel BTF lacks what the tracer needs ({field}): {reason}")]
    Required {
        /// The `Offsets` field that could not be filled.
        field: &'static str,
        #[source]
        reason: Unresolved,
    },
}

/// Why one field could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    #[error("BTF has no struct {0}")]
    NoType(String),
    #[error("struct {root} has no {path}")]
    NoField { root: String, path: String },
    #[error("struct {root} field {path} is {found}, expected {expected}")]
    WrongShape {
        root: String,
        path: String,
        found: String,
        expected: String,
    },
    #[error("struct {root} field {path}: the {count} BTF definitions of struct {root} disagree")]
    Ambiguous {
        root: String,
        path: String,
        count: usize,
    },
    #[error("{0}, and {1}")]
    Neither(Box<Unresolved>, Box<Unresolved>),
    #[error("BTF is inconsistent: {0}")]
    Corrupt(String),
}

/// An optional part of the output that needs fields some kernels lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `rq->clock - cfs_rq->throttled_clock`: the duration as the kernel accounts it.
    KernelDuration,
    /// `h_nr_queued` / `h_nr_running` of the stopped cfs_rq.
    TaskCount,
    /// `tg->cfs_bandwidth.{quota,period}`.
    Bandwidth,
    /// `tg->cfs_bandwidth.burst` (5.14+).
    Burst,
    /// pid, tid and comm of the task running on the stopped CPU.
    RunningTask,
    /// What the tracepoint backend needs to see throttles and refills at all.
    Tracepoint,
    /// `throttled_clock_self_time` (6.6+): the tracepoint backend's exact kernel duration.
    SelfTime,
    /// `rq->cfsb_csd` and its list (6.2+): ends of async unthrottles on remote CPUs.
    AsyncUnthrottle,
    /// `task_struct.throttled` (6.18): tasks parked by the task-based throttle.
    ParkedTasks,
    /// `task_group.children` / `.siblings` / `.cfs_rq` and `cfs_rq.nr_running` (`nr_queued`):
    /// every child a parent's stop stops, not only the one whose task was seen.
    StoppedChildren,
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Feature::KernelDuration => "kernel-accounted duration",
            Feature::TaskCount => "task count",
            Feature::Bandwidth => "quota and period",
            Feature::Burst => "burst",
            Feature::RunningTask => "running task pid/comm",
            Feature::Tracepoint => "tracepoint backend",
            Feature::SelfTime => "tracepoint backend exact kernel duration",
            Feature::AsyncUnthrottle => "tracepoint backend async unthrottle ends",
            Feature::ParkedTasks => "parked task count",
            Feature::StoppedChildren => "stopped children of a quota owner",
        })
    }
}

impl Feature {
    /// Whether this kernel has the feature at all: a field that is simply not in its BTF (older
    /// or newer kernels) leaves the feature absent without turning it "off".
    pub fn in_kernel(self, o: &Offsets) -> bool {
        let field = match self {
            Feature::KernelDuration => o.cfs_rq_throttled_clock,
            Feature::TaskCount => o.cfs_rq_nr_tasks,
            Feature::Bandwidth => o.tg_quota,
            Feature::Burst => o.tg_burst,
            Feature::RunningTask => o.rq_curr,
            Feature::Tracepoint => o.cfs_rq_runtime_enabled,
            Feature::SelfTime => o.cfs_rq_throttled_clock_self_time,
            Feature::AsyncUnthrottle => o.rq_cfsb_csd,
            Feature::ParkedTasks => o.task_throttled.offset,
            Feature::StoppedChildren => o.tg_children,
        };
        field != tracer_common::ABSENT
    }
}

/// A feature turned off, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    pub feature: Feature,
    pub reason: String,
}

impl fmt::Display for Disabled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.feature, self.reason)
    }
}

/// What BTF says `throttle_cfs_rq` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThrottleReturn {
    /// 5.4.69+ and 5.8+: the return value says whether it throttled.
    Bool,
    /// 5.4.0–5.4.68: read `cfs_rq->throttled` after it returns.
    Void,
    /// No `FUNC throttle_cfs_rq` in BTF (inlined, or BTF without functions). `Offsets` keeps
    /// its default (bool); the caller decides whether the probe can work at all.
    NotInBtf,
    /// Something else (a return type that is neither, or FUNC records that disagree).
    Unexpected(String),
}

/// Everything resolved from one BTF file.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// What the eBPF program gets as its global before load.
    pub offsets: Offsets,
    /// Optional features turned off, each with the reason.
    pub disabled: Vec<Disabled>,
    pub throttle_return: ThrottleReturn,
    /// Which cfs_rq field `offsets.cfs_rq_nr_tasks` is (`h_nr_queued` or `h_nr_running`).
    pub nr_tasks_field: Option<&'static str>,
    /// Which cfs_rq field `offsets.cfs_rq_nr_queued` is (`nr_queued` or `nr_running`).
    pub nr_queued_field: Option<&'static str>,
    /// The [`PROBE_FUNCTIONS`] that have a BTF `FUNC` record. A record says the function was
    /// compiled out of line somewhere; it does not prove a probe can attach to it.
    pub functions: Vec<&'static str>,
}

/// Reads and parses `btf` and resolves every offset in [`Offsets`].
pub fn resolve(btf: &Path) -> Result<Resolved, BtfError> {
    let bytes = std::fs::read(btf).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            BtfError::Missing {
                path: btf.to_path_buf(),
            }
        } else {
            BtfError::Read {
                path: btf.to_path_buf(),
                source,
            }
        }
    })?;
    let parsed = Btf::from_bytes(&bytes).map_err(|e| BtfError::Parse {
        path: btf.to_path_buf(),
        source: e.into(),
    })?;
    resolve_parsed(&Kernel { btf: parsed })
}

fn resolve_parsed(k: &Kernel) -> Result<Resolved, BtfError> {
    let mut o = Offsets::ABSENT;
    let mut disabled = Vec::new();

    // Required: without these no stop can be attributed to a CPU and a cgroup.
    let required = |field, r: Result<u32, Unresolved>| {
        r.map_err(|reason| BtfError::Required { field, reason })
    };
    o.cfs_rq_rq = required("cfs_rq_rq", k.offset("cfs_rq", &["rq"], Shape::Ptr("rq")))?;
    o.cfs_rq_tg = required(
        "cfs_rq_tg",
        k.offset("cfs_rq", &["tg"], Shape::Ptr("task_group")),
    )?;
    o.cfs_rq_throttled = k
        .flag("cfs_rq", "throttled")
        .map_err(|reason| BtfError::Required {
            field: "cfs_rq_throttled",
            reason,
        })?;
    o.rq_cpu = required("rq_cpu", k.offset("rq", &["cpu"], Shape::Int(4)))?;
    o.tg_cgroup = required(
        "tg_cgroup",
        k.offset("task_group", &["css", "cgroup"], Shape::Ptr("cgroup")),
    )?;
    o.cgroup_kn = required(
        "cgroup_kn",
        k.offset("cgroup", &["kn"], Shape::Ptr("kernfs_node")),
    )?;
    let (kn_id, is_union) = k.kn_id().map_err(|reason| BtfError::Required {
        field: "kn_id",
        reason,
    })?;
    o.kn_id = kn_id;
    o.kn_id_is_union = u32::from(is_union);

    // Optional groups: each is all or nothing, so the probe never sees half a feature.
    let mut group = |feature, fields: Vec<(&mut u32, Result<u32, Unresolved>)>| {
        let reasons: Vec<String> = fields
            .iter()
            .filter_map(|(_, r)| r.as_ref().err().map(ToString::to_string))
            .collect();
        if reasons.is_empty() {
            for (slot, r) in fields {
                if let Ok(v) = r {
                    *slot = v;
                }
            }
        } else {
            disabled.push(Disabled {
                feature,
                reason: reasons.join("; "),
            });
        }
    };

    group(
        Feature::KernelDuration,
        vec![
            (
                &mut o.cfs_rq_throttled_clock,
                k.offset("cfs_rq", &["throttled_clock"], Shape::Int(8)),
            ),
            (&mut o.rq_clock, k.offset("rq", &["clock"], Shape::Int(8))),
        ],
    );

    // 6.14 renamed h_nr_running to h_nr_queued (6.12.37+ has the rename backported, next to
    // the new h_nr_runnable). A kernel has one of the two names, so look for the new one first.
    let nr_tasks = one_of(k, "cfs_rq", ["h_nr_queued", "h_nr_running"], Shape::Int(4));
    let nr_tasks_field = nr_tasks.as_ref().ok().map(|&(_, name)| name);
    let nr_tasks = nr_tasks.map(|(v, _)| v);
    group(Feature::TaskCount, vec![(&mut o.cfs_rq_nr_tasks, nr_tasks)]);

    // 6.14 renamed nr_running to nr_queued (the entities queued on this cfs_rq).
    let nr_queued = one_of(k, "cfs_rq", ["nr_queued", "nr_running"], Shape::Int(4));
    let nr_queued_field = nr_queued.as_ref().ok().map(|&(_, name)| name);
    // 7.x allocates a group's cfs_rqs per CPU: `struct cfs_rq __percpu *cfs_rq` replaced the
    // array of pointers (BTF may not keep the `__percpu` tag, and no other kernel has a single
    // `struct cfs_rq *` there).
    let (tg_cfs_rq, percpu) = match k.offset("task_group", &["cfs_rq"], Shape::PtrPtr("cfs_rq")) {
        Ok(at) => (Ok(at), false),
        Err(array) => match k.offset("task_group", &["cfs_rq"], Shape::Ptr("cfs_rq")) {
            Ok(at) => (Ok(at), true),
            Err(_) => (Err(array), false),
        },
    };
    o.tg_cfs_rq_percpu = u32::from(percpu);
    group(
        Feature::StoppedChildren,
        vec![
            (&mut o.cfs_rq_nr_queued, nr_queued.map(|(v, _)| v)),
            (&mut o.tg_cfs_rq, tg_cfs_rq),
            (
                &mut o.tg_children,
                k.offset("task_group", &["children"], Shape::Struct("list_head")),
            ),
            (
                &mut o.tg_siblings,
                k.offset("task_group", &["siblings"], Shape::Struct("list_head")),
            ),
        ],
    );

    group(
        Feature::Bandwidth,
        vec![
            (
                &mut o.tg_period,
                k.offset("task_group", &["cfs_bandwidth", "period"], Shape::Int(8)),
            ),
            (
                &mut o.tg_quota,
                k.offset("task_group", &["cfs_bandwidth", "quota"], Shape::Int(8)),
            ),
        ],
    );
    group(
        Feature::Burst,
        vec![(
            &mut o.tg_burst,
            k.offset("task_group", &["cfs_bandwidth", "burst"], Shape::Int(8)),
        )],
    );

    group(
        Feature::RunningTask,
        vec![
            (
                &mut o.rq_curr,
                k.offset("rq", &["curr"], Shape::Ptr("task_struct")),
            ),
            (
                &mut o.task_pid,
                k.offset("task_struct", &["pid"], Shape::Int(4)),
            ),
            (
                &mut o.task_tgid,
                k.offset("task_struct", &["tgid"], Shape::Int(4)),
            ),
            (
                &mut o.task_comm,
                k.offset("task_struct", &["comm"], Shape::Bytes(16)),
            ),
            (
                &mut o.task_se,
                k.offset("task_struct", &["se"], Shape::Struct("sched_entity")),
            ),
            (
                &mut o.se_cfs_rq,
                k.offset("sched_entity", &["cfs_rq"], Shape::Ptr("cfs_rq")),
            ),
            (
                &mut o.se_parent,
                k.offset("sched_entity", &["parent"], Shape::Ptr("sched_entity")),
            ),
        ],
    );

    // The tracepoint backend's fields, and those only newer kernels have. Their absence only
    // matters to that backend, which names what is missing when it is asked for (on older
    // kernels it is the kernel's age, not a defect); so here only a field that exists with
    // another shape is reported as disabled.
    let mut gated = |feature, fields: Vec<(&mut u32, Result<u32, Unresolved>)>| {
        let reasons: Vec<String> = fields
            .iter()
            .filter_map(|(_, r)| r.as_ref().err())
            .filter(|e| !matches!(e, Unresolved::NoField { .. } | Unresolved::NoType(_)))
            .map(ToString::to_string)
            .collect();
        if fields.iter().all(|(_, r)| r.is_ok()) {
            for (slot, r) in fields {
                if let Ok(v) = r {
                    *slot = v;
                }
            }
        } else if !reasons.is_empty() {
            disabled.push(Disabled {
                feature,
                reason: reasons.join("; "),
            });
        }
    };
    gated(
        Feature::Tracepoint,
        vec![
            (
                &mut o.cfs_rq_runtime_enabled,
                k.offset("cfs_rq", &["runtime_enabled"], Shape::Int(4)),
            ),
            (
                &mut o.cfs_rq_throttle_count,
                k.offset("cfs_rq", &["throttle_count"], Shape::Int(4)),
            ),
            (
                &mut o.cfs_rq_throttled_list,
                k.offset("cfs_rq", &["throttled_list"], Shape::Struct("list_head")),
            ),
            (
                &mut o.cfsb_period_timer,
                k.offset("cfs_bandwidth", &["period_timer"], Shape::Struct("hrtimer")),
            ),
            (
                &mut o.cfsb_slack_timer,
                k.offset("cfs_bandwidth", &["slack_timer"], Shape::Struct("hrtimer")),
            ),
            (
                &mut o.cfsb_throttled_cfs_rq,
                k.offset(
                    "cfs_bandwidth",
                    &["throttled_cfs_rq"],
                    Shape::Struct("list_head"),
                ),
            ),
            (
                &mut o.hrtimer_function,
                k.offset("hrtimer", &["function"], Shape::FuncPtr),
            ),
            // The walk from a task up its groups (also part of RunningTask).
            (
                &mut o.task_se,
                k.offset("task_struct", &["se"], Shape::Struct("sched_entity")),
            ),
            (
                &mut o.se_cfs_rq,
                k.offset("sched_entity", &["cfs_rq"], Shape::Ptr("cfs_rq")),
            ),
            (
                &mut o.se_parent,
                k.offset("sched_entity", &["parent"], Shape::Ptr("sched_entity")),
            ),
        ],
    );

    gated(
        Feature::SelfTime,
        vec![
            (
                &mut o.cfs_rq_throttled_clock_self,
                k.offset("cfs_rq", &["throttled_clock_self"], Shape::Int(8)),
            ),
            (
                &mut o.cfs_rq_throttled_clock_self_time,
                k.offset("cfs_rq", &["throttled_clock_self_time"], Shape::Int(8)),
            ),
        ],
    );
    gated(
        Feature::AsyncUnthrottle,
        vec![
            (
                &mut o.rq_cfsb_csd,
                k.offset("rq", &["cfsb_csd"], Shape::Struct("__call_single_data")),
            ),
            (
                &mut o.rq_cfsb_csd_list,
                k.offset("rq", &["cfsb_csd_list"], Shape::Struct("list_head")),
            ),
            (
                &mut o.cfs_rq_throttled_csd_list,
                k.offset(
                    "cfs_rq",
                    &["throttled_csd_list"],
                    Shape::Struct("list_head"),
                ),
            ),
            (
                &mut o.csd_func,
                k.offset("__call_single_data", &["func"], Shape::FuncPtr),
            ),
        ],
    );
    match k.flag("task_struct", "throttled") {
        Ok(field) => o.task_throttled = field,
        Err(Unresolved::NoField { .. } | Unresolved::NoType(_)) => {}
        Err(e) => disabled.push(Disabled {
            feature: Feature::ParkedTasks,
            reason: e.to_string(),
        }),
    }

    let throttle_return = k.throttle_return();
    o.throttle_returns_bool = match throttle_return {
        ThrottleReturn::Void => 0,
        // Keep the default for the unknown cases; `throttle_return` tells the caller.
        _ => Offsets::ABSENT.throttle_returns_bool,
    };

    let functions = PROBE_FUNCTIONS
        .iter()
        .copied()
        .filter(|name| !k.funcs(name).is_empty())
        .collect();

    Ok(Resolved {
        offsets: o,
        disabled,
        throttle_return,
        nr_tasks_field,
        nr_queued_field,
        functions,
    })
}

/// The offset of whichever of two names (`[new, old]`) of a renamed field `root` has, the
/// new name first, and which one it was.
fn one_of(
    k: &Kernel,
    root: &str,
    [new, old]: [&'static str; 2],
    shape: Shape,
) -> Result<(u32, &'static str), Unresolved> {
    k.offset(root, &[new], shape)
        .map(|v| (v, new))
        .or_else(|first| {
            k.offset(root, &[old], shape)
                .map(|v| (v, old))
                .map_err(|second| Unresolved::Neither(Box::new(first), Box::new(second)))
        })
}

/// What the probe reads at a field, checked so a field that changed type is not misread.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// A pointer to the named struct.
    Ptr(&'static str),
    /// A pointer to pointers to the named struct (a per-CPU array such as `tg->cfs_rq`).
    PtrPtr(&'static str),
    /// An integer (or enum) of this many bytes, not a bit field.
    Int(u32),
    /// Any type of this many bytes (e.g. `char comm[16]`).
    Bytes(u32),
    /// An embedded struct of this name.
    Struct(&'static str),
    /// A pointer to a function.
    FuncPtr,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Ptr(s) => write!(f, "a pointer to struct {s}"),
            Shape::PtrPtr(s) => write!(f, "a pointer to pointers to struct {s}"),
            Shape::Int(n) => write!(f, "a {n}-byte integer"),
            Shape::Bytes(n) => write!(f, "{n} bytes"),
            Shape::Struct(s) => write!(f, "struct {s}"),
            Shape::FuncPtr => write!(f, "a function pointer"),
        }
    }
}

/// A member found by name, with its position from the start of the root struct.
#[derive(Debug, Clone)]
struct Found {
    bit_offset: u32,
    /// 0 when the member is not a bit field.
    bitfield_bits: u32,
    type_id: u32,
}

struct Kernel {
    btf: Btf,
}

impl Kernel {
    /// Byte offset of `root.path…` checked against `shape`.
    fn offset(&self, root: &str, path: &[&str], shape: Shape) -> Result<u32, Unresolved> {
        let found = self.path(root, path)?;
        let wrong = |found: String| Unresolved::WrongShape {
            root: root.to_string(),
            path: path.join("."),
            found,
            expected: shape.to_string(),
        };
        if found.bitfield_bits != 0 {
            return Err(wrong(format!("a {}-bit bit field", found.bitfield_bits)));
        }
        if found.bit_offset % 8 != 0 {
            return Err(wrong(format!("at bit {}", found.bit_offset)));
        }
        let ty = self.strip(found.type_id)?;
        let ok = match (&shape, &ty) {
            (Shape::Ptr(want), Type::Ptr(p)) => self.points_to_struct(p, want)?,
            (Shape::PtrPtr(want), Type::Ptr(p)) => {
                let target = p
                    .get_type_id()
                    .map_err(|e| Unresolved::Corrupt(e.to_string()))?;
                match self.strip(target)? {
                    Type::Ptr(inner) => self.points_to_struct(&inner, want)?,
                    _ => false,
                }
            }
            (Shape::Int(n), Type::Int(_) | Type::Enum(_) | Type::Enum64(_)) => {
                self.size(found.type_id)? == Some(*n)
            }
            (Shape::Bytes(n), _) => self.size(found.type_id)? == Some(*n),
            (Shape::Struct(want), Type::Struct(s)) => self.name(s)? == *want,
            (Shape::FuncPtr, Type::Ptr(p)) => {
                let target = p
                    .get_type_id()
                    .map_err(|e| Unresolved::Corrupt(e.to_string()))?;
                matches!(self.strip(target)?, Type::FuncProto(_))
            }
            _ => false,
        };
        if !ok {
            return Err(wrong(self.describe(found.type_id)?));
        }
        Ok(found.bit_offset / 8)
    }

    /// Whether pointer `p` points to `struct want`.
    fn points_to_struct(&self, p: &btf_rs::Ptr, want: &str) -> Result<bool, Unresolved> {
        let target = p
            .get_type_id()
            .map_err(|e| Unresolved::Corrupt(e.to_string()))?;
        Ok(match self.strip(target)? {
            Type::Struct(s) => self.name(&s)? == want,
            _ => false,
        })
    }

    /// A flag read as "non-zero": `int throttled` before 6.18, `bool throttled:1` since.
    fn flag(&self, root: &str, name: &str) -> Result<BitField, Unresolved> {
        let found = self.path(root, &[name])?;
        let ty = self.strip(found.type_id)?;
        let wrong = |found: String| Unresolved::WrongShape {
            root: root.to_string(),
            path: name.to_string(),
            found,
            expected: "an integer of at most 32 bits".to_string(),
        };
        if !matches!(ty, Type::Int(_) | Type::Enum(_)) {
            return Err(wrong(self.describe(found.type_id)?));
        }
        let bits = match found.bitfield_bits {
            0 => match self.size(found.type_id)? {
                Some(bytes) => bytes * 8,
                None => return Err(wrong(self.describe(found.type_id)?)),
            },
            bits => bits,
        };
        let root_size = self.root_size(root)?;
        bit_window(found.bit_offset, bits, root_size).ok_or_else(|| {
            wrong(format!(
                "{bits} bits at bit {} that no 32-bit read inside the struct covers",
                found.bit_offset
            ))
        })
    }

    /// `kernfs_node.id`: `u64` since 5.5, `union kernfs_node_id` on 5.4 (inode in the low half).
    fn kn_id(&self) -> Result<(u32, bool), Unresolved> {
        let found = self.path("kernfs_node", &["id"])?;
        let is_union = matches!(self.strip(found.type_id)?, Type::Union(_));
        let shape = if is_union {
            // Size-only check: the union's layout was fixed for its whole life.
            Shape::Bytes(8)
        } else {
            Shape::Int(8)
        };
        Ok((self.offset("kernfs_node", &["id"], shape)?, is_union))
    }

    fn throttle_return(&self) -> ThrottleReturn {
        let funcs = self.funcs("throttle_cfs_rq");
        if funcs.is_empty() {
            return ThrottleReturn::NotInBtf;
        }
        let mut kinds = Vec::new();
        for func in &funcs {
            let kind = match self.return_kind(func) {
                Ok(kind) => kind,
                Err(e) => ThrottleReturn::Unexpected(e.to_string()),
            };
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        match kinds.len() {
            1 => kinds.remove(0),
            _ => ThrottleReturn::Unexpected(format!(
                "{} FUNC throttle_cfs_rq records disagree: {kinds:?}",
                funcs.len()
            )),
        }
    }

    fn return_kind(&self, func: &btf_rs::Func) -> Result<ThrottleReturn, Unresolved> {
        let proto = self
            .btf
            .resolve_chained_type(func)
            .map_err(|e| Unresolved::Corrupt(e.to_string()))?;
        let Type::FuncProto(proto) = proto else {
            return Err(Unresolved::Corrupt(
                "FUNC throttle_cfs_rq does not point to a FUNC_PROTO".into(),
            ));
        };
        let ret = proto.return_type_id();
        if ret == 0 {
            return Ok(ThrottleReturn::Void);
        }
        Ok(match self.strip(ret)? {
            Type::Int(i) if i.is_bool() || matches!(self.name(&i)?.as_str(), "_Bool" | "bool") => {
                ThrottleReturn::Bool
            }
            _ => ThrottleReturn::Unexpected(format!("returns {}", self.describe(ret)?)),
        })
    }

    fn funcs(&self, name: &str) -> Vec<btf_rs::Func> {
        // btf-rs reports "no such name" as an error; that only means "none".
        self.btf
            .resolve_types_by_name(name)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|t| match t {
                Type::Func(f) => Some(f),
                _ => None,
            })
            .collect()
    }

    /// Every full definition (not forward declaration) of `struct name`.
    fn structs(&self, name: &str) -> Result<Vec<Struct>, Unresolved> {
        let structs: Vec<Struct> = self
            .btf
            .resolve_types_by_name(name)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|t| match t {
                Type::Struct(s) => Some(s),
                _ => None,
            })
            .collect();
        if structs.is_empty() {
            return Err(Unresolved::NoType(name.to_string()));
        }
        Ok(structs)
    }

    fn root_size(&self, root: &str) -> Result<u32, Unresolved> {
        let sizes: Vec<usize> = self.structs(root)?.iter().map(Struct::size).collect();
        match sizes.as_slice() {
            [first, rest @ ..] if rest.iter().all(|s| s == first) => u32::try_from(*first)
                .map_err(|_| Unresolved::Corrupt(format!("struct {root} size {first}"))),
            _ => Err(Unresolved::Ambiguous {
                root: root.to_string(),
                path: String::new(),
                count: sizes.len(),
            }),
        }
    }

    /// Finds `root.path…` in every definition of `struct root`; all that have it must agree,
    /// since a deduplicated vmlinux BTF normally has one and two different layouts under one
    /// name leave no way to know which the probed object uses.
    fn path(&self, root: &str, path: &[&str]) -> Result<Found, Unresolved> {
        let mut results: Vec<Found> = Vec::new();
        let structs = self.structs(root)?;
        for s in &structs {
            if let Some(found) = self.descend(s, path)? {
                let differs = results.first().is_some_and(|first| {
                    first.bit_offset != found.bit_offset
                        || first.bitfield_bits != found.bitfield_bits
                        || self.describe(first.type_id).ok() != self.describe(found.type_id).ok()
                });
                if differs {
                    return Err(Unresolved::Ambiguous {
                        root: root.to_string(),
                        path: path.join("."),
                        count: structs.len(),
                    });
                }
                results.push(found);
            }
        }
        results
            .into_iter()
            .next()
            .ok_or_else(|| Unresolved::NoField {
                root: root.to_string(),
                path: path.join("."),
            })
    }

    /// Follows `path` through embedded structs/unions, adding offsets.
    fn descend(&self, s: &Struct, path: &[&str]) -> Result<Option<Found>, Unresolved> {
        let Some((first, rest)) = path.split_first() else {
            return Ok(None);
        };
        let Some(found) = self.member(s, first)? else {
            return Ok(None);
        };
        if rest.is_empty() {
            return Ok(Some(found));
        }
        if found.bitfield_bits != 0 {
            return Ok(None);
        }
        let inner = match self.strip(found.type_id)? {
            Type::Struct(inner) | Type::Union(inner) => inner,
            _ => return Ok(None),
        };
        Ok(self.descend(&inner, rest)?.map(|deeper| Found {
            bit_offset: found.bit_offset + deeper.bit_offset,
            ..deeper
        }))
    }

    /// A member named `name` of `s`, also inside its anonymous structs and unions (C puts
    /// their members in the enclosing scope, so a name appears at most once).
    fn member(&self, s: &Struct, name: &str) -> Result<Option<Found>, Unresolved> {
        for m in &s.members {
            let type_id = m
                .get_type_id()
                .map_err(|e| Unresolved::Corrupt(e.to_string()))?;
            let member_name = self.name(m)?;
            if member_name == name {
                return Ok(Some(Found {
                    bit_offset: m.bit_offset(),
                    bitfield_bits: m.bitfield_size().unwrap_or(0),
                    type_id,
                }));
            }
            if member_name.is_empty()
                && let Type::Struct(inner) | Type::Union(inner) = self.strip(type_id)?
                && let Some(found) = self.member(&inner, name)?
            {
                return Ok(Some(Found {
                    bit_offset: m.bit_offset() + found.bit_offset,
                    ..found
                }));
            }
        }
        Ok(None)
    }

    /// The type behind typedefs and qualifiers (const, volatile, restrict, type tags).
    fn strip(&self, mut id: u32) -> Result<Type, Unresolved> {
        // A bound, so a malformed cycle cannot hang the agent.
        for _ in 0..64 {
            let ty = self
                .btf
                .resolve_type_by_id(id)
                .map_err(|e| Unresolved::Corrupt(e.to_string()))?;
            match &ty {
                Type::Typedef(t) | Type::TypeTag(t) => {
                    id = t
                        .get_type_id()
                        .map_err(|e| Unresolved::Corrupt(e.to_string()))?
                }
                Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => {
                    id = t
                        .get_type_id()
                        .map_err(|e| Unresolved::Corrupt(e.to_string()))?
                }
                _ => return Ok(ty),
            }
        }
        Err(Unresolved::Corrupt(format!("type {id}: chain too long")))
    }

    /// Size in bytes, or None for types without one (void, functions).
    fn size(&self, id: u32) -> Result<Option<u32>, Unresolved> {
        let bytes = match self.strip(id)? {
            Type::Int(t) => t.size(),
            Type::Struct(t) | Type::Union(t) => t.size(),
            Type::Enum(t) => t.size(),
            Type::Enum64(t) => t.size(),
            Type::Float(t) => t.size(),
            Type::Ptr(_) => return Ok(Some(POINTER_BYTES)),
            Type::Array(a) => {
                let elem = a
                    .get_type_id()
                    .map_err(|e| Unresolved::Corrupt(e.to_string()))?;
                let Some(elem) = self.size(elem)? else {
                    return Ok(None);
                };
                return Ok(u32::try_from(a.len())
                    .ok()
                    .and_then(|n| n.checked_mul(elem)));
            }
            _ => return Ok(None),
        };
        Ok(u32::try_from(bytes).ok())
    }

    /// A short human description of a type, for error messages.
    fn describe(&self, id: u32) -> Result<String, Unresolved> {
        let ty = self.strip(id)?;
        let named = |t: &dyn BtfType| self.name(t).unwrap_or_default();
        Ok(match &ty {
            Type::Ptr(p) => match p.get_type_id() {
                Ok(target) => format!("a pointer to {}", self.describe(target)?),
                Err(_) => "a pointer".to_string(),
            },
            Type::Struct(s) => format!("struct {}", named(s)),
            Type::Union(u) => format!("union {}", named(u)),
            Type::Int(i) => format!("{} ({} bytes)", named(i), i.size()),
            other => match self.size(id)? {
                Some(n) => format!("a {} of {n} bytes", other.name()),
                None => format!("a {}", other.name()),
            },
        })
    }

    fn name(&self, t: &(impl BtfType + ?Sized)) -> Result<String, Unresolved> {
        self.btf
            .resolve_name(t)
            .map_err(|e| Unresolved::Corrupt(e.to_string()))
    }
}

/// The 32-bit window that holds `bits` bits starting `bit_offset` bits into a struct of
/// `struct_size` bytes: prefer a 4-byte-aligned window (one aligned load), else start at the
/// field's first byte. None when no window inside the struct holds the whole field.
fn bit_window(bit_offset: u32, bits: u32, struct_size: u32) -> Option<BitField> {
    if bits == 0 || bits > 32 {
        return None;
    }
    let fits = |start_byte: u32| {
        let rel = bit_offset - start_byte * 8;
        (rel + bits <= 32 && start_byte.checked_add(4)? <= struct_size).then_some(rel)
    };
    let aligned = bit_offset / 32 * 4;
    let (start, rel) = match fits(aligned) {
        Some(rel) => (aligned, rel),
        None => {
            let byte = bit_offset / 8;
            (byte, fits(byte)?)
        }
    };
    // BTF counts bits from the first byte's least significant bit on little-endian machines
    // and from its most significant bit on big-endian ones; the agent runs on the kernel's
    // machine, so its own byte order is the kernel's.
    let shift = if cfg!(target_endian = "big") {
        32 - rel - bits
    } else {
        rel
    };
    Some(BitField {
        offset: start,
        shift,
        bits,
    })
}

#[cfg(test)]
mod synthetic;

#[cfg(test)]
mod tests {
    use super::synthetic::{self, Throttle, V5_4, Variant};
    use super::*;
    use tracer_common::ABSENT;

    /// Resolves a synthetic kernel through the same file path the agent uses.
    fn synth(v: Variant) -> Result<Resolved, BtfError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmlinux");
        std::fs::write(&path, synthetic::kernel(v)).unwrap();
        resolve(&path)
    }

    #[test]
    fn old_kernel_layout() {
        let r = synth(V5_4).unwrap();
        let o = r.offsets;
        // `int throttled` at byte 36: the whole 32-bit word.
        assert_eq!(
            o.cfs_rq_throttled,
            BitField {
                offset: 36,
                shift: 0,
                bits: 32
            }
        );
        assert_eq!((o.cfs_rq_rq, o.cfs_rq_tg, o.rq_cpu), (8, 16, 16));
        // `css` at 0 in task_group, `cgroup` at 8 in css; cfs_bandwidth at 16.
        assert_eq!((o.tg_cgroup, o.tg_period, o.tg_quota), (8, 24, 32));
        assert_eq!((o.cgroup_kn, o.kn_id, o.kn_id_is_union), (16, 8, 1));
        assert_eq!(r.nr_tasks_field, Some("h_nr_running"));
        assert_eq!(o.cfs_rq_nr_tasks, 4);
        assert_eq!((o.cfs_rq_throttled_clock, o.rq_clock), (24, 8));
        // `curr` is found inside the anonymous union at 24.
        assert_eq!(o.rq_curr, 24);
        assert_eq!(
            (o.task_pid, o.task_tgid, o.task_comm, o.task_se),
            (4, 8, 40, 16)
        );
        assert_eq!((o.se_parent, o.se_cfs_rq), (0, 8));
        assert_eq!(r.throttle_return, ThrottleReturn::Void);
        assert_eq!(o.throttle_returns_bool, 0);
        assert_eq!(o.tg_burst, ABSENT);
        assert_eq!(
            r.disabled,
            vec![Disabled {
                feature: Feature::Burst,
                reason: "struct task_group has no cfs_bandwidth.burst".into()
            }]
        );
        let off = |f: Feature| !is_on(&r, f);
        assert!(off(Feature::Burst) && !off(Feature::TaskCount));
        assert_eq!(r.functions, vec!["throttle_cfs_rq", "unthrottle_cfs_rq"]);
        assert_eq!(r.nr_queued_field, Some("nr_running"));
        assert_eq!(
            (
                o.cfs_rq_nr_queued,
                o.tg_cfs_rq,
                o.tg_children,
                o.tg_siblings
            ),
            (0, 48, 56, 72)
        );
    }

    /// 6.14 renamed `cfs_rq.nr_running` to `nr_queued`: the new name is found at the same
    /// place, and the feature stays on.
    #[test]
    fn stopped_children_with_nr_queued() {
        let r = synth(Variant {
            nr_queued: true,
            ..V5_4
        })
        .unwrap();
        assert_eq!(r.nr_queued_field, Some("nr_queued"));
        assert_eq!(r.offsets.cfs_rq_nr_queued, 0);
        assert!(is_on(&r, Feature::StoppedChildren));
    }

    /// 7.x: `task_group.cfs_rq` is one per-CPU pointer; the feature stays on and the probe is
    /// told to add the per-CPU offset instead of indexing an array.
    #[test]
    fn stopped_children_with_a_percpu_cfs_rq() {
        let array = synth(V5_4).unwrap();
        assert_eq!(array.offsets.tg_cfs_rq_percpu, 0);
        let r = synth(Variant {
            percpu_cfs_rq: true,
            ..V5_4
        })
        .unwrap();
        assert_eq!((r.offsets.tg_cfs_rq, r.offsets.tg_cfs_rq_percpu), (48, 1));
        assert!(is_on(&r, Feature::StoppedChildren));
    }

    fn is_on(r: &Resolved, feature: Feature) -> bool {
        !r.disabled.iter().any(|d| d.feature == feature)
    }

    /// Without `task_group.children` the whole feature is off, with a warning naming the
    /// missing fields, and no half of it is handed to the probe.
    #[test]
    fn stopped_children_is_all_or_nothing() {
        let r = synth(Variant {
            with_children: false,
            ..V5_4
        })
        .unwrap();
        let o = r.offsets;
        for v in [
            o.cfs_rq_nr_queued,
            o.tg_cfs_rq,
            o.tg_children,
            o.tg_siblings,
        ] {
            assert_eq!(v, ABSENT);
        }
        let d = r
            .disabled
            .iter()
            .find(|d| d.feature == Feature::StoppedChildren)
            .expect("stopped children disabled");
        assert_eq!(
            d.reason,
            "struct task_group has no cfs_rq; struct task_group has no children; \
             struct task_group has no siblings"
        );
    }

    #[test]
    fn bool_bitfield_and_bool_return() {
        let r = synth(Variant {
            throttled_bitfield_at: Some(36 * 8 + 1),
            with_burst: true,
            throttle: Throttle::Bool,
            ..V5_4
        })
        .unwrap();
        let expected = if cfg!(target_endian = "little") {
            1
        } else {
            30
        };
        assert_eq!(
            r.offsets.cfs_rq_throttled,
            BitField {
                offset: 36,
                shift: expected,
                bits: 1
            }
        );
        assert_eq!(r.throttle_return, ThrottleReturn::Bool);
        assert_eq!(r.offsets.throttle_returns_bool, 1);
        assert_eq!(r.offsets.tg_burst, 40);
        assert!(r.disabled.is_empty(), "{:?}", r.disabled);
    }

    #[test]
    fn missing_required_field_is_an_error() {
        let err = synth(Variant {
            with_cgroup_kn: false,
            ..V5_4
        })
        .unwrap_err();
        match &err {
            BtfError::Required { field, reason } => {
                assert_eq!(*field, "cgroup_kn");
                assert_eq!(
                    *reason,
                    Unresolved::NoField {
                        root: "cgroup".into(),
                        path: "kn".into()
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("struct cgroup has no kn"), "{err}");
    }

    #[test]
    fn changed_shape_is_not_read() {
        let err = synth(Variant {
            rq_as_integer: true,
            ..V5_4
        })
        .unwrap_err();
        assert!(
            matches!(
                err,
                BtfError::Required {
                    field: "cfs_rq_rq",
                    reason: Unresolved::WrongShape { .. }
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn running_task_is_all_or_nothing() {
        let r = synth(Variant {
            with_task_se: false,
            ..V5_4
        })
        .unwrap();
        let o = r.offsets;
        for v in [
            o.rq_curr,
            o.task_pid,
            o.task_tgid,
            o.task_comm,
            o.task_se,
            o.se_cfs_rq,
            o.se_parent,
        ] {
            assert_eq!(v, ABSENT);
        }
        let d = r
            .disabled
            .iter()
            .find(|d| d.feature == Feature::RunningTask)
            .expect("running task disabled");
        assert_eq!(d.reason, "struct task_struct has no se");
        assert_eq!(
            d.to_string(),
            "running task pid/comm: struct task_struct has no se"
        );
    }

    #[test]
    fn throttle_not_in_btf() {
        let r = synth(Variant {
            throttle: Throttle::Absent,
            ..V5_4
        })
        .unwrap();
        assert_eq!(r.throttle_return, ThrottleReturn::NotInBtf);
        assert_eq!(r.offsets.throttle_returns_bool, 1);
        assert_eq!(r.functions, vec!["unthrottle_cfs_rq"]);
    }

    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

    fn host() -> Option<Resolved> {
        if !Path::new(VMLINUX).exists() {
            println!("skipped: {VMLINUX} is absent (kernel without CONFIG_DEBUG_INFO_BTF)");
            return None;
        }
        Some(resolve(Path::new(VMLINUX)).expect("host BTF resolves"))
    }

    /// Writes `value` into `mem` the way the compiler lays out a bit field at `bit_offset`
    /// (little-endian bit numbering, as BTF describes it on x86-64 and arm64).
    fn store_bits(mem: &mut [u8], bit_offset: u32, bits: u32, value: u64) {
        for i in 0..bits {
            let bit = bit_offset + i;
            let byte = (bit / 8) as usize;
            let mask = 1u8 << (bit % 8);
            if value >> i & 1 == 1 {
                mem[byte] |= mask;
            } else {
                mem[byte] &= !mask;
            }
        }
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn window_extracts_int_and_bit_fields() {
        // (bit offset, width, value): a plain int, 1-bit flags at several positions (the
        // 6.18 layout has `throttled` at 3328 and a neighbour at 3329), a field that would
        // straddle an aligned window, and a bool-sized int.
        let cases = [
            (3328, 32, 0xdead_beef_u64),
            (3328, 32, 1),
            (3328, 1, 1),
            (3329, 1, 1),
            (3335, 1, 1),
            (3336, 1, 1),
            (3359, 1, 1),
            (3358, 4, 0b1011),
            (3357, 20, 0xabcde),
            (3336, 8, 0x5a),
        ];
        for (bit_offset, bits, value) in cases {
            // Surround the field with ones so a wrong shift or mask shows up.
            let mut mem = vec![0xffu8; 512];
            store_bits(&mut mem, bit_offset, bits, value);
            let w = bit_window(bit_offset, bits, 512).expect("a window exists");
            assert!(w.offset * 8 <= bit_offset, "window starts after the field");
            assert!(w.shift + w.bits <= 32);
            let at = w.offset as usize;
            let window = u32::from_le_bytes(mem[at..at + 4].try_into().unwrap());
            assert_eq!(
                u64::from(w.extract(window)),
                value,
                "field at bit {bit_offset}, {bits} bits: window {w:?}"
            );
            // And zero reads as zero with all neighbours set.
            store_bits(&mut mem, bit_offset, bits, 0);
            let window = u32::from_le_bytes(mem[at..at + 4].try_into().unwrap());
            assert_eq!(w.extract(window), 0, "zeroed field at {bit_offset}: {w:?}");
        }
    }

    #[test]
    fn window_positions() {
        // 6.18 `bool throttled:1` at bit 3328: byte 416, bit 0.
        let w = bit_window(3328, 1, 512).unwrap();
        assert_eq!((w.offset, w.bits), (416, 1));
        // An aligned window is preferred even when the field starts mid-word.
        let w = bit_window(3329 + 8, 1, 512).unwrap();
        assert_eq!(w.offset, 416);
        // A field crossing an aligned 32-bit boundary falls back to its first byte.
        let w = bit_window(3358, 4, 512).unwrap();
        assert_eq!(w.offset, 3358 / 8);
        // A plain int: the whole window, shift 0.
        let w = bit_window(100 * 8, 32, 512).unwrap();
        assert_eq!((w.offset, w.bits), (100, 32));
        if cfg!(target_endian = "little") {
            assert_eq!(w.shift, 0);
        }
        // No window: too wide, or would read past the struct.
        assert_eq!(bit_window(0, 33, 512), None);
        assert_eq!(bit_window(0, 0, 512), None);
        assert_eq!(bit_window(509 * 8, 8, 510), None);
        assert_eq!(bit_window(3357, 29, 512), None);
    }

    #[test]
    fn missing_file_says_btf_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmlinux");
        let err = resolve(&path).unwrap_err();
        assert!(matches!(err, BtfError::Missing { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("BTF is missing"), "{msg}");
        assert!(msg.contains("CONFIG_DEBUG_INFO_BTF"), "{msg}");
    }

    #[test]
    fn garbage_is_a_parse_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmlinux");
        std::fs::write(&path, b"not BTF at all, just some bytes").unwrap();
        let err = resolve(&path).unwrap_err();
        assert!(matches!(err, BtfError::Parse { .. }), "{err:?}");
    }

    /// Expected values come from `bpftool btf dump file /sys/kernel/btf/vmlinux` and
    /// `pahole -C <struct> /sys/kernel/btf/vmlinux` (Debian bpftool 7.1.0, dwarves 1.24) on the
    /// 6.18.44 host, independently of btf-rs: cfs_rq `'throttled' type_id=70 bits_offset=3328
    /// bitfield_size=1` (docs/kernel.md §6 says the same), pahole `bool throttled:1; /* 416: 0 1 */`.
    #[test]
    fn host_6_18_layout() {
        let Some(r) = host() else { return };
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        println!("kernel {}", release.trim());
        println!("{:#?}", r.offsets);
        println!("disabled: {:?}", r.disabled);
        println!("throttle_cfs_rq returns: {:?}", r.throttle_return);
        println!("nr_tasks field: {:?}", r.nr_tasks_field);
        println!("functions in BTF: {:?}", r.functions);
        if !release.starts_with("6.18.") {
            println!(
                "skipped: layout checks are for 6.18.x, this is {}",
                release.trim()
            );
            return;
        }
        let o = r.offsets;
        assert_eq!(
            o.cfs_rq_throttled,
            BitField {
                offset: 3328 / 32 * 4,
                shift: 3328 % 32,
                bits: 1
            }
        );
        assert_eq!(r.nr_tasks_field, Some("h_nr_queued"));
        assert_eq!(r.throttle_return, ThrottleReturn::Bool);
        assert_eq!(o.throttle_returns_bool, 1);
        assert_eq!(o.kn_id_is_union, 0);
        assert!(r.disabled.is_empty(), "{:?}", r.disabled);
        for (name, v) in [
            ("cfs_rq_rq", o.cfs_rq_rq),
            ("cfs_rq_tg", o.cfs_rq_tg),
            ("rq_cpu", o.rq_cpu),
            ("tg_cgroup", o.tg_cgroup),
            ("cgroup_kn", o.cgroup_kn),
            ("kn_id", o.kn_id),
            ("tg_burst", o.tg_burst),
        ] {
            assert_ne!(v, ABSENT, "{name}");
        }
        assert!(
            r.functions.contains(&"throttle_cfs_rq") && r.functions.contains(&"unthrottle_cfs_rq")
        );
    }

    /// Expected values from `pahole -C task_group /sys/kernel/btf/vmlinux` and `pahole -C
    /// cfs_rq` on the 6.18.44 host (dwarves 1.24), independently of btf-rs: task_group
    /// `struct cfs_rq * * cfs_rq; /* 224 8 */`, `siblings; /* 416 16 */`, `children;
    /// /* 432 16 */`; cfs_rq `unsigned int nr_queued; /* 16 4 */`.
    #[test]
    fn host_6_18_children_layout() {
        let Some(r) = host() else { return };
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if !release.starts_with("6.18.") {
            println!(
                "skipped: layout checks are for 6.18.x, this is {}",
                release.trim()
            );
            return;
        }
        let o = r.offsets;
        assert_eq!(r.nr_queued_field, Some("nr_queued"));
        assert_eq!(
            (
                o.tg_cfs_rq,
                o.tg_siblings,
                o.tg_children,
                o.cfs_rq_nr_queued
            ),
            (224, 416, 432, 16)
        );
        // `cfs_rq` is a pointer to pointers: neither a pointer to the struct nor an int.
        let k = Kernel {
            btf: Btf::from_file(VMLINUX).unwrap(),
        };
        assert!(matches!(
            k.offset("task_group", &["cfs_rq"], Shape::Ptr("cfs_rq")),
            Err(Unresolved::WrongShape { .. })
        ));
        assert!(matches!(
            k.offset("task_group", &["children"], Shape::PtrPtr("cfs_rq")),
            Err(Unresolved::WrongShape { .. })
        ));
    }

    /// 6.18 has no `h_nr_running` (renamed in 6.14): resolving it must fail, not fall back.
    #[test]
    fn host_has_no_h_nr_running() {
        if !Path::new(VMLINUX).exists() {
            println!("skipped: {VMLINUX} is absent");
            return;
        }
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if !release.starts_with("6.18.") {
            println!("skipped: not a 6.18 kernel");
            return;
        }
        let k = Kernel {
            btf: Btf::from_file(VMLINUX).unwrap(),
        };
        assert_eq!(
            k.offset("cfs_rq", &["h_nr_running"], Shape::Int(4)),
            Err(Unresolved::NoField {
                root: "cfs_rq".into(),
                path: "h_nr_running".into()
            })
        );
        assert!(k.offset("cfs_rq", &["h_nr_queued"], Shape::Int(4)).is_ok());
        // Shape checks bite: `rq` is a pointer, not an int; `curr` sits in an anonymous union.
        assert!(matches!(
            k.offset("cfs_rq", &["rq"], Shape::Int(8)),
            Err(Unresolved::WrongShape { .. })
        ));
        assert!(matches!(
            k.offset("cfs_rq", &["throttled"], Shape::Int(4)),
            Err(Unresolved::WrongShape { .. })
        ));
        assert!(k.offset("rq", &["curr"], Shape::Ptr("task_struct")).is_ok());
        assert_eq!(
            k.offset("no_such_struct_here", &["x"], Shape::Int(4)),
            Err(Unresolved::NoType("no_such_struct_here".into()))
        );
    }

    /// A kernel without the tracepoint backend's structs (the synthetic 5.4 has none of them):
    /// every such offset is ABSENT, and nothing is reported as disabled for it, since only
    /// that backend needs them and it names what is missing itself.
    #[test]
    fn tracepoint_fields_absent_without_noise() {
        let r = synth(V5_4).unwrap();
        let o = r.offsets;
        for v in [
            o.cfs_rq_runtime_enabled,
            o.cfs_rq_throttle_count,
            o.cfs_rq_throttled_list,
            o.cfs_rq_throttled_csd_list,
            o.cfs_rq_throttled_clock_self,
            o.cfs_rq_throttled_clock_self_time,
            o.cfsb_period_timer,
            o.cfsb_slack_timer,
            o.cfsb_throttled_cfs_rq,
            o.hrtimer_function,
            o.rq_cfsb_csd,
            o.rq_cfsb_csd_list,
            o.csd_func,
        ] {
            assert_eq!(v, ABSENT);
        }
        assert_eq!(o.task_throttled, BitField::ABSENT);
        let tp = |f: Feature| !is_on(&r, f);
        assert!(!tp(Feature::Tracepoint) && !tp(Feature::SelfTime));
        assert!(!tp(Feature::AsyncUnthrottle) && !tp(Feature::ParkedTasks));
        // Absent, not off: the doctor says "not in this kernel".
        assert!(!Feature::SelfTime.in_kernel(&o) && !Feature::ParkedTasks.in_kernel(&o));
        assert!(Feature::KernelDuration.in_kernel(&o) && Feature::Bandwidth.in_kernel(&o));
    }

    /// Expected values from `pahole -C cfs_rq|cfs_bandwidth|rq|hrtimer|__call_single_data|
    /// task_struct /sys/kernel/btf/vmlinux` on the 6.18.44 host (dwarves 1.24), independently of
    /// btf-rs: cfs_rq runtime_enabled 356, throttled_clock_self 400, throttled_clock_self_time
    /// 408, throttle_count 420, throttled_list 424, throttled_csd_list 440; cfs_bandwidth
    /// period_timer 64, slack_timer 128, throttled_cfs_rq 192; hrtimer function 40; rq cfsb_csd
    /// 3488, cfsb_csd_list 3520; __call_single_data func 16; task_struct `bool throttled` 752.
    #[test]
    fn host_6_18_tracepoint_layout() {
        let Some(r) = host() else { return };
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if !release.starts_with("6.18.") {
            println!(
                "skipped: layout checks are for 6.18.x, this is {}",
                release.trim()
            );
            return;
        }
        let o = r.offsets;
        assert_eq!(
            (
                o.cfs_rq_runtime_enabled,
                o.cfs_rq_throttled_clock_self,
                o.cfs_rq_throttled_clock_self_time,
                o.cfs_rq_throttle_count,
                o.cfs_rq_throttled_list,
                o.cfs_rq_throttled_csd_list
            ),
            (356, 400, 408, 420, 424, 440)
        );
        assert_eq!(
            (
                o.cfsb_period_timer,
                o.cfsb_slack_timer,
                o.cfsb_throttled_cfs_rq
            ),
            (64, 128, 192)
        );
        assert_eq!(o.hrtimer_function, 40);
        assert_eq!(
            (o.rq_cfsb_csd, o.rq_cfsb_csd_list, o.csd_func),
            (3488, 3520, 16)
        );
        // A plain bool (not a bit field): the aligned 32-bit window at 752, low byte.
        assert_eq!(
            o.task_throttled,
            BitField {
                offset: 752,
                shift: if cfg!(target_endian = "little") {
                    0
                } else {
                    24
                },
                bits: 8
            }
        );
        // The hrtimer callback is a function pointer; an int at the same place is refused.
        let k = Kernel {
            btf: Btf::from_file(VMLINUX).unwrap(),
        };
        assert!(matches!(
            k.offset("hrtimer", &["function"], Shape::Int(8)),
            Err(Unresolved::WrongShape { .. })
        ));
        assert!(matches!(
            k.offset("cfs_rq", &["runtime_enabled"], Shape::FuncPtr),
            Err(Unresolved::WrongShape { .. })
        ));
    }
}
