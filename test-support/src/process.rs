//! A test's processes: killed and reaped on drop, and workloads started inside a cgroup (they
//! enter it before exec, so every thread they make is inside), optionally pinned to one CPU.
use std::{
    ffi::CString,
    fs,
    ops::{Deref, DerefMut},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Output},
};

use crate::Cgroup;

/// The directory of the programs the tests run: cargo builds them where it builds the test
/// binaries, one level up (`target/<profile>/deps/<test>` beside `target/<profile>/<program>`);
/// the VM guests keep that layout.
fn programs_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    deps.parent().unwrap_or(deps).to_owned()
}

/// The values of `key` (`map_id`, `recursion_misses`) in process `pid`'s open descriptors'
/// fdinfo, one per descriptor that has it: what the kernel says of its BPF maps and programs.
pub fn fdinfo_values(pid: u32, key: &str) -> Vec<u64> {
    let fds = fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fdinfo: {e}"));
    fds.filter_map(|fd| fs::read_to_string(fd.ok()?.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|n| n.trim().parse().ok())
        })
        .collect()
}

/// The tracer's binary, which cargo builds for the tracer's integration tests.
pub fn tracer_program() -> PathBuf {
    programs_dir().join("throttle-tracer")
}

/// `throttle-workload`, a crate of the workspace of its own so that installing the tracer does
/// not install it. Cargo builds it beside the tracer's binary when it tests both (`cargo test
/// -p tracer -p throttle-workload`, as `cargo xtask test` does).
pub fn workload() -> PathBuf {
    let path = programs_dir().join("throttle-workload");
    assert!(
        path.exists(),
        "{} is missing: test with `-p throttle-workload` too, or `cargo build -p throttle-workload`",
        path.display()
    );
    path
}

/// A child process that is killed and reaped when dropped, also when an assertion failed.
pub struct Running(Option<Child>);

impl Running {
    pub fn spawn(cmd: &mut Command) -> Self {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Self(Some(child))
    }

    /// SIGINT (how a user stops the tracer), then its exit status.
    pub fn interrupt(&mut self) -> ExitStatus {
        // SAFETY: signalling our own unreaped child by pid.
        unsafe { libc::kill(self.id() as i32, libc::SIGINT) };
        self.wait().expect("wait for the child")
    }

    pub fn wait_with_output(mut self) -> Output {
        let child = self.0.take().expect("a child");
        child.wait_with_output().expect("wait for the child")
    }

    /// The ids of its threads besides the main one (/proc/PID/task).
    pub fn thread_ids(&self) -> Vec<u32> {
        let pid = self.id();
        fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|task| task.file_name().to_str()?.parse().ok())
            .filter(|&tid| tid != pid)
            .collect()
    }

    /// How many threads besides the main one are running or runnable (state R in
    /// /proc/PID/task/TID/stat).
    pub fn running_threads(&self) -> usize {
        let pid = self.id();
        self.thread_ids()
            .into_iter()
            .filter(|tid| {
                // `tid (comm) S ...`: the state follows the comm's closing parenthesis.
                fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).is_ok_and(|stat| {
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('R'))
                })
            })
            .count()
    }
}

impl Deref for Running {
    type Target = Child;

    fn deref(&self) -> &Child {
        self.0.as_ref().expect("a child")
    }
}

impl DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("a child")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `throttle-workload busy`: `threads` spinning threads for `seconds` of wall time.
pub fn busy(threads: u32, seconds: u32) -> Command {
    let mut cmd = Command::new(workload());
    cmd.args(["busy", "--threads", &threads.to_string()])
        .args(["--seconds", &seconds.to_string()]);
    cmd
}

/// `throttle-workload held`: one spinning thread for `seconds` that prints its own
/// CLOCK_REALTIME around each time it was held, one `held ...` line each.
pub fn held(seconds: u32) -> Command {
    let mut cmd = Command::new(workload());
    cmd.args(["held", "--seconds", &seconds.to_string()]);
    cmd
}

/// `throttle-workload pair`: a thread `spinner` spinning and a thread `sleeper` sleeping for
/// `seconds`; prints `tids spinner T sleeper T'` once both run.
pub fn pair(seconds: u32) -> Command {
    let mut cmd = Command::new(workload());
    cmd.args(["pair", "--seconds", &seconds.to_string()]);
    cmd
}

/// `throttle-workload spiky`: after a `synced` line, `rounds` rounds `every_ms` apart (a
/// multiple of the period), each of `threads` threads burning `burn_ms` of its own CPU time;
/// one `round I start_ns A end_ns B cpu_ns C wall_ms W` line each (C: the round's CPU by the
/// process's clock; with `--usage-file`, also `group_ns G`: by the group's counter, from the
/// previous round's close (the first: from the sync) to just before the next round). It exits `every_ms` after the last round.
pub fn spiky(every_ms: u32, burn_ms: u32, rounds: u32, threads: u32) -> Command {
    let mut cmd = Command::new(workload());
    cmd.args(["spiky", "--every-ms", &every_ms.to_string()])
        .args(["--burn-ms", &burn_ms.to_string()])
        .args(["--rounds", &rounds.to_string()])
        .args(["--threads", &threads.to_string()]);
    cmd
}

/// `throttle-workload arrivals`: reference 003's lab, requests of `cost_ms` of CPU arriving at
/// random (Poisson, `rate` per second; the same seed, the same arrivals) for 4 workers over
/// `seconds`; one `request I arrival_ns A start_ns S end_ns E cpu_ns C marks T:c,...` line each.
pub fn arrivals(rate: u32, cost_ms: u32, seconds: u32, seed: u64) -> Command {
    let mut cmd = Command::new(workload());
    cmd.args(["arrivals", "--rate", &rate.to_string()])
        .args(["--cost-ms", &cost_ms.to_string()])
        .args(["--threads", "4", "--seconds", &seconds.to_string()])
        .args(["--seed", &seed.to_string()]);
    cmd
}

/// The machine's last CPU, where the tests pin what they throttle (as `taskset -c <last>`).
pub fn last_cpu() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) - 1
}

/// Every CPU of the machine but `cpu`: where the tests keep the tracer and themselves when the
/// work they judge is pinned to `cpu`, so that neither takes that CPU's time from it (under
/// emulation, where the two vCPUs take turns, milliseconds a period). All CPUs on a machine of
/// one.
fn all_but(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: a plain bit set, filled by the libc macros.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for other in (0..cpus).filter(|&c| c != cpu || cpus == 1) {
            libc::CPU_SET(other, &mut set);
        }
        set
    }
}

/// Runs `cmd` (and the threads it starts) on every CPU but `cpu`.
pub fn away_from(cmd: &mut Command, cpu: usize) -> &mut Command {
    let set = all_but(cpu);
    // SAFETY: sched_setaffinity between fork and exec, on a set prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Moves the calling thread to every CPU but `cpu` .
pub fn move_away_from(cpu: usize) {
    let set = all_but(cpu);
    // SAFETY: a whole cpu_set_t for the calling thread (0).
    let status = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(status, 0, "{}", std::io::Error::last_os_error());
}

/// Starts `cmd` inside `cgroup`, pinned to `cpu` if given (as `taskset -c cpu` would).
pub fn spawn_in(cmd: &mut Command, cgroup: &Cgroup, cpu: Option<usize>) -> Running {
    let procs: Vec<CString> = cgroup
        .procs_files()
        .map(|f| CString::new(f.into_os_string().into_encoded_bytes()).expect("a path"))
        .collect();
    // SAFETY: between fork and exec only async-signal-safe calls (open, write, close,
    // sched_setaffinity), on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            // Pinned before it joins: once in the cgroup it is throttled wherever it runs, and
            // a stop on the CPU it was forked on would be the test's too (a 7.2 guest: the
            // child throttled on CPU 0 under a 1 ms quota before it moved to its CPU).
            if let Some(cpu) = cpu {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for file in &procs {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                // Before close can overwrite errno.
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                if written != 2 {
                    return Err(error);
                }
            }
            Ok(())
        });
    }
    Running::spawn(cmd)
}

/// CAP_PERFMON and CAP_BPF (linux/capability.h): what deploy/daemonset.yaml grants.
pub const BPF_PERFMON: &[u32] = &[38, 39];

/// The same and CAP_SYS_ADMIN (21): what the README asks for the kprobe backend, whose perf
/// events Debian's kernels refuse to CAP_BPF + CAP_PERFMON alone (EACCES: their
/// perf_event_paranoid 3 wants CAP_SYS_ADMIN; doctor.rs's every-kernel test shows it).
pub const BPF_PERFMON_SYS_ADMIN: &[u32] = &[21, 38, 39];

/// A command that runs `bin` as nobody with CAP_BPF and CAP_PERFMON only, what
/// deploy/daemonset.yaml grants: [`least_privileged`].
pub fn with_bpf_perfmon_only(bin: &str) -> Command {
    least_privileged(Command::new(bin), BPF_PERFMON)
}

/// `cmd`, made to run as nobody with the capabilities `keep` only, after what its earlier
/// pre_exec closures do, and with no locked-memory limit, as containerd and Docker start a
/// container: before 5.11 the kernel charges BPF maps to RLIMIT_MEMLOCK (the 5.10 guest's
/// default refused the first map), which the manifest leaves to the runtime.
pub fn least_privileged(mut cmd: Command, keep: &'static [u32]) -> Command {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: one system call between fork and exec, before drop_on_exec's closure drops the
    // capability (CAP_SYS_RESOURCE) that raising the hard limit needs. Where even root lacks it
    // (this host's sandbox) the limit stays: the kernels there (5.11+) do not charge maps to it.
    unsafe {
        cmd.pre_exec(move || {
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited);
            Ok(())
        })
    };
    drop_on_exec(cmd, keep)
}

/// A command that runs `bin` as nobody (uid and gid 65534, no supplementary groups) with the
/// capabilities `keep` alone in its bounding, inheritable and ambient sets, so that they
/// survive the exec: what util-linux's `setpriv --reuid --regid --clear-groups --inh-caps
/// --ambient-caps --bounding-set` does, done here because the VM guests' busybox setpriv
/// cannot change uid.
pub fn as_nobody(bin: &str, keep: &'static [u32]) -> Command {
    drop_on_exec(Command::new(bin), keep)
}

/// `cmd`, made to drop to nobody with `keep` after what its earlier pre_exec closures do.
fn drop_on_exec(mut cmd: Command, keep: &'static [u32]) -> Command {
    let last: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("/proc/sys/kernel/cap_last_cap");
    // SAFETY: between fork and exec the closure makes system calls only: no allocation, no
    // lock.
    unsafe { cmd.pre_exec(move || drop_to_nobody(keep, last)) };
    cmd
}

/// capset(2)'s header and data, version 3 (two 32-bit words per set).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

pub const NOBODY: libc::uid_t = 65534;

fn drop_to_nobody(keep: &[u32], last: u32) -> std::io::Result<()> {
    let ok = |r: libc::c_long| {
        if r == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY (every call below): system calls with plain values or pointers to locals.
    unsafe {
        // Dropping from the bounding set needs CAP_SETPCAP, which root still has here.
        for cap in (0..=last).filter(|c| !keep.contains(c)) {
            ok(libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0).into())?;
        }
        ok(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0).into())?;
        ok(libc::setgroups(0, std::ptr::null()).into())?;
        ok(libc::setresgid(NOBODY, NOBODY, NOBODY).into())?;
        ok(libc::setresuid(NOBODY, NOBODY, NOBODY).into())?;
        let mask: u64 = keep.iter().fold(0, |m, c| m | 1 << c);
        let word = |shift: u32| {
            let w = (mask >> shift) as u32;
            CapData {
                effective: w,
                permitted: w,
                inheritable: w,
            }
        };
        let header = CapHeader {
            version: 0x2008_0522,
            pid: 0,
        };
        let data = [word(0), word(32)];
        ok(libc::syscall(libc::SYS_capset, &header, data.as_ptr()))?;
        for &cap in keep {
            ok(libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            )
            .into())?;
        }
    }
    Ok(())
}

/// A child's stdout lines, read on a thread of their own (until the pipe closes or the
/// receiver is dropped), so that a test can wait for a line with a time limit.
pub fn stdout_lines(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    use std::io::{BufRead as _, BufReader};
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// The tracer `child`'s stdout lines ([`stdout_lines`]), once its first line (the NDJSON
/// `start` line, returned parsed) has come.
pub fn ndjson_lines(child: &mut Running) -> (serde_json::Value, std::sync::mpsc::Receiver<String>) {
    let lines = stdout_lines(child.stdout.take().expect("tracer stdout"));
    // A guard against hanging forever, not a timing assertion.
    let first = lines
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the tracer printed nothing (see its stderr above)");
    let start: serde_json::Value = serde_json::from_str(&first).expect("first line is JSON");
    assert_eq!(start["type"], "start", "{first}");
    (start, lines)
}
