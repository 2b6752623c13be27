//! Descriptors that notice when they stop being opdump's, directories
//! opdump may trust with a dump, and a file-size limit that fails a write
//! instead of killing the job ([`block_file_size_signal`]).
//!
//! opdump lives inside a job it does not control. A daemon-style job closes
//! every inherited descriptor (`os.closerange(3, 4096)`) and then opens files
//! of its own, which get the numbers opdump's descriptors had. Writing to, or
//! closing, such a number would write into, or close, the job's file. So every
//! descriptor opdump keeps is a [`GuardedFd`]: it remembers what it opened
//! (`st_dev`, `st_ino`), checks that with `fstat` before each use, and once the
//! check fails it never uses the number again, not even to close it.
//!
//! The check and the use are two system calls: a job that closes and reopens
//! descriptors on another thread in between is not caught. It narrows the
//! window to a few microseconds; nothing in user space can close it.
//!
//! Directory policy (see [`open_dump_root`] and [`enter_dir`]):
//! - `OPDUMP_DIR` is opened once, following the path the user gave (links in
//!   it included: that path is the user's choice), and then judged by what was
//!   opened: it must be a directory owned by the effective uid, and not
//!   writable by group or others unless `OPDUMP_FILE_MODE` grants them that or
//!   it has the sticky bit (as `/tmp` does: others may add entries but not
//!   rename or remove ours).
//! - Every level below it (`rank=<R>`, `device=<D>`) is created and opened
//!   relative to the parent's descriptor with `O_NOFOLLOW`, never through a
//!   symbolic link, and judged by the same rule. Files are created with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW` and published with `renameat`.
//! - The ancestors of `OPDUMP_DIR` (`/tmp`, `/home/me`, a shared scratch
//!   directory) are not judged: refusing a world-writable sticky `/tmp` or a
//!   group-writable project directory would refuse common set-ups, and once
//!   `OPDUMP_DIR` is open, renaming an ancestor no longer moves where files go.

use std::ffi::{CStr, CString};
use std::fmt;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};

/// What a descriptor or a name refers to: `(st_dev, st_ino)`. Unique while
/// the file exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    dev: u64,
    ino: u64,
}

impl Identity {
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    fn of(st: &libc::stat) -> Identity {
        Identity {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        }
    }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: fstat writes into the zeroed struct we own; a bad fd is an error.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) == 0 {
            Ok(st)
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// `fstatat` of `name` in `dir`, not following a symbolic link.
fn stat_name(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: a valid C string and a struct we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 {
            Ok(st)
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// The result of a system call that returns -1 and sets errno on failure.
fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A file name for the `*at` calls. Names opdump makes never hold a NUL.
pub fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a file name holds a NUL byte"))
}

/// The error of a descriptor that is no longer opdump's.
#[derive(Debug)]
pub struct DescriptorLost {
    fd: RawFd,
}

impl fmt::Display for DescriptorLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "descriptor {} no longer refers to the file opdump opened (the job closed it, e.g. with \
             os.closerange, and may have reused the number); opdump neither writes to nor closes it",
            self.fd
        )
    }
}

impl std::error::Error for DescriptorLost {}

/// A descriptor opdump opened, with the identity of what it opened.
#[derive(Debug)]
pub struct GuardedFd {
    fd: RawFd,
    id: Identity,
    /// The check failed once: the number may be the job's now.
    lost: bool,
}

impl GuardedFd {
    /// Takes ownership of `fd`, just returned by open/openat.
    fn adopt(fd: RawFd) -> io::Result<GuardedFd> {
        match fstat(fd) {
            Ok(st) => Ok(GuardedFd {
                fd,
                id: Identity::of(&st),
                lost: false,
            }),
            Err(e) => {
                // SAFETY: fd was opened by our caller a moment ago and is ours.
                unsafe { libc::close(fd) };
                Err(e)
            }
        }
    }

    pub fn identity(&self) -> Identity {
        self.id
    }

    /// The descriptor, after checking that it still refers to what opdump
    /// opened. Once a check fails, every later one fails too.
    pub fn check(&mut self) -> io::Result<RawFd> {
        if !self.lost {
            match fstat(self.fd) {
                Ok(st) if Identity::of(&st) == self.id => return Ok(self.fd),
                _ => self.lost = true,
            }
        }
        Err(io::Error::other(DescriptorLost { fd: self.fd }))
    }

    /// The check failed once: this descriptor is never used again.
    pub fn is_lost(&self) -> bool {
        self.lost
    }
}

impl Drop for GuardedFd {
    /// Closes the descriptor only while it is still opdump's: closing a
    /// number the job reused would close the job's file.
    fn drop(&mut self) {
        if self.check().is_ok() {
            // SAFETY: the descriptor is ours (checked just now) and dropped once.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// A file opdump writes, through a descriptor checked before every write.
/// After a failed check it refuses every write and is never closed.
#[derive(Debug)]
pub struct CheckedFile {
    fd: GuardedFd,
}

impl CheckedFile {
    /// Creates `name` in `dir` (`O_CREAT|O_EXCL|O_NOFOLLOW`): never opens an
    /// existing file or follows a link.
    pub fn create_new(dir: &mut GuardedFd, name: &CStr, mode: u32) -> io::Result<CheckedFile> {
        let dirfd = dir.check()?;
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a checked directory descriptor and a valid C string.
        let fd = cvt(unsafe { libc::openat(dirfd, name.as_ptr(), flags, mode as libc::c_uint) })?;
        Ok(CheckedFile {
            fd: GuardedFd::adopt(fd)?,
        })
    }

    pub fn identity(&self) -> Identity {
        self.fd.identity()
    }

    pub fn guard(&mut self) -> &mut GuardedFd {
        &mut self.fd
    }
}

impl Write for CheckedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let fd = self.fd.check()?;
        // SAFETY: a checked descriptor and a buffer of buf.len() bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Checks that `name` in `dir` is the file `id` (and not a link or another
/// file put in its place).
pub fn name_is(dir: &mut GuardedFd, name: &CStr, id: Identity) -> io::Result<bool> {
    let dirfd = dir.check()?;
    match stat_name(dirfd, name) {
        Ok(st) => Ok(Identity::of(&st) == id),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether `name` exists in `dir` (as anything, links included).
pub fn name_exists(dir: &mut GuardedFd, name: &CStr) -> io::Result<bool> {
    let dirfd = dir.check()?;
    match stat_name(dirfd, name) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes the complete file `file`, now named `from` in `dir`, visible as
/// `to`: only while the descriptor and the name both still refer to the file
/// opdump wrote, and never over an existing `to`.
pub fn publish(
    dir: &mut GuardedFd,
    file: &mut CheckedFile,
    from: &CStr,
    to: &CStr,
) -> io::Result<()> {
    let id = file.identity();
    file.guard().check()?;
    if !name_is(dir, from, id)? {
        return Err(io::Error::other(format!(
            "{} is no longer the file opdump wrote (removed or replaced); it is not published",
            from.to_string_lossy()
        )));
    }
    let dirfd = dir.check()?;
    rename_noreplace(dirfd, from, to)
}

#[cfg(target_os = "linux")]
fn rename_noreplace(dir: RawFd, from: &CStr, to: &CStr) -> io::Result<()> {
    // SAFETY: renameat2 with valid C strings and a checked descriptor.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            dir,
            from.as_ptr(),
            dir,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // A file system or kernel without RENAME_NOREPLACE: the name was free
        // when the file was opened (see RotatingWriter::open).
        Some(libc::EINVAL | libc::ENOSYS) => rename_plain(dir, from, to),
        _ => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn rename_noreplace(dir: RawFd, from: &CStr, to: &CStr) -> io::Result<()> {
    rename_plain(dir, from, to)
}

fn rename_plain(dir: RawFd, from: &CStr, to: &CStr) -> io::Result<()> {
    // SAFETY: renameat with valid C strings and a checked descriptor.
    cvt(unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) }).map(|_| ())
}

/// Removes `name` from `dir` if it is still the file `id`. Best effort.
pub fn remove_if(dir: &mut GuardedFd, name: &CStr, id: Identity) -> io::Result<()> {
    if name_is(dir, name, id)? {
        let dirfd = dir.check()?;
        // SAFETY: a checked directory descriptor and a valid C string.
        cvt(unsafe { libc::unlinkat(dirfd, name.as_ptr(), 0) })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Directories
// ---------------------------------------------------------------------------

/// Why a directory is not trusted with a dump. Each names the fix.
#[derive(Debug)]
pub enum DirProblem {
    NotDirectory,
    Link,
    OwnedByOther { uid: u32, euid: u32 },
    WritableByOthers { mode: u32 },
    NotWritable,
    CannotCreate(io::Error),
    CannotOpen(io::Error),
}

impl fmt::Display for DirProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirProblem::NotDirectory => write!(f, "is not a directory; set OPDUMP_DIR to a writable directory"),
            DirProblem::Link => write!(
                f,
                "is a symbolic link, which opdump never follows inside OPDUMP_DIR; remove it, or use another OPDUMP_DIR"
            ),
            DirProblem::OwnedByOther { uid, euid } => write!(
                f,
                "is owned by another user (uid {uid}, this process runs as uid {euid}), who could read or \
                 replace the dump; use a directory you own"
            ),
            DirProblem::WritableByOthers { mode } => write!(
                f,
                "is writable by other users (mode {mode:04o}, no sticky bit), who could read or replace \
                 the dump; use a directory only you can write, or chmod g-w,o-w it"
            ),
            DirProblem::NotWritable => write!(f, "is not writable; set OPDUMP_DIR to a writable directory"),
            DirProblem::CannotCreate(e) => {
                write!(f, "cannot be created ({e}); set OPDUMP_DIR to a writable directory")
            }
            DirProblem::CannotOpen(e) => write!(f, "cannot be opened ({e}); set OPDUMP_DIR to a writable directory"),
        }
    }
}

/// A directory refused, with the path it was reached by.
#[derive(Debug)]
pub struct DirRefused {
    pub path: PathBuf,
    pub problem: DirProblem,
}

impl fmt::Display for DirRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.path.display(), self.problem)
    }
}

impl std::error::Error for DirRefused {}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The group and other write bits a directory may have: those
/// `OPDUMP_FILE_MODE` grants (its directory mode), none by default.
fn allowed_write(dir_mode: u32) -> u32 {
    dir_mode & 0o022
}

/// Judges an opened directory by its owner and mode (see the module notes).
fn judge(st: &libc::stat, dir_mode: u32) -> Result<(), DirProblem> {
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(DirProblem::NotDirectory);
    }
    let euid = euid();
    if st.st_uid != euid {
        return Err(DirProblem::OwnedByOther {
            uid: st.st_uid,
            euid,
        });
    }
    let mode = st.st_mode & 0o7777;
    let extra = mode & 0o022 & !allowed_write(dir_mode);
    if extra != 0 && mode & libc::S_ISVTX == 0 {
        return Err(DirProblem::WritableByOthers { mode });
    }
    Ok(())
}

/// Takes ownership of the directory descriptor `fd` and judges what it refers to.
fn adopt_dir(fd: RawFd, dir_mode: u32) -> Result<GuardedFd, DirProblem> {
    let dir = GuardedFd::adopt(fd).map_err(DirProblem::CannotOpen)?;
    let st = fstat(dir.fd).map_err(DirProblem::CannotOpen)?;
    judge(&st, dir_mode)?;
    Ok(dir)
}

/// Opens `OPDUMP_DIR`, creating it (and missing parents) with `dir_mode`,
/// and checks that opdump may trust it: owned by this user, not writable by
/// others (see the module notes), writable by us.
pub fn open_dump_root(path: &Path, dir_mode: u32) -> Result<GuardedFd, DirRefused> {
    let refuse = |problem| DirRefused {
        path: path.to_path_buf(),
        problem,
    };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true).mode(dir_mode);
    if let Err(e) = builder.create(path) {
        return Err(refuse(DirProblem::CannotCreate(e)));
    }
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        refuse(DirProblem::CannotOpen(io::Error::from(
            io::ErrorKind::InvalidInput,
        )))
    })?;
    // SAFETY: a valid C string. The path may hold links: it is the user's.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    let fd = cvt(fd).map_err(|e| {
        refuse(match e.raw_os_error() {
            Some(libc::ENOTDIR) => DirProblem::NotDirectory,
            _ => DirProblem::CannotOpen(e),
        })
    })?;
    let dir = adopt_dir(fd, dir_mode).map_err(refuse)?;
    // The owner may lack write permission, or the file system may be
    // read-only: say so now rather than at the first file.
    // SAFETY: a descriptor we own and a static C string.
    let writable = unsafe {
        libc::faccessat(
            dir.fd,
            c".".as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    } == 0;
    if !writable {
        return Err(refuse(DirProblem::NotWritable));
    }
    Ok(dir)
}

/// Opens the existing directory `path`, to read from it, and judges it as
/// `OPDUMP_DIR` is judged: a directory owned by this user and writable by
/// no one else (or with the sticky bit). Data from elsewhere, such as a
/// reference dump, is read only from a place no other user can change.
pub fn open_trusted_dir(path: &Path) -> Result<GuardedFd, DirRefused> {
    let refuse = |problem| DirRefused {
        path: path.to_path_buf(),
        problem,
    };
    let fd = open_parent_dir(path).map_err(|e| {
        refuse(match e.raw_os_error() {
            Some(libc::ENOTDIR) => DirProblem::NotDirectory,
            _ => DirProblem::CannotOpen(e),
        })
    })?;
    let st = fstat(fd.fd).map_err(|e| refuse(DirProblem::CannotOpen(e)))?;
    judge(&st, 0o700).map_err(refuse)?;
    Ok(fd)
}

/// Creates `OPDUMP_DIR` if it is missing and checks that opdump may trust it
/// (see the module notes): owned by this user, not writable by others, no
/// file in its place. The error is one sentence that names the directory,
/// the problem and the fix, e.g. `OPDUMP_DIR=/tmp/x is writable by other
/// users (mode 0777, no sticky bit), ...; use a directory only you can write,
/// or chmod g-w,o-w it`.
pub fn check_dump_dir(dir: &Path, dir_mode: u32) -> Result<(), String> {
    match open_dump_root(dir, dir_mode) {
        Ok(_) => Ok(()),
        Err(r) => Err(format!("OPDUMP_DIR={} {}", r.path.display(), r.problem)),
    }
}

/// Opens the directory `path` (following links in it, as the user's) without
/// judging it: the parent to [`enter_dir`] from when it is not opdump's to
/// judge, as the ancestors of `OPDUMP_DIR` are not (a working directory).
pub fn open_parent_dir(path: &Path) -> io::Result<GuardedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: a valid C string.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), flags) })?;
    GuardedFd::adopt(fd)
}

/// Opens (creating it with `dir_mode` if missing) the directory `name`
/// inside `parent`, never through a symbolic link, and judges it.
pub fn enter_dir(
    parent: &mut GuardedFd,
    parent_path: &Path,
    name: &str,
    dir_mode: u32,
) -> Result<GuardedFd, DirRefused> {
    let path = parent_path.join(name);
    let refuse = |problem| DirRefused {
        path: path.clone(),
        problem,
    };
    let pfd = parent
        .check()
        .map_err(|e| refuse(DirProblem::CannotOpen(e)))?;
    let c = c_name(name).map_err(|e| refuse(DirProblem::CannotOpen(e)))?;
    // SAFETY: a checked descriptor and a valid C string.
    let made = unsafe { libc::mkdirat(pfd, c.as_ptr(), dir_mode as libc::mode_t) };
    if made != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(refuse(DirProblem::CannotCreate(e)));
        }
    }
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a checked descriptor and a valid C string.
    let fd = cvt(unsafe { libc::openat(pfd, c.as_ptr(), flags) }).map_err(|e| {
        refuse(match e.raw_os_error() {
            // O_NOFOLLOW on a link gives ELOOP; O_DIRECTORY on a file, ENOTDIR.
            Some(libc::ELOOP) => DirProblem::Link,
            Some(libc::ENOTDIR) => match stat_name(pfd, &c) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => DirProblem::Link,
                _ => DirProblem::NotDirectory,
            },
            _ => DirProblem::CannotOpen(e),
        })
    })?;
    adopt_dir(fd, dir_mode).map_err(refuse)
}

/// Starts a thread of opdump's own. Every thread opdump starts, in Rust
/// here and in C++ (`start_thread`, which calls [`block_file_size_signal`]
/// through the bridge), keeps one rule: SIGXFSZ is blocked before its body
/// runs, so no thread of opdump's can be killed by a file-size limit. A
/// thread started from the job's thread would otherwise inherit the job's
/// mask, and with it the signal's default action.
pub fn spawn<F, T>(name: &str, body: F) -> io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // It cannot fail for a valid signal set.
            let _ = block_file_size_signal();
            body()
        })
}

/// Blocks SIGXFSZ on the calling thread. Call it first thing on a thread
/// that writes files: a write past `ulimit -f` then fails with EFBIG (handled
/// as a full disk) instead of killing the whole process, which is what the
/// signal's default action does in a job that did not ignore it. The kernel
/// sends SIGXFSZ to the thread that wrote, so blocking it on that thread is
/// enough; other threads keep the job's own disposition and mask.
pub fn block_file_size_signal() -> io::Result<()> {
    // SAFETY: a sigset_t we own, initialised by sigemptyset; pthread_sigmask
    // changes only the calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGXFSZ);
        match libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) {
            0 => Ok(()),
            rc => Err(io::Error::from_raw_os_error(rc)),
        }
    }
}
