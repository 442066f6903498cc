//! The errors that reach the user: one line naming the cause, a `hint:` line with the way out
//! when there is one, and the exit code (2 for usage, 1 for the environment).
use std::fmt;

/// `eprintln!` that never panics: with standard error closed (`2>&-`, or a pipe whose reader
/// left) the line is dropped, and the exit status is the one thing left to say.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use say;

/// What went wrong, from the user's point of view.
#[derive(Debug)]
pub enum Failure {
    /// The command line asked for something impossible (exit 2).
    Usage {
        message: String,
        hint: Option<String>,
    },
    /// The machine cannot do what was asked (exit 1).
    Environment {
        message: String,
        hint: Option<String>,
    },
}

impl Failure {
    pub fn usage(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::Usage {
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    pub fn environment(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::Environment {
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    /// An environment failure with no way out to suggest: it prints no `hint:` line.
    pub fn environment_without_hint(message: impl Into<String>) -> Self {
        Self::Environment {
            message: message.into(),
            hint: None,
        }
    }

    /// Standard output refused `what` (e.g. "the scan") with `e`.
    pub fn stdout(what: &str, e: &std::io::Error) -> Self {
        Self::environment(
            format!("cannot write {what}: {e}"),
            "check that standard output can be written",
        )
    }

    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Usage { .. } => 2,
            Self::Environment { .. } => 1,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (Self::Usage { message, hint } | Self::Environment { message, hint }) = self;
        write!(f, "error: {message}")?;
        match hint {
            Some(hint) => write!(f, "\nhint: {hint}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Failure {}

/// How a command ends when not with success: a failure for `main` to print, or an exit status
/// alone, whose meaning the command has shown (`doctor`'s diagnosis, an interrupted demo).
#[derive(Debug)]
pub enum Exit {
    Failed(Failure),
    Status(i32),
}

impl From<Failure> for Exit {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_is_a_second_line_only_when_there_is_one() {
        let hinted = Failure::usage("--x is bad", "give --y");
        assert_eq!(hinted.to_string(), "error: --x is bad\nhint: give --y");
        assert_eq!(hinted.exit_code(), 2);
        let bare = Failure::environment_without_hint("cannot handle signals: EINVAL");
        assert_eq!(bare.to_string(), "error: cannot handle signals: EINVAL");
        assert_eq!(bare.exit_code(), 1);
    }
}
