//! A write past `ulimit -f`, with SIGXFSZ at its default action, on a thread
//! that blocked the signal fails with EFBIG instead of killing the process.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

const CHILD: &str = "FSGUARD_XFSZ_CHILD";
const LIMIT: u64 = 16 * 1024;

/// In a child process: a file-size limit, SIGXFSZ at its default action, and
/// a thread that blocks SIGXFSZ (or not, with "unblocked") and then writes
/// past the limit. Prints the errno the write failed with.
fn child(mode: &str) {
    let path = PathBuf::from(std::env::var("FSGUARD_XFSZ_FILE").unwrap());
    // SAFETY: setting this process's limit and a signal's default action.
    unsafe {
        let lim = libc::rlimit {
            rlim_cur: LIMIT,
            rlim_max: LIMIT,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
    }
    let block = mode == "blocked";
    let errno = std::thread::spawn(move || {
        if block {
            opdump_fsguard::block_file_size_signal().unwrap();
        }
        let mut f = std::fs::File::create(path).unwrap();
        let chunk = [0u8; 4096];
        (0..2 * LIMIT / 4096)
            .find_map(|_| f.write_all(&chunk).err())
            .and_then(|e| e.raw_os_error())
    })
    .join()
    .unwrap();
    println!("CHILD-ERRNO={errno:?}");
}

fn run_child(mode: &str) -> std::process::Output {
    let tmp = tempfile::tempdir().unwrap();
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "file_size_signal::sigxfsz_is_blocked_on_the_calling_thread",
            "--nocapture",
        ])
        .env(CHILD, mode)
        .env("FSGUARD_XFSZ_FILE", tmp.path().join("big"))
        .output()
        .unwrap()
}

#[test]
fn sigxfsz_is_blocked_on_the_calling_thread() {
    if let Ok(mode) = std::env::var(CHILD) {
        child(&mode);
        return;
    }
    let out = run_child("blocked");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}\n{stdout}", out.status);
    assert!(
        stdout.contains(&format!("CHILD-ERRNO=Some({})", libc::EFBIG)),
        "{stdout}"
    );
    // The control: without the block the same write kills the process, so
    // the test above can fail.
    let out = run_child("unblocked");
    assert_eq!(out.status.signal(), Some(libc::SIGXFSZ), "{:?}", out.status);
}
