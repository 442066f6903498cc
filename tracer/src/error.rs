//! The errors that reach the user: one line naming the cause, one `hint:` line with the way out,
//! and the exit code (2 for usage, 1 for the environment).
use std::fmt;

/// What went wrong, from the user's point of view.
#[derive(Debug)]
pub enum Failure {
    /// The command line asked for something impossible (exit 2).
    Usage { message: String, hint: String },
    /// The machine cannot do what was asked (exit 1).
    Environment { message: String, hint: String },
}

impl Failure {
    pub fn usage(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::Usage {
            message: message.into(),
            hint: hint.into(),
        }
    }

    pub fn environment(message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::Environment {
            message: message.into(),
            hint: hint.into(),
        }
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
        write!(f, "error: {message}\nhint: {hint}")
    }
}

impl std::error::Error for Failure {}
