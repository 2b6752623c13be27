//! The one error type of the CLI: a usage or input problem, shown as one line
//! and exit status 2.

use std::fmt;

#[derive(Debug)]
pub struct CliError {
    pub message: String,
}

pub type Result<T> = std::result::Result<T, CliError>;

impl CliError {
    pub fn new(message: impl Into<String>) -> Self {
        // One line: a message spread over lines reads badly after "opdump: ".
        let m: String = message.into();
        CliError {
            message: m.replace('\n', " "),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

impl From<opdump_format::Error> for CliError {
    fn from(e: opdump_format::Error) -> Self {
        CliError::new(e.to_string())
    }
}

/// Shorthand for `Err(CliError::new(format!(...)))`.
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::error::CliError::new(format!($($t)*)))
    };
}
