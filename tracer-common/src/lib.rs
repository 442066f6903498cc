//! The records and settings shared by the eBPF programs and the agent.
//!
//! Everything here is `#[repr(C)]` and plain data: the kernel side writes these bytes into the
//! ring buffer or reads them from `.rodata`, the agent reinterprets the same bytes.
#![no_std]

/// Userspace only: reads the system's clocks.
#[cfg(not(target_arch = "bpf"))]
pub mod clock;
/// Userspace only: a line of text, with floating point in it.
#[cfg(not(target_arch = "bpf"))]
pub mod round;

/// A field the running kernel does not have; the probe skips whatever needs it.
pub const ABSENT: u32 = u32::MAX;

/// `StopEvent::kind`: a cfs_rq was really throttled (the stop begins).
pub const EVENT_START: u32 = 1;
/// `StopEvent::kind`: a throttled cfs_rq was really unthrottled after a start we saw.
pub const EVENT_END: u32 = 2;
/// `StopEvent::kind`: an unthrottle whose start predates tracing; only `kernel_ns` is meaningful.
/// The kernel adds it to cpu.stat inside the window, so the cross-check needs it.
pub const EVENT_UNSEEN_START_END: u32 = 3;

/// `PeriodEvent::kind`: one period of a group with a quota ended (its period timer fired).
/// Shares the first field with `StopEvent::kind`, so a record's kind tells its type.
pub const EVENT_PERIOD: u32 = 4;

/// Not a record's kind: under this kind `LOST_BY_CGROUP` sums the `kernel_ns` of a cgroup's
/// lost ends (those whose kernel time was read), so that its traced kernel time plus this sum
/// is the kernel's own throttled time however many ends were lost.
pub const LOST_KERNEL_NS: u32 = 5;

/// `DeferredEvent::kind`: a thread a stop held ran the work the stop deferred (tracepoint
/// backend).
pub const EVENT_DEFERRED: u32 = 6;
/// `DeferredEvent::continues` values.
pub const DEFERRED_CONTINUES: u32 = 1;
pub const DEFERRED_UNFOLLOWED: u32 = 2;

/// The key of a cgroup's count of lost records of one kind (`EVENT_*`) in the programs'
/// `LOST_BY_CGROUP` map: the kind in the top 4 bits, the cgroup id below (kernfs ids are an
/// inode number in the low 32 bits and a wrap generation above it, far below 2^60).
pub const fn lost_key(cgroup_id: u64, kind: u32) -> u64 {
    (cgroup_id & LOST_KEY_ID_MASK) | ((kind as u64) << 60)
}

/// The cgroup id part of a [`lost_key`]; the kind is `key >> 60`.
pub const LOST_KEY_ID_MASK: u64 = (1 << 60) - 1;

/// `StopEvent::end_reason` values, from the kernel function that called `unthrottle_cfs_rq`.
pub const END_UNKNOWN: u32 = 0;
/// Period or slack timer refill (`distribute_cfs_runtime`, `__cfsb_csd_unthrottle`).
pub const END_REFILL: u32 = 1;
/// A write to cpu.max / cpu.cfs_quota_us / burst (`tg_set_cfs_bandwidth`).
pub const END_QUOTA_CHANGE: u32 = 2;
/// CPU hot-unplug (`rq_offline_fair`).
pub const END_CPU_OFFLINE: u32 = 3;
/// The task group is being destroyed (`destroy_cfs_bandwidth`).
pub const END_CGROUP_GONE: u32 = 4;

/// `kernel_ns` when the kernel's own clocks could not be read.
pub const KERNEL_NS_UNKNOWN: u64 = u64::MAX;

/// One ring-buffer record: the start or the end of one per-CPU stop.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopEvent {
    /// `EVENT_*`.
    pub kind: u32,
    /// The stopped CPU: `cfs_rq->rq->cpu`, not the CPU that ran the probe.
    pub cpu: u32,
    /// `cfs_rq->tg->css.cgroup->kn->id`: the cgroup directory's inode number.
    pub cgroup_id: u64,
    /// The `struct cfs_rq *` that identifies this stop while it is open.
    pub cfs_rq: u64,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when `throttle_cfs_rq` returned having throttled.
    pub start_ns: u64,
    /// `bpf_ktime_get_ns()` when `unthrottle_cfs_rq` returned having unthrottled (ends only).
    pub end_ns: u64,
    /// What the kernel added to `throttled_time` for this stop: `rq->clock` after unthrottle's
    /// clock update minus `cfs_rq->throttled_clock` (ends only; `KERNEL_NS_UNKNOWN` if unreadable).
    pub kernel_ns: u64,
    /// `tg->cfs_bandwidth.quota`, `.period`, `.burst` in ns at the event (`u64::MAX` = no limit).
    pub quota_ns: u64,
    pub period_ns: u64,
    pub burst_ns: u64,
    /// Tasks queued in the stopped cfs_rq at throttle time (`h_nr_running` or `h_nr_queued`).
    pub tasks: u32,
    /// The task running on the stopped CPU at throttle time, if it belongs to the group; else 0.
    pub pid: u32,
    pub tid: u32,
    /// `END_*`.
    pub end_reason: u32,
    pub comm: [u8; 16],
    // Appended for the tracepoint backend (0 from the kprobe backend).
    /// The kernel's own start of the stop: `cfs_rq->throttled_clock` (rq clock domain, not
    /// CLOCK_MONOTONIC; 0 = not set or unknown). On 6.18 it is set when the first task is parked.
    pub kernel_start_clock: u64,
    /// `bpf_ktime_get_ns()` when the first task of the stopped cfs_rq was seen parked (6.18:
    /// sched_switch away from a task with `throttled` set); 0 = none seen.
    pub park_ns: u64,
    /// Tasks seen parked by this stop (6.18 task-based throttle); 0 on older kernels.
    pub parked: u32,
    pub _reserved: u32,
    // Appended for ancestor attribution (all backends).
    /// The cgroup id of the stopped task's own group (`task->se.cfs_rq->tg`'s cgroup): the task
    /// running on the stopped CPU, or (tracepoint backend) the task seen parked or switching
    /// there. A descendant of `cgroup_id` when the quota lives on an ancestor; 0 = no task of
    /// the group was seen.
    pub leaf_cgroup_id: u64,
    // Appended for crediting every stopped child (all backends).
    /// Cgroup ids of up to `MAX_CHILDREN` direct children of the throttled group whose cfs_rq on
    /// the stopped CPU had tasks queued when the stop was recorded (`nr_running` / `nr_queued`
    /// non-zero, or their `throttled_clock_self` already running): the children the kernel's
    /// `tg_throttle_down` starts stopping too. The first `children` entries are valid.
    pub child_cgroup_ids: [u64; MAX_CHILDREN],
    pub children: u32,
    /// Children that qualified beyond the `MAX_CHILDREN` listed, plus one when the walk gave up
    /// before the end of a very long list of children (so a lower bound then).
    pub children_unlisted: u32,
    // Appended for the threads a stop held (all backends).
    /// Up to `MAX_THREADS` threads of the group the stop held on the stopped CPU, each from
    /// the moment it began to wait (docs/design.md, "threads held"). The first `threads`
    /// entries are valid.
    pub held: [HeldThread; MAX_THREADS],
    pub threads: u32,
    /// Threads held beyond the `MAX_THREADS` listed.
    pub threads_unlisted: u32,
}

/// One thread a stop held.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldThread {
    /// Thread-group id and thread id.
    pub pid: u32,
    pub tid: u32,
    /// `bpf_ktime_get_ns()` when it began to wait: the stop's start (the task running or
    /// queued at the throttle), its switch-out or wakeup into the throttled group, or (6.18+,
    /// tracepoint backend) its park.
    pub since_ns: u64,
    pub comm: [u8; 16],
}

/// Most threads listed in one `StopEvent`.
pub const MAX_THREADS: usize = 8;

/// One ring-buffer record per period of a group with a quota (tracepoint backend): what the
/// group ran in the period that its period timer's expiry ends, from the kernel's own
/// accounting (the group entity's `sum_exec_runtime` on each CPU: `tg->se[cpu]`, or on 7.x the
/// `se` of that CPU's `cfs_tg_state`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeriodEvent {
    /// `EVENT_PERIOD`.
    pub kind: u32,
    /// CPUs whose group entity ran in the period (Δ sum_exec_runtime > 0).
    pub cpus_used: u32,
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns()` at the previous expiry of this group's period timer that the probe
    /// saw; 0 = none (the first one seen: `usage_ns` is unknown).
    pub start_ns: u64,
    /// `bpf_ktime_get_ns()` at this expiry (hrtimer_expire_entry): the period boundary.
    pub end_ns: u64,
    /// Σ over CPUs of Δ`sum_exec_runtime` since `start_ns` (rq_clock_task ns).
    pub usage_ns: u64,
    /// The largest one CPU's share of `usage_ns`.
    pub max_cpu_ns: u64,
    /// `tg->cfs_bandwidth.quota`, `.period`, `.burst` at the expiry (`u64::MAX` = none).
    pub quota_ns: u64,
    pub period_ns: u64,
    pub burst_ns: u64,
    /// `cfs_b->runtime` at the expiry, before the refill: the pool the period left.
    pub runtime_ns: u64,
    /// cfs_rqs on `cfs_b->throttled_cfs_rq` at the expiry (the kernel counts the period in
    /// `nr_throttled` when this is not 0).
    pub throttled_cpus: u32,
    /// CPUs whose entity was read; a CPU seen for the first time has no Δ yet.
    pub cpus_read: u32,
    /// `cfs_b->runtime_snap` at the expiry (5.16+; `u64::MAX` = none): the pool the previous
    /// refill left. The refill counts `runtime_snap - (runtime + quota)`, when positive, as
    /// burst the period spent (cpu.stat `burst_time` / `burst_usec`).
    pub runtime_snap_ns: u64,
}

/// One ring-buffer record per thread a stop held, once the work it had waiting is done: the CPU
/// time it ran from its hold until it next blocked (went to sleep or exited), or until a later
/// stop held it again first (`continues`; its next record then goes on with the same work). The
/// work a stop defers is known only in hindsight: the kernel keeps no count of it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeferredEvent {
    /// `EVENT_DEFERRED`.
    pub kind: u32,
    pub tid: u32,
    /// The stopped group's cgroup id.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns()` when the stop began to hold it (`HeldThread::since_ns`).
    pub since_ns: u64,
    /// Δ its `sum_exec_runtime` from the hold to the block (or to the next hold).
    pub ran_ns: u64,
    /// `DEFERRED_CONTINUES`: a later stop held it again before it blocked;
    /// `DEFERRED_UNFOLLOWED`: the hold could not be followed (the programs' map of held
    /// threads was full), `ran_ns` is 0 and the work is unknown; 0: it blocked.
    pub continues: u32,
    pub _reserved: u32,
}

/// Most direct children listed in one `StopEvent`.
pub const MAX_CHILDREN: usize = 8;

/// Where a bit field sits: byte offset of a 32-bit window, shift and width inside it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitField {
    pub offset: u32,
    pub shift: u32,
    pub bits: u32,
}

impl BitField {
    pub const ABSENT: Self = Self {
        offset: ABSENT,
        shift: 0,
        bits: 0,
    };

    /// The field's value from the 32-bit window read at `offset`.
    pub const fn extract(&self, window: u32) -> u32 {
        let value = window >> self.shift;
        if self.bits >= 32 {
            value
        } else {
            value & ((1u32 << self.bits) - 1)
        }
    }
}

/// Byte offsets of every kernel field the probes read, resolved by the agent from the running
/// kernel's BTF (Rust eBPF cannot emit CO-RE relocations). Nested paths are pre-added, e.g.
/// `tg_cgroup` is `offsetof(task_group, css) + offsetof(cgroup_subsys_state, cgroup)`.
/// A field the kernel lacks is `ABSENT`, and the feature that needs it is off.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub cfs_rq_rq: u32,
    pub cfs_rq_tg: u32,
    pub cfs_rq_throttled: BitField,
    pub cfs_rq_throttled_clock: u32,
    /// `h_nr_running` (<= 6.13) or `h_nr_queued` (6.14+, and 6.12.37+ backports).
    pub cfs_rq_nr_tasks: u32,
    pub rq_cpu: u32,
    pub rq_clock: u32,
    pub rq_curr: u32,
    pub tg_cgroup: u32,
    pub tg_period: u32,
    pub tg_quota: u32,
    pub tg_burst: u32,
    pub cgroup_kn: u32,
    pub kn_id: u32,
    /// 1 on 5.4, where `kn->id` is `union kernfs_node_id` and the inode is its low 32 bits.
    pub kn_id_is_union: u32,
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_comm: u32,
    pub task_se: u32,
    pub se_cfs_rq: u32,
    pub se_parent: u32,
    /// 1 when `throttle_cfs_rq` returns bool (5.4.69+, 5.8+); 0 when void (read `throttled`).
    pub throttle_returns_bool: u32,
    // Appended for the tracepoint backend. Offsets inside `cfs_bandwidth` are relative to it.
    pub cfs_rq_runtime_enabled: u32,
    pub cfs_rq_throttle_count: u32,
    /// `list_head` in `cfs_b->throttled_cfs_rq`.
    pub cfs_rq_throttled_list: u32,
    /// `list_head` in `rq->cfsb_csd_list` (6.2+).
    pub cfs_rq_throttled_csd_list: u32,
    /// 6.6+.
    pub cfs_rq_throttled_clock_self: u32,
    /// 6.6+.
    pub cfs_rq_throttled_clock_self_time: u32,
    pub cfsb_period_timer: u32,
    pub cfsb_slack_timer: u32,
    pub cfsb_throttled_cfs_rq: u32,
    pub hrtimer_function: u32,
    /// `rq->cfsb_csd`, `rq->cfsb_csd_list` (6.2+).
    pub rq_cfsb_csd: u32,
    pub rq_cfsb_csd_list: u32,
    /// `__call_single_data.func`.
    pub csd_func: u32,
    /// 6.18 `task_struct.throttled` (a task parked by the task-based throttle).
    pub task_throttled: BitField,
    // Appended for crediting every stopped child.
    /// `task_group.cfs_rq`: `struct cfs_rq **`, one per CPU (before 7.x; see
    /// `tg_cfs_rq_percpu`).
    pub tg_cfs_rq: u32,
    /// `task_group.children` (`list_head`), linking the children through their `siblings`.
    pub tg_children: u32,
    pub tg_siblings: u32,
    /// `cfs_rq.nr_running` (entities queued, < 6.14) or `cfs_rq.nr_queued` (6.14+).
    pub cfs_rq_nr_queued: u32,
    // Appended for 7.x.
    /// 1 when `task_group.cfs_rq` is one per-CPU pointer (`struct cfs_rq __percpu *`, 7.x):
    /// a group's cfs_rq on a CPU is that pointer plus the CPU's per-CPU offset.
    pub tg_cfs_rq_percpu: u32,
    // Appended for per-period demand (tracepoint backend).
    /// `task_group.cfs_bandwidth`: the bandwidth inside its group (`cfsb_*` are relative to it).
    pub tg_cfs_bandwidth: u32,
    /// `task_group.se`: `struct sched_entity **`, one group entity per CPU (before 7.x; see
    /// `tg_state_se`).
    pub tg_se: u32,
    pub se_sum_exec_runtime: u32,
    /// `cfs_bandwidth.runtime`, relative to `cfs_bandwidth`.
    pub cfsb_runtime: u32,
    // Appended for the burst each period spent (5.16+).
    /// `cfs_bandwidth.runtime_snap`, relative to `cfs_bandwidth`.
    pub cfsb_runtime_snap: u32,
    // Appended for the threads a stop held (tracepoint backend).
    /// `task_struct.on_rq`: a task switched out with it set was still runnable (preempted or
    /// throttled), not going to sleep.
    pub task_on_rq: BitField,
    /// `sched_entity.sched_delayed` (6.12+, relative to `sched_entity`): a sleeping task whose
    /// dequeue the kernel delayed keeps `on_rq` set.
    pub se_sched_delayed: BitField,
    // Appended for per-period demand on 7.x.
    /// `cfs_tg_state.cfs_rq` and `.se` (7.x): a group's cfs_rq and entity on one CPU, side by
    /// side in the per-CPU `struct cfs_tg_state` that `task_group.cfs_rq` points into.
    pub tg_state_cfs_rq: u32,
    pub tg_state_se: u32,
    // Appended for the async unthrottle's refills (tracepoint backend, 6.2+).
    /// `cfs_rq.runtime_remaining` (`s64`): positive on a throttled cfs_rq once a refill has
    /// paid it, until its unthrottle (queued as a CSD, or run by another CPU's refill).
    pub cfs_rq_runtime_remaining: u32,
    // Appended for the threads queued at a throttle (kprobe, fentry).
    /// `cfs_rq.tasks_timeline.rb_root.rb_node`: the root of the runqueue's red-black tree of
    /// queued entities (every one but the running `curr`).
    pub cfs_rq_tasks_root: u32,
    /// `cfs_rq.curr`: the running entity, which the tree does not hold.
    pub cfs_rq_curr: u32,
    /// `sched_entity.run_node`: an entity's node in its runqueue's tree.
    pub se_run_node: u32,
    /// `sched_entity.my_q`: a group entity's own runqueue; NULL for a task's entity.
    pub se_my_q: u32,
    /// `rb_node.rb_left`, `rb_node.rb_right`.
    pub rb_left: u32,
    pub rb_right: u32,
}

impl Offsets {
    /// Every field absent: the value the eBPF object is compiled with, replaced before load.
    pub const ABSENT: Self = Self {
        cfs_rq_rq: ABSENT,
        cfs_rq_tg: ABSENT,
        cfs_rq_throttled: BitField::ABSENT,
        cfs_rq_throttled_clock: ABSENT,
        cfs_rq_nr_tasks: ABSENT,
        rq_cpu: ABSENT,
        rq_clock: ABSENT,
        rq_curr: ABSENT,
        tg_cgroup: ABSENT,
        tg_period: ABSENT,
        tg_quota: ABSENT,
        tg_burst: ABSENT,
        cgroup_kn: ABSENT,
        kn_id: ABSENT,
        kn_id_is_union: 0,
        task_pid: ABSENT,
        task_tgid: ABSENT,
        task_comm: ABSENT,
        task_se: ABSENT,
        se_cfs_rq: ABSENT,
        se_parent: ABSENT,
        throttle_returns_bool: 1,
        cfs_rq_runtime_enabled: ABSENT,
        cfs_rq_throttle_count: ABSENT,
        cfs_rq_throttled_list: ABSENT,
        cfs_rq_throttled_csd_list: ABSENT,
        cfs_rq_throttled_clock_self: ABSENT,
        cfs_rq_throttled_clock_self_time: ABSENT,
        cfsb_period_timer: ABSENT,
        cfsb_slack_timer: ABSENT,
        cfsb_throttled_cfs_rq: ABSENT,
        hrtimer_function: ABSENT,
        rq_cfsb_csd: ABSENT,
        rq_cfsb_csd_list: ABSENT,
        csd_func: ABSENT,
        task_throttled: BitField::ABSENT,
        tg_cfs_rq: ABSENT,
        tg_children: ABSENT,
        tg_siblings: ABSENT,
        cfs_rq_nr_queued: ABSENT,
        tg_cfs_rq_percpu: 0,
        tg_cfs_bandwidth: ABSENT,
        tg_se: ABSENT,
        se_sum_exec_runtime: ABSENT,
        cfsb_runtime: ABSENT,
        cfsb_runtime_snap: ABSENT,
        task_on_rq: BitField::ABSENT,
        se_sched_delayed: BitField::ABSENT,
        tg_state_cfs_rq: ABSENT,
        tg_state_se: ABSENT,
        cfs_rq_runtime_remaining: ABSENT,
        cfs_rq_tasks_root: ABSENT,
        cfs_rq_curr: ABSENT,
        se_run_node: ABSENT,
        se_my_q: ABSENT,
        rb_left: ABSENT,
        rb_right: ABSENT,
    };

    /// Whether the group entities are 7.x's, each in its CPU's `cfs_tg_state` beside the
    /// group's cfs_rq, rather than in the `task_group.se` array.
    pub const fn entities_per_cpu(&self) -> bool {
        self.tg_se == ABSENT && self.tg_state_se != ABSENT && self.tg_cfs_rq_percpu != 0
    }

    /// Whether the per-period demand can read the group entities at all.
    pub const fn has_entities(&self) -> bool {
        self.tg_se != ABSENT || self.entities_per_cpu()
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers and byte arrays; every bit pattern is valid.
    unsafe impl aya::Pod for super::StopEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Offsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PeriodEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::DeferredEvent {}
}
