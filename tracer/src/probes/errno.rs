//! What the kernel answered when it refused: the errno under an aya error, found in its chain
//! of causes rather than in its text, and whether it means a missing privilege.
use std::{error::Error, io};

use aya::{maps::MapError, programs::ProgramError};

use crate::privileges::Capabilities;

/// Why the kernel refused, as far as its errno and this process's capabilities tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// EPERM, and this process lacks the capabilities tracing needs.
    Unprivileged,
    /// EPERM although the capabilities are there: something forbids it even for root.
    Forbidden,
    /// Another errno (EACCES and EINVAL come from the verifier's or the kernel's own checks),
    /// or none.
    Other,
}

impl Cause {
    pub fn of(errno: Option<i32>, caps: Capabilities) -> Self {
        match errno {
            Some(libc::EPERM) if !caps.can_trace() => Self::Unprivileged,
            Some(libc::EPERM) => Self::Forbidden,
            _ => Self::Other,
        }
    }
}

/// The errno of the failed syscall under `e`, at any depth (a map's creation under a load, a
/// syscall under a program error).
pub fn of(e: &(dyn Error + 'static)) -> Option<i32> {
    std::iter::successors(Some(e), |&e| e.source()).find_map(|e| io_error(e)?.raw_os_error())
}

/// `e` as an io::Error. aya's `#[error(transparent)]` variants wrap one whose `source()` skips
/// it, so they are looked into by name.
fn io_error<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a io::Error> {
    if let Some(io) = e.downcast_ref::<io::Error>() {
        return Some(io);
    }
    match (
        e.downcast_ref::<ProgramError>(),
        e.downcast_ref::<MapError>(),
    ) {
        (Some(ProgramError::IOError(io)), _) | (_, Some(MapError::IoError(io))) => Some(io),
        _ => None,
    }
}

/// `EPERM (Operation not permitted)`: the symbol and the C library's text.
pub fn describe(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    let text = text.split(" (os error").next().unwrap_or_default();
    format!("{} ({text})", name(errno))
}

/// The symbolic name of the errnos the bpf() syscall returns for tracing programs and maps.
fn name(errno: i32) -> String {
    match errno {
        libc::EPERM => "EPERM".to_owned(),
        libc::EACCES => "EACCES".to_owned(),
        libc::EINVAL => "EINVAL".to_owned(),
        libc::ENOENT => "ENOENT".to_owned(),
        libc::ESRCH => "ESRCH".to_owned(),
        libc::E2BIG => "E2BIG".to_owned(),
        libc::ENOMEM => "ENOMEM".to_owned(),
        libc::EOPNOTSUPP => "EOPNOTSUPP".to_owned(),
        // The kernel's internal ENOTSUPP, which it leaks for missing BPF trampoline support.
        524 => "ENOTSUPP".to_owned(),
        n => format!("errno {n}"),
    }
}

#[cfg(test)]
mod tests {
    use aya::{EbpfError, sys::SyscallError};

    use super::*;

    const NONE: Capabilities = Capabilities {
        effective: 0,
        initial_user_ns: true,
    };
    /// CAP_BPF and CAP_PERFMON, as `setcap cap_bpf,cap_perfmon+ep` grants.
    const BPF_PERFMON: Capabilities = Capabilities {
        effective: 1 << 39 | 1 << 38,
        initial_user_ns: true,
    };

    fn map_creation(errno: i32) -> EbpfError {
        EbpfError::MapError(MapError::CreateError {
            name: "CGROUP_FILTER".into(),
            io_error: io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn the_errno_is_found_under_every_wrapper() {
        assert_eq!(of(&map_creation(libc::EPERM)), Some(libc::EPERM));
        let syscall = ProgramError::SyscallError(SyscallError {
            call: "bpf_link_create",
            io_error: io::Error::from_raw_os_error(libc::EACCES),
        });
        assert_eq!(of(&syscall), Some(libc::EACCES));
        let transparent = EbpfError::ProgramError(ProgramError::IOError(
            io::Error::from_raw_os_error(libc::EINVAL),
        ));
        assert_eq!(of(&transparent), Some(libc::EINVAL));
        assert_eq!(of(&EbpfError::NoBTF), None);
        let not_os = EbpfError::MapError(MapError::IoError(io::Error::other("no errno")));
        assert_eq!(of(&not_os), None);
    }

    #[test]
    fn only_eperm_without_the_capabilities_is_a_missing_privilege() {
        let cause = |errno, caps| Cause::of(of(&map_creation(errno)), caps);
        assert_eq!(cause(libc::EPERM, NONE), Cause::Unprivileged);
        assert_eq!(cause(libc::EPERM, BPF_PERFMON), Cause::Forbidden);
        assert_eq!(cause(libc::EACCES, NONE), Cause::Other);
        assert_eq!(cause(libc::EINVAL, NONE), Cause::Other);
        assert_eq!(cause(libc::EACCES, BPF_PERFMON), Cause::Other);
        assert_eq!(Cause::of(None, NONE), Cause::Other);
    }

    #[test]
    fn an_errno_is_shown_with_its_symbol_and_text() {
        assert_eq!(describe(libc::EPERM), "EPERM (Operation not permitted)");
        assert_eq!(describe(libc::EACCES), "EACCES (Permission denied)");
        assert_eq!(describe(524), "ENOTSUPP (Unknown error 524)");
    }
}
