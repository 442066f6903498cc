//! Loading a backend's programs all at once. BPF_PROG_LOAD runs the verifier in the calling
//! thread and privileged loads do not wait for one another, so programs loaded from threads of
//! their own verify on as many CPUs as the machine has: startup is the dearest program's
//! verification, not the sum of them all. Attaching stays with the caller, in its order.
use std::sync::Mutex;

use aya::{Ebpf, programs::Program};
use log::debug;

/// Loads the programs `names` of `ebpf`, each with `load(i, program)` (`i` its index in
/// `names`, `program` None when the object has no such program) on a thread of its own.
/// Returns each one's result, in the order of `names`.
pub fn load<E: Send>(
    ebpf: &mut Ebpf,
    names: &[&str],
    load: impl Fn(usize, Option<&mut Program>) -> Result<(), E> + Sync,
) -> Vec<Result<(), E>> {
    let mut programs: Vec<Option<&mut Program>> = names.iter().map(|_| None).collect();
    for (name, program) in ebpf.programs_mut() {
        if let Some(i) = names.iter().position(|&n| n == name) {
            programs[i] = Some(program);
        }
    }
    // Each program in a slot its thread takes it from, so that a thread that cannot be
    // started leaves its program to be loaded here.
    let slots: Vec<Mutex<Option<&mut Program>>> = programs.into_iter().map(Mutex::new).collect();
    let run = |i: usize| {
        let program = slots[i].lock().map_or(None, |mut slot| slot.take());
        load(i, program)
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..names.len())
            .map(|i| {
                std::thread::Builder::new()
                    .name(format!("load {}", names[i]))
                    .spawn_scoped(scope, move || run(i))
                    .map_err(|e| debug!("loading {} without a thread of its own: {e}", names[i]))
            })
            .collect();
        threads
            .into_iter()
            .enumerate()
            .map(|(i, thread)| match thread {
                Ok(thread) => thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(()) => run(i),
            })
            .collect()
    })
}
