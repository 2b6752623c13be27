//! The schema table (`schema::COLUMNS`) against what depends on it: the
//! column table of docs/reference/schema.md, and the reader facing files
//! whose columns are in another order or of another type.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use opdump_format::schema::{meta, BatchBuilder, ColType, COLUMNS, SCHEMA_VERSION};
use opdump_format::{OpRecord, Phase, Role, Stats, StatsStatus, TensorRecord};
use opdump_testkit::records::read_records;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;

/// How the README spells a column type.
fn readme_type(t: ColType) -> &'static str {
    match t {
        ColType::Int32 => "int32",
        ColType::Int64 => "int64",
        ColType::Float64 => "float64",
        ColType::UInt64 => "uint64",
        ColType::Utf8 => "string",
        ColType::Int64List => "list of int64",
        ColType::Float64List => "list of float64",
    }
}

/// One column as the README declares it: (name, type, nullable).
type Declared = (String, String, bool);

/// The rows of the README's `| column | type | meaning |` table. A row may
/// declare several columns: `` `pid`, `thread` `` with one type for all or
/// one per name (`int32, int64`); a trailing `, null` makes them nullable.
fn readme_columns(readme: &str) -> Vec<Declared> {
    let mut lines = readme
        .lines()
        .skip_while(|l| !l.starts_with("| column | type |"));
    assert!(
        lines.next().is_some(),
        "README.md has no `| column | type | meaning |` table"
    );
    let mut out = Vec::new();
    for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (names, ty) = (cells[1], cells[2]);
        let names: Vec<String> = names
            .split(',')
            .map(|n| n.trim().trim_matches('`').to_string())
            .collect();
        let mut types: Vec<&str> = ty.split(',').map(str::trim).collect();
        let nullable = types.last() == Some(&"null");
        if nullable {
            types.pop();
        }
        assert!(
            types.len() == 1 || types.len() == names.len(),
            "README row {line:?}: {} names but {} types",
            names.len(),
            types.len()
        );
        for (i, n) in names.into_iter().enumerate() {
            let t = types[if types.len() == 1 { 0 } else { i }];
            out.push((n, t.to_string(), nullable));
        }
    }
    out
}

fn show(d: &Declared) -> String {
    format!("{} {}{}", d.0, d.1, if d.2 { ", null" } else { "" })
}

#[test]
fn readme_table_matches_the_schema() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference/schema.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let documented = readme_columns(&readme);
    let code: Vec<Declared> = COLUMNS
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                readme_type(c.ty).to_string(),
                c.nullable,
            )
        })
        .collect();
    // Line by line, in file order, so a swap or a missing column shows
    // where it is.
    let mut diff = Vec::new();
    for i in 0..code.len().max(documented.len()) {
        match (code.get(i), documented.get(i)) {
            (Some(c), Some(d)) if c == d => {}
            (c, d) => diff.push(format!(
                "  column {i}: code `{}`, README `{}`",
                c.map_or("-".into(), show),
                d.map_or("-".into(), show)
            )),
        }
    }
    assert!(
        diff.is_empty(),
        "the README's column table ({}) disagrees with schema::COLUMNS:\n{}",
        path.display(),
        diff.join("\n")
    );
}

fn record() -> OpRecord {
    OpRecord {
        seq: 3,
        parent_seq: Some(1),
        depth: 1,
        pid: 42,
        thread: 7,
        step: 2,
        phase: Phase::Backward,
        op: "aten::mul".into(),
        overload: "Tensor".into(),
        args: String::new(),
        start_ns: 10,
        duration_ns: 5,
        error: Some("boom".into()),
        module: None,
        fwd_seq: None,
        source: None,
        capture: None,
        tensors: vec![TensorRecord {
            role: Role::Output,
            arg: "0".into(),
            list_index: Some(1),
            dtype: "bfloat16".into(),
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
                mean: 0.5,
                std: 0.75,
                l2: 3.0,
                absmax: 2.0,
                nan_count: 1,
                posinf_count: 2,
                neginf_count: 3,
                zero_count: 4,
            },
            fingerprint: None,
            sketch: None,
        }],
    }
}

/// Writes one batch as a version-1 dump file, with the given fields and
/// arrays instead of the table's.
fn write_file(path: &Path, fields: Vec<Field>, cols: Vec<ArrayRef>) {
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.append_key_value_metadata(KeyValue::new(
        meta::SCHEMA_VERSION.into(),
        SCHEMA_VERSION.to_string(),
    ));
    w.close().unwrap();
}

/// The columns of `record()`, as the writer builds them.
fn columns() -> Vec<(Field, ArrayRef)> {
    let mut b = BatchBuilder::new();
    b.append(&record());
    let batch = b.finish().unwrap();
    batch
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .zip(batch.columns().iter().cloned())
        .collect()
}

/// Columns are found by name: a file that has them in another order (as a
/// tool that rewrote it may leave them) reads back the same.
#[test]
fn reordered_columns_read_back_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("part-1-00000.parquet");
    let (fields, cols): (Vec<_>, Vec<_>) = columns().into_iter().rev().unzip();
    write_file(&path, fields, cols);
    assert_eq!(read_records(&path).unwrap(), vec![record()]);
}

/// A column of another type than the table's is refused with an error
/// that names it, for every column, and never panics the reader.
#[test]
fn mistyped_columns_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    for (k, c) in COLUMNS.iter().enumerate() {
        let path = tmp.path().join(format!("{}.parquet", c.name));
        let (mut fields, mut cols): (Vec<_>, Vec<_>) = columns().into_iter().unzip();
        // A string column becomes int64, any other a string.
        let (ty, col): (DataType, ArrayRef) = if c.ty == ColType::Utf8 {
            (DataType::Int64, Arc::new(Int64Array::from(vec![1])))
        } else {
            (DataType::Utf8, Arc::new(StringArray::from(vec!["x"])))
        };
        fields[k] = Field::new(c.name, ty.clone(), true);
        cols[k] = col;
        write_file(&path, fields, cols);
        let err = std::panic::catch_unwind(|| read_records(&path))
            .unwrap_or_else(|_| panic!("reading a mistyped {:?} panicked", c.name))
            .unwrap_err()
            .to_string();
        let expected = format!(
            "column {:?} has type {ty}, expected {}",
            c.name,
            c.ty.data_type()
        );
        assert!(err.contains(&expected), "{}: {err}", c.name);
    }
}
