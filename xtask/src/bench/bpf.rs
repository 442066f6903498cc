//! BPF programs as the kernel's run-time statistics see them: the tracer's (by the raw
//! tracepoint links its process holds), bpftrace's (new since it started), and the floor on
//! each hook, an empty program of the same type (raw tracepoint, kprobe, fentry/fexit).
use super::procfs;
use anyhow::{Context as _, Result, bail};
use aya_obj::generated::{
    PERF_FLAG_FD_CLOEXEC, bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_info, bpf_prog_type,
    perf_event_attr,
};
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

/// The programs behind the raw-tracepoint links (what tp_btf and raw tracepoint programs
/// attach with) that `pid` holds, from `/proc/<pid>/fdinfo`: the kernel truncates program
/// names to 15 bytes; the link names the tracepoint.
pub fn attached_programs(pid: u32) -> Result<Vec<Program>> {
    let names: HashMap<u32, String> = aya::programs::loaded_programs()
        .flatten()
        .map(|p| (p.id(), p.name_as_str().unwrap_or("").to_owned()))
        .collect();
    let mut programs = Vec::new();
    for (fd, target) in procfs::fds(pid)? {
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
        hook: procfs::field(text, "tp_name")?.to_owned(),
        name: String::new(),
        id: procfs::field(text, "prog_id")?.parse().ok()?,
    })
}

/// Ids of the programs loaded now.
pub fn loaded_ids() -> HashSet<u32> {
    aya::programs::loaded_programs()
        .flatten()
        .map(|p| p.id())
        .collect()
}

/// Programs of `kind` loaded since `before` (what a bpftrace just started loaded).
pub fn programs_since(before: &HashSet<u32>, kind: bpf_prog_type, hook: &str) -> Vec<Program> {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| !before.contains(&p.id()))
        .filter(|p| p.program_type() == kind)
        .map(|p| Program {
            hook: hook.to_owned(),
            name: p.name_as_str().unwrap_or("").to_owned(),
            id: p.id(),
        })
        .collect()
}

/// The cheapest program there can be (`r0 = 0; exit`) on the hooks of one measured program: the
/// kernel runs it through the same call as the measured one (`bpf_trace_run` on a raw
/// tracepoint, the kprobe handler, the fentry/fexit trampoline), so its mean run time is what
/// any program costs there on this kernel.
pub struct Floor {
    pub program: Program,
    /// The program's and its attachments' fds (links, perf events): closing them detaches it.
    _fds: Vec<OwnedFd>,
}

/// The floor programs' name, to tell them from the measured ones.
pub const FLOOR_NAME: &str = "tt_bench_empty";

impl Floor {
    /// A raw tracepoint program on the tracepoint `hook`: the type of the tracepoint backend's
    /// CSD entry program, and the same call for its tp_btf programs, which attach to the same
    /// raw tracepoint and which the kernel runs through the same `bpf_trace_run<N>`.
    pub fn attach(hook: &str) -> Result<Self> {
        let (prog, id) = load_empty(bpf_prog_type::BPF_PROG_TYPE_RAW_TRACEPOINT, None)?;
        let link = raw_tracepoint_open(&prog, Some(hook))
            .with_context(|| format!("attaching an empty program to {hook}"))?;
        Ok(Self::new(hook, id, vec![prog, link]))
    }

    /// One kprobe-type program on each `(return probe?, function)`: a kretprobe where the first
    /// is true. `hook` names them all, for the table.
    pub fn kprobe(hook: &str, probes: &[(bool, &str)]) -> Result<Self> {
        let (prog, id) = load_empty(bpf_prog_type::BPF_PROG_TYPE_KPROBE, None)?;
        let mut fds = vec![];
        for &(ret, function) in probes {
            let event = kprobe_event(ret, function)
                .with_context(|| format!("opening a kprobe perf event on {function}"))?;
            perf_ioctl(&event, PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd())
                .and_then(|()| perf_ioctl(&event, PERF_EVENT_IOC_ENABLE, 0))
                .with_context(|| format!("attaching an empty kprobe program to {function}"))?;
            fds.push(event);
        }
        fds.push(prog);
        Ok(Self::new(hook, id, fds))
    }

    /// An fentry (or, `exit`, fexit) program on `function`, whose BTF id `btf` has.
    pub fn fentry(hook: &str, exit: bool, function: &str, btf: &aya::Btf) -> Result<Self> {
        let btf_id = btf
            .id_by_type_name_kind(function, aya_obj::btf::BtfKind::Func)
            .with_context(|| format!("{function} in the kernel's BTF"))?;
        let attach = if exit {
            bpf_attach_type::BPF_TRACE_FEXIT
        } else {
            bpf_attach_type::BPF_TRACE_FENTRY
        };
        let (prog, id) = load_empty(bpf_prog_type::BPF_PROG_TYPE_TRACING, Some((attach, btf_id)))?;
        let link = raw_tracepoint_open(&prog, None)
            .with_context(|| format!("attaching an empty fentry/fexit program to {function}"))?;
        Ok(Self::new(hook, id, vec![prog, link]))
    }

    fn new(hook: &str, id: u32, fds: Vec<OwnedFd>) -> Self {
        Self {
            program: Program {
                hook: hook.to_owned(),
                name: FLOOR_NAME.to_owned(),
                id,
            },
            _fds: fds,
        }
    }
}

/// Loads `r0 = 0; exit` as a `prog_type` program (bound to a BTF function with its attach type
/// where given) and returns its fd and id.
fn load_empty(
    prog_type: bpf_prog_type,
    target: Option<(bpf_attach_type, u32)>,
) -> Result<(OwnedFd, u32)> {
    // mov64 r0, 0; exit (little-endian `struct bpf_insn`s: opcode in the low byte).
    let insns: [u64; 2] = [0xb7, 0x95];
    let mut attr = zeroed_attr();
    // SAFETY: the BPF_PROG_LOAD member of a zeroed union.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = prog_type as u32;
    load.insn_cnt = 2;
    load.insns = insns.as_ptr() as u64;
    // fentry/fexit programs must be GPL-compatible.
    load.license = c"GPL".as_ptr() as u64;
    if let Some((attach, btf_id)) = target {
        load.expected_attach_type = attach as u32;
        load.attach_btf_id = btf_id;
    }
    for (slot, byte) in load.prog_name.iter_mut().zip(FLOOR_NAME.bytes()) {
        *slot = byte as libc::c_char;
    }
    let prog = bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr).context("loading an empty program")?;
    let id = prog_id(&prog).context("the empty program's id")?;
    Ok((prog, id))
}

/// BPF_RAW_TRACEPOINT_OPEN: attaches a raw tracepoint program to the tracepoint `name`, or
/// (no name) a tracing program to the function it was loaded for.
fn raw_tracepoint_open(prog: &OwnedFd, name: Option<&str>) -> Result<OwnedFd> {
    let name = name.map(std::ffi::CString::new).transpose()?;
    let mut attr = zeroed_attr();
    // SAFETY: the BPF_RAW_TRACEPOINT_OPEN member of a zeroed union.
    let open = unsafe { &mut attr.raw_tracepoint };
    open.name = name.as_ref().map_or(0, |n| n.as_ptr() as u64);
    open.prog_fd = u32::try_from(prog.as_raw_fd()).context("program fd")?;
    bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr)
}

/// The kernel's id of the program behind `prog` (BPF_OBJ_GET_INFO_BY_FD).
fn prog_id(prog: &OwnedFd) -> Result<u32> {
    // SAFETY: plain integers; all zero is what the kernel expects of an output buffer.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr = zeroed_attr();
    // SAFETY: the BPF_OBJ_GET_INFO_BY_FD member of a zeroed union.
    let get = unsafe { &mut attr.info };
    get.bpf_fd = u32::try_from(prog.as_raw_fd()).context("program fd")?;
    get.info_len = u32::try_from(size_of::<bpf_prog_info>())?;
    get.info = std::ptr::from_mut(&mut info) as u64;
    sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info.id)
}

/// `_IOW('$', 8, u32)` and `_IO('$', 0)` of linux/perf_event.h.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;

/// A perf event of the kernel's kprobe PMU on the entry (or, `ret`, the return) of `function`,
/// on every CPU (a trace event runs its BPF program wherever it fires).
fn kprobe_event(ret: bool, function: &str) -> Result<OwnedFd> {
    let pmu = "/sys/bus/event_source/devices/kprobe";
    let read = |file: &str| {
        std::fs::read_to_string(format!("{pmu}/{file}")).with_context(|| format!("{pmu}/{file}"))
    };
    let pmu_type: u32 = read("type")?
        .trim()
        .parse()
        .context("the kprobe PMU's type")?;
    // SAFETY: plain integers and unions of them; all zero is every field's "unset".
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    if ret {
        // "config:N": the bit of `config` that makes a kprobe a return probe.
        let format = read("format/retprobe")?;
        let bit: u32 = format
            .trim()
            .strip_prefix("config:")
            .and_then(|b| b.parse().ok())
            .with_context(|| format!("{pmu}/format/retprobe reads {format:?}"))?;
        attr.config = 1 << bit;
    }
    let name = std::ffi::CString::new(function)?;
    attr.size = u32::try_from(size_of::<perf_event_attr>())?;
    attr.type_ = pmu_type;
    attr.__bindgen_anon_3.config1 = name.as_ptr() as u64;
    // SAFETY: a whole perf_event_attr, which lives through the call; pid -1 on CPU 0 is a
    // system-wide event.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            std::ptr::from_ref(&attr),
            -1,
            0,
            -1,
            libc::c_ulong::from(PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let fd = RawFd::try_from(fd).context("perf_event_open returned no fd")?;
    // SAFETY: a new fd the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn perf_ioctl(event: &OwnedFd, request: libc::c_ulong, arg: RawFd) -> Result<()> {
    // SAFETY: an ioctl of a perf event fd that takes an integer argument.
    if unsafe { libc::ioctl(event.as_raw_fd(), request, arg) } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: plain integers and arrays; all zero is every field's "unset".
    unsafe { std::mem::zeroed() }
}

/// The bpf(2) commands that return a new fd.
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> Result<OwnedFd> {
    let fd = sys_bpf(cmd, attr)?;
    let fd = RawFd::try_from(fd).context("bpf(2) returned no fd")?;
    // SAFETY: a new fd the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> Result<libc::c_long> {
    // SAFETY: `attr` is a whole bpf_attr, and its size is passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(ret)
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
