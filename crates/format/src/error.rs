//! One error type for reading and writing dump files.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum Error {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[cfg(feature = "parquet")]
    Parquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
    #[cfg(feature = "parquet")]
    Arrow(arrow_schema::ArrowError),
    /// The file is readable but is not a dump this version understands.
    Format { path: PathBuf, message: String },
    /// A directory holds no dump files.
    NoDump { path: PathBuf },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    #[cfg(feature = "parquet")]
    pub fn parquet(path: impl Into<PathBuf>, source: parquet::errors::ParquetError) -> Self {
        Error::Parquet {
            path: path.into(),
            source,
        }
    }
    pub fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Format {
            path: path.into(),
            message: message.into(),
        }
    }
    /// The OS error code behind an I/O failure (ENOSPC, EACCES, ...), if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            #[cfg(feature = "parquet")]
            Error::Parquet {
                source: parquet::errors::ParquetError::External(e),
                ..
            } => e
                .downcast_ref::<std::io::Error>()
                .and_then(|e| e.raw_os_error()),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {}", path.display(), source),
            #[cfg(feature = "parquet")]
            Error::Parquet { path, source } => write!(f, "{}: {}", path.display(), source),
            #[cfg(feature = "parquet")]
            Error::Arrow(e) => write!(f, "arrow: {e}"),
            Error::Format { path, message } => write!(f, "{}: {}", path.display(), message),
            Error::NoDump { path } => write!(
                f,
                "{}: no opdump files here (expected rank=<R>/device=<D>/part-*.parquet); name the OPDUMP_DIR of a run that recorded (OPDUMP=1 or torch.ops.opdump.enable())",
                path.display()
            ),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(feature = "parquet")]
impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Error::Arrow(e)
    }
}
