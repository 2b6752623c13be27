//! The files the CLI writes and reads, as a hostile user probes them
//! (issue 44): no output is ever written through a symlink planted at its
//! name, even one of the user's own (`repro --out`, `repro --check`,
//! `compare --out/--html`, `compare --rank all --html`, `check --html`);
//! `opdump check` refuses an oversized file before reading it; a bit
//! flipped inside a data page of a dump is one line and exit 2, never a
//! verdict.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{gelu_dump, path_str, run_timeout, small_dump, tmp, TimedRun};

const SECS: u64 = 60;
const KEEP: &[u8] = b"the other file, which no opdump command may change";

/// Two dumps whose captured gelu differs: `opdump repro A B` reproduces it.
fn captured_pair(root: &Path) -> (PathBuf, PathBuf) {
    let (a, b) = (root.join("a"), root.join("b"));
    gelu_dump(&a, &[0.35, -0.16, 1.95, 1.40], true);
    gelu_dump(&b, &[1.40, -0.16, 1.95, 0.35], true);
    (a, b)
}

/// A dump with check results (`checks/rank=0/part-4242.jsonl`) and the
/// capture file of its failed check; returns the dump and that file.
fn checked_dump(root: &Path) -> (PathBuf, PathBuf) {
    let src = root.join("src");
    gelu_dump(&src, &[0.35, -0.16, 1.95, 1.40], true);
    let (capture,) = glob_one(&src.join("rank=0/device=cpu"), "capture-");
    let dump = root.join("checked");
    let rank = dump.join("checks/rank=0");
    std::fs::create_dir_all(&rank).unwrap();
    let name = "capture-4242-0.safetensors";
    std::fs::copy(capture, rank.join(name)).unwrap();
    let row = serde_json::json!({
        "kind": "check", "signature": "aten::gelu.default(float32[4])", "op": "aten::gelu",
        "overload": "default", "args": "", "module": null, "phase": "forward", "step": 0,
        "seq": 0, "rank": 0, "device": "cpu", "dtype": "float32", "device_err": 1e-3,
        "cpu_err": 6e-8, "ratio": 1.6e4, "device_ulp": null, "cpu_ulp": null,
        "reduction_len": null, "verdict": "fail", "reason": null,
        "capture": format!("checks/rank=0/{name}"),
    });
    let summary = serde_json::json!({
        "kind": "summary", "rank": 0, "pid": 4242, "checked": 1, "passed": 0, "failed": 1,
        "no_reference": 0, "signatures": 1, "skipped_bytes": 0, "skipped_budget": 0,
        "skipped_busy": 0,
    });
    std::fs::write(rank.join("part-4242.jsonl"), format!("{row}\n{summary}\n")).unwrap();
    (dump, rank.join(name))
}

/// The one file in `dir` whose name starts with `prefix`.
fn glob_one(dir: &Path, prefix: &str) -> (PathBuf,) {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    (found[0].clone(),)
}

/// Plants, in `dir` (created if missing), a symlink of the user's own named
/// as each of `names`, all pointing at one other file; returns that file.
fn plant(root: &Path, dir: &Path, names: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let other = root.join("other.txt");
    std::fs::write(&other, KEEP).unwrap();
    for name in names {
        std::os::unix::fs::symlink(&other, dir.join(name)).unwrap();
    }
    other
}

/// The other file is untouched; each output is a regular file now, with
/// something in it; nothing else (no temporary file) is in `dir`.
fn expect_replaced(r: &TimedRun, other: &Path, dir: &Path, names: &[&str]) {
    assert!(!r.timed_out && r.code != 2, "exit {}: {}", r.code, r.stderr);
    let now = std::fs::read(other).unwrap();
    assert!(
        now == KEEP,
        "the other file was written through a link: it starts {:?}",
        String::from_utf8_lossy(&now[..now.len().min(60)])
    );
    for name in names {
        let m = std::fs::symlink_metadata(dir.join(name)).unwrap();
        assert!(m.file_type().is_file(), "{name} is not a regular file now");
        assert!(m.len() > 0, "{name} is empty");
    }
    let mut left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !names.contains(&n.as_str()))
        .collect();
    left.sort();
    assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
}

#[test]
fn repro_out_replaces_planted_links() {
    let t = tmp();
    let (a, b) = captured_pair(t.path());
    let out = t.path().join("out");
    let names = ["repro.py", "a.safetensors", "b.safetensors", "call.json"];
    let other = plant(t.path(), &out, &names);
    let r = run_timeout(
        &["repro", path_str(&a), path_str(&b), "--out", path_str(&out)],
        SECS,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    expect_replaced(&r, &other, &out, &names);
}

#[test]
fn repro_check_replaces_planted_links() {
    let t = tmp();
    let (_, capture) = checked_dump(t.path());
    let out = t.path().join("out");
    let names = ["repro.py", "b.safetensors", "call.json"];
    let other = plant(t.path(), &out, &names);
    let r = run_timeout(
        &[
            "repro",
            "--check",
            path_str(&capture),
            "--out",
            path_str(&out),
        ],
        SECS,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    expect_replaced(&r, &other, &out, &names);
}

#[test]
fn compare_reports_replace_planted_links() {
    let t = tmp();
    let dump = t.path().join("d");
    small_dump(&dump);
    let rep = t.path().join("rep");
    let names = ["compare.json", "compare.parquet"];
    let other = plant(t.path(), &rep, &names);
    let pages = t.path().join("pages");
    plant(t.path(), &pages, &["page.html"]);
    let d = path_str(&dump);
    let r = run_timeout(
        &[
            "compare",
            d,
            d,
            "--out",
            path_str(&rep),
            "--html",
            path_str(&pages.join("page.html")),
        ],
        SECS,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    expect_replaced(&r, &other, &rep, &names);
    expect_replaced(&r, &other, &pages, &["page.html"]);
}

#[test]
fn check_html_replaces_a_planted_link() {
    let t = tmp();
    let (dump, _) = checked_dump(t.path());
    let pages = t.path().join("pages");
    let other = plant(t.path(), &pages, &["check.html"]);
    let page = pages.join("check.html");
    let r = run_timeout(&["check", path_str(&dump), "--html", path_str(&page)], SECS);
    assert_eq!(r.code, 1, "{}", r.stderr);
    expect_replaced(&r, &other, &pages, &["check.html"]);
}

#[test]
fn fleet_html_replaces_a_planted_link() {
    use opdump_testkit::synth::{write_model_rank, RankOf, Variant};
    let t = tmp();
    let dump = t.path().join("d");
    for rank in 0..2 {
        let of = RankOf {
            rank,
            fingerprints: false,
            odd_grad_at: None,
        };
        write_model_rank(
            &dump,
            &of,
            &crate::common::small_model(),
            &Variant::default(),
            false,
            500_000,
        )
        .expect("write rank");
    }
    let pages = t.path().join("pages");
    let other = plant(t.path(), &pages, &["ranks.html"]);
    let d = path_str(&dump);
    let page = pages.join("ranks.html");
    let r = run_timeout(
        &["compare", d, d, "--rank", "all", "--html", path_str(&page)],
        SECS,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    expect_replaced(&r, &other, &pages, &["ranks.html"]);
}

/// Runs `opdump args`, and returns its exit status, stderr and peak RSS in
/// KiB (wait4's rusage of the child alone).
#[allow(clippy::zombie_processes)] // wait4 reaps it, not std's wait
fn run_with_rss(args: &[&str]) -> (i32, String, i64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_opdump"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn opdump");
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage we own, filled by wait4 for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for the child spawned above, which std has not reaped.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (code, reader.join().unwrap(), usage.ru_maxrss)
}

#[test]
fn check_refuses_an_oversized_file_before_reading_it() {
    let t = tmp();
    let rank = t.path().join("d/checks/rank=0");
    std::fs::create_dir_all(&rank).unwrap();
    // Sparse: past the 1 GiB limit without taking the disk space.
    let f = std::fs::File::create(rank.join("part-1.jsonl")).unwrap();
    f.set_len((1 << 30) + 1).unwrap();
    drop(f);
    let (code, stderr, rss_kib) = run_with_rss(&["check", path_str(&t.path().join("d"))]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("opdump: ") && stderr.contains("larger than"),
        "{stderr}"
    );
    // Reading the file first took over 1 GiB of memory.
    assert!(
        rss_kib < 256 * 1024,
        "peak RSS {rss_kib} KiB: the file was read before it was refused"
    );
}

/// Flips one bit in the middle of the first data page of `column`'s chunk
/// in the first row group of the Parquet file `path`.
fn flip_bit_in_page(path: &Path, column: &str) {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let rg = reader.metadata().row_group(0);
    let chunk = rg
        .columns()
        .iter()
        .find(|c| c.column_path().string() == column)
        .unwrap_or_else(|| panic!("no column {column}"));
    let (start, len) = chunk.byte_range();
    assert!(
        chunk.dictionary_page_offset().is_none(),
        "{column} has a dictionary page"
    );
    let mut bytes = std::fs::read(path).unwrap();
    // Past the page header (tens of bytes), inside a literal run of the
    // Snappy-compressed values: without a checksum this reads without an
    // error, and compare names a false introducer (exit 1).
    let at = (start + len * 3 / 10) as usize;
    bytes[at] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_bit_flipped_in_a_data_page_is_one_line_and_exit_2() {
    let t = tmp();
    let a = t.path().join("a");
    small_dump(&a);
    let b = t.path().join("b");
    small_dump(&b);
    let (file,) = glob_one(&b.join("rank=0/device=cpu"), "part-");
    flip_bit_in_page(&file, "max");
    for args in [
        ["compare", path_str(&a), path_str(&b)],
        ["compare", path_str(&b), path_str(&a)],
    ] {
        let r = run_timeout(&args, SECS);
        crate::common::expect_one_line(&r, "a flipped bit", "checksum");
        assert!(r.stderr.contains(path_str(&file)), "{}", r.stderr);
    }
}
