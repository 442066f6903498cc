//! Resolves, from the running kernel's BTF, every kernel struct offset the probes read into
//! [`tracer_common::Offsets`], as libbpf's CO-RE would at load time (docs/kernel.md, "6. Fields, by
//! kernel"). It never guesses: a field not resolved exactly is `ABSENT`, an error if required, else
//! its feature is off with the reason in [`Resolved::disabled`]. Every field is one entry of
//! [`TABLE`], with its names across kernel versions; [`walk`] does the BTF reading.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use tracer_common::{BitField, Offsets};

mod raw;
mod walk;

pub use walk::Unresolved;
use walk::{Kernel, Returns, Shape};

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
    /// `task_group.se` (7.x: `cfs_tg_state.se` and the per-CPU `task_group.cfs_rq`) /
    /// `sched_entity.sum_exec_runtime` and the bandwidth's place in its group: the per-period
    /// CPU demand.
    Demand,
    /// `cfs_bandwidth.runtime_snap` (5.16+): the burst each period spent.
    BurstSpent,
    /// `task_struct.on_rq` (and 6.12+'s `sched_entity.sched_delayed`): which tasks a stop
    /// holds, as the tracepoint backend sees them switched out before 6.18.
    HeldThreads,
    /// The runqueue's tree of queued entities (`cfs_rq.tasks_timeline`, `sched_entity.run_node`
    /// and `.my_q`, `rb_node`'s children, `cfs_rq.curr`): the threads queued at a throttle,
    /// which the kprobe and fentry backends list beside the running one.
    QueuedThreads,
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
            Feature::Demand => "per-period CPU demand",
            Feature::BurstSpent => "burst spent per period",
            Feature::HeldThreads => "threads held by a stop",
            Feature::QueuedThreads => "threads queued at a throttle",
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
            Feature::Demand => return o.has_entities(),
            Feature::BurstSpent => o.cfsb_runtime_snap,
            Feature::HeldThreads => o.task_on_rq.offset,
            Feature::QueuedThreads => o.se_run_node,
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
    let parsed = raw::Btf::parse(&bytes).map_err(|e| BtfError::Parse {
        path: btf.to_path_buf(),
        source: e.into(),
    })?;
    resolve_parsed(&Kernel::new(parsed))
}

fn resolve_parsed(k: &Kernel) -> Result<Resolved, BtfError> {
    let mut o = Offsets::ABSENT;
    let mut disabled = Vec::new();
    // Which name each field was found under, for the renamed ones' reports.
    let mut members = Vec::new();
    for group in TABLE {
        disabled.extend(group.resolve(k, &mut o, &mut members)?);
    }
    let member_of = |name: &str| {
        members
            .iter()
            .find(|(field, _)| *field == name)
            .map(|&(_, member)| member)
    };

    let throttle_return = throttle_return(k);
    o.throttle_returns_bool = match throttle_return {
        ThrottleReturn::Void => 0,
        // Keep the default for the unknown cases; `throttle_return` tells the caller.
        _ => Offsets::ABSENT.throttle_returns_bool,
    };

    Ok(Resolved {
        offsets: o,
        disabled,
        throttle_return,
        nr_tasks_field: member_of("cfs_rq_nr_tasks"),
        nr_queued_field: member_of("cfs_rq_nr_queued"),
        functions: PROBE_FUNCTIONS
            .iter()
            .copied()
            .filter(|name| k.has_func(name))
            .collect(),
    })
}

fn throttle_return(k: &Kernel) -> ThrottleReturn {
    let records = k.returns("throttle_cfs_rq");
    if records.is_empty() {
        return ThrottleReturn::NotInBtf;
    }
    let mut kinds = Vec::new();
    for record in &records {
        let kind = match record {
            Ok(Returns::Void) => ThrottleReturn::Void,
            Ok(Returns::Bool) => ThrottleReturn::Bool,
            Ok(Returns::Other(ty)) => ThrottleReturn::Unexpected(format!("returns {ty}")),
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
            records.len()
        )),
    }
}

/// Where a resolved offset goes in [`Offsets`].
type Slot = fn(&mut Offsets) -> &mut u32;

/// One [`Offsets`] field and where the kernel keeps it.
struct Field {
    /// The `Offsets` field, as errors name it.
    name: &'static str,
    root: &'static str,
    /// The member's name (dotted through embedded structs) on current kernels.
    member: &'static str,
    /// Its earlier names, newest first.
    formerly: &'static [&'static str],
    read: Read,
}

/// How the probe reads a field, hence what BTF must show there.
#[derive(Clone, Copy)]
enum Read {
    /// A byte offset to a member of this shape.
    At(Shape, Slot),
    /// A byte offset to a member of one of two shapes that no kernel has both of: the usual
    /// one, or the other, which also sets `marks` to 1 so the probe reads it the other way.
    Either {
        usual: Shape,
        other: Shape,
        at: Slot,
        marks: Slot,
    },
    /// A flag read as "non-zero": an integer or a bit field, through a 32-bit window.
    Flag(fn(&mut Offsets) -> &mut BitField),
}

/// What a missing field costs.
#[derive(Clone, Copy)]
enum Need {
    /// The tracer cannot run: an error.
    Required,
    /// The feature is off, with the reason.
    AllOf(Feature),
    /// Fields of newer kernels, or read only by some programs (the tracepoint backend's, the
    /// demand's): their absence is the kernel's age, not a defect, and what needs them says so
    /// when asked for, so only a field that exists with another shape turns the feature off.
    Newer(Feature),
}

/// Fields that are handed to the probe all together or not at all, so it never sees half a
/// feature.
struct Group {
    need: Need,
    fields: &'static [Field],
}

/// `at!(slot, root, member | older_name…, shape)`: `Offsets::slot` is the byte offset of
/// `root.member`, checked against `shape`.
macro_rules! at {
    ($slot:ident, $root:literal, $member:literal $(| $old:literal)*, $shape:expr) => {
        Field {
            name: stringify!($slot),
            root: $root,
            member: $member,
            formerly: &[$($old),*],
            read: Read::At($shape, |o| &mut o.$slot),
        }
    };
}

/// `either!(slot, root, member, usual, other => marks)`: as `at!`, with a second shape
/// that sets `Offsets::marks`.
macro_rules! either {
    ($slot:ident, $root:literal, $member:literal, $usual:expr, $other:expr => $marks:ident) => {
        Field {
            name: stringify!($slot),
            root: $root,
            member: $member,
            formerly: &[],
            read: Read::Either {
                usual: $usual,
                other: $other,
                at: |o| &mut o.$slot,
                marks: |o| &mut o.$marks,
            },
        }
    };
}

/// `flag!(slot, root, member)`: `Offsets::slot` is the window of the flag `root.member`.
macro_rules! flag {
    ($slot:ident, $root:literal, $member:literal) => {
        Field {
            name: stringify!($slot),
            root: $root,
            member: $member,
            formerly: &[],
            read: Read::Flag(|o| &mut o.$slot),
        }
    };
}

// The walk from a task up its groups: part of RunningTask and of the tracepoint backend.
const TASK_SE: Field = at!(task_se, "task_struct", "se", Shape::Struct("sched_entity"));
const SE_CFS_RQ: Field = at!(se_cfs_rq, "sched_entity", "cfs_rq", Shape::Ptr("cfs_rq"));
const SE_PARENT: Field = at!(
    se_parent,
    "sched_entity",
    "parent",
    Shape::Ptr("sched_entity")
);

// A group's bandwidth and its period timer: part of the tracepoint backend and of Demand.
const TG_CFS_BANDWIDTH: Field = at!(
    tg_cfs_bandwidth,
    "task_group",
    "cfs_bandwidth",
    Shape::Struct("cfs_bandwidth")
);
const CFSB_PERIOD_TIMER: Field = at!(
    cfsb_period_timer,
    "cfs_bandwidth",
    "period_timer",
    Shape::Struct("hrtimer")
);

// A group's cfs_rqs: part of StoppedChildren and of Demand on 7.x. 7.x allocates them per
// CPU: `struct cfs_rq __percpu *cfs_rq` replaced the array of pointers (BTF may not keep the
// `__percpu` tag, and no other kernel has a single `struct cfs_rq *` there).
const TG_CFS_RQ: Field = either!(
    tg_cfs_rq,
    "task_group",
    "cfs_rq",
    Shape::PtrPtr("cfs_rq"),
    Shape::Ptr("cfs_rq") => tg_cfs_rq_percpu
);
// What Demand reads of each entity and of the pool, wherever the entities are.
const SE_SUM_EXEC_RUNTIME: Field = at!(
    se_sum_exec_runtime,
    "sched_entity",
    "sum_exec_runtime",
    Shape::Int(8)
);
const CFSB_RUNTIME: Field = at!(cfsb_runtime, "cfs_bandwidth", "runtime", Shape::Int(8));

/// Every kernel field the probes read. Groups are resolved in this order, which is the order
/// of [`Resolved::disabled`]; the first missing required field is the error.
const TABLE: &[Group] = &[
    // Without these no stop can be attributed to a CPU and a cgroup.
    Group {
        need: Need::Required,
        fields: &[
            at!(cfs_rq_rq, "cfs_rq", "rq", Shape::Ptr("rq")),
            at!(cfs_rq_tg, "cfs_rq", "tg", Shape::Ptr("task_group")),
            // `int throttled` before 6.18, `bool throttled:1` since.
            flag!(cfs_rq_throttled, "cfs_rq", "throttled"),
            at!(rq_cpu, "rq", "cpu", Shape::Int(4)),
            at!(tg_cgroup, "task_group", "css.cgroup", Shape::Ptr("cgroup")),
            at!(cgroup_kn, "cgroup", "kn", Shape::Ptr("kernfs_node")),
            // `u64` since 5.5, `union kernfs_node_id` on 5.4 (the inode in its low half). Only
            // the union's size is checked: its layout was fixed for its whole life.
            either!(kn_id, "kernfs_node", "id", Shape::Int(8), Shape::Union(8) => kn_id_is_union),
        ],
    },
    Group {
        need: Need::AllOf(Feature::KernelDuration),
        fields: &[
            at!(
                cfs_rq_throttled_clock,
                "cfs_rq",
                "throttled_clock",
                Shape::Int(8)
            ),
            at!(rq_clock, "rq", "clock", Shape::Int(8)),
        ],
    },
    Group {
        need: Need::AllOf(Feature::TaskCount),
        // 6.14 renamed h_nr_running to h_nr_queued (6.12.37+ has the rename backported, next
        // to the new h_nr_runnable). A kernel has one of the two names.
        fields: &[at!(
            cfs_rq_nr_tasks,
            "cfs_rq",
            "h_nr_queued" | "h_nr_running",
            Shape::Int(4)
        )],
    },
    Group {
        need: Need::AllOf(Feature::StoppedChildren),
        fields: &[
            // 6.14 renamed nr_running to nr_queued (the entities queued on this cfs_rq).
            at!(
                cfs_rq_nr_queued,
                "cfs_rq",
                "nr_queued" | "nr_running",
                Shape::Int(4)
            ),
            TG_CFS_RQ,
            at!(
                tg_children,
                "task_group",
                "children",
                Shape::Struct("list_head")
            ),
            at!(
                tg_siblings,
                "task_group",
                "siblings",
                Shape::Struct("list_head")
            ),
        ],
    },
    Group {
        need: Need::AllOf(Feature::Bandwidth),
        fields: &[
            at!(
                tg_period,
                "task_group",
                "cfs_bandwidth.period",
                Shape::Int(8)
            ),
            at!(tg_quota, "task_group", "cfs_bandwidth.quota", Shape::Int(8)),
        ],
    },
    Group {
        need: Need::AllOf(Feature::Burst),
        // 5.14+.
        fields: &[at!(
            tg_burst,
            "task_group",
            "cfs_bandwidth.burst",
            Shape::Int(8)
        )],
    },
    Group {
        need: Need::AllOf(Feature::RunningTask),
        fields: &[
            at!(rq_curr, "rq", "curr", Shape::Ptr("task_struct")),
            at!(task_pid, "task_struct", "pid", Shape::Int(4)),
            at!(task_tgid, "task_struct", "tgid", Shape::Int(4)),
            at!(task_comm, "task_struct", "comm", Shape::Bytes(16)),
            TASK_SE,
            SE_CFS_RQ,
            SE_PARENT,
        ],
    },
    Group {
        need: Need::AllOf(Feature::QueuedThreads),
        // The kprobe and fentry backends' walk of the stopped runqueue's tree at the throttle
        // (tracer-ebpf/src/queued.rs). Every kernel since 4.14 has them (`rb_root_cached`).
        fields: &[
            at!(
                cfs_rq_tasks_root,
                "cfs_rq",
                "tasks_timeline.rb_root.rb_node",
                Shape::Ptr("rb_node")
            ),
            at!(cfs_rq_curr, "cfs_rq", "curr", Shape::Ptr("sched_entity")),
            at!(
                se_run_node,
                "sched_entity",
                "run_node",
                Shape::Struct("rb_node")
            ),
            at!(se_my_q, "sched_entity", "my_q", Shape::Ptr("cfs_rq")),
            at!(rb_left, "rb_node", "rb_left", Shape::Ptr("rb_node")),
            at!(rb_right, "rb_node", "rb_right", Shape::Ptr("rb_node")),
            TASK_SE,
        ],
    },
    Group {
        need: Need::Newer(Feature::Tracepoint),
        fields: &[
            at!(
                cfs_rq_runtime_enabled,
                "cfs_rq",
                "runtime_enabled",
                Shape::Int(4)
            ),
            at!(
                cfs_rq_throttle_count,
                "cfs_rq",
                "throttle_count",
                Shape::Int(4)
            ),
            at!(
                cfs_rq_throttled_list,
                "cfs_rq",
                "throttled_list",
                Shape::Struct("list_head")
            ),
            CFSB_PERIOD_TIMER,
            at!(
                cfsb_slack_timer,
                "cfs_bandwidth",
                "slack_timer",
                Shape::Struct("hrtimer")
            ),
            at!(
                cfsb_throttled_cfs_rq,
                "cfs_bandwidth",
                "throttled_cfs_rq",
                Shape::Struct("list_head")
            ),
            at!(hrtimer_function, "hrtimer", "function", Shape::FuncPtr),
            // Where the programs learn the timers' callbacks (tracer-ebpf/.../config.rs).
            TG_CFS_BANDWIDTH,
            TASK_SE,
            SE_CFS_RQ,
            SE_PARENT,
        ],
    },
    Group {
        need: Need::Newer(Feature::SelfTime),
        // 6.6+.
        fields: &[
            at!(
                cfs_rq_throttled_clock_self,
                "cfs_rq",
                "throttled_clock_self",
                Shape::Int(8)
            ),
            at!(
                cfs_rq_throttled_clock_self_time,
                "cfs_rq",
                "throttled_clock_self_time",
                Shape::Int(8)
            ),
        ],
    },
    Group {
        need: Need::Newer(Feature::AsyncUnthrottle),
        // 6.2+.
        fields: &[
            at!(
                rq_cfsb_csd,
                "rq",
                "cfsb_csd",
                Shape::Struct("__call_single_data")
            ),
            at!(
                rq_cfsb_csd_list,
                "rq",
                "cfsb_csd_list",
                Shape::Struct("list_head")
            ),
            at!(
                cfs_rq_throttled_csd_list,
                "cfs_rq",
                "throttled_csd_list",
                Shape::Struct("list_head")
            ),
            at!(
                cfs_rq_runtime_remaining,
                "cfs_rq",
                "runtime_remaining",
                Shape::Int(8)
            ),
            at!(csd_func, "__call_single_data", "func", Shape::FuncPtr),
        ],
    },
    Group {
        need: Need::Newer(Feature::ParkedTasks),
        // 6.18: a task parked by the task-based throttle.
        fields: &[flag!(task_throttled, "task_struct", "throttled")],
    },
    Group {
        need: Need::Newer(Feature::HeldThreads),
        fields: &[flag!(task_on_rq, "task_struct", "on_rq")],
    },
    Group {
        need: Need::Newer(Feature::HeldThreads),
        // 6.12+: EEVDF's delayed dequeue leaves a sleeping task on_rq.
        fields: &[flag!(se_sched_delayed, "sched_entity", "sched_delayed")],
    },
    Group {
        need: Need::Newer(Feature::Demand),
        // Read at each expiry of a group's period timer: its group entity on every CPU, from
        // the array `task_group.se` (up to 6.x)...
        fields: &[
            TG_CFS_BANDWIDTH,
            at!(tg_se, "task_group", "se", Shape::PtrPtr("sched_entity")),
            SE_SUM_EXEC_RUNTIME,
            CFSB_RUNTIME,
            CFSB_PERIOD_TIMER,
        ],
    },
    Group {
        need: Need::Newer(Feature::Demand),
        // ...or (7.x) beside the group's cfs_rq in each CPU's `cfs_tg_state`, at the group's
        // per-CPU `cfs_rq` pointer plus the CPU's per-CPU offset, which the program learns from
        // the current task's cfs_rq (tracer-ebpf/src/demand.rs).
        fields: &[
            TG_CFS_BANDWIDTH,
            TG_CFS_RQ,
            at!(
                tg_state_cfs_rq,
                "cfs_tg_state",
                "cfs_rq",
                Shape::Struct("cfs_rq")
            ),
            at!(
                tg_state_se,
                "cfs_tg_state",
                "se",
                Shape::Struct("sched_entity")
            ),
            SE_SUM_EXEC_RUNTIME,
            CFSB_RUNTIME,
            CFSB_PERIOD_TIMER,
            TASK_SE,
            SE_CFS_RQ,
        ],
    },
    Group {
        need: Need::Newer(Feature::BurstSpent),
        // 5.16+, with cpu.stat's nr_bursts and burst_time.
        fields: &[at!(
            cfsb_runtime_snap,
            "cfs_bandwidth",
            "runtime_snap",
            Shape::Int(8)
        )],
    },
];

impl Group {
    /// Hands the group's fields to `o` when all of them resolve; otherwise says what that
    /// costs: an error for a required group, else the feature turned off (or, for fields only
    /// newer kernels have, nothing when they are simply absent).
    fn resolve(
        &self,
        k: &Kernel,
        o: &mut Offsets,
        members: &mut Vec<(&'static str, &'static str)>,
    ) -> Result<Option<Disabled>, BtfError> {
        let mut stores = Vec::new();
        let mut missing = Vec::new();
        for field in self.fields {
            match field.find(k) {
                Ok(found) => {
                    // What a field's layout says (its name, which of two shapes) is kept even
                    // when the group is not handed to the probe.
                    members.push((field.name, found.member));
                    if let Some(marks) = found.marks {
                        *marks(o) = 1;
                    }
                    stores.push(found.store);
                }
                Err(why) => missing.push((field.name, why)),
            }
        }
        if missing.is_empty() {
            for store in stores {
                store.apply(o);
            }
            return Ok(None);
        }
        let (feature, newer) = match self.need {
            Need::Required => {
                let (field, reason) = missing.remove(0);
                return Err(BtfError::Required { field, reason });
            }
            Need::AllOf(feature) => (feature, false),
            Need::Newer(feature) => (feature, true),
        };
        let reasons: Vec<String> = missing
            .iter()
            .map(|(_, why)| why)
            .filter(|why| {
                !(newer && matches!(why, Unresolved::NoField { .. } | Unresolved::NoType(_)))
            })
            .map(ToString::to_string)
            .collect();
        Ok((!reasons.is_empty()).then(|| Disabled {
            feature,
            reason: reasons.join("; "),
        }))
    }
}

/// A field found in this kernel's BTF.
struct Found {
    /// The name it was found under.
    member: &'static str,
    store: Store,
    /// Set to 1 when the member has its other shape.
    marks: Option<Slot>,
}

enum Store {
    Offset(Slot, u32),
    Flag(fn(&mut Offsets) -> &mut BitField, BitField),
}

impl Store {
    fn apply(self, o: &mut Offsets) {
        match self {
            Store::Offset(slot, at) => *slot(o) = at,
            Store::Flag(slot, window) => *slot(o) = window,
        }
    }
}

impl Field {
    /// Looks the field up under each of its names, newest first; when none resolves, says why
    /// for each.
    fn find(&self, k: &Kernel) -> Result<Found, Unresolved> {
        let mut why = match self.find_as(k, self.member) {
            Ok(found) => return Ok(found),
            Err(e) => e,
        };
        for &old in self.formerly {
            match self.find_as(k, old) {
                Ok(found) => return Ok(found),
                Err(e) => why = Unresolved::Neither(Box::new(why), Box::new(e)),
            }
        }
        Err(why)
    }

    fn find_as(&self, k: &Kernel, member: &'static str) -> Result<Found, Unresolved> {
        let path: Vec<&str> = member.split('.').collect();
        let found = |store, marks| Found {
            member,
            store,
            marks,
        };
        match self.read {
            Read::At(shape, slot) => {
                let at = k.offset(self.root, &path, shape)?;
                Ok(found(Store::Offset(slot, at), None))
            }
            Read::Either {
                usual,
                other,
                at: slot,
                marks,
            } => match k.offset(self.root, &path, usual) {
                Ok(at) => Ok(found(Store::Offset(slot, at), None)),
                // The usual shape's mismatch is the one worth reporting.
                Err(why) => match k.offset(self.root, &path, other) {
                    Ok(at) => Ok(found(Store::Offset(slot, at), Some(marks))),
                    Err(_) => Err(why),
                },
            },
            Read::Flag(slot) => {
                let window = k.flag(self.root, &path)?;
                Ok(found(Store::Flag(slot, window), None))
            }
        }
    }
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
            (4, 8, 80, 16)
        );
        assert_eq!(
            (
                o.cfs_rq_tasks_root,
                o.cfs_rq_curr,
                o.se_run_node,
                o.se_my_q,
                o.rb_left,
                o.rb_right
            ),
            (48, 64, 24, 48, 16, 8)
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

    /// The per-period demand finds the group entities in the array `task_group.se`, or on 7.x
    /// in each CPU's `cfs_tg_state`, `se` past the `cfs_rq` that the per-CPU
    /// `task_group.cfs_rq` points to; a kernel with neither (older BTF here) has no demand, and
    /// says nothing of it.
    #[test]
    fn demand_entities_in_an_array_or_per_cpu() {
        let array = synth(Variant {
            with_demand: true,
            ..V5_4
        })
        .unwrap();
        let o = array.offsets;
        assert_eq!(
            (
                o.tg_se,
                o.tg_state_se,
                o.tg_cfs_bandwidth,
                o.se_sum_exec_runtime
            ),
            (152, ABSENT, 96, 16)
        );
        assert!(o.has_entities() && !o.entities_per_cpu());
        let per_cpu = synth(Variant {
            with_demand: true,
            percpu_cfs_rq: true,
            ..V5_4
        })
        .unwrap();
        let o = per_cpu.offsets;
        assert_eq!(
            (o.tg_se, o.tg_cfs_rq, o.tg_state_cfs_rq, o.tg_state_se),
            (ABSENT, 48, 0, 80)
        );
        assert_eq!((o.cfsb_runtime, o.cfsb_period_timer), (32, 40));
        assert!(o.entities_per_cpu() && Feature::Demand.in_kernel(&o));
        assert!(is_on(&per_cpu, Feature::Demand), "{:?}", per_cpu.disabled);
        let none = synth(V5_4).unwrap();
        assert!(!Feature::Demand.in_kernel(&none.offsets));
        assert!(is_on(&none, Feature::Demand), "{:?}", none.disabled);
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

    pub(super) const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

    fn host() -> Option<Resolved> {
        if !Path::new(VMLINUX).exists() {
            crate::testing::missing(&format!(
                "{VMLINUX} is absent (kernel without CONFIG_DEBUG_INFO_BTF)"
            ));
            return None;
        }
        Some(resolve(Path::new(VMLINUX)).expect("host BTF resolves"))
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
    /// 6.18.44 host, independently of the tracer's BTF reader: cfs_rq `'throttled' type_id=70
    /// bits_offset=3328 bitfield_size=1`, pahole `bool throttled:1; /* 416: 0 1 */`.
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
            crate::testing::not_applicable(&format!(
                "layout checks are for 6.18.x, this is {}",
                release.trim()
            ));
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
        // include/linux/rbtree_types.h: `unsigned long __rb_parent_color; struct rb_node
        // *rb_right; struct rb_node *rb_left;`, unchanged since 2.6.
        assert_eq!((o.rb_right, o.rb_left), (8, 16));
    }

    /// Expected values from `pahole -C task_group /sys/kernel/btf/vmlinux` and `pahole -C
    /// cfs_rq` on the 6.18.44 host (dwarves 1.24), independently of the tracer's BTF reader:
    /// task_group `struct cfs_rq * * cfs_rq; /* 224 8 */`, `siblings; /* 416 16 */`,
    /// `children; /* 432 16 */`; cfs_rq `unsigned int nr_queued; /* 16 4 */`.
    #[test]
    fn host_6_18_children_layout() {
        let Some(r) = host() else { return };
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if !release.starts_with("6.18.") {
            crate::testing::not_applicable(&format!(
                "layout checks are for 6.18.x, this is {}",
                release.trim()
            ));
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
        let bytes = std::fs::read(VMLINUX).unwrap();
        let k = Kernel::new(raw::Btf::parse(&bytes).unwrap());
        assert!(matches!(
            k.offset("task_group", &["cfs_rq"], Shape::Ptr("cfs_rq")),
            Err(Unresolved::WrongShape { .. })
        ));
        assert!(matches!(
            k.offset("task_group", &["children"], Shape::PtrPtr("cfs_rq")),
            Err(Unresolved::WrongShape { .. })
        ));
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
            o.cfs_rq_runtime_remaining,
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
    /// the tracer's BTF reader: cfs_rq runtime_enabled 356, runtime_remaining 360, throttled_clock_self 400,
    /// throttled_clock_self_time 408, throttle_count 420, throttled_list 424, throttled_csd_list
    /// 440; cfs_bandwidth period_timer 64, slack_timer 128, throttled_cfs_rq 192; hrtimer
    /// function 40; rq cfsb_csd 3488, cfsb_csd_list 3520; __call_single_data func 16;
    /// task_struct `bool throttled` 752.
    #[test]
    fn host_6_18_tracepoint_layout() {
        let Some(r) = host() else { return };
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if !release.starts_with("6.18.") {
            crate::testing::not_applicable(&format!(
                "layout checks are for 6.18.x, this is {}",
                release.trim()
            ));
            return;
        }
        let o = r.offsets;
        assert_eq!(
            (
                o.cfs_rq_runtime_enabled,
                o.cfs_rq_runtime_remaining,
                o.cfs_rq_throttled_clock_self,
                o.cfs_rq_throttled_clock_self_time,
                o.cfs_rq_throttle_count,
                o.cfs_rq_throttled_list,
                o.cfs_rq_throttled_csd_list
            ),
            (356, 360, 400, 408, 420, 424, 440)
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
        let bytes = std::fs::read(VMLINUX).unwrap();
        let k = Kernel::new(raw::Btf::parse(&bytes).unwrap());
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
