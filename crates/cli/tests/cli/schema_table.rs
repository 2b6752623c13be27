//! The CLI's loader against the format's schema table (`schema::COLUMNS`):
//! every column it decodes must be in the table with the type it expects,
//! and a file that disagrees with the table is refused by column name, not
//! misread and not a panic. Columns are found by name, so their order in a
//! file does not matter.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use opdump_format::schema::{col, meta, BatchBuilder, ColType, COLUMNS, SCHEMA_VERSION};
use opdump_format::{OpRecord, Phase, Role, Stats, StatsStatus, TensorRecord};
use opdump_judge::dump::Dump;
use opdump_judge::Silent;
use opdump_load::read::{load, scan};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;

fn record(seq: i64) -> OpRecord {
    OpRecord {
        seq,
        parent_seq: None,
        depth: 0,
        pid: 5,
        thread: 1,
        step: 0,
        phase: Phase::Forward,
        op: "aten::mul".into(),
        overload: "Tensor".into(),
        args: String::new(),
        start_ns: 0,
        duration_ns: 1,
        error: None,
        module: None,
        fwd_seq: None,
        source: None,
        capture: None,
        tensors: vec![TensorRecord {
            role: Role::Output,
            arg: "0".into(),
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
                min: -1.0,
                max: 2.0,
                mean: 0.5 + seq as f64,
                std: 0.75,
                l2: 3.0,
                absmax: 2.0,
                nan_count: 1,
                posinf_count: 0,
                neginf_count: 0,
                zero_count: 4,
            },
            fingerprint: None,
            sketch: None,
        }],
    }
}

/// The fields and columns of two records, as the writer builds them.
fn columns() -> (Vec<Field>, Vec<ArrayRef>) {
    let mut b = BatchBuilder::new();
    b.append(&record(1));
    b.append(&record(2));
    let batch = b.finish().unwrap();
    let fields = batch
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    (fields, batch.columns().to_vec())
}

/// A one-file dump of rank 0 under `root`.
fn write_dump(root: &Path, fields: Vec<Field>, cols: Vec<ArrayRef>) -> PathBuf {
    let dir = root.join("rank=0").join("device=cpu");
    std::fs::create_dir_all(&dir).unwrap();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
    let f = std::fs::File::create(dir.join("part-5-00000.parquet")).unwrap();
    let mut w = ArrowWriter::try_new(f, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.append_key_value_metadata(KeyValue::new(
        meta::SCHEMA_VERSION.into(),
        SCHEMA_VERSION.to_string(),
    ));
    w.close().unwrap();
    root.to_path_buf()
}

fn try_load(dir: &Path) -> Result<Dump, String> {
    let index = scan(dir).map_err(|e| e.to_string())?;
    load(&index, 0, &Silent, "test").map_err(|e| e.to_string())
}

#[test]
fn reordered_columns_load_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let (fields, cols) = columns();
    let plain = try_load(&write_dump(
        &tmp.path().join("a"),
        fields.clone(),
        cols.clone(),
    ))
    .unwrap();
    let (fields, cols) = (
        fields.into_iter().rev().collect(),
        cols.into_iter().rev().collect(),
    );
    let reversed = try_load(&write_dump(&tmp.path().join("b"), fields, cols)).unwrap();
    for d in [&plain, &reversed] {
        assert_eq!(
            (0..d.len() as u32).map(|i| d.seq(i)).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(d.full_name(0), "aten::mul.Tensor");
        assert_eq!([d.tensors.row(0).mean, d.tensors.row(1).mean], [1.5, 2.5]);
        assert_eq!(d.tensors.nonfinite_counts(1), [1, 0, 0]);
        assert_eq!([d.tensors.row(0).zero, d.tensors.row(1).zero], [4, 4]);
        assert_eq!(d.shape(0), &[2, 3]);
    }
}

/// Each column of the table in turn gets another type: the loader either
/// never decodes it, or refuses the file with an error naming it. The
/// columns it never decodes are exactly those `read.rs` says it skips; all
/// others must therefore be in the table with the type the loader expects
/// (the untouched file loads).
#[test]
fn each_mistyped_column_is_refused_or_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let mut unread = BTreeSet::new();
    for (k, c) in COLUMNS.iter().enumerate() {
        let (mut fields, mut cols) = columns();
        let (ty, array): (DataType, ArrayRef) = if c.ty == ColType::Utf8 {
            (DataType::Int64, Arc::new(Int64Array::from(vec![1, 2])))
        } else {
            (DataType::Utf8, Arc::new(StringArray::from(vec!["x", "y"])))
        };
        fields[k] = Field::new(c.name, ty, true);
        cols[k] = array;
        let dir = write_dump(&tmp.path().join(c.name), fields, cols);
        let result = std::panic::catch_unwind(|| try_load(&dir))
            .unwrap_or_else(|_| panic!("loading a mistyped {:?} panicked", c.name));
        match result {
            Ok(_) => {
                unread.insert(c.name);
            }
            Err(e) => assert!(
                e.contains(&format!("column {:?} has unexpected type", c.name)),
                "{}: {e}",
                c.name
            ),
        }
    }
    let expected: BTreeSet<&str> = [
        col::PID,
        col::THREAD,
        col::START_NS,
        col::DURATION_NS,
        col::STRIDE,
        col::TENSOR_DEVICE,
    ]
    .into();
    assert_eq!(unread, expected);
}

/// A dump of schema version 1 (no `module`, `fwd_seq`, `source`, `name`
/// columns) loads with those null, and the reports say so once per dump.
#[test]
fn schema_1_dumps_load_without_module_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let v2 = [col::MODULE, col::FWD_SEQ, col::SOURCE, col::NAME];
    let write_v1 = |root: &Path| {
        let (fields, cols) = columns();
        let (fields, cols): (Vec<Field>, Vec<ArrayRef>) = fields
            .into_iter()
            .zip(cols)
            .filter(|(f, _)| !v2.contains(&f.name().as_str()))
            .unzip();
        let dir = root.join("rank=0").join("device=cpu");
        std::fs::create_dir_all(&dir).unwrap();
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
        // Two files: the note is still said once.
        for part in ["part-5-00000.parquet", "part-5-00001.parquet"] {
            let f = std::fs::File::create(dir.join(part)).unwrap();
            let mut w = ArrowWriter::try_new(f, schema.clone(), None).unwrap();
            let mut b = batch.clone();
            if part.ends_with("1.parquet") {
                // seqs 3 and 4
                let seq: ArrayRef = Arc::new(Int64Array::from(vec![3, 4]));
                let i = b.schema().index_of(col::SEQ).unwrap();
                let mut cs = b.columns().to_vec();
                cs[i] = seq;
                b = RecordBatch::try_new(b.schema(), cs).unwrap();
            }
            w.write(&b).unwrap();
            w.append_key_value_metadata(KeyValue::new(
                meta::SCHEMA_VERSION.to_string(),
                "1".to_string(),
            ));
            w.close().unwrap();
        }
        root.to_path_buf()
    };
    let old = write_v1(&tmp.path().join("old"));
    let d = try_load(&old).unwrap();
    assert_eq!(
        (0..d.len() as u32).map(|i| d.seq(i)).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert_eq!(d.schema_version, 1);
    assert!(!d.has_modules);
    assert!((0..4).all(|i| d.module_of(i).is_none() && d.fwd_seq_of(i).is_none()));
    assert!((0..4).all(|t| d.tensor_name(t).is_none()));

    let (fields, cols) = columns();
    let new = write_dump(&tmp.path().join("new"), fields, cols);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_opdump"))
        .args(["compare", old.to_str().unwrap(), new.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let notes: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("schema version 1"))
        .collect();
    assert_eq!(notes.len(), 1, "{text}");
    assert!(
        notes[0].contains("no module, fwd_seq, source or name"),
        "{text}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_opdump"))
        .args(["summary", old.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("schema version 1").count(), 1, "{text}");
}
