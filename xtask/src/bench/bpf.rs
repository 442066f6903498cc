//! BPF programs as the kernel's run-time statistics see them: the tracer's (by the raw
//! tracepoint links its process holds), bpftrace's (new since it started), and the floor on
//! each hook, an empty program.
use super::procs;
use anyhow::{Context as _, Result, bail};
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_type};
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

/// A program: what it is attached to, and its id.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub hook: String,
    pub name: String,
    pub id: u32,
}

/// Per program id: (run_time_ns, run_cnt).
pub type Snapshot = HashMap<u32, (u64, u64)>;

/// The run-time statistics of `programs` now.
pub fn snapshot(programs: &[Program]) -> Result<Snapshot> {
    let mut snapshot = Snapshot::new();
    // Other processes load and unload programs meanwhile: one that vanished between the
    // listing and the lookup is an error here, and not one of ours.
    for info in aya::programs::loaded_programs().flatten() {
        if programs.iter().any(|p| p.id == info.id()) {
            let ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            snapshot.insert(info.id(), (ns, info.run_count()));
        }
    }
    if let Some(p) = programs.iter().find(|p| !snapshot.contains_key(&p.id)) {
        bail!("program {} ({}) is not loaded", p.id, p.hook);
    }
    Ok(snapshot)
}

/// `after − before` per program.
pub fn delta(before: &Snapshot, after: &Snapshot) -> Snapshot {
    after
        .iter()
        .map(|(id, &(ns, cnt))| {
            let (ns0, cnt0) = before.get(id).copied().unwrap_or_default();
            (*id, (ns.saturating_sub(ns0), cnt.saturating_sub(cnt0)))
        })
        .collect()
}

/// The programs behind the raw-tracepoint links (what tp_btf attaches with) that `pid` holds,
/// from `/proc/<pid>/fdinfo`: the kernel truncates program names to 15 bytes; the link names
/// the tracepoint.
pub fn attached_programs(pid: u32) -> Result<Vec<Program>> {
    let names: HashMap<u32, String> = aya::programs::loaded_programs()
        .flatten()
        .map(|p| (p.id(), p.name_as_str().unwrap_or("").to_owned()))
        .collect();
    let mut programs = Vec::new();
    for (fd, target) in procs::fds(pid)? {
        if target != "anon_inode:bpf_link" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
            continue;
        };
        if let Some(mut program) = parse_link_fdinfo(&text) {
            program.name = names.get(&program.id).cloned().unwrap_or_default();
            programs.push(program);
        }
    }
    if programs.is_empty() {
        bail!("pid {pid} holds no raw-tracepoint links");
    }
    programs.sort_by_key(|p| (p.hook.clone(), p.name.clone()));
    Ok(programs)
}

fn parse_link_fdinfo(text: &str) -> Option<Program> {
    Some(Program {
        hook: procs::field(text, "tp_name")?.to_owned(),
        name: String::new(),
        id: procs::field(text, "prog_id")?.parse().ok()?,
    })
}

/// Ids of the programs loaded now.
pub fn loaded_ids() -> HashSet<u32> {
    aya::programs::loaded_programs()
        .flatten()
        .map(|p| p.id())
        .collect()
}

/// Tracepoint-type programs loaded since `before` (what a bpftrace just started loaded).
pub fn tracepoint_programs_since(before: &HashSet<u32>, hook: &str) -> Vec<Program> {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| !before.contains(&p.id()))
        .filter(|p| p.program_type() == bpf_prog_type::BPF_PROG_TYPE_TRACEPOINT)
        .map(|p| Program {
            hook: hook.to_owned(),
            name: p.name_as_str().unwrap_or("").to_owned(),
            id: p.id(),
        })
        .collect()
}

/// The cheapest program there can be (`r0 = 0; exit`) on a raw tracepoint: the kernel runs it
/// through the same `bpf_trace_run` call as the tracer's tp_btf programs, so its mean run time
/// is what any program costs on that hook on this host.
pub struct Floor {
    pub program: Program,
    _link: OwnedFd,
    _prog: OwnedFd,
}

/// The floor programs' name, to find their ids among the loaded programs.
const FLOOR_NAME: &str = "tt_bench_empty";

impl Floor {
    pub fn attach(hook: &str) -> Result<Self> {
        // mov64 r0, 0; exit (little-endian `struct bpf_insn`s: opcode in the low byte).
        let insns: [u64; 2] = [0xb7, 0x95];
        let mut attr = zeroed_attr();
        // SAFETY: the BPF_PROG_LOAD member of a zeroed union.
        let load = unsafe { &mut attr.__bindgen_anon_3 };
        load.prog_type = bpf_prog_type::BPF_PROG_TYPE_RAW_TRACEPOINT as u32;
        load.insn_cnt = 2;
        load.insns = insns.as_ptr() as u64;
        load.license = c"GPL".as_ptr() as u64;
        for (slot, byte) in load.prog_name.iter_mut().zip(FLOOR_NAME.bytes()) {
            *slot = byte as libc::c_char;
        }
        let before = loaded_ids();
        let prog = bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr).context("loading an empty program")?;
        let name = std::ffi::CString::new(hook)?;
        let mut attr = zeroed_attr();
        // SAFETY: the BPF_RAW_TRACEPOINT_OPEN member of a zeroed union.
        let open = unsafe { &mut attr.raw_tracepoint };
        open.name = name.as_ptr() as u64;
        open.prog_fd = u32::try_from(prog.as_raw_fd()).context("program fd")?;
        let link = bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr)
            .with_context(|| format!("attaching an empty program to {hook}"))?;
        let id = aya::programs::loaded_programs()
            .flatten()
            .filter(|p| p.name_as_str() == Some(FLOOR_NAME) && !before.contains(&p.id()))
            .map(|p| p.id())
            .max()
            .context("the empty program is not among the loaded programs")?;
        Ok(Self {
            program: Program {
                hook: hook.to_owned(),
                name: FLOOR_NAME.to_owned(),
                id,
            },
            _link: link,
            _prog: prog,
        })
    }
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: plain integers and arrays; all zero is every field's "unset".
    unsafe { std::mem::zeroed() }
}

/// The bpf(2) commands that return a new fd.
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> Result<OwnedFd> {
    // SAFETY: `attr` is a whole bpf_attr, and its size is passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            size_of::<bpf_attr>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let fd = RawFd::try_from(fd).context("bpf(2) returned no fd")?;
    // SAFETY: a new fd the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_fdinfo() {
        let text = "pos:\t0\nflags:\t02000000\nmnt_id:\t17\nino:\t1038\nlink_type:\traw_tracepoint\nlink_id:\t259\nprog_tag:\t346a43a1833c03a0\nprog_id:\t411\ntp_name:\thrtimer_expire_exit\ncookie:\t0\n";
        assert_eq!(
            parse_link_fdinfo(text),
            Some(Program {
                hook: "hrtimer_expire_exit".into(),
                name: String::new(),
                id: 411
            })
        );
        assert_eq!(parse_link_fdinfo("prog_id:\t3\n"), None);
    }
}
