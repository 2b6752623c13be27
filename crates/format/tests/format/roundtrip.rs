//! The writer and reader against each other, and against the promises of the
//! file layout: hidden temporary files, rotation, complete visible files.

use std::path::Path;
use std::time::{Duration, Instant};

use opdump_format::reader::{file_metadata, list_files};
use opdump_format::schema::meta;
use opdump_format::{
    OpRecord, Phase, Role, RotateOptions, RotatingWriter, Stats, StatsStatus, TensorRecord,
};
use opdump_testkit::records::read_records;

fn tensor(role: Role, arg: &str, v: f64) -> TensorRecord {
    TensorRecord {
        role,
        arg: arg.to_string().into(),
        list_index: None,
        dtype: "float32".into(),
        shape: vec![2, 3],
        stride: vec![3, 1],
        device: "cpu".into(),
        numel: 6,
        name: None,
        capture_key: None,
        status: StatsStatus::Computed,
        stats: Stats {
            min: -v,
            max: v,
            mean: 0.5 * v,
            std: 0.25,
            l2: 2.0 * v,
            absmax: v,
            nan_count: 1,
            posinf_count: 0,
            neginf_count: 2,
            zero_count: 0,
        },
        fingerprint: None,
        sketch: None,
    }
}

fn record(seq: i64) -> OpRecord {
    OpRecord {
        seq,
        parent_seq: (seq % 2 == 1).then(|| seq - 1),
        depth: (seq % 2) as i32,
        pid: 42,
        thread: 7,
        step: seq / 10,
        phase: Phase::Forward,
        op: "aten::add".into(),
        overload: "Tensor".into(),
        args: "alpha=1".into(),
        start_ns: 1000 + seq,
        duration_ns: 5,
        error: None,
        module: None,
        fwd_seq: None,
        source: None,
        capture: None,
        tensors: vec![
            tensor(Role::Input, "self", seq as f64),
            tensor(Role::Output, "0", seq as f64 + 1.0),
        ],
    }
}

fn opts(max_rows: u64) -> RotateOptions {
    RotateOptions {
        max_rows,
        max_age: Duration::from_secs(3600),
        batch_rows: 16,
        ..Default::default()
    }
}

fn read_all(dir: &Path) -> Vec<OpRecord> {
    let mut out: Vec<OpRecord> = list_files(dir)
        .unwrap()
        .iter()
        .flat_map(|f| read_records(&f.path).unwrap())
        .collect();
    out.sort_by_key(|r| r.seq);
    out
}

#[test]
fn records_read_back_equal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rank=0/device=cpu");
    let mut w = RotatingWriter::new(
        &dir,
        "part-42",
        opts(1_000_000),
        vec![("opdump.pid".into(), "42".into())],
    );
    let mut recs: Vec<OpRecord> = (0..100).map(record).collect();
    // An op without tensors, an op that raised, a tensor without values.
    recs[3].tensors.clear();
    recs[4].error = Some("shape mismatch".into());
    recs[5].tensors[0].status = StatsStatus::Uninitialized;
    recs[5].tensors[0].stats = Stats::NONE;
    recs[6].tensors[1].stats.min = f64::NAN; // no finite element: null in the file
    for r in &recs {
        w.append(r).unwrap();
    }
    w.close_file().unwrap();
    assert_eq!(w.ops_written(), 100);
    let back = read_all(tmp.path());
    assert_eq!(back.len(), recs.len());
    for (a, b) in recs.iter().zip(&back) {
        if a.seq == 6 {
            assert!(b.tensors[1].stats.min.is_nan());
            continue;
        }
        // Debug text compares NaN (no value) as equal to itself.
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "seq {}", a.seq);
    }
    let files = list_files(tmp.path()).unwrap();
    assert_eq!(files[0].rank, Some(0));
    assert_eq!(files[0].device.as_deref(), Some("cpu"));
}

#[test]
fn rotates_by_rows_and_keeps_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = RotatingWriter::new(tmp.path(), "part-1", opts(50), vec![]);
    for s in 0..100 {
        w.append(&record(s)).unwrap(); // 2 rows each: a file every 25 ops
    }
    w.close_file().unwrap();
    let files = list_files(tmp.path()).unwrap();
    assert_eq!(files.len(), 4);
    let kv = file_metadata(&files[1].path).unwrap();
    assert_eq!(
        kv[meta::SCHEMA_VERSION],
        opdump_format::SCHEMA_VERSION.to_string()
    );
    assert_eq!(kv[meta::OP_CALLS], "25");
    assert_eq!(kv[meta::SEQ_MIN], "25");
    assert_eq!(kv[meta::SEQ_MAX], "49");
    assert_eq!(read_all(tmp.path()).len(), 100);
}

#[test]
fn rotates_by_age() {
    // The clock is driven by hand, so no scheduling delay changes the
    // outcome: a file opened before `Instant::now()` is at least `max_age`
    // old at `now + max_age`, and younger than an hour at `now`.
    let tmp = tempfile::tempdir().unwrap();
    let max_age = Duration::from_secs(3600);
    let o = RotateOptions {
        max_age,
        ..opts(1_000_000)
    };
    let mut w = RotatingWriter::new(tmp.path(), "part-1", o, vec![]);
    w.append(&record(0)).unwrap();
    w.tick(Instant::now()).unwrap(); // too young: stays hidden
    assert!(list_files(tmp.path()).is_err(), "no visible file yet");
    w.tick(Instant::now() + max_age).unwrap();
    assert_eq!(list_files(tmp.path()).unwrap().len(), 1);
    w.append(&record(1)).unwrap();
    w.tick(Instant::now()).unwrap(); // the new file is too young
    assert_eq!(list_files(tmp.path()).unwrap().len(), 1);
    w.tick(Instant::now() + max_age).unwrap();
    assert_eq!(list_files(tmp.path()).unwrap().len(), 2);
}

#[test]
fn stopped_writer_leaves_only_complete_visible_files() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = RotatingWriter::new(tmp.path(), "part-9", opts(40), vec![]);
    for s in 0..50 {
        w.append(&record(s)).unwrap();
    }
    // The writer stops early (a crash): the open file is never completed.
    std::mem::forget(w);
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with(".part-9-") && n.ends_with(".parquet.tmp")),
        "{names:?}"
    );
    let back = read_all(tmp.path());
    // 2 rows per op and 40 rows per file: two complete files of 20 ops.
    assert_eq!(back.len(), 40, "the completed files hold the first 40 ops");
    assert_eq!(back.last().unwrap().seq, 39);
}

#[test]
fn abandon_removes_the_open_file_and_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = RotatingWriter::new(tmp.path(), "part-3", opts(1_000_000), vec![]);
    for s in 0..7 {
        w.append(&record(s)).unwrap();
    }
    assert_eq!(w.abandon(), 7);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn files_are_private_by_default() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let mut w = RotatingWriter::new(&dir, "part-1", opts(10), vec![]);
    w.append(&record(0)).unwrap();
    w.close_file().unwrap();
    let f = &list_files(&dir).unwrap()[0].path;
    assert_eq!(
        std::fs::metadata(f).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
}

#[test]
fn reader_rejects_foreign_and_newer_files() {
    use arrow_array::{Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    use std::sync::Arc;

    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, version: Option<&str>| {
        let schema = Arc::new(Schema::new(vec![Field::new("seq", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1]))])
            .unwrap();
        let path = tmp.path().join(name);
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        if let Some(v) = version {
            w.append_key_value_metadata(KeyValue::new(meta::SCHEMA_VERSION.into(), v.to_string()));
        }
        w.close().unwrap();
        path
    };
    let foreign = write("a.parquet", None);
    let err = file_metadata(&foreign).unwrap_err().to_string();
    assert!(err.contains("not an opdump file"), "{err}");
    let newer = write("b.parquet", Some("99"));
    let err = file_metadata(&newer).unwrap_err().to_string();
    assert!(
        err.contains(
            "newer than this opdump (reads up to 4): compare it with the opdump that wrote it"
        ),
        "{err}"
    );
    let truncated = tmp.path().join("c.parquet");
    std::fs::write(&truncated, b"PAR1garbage").unwrap();
    assert!(file_metadata(&truncated).is_err());
    let empty = tempfile::tempdir().unwrap();
    assert!(list_files(empty.path())
        .unwrap_err()
        .to_string()
        .contains("no opdump files"));
}

#[test]
fn a_captured_call_writes_its_file_and_its_rows_name_it() {
    use opdump_format::capture::{meta as cmeta, CaptureFile};
    use opdump_format::{Capture, CapturedTensor};
    let tmp = tempfile::tempdir().unwrap();
    let mut w = RotatingWriter::new(tmp.path(), "part-77", opts(1000), vec![]);
    let mut rec = record(5);
    rec.tensors[0].capture_key = Some("input.self".into());
    rec.tensors[1].capture_key = Some("output.0".into());
    let values: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let saved = |key: &str| CapturedTensor {
        key: key.into(),
        dtype: "float32".into(),
        shape: vec![2, 3],
        data: values.clone(),
    };
    rec.capture = Some(Capture {
        selector: "aten::op#0".into(),
        args: "[]".into(),
        tensors: vec![saved("input.self"), saved("output.0")],
        outputs_skipped: false,
        file: None,
    });
    w.write_capture(&mut rec).unwrap();
    let name = rec.capture.as_ref().unwrap().file.clone().unwrap();
    assert_eq!(name, "capture-77-00000.safetensors");
    w.append(&rec).unwrap();
    // A record without a capture writes no file and names none.
    let mut plain = record(6);
    w.write_capture(&mut plain).unwrap();
    w.append(&plain).unwrap();
    w.close_file().unwrap();
    assert_eq!(w.captures_written(), 1);
    let f = CaptureFile::open(&tmp.path().join(&name)).unwrap();
    assert_eq!(f.keys(), ["input.self", "output.0"]);
    assert_eq!(f.tensor("output.0").unwrap().data, values.as_slice());
    assert_eq!(f.metadata[cmeta::SEQ], "5");
    assert_eq!(f.metadata[cmeta::SELECTOR], "aten::op#0");
    let back = read_all(tmp.path());
    assert_eq!(
        back[0].capture.as_ref().unwrap().file.as_deref(),
        Some(name.as_str())
    );
    assert_eq!(back[0].tensors[1].capture_key.as_deref(), Some("output.0"));
    assert!(back[1].capture.is_none() && back[1].tensors[0].capture_key.is_none());
    // Nothing hidden is left behind.
    let hidden: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(hidden.is_empty());
}
