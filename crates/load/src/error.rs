//! The loader's error: a dump that cannot be read, as one line.

use std::fmt;

/// Why a dump could not be read, as one line naming the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The message, on one line.
    pub message: String,
}

/// The loader's result.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `message`, its line breaks replaced by spaces (a message
    /// spread over lines reads badly after "opdump: ").
    pub fn new(message: impl Into<String>) -> Self {
        let m: String = message.into();
        Error {
            message: m.replace('\n', " "),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<opdump_format::Error> for Error {
    fn from(e: opdump_format::Error) -> Self {
        Error::new(e.to_string())
    }
}
