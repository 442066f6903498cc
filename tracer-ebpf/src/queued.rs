//! The threads queued on a runqueue at its throttle: for the kprobe and fentry backends, which see
//! the throttle and nothing after it on that CPU, and for the tracepoint backend's first sight of a
//! stop before 6.18, when the tasks queued at the throttle are neither switched out nor woken
//! during it. A bounded walk ([`MAX_NODES`]) of the runqueue's tree, one level into child groups,
//! under the runqueue's lock; the rest is counted. Why the walk is sound and what it leaves out:
//! docs/design.md ("Threads held").
use aya_ebpf::{macros::map, maps::PerCpuArray};
use tracer_common::{ABSENT, Offsets, StopEvent};

use crate::{
    held::hold,
    toolbox::{read, read_bits},
};

/// Most tree nodes one throttle visits: each is a few helper reads, and the verifier walks the
/// loop once per bound.
const MAX_NODES: usize = 16;
/// Nodes waiting to be visited; a power of two, so that a mask bounds every index for the
/// verifier. Two roots, then each visit pops one and pushes at most three (two children and a
/// child group's root): only the last visit's pushes can find it full, and those would not be
/// visited anyway. A push past it is dropped (its tasks counted through `tasks`).
const STACK: usize = 32;
/// The tag on a stacked node (rb_node pointers are 8-byte aligned): it lies in a child group's
/// tree, whose group entities are not descended into.
const IN_CHILD: u64 = 1;

#[repr(C)]
struct TreeWalk {
    nodes: [u64; STACK],
    /// Nodes on the stack. Kept here rather than in a register so that every path through a
    /// visit reaches the next with the same state for the verifier: the cost stays linear in
    /// `MAX_NODES`.
    len: u64,
    /// The task running on the stopped CPU, already listed: it may sit in a child group's tree
    /// (put back there by `put_prev_entity` before the group above it throttled).
    running: u64,
}

/// The walk's stack, too big for the BPF stack next to the callers' frames.
#[map]
static TREE_WALK: PerCpuArray<TreeWalk> = PerCpuArray::with_max_entries(1, 0);

/// Lists in `ev` every task queued on the throttled `cfs_rq` (and one level down), waiting
/// since the throttle (`ev.start_ns`); `running` is the running task listed already, or 0.
#[inline(never)]
pub fn list(o: &Offsets, cfs_rq: u64, running: u64, ev: &mut StopEvent) {
    if o.se_run_node == ABSENT || o.task_pid == ABSENT {
        return;
    }
    let Some(walk) = TREE_WALK.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot; the throttle's programs do not nest on a CPU (rq lock held).
    let walk = unsafe { &mut *walk };
    walk.len = 0;
    walk.running = running;
    push(walk, read::<u64>(cfs_rq, o.cfs_rq_tasks_root).unwrap_or(0));
    if let Some(curr) = read::<u64>(cfs_rq, o.cfs_rq_curr).filter(|&c| c != 0)
        && let Some(queue) = read::<u64>(curr, o.se_my_q).filter(|&q| q != 0)
    {
        push_in_child(o, walk, queue);
    }
    for _ in 0..MAX_NODES {
        if walk.len == 0 {
            return;
        }
        visit(o, walk, ev);
    }
}

/// Pops one node: stacks its children and, for a group's entity in the stopped runqueue's own
/// tree, that group's tree; lists it if it is a task's.
#[inline(never)]
fn visit(o: &Offsets, walk: &mut TreeWalk, ev: &mut StopEvent) {
    let len = walk.len;
    if len == 0 || len > STACK as u64 {
        return;
    }
    walk.len = len - 1;
    let item = walk.nodes[(len - 1) as usize & (STACK - 1)];
    let (node, tag) = (item & !IN_CHILD, item & IN_CHILD);
    if node == 0 {
        return;
    }
    push(walk, read::<u64>(node, o.rb_left).map_or(0, |n| n | tag));
    push(walk, read::<u64>(node, o.rb_right).map_or(0, |n| n | tag));
    let se = node.wrapping_sub(u64::from(o.se_run_node));
    // 6.12+: a task going to sleep whose dequeue the kernel delayed stays in the tree; it is
    // not waiting for the CPU. A delayed group entity holds no runnable task either.
    if read_bits(se, &o.se_sched_delayed).is_some_and(|d| d != 0) {
        return;
    }
    match read::<u64>(se, o.se_my_q) {
        Some(0) => {
            let task = se.wrapping_sub(u64::from(o.task_se));
            if task != walk.running {
                hold(o, task, ev.start_ns, ev);
            }
        }
        Some(queue) if tag == 0 => push_in_child(o, walk, queue),
        // A group two levels down: its tasks are counted in `tasks`, not named.
        _ => {}
    }
}

/// Stacks the root of `queue`'s tree, a child group's.
#[inline(always)]
fn push_in_child(o: &Offsets, walk: &mut TreeWalk, queue: u64) {
    let root = read::<u64>(queue, o.cfs_rq_tasks_root).unwrap_or(0);
    if root != 0 {
        push(walk, root | IN_CHILD);
    }
}

#[inline(always)]
fn push(walk: &mut TreeWalk, item: u64) {
    if item & !IN_CHILD == 0 {
        return;
    }
    let len = walk.len;
    if len < STACK as u64 {
        walk.nodes[len as usize & (STACK - 1)] = item;
        walk.len = len + 1;
    }
}
