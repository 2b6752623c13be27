//! Helpers shared by the integration tests: synthetic dumps, running the
//! `opdump` binary, and an independent look at a dump (through the format
//! crate's own reader, not the CLI's) to know which seqs a test expects.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use opdump_format::reader::list_files;
use opdump_format::{Capture, CapturedTensor, OpRecord, Phase};
use opdump_judge::align::{align, Alignment, Filter};
use opdump_judge::dump::Dump;
use opdump_judge::Silent;
use opdump_load::read::{load, scan};
use opdump_testkit::records::read_records;
use opdump_testkit::synth::{input, output, write_model, DumpWriter, Model, Variant};

pub fn opdump(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opdump"))
        .args(args)
        .output()
        .expect("run opdump")
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(args: &[&str]) -> Run {
    let o = opdump(args);
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `opdump compare A B --json ...` parsed.
pub fn compare_json(a: &Path, b: &Path, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let mut args = vec!["compare", path_str(a), path_str(b), "--json"];
    args.extend_from_slice(extra);
    let r = run(&args);
    assert!(!r.stderr.contains("panicked"), "panic: {}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON ({e}); exit {}; stderr: {}; stdout: {}",
            r.code, r.stderr, r.stdout
        )
    });
    (r.code, v, r.stderr)
}

pub fn small_model() -> Model {
    Model {
        steps: 3,
        layers: 6,
        tokens: 8,
        hidden: 16,
    }
}

/// Writes side A and side B of a synthetic run under `root/a` and `root/b`.
pub fn model_pair(root: &Path, m: &Model, v: &Variant) -> (PathBuf, PathBuf) {
    let (a, b) = (root.join("a"), root.join("b"));
    write_model(&a, m, v, false, 500_000).expect("write A");
    write_model(&b, m, v, true, 500_000).expect("write B");
    (a, b)
}

/// Every record of a dump, in seq order, read by the format crate.
pub fn records(dir: &Path) -> Vec<OpRecord> {
    let mut out = Vec::new();
    for f in list_files(dir).expect("list") {
        out.extend(read_records(&f.path).expect("read"));
    }
    out.sort_by_key(|r| r.seq);
    out
}

/// The seq of the `n`-th (0-based) top-level call of `op` in the forward of
/// `step`.
pub fn nth_root(recs: &[OpRecord], step: i64, op: &str, n: usize) -> i64 {
    recs.iter()
        .filter(|r| r.step == step && r.phase == Phase::Forward && r.depth == 0 && r.op == op)
        .nth(n)
        .unwrap_or_else(|| panic!("no {op} #{n} in step {step}"))
        .seq
}

/// The seq of the first child named `op` of the call `parent`.
pub fn child(recs: &[OpRecord], parent: i64, op: &str) -> i64 {
    recs.iter()
        .find(|r| r.parent_seq == Some(parent) && r.op == op)
        .unwrap_or_else(|| panic!("no child {op} of seq {parent}"))
        .seq
}

pub fn load_one(dir: &Path) -> Dump {
    let idx = scan(dir).expect("scan");
    load(&idx, 0, &Silent, "test").expect("load")
}

pub fn align_dirs(a: &Path, b: &Path) -> (Dump, Dump, Alignment) {
    let (da, db) = (load_one(a), load_one(b));
    let al = align(&da, &db, &Filter::default(), &Silent);
    (da, db, al)
}

/// Matched (seq A, seq B) pairs.
pub fn seq_pairs(a: &Dump, b: &Dump, al: &Alignment) -> Vec<(i64, i64)> {
    al.pairs.iter().map(|p| (a.seq(p.a), b.seq(p.b))).collect()
}

pub fn seqs(d: &Dump, idx: &[u32]) -> Vec<i64> {
    idx.iter().map(|&i| d.seq(i)).collect()
}

/// `opdump compare` of two dump directories, with the default settings.
pub fn compare_dirs(a: &Path, b: &Path) -> opdump_judge::compare::Compared {
    let settings = opdump_judge::compare::CompareSettings {
        filter: Filter::default(),
        tol: opdump_judge::tolerance::Tolerances::default(),
        top: 10,
        force: false,
        context_before: None,
    };
    opdump_judge::compare::compare_dumps(load_one(a), load_one(b), settings, vec![], &Silent)
        .expect("compare")
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Runs `opdump` with stdout on `stdout` (piped when `None`), killing it
/// after `timeout`: a hang fails the test instead of blocking the suite.
/// `code` is -1 when a signal ended the process; `timed_out` says whether
/// the timeout did.
pub struct TimedRun {
    pub code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

pub fn run_timeout_with(
    args: &[&str],
    timeout: std::time::Duration,
    stdout: Option<std::process::Stdio>,
) -> TimedRun {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let piped = stdout.is_none();
    let mut child = Command::new(env!("CARGO_BIN_EXE_opdump"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout.unwrap_or_else(Stdio::piped))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn opdump");
    // Pipes are drained on threads, so a chatty child cannot block on them.
    let mut out_pipe = if piped { child.stdout.take() } else { None };
    let mut err_pipe = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.read_to_end(&mut v);
        }
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_end(&mut v);
        }
        v
    });
    let start = std::time::Instant::now();
    let (status, timed_out) = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break (s, false);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            break (child.wait().expect("wait"), true);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    TimedRun {
        code: status.code().unwrap_or(-1),
        signal: status.signal(),
        timed_out,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

pub fn run_timeout(args: &[&str], secs: u64) -> TimedRun {
    run_timeout_with(args, std::time::Duration::from_secs(secs), None)
}

/// Exit 2, exactly one `opdump:` line on stderr holding `needle`, no panic,
/// nothing on stdout, within the timeout.
pub fn expect_one_line(r: &TimedRun, what: &str, needle: &str) {
    assert!(
        !r.timed_out,
        "{what}: timed out (hang); stderr: {}",
        r.stderr
    );
    assert_eq!(
        r.code, 2,
        "{what}: exit {} signal {:?}; stderr: {}",
        r.code, r.signal, r.stderr
    );
    assert!(
        !r.stderr.contains("panicked"),
        "{what}: panic: {}",
        r.stderr
    );
    assert!(
        r.stderr.starts_with("opdump: "),
        "{what}: stderr: {}",
        r.stderr
    );
    assert_eq!(
        r.stderr.trim_end().lines().count(),
        1,
        "{what}: not one line: {}",
        r.stderr
    );
    assert!(
        r.stderr.contains(needle),
        "{what}: expected {needle:?} in: {}",
        r.stderr
    );
    assert!(r.stdout.is_empty(), "{what}: stdout: {}", r.stdout);
}

/// A small valid dump (one step, two layers) under `dir`.
pub fn small_dump(dir: &Path) {
    let m = Model {
        steps: 1,
        layers: 2,
        tokens: 4,
        hidden: 8,
    };
    opdump_testkit::synth::write_model(dir, &m, &Variant::default(), false, 500_000)
        .expect("write dump");
}

/// The only file of a dump written by [`small_dump`].
pub fn only_file(dir: &Path) -> PathBuf {
    let files = list_files(dir).expect("list");
    assert_eq!(files.len(), 1);
    files[0].path.clone()
}

/// Writes `records` as they are (seq, parent_seq and all) into
/// `root/rank=0/device=cpu/`, with the real writer.
pub fn write_records(root: &Path, records: &[OpRecord]) {
    use opdump_format::{RotateOptions, RotatingWriter};
    let dir = root.join("rank=0").join("device=cpu");
    let md = vec![(
        opdump_format::schema::meta::PID.to_string(),
        "7".to_string(),
    )];
    let mut w = RotatingWriter::new(dir, "part-7".to_string(), RotateOptions::default(), md);
    for r in records {
        w.append(r).expect("append");
    }
    w.close_file().expect("close");
}

/// A top-level record with one input and one output at scale `x`.
pub fn record(seq: i64, parent_seq: Option<i64>, op: &str, x: f64) -> OpRecord {
    OpRecord {
        seq,
        parent_seq,
        depth: if parent_seq.is_some() { 1 } else { 0 },
        pid: 7,
        thread: 1,
        step: 0,
        phase: Phase::Forward,
        op: op.to_string().into(),
        overload: "default".to_string().into(),
        args: String::new(),
        start_ns: seq * 1000,
        duration_ns: 10,
        error: None,
        module: None,
        fwd_seq: None,
        source: None,
        capture: None,
        tensors: vec![
            opdump_testkit::synth::input("self", "float32", &[4, 8], x),
            opdump_testkit::synth::output(0, "float32", &[4, 8], x),
        ],
    }
}

/// Thrift compact zigzag varint of an i64: how a Parquet footer stores the
/// integers the hostile-input and mutation tests forge.
pub fn varint(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A dump of one gelu call whose output holds `out`; captured or not. The
/// statistics rows are the same for any order of `out`.
pub fn gelu_dump(dir: &Path, out: &[f32], captured: bool) {
    let x = [0.5f32, -1.0, 2.0, 1.5];
    let mut w = DumpWriter::new(dir, 0, "cpu");
    let (i, o) = (
        vec![input("self", "float32", &[4], 1.0)],
        vec![output(0, "float32", &[4], 2.0)],
    );
    if captured {
        let t = |key: &str, v: &[f32]| CapturedTensor {
            key: key.into(),
            dtype: "float32".into(),
            shape: vec![4],
            data: f32s(v),
        };
        let cap = Capture {
            selector: "aten::gelu#0".into(),
            args: "[]".into(),
            tensors: vec![t("input.self", &x), t("output.0", out)],
            outputs_skipped: false,
            file: None,
        };
        w.leaf_captured("aten::gelu", i, o, cap).expect("write");
    } else {
        w.leaf("aten::gelu", "default", "", i, o).expect("write");
    }
    w.close().expect("close");
}

/// The value of attribute `name` in an HTML start tag.
pub fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&tag[start..start + tag[start..].find('"')?])
}

/// Every `<details …>` start tag of a page's module tree, in page order,
/// with the `data-path` of the nearest `<details>` it is nested in.
pub fn details_tags(page: &str) -> Vec<(&str, Option<String>)> {
    let mut out = Vec::new();
    let mut stack: Vec<Option<String>> = Vec::new();
    let mut rest = page;
    while let Some(i) = rest
        .find("<details")
        .into_iter()
        .chain(rest.find("</details>"))
        .min()
    {
        rest = &rest[i..];
        if rest.starts_with("</details>") {
            stack.pop();
            rest = &rest[10..];
            continue;
        }
        let tag = &rest[..rest.find('>').unwrap()];
        out.push((tag, stack.iter().rev().flatten().next().cloned()));
        stack.push(attr(tag, "data-path").map(str::to_string));
        rest = &rest[tag.len()..];
    }
    out
}
