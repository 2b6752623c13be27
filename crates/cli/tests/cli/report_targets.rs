//! Report paths that are not regular files (README, "Guarantees"): a
//! device node or a FIFO is written in place, never replaced; a link to
//! `/proc/self/fd/1`, as `/dev/stdout` is, prints the page on stdout; a
//! link planted by another user is replaced, not followed; a directory is
//! refused in one line. The root-only cases (a device node of the test's
//! own, a link owned by another user) skip when not root.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::common::{model_pair, path_str, run, small_model, Run};
use opdump_testkit::synth::Variant;

/// The uid of `nobody`: the other user that plants a link.
const OTHER_UID: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Two small dumps that agree, under `root`.
fn dumps(root: &Path) -> (PathBuf, PathBuf) {
    model_pair(root, &small_model(), &Variant::default())
}

fn compare_html(a: &Path, b: &Path, page: &Path) -> Run {
    let r = run(&[
        "compare",
        path_str(a),
        path_str(b),
        "--html",
        path_str(page),
    ]);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    r
}

fn is_page(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.contains("<html") && text.contains("</html>")
}

#[test]
fn a_device_node_stays_a_device() {
    if !is_root() {
        eprintln!("skipped: mknod needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (a, b) = dumps(t.path());
    let dev = t.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    let node = dev.join("null");
    // SAFETY: a valid NUL-terminated path; the numbers of /dev/null.
    let rc = unsafe {
        libc::mknod(
            c_path(&node).as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(1, 3),
        )
    };
    assert_eq!(rc, 0, "mknod");
    let r = compare_html(&a, &b, &node);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let m = std::fs::symlink_metadata(&node).unwrap();
    assert!(m.file_type().is_char_device(), "{:?}", m.file_type());
    assert_eq!(m.rdev(), libc::makedev(1, 3));
    // Nothing left beside it (no temporary file).
    assert_eq!(std::fs::read_dir(&dev).unwrap().count(), 1);
}

#[test]
fn a_fifo_gets_the_page() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = dumps(t.path());
    let fifo = t.path().join("page.fifo");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let fifo = fifo.clone();
        std::thread::spawn(move || tx.send(std::fs::read(fifo).unwrap()));
    }
    let r = compare_html(&a, &b, &fifo);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // A FIFO replaced instead of written leaves the reader waiting: a
    // failure, not a hang.
    let page = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the reader got nothing");
    assert!(is_page(&page), "{}", String::from_utf8_lossy(&page));
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

/// `/dev/stdout` is a link, owned by root in root's `/dev`, to
/// `/proc/self/fd/1`. The test makes the same link of its own instead of
/// naming `/dev/stdout`: a regression that replaced the target would then
/// replace the test's link, not the machine's `/dev/stdout`.
#[test]
fn a_link_to_stdout_prints_the_page() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = dumps(t.path());
    let stdout = t.path().join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &stdout).unwrap();
    let r = compare_html(&a, &b, &stdout);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(is_page(r.stdout.as_bytes()), "{}", r.stdout);
    // The text report follows the page.
    assert!(r.stdout.contains("opdump compare"), "{}", r.stdout);
    assert!(std::fs::symlink_metadata(&stdout)
        .unwrap()
        .file_type()
        .is_symlink());
}

/// `--html /dev/stdout > page.html`: the page, then the text report, as
/// written one after the other on stdout; the text does not overwrite the
/// start of the page.
#[test]
fn stdout_redirected_to_a_file_gets_the_page_then_the_text() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = dumps(t.path());
    let stdout = t.path().join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &stdout).unwrap();
    let saved = t.path().join("saved.txt");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_opdump"))
        .args([
            "compare",
            path_str(&a),
            path_str(&b),
            "--html",
            path_str(&stdout),
        ])
        .stdout(std::fs::File::create(&saved).unwrap())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&saved).unwrap();
    let page_end = text.find("</html>").expect("the page") + "</html>".len();
    assert!(is_page(&text.as_bytes()[..page_end]), "{text}");
    assert!(text[..page_end].trim_start().starts_with("<!"), "{text}");
    assert!(text[page_end..].contains("opdump compare"), "{text}");
}

#[test]
fn a_link_planted_by_another_user_is_replaced() {
    if !is_root() {
        eprintln!("skipped: a link owned by another user needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (a, b) = dumps(t.path());
    // A shared directory: world-writable and sticky, as /tmp.
    let shared = t.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let precious = t.path().join("precious.txt");
    std::fs::write(&precious, b"keep me").unwrap();
    let link = shared.join("report.html");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    // SAFETY: a valid NUL-terminated path; -1 leaves the group alone.
    let rc = unsafe { libc::lchown(c_path(&link).as_ptr(), OTHER_UID, u32::MAX) };
    assert_eq!(rc, 0, "lchown");
    let r = compare_html(&a, &b, &link);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    let m = std::fs::symlink_metadata(&link).unwrap();
    assert!(m.file_type().is_file(), "{:?}", m.file_type());
    assert!(is_page(&std::fs::read(&link).unwrap()));
}

#[test]
fn a_directory_is_refused_in_one_line() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = dumps(t.path());
    let dir = t.path().join("page.html");
    std::fs::create_dir(&dir).unwrap();
    let r = compare_html(&a, &b, &dir);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.starts_with("opdump: ") && r.stderr.contains("is a directory"),
        "{}",
        r.stderr
    );
    assert!(std::fs::metadata(&dir).unwrap().is_dir());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}
