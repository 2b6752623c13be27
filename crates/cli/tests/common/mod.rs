//! Helpers shared by the integration tests: synthetic dumps, running the
//! `opdump` binary, and an independent look at a dump (through the format
//! crate's own reader, not the CLI's) to know which seqs a test expects.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use opdump_cli::align::{align, Alignment, Filter};
use opdump_cli::dump::Dump;
use opdump_cli::progress::Progress;
use opdump_cli::read::{load, scan};
use opdump_cli::synth::{write_model, Model, Variant};
use opdump_format::reader::{list_files, read_records};
use opdump_format::{OpRecord, Phase};

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
    load(&idx, 0, &Progress::hidden(), "test").expect("load")
}

pub fn align_dirs(a: &Path, b: &Path) -> (Dump, Dump, Alignment) {
    let (da, db) = (load_one(a), load_one(b));
    let al = align(&da, &db, &Filter::default(), &Progress::hidden());
    (da, db, al)
}

/// Matched (seq A, seq B) pairs.
pub fn seq_pairs(a: &Dump, b: &Dump, al: &Alignment) -> Vec<(i64, i64)> {
    al.pairs
        .iter()
        .map(|p| (a.seq[p.a as usize], b.seq[p.b as usize]))
        .collect()
}

pub fn seqs(d: &Dump, idx: &[u32]) -> Vec<i64> {
    idx.iter().map(|&i| d.seq[i as usize]).collect()
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}
