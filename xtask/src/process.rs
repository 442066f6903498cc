//! The child processes the host tasks (bench, advise-check) run: tied to xtask's life, signalled,
//! waited for with a deadline.
use anyhow::{Context as _, Result};
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

/// In a child before exec: receive `signal` when the spawning thread ends, so that a killed
/// xtask leaves no tracer attached and no busy loop behind.
pub fn die_with_parent(signal: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `sig` to our child `pid`.
pub fn signal(pid: u32, sig: libc::c_int) -> Result<()> {
    let pid = libc::pid_t::try_from(pid)?;
    // SAFETY: kill(2) with a pid of a child we have not reaped yet.
    if unsafe { libc::kill(pid, sig) } == -1 {
        return Err(std::io::Error::last_os_error()).context(format!("kill({pid}, {sig})"));
    }
    Ok(())
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(10));
    }
}
