//! Dumps and paths made to hurt the user who runs `opdump` on them: planted
//! symlinks at report paths, control characters in names, forged footers,
//! FIFOs, cyclic call trees, bad partition names, a full stdout. Each gives
//! one `opdump:` line and exit status 2 (or a safe result), never a hang,
//! an abort, or a write through a link.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use opdump_testkit::synth::output;

const SECS: u64 = 20;

// --- Report files: symlinks and modes -----------------------------------

/// Gives the link itself to `nobody`, as if that user had planted it (a
/// link of the user's own is replaced too: tests/probe_files.rs).
fn plant_as_another_user(link: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(link.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; -1 leaves the group alone.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, u32::MAX) }, 0);
}

#[test]
fn reports_replace_planted_symlinks() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: planting a link as another user needs root");
        return;
    }
    let t = tmp();
    let dump = t.path().join("d");
    small_dump(&dump);
    let rep = t.path().join("rep");
    std::fs::create_dir(&rep).unwrap();
    let precious = t.path().join("precious.txt");
    std::fs::write(&precious, b"the victim's file").unwrap();
    for name in ["compare.json", "compare.parquet"] {
        std::os::unix::fs::symlink(&precious, rep.join(name)).unwrap();
        plant_as_another_user(&rep.join(name));
    }
    let page = t.path().join("page.html");
    std::os::unix::fs::symlink(&precious, &page).unwrap();
    plant_as_another_user(&page);
    let d = path_str(&dump);
    let r = run_timeout(
        &[
            "compare",
            d,
            d,
            "--out",
            path_str(&rep),
            "--html",
            path_str(&page),
        ],
        SECS,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(std::fs::read(&precious).unwrap(), b"the victim's file");
    for p in [rep.join("compare.json"), rep.join("compare.parquet"), page] {
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_file(), "{} is not a file now", p.display());
        assert!(m.len() > 0);
    }
    // No temporary file left beside the reports.
    let mut names: Vec<String> = std::fs::read_dir(&rep)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["compare.json", "compare.parquet"]);
}

#[test]
fn reports_are_private() {
    let t = tmp();
    let dump = t.path().join("d");
    small_dump(&dump);
    let out = t.path().join("new").join("sub");
    let page = t.path().join("page.html");
    let d = path_str(&dump);
    let r = run_timeout(
        &[
            "compare",
            d,
            d,
            "--out",
            path_str(&out),
            "--html",
            path_str(&page),
        ],
        SECS,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for f in [out.join("compare.json"), out.join("compare.parquet"), page] {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    for dir in [t.path().join("new"), out] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
}

// --- Control characters from a dump ---------------------------------------

/// An op name, args and error text made to drive a terminal (OSC retitle,
/// CSI clear screen as ESC and as the C1 byte, a forged line) and to break
/// out of HTML.
const EVIL_OP: &str =
    "evil::op\x1b]0;pwned\x07\u{9b}2J\nVerdict: no divergence</script><img src=x onerror=alert(1)>";
const EVIL_ARGS: &str = "alpha=1\x1b[31m\u{85}\x7f";
const EVIL_ERROR: &str = "RuntimeError</script><img src=x onerror=alert(1)>\x1b[2J";

/// A and B of a short run where the evil op doubles its output on B, and
/// raises with a hostile error text afterwards.
fn evil_pair(root: &Path) -> (PathBuf, PathBuf) {
    let mut dirs = Vec::new();
    for (side, f) in [("a", 1.0), ("b", 2.0)] {
        let relu = record(0, None, "aten::relu", 1.0);
        let mut evil = record(1, None, EVIL_OP, 1.0);
        evil.overload = "Tensor\x1b[8m".into();
        evil.args = EVIL_ARGS.into();
        evil.tensors[0].arg = "self\x1b[1m".into();
        evil.tensors[1] = output(0, "float32", &[4, 8], f);
        let mut sum = record(2, None, "aten::sum", f);
        sum.tensors[1] = output(0, "float32", &[], f);
        let mut raised = record(3, None, EVIL_OP, 1.0);
        raised.tensors.clear();
        raised.error = Some(EVIL_ERROR.into());
        let dir = root.join(side);
        write_records(&dir, &[relu, evil, sum, raised]);
        dirs.push(dir);
    }
    let b = dirs.pop().unwrap();
    (dirs.pop().unwrap(), b)
}

fn assert_no_raw_controls(what: &str, s: &str) {
    for c in s.chars() {
        assert!(
            !c.is_control() || c == '\n',
            "{what}: raw control character {c:?} in output:\n{s}"
        );
    }
    assert!(
        !s.contains("\nVerdict: no divergence</script>"),
        "{what}: forged line"
    );
}

#[test]
fn control_characters_are_escaped_everywhere() {
    let t = tmp();
    let (a, b) = evil_pair(t.path());
    let (a, b) = (path_str(&a), path_str(&b));
    let page = t.path().join("page.html");

    let r = run_timeout(&["compare", a, b, "--html", path_str(&page)], SECS);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_no_raw_controls("compare", &r.stdout);
    assert!(r
        .stdout
        .contains("evil::op\\x1b]0;pwned\\x07\\u{9b}2J\\x0aVerdict"));
    assert!(
        r.stdout.contains("alpha=1\\x1b[31m\\u{85}\\x7f"),
        "{}",
        r.stdout
    );

    for args in [vec!["summary", a], vec!["summary", b]] {
        let r = run_timeout(&args, SECS);
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_no_raw_controls("summary", &r.stdout);
        assert!(r.stdout.contains("evil::op\\x1b]0;pwned"), "{}", r.stdout);
    }

    // JSON: terminal-safe text, exactly the dump's strings once parsed.
    let r = run_timeout(&["compare", a, b, "--json"], SECS);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_no_raw_controls("compare --json", &r.stdout);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["first_divergence"]["op"], EVIL_OP);
    assert_eq!(v["first_divergence"]["args_a"], EVIL_ARGS);
    let r = run_timeout(&["summary", b, "--json"], SECS);
    assert_no_raw_controls("summary --json", &r.stdout);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let ops: Vec<&str> = v["ranks"][0]["per_op"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert!(ops.contains(&EVIL_OP), "{ops:?}");

    // HTML (compare's page and summary's): no markup from the dump, no raw
    // control characters.
    let summary_page = t.path().join("summary.html");
    let r = run_timeout(&["summary", b, "--html", path_str(&summary_page)], SECS);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for page in [&page, &summary_page] {
        let html = std::fs::read_to_string(page).unwrap();
        assert!(html.contains("evil::op"), "the op is not in the page");
        assert!(!html.contains("<img"), "markup from the dump in the HTML");
        assert!(!html.contains("</script><img"));
        assert!(!html.contains("<script"), "the page has no script");
        assert!(html.contains("&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"));
        assert!(!html.chars().any(|c| c.is_control() && c != '\n'));
    }
}

#[test]
fn error_lines_escape_control_characters() {
    let t = tmp();
    // A path from the command line, and a directory name from the dump.
    let dir = t.path().join("dump\x1b]0;pwned\x07\u{9b}2J");
    let part = dir.join("rank=0").join("device=cpu");
    std::fs::create_dir_all(&part).unwrap();
    std::fs::write(part.join("part-1-00000.parquet"), b"not parquet").unwrap();
    let r = run_timeout(&["summary", path_str(&dir)], SECS);
    expect_one_line(&r, "summary", "dump\\x1b]0;pwned\\x07\\u{9b}2J");
    assert!(!r.stderr.trim_end().chars().any(|c| c.is_control()));

    // A value from the command line, echoed by the usage error.
    let r = run_timeout(&["summary", "--rank", "1\x07\u{85}\x1b[2J"], SECS);
    expect_one_line(&r, "--rank", "invalid value");
    assert!(!r.stderr.trim_end().chars().any(|c| c.is_control()));

    // A metadata value from the file.
    use opdump_format::schema::{meta, schema};
    let d = t.path().join("meta");
    let p = d.join("rank=0").join("device=cpu");
    std::fs::create_dir_all(&p).unwrap();
    let f = std::fs::File::create(p.join("part-1-00000.parquet")).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(f, schema(), None).unwrap();
    w.append_key_value_metadata(parquet::file::metadata::KeyValue::new(
        meta::SCHEMA_VERSION.to_string(),
        "1\x1b]0;pwned\x07".to_string(),
    ));
    w.close().unwrap();
    let r = run_timeout(&["summary", path_str(&d)], SECS);
    expect_one_line(&r, "metadata", "bad opdump.schema_version");
    assert!(!r.stderr.trim_end().chars().any(|c| c.is_control()));
}

// --- Forged footers --------------------------------------------------------

/// The file with its footer's `num_rows` (FileMetaData field 3, an i64
/// after the schema list, before the row group list) set to `rows`.
fn with_footer_rows(bytes: &[u8], rows_now: i64, rows: i64) -> Vec<u8> {
    let n = bytes.len();
    let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let start = n - 8 - len;
    let footer = &bytes[start..n - 8];
    // Field header: delta 1, type i64 (6); then the row group list header
    // (delta 1, type list (9)).
    let mut pat = vec![0x16];
    pat.extend(varint(rows_now));
    pat.push(0x19);
    let hits: Vec<usize> = footer
        .windows(pat.len())
        .enumerate()
        .filter(|(_, w)| *w == pat.as_slice())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "num_rows not found in the footer");
    let at = hits[0];
    let mut new_footer = footer[..at].to_vec();
    new_footer.push(0x16);
    new_footer.extend(varint(rows));
    new_footer.extend_from_slice(&footer[at + pat.len() - 1..]);
    let mut out = bytes[..start].to_vec();
    out.extend_from_slice(&new_footer);
    out.extend_from_slice(&(new_footer.len() as u32).to_le_bytes());
    out.extend_from_slice(b"PAR1");
    out
}

fn footer_rows(path: &Path) -> i64 {
    let f = std::fs::File::open(path).unwrap();
    let b = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
    b.metadata().file_metadata().num_rows()
}

#[test]
fn forged_footer_row_counts() {
    let t = tmp();
    let good = t.path().join("good");
    small_dump(&good);
    let f = only_file(&good);
    let bytes = std::fs::read(&f).unwrap();
    let rows = footer_rows(&f);
    assert!(rows > 0);
    // Check the rewrite itself: the same count gives the same file.
    assert_eq!(with_footer_rows(&bytes, rows, rows), bytes);
    for (name, forged) in [
        ("huge", 1i64 << 50),
        ("max", i64::MAX),
        ("zero", 0),
        ("negative", -5),
        ("one more", rows + 1),
    ] {
        let bad = t.path().join(format!("bad-{}", name.replace(' ', "-")));
        let p = bad.join("rank=0").join("device=cpu");
        std::fs::create_dir_all(&p).unwrap();
        let file = p.join("part-1-00000.parquet");
        std::fs::write(&file, with_footer_rows(&bytes, rows, forged)).unwrap();
        assert_eq!(footer_rows(&file), forged);
        let r = run_timeout(&["summary", path_str(&bad)], SECS);
        expect_one_line(&r, name, "corrupt footer");
        let r = run_timeout(&["compare", path_str(&good), path_str(&bad)], SECS);
        expect_one_line(&r, name, "corrupt footer");
    }
}

#[test]
fn zero_rows_while_the_writer_counted_op_calls() {
    // A file whose footer and row groups agree on 0 rows, while the
    // writer's own counts say it holds op calls: not read as empty.
    use opdump_format::schema::{meta, schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    let t = tmp();
    let d = t.path().join("d");
    let p = d.join("rank=0").join("device=cpu");
    std::fs::create_dir_all(&p).unwrap();
    let f = std::fs::File::create(p.join("part-1-00000.parquet")).unwrap();
    let mut w = ArrowWriter::try_new(f, schema(), None).unwrap();
    for (k, v) in [
        (
            meta::SCHEMA_VERSION,
            opdump_format::SCHEMA_VERSION.to_string(),
        ),
        (meta::ROWS, "0".to_string()),
        (meta::OP_CALLS, "120".to_string()),
    ] {
        w.append_key_value_metadata(KeyValue::new(k.to_string(), v));
    }
    w.close().unwrap();
    let r = run_timeout(&["summary", path_str(&d)], SECS);
    expect_one_line(&r, "zero rows", "opdump.op_calls says 120");
}

// --- Non-regular files -----------------------------------------------------

fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[test]
fn a_fifo_is_refused_not_waited_on() {
    let t = tmp();
    let good = t.path().join("good");
    small_dump(&good);
    let bad = t.path().join("bad");
    let p = bad.join("rank=0").join("device=cpu");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::copy(only_file(&good), p.join("part-1-00000.parquet")).unwrap();
    mkfifo(&p.join("part-1-00001.parquet"));
    let r = run_timeout(&["summary", path_str(&bad)], SECS);
    expect_one_line(&r, "summary", "not a regular file");
    let r = run_timeout(&["compare", path_str(&good), path_str(&bad)], SECS);
    expect_one_line(&r, "compare", "not a regular file");
    // Through a symlink as well.
    let l = t.path().join("linked");
    let lp = l.join("rank=0").join("device=cpu");
    std::fs::create_dir_all(&lp).unwrap();
    std::os::unix::fs::symlink(
        p.join("part-1-00001.parquet"),
        lp.join("part-1-00000.parquet"),
    )
    .unwrap();
    let r = run_timeout(&["summary", path_str(&l)], SECS);
    expect_one_line(&r, "symlink to a fifo", "not a regular file");
}

#[test]
fn open_regular_refuses_a_fifo_without_blocking() {
    let t = tmp();
    let f = t.path().join("part-1-00000.parquet");
    mkfifo(&f);
    let e = opdump_format::reader::open_regular(&f).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

// --- Cyclic call trees -----------------------------------------------------

#[test]
fn parent_cycles_are_an_error_not_a_hang() {
    let t = tmp();
    // NaN from finite inputs: `summary` looks for the deepest such call,
    // walking down the (cyclic) tree.
    let nan = |mut r: opdump_format::OpRecord| {
        r.tensors[1].stats.nan_count = 1;
        r
    };
    let cases: [(&str, Vec<opdump_format::OpRecord>); 3] = [
        (
            "own parent",
            vec![
                record(0, None, "aten::relu", 1.0),
                nan(record(1, Some(1), "aten::mul", 1.0)),
            ],
        ),
        (
            "two-cycle",
            vec![
                record(0, None, "aten::relu", 1.0),
                nan(record(1, Some(2), "aten::mul", 1.0)),
                nan(record(2, Some(1), "aten::add", 1.0)),
            ],
        ),
        (
            "three-cycle below a root",
            vec![
                record(0, None, "aten::relu", 1.0),
                nan(record(1, Some(3), "aten::mul", 1.0)),
                nan(record(2, Some(1), "aten::add", 1.0)),
                nan(record(3, Some(2), "aten::sub", 1.0)),
                nan(record(4, Some(3), "aten::div", 1.0)),
            ],
        ),
    ];
    for (name, recs) in cases {
        let d = t.path().join(name.replace(' ', "-"));
        write_records(&d, &recs);
        let r = run_timeout(&["summary", path_str(&d)], 10);
        expect_one_line(&r, name, "its own ancestor");
        let r = run_timeout(&["summary", path_str(&d), "--json"], 10);
        expect_one_line(&r, name, "its own ancestor");
        let r = run_timeout(&["compare", path_str(&d), path_str(&d)], 10);
        expect_one_line(&r, name, "its own ancestor");
    }
}

// --- stdout ----------------------------------------------------------------

#[test]
fn a_failed_write_to_stdout_is_an_error() {
    let t = tmp();
    let d = t.path().join("d");
    small_dump(&d);
    let full = || {
        std::process::Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
    };
    let dur = Duration::from_secs(SECS);
    let d = path_str(&d);
    for args in [
        vec!["summary", d],
        vec!["summary", d, "--json"],
        vec!["compare", d, d],
        vec!["compare", d, d, "--json"],
        vec!["--help"],
    ] {
        let r = run_timeout_with(&args, dur, Some(full()));
        expect_one_line(&r, &format!("{args:?}"), "writing to stdout");
    }
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let t = tmp();
    let d = t.path().join("d");
    small_dump(&d);
    // A pipe whose reading end is already closed: every write gets EPIPE.
    let mut fds = [0i32; 2];
    // SAFETY: pipe fills the two descriptors of a valid two-element array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: closes the reading end this test just created and owns.
    unsafe { libc::close(fds[0]) };
    use std::os::fd::FromRawFd;
    // SAFETY: the writing end is open and owned by nothing else.
    let w = unsafe { std::os::fd::OwnedFd::from_raw_fd(fds[1]) };
    let d = path_str(&d);
    let r = run_timeout_with(
        &["compare", d, d],
        Duration::from_secs(SECS),
        Some(std::process::Stdio::from(w)),
    );
    assert!(!r.timed_out);
    assert_eq!(r.code, 0, "signal {:?}; stderr: {}", r.signal, r.stderr);
    assert!(r.stderr.is_empty(), "{}", r.stderr);
}

// --- Partition names -------------------------------------------------------

#[test]
fn bad_partition_names_are_refused() {
    let t = tmp();
    let good = t.path().join("good");
    small_dump(&good);
    let file = only_file(&good);
    // The file of the bad partition: another process, so that merged into
    // rank 0 it would pass without a word.
    let other = t.path().join("other");
    write_records(&other, &[record(0, None, "aten::relu", 1.0)]);
    let other = only_file(&other);
    for (k, (rank, device)) in [
        ("rank=abc", "device=cpu"),
        ("rank=-1", "device=cpu"),
        ("rank=0x1", "device=cpu"),
        ("rank=", "device=cpu"),
        ("rank=+1", "device=cpu"),
        ("rank=01", "device=cpu"),
        ("rank=99999999999", "device=cpu"),
        ("rank=0", "device="),
    ]
    .into_iter()
    .enumerate()
    {
        let root = t.path().join(format!("case{k}"));
        // Beside a good rank 0, which the bad one would have merged into.
        let ok = root.join("rank=0").join("device=cpu");
        std::fs::create_dir_all(&ok).unwrap();
        std::fs::copy(&file, ok.join("part-1-00000.parquet")).unwrap();
        let p = root.join(rank).join(device);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::copy(&other, p.join("part-7-00000.parquet")).unwrap();
        let bad_dir = if device == "device=" { device } else { rank };
        let r = run_timeout(&["summary", path_str(&root)], SECS);
        expect_one_line(&r, rank, &format!("{bad_dir}:"));
        assert!(r.stderr.contains("bad partition directory"), "{}", r.stderr);
        let r = run_timeout(&["compare", path_str(&good), path_str(&root)], SECS);
        expect_one_line(&r, rank, "bad partition directory");
        // The bad directory given itself.
        let r = run_timeout(&["summary", path_str(&root.join(rank))], SECS);
        expect_one_line(&r, rank, "bad partition directory");
    }
}

// --- Usage -----------------------------------------------------------------

#[test]
fn bare_opdump_is_one_usage_line() {
    let r = run_timeout(&[], SECS);
    expect_one_line(&r, "no arguments", "missing command");
    for sub in ["compare", "summary"] {
        let r = run_timeout(&[sub], SECS);
        expect_one_line(&r, sub, "see opdump --help");
    }
    let r = run_timeout(&["--help"], SECS);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("compare") && r.stdout.contains("summary"));
    assert!(r.stderr.is_empty());
}
