//! Creating report files (`--out DIR`, `--html FILE`) safely.
//!
//! A report path often lies in a shared directory (`/tmp/rep`), where
//! anyone may have planted `compare.json -> ~victim/precious.txt`. Opening
//! the path for writing would follow the link and overwrite the victim's
//! file. So every report is written to a new temporary file beside the
//! target, created with `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600 (never
//! an existing file, never through a link), and then renamed over the
//! target: `rename` replaces a symlink at the target path itself, never
//! what it points to. Reports hold the run's op names and statistics, so
//! they are readable by their owner only; directories created for them get
//! mode 0700. A directory the user names is used as it is (followed if it
//! is a link, its mode left alone): the user chose it.

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{CliError, Result};

/// Mode of report files.
pub const FILE_MODE: u32 = 0o600;
/// Mode of directories created for reports.
pub const DIR_MODE: u32 = 0o700;

fn io_err(path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError::new(format!("{}: {e}", path.display()))
}

/// Creates `dir` and its missing parents with mode 0700; an existing
/// directory is fine, anything else there is an error.
pub fn create_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => return Err(io_err(dir, "exists and is not a directory")),
        Err(_) => {}
    }
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| io_err(dir, e))
}

/// A new temporary file in `dir`, created exclusively (never an existing
/// file, never through a symlink), mode 0600.
fn create_temp(dir: &Path, name: &str) -> Result<(File, PathBuf)> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for attempt in 0u32..64 {
        let tmp = dir.join(format!(
            ".{name}.{}.{nanos:x}.{attempt}.tmp",
            std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(&tmp, e)),
        }
    }
    Err(io_err(dir, "cannot create a temporary file"))
}

/// Writes the file `path` through `fill`, atomically: readers see the old
/// file or the whole new one, and a symlink at `path` is replaced, not
/// followed. On failure the temporary file is removed and `path` is left
/// as it was.
pub fn write_file(path: &Path, fill: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io_err(path, "not a file name"))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (mut file, tmp) = create_temp(dir, name)?;
    let r = fill(&mut file)
        .and_then(|()| file.sync_all().map_err(|e| io_err(path, e)))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| io_err(path, e)));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// [`write_file`] with a whole buffer.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    write_file(path, |f| f.write_all(bytes).map_err(|e| io_err(path, e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_a_symlink_and_is_private() {
        let t = tempfile::tempdir().unwrap();
        let precious = t.path().join("precious.txt");
        std::fs::write(&precious, b"keep me").unwrap();
        let target = t.path().join("report.json");
        std::os::unix::fs::symlink(&precious, &target).unwrap();
        write_bytes(&target, b"{}").unwrap();
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
        let m = std::fs::symlink_metadata(&target).unwrap();
        assert!(m.file_type().is_file());
        assert_eq!(m.permissions().mode() & 0o777, FILE_MODE);
        assert_eq!(std::fs::read(&target).unwrap(), b"{}");
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn failure_leaves_no_temp_file() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("x.json");
        let r = write_file(&target, |_| Err(CliError::new("boom")));
        assert!(r.is_err());
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }
}
