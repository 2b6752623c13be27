//! Opening a file of a dump for reading, as a regular file only: the
//! Parquet reader and the capture files both open through it.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

pub(crate) fn not_regular(path: &Path) -> Error {
    Error::format(
        path,
        "not a regular file (a FIFO, socket or device?); only regular files are read",
    )
}

/// Opens a dump file for reading. Only a regular file is read: a FIFO named
/// `part-*.parquet` would block the reader forever, a device would never
/// end. The open cannot block (`O_NONBLOCK`, which changes nothing for a
/// regular file), and the check is made on the opened file (`fstat`), so
/// nothing can be swapped in between.
pub fn open_regular(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let m = file.metadata().map_err(|e| Error::io(path, e))?;
    if !m.is_file() {
        return Err(not_regular(path));
    }
    Ok(file)
}
