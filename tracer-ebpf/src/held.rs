//! The threads a stop holds: each is listed in the stop's record once, and its deferred work
//! followed from the hold (`deferred`).
use tracer_common::{MAX_THREADS, Offsets, StopEvent};

use crate::{deferred, toolbox::read};

/// Lists `task` among the threads the stop `ev` holds, waiting since `since_ns`, unless it is
/// listed already; past `MAX_THREADS` it is counted in `threads_unlisted`. A thread waits once
/// per stop (it cannot run again before the unthrottle), so an entry is never updated.
#[inline(never)]
pub fn hold(o: &Offsets, task: u64, since_ns: u64, ev: &mut StopEvent) {
    let Some(tid) = read::<u32>(task, o.task_pid) else {
        return;
    };
    let n = ev.threads as usize;
    // Every index a constant: with `held[n]` taken after the loop, 5.10's verifier lost the
    // pointer on one of the paths the compiler merged ("R3 invalid mem access 'inv'").
    for i in 0..MAX_THREADS {
        if i == n {
            deferred::held(o, task, tid, ev.cgroup_id, since_ns);
            let entry = &mut ev.held[i];
            entry.tid = tid;
            entry.pid = read::<u32>(task, o.task_tgid).unwrap_or(0);
            entry.since_ns = since_ns;
            entry.comm = read::<[u8; 16]>(task, o.task_comm).unwrap_or([0; 16]);
            ev.threads += 1;
            return;
        }
        if ev.held[i].tid == tid {
            return;
        }
    }
    ev.threads_unlisted = ev.threads_unlisted.saturating_add(1);
}
