//! Single keys from the terminal for the live view: stdin without line buffering or echo while
//! a [`Keys`] lives (Ctrl-C still sends SIGINT, so the run ends with its summary), restored on
//! drop.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use tokio::io::{Interest, unix::AsyncFd};

/// Standard input, for `AsyncFd`.
struct Stdin;

impl AsRawFd for Stdin {
    fn as_raw_fd(&self) -> RawFd {
        libc::STDIN_FILENO
    }
}

/// Key presses on a terminal's stdin.
pub struct Keys {
    fd: AsyncFd<Stdin>,
    saved: libc::termios,
    saved_flags: libc::c_int,
    /// stdin reached its end: no more keys.
    closed: bool,
}

impl Keys {
    /// Takes single keys from stdin if it is a terminal; `None` otherwise (or if it cannot).
    pub fn open() -> Option<Self> {
        // SAFETY: isatty, tcgetattr, tcsetattr and fcntl on fd 0 with a termios we own; fd 0
        // stays open for the life of the process, past the AsyncFd registered on it.
        unsafe {
            if libc::isatty(libc::STDIN_FILENO) != 1 {
                return None;
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            raw.c_lflag &= !(libc::ICANON | libc::ECHO);
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            let saved_flags = libc::fcntl(libc::STDIN_FILENO, libc::F_GETFL);
            if saved_flags < 0 || libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) != 0 {
                return None;
            }
            libc::fcntl(
                libc::STDIN_FILENO,
                libc::F_SETFL,
                saved_flags | libc::O_NONBLOCK,
            );
            // fd 0 stays open for the life of the process, past this AsyncFd.
            let fd = AsyncFd::register_with_interest(Stdin, Interest::READABLE).ok()?;
            let keys = Self {
                fd,
                saved,
                saved_flags,
                closed: false,
            };
            Some(keys)
        }
    }

    /// The next key pressed; never returns once stdin is closed.
    pub async fn next(&mut self) -> u8 {
        loop {
            if self.closed {
                std::future::pending::<()>().await;
            }
            let Ok(mut guard) = self.fd.readable_mut().await else {
                self.closed = true;
                continue;
            };
            let mut byte = 0u8;
            // SAFETY: reading one byte into a local.
            let n = unsafe { libc::read(libc::STDIN_FILENO, (&raw mut byte).cast(), 1) };
            match n {
                1 => return byte,
                0 => self.closed = true,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock => {
                    guard.clear_ready();
                }
                _ => self.closed = true,
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        // SAFETY: restoring what `open` read from fd 0.
        unsafe {
            libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.saved);
            libc::fcntl(libc::STDIN_FILENO, libc::F_SETFL, self.saved_flags);
        }
    }
}

/// The next key if there are keys; never otherwise.
pub async fn next_key(keys: Option<&mut Keys>) -> u8 {
    match keys {
        Some(keys) => keys.next().await,
        None => std::future::pending().await,
    }
}
