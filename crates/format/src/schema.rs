//! The Arrow schema of a dump file, and the builders that turn records into
//! record batches, both made from the table in [`crate::columns`].
//!
//! One row per tensor; the op-level columns repeat on each row of an op, so
//! pandas and DuckDB need no join. No column is named `rank` or `device`:
//! those are the directory's partition keys (`rank=<R>/device=<D>/`).

use std::sync::{Arc, OnceLock};

use arrow_array::builder::{
    Float64Builder, Int32Builder, Int64Builder, ListBuilder, StringBuilder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

pub use crate::columns::{col, ColType, ColumnDef, COLUMNS};
use crate::columns::{for_each_column, Stats};
use crate::record::{OpRecord, Role, StatsStatus};

/// Bumped whenever a column is added, removed or changes meaning.
pub const SCHEMA_VERSION: u32 = 4;
/// The oldest schema version this build can read.
pub const MIN_READABLE_SCHEMA_VERSION: u32 = 1;

/// Key-value metadata keys of each file.
pub mod meta {
    pub const SCHEMA_VERSION: &str = "opdump.schema_version";
    pub const PLUGIN_VERSION: &str = "opdump.version";
    pub const TORCH_VERSION: &str = "opdump.torch_version";
    pub const PID: &str = "opdump.pid";
    pub const RANK: &str = "opdump.rank";
    pub const LOCAL_RANK: &str = "opdump.local_rank";
    pub const DEVICE: &str = "opdump.device";
    /// The float type statistics were accumulated in on this device.
    pub const STATS_ACCUMULATE: &str = "opdump.stats_accumulate";
    pub const ROWS: &str = "opdump.rows";
    pub const OP_CALLS: &str = "opdump.op_calls";
    pub const SEQ_MIN: &str = "opdump.seq_min";
    pub const SEQ_MAX: &str = "opdump.seq_max";
    /// Set in the files of a forked child: the pid of the process it forked
    /// from, whose seq numbers it continues.
    pub const FORKED_FROM: &str = "opdump.forked_from";
    /// The CRC-32 of each column chunk (see [`crate::checksum`]).
    pub const CHUNK_CRC32: &str = "opdump.chunk_crc32";
}

impl ColType {
    /// The Arrow type the writer gives the column.
    pub fn data_type(self) -> DataType {
        match self {
            ColType::Int32 => DataType::Int32,
            ColType::Int64 => DataType::Int64,
            ColType::Float64 => DataType::Float64,
            ColType::UInt64 => DataType::UInt64,
            ColType::Utf8 => DataType::Utf8,
            ColType::Int64List => {
                DataType::List(Arc::new(Field::new("item", DataType::Int64, true)))
            }
            ColType::Float64List => {
                DataType::List(Arc::new(Field::new("item", DataType::Float64, true)))
            }
        }
    }

    /// Whether a file's column of type `t` can be read as this type. A
    /// list's item field may be named or nulled otherwise by another writer
    /// (pyarrow names it `element`); readers only look at its values.
    pub fn accepts(self, t: &DataType) -> bool {
        match (self, t) {
            (ColType::Int64List, DataType::List(item)) => item.data_type() == &DataType::Int64,
            (ColType::Float64List, DataType::List(item)) => item.data_type() == &DataType::Float64,
            _ => &self.data_type() == t,
        }
    }
}

impl ColumnDef {
    pub fn field(&self) -> Field {
        Field::new(self.name, self.ty.data_type(), self.nullable)
    }
}

// The builder type and a new builder for each `ColType`, for the `batch_builder!`
// expansion.
macro_rules! builder_type {
    (Int32) => { Int32Builder };
    (Int64) => { Int64Builder };
    (Float64) => { Float64Builder };
    (UInt64) => { UInt64Builder };
    (Utf8) => { StringBuilder };
    (Int64List) => { ListBuilder<Int64Builder> };
    (Float64List) => { ListBuilder<Float64Builder> };
}

macro_rules! new_builder {
    (Int64List) => {
        ListBuilder::new(Int64Builder::new())
    };
    (Float64List) => {
        ListBuilder::new(Float64Builder::new())
    };
    ($ty:ident) => {
        <builder_type!($ty)>::new()
    };
}

/// Generates [`BatchBuilder`] from the table, with one builder per column
/// (`new`, `finish` and the statistics' `append`). Only the append of the
/// record's own fields is written by hand, and it reaches each builder by
/// the column's name, so the order of the columns in a file can only change
/// in the table.
macro_rules! batch_builder {
    (
        record {
            $( $name:ident $CONST:ident: $ty:ident, $null:ident, $doc:literal; )*
        }
        float_stats {
            $( $fname:ident $FCONST:ident: $fdoc:literal; )*
        }
        count_stats {
            $( $cname:ident $CCONST:ident: $cdoc:literal; )*
        }
    ) => {
        /// Column builders for one batch. Reused across batches: `finish`
        /// empties them and keeps their allocations.
        pub struct BatchBuilder {
            $( $name: builder_type!($ty), )*
            $( $fname: Float64Builder, )*
            $( $cname: Int64Builder, )*
            rows: usize,
        }

        impl BatchBuilder {
            pub fn new() -> Self {
                BatchBuilder {
                    $( $name: new_builder!($ty), )*
                    $( $fname: Float64Builder::new(), )*
                    $( $cname: Int64Builder::new(), )*
                    rows: 0,
                }
            }

            /// The statistics columns of one row: null when the tensor has
            /// no values.
            fn append_stats(&mut self, s: Option<&Stats>) {
                match s {
                    Some(s) => {
                        $( self.$fname.append_option(opt(s.$fname)); )*
                        $( self.$cname.append_value(s.$cname); )*
                    }
                    None => {
                        $( self.$fname.append_null(); )*
                        $( self.$cname.append_null(); )*
                    }
                }
            }

            /// Builds a batch of the rows appended so far and empties the
            /// builders.
            pub fn finish(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
                let cols: Vec<ArrayRef> = vec![
                    $( Arc::new(self.$name.finish()), )*
                    $( Arc::new(self.$fname.finish()), )*
                    $( Arc::new(self.$cname.finish()), )*
                ];
                self.rows = 0;
                RecordBatch::try_new(schema(), cols)
            }
        }
    };
}

for_each_column!(batch_builder);

/// The schema of every dump file of this version: [`COLUMNS`] as Arrow
/// fields.
pub fn schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            Arc::new(Schema::new(
                COLUMNS.iter().map(ColumnDef::field).collect::<Vec<_>>(),
            ))
        })
        .clone()
}

/// Checks that every column of the table that a file has is of the table's
/// type, so that a reader's downcasts cannot fail. Columns are found by
/// name, so their order in the file does not matter; a missing column is
/// left to the reader, which knows which ones it needs. The error names
/// each wrong column with both types.
pub fn check_types(file: &Schema) -> std::result::Result<(), String> {
    let wrong: Vec<String> = COLUMNS
        .iter()
        .filter_map(|c| {
            let f = file.field_with_name(c.name).ok()?;
            (!c.ty.accepts(f.data_type())).then(|| {
                format!(
                    "column {:?} has type {}, expected {}",
                    c.name,
                    f.data_type(),
                    c.ty.data_type()
                )
            })
        })
        .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// NaN stands for "no such value" in a record; it is null in the file.
fn opt(v: f64) -> Option<f64> {
    (!v.is_nan()).then_some(v)
}

impl BatchBuilder {
    /// Rows appended since the last `finish`.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends the rows of one op call: one per tensor, or one row with role
    /// `none` when the call has no tensor.
    pub fn append(&mut self, rec: &OpRecord) {
        if rec.tensors.is_empty() {
            self.append_op_columns(rec);
            self.role.append_value(Role::None.as_str());
            self.arg.append_null();
            self.list_index.append_null();
            self.dtype.append_null();
            self.shape.append_null();
            self.stride.append_null();
            self.tensor_device.append_null();
            self.numel.append_null();
            self.stats_status.append_null();
            self.name.append_null();
            self.capture_file.append_null();
            self.capture_key.append_null();
            self.fingerprint.append_null();
            self.sketch.append_null();
            self.append_stats(None);
            self.rows += 1;
            return;
        }
        for t in &rec.tensors {
            self.append_op_columns(rec);
            self.role.append_value(t.role.as_str());
            self.arg.append_value(&t.arg);
            self.list_index.append_option(t.list_index);
            self.dtype.append_value(&t.dtype);
            self.shape.values().append_slice(&t.shape);
            self.shape.append(true);
            self.stride.values().append_slice(&t.stride);
            self.stride.append(true);
            self.tensor_device.append_value(&t.device);
            self.numel.append_value(t.numel);
            self.stats_status.append_value(t.status.as_str());
            self.name.append_option(t.name.as_deref());
            // A key only where the file that holds it was written.
            let file = rec.capture.as_ref().and_then(|c| c.file.as_deref());
            let key = file.and(t.capture_key.as_deref());
            self.capture_file.append_option(key.and(file));
            self.capture_key.append_option(key);
            let measured = t.status.has_values();
            self.fingerprint
                .append_option(t.fingerprint.filter(|_| measured));
            match t.sketch.as_deref().filter(|_| measured) {
                Some(v) => {
                    self.sketch.values().append_slice(v);
                    self.sketch.append(true);
                }
                None => self.sketch.append_null(),
            }
            self.append_stats(measured.then_some(&t.stats));
            self.rows += 1;
        }
    }

    fn append_op_columns(&mut self, rec: &OpRecord) {
        self.seq.append_value(rec.seq);
        self.parent_seq.append_option(rec.parent_seq);
        self.depth.append_value(rec.depth);
        self.pid.append_value(rec.pid);
        self.thread.append_value(rec.thread);
        self.step.append_value(rec.step);
        self.phase.append_value(rec.phase.as_str());
        self.op.append_value(&rec.op);
        self.overload.append_value(&rec.overload);
        self.args.append_value(&rec.args);
        self.start_ns.append_value(rec.start_ns);
        self.duration_ns.append_value(rec.duration_ns);
        self.error.append_option(rec.error.as_deref());
        self.module.append_option(rec.module.as_deref());
        self.fwd_seq.append_option(rec.fwd_seq);
        self.source.append_option(rec.source.as_deref());
    }
}

/// A status value read back from a file, for readers.
pub fn parse_status(s: Option<&str>) -> Option<StatsStatus> {
    s.and_then(StatsStatus::parse)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder's batches carry exactly the table's schema, in its order,
    /// whether or not the call has tensors.
    #[test]
    fn batches_follow_the_table() {
        use crate::record::{Phase, TensorRecord};
        let mut rec = OpRecord {
            seq: 1,
            parent_seq: None,
            depth: 0,
            pid: 1,
            thread: 1,
            step: 0,
            phase: Phase::Forward,
            op: "aten::add".into(),
            overload: "Tensor".into(),
            args: String::new(),
            start_ns: 0,
            duration_ns: 0,
            error: None,
            module: None,
            fwd_seq: None,
            source: None,
            capture: None,
            tensors: vec![],
        };
        let mut b = BatchBuilder::new();
        b.append(&rec);
        rec.tensors.push(TensorRecord {
            role: Role::Output,
            arg: "0".into(),
            list_index: None,
            dtype: "float32".into(),
            shape: vec![2],
            stride: vec![1],
            device: "cpu".into(),
            numel: 2,
            name: None,
            capture_key: None,
            fingerprint: Some(7),
            sketch: Some(vec![1.0, -1.0]),
            status: StatsStatus::Computed,
            stats: Stats::NONE,
        });
        b.append(&rec);
        let batch = b.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        let names: Vec<&str> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let table: Vec<&str> = COLUMNS.iter().map(|c| c.name).collect();
        assert_eq!(names, table);
        for (f, c) in batch.schema_ref().fields().iter().zip(COLUMNS) {
            assert_eq!(f.data_type(), &c.ty.data_type(), "{}", c.name);
            assert_eq!(f.is_nullable(), c.nullable, "{}", c.name);
        }
    }

    #[test]
    fn check_types_names_each_wrong_column() {
        assert_eq!(check_types(&schema()), Ok(()));
        let fields: Vec<Field> = COLUMNS
            .iter()
            .map(|c| match c.name {
                col::MIN => Field::new(c.name, DataType::Utf8, true),
                col::SHAPE => Field::new(
                    c.name,
                    DataType::List(Arc::new(Field::new("element", DataType::Int64, false))),
                    true,
                ),
                _ => c.field(),
            })
            .rev()
            .collect();
        // Reversed order and another list item name are fine; `min` is not.
        let err = check_types(&Schema::new(fields)).unwrap_err();
        assert_eq!(err, "column \"min\" has type Utf8, expected Float64");
    }
}
