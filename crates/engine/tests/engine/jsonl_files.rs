//! The files the engine writes beside its JSON lines (the accuracy check's
//! captures in `checks/rank=<R>/`, `JsonLines::write_beside`): a write that
//! fails for a full disk or `ulimit -f` leaves no hidden temporary file,
//! and a link planted at either name is never written through.

use std::path::{Path, PathBuf};

use opdump_engine::jsonl::JsonLines;
use opdump_format::tables::Table;

const CHILD: &str = "JSONL_FULL_DISK_CHILD";
const LIMIT: u64 = 16 * 1024;
const CAPTURE: &str = "capture-4242-00000.safetensors";

fn rank_dir(root: &Path) -> PathBuf {
    root.join("checks").join("rank=0")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// In a child process: a file-size limit with SIGXFSZ ignored (a write past
/// it fails with EFBIG, as on a full disk), then a capture past the limit.
fn child(root: &Path) {
    // SAFETY: setting this process's limit and a signal's disposition.
    unsafe {
        let lim = libc::rlimit {
            rlim_cur: LIMIT,
            rlim_max: LIMIT,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let mut f = JsonLines::create(root, Table::Checks, 0, 4242, 0o600, 0o700).unwrap();
    f.append(&serde_json::json!({"kind": "check"})).unwrap();
    let err = f
        .write_beside(CAPTURE, &vec![7u8; 4 * LIMIT as usize])
        .expect_err("a capture past the limit was written");
    println!("CHILD-ERRNO={:?}", err.raw_os_error());
}

#[test]
fn a_failed_capture_leaves_no_temporary_file() {
    if let Ok(root) = std::env::var(CHILD) {
        child(Path::new(&root));
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("dump");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "jsonl_files::a_failed_capture_leaves_no_temporary_file",
            "--nocapture",
        ])
        .env(CHILD, &root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("CHILD-ERRNO=Some({})", libc::EFBIG)),
        "{stdout}"
    );
    assert_eq!(names(&rank_dir(&root)), ["part-4242.jsonl"]);
}

#[test]
fn a_planted_link_is_never_written_through() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("dump");
    let other = t.path().join("other.txt");
    std::fs::write(&other, b"keep me").unwrap();
    let mut f = JsonLines::create(&root, Table::Checks, 0, 4242, 0o600, 0o700).unwrap();
    for name in [CAPTURE.to_string(), format!(".{CAPTURE}.tmp")] {
        let link = rank_dir(&root).join(&name);
        std::os::unix::fs::symlink(&other, &link).unwrap();
        assert!(f.write_beside(CAPTURE, b"tensors").is_err(), "{name}");
        assert_eq!(std::fs::read(&other).unwrap(), b"keep me", "{name}");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        std::fs::remove_file(&link).unwrap();
    }
    assert_eq!(names(&rank_dir(&root)), ["part-4242.jsonl"]);
}
