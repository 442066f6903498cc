//! What /proc says about a process: its memory (with its BPF maps'), CPU time and open files.
use anyhow::{Context as _, Result};
use std::path::PathBuf;

/// A process's memory: resident set (now and peak) and its BPF maps' `memlock`, bytes.
pub struct Memory {
    pub rss: u64,
    pub peak_rss: u64,
    pub maps: u64,
}

impl Memory {
    pub fn of(pid: u32) -> Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib = |key: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| {
                    l.strip_prefix(key)?
                        .trim()
                        .strip_suffix("kB")?
                        .trim()
                        .parse()
                        .ok()
                })
                .map(|k: u64| k * 1024)
                .with_context(|| format!("no {key} in /proc/{pid}/status"))
        };
        let mut maps = 0;
        for (fd, target) in fds(pid)? {
            if target == "anon_inode:bpf-map" {
                let info =
                    std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
                maps += field(&info, "memlock")
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        Ok(Self {
            rss: kib("VmRSS:")?,
            peak_rss: kib("VmHWM:")?,
            maps,
        })
    }
}

/// user + system CPU time of `pid` so far, seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command name's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').context("/proc/PID/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(14) + ticks(15)) / hz)
}

/// `(fd, link target)` of every fd of `pid`.
pub fn fds(pid: u32) -> Result<Vec<(String, String)>> {
    let dir = PathBuf::from(format!("/proc/{pid}/fd"));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        if let Ok(target) = std::fs::read_link(entry.path()) {
            out.push((
                entry.file_name().to_string_lossy().into_owned(),
                target.to_string_lossy().into_owned(),
            ));
        }
    }
    Ok(out)
}

/// `name:\tvalue` of an fdinfo file.
pub fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}
