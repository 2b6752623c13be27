//! Descriptors closed and reused behind opdump's back are never written,
//! closed or published; names replaced behind its back are not published.

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use opdump_fsguard::{c_name, open_dump_root, publish, CheckedFile, GuardedFd};

fn fd_is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Puts `with` under the number `fd`, as a job's `closerange` followed by
/// an `open` does.
fn replace_fd(fd: i32, with: &impl AsRawFd) {
    // SAFETY: dup2 onto a number the test owns; the old description is the guard's.
    assert_eq!(unsafe { libc::dup2(with.as_raw_fd(), fd) }, fd);
}

/// The descriptor number of `file`, found through /proc by its path.
fn fd_of(path: &Path) -> i32 {
    let path = fs::canonicalize(path).unwrap();
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| fs::read_link(e.path()).is_ok_and(|t| t == path))
        .map(|e| e.file_name().to_string_lossy().parse().unwrap())
        .expect("the file is open")
}

fn root(dir: &Path) -> GuardedFd {
    open_dump_root(dir, 0o700).unwrap()
}

#[test]
fn a_reused_descriptor_is_never_written_or_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dir = root(tmp.path());
    let name = c_name("ours").unwrap();
    let mut file = CheckedFile::create_new(&mut dir, &name, 0o600).unwrap();
    file.write_all(b"opdump\n").unwrap();
    let fd = fd_of(&tmp.path().join("ours"));

    let job_path = tmp.path().join("job.txt");
    let job = fs::File::create(&job_path).unwrap();
    replace_fd(fd, &job);

    let err = file.write_all(b"more").unwrap_err();
    assert!(err.to_string().contains("no longer refers"), "{err}");
    assert!(file.guard().is_lost());
    drop(file);
    assert_eq!(
        fs::read(&job_path).unwrap(),
        b"",
        "nothing reached the job's file"
    );
    assert!(fd_is_open(fd), "the job's descriptor was closed");
    // SAFETY: the test's own duplicate, closed once.
    unsafe { libc::close(fd) };
}

#[test]
fn a_name_replaced_behind_the_writer_is_not_published() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dir = root(tmp.path());
    let (hidden, visible) = (c_name(".a.tmp").unwrap(), c_name("a").unwrap());
    let mut file = CheckedFile::create_new(&mut dir, &hidden, 0o600).unwrap();
    file.write_all(b"opdump\n").unwrap();
    // Another file takes the hidden name.
    fs::write(tmp.path().join("planted"), b"planted").unwrap();
    fs::rename(tmp.path().join("planted"), tmp.path().join(".a.tmp")).unwrap();
    let err = publish(&mut dir, &mut file, &hidden, &visible).unwrap_err();
    assert!(
        err.to_string().contains("no longer the file opdump wrote"),
        "{err}"
    );
    assert!(!tmp.path().join("a").exists());
}

#[test]
fn publishing_never_replaces_an_existing_name() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dir = root(tmp.path());
    let (hidden, visible) = (c_name(".a.tmp").unwrap(), c_name("a").unwrap());
    let mut file = CheckedFile::create_new(&mut dir, &hidden, 0o600).unwrap();
    file.write_all(b"opdump\n").unwrap();
    fs::write(tmp.path().join("a"), b"keep").unwrap();
    let err = publish(&mut dir, &mut file, &hidden, &visible).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    assert_eq!(fs::read(tmp.path().join("a")).unwrap(), b"keep");
    // And creating never opens an existing file.
    let err = CheckedFile::create_new(&mut dir, &visible, 0o600).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
}
