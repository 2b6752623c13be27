//! Creating report files (`--out DIR`, `--html FILE`, repro's folder) safely.
//!
//! A report path often lies in a shared directory (`/tmp/rep`), where
//! anyone may have planted `compare.json -> ~victim/precious.txt`. Opening
//! the path for writing would follow the link and overwrite the victim's
//! file. So a report is written to a new temporary file beside the target,
//! created with `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600 (never an
//! existing file, never through a link), and then renamed over the target:
//! `rename` replaces a symlink at the target path itself, never what it
//! points to. Reports hold the run's op names and statistics, so they are
//! readable by their owner only; directories created for them get mode
//! 0700. A directory the user names is used as it is (followed if it is a
//! link, its mode left alone): the user chose it.
//!
//! Renaming over a target that is not a regular file would replace it: a
//! device node (`/dev/full`), a FIFO a reader waits on, `/dev/stdout`. Such
//! a target, when the user named it (`--html FILE`), is written in place
//! instead, the way a shell's `>` would, or refused with one line where
//! writing makes no sense (a directory, a socket) or would destroy data (a
//! block device). A symlink is followed only to such a node, and only where
//! the kernel's `fs.protected_symlinks` would follow it in a sticky
//! directory: when its owner is the user or the owner of the directory that
//! holds it (`/dev/stdout`, a link the user made). A link to a regular file
//! is replaced, whoever made it (unless it is the process's own stdout, as
//! `--html /dev/stdout > page.html` makes it): the owner of the folder that
//! holds it may be whoever planted it, and a job of the user's own (often
//! root's) may have made it; following it would let the link choose which
//! file a report overwrites. A file opdump names itself inside a folder
//! (repro's files, `compare.json`) is always a new file renamed into place,
//! whatever is there ([`write_bytes_in`], [`write_file_in`]).

use std::fs::{DirBuilder, File, Metadata, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::app::error::{CliError, Result};

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

/// How a report path is written, from what is there now.
enum Target {
    /// Nothing, a regular file, or a link not to be followed: a new file
    /// renamed over the path.
    Replace,
    /// An existing node that is not a regular file, or whatever a trusted
    /// link points to: opened where it is. The node's metadata, to check
    /// that the file opened is the one judged.
    InPlace { node: Metadata, follow: bool },
}

/// Decides how to write `path` (see the module's comment); a target that
/// cannot take a report is an error.
fn target(path: &Path) -> Result<Target> {
    // Missing, or unreadable: the temporary file's creation says why.
    let Ok(here) = std::fs::symlink_metadata(path) else {
        return Ok(Target::Replace);
    };
    let kind = here.file_type();
    if kind.is_file() {
        return Ok(Target::Replace);
    }
    if !kind.is_symlink() {
        return writable_node(path, here, false);
    }
    if !trusted_link(path, &here) {
        return Ok(Target::Replace);
    }
    match std::fs::metadata(path) {
        // A link to a regular file is never written through: that file may
        // be anyone's (see the module's comment). Our own stdout is the
        // exception: the shell redirected it there.
        Ok(pointed) if pointed.is_file() && stdout_if_it_is(&pointed).is_none() => {
            Ok(Target::Replace)
        }
        Ok(pointed) => writable_node(path, pointed, true),
        // A dangling link: nothing to write through to.
        Err(_) => Ok(Target::Replace),
    }
}

/// The `fs.protected_symlinks` rule: a link may be followed when its owner
/// is the user or the owner of the directory that holds it.
fn trusted_link(path: &Path, link: &Metadata) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    link.uid() == euid || std::fs::metadata(parent(path)).is_ok_and(|dir| dir.uid() == link.uid())
}

/// An existing `node` written in place, or the line that says why not.
fn writable_node(path: &Path, node: Metadata, follow: bool) -> Result<Target> {
    let kind = node.file_type();
    if kind.is_dir() {
        return Err(io_err(path, "is a directory; name a file for the report"));
    }
    if kind.is_socket() {
        return Err(io_err(
            path,
            "is a socket; a report is written to a file, a device or a FIFO",
        ));
    }
    if kind.is_block_device() {
        return Err(io_err(
            path,
            "is a block device; opdump does not write a report over a disk",
        ));
    }
    Ok(Target::InPlace { node, follow })
}

/// The directory that holds `path`.
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes the file `path` through `fill`. A regular file (or none) is
/// written atomically: readers see the old file or the whole new one, a
/// symlink at `path` that is not trusted is replaced, not followed, and on
/// failure the temporary file is removed and `path` is left as it was. A
/// device, a FIFO or a trusted link's target is written in place; a
/// directory, a socket or a block device is refused (see the module's
/// comment).
pub fn write_file(path: &Path, fill: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    match target(path)? {
        Target::Replace => replace(path, fill),
        Target::InPlace { node, follow } => write_in_place(path, &node, follow, fill),
    }
}

/// Writes a new file beside `path` and renames it over `path`.
fn replace(path: &Path, fill: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io_err(path, "not a file name"))?;
    let (mut file, tmp) = create_temp(parent(path), name)?;
    let r = fill(&mut file)
        .and_then(|()| file.sync_all().map_err(|e| io_err(path, e)))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| io_err(path, e)));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Opens the existing `node` at `path` (through the link when `follow`)
/// and writes it there; a regular file is emptied first, as `>` does. The
/// process's own stdout (`/dev/stdout`) is written through its descriptor
/// instead, so that the report and what the command prints after it land
/// one after the other in a file the shell redirected stdout to.
fn write_in_place(
    path: &Path,
    node: &Metadata,
    follow: bool,
    fill: impl FnOnce(&mut File) -> Result<()>,
) -> Result<()> {
    if let Some(mut stdout) = stdout_if_it_is(node) {
        return fill(&mut stdout);
    }
    let no_follow = if follow { 0 } else { libc::O_NOFOLLOW };
    // No O_CREAT: the node exists; no O_TRUNC before the check below.
    let mut file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY | no_follow)
        .open(path)
        .map_err(|e| io_err(path, e))?;
    let opened = file.metadata().map_err(|e| io_err(path, e))?;
    // Whatever was swapped in at the path since it was judged is not written.
    if (opened.dev(), opened.ino()) != (node.dev(), node.ino()) {
        return Err(io_err(path, "changed while it was opened; not written"));
    }
    let regular = opened.file_type().is_file();
    if regular {
        file.set_len(0).map_err(|e| io_err(path, e))?;
    }
    fill(&mut file)?;
    // fsync fails on a pipe (EINVAL) and means nothing on a device.
    if regular {
        file.sync_all().map_err(|e| io_err(path, e))?;
    }
    Ok(())
}

/// A duplicate of the process's stdout descriptor when it writes `node`.
fn stdout_if_it_is(node: &Metadata) -> Option<File> {
    use std::os::fd::AsFd;
    let stdout = File::from(std::io::stdout().as_fd().try_clone_to_owned().ok()?);
    let m = stdout.metadata().ok()?;
    ((m.dev(), m.ino()) == (node.dev(), node.ino())).then_some(stdout)
}

/// [`write_file`] with a whole buffer.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    write_file(path, |f| f.write_all(bytes).map_err(|e| io_err(path, e)))
}

/// Writes the file `name` that opdump names inside `dir` (repro's files,
/// `compare.json`) through `fill`: always a new file renamed into place.
/// Whatever is at that name was not named by the user, so it is replaced,
/// never followed or written in place, be it a link, a FIFO or a device.
pub fn write_file_in(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut File) -> Result<()>,
) -> Result<PathBuf> {
    let path = dir.join(name);
    replace(&path, fill)?;
    Ok(path)
}

/// [`write_file_in`] with a whole buffer.
pub fn write_bytes_in(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    use std::io::Write;
    let path = dir.join(name);
    write_file_in(dir, name, |f| {
        f.write_all(bytes).map_err(|e| io_err(&path, e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;

    /// The uid of `nobody`, the other user of the root-only tests.
    const OTHER_UID: u32 = 65534;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    fn c_path(p: &Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    /// Gives the link itself (not what it points to) to `uid`.
    fn lchown(p: &Path, uid: u32) {
        // SAFETY: a valid NUL-terminated path; -1 leaves the group alone.
        let rc = unsafe { libc::lchown(c_path(p).as_ptr(), uid, u32::MAX) };
        assert_eq!(rc, 0, "lchown {}", p.display());
    }

    /// Reads `path` to its end on a thread; the bytes come on the channel.
    fn read_in_thread(path: &Path) -> std::sync::mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = path.to_path_buf();
        std::thread::spawn(move || tx.send(std::fs::read(path).unwrap()));
        rx
    }

    fn names_in(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn a_planted_link_is_replaced_and_the_file_is_private() {
        if !is_root() {
            eprintln!("skipped: making a link owned by another user needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        // A shared directory: world-writable and sticky, as /tmp.
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let precious = t.path().join("precious.txt");
        std::fs::write(&precious, b"keep me").unwrap();
        let target = t.path().join("report.json");
        std::os::unix::fs::symlink(&precious, &target).unwrap();
        lchown(&target, OTHER_UID);
        write_bytes(&target, b"{}").unwrap();
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
        let m = std::fs::symlink_metadata(&target).unwrap();
        assert!(m.file_type().is_file());
        assert_eq!(m.permissions().mode() & 0o777, FILE_MODE);
        assert_eq!(std::fs::read(&target).unwrap(), b"{}");
        // No temporary file left behind.
        assert_eq!(names_in(t.path()), 2);
    }

    /// A link of the user's own to a regular file is replaced, not
    /// followed: it may have been planted by a job of the same user (the
    /// probe of issue 44, as root, found repro's files written through).
    #[test]
    fn a_link_of_the_user_to_a_file_is_replaced() {
        let t = tempfile::tempdir().unwrap();
        let other = t.path().join("other.txt");
        std::fs::write(&other, b"keep me").unwrap();
        let target = t.path().join("report.json");
        std::os::unix::fs::symlink(&other, &target).unwrap();
        write_bytes(&target, b"{}").unwrap();
        assert_eq!(std::fs::read(&other).unwrap(), b"keep me");
        assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
        assert_eq!(std::fs::read(&target).unwrap(), b"{}");
        assert_eq!(names_in(t.path()), 2);
    }

    #[test]
    fn a_link_of_the_directory_owner_to_a_file_is_replaced() {
        if !is_root() {
            eprintln!("skipped: giving a directory to another user needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let theirs = t.path().join("theirs.json");
        std::fs::write(&theirs, b"old").unwrap();
        let dir = t.path().join("shared");
        std::fs::create_dir(&dir).unwrap();
        let target = dir.join("report.json");
        std::os::unix::fs::symlink(&theirs, &target).unwrap();
        lchown(&target, OTHER_UID);
        lchown(&dir, OTHER_UID);
        write_bytes(&target, b"{}").unwrap();
        assert_eq!(std::fs::read(&theirs).unwrap(), b"old");
        assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
    }

    /// A link of the user's own to a FIFO (as `/dev/stdout` is to a pipe)
    /// is still written through.
    #[test]
    fn a_link_of_the_user_to_a_fifo_is_written_through() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("page.fifo");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);
        let target = t.path().join("page.html");
        std::os::unix::fs::symlink(&fifo, &target).unwrap();
        let read = read_in_thread(&fifo);
        write_bytes(&target, b"<html>").unwrap();
        let got = read.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got.expect("the reader got nothing"), b"<html>");
        assert!(std::fs::symlink_metadata(&target)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    /// A file opdump names in a folder replaces whatever is at its name:
    /// a link of the user's own, or a FIFO that would block the write.
    #[test]
    fn a_file_named_by_opdump_replaces_links_and_fifos() {
        let t = tempfile::tempdir().unwrap();
        let other = t.path().join("other.txt");
        std::fs::write(&other, b"keep me").unwrap();
        let out = t.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&other, out.join("call.json")).unwrap();
        let fifo = out.join("repro.py");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);
        write_bytes_in(&out, "call.json", b"{}").unwrap();
        write_bytes_in(&out, "repro.py", b"print()").unwrap();
        assert_eq!(std::fs::read(&other).unwrap(), b"keep me");
        for (name, bytes) in [("call.json", &b"{}"[..]), ("repro.py", b"print()")] {
            let p = out.join(name);
            assert!(std::fs::symlink_metadata(&p).unwrap().is_file(), "{name}");
            assert_eq!(std::fs::read(&p).unwrap(), bytes);
        }
        assert_eq!(names_in(&out), 2);
    }

    #[test]
    fn a_dangling_link_is_replaced() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("report.json");
        std::os::unix::fs::symlink(t.path().join("missing"), &target).unwrap();
        write_bytes(&target, b"{}").unwrap();
        assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
        assert!(!t.path().join("missing").exists());
    }

    #[test]
    fn a_fifo_is_written_in_place() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("page.fifo");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);
        let read = read_in_thread(&fifo);
        write_bytes(&fifo, b"<html>").unwrap();
        // A FIFO replaced instead of written leaves the reader waiting:
        // a failure, not a hang.
        let got = read.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got.expect("the reader got nothing"), b"<html>");
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        assert_eq!(names_in(t.path()), 1);
    }

    #[test]
    fn a_char_device_stays_a_device() {
        if !is_root() {
            eprintln!("skipped: mknod needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let node = t.path().join("null");
        // SAFETY: a valid NUL-terminated path; the numbers of /dev/null.
        let rc = unsafe {
            libc::mknod(
                c_path(&node).as_ptr(),
                libc::S_IFCHR | 0o600,
                libc::makedev(1, 3),
            )
        };
        assert_eq!(rc, 0);
        write_bytes(&node, b"<html>").unwrap();
        let m = std::fs::symlink_metadata(&node).unwrap();
        assert!(m.file_type().is_char_device());
        assert_eq!(m.rdev(), libc::makedev(1, 3));
        assert_eq!(names_in(t.path()), 1);
    }

    #[test]
    fn a_directory_or_a_socket_is_refused_in_one_line() {
        let t = tempfile::tempdir().unwrap();
        let err = write_bytes(t.path(), b"{}").unwrap_err();
        assert!(err.message.contains("is a directory"), "{err}");
        let sock = t.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let err = write_bytes(&sock, b"{}").unwrap_err();
        assert!(err.message.contains("is a socket"), "{err}");
        assert!(!err.message.contains('\n'));
        assert!(std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket());
        assert_eq!(names_in(t.path()), 1);
    }

    #[test]
    fn failure_leaves_no_temp_file() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("x.json");
        let r = write_file(&target, |_| Err(CliError::new("boom")));
        assert!(r.is_err());
        assert_eq!(names_in(t.path()), 0);
    }
}
