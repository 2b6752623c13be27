//! Bad input gives one clear `opdump:` line and exit status 2, never a
//! panic: corrupt and truncated files, empty directories, dumps of
//! different programs, unreadable schema versions, bad options.

use std::path::Path;
use std::sync::Arc;

use crate::common::*;
use opdump_format::schema::{meta, schema, BatchBuilder};
use opdump_testkit::synth::{Model, Variant};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

/// Exit 2, one line on stderr naming the problem, nothing on stdout.
fn expect_error(args: &[&str], needle: &str) {
    let r = run(args);
    assert_eq!(
        r.code, 2,
        "args {args:?}: exit {}; stderr: {}",
        r.code, r.stderr
    );
    assert!(!r.stderr.contains("panicked"), "panic: {}", r.stderr);
    assert!(r.stderr.starts_with("opdump: "), "stderr: {}", r.stderr);
    assert_eq!(
        r.stderr.trim_end().lines().count(),
        1,
        "not one line: {}",
        r.stderr
    );
    assert!(
        r.stderr.contains(needle),
        "expected {needle:?} in: {}",
        r.stderr
    );
    assert!(r.stdout.is_empty(), "stdout: {}", r.stdout);
}

fn good_dump(dir: &Path) {
    let m = Model {
        steps: 1,
        layers: 2,
        tokens: 4,
        hidden: 8,
    };
    opdump_testkit::synth::write_model(dir, &m, &Variant::default(), false, 500_000).unwrap();
}

fn partition(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("rank=0").join("device=cpu");
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn corrupt_parquet() {
    let t = tmp();
    let bad = t.path().join("bad");
    std::fs::write(
        partition(&bad).join("part-1-00000.parquet"),
        b"this is not parquet at all, not even close",
    )
    .unwrap();
    let good = t.path().join("good");
    good_dump(&good);
    expect_error(
        &["compare", path_str(&good), path_str(&bad)],
        "part-1-00000.parquet",
    );
    expect_error(&["summary", path_str(&bad)], "part-1-00000.parquet");
}

#[test]
fn truncated_parquet() {
    let t = tmp();
    let good = t.path().join("good");
    good_dump(&good);
    let bad = t.path().join("bad");
    let files = opdump_format::reader::list_files(&good).unwrap();
    let bytes = std::fs::read(&files[0].path).unwrap();
    for cut in [bytes.len() / 2, bytes.len() - 3, 10] {
        std::fs::write(partition(&bad).join("part-1-00000.parquet"), &bytes[..cut]).unwrap();
        expect_error(
            &["compare", path_str(&good), path_str(&bad)],
            "part-1-00000.parquet",
        );
    }
}

#[test]
fn corrupted_pages() {
    // A valid footer over garbage data pages: the decoder, not the footer,
    // has to fail.
    let t = tmp();
    let good = t.path().join("good");
    good_dump(&good);
    let files = opdump_format::reader::list_files(&good).unwrap();
    let mut bytes = std::fs::read(&files[0].path).unwrap();
    let n = bytes.len();
    for (i, b) in bytes[4..n / 2].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    let bad = t.path().join("bad");
    std::fs::write(partition(&bad).join("part-1-00000.parquet"), &bytes).unwrap();
    let r = run(&["compare", path_str(&good), path_str(&bad)]);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert_eq!(r.code, 2, "{}", r.stderr);
}

#[test]
fn empty_and_missing_directories() {
    let t = tmp();
    let good = t.path().join("good");
    good_dump(&good);
    let empty = t.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    expect_error(
        &["compare", path_str(&good), path_str(&empty)],
        "no opdump files",
    );
    expect_error(&["summary", path_str(&empty)], "no opdump files");
    let missing = t.path().join("missing");
    expect_error(&["compare", path_str(&missing), path_str(&good)], "missing");
    // Only in-progress files: nothing to read yet.
    std::fs::write(partition(&empty).join(".part-1-00000.parquet.tmp"), b"x").unwrap();
    expect_error(
        &["compare", path_str(&good), path_str(&empty)],
        "no opdump files",
    );
}

#[test]
fn dumps_of_different_programs() {
    let t = tmp();
    let a = t.path().join("a");
    let b = t.path().join("b");
    let m1 = Model {
        steps: 2,
        layers: 4,
        tokens: 8,
        hidden: 16,
    };
    let m2 = Model {
        steps: 2,
        layers: 4,
        tokens: 12,
        hidden: 24,
    };
    opdump_testkit::synth::write_model(&a, &m1, &Variant::default(), false, 500_000).unwrap();
    opdump_testkit::synth::write_model(&b, &m2, &Variant::default(), false, 500_000).unwrap();
    expect_error(
        &["compare", path_str(&a), path_str(&b)],
        "different programs",
    );
    // --force compares anyway.
    let r = run(&["compare", path_str(&a), path_str(&b), "--force", "--json"]);
    assert!(matches!(r.code, 0 | 1 | 3), "{}", r.stderr);
}

fn write_file(path: &Path, version: &str) {
    let mut bb = BatchBuilder::new();
    let rec = opdump_format::OpRecord {
        seq: 0,
        parent_seq: None,
        depth: 0,
        pid: 1,
        thread: 1,
        step: 0,
        phase: opdump_format::Phase::Forward,
        op: "aten::add".into(),
        overload: "Tensor".into(),
        args: String::new(),
        start_ns: 0,
        duration_ns: 1,
        error: None,
        module: None,
        fwd_seq: None,
        source: None,
        capture: None,
        tensors: vec![opdump_testkit::synth::input("self", "float32", &[2], 1.0)],
    };
    bb.append(&rec);
    let batch = bb.finish().unwrap();
    let f = std::fs::File::create(path).unwrap();
    let mut w =
        ArrowWriter::try_new(f, schema(), Some(WriterProperties::builder().build())).unwrap();
    w.write(&batch).unwrap();
    w.append_key_value_metadata(KeyValue::new(
        meta::SCHEMA_VERSION.to_string(),
        version.to_string(),
    ));
    w.close().unwrap();
}

#[test]
fn schema_versions() {
    let t = tmp();
    let good = t.path().join("good");
    good_dump(&good);
    let newer = t.path().join("newer");
    write_file(&partition(&newer).join("part-1-00000.parquet"), "99");
    expect_error(&["compare", path_str(&good), path_str(&newer)], "newer");
    let older = t.path().join("older");
    write_file(&partition(&older).join("part-1-00000.parquet"), "0");
    expect_error(
        &["compare", path_str(&older), path_str(&good)],
        "too old: this opdump reads versions 1 to 4; dump the job again with this opdump",
    );
}

#[test]
fn not_an_opdump_file() {
    // A valid Parquet file of another program.
    let t = tmp();
    let good = t.path().join("good");
    good_dump(&good);
    let other = t.path().join("other");
    let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
        "x",
        arrow_schema::DataType::Int64,
        false,
    )]));
    let batch = arrow_array::RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(arrow_array::Int64Array::from(vec![1i64, 2]))],
    )
    .unwrap();
    let f = std::fs::File::create(partition(&other).join("part-1-00000.parquet")).unwrap();
    let mut w = ArrowWriter::try_new(f, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    expect_error(
        &["compare", path_str(&good), path_str(&other)],
        "not an opdump file",
    );
}

#[test]
fn missing_columns() {
    let t = tmp();
    let good = t.path().join("good");
    good_dump(&good);
    let other = t.path().join("other");
    let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
        "seq",
        arrow_schema::DataType::Int64,
        false,
    )]));
    let batch = arrow_array::RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(arrow_array::Int64Array::from(vec![1i64, 2]))],
    )
    .unwrap();
    let f = std::fs::File::create(partition(&other).join("part-1-00000.parquet")).unwrap();
    let mut w = ArrowWriter::try_new(f, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.append_key_value_metadata(KeyValue::new(
        meta::SCHEMA_VERSION.to_string(),
        "1".to_string(),
    ));
    w.close().unwrap();
    expect_error(
        &["compare", path_str(&good), path_str(&other)],
        "is missing",
    );
}

#[test]
fn bad_options() {
    let t = tmp();
    let good = t.path().join("good");
    good_dump(&good);
    let g = path_str(&good);
    expect_error(&["compare", g, g, "--steps", "x-y"], "--steps");
    expect_error(&["compare", g, g, "--rtol", "float32"], "--rtol");
    expect_error(&["compare", g, g, "--rtol", "float99=1"], "unknown dtype");
    expect_error(&["compare", g, g, "--ignore", "("], "--ignore");
    expect_error(&["compare", g, g, "--rank", "3"], "no rank 3");
    expect_error(
        &["compare", g, g, "--steps", "7"],
        "no op calls in the selected steps",
    );
    expect_error(&["compare", g], "DUMP_B");
    expect_error(&["frobnicate"], "frobnicate");
}

/// A dump of one phase: a `gelu` per step.
fn one_phase_dump(dir: &Path, phase: opdump_format::Phase, steps: std::ops::Range<i64>) {
    use opdump_testkit::synth::{input, output, DumpWriter};
    let mut w = DumpWriter::new(dir, 0, "cpu");
    w.phase = phase;
    for step in steps {
        w.step = step;
        w.leaf(
            "aten::gelu",
            "default",
            "",
            vec![input("self", "float32", &[4], 1.0)],
            vec![output(0, "float32", &[4], 1.0)],
        )
        .unwrap();
    }
    w.close().unwrap();
}

#[test]
fn no_phase_in_common_says_what_each_dump_has_and_what_to_do() {
    use opdump_format::Phase;
    let t = tmp();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    one_phase_dump(&a, Phase::Forward, 0..3);
    one_phase_dump(&b, Phase::Optimizer, 5..8);
    expect_error(
        &["compare", path_str(&a), path_str(&b)],
        "A has steps 0..2, phases taking part: forward; B has steps 5..7, phases taking part: optimizer; dump the same steps and ops on both sides, or widen --steps and --ignore",
    );
    // An --ignore that leaves nothing: no phase takes part on either side.
    expect_error(
        &["compare", path_str(&a), path_str(&a), "--ignore", "gelu"],
        "A has steps 0..2, phases taking part: none; B has steps 0..2, phases taking part: none",
    );
}
