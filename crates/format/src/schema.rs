//! The Arrow schema of a dump file, and the builders that turn records into
//! record batches.
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
}

/// The Arrow type of a column, in a form a `const` table can hold
/// (`DataType::List` owns an `Arc`, so a `DataType` cannot be a constant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColType {
    Int32,
    Int64,
    Float64,
    /// Fingerprints.
    UInt64,
    Utf8,
    /// A list of int64: shapes and strides.
    Int64List,
    /// A list of float64: sketches.
    Float64List,
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

/// One column of a dump file, as [`COLUMNS`] declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnDef {
    pub name: &'static str,
    pub ty: ColType,
    pub nullable: bool,
    /// One line: what the column holds.
    pub doc: &'static str,
}

impl ColumnDef {
    pub fn field(&self) -> Field {
        Field::new(self.name, self.ty.data_type(), self.nullable)
    }
}

// The builder type and a new builder for each `ColType`, for the `columns!`
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

macro_rules! is_nullable {
    (null) => {
        true
    };
    (required) => {
        false
    };
}

/// Generates, from the one table below and in its order: the `col` name
/// constants, [`COLUMNS`], the [`Stats`] struct, and [`BatchBuilder`] with
/// one builder per column (`new`, `finish` and the statistics' `append`).
/// Only the append of the record's own fields is written by hand, and it
/// reaches each builder by the column's name, so the order of the columns
/// in a file can only change here.
macro_rules! columns {
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
        /// Column names, for readers.
        pub mod col {
            $( #[doc = $doc] pub const $CONST: &str = stringify!($name); )*
            $( #[doc = $fdoc] pub const $FCONST: &str = stringify!($fname); )*
            $( #[doc = $cdoc] pub const $CCONST: &str = stringify!($cname); )*
        }

        /// Every column of a dump file, in file order. The statistics
        /// columns are float64 and int64, null when not measured.
        pub const COLUMNS: &[ColumnDef] = &[
            $( ColumnDef {
                name: stringify!($name),
                ty: ColType::$ty,
                nullable: is_nullable!($null),
                doc: $doc,
            }, )*
            $( ColumnDef {
                name: stringify!($fname),
                ty: ColType::Float64,
                nullable: true,
                doc: $fdoc,
            }, )*
            $( ColumnDef {
                name: stringify!($cname),
                ty: ColType::Int64,
                nullable: true,
                doc: $cdoc,
            }, )*
        ];

        /// Each `col` constant's identifier and value, to test that one is
        /// the other in capitals.
        #[cfg(test)]
        const COL_IDENTS: &[(&str, &str)] = &[
            $( (stringify!($CONST), col::$CONST), )*
            $( (stringify!($FCONST), col::$FCONST), )*
            $( (stringify!($CCONST), col::$CCONST), )*
        ];

        /// Statistics over the finite elements of a tensor, in float64: one
        /// field per statistics column, of the same name.
        ///
        /// A value that does not exist (the min of a tensor with no finite
        /// element) is NaN here and null in the file.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct Stats {
            $( #[doc = $fdoc] pub $fname: f64, )*
            $( #[doc = $cdoc] pub $cname: i64, )*
        }

        impl Stats {
            /// No values: what an unmeasured tensor carries.
            pub const NONE: Stats = Stats {
                $( $fname: f64::NAN, )*
                $( $cname: 0, )*
            };
        }

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

// The schema, once. Adding a column here adds it to the file, to `COLUMNS`
// and to the builder; a statistic also becomes a field of `Stats`. Then the
// README's table (checked by `tests/schema_table.rs`) and, for a statistic,
// the plugin's kernel and bridge row.
columns! {
    record {
        // The op call, repeated on each of its rows.
        seq           SEQ:           Int64,     required, "Process-wide, unique, increasing in call (entry) order.";
        parent_seq    PARENT_SEQ:    Int64,     null,     "The seq of the nearest recorded enclosing call; null at depth 0.";
        depth         DEPTH:         Int32,     required, "Nesting depth (0: called by the job itself).";
        pid           PID:           Int32,     required, "Process id.";
        thread        THREAD:        Int64,     required, "OS thread id.";
        step          STEP:          Int64,     required, "Training step.";
        phase         PHASE:         Utf8,      required, "`forward`, `backward` or `optimizer`.";
        op            OP:            Utf8,      required, "The op as its schema names it, without the overload.";
        overload      OVERLOAD:      Utf8,      required, "The overload name; `default` for the unnamed one.";
        args          ARGS:          Utf8,      required, "The non-tensor arguments as text.";
        start_ns      START_NS:      Int64,     required, "Epoch time at entry, in nanoseconds.";
        duration_ns   DURATION_NS:   Int64,     required, "Time in the op itself, without opdump's measuring.";
        error         ERROR:         Utf8,      null,     "The message of the exception the op raised, if it raised.";
        module        MODULE:        Utf8,      null,     "The innermost `nn.Module` running the call (its forward's, for a backward call); null outside any.";
        fwd_seq       FWD_SEQ:       Int64,     null,     "Backward calls: the seq of the forward call that made the autograd node being run.";
        source        SOURCE:        Utf8,      null,     "With OPDUMP_SOURCE=1: the innermost line of user code, `file.py:123 in forward`.";
        // The tensor; null from `arg` on in the one row of a call without
        // tensors (role `none`).
        role          ROLE:          Utf8,      required, "`input`, `output`, or `none` for a call without tensors.";
        arg           ARG:           Utf8,      null,     "The schema's argument name, or the return index for results.";
        list_index    LIST_INDEX:    Int32,     null,     "The position inside a `Tensor[]` argument or result.";
        dtype         DTYPE:         Utf8,      null,     "As torch names it without `torch.`: `float32`, `bfloat16`.";
        shape         SHAPE:         Int64List, null,     "Sizes; -1 for a symbolic size.";
        stride        STRIDE:        Int64List, null,     "Strides; empty for a layout without strides.";
        tensor_device TENSOR_DEVICE: Utf8,      null,     "As torch prints it: `cpu`, `cuda:0`.";
        numel         NUMEL:         Int64,     null,     "Number of elements; -1 when symbolic.";
        stats_status  STATS_STATUS:  Utf8,      null,     "Why the statistics are what they are (see `StatsStatus`).";
        name          NAME:          Utf8,      null,     "The parameter or buffer this tensor is (`h.3.mlp.c_fc.weight`), or its `.grad`.";
        capture_file  CAPTURE_FILE:  Utf8,      null,     "In a call OPDUMP_CAPTURE chose: the safetensors file in the same directory holding the tensor.";
        capture_key   CAPTURE_KEY:   Utf8,      null,     "In a call OPDUMP_CAPTURE chose: the tensor's key in that file (`input.self`, `output.0`).";
        fingerprint   FINGERPRINT:   UInt64,    null,     "A 64-bit hash of the values in logical order, the same on every device (README: Fingerprint and sketch); null where not measured.";
        sketch        SKETCH:        Float64List, null,   "K random +-1 projections of the values, float64 (README: Fingerprint and sketch); null where not measured.";
    }
    float_stats {
        min           MIN:           "The smallest finite element.";
        max           MAX:           "The largest finite element.";
        mean          MEAN:          "The mean of the finite elements.";
        std           STD:           "The population standard deviation of the finite elements.";
        l2            L2:            "The Euclidean norm of the finite elements (0 when there is none).";
        absmax        ABSMAX:        "The largest magnitude of a finite element.";
    }
    count_stats {
        nan_count     NAN_COUNT:     "Elements that are NaN.";
        posinf_count  POSINF_COUNT:  "Elements that are +Inf.";
        neginf_count  NEGINF_COUNT:  "Elements that are -Inf.";
        zero_count    ZERO_COUNT:    "Elements equal to zero (either sign).";
    }
}

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

    #[test]
    fn col_constants_are_the_names_in_capitals() {
        for (ident, name) in COL_IDENTS {
            assert_eq!(ident.to_ascii_lowercase(), *name);
        }
        assert_eq!(COL_IDENTS.len(), COLUMNS.len());
    }

    #[test]
    fn names_are_unique_and_docs_one_line() {
        for (i, c) in COLUMNS.iter().enumerate() {
            assert!(
                COLUMNS[..i].iter().all(|d| d.name != c.name),
                "{} twice",
                c.name
            );
            assert!(
                !c.doc.is_empty() && !c.doc.contains('\n'),
                "{}: {:?}",
                c.name,
                c.doc
            );
        }
    }

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
