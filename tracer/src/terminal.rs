//! The terminal while the live view owns it: raw mode (every key at once, Ctrl-C included, as a
//! key rather than SIGINT) and the alternate screen, drawn through ratatui; its key and resize
//! events ([`Keys`]) as a stream for the tokio loop, which hands them to the report. The terminal is given back on every way out: when the
//! [`Screen`] drops (the run's end, `q`, a signal, an error), and on a panic in a hook that runs
//! before the panic message is printed, so the message lands on the normal screen instead of
//! the alternate one that is about to be left.

use std::io::{self, Stdout};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use crossterm::{
    cursor::Show,
    event::{Event, EventStream},
    execute,
    terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
};
use futures_util::StreamExt as _;
use ratatui::{Frame, Terminal, backend::CrosstermBackend};

/// The terminal is in raw mode on the alternate screen: what [`restore`] undoes, once.
static TAKEN: AtomicBool = AtomicBool::new(false);
static PANIC_HOOK: Once = Once::new();

/// The terminal, taken for the live view until this drops.
pub struct Screen {
    /// First, so that it drops first: the terminal is back before anything else goes.
    _restore: Restore,
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Screen {
    /// Raw mode and the alternate screen; on an error, whatever was set is undone.
    pub fn open() -> io::Result<Self> {
        PANIC_HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        TAKEN.store(true, Ordering::SeqCst);
        let restore = Restore;
        enable_raw_mode()?;
        execute!(io::stdout(), EnterAlternateScreen)?;
        Ok(Self {
            terminal: Terminal::new(CrosstermBackend::new(io::stdout()))?,
            _restore: restore,
        })
    }

    /// Draws one frame at the terminal's current size.
    pub fn draw(&mut self, draw: impl FnOnce(&mut Frame)) -> io::Result<()> {
        self.terminal.draw(draw).map(drop)
    }
}

/// The terminal's key presses and resizes, while a [`Screen`] has it in raw mode.
#[derive(Default)]
pub struct Keys(EventStream);

impl Keys {
    /// The next key press or resize; never returns once the terminal's input has ended.
    pub async fn next(&mut self) -> io::Result<Event> {
        match self.0.next().await {
            Some(event) => event,
            None => std::future::pending().await,
        }
    }
}

/// Gives the terminal back when dropped.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves raw mode and the alternate screen, shows the cursor; only the first call after
/// [`Screen::open`] does anything, so a panic hook and a drop do not both leave the screen.
fn restore() {
    if TAKEN.swap(false, Ordering::SeqCst) {
        // Nothing to do about a terminal that cannot be written while giving it back.
        let _ = disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, Show);
    }
}
