//! The writer in a hostile process and file system: descriptors closed and
//! reused behind its back, links and foreign directories planted in the dump,
//! a file-size limit with SIGXFSZ at its default action. What the writer does
//! about each (abandon, count, never publish); the guards themselves are
//! tested in `crates/fsguard/tests`.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use opdump_format::reader::{file_metadata, list_files};
use opdump_format::schema::meta;
use opdump_format::{
    OpRecord, Phase, Role, RotateOptions, RotatingWriter, Stats, StatsStatus, TensorRecord,
};
use opdump_testkit::records::read_records;

fn record(seq: i64) -> OpRecord {
    let t = |role, arg: &str| TensorRecord {
        role,
        arg: arg.to_string().into(),
        list_index: None,
        dtype: "float32".into(),
        shape: vec![4],
        stride: vec![1],
        device: "cpu".into(),
        numel: 4,
        name: None,
        capture_key: None,
        status: StatsStatus::Computed,
        stats: Stats {
            min: seq as f64,
            max: seq as f64 + 1.0,
            mean: 0.5,
            std: 0.25,
            l2: 2.0,
            absmax: 1.0,
            nan_count: 0,
            posinf_count: 0,
            neginf_count: 0,
            zero_count: 0,
        },
        fingerprint: None,
        sketch: None,
    };
    OpRecord {
        seq,
        parent_seq: None,
        depth: 0,
        pid: 42,
        thread: 7,
        step: 0,
        phase: Phase::Forward,
        op: "aten::add".into(),
        overload: "Tensor".into(),
        args: format!("alpha={seq}"),
        start_ns: 1000 + seq,
        duration_ns: 5,
        error: None,
        module: None,
        fwd_seq: None,
        source: None,
        capture: None,
        tensors: vec![t(Role::Input, "self"), t(Role::Output, "0")],
    }
}

fn opts() -> RotateOptions {
    RotateOptions {
        max_rows: 1_000_000,
        max_age: Duration::from_secs(3600),
        batch_rows: 64,
        ..Default::default()
    }
}

/// A private directory for one test (0700, ours).
fn private_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Every entry under `dir`, hidden ones included.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A writer of `part-1` files in the partition `levels` below `root`, with
/// the tests' options and no metadata.
fn partition_writer(root: &Path, levels: &[&str]) -> RotatingWriter {
    let levels = levels.iter().map(|l| l.to_string()).collect();
    RotatingWriter::in_partition(root, levels, "part-1", opts(), vec![])
}

/// The descriptor of the writer's open hidden file under `dir`.
fn hidden_file_fd(dir: &Path) -> i32 {
    fds_under(dir)
        .into_iter()
        .find(|&fd| {
            fs::read_link(format!("/proc/self/fd/{fd}"))
                .unwrap()
                .to_string_lossy()
                .ends_with(".tmp")
        })
        .expect("the hidden file is open")
}

/// The descriptor numbers of this process that refer to a path under `dir`.
fn fds_under(dir: &Path) -> Vec<i32> {
    let dir = fs::canonicalize(dir).unwrap();
    let mut fds = Vec::new();
    for e in fs::read_dir("/proc/self/fd").unwrap() {
        let e = e.unwrap();
        if let Ok(target) = fs::read_link(e.path()) {
            if target.starts_with(&dir) {
                fds.push(e.file_name().to_string_lossy().parse().unwrap());
            }
        }
    }
    fds.sort();
    fds
}

fn fd_is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Puts `with` under the number `fd`, as a job's `closerange` followed by
/// an `open` does.
fn replace_fd(fd: i32, with: &impl AsRawFd) {
    // SAFETY: dup2 onto a number the test owns; the old description is the writer's.
    assert_eq!(unsafe { libc::dup2(with.as_raw_fd(), fd) }, fd);
}

#[test]
fn a_reused_file_descriptor_is_never_written_closed_or_published() {
    let tmp = private_dir();
    let dir = tmp.path().join("dump");
    let mut w = partition_writer(&dir, &["rank=0", "device=cpu"]);
    for seq in 0..10 {
        w.append(&record(seq)).unwrap();
    }
    w.close_file().unwrap(); // one good file
    for seq in 10..300 {
        w.append(&record(seq)).unwrap();
    }
    let part = dir.join("rank=0/device=cpu");
    let tmp_fd = hidden_file_fd(&part);

    // The job's own file takes the writer's number.
    let job_path = tmp.path().join("job.txt");
    let mut job = fs::File::create(&job_path).unwrap();
    job.write_all(b"the job's data\n").unwrap();
    replace_fd(tmp_fd, &job);

    let err = w.close_file().unwrap_err().to_string();
    assert!(err.contains("no longer refers"), "{err}");
    assert_eq!(
        w.abandon(),
        290,
        "the op calls of the abandoned file are counted"
    );
    drop(w);

    // Not written: the job's file holds only what the job wrote.
    assert_eq!(fs::read(&job_path).unwrap(), b"the job's data\n");
    // Not closed: the number still works for the job.
    assert!(fd_is_open(tmp_fd));
    // SAFETY: writing a few bytes to the job's descriptor.
    let written = unsafe { libc::write(tmp_fd, b"more\n".as_ptr().cast(), 5) };
    assert_eq!(written, 5);
    assert_eq!(fs::read(&job_path).unwrap(), b"the job's data\nmore\n");
    // SAFETY: the test's own duplicate, closed once.
    unsafe { libc::close(tmp_fd) };
    // Not published, and the hidden file is removed: only the good file is left.
    let left = entries(&part);
    assert_eq!(left.len(), 1, "{left:?}");
    let files = list_files(&dir).unwrap();
    assert_eq!(read_records(&files[0].path).unwrap().len(), 10);
    assert_eq!(file_metadata(&files[0].path).unwrap()[meta::OP_CALLS], "10");
}

#[test]
fn a_reused_file_descriptor_is_caught_in_the_middle_of_a_file() {
    // Enough rows that the encoder writes to the descriptor before the file
    // completes: the write after the swap is refused.
    let tmp = private_dir();
    let dir = tmp.path().join("dump");
    let o = RotateOptions {
        batch_rows: 4096,
        ..opts()
    };
    let mut w = RotatingWriter::new(&dir, "part-42", o, vec![]);
    w.append(&record(0)).unwrap();
    let hidden = entries(&dir)
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(".tmp"))
        .unwrap();
    let mut seq = 1;
    while fs::metadata(&hidden).unwrap().len() == 0 {
        w.append(&record(seq)).unwrap();
        seq += 1;
        assert!(seq < 2_000_000, "nothing reached the file");
    }
    let tmp_fd = hidden_file_fd(&dir);
    let other = tmp.path().join("other.txt");
    let job = fs::File::create(&other).unwrap();
    replace_fd(tmp_fd, &job);
    let mut failed = None;
    for _ in 0..2_000_000 {
        if let Err(e) = w.append(&record(seq)) {
            failed = Some(e.to_string());
            break;
        }
        seq += 1;
    }
    let failed = failed.expect("a write after the swap fails");
    assert!(failed.contains("no longer refers"), "{failed}");
    w.abandon();
    drop(w);
    assert_eq!(
        fs::metadata(&other).unwrap().len(),
        0,
        "nothing reached the job's file"
    );
    assert!(fd_is_open(tmp_fd));
    // SAFETY: the test's own duplicate, closed once.
    unsafe { libc::close(tmp_fd) };
    assert!(entries(&dir).is_empty(), "{:?}", entries(&dir));
}

#[test]
fn a_reused_directory_descriptor_is_never_used_or_closed() {
    let tmp = private_dir();
    let dir = tmp.path().join("dump");
    let mut w = partition_writer(&dir, &["rank=0", "device=cpu"]);
    w.append(&record(0)).unwrap();
    w.close_file().unwrap();
    // Between files the writer keeps only the partition directory open.
    let part = dir.join("rank=0/device=cpu");
    let dir_fd = fds_under(&part);
    assert_eq!(dir_fd.len(), 1, "{dir_fd:?}");
    let elsewhere = tmp.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    let job_dir = fs::File::open(&elsewhere).unwrap();
    replace_fd(dir_fd[0], &job_dir);
    // The writer notices, opens the partition again by its path, and loses nothing.
    w.append(&record(1)).unwrap();
    w.close_file().unwrap();
    assert_eq!(w.ops_written(), 2);
    drop(w);
    assert!(entries(&elsewhere).is_empty(), "{:?}", entries(&elsewhere));
    assert!(
        fd_is_open(dir_fd[0]),
        "the job's directory descriptor was closed"
    );
    // SAFETY: the test's own duplicate, closed once.
    unsafe { libc::close(dir_fd[0]) };
    assert_eq!(list_files(&dir).unwrap().len(), 2);
}

// ---------------------------------------------------------------------------
// Directories
// ---------------------------------------------------------------------------

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn the_writer_refuses_a_world_writable_dump_dir_and_writes_nothing() {
    let tmp = private_dir();
    let dir = tmp.path().join("shared");
    fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o777);
    let mut w = RotatingWriter::new(&dir, "part-1", opts(), vec![]);
    let err = w.append(&record(0)).unwrap_err().to_string();
    assert!(err.contains("writable by other users"), "{err}");
    assert_eq!(
        w.abandon(),
        1,
        "the record that could not be written is counted"
    );
    assert!(entries(&dir).is_empty());
}

#[test]
fn the_writer_writes_in_a_sticky_dump_dir() {
    let tmp = private_dir();
    let dir = tmp.path().join("team");
    fs::create_dir(&dir).unwrap();
    // A sticky directory (as /tmp): others cannot rename or remove our entries.
    chmod(&dir, 0o1777);
    let mut w = partition_writer(&dir, &["rank=0"]);
    w.append(&record(0)).unwrap();
    w.close_file().unwrap();
    assert_eq!(w.files_written(), 1);
}

/// Another user's uid, when this process may give files away (root).
fn other_uid() -> Option<u32> {
    // SAFETY: geteuid cannot fail.
    (unsafe { libc::geteuid() } == 0).then_some(65534)
}

#[test]
fn the_writer_refuses_a_level_of_another_user() {
    let Some(uid) = other_uid() else {
        eprintln!("skipped: only root can give a directory to another user");
        return;
    };
    let tmp = private_dir();
    let root = tmp.path().join("ours");
    fs::create_dir(&root).unwrap();
    fs::create_dir(root.join("rank=0")).unwrap();
    std::os::unix::fs::chown(root.join("rank=0"), Some(uid), Some(uid)).unwrap();
    let mut w = partition_writer(&root, &["rank=0", "device=cpu"]);
    let err = w.append(&record(0)).unwrap_err().to_string();
    assert!(
        err.contains("rank=0") && err.contains("owned by another user"),
        "{err}"
    );
    assert!(entries(&root.join("rank=0")).is_empty());
}

#[test]
fn planted_links_inside_the_dump_are_never_followed() {
    let tmp = private_dir();
    let root = tmp.path().join("dump");
    let elsewhere = tmp.path().join("elsewhere");
    fs::create_dir(&root).unwrap();
    fs::create_dir(&elsewhere).unwrap();
    // A level that is a link: refused.
    std::os::unix::fs::symlink(&elsewhere, root.join("rank=0")).unwrap();
    let mut w = partition_writer(&root, &["rank=0", "device=cpu"]);
    let err = w.append(&record(0)).unwrap_err().to_string();
    assert!(
        err.contains("rank=0") && err.contains("symbolic link"),
        "{err}"
    );
    assert!(entries(&elsewhere).is_empty());
    // A level that is a file: refused.
    fs::write(root.join("rank=1"), b"x").unwrap();
    let mut w = partition_writer(&root, &["rank=1"]);
    let err = w.append(&record(0)).unwrap_err().to_string();
    assert!(err.contains("not a directory"), "{err}");
    // Links at the names of the files: neither the hidden nor the final
    // name is followed or overwritten; the writer takes the next free index.
    let part = root.join("rank=2");
    fs::create_dir(&part).unwrap();
    let victim = elsewhere.join("victim");
    fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, part.join(".part-1-00000.parquet.tmp")).unwrap();
    std::os::unix::fs::symlink(&victim, part.join("part-1-00001.parquet")).unwrap();
    let mut w = partition_writer(&root, &["rank=2"]);
    w.append(&record(0)).unwrap();
    w.close_file().unwrap();
    drop(w);
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
    assert!(part.join("part-1-00002.parquet").is_file());
    assert_eq!(
        read_records(&part.join("part-1-00002.parquet"))
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_writable_level_below_the_dump_dir_is_refused() {
    let tmp = private_dir();
    let root = tmp.path().join("dump");
    fs::create_dir_all(root.join("rank=0")).unwrap();
    chmod(&root.join("rank=0"), 0o777);
    let mut w = partition_writer(&root, &["rank=0"]);
    let err = w.append(&record(0)).unwrap_err().to_string();
    assert!(
        err.contains("rank=0") && err.contains("writable by other users"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------
// SIGXFSZ
// ---------------------------------------------------------------------------

const XFSZ_CHILD: &str = "XFSZ_TEST_CHILD";

/// In a child process: a file-size limit, SIGXFSZ at its default action,
/// and a writer thread that blocks SIGXFSZ (or not, with "unblocked").
fn xfsz_child(mode: &str) {
    let dir = PathBuf::from(std::env::var("XFSZ_TEST_DIR").unwrap());
    // SAFETY: setting this process's limit and a signal's default action.
    unsafe {
        let lim = libc::rlimit {
            rlim_cur: 16 * 1024,
            rlim_max: 16 * 1024,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
    }
    let block = mode == "blocked";
    let result = std::thread::spawn(move || {
        if block {
            opdump_fsguard::block_file_size_signal().unwrap();
        }
        let mut w = RotatingWriter::new(&dir, "part-1", opts(), vec![]);
        let mut result = Ok(());
        for seq in 0..100_000 {
            result = w.append(&record(seq));
            if result.is_err() {
                break;
            }
        }
        if let Err(e) = result.and_then(|()| w.close_file()) {
            let lost = w.abandon();
            return Some((e.raw_os_error(), lost));
        }
        None
    })
    .join()
    .unwrap();
    let (errno, lost) = result.expect("the writer passed the limit without an error");
    assert_eq!(errno, Some(libc::EFBIG));
    assert!(lost > 0);
    println!("XFSZ-CHILD-OK");
}

fn run_xfsz_child(mode: &str) -> std::process::Output {
    let tmp = private_dir();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hostile::sigxfsz_is_blocked_on_the_writer_thread",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(XFSZ_CHILD, mode)
        .env("XFSZ_TEST_DIR", tmp.path())
        .output()
        .unwrap();
    // No partial file, visible or hidden, whatever happened.
    if mode == "blocked" {
        for p in entries(tmp.path()) {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            assert!(!name.starts_with('.'), "hidden file left: {p:?}");
            read_records(&p).unwrap();
        }
    }
    out
}

#[test]
fn sigxfsz_is_blocked_on_the_writer_thread() {
    if let Ok(mode) = std::env::var(XFSZ_CHILD) {
        xfsz_child(&mode);
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let out = run_xfsz_child("blocked");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("XFSZ-CHILD-OK"),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The control: without the block the same writer kills the process, so
    // the test above can fail.
    let out = run_xfsz_child("unblocked");
    assert_eq!(out.status.signal(), Some(libc::SIGXFSZ), "{:?}", out.status);
}
