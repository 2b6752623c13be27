//! The Arrow schema of a dump file, and the builders that turn records into
//! record batches.
//!
//! One row per tensor; the op-level columns repeat on each row of an op, so
//! pandas and DuckDB need no join. No column is named `rank` or `device`:
//! those are the directory's partition keys (`rank=<R>/device=<D>/`).

use std::sync::{Arc, OnceLock};

use arrow_array::builder::{
    Float64Builder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::record::{OpRecord, Role, Stats, StatsStatus};

/// Bumped whenever a column is added, removed or changes meaning.
pub const SCHEMA_VERSION: u32 = 1;
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

/// Column names, for readers.
pub mod col {
    pub const SEQ: &str = "seq";
    pub const PARENT_SEQ: &str = "parent_seq";
    pub const DEPTH: &str = "depth";
    pub const PID: &str = "pid";
    pub const THREAD: &str = "thread";
    pub const STEP: &str = "step";
    pub const PHASE: &str = "phase";
    pub const OP: &str = "op";
    pub const OVERLOAD: &str = "overload";
    pub const ARGS: &str = "args";
    pub const START_NS: &str = "start_ns";
    pub const DURATION_NS: &str = "duration_ns";
    pub const ERROR: &str = "error";
    pub const ROLE: &str = "role";
    pub const ARG: &str = "arg";
    pub const LIST_INDEX: &str = "list_index";
    pub const DTYPE: &str = "dtype";
    pub const SHAPE: &str = "shape";
    pub const STRIDE: &str = "stride";
    pub const TENSOR_DEVICE: &str = "tensor_device";
    pub const NUMEL: &str = "numel";
    pub const STATS_STATUS: &str = "stats_status";
    pub const MIN: &str = "min";
    pub const MAX: &str = "max";
    pub const MEAN: &str = "mean";
    pub const STD: &str = "std";
    pub const L2: &str = "l2";
    pub const ABSMAX: &str = "absmax";
    pub const NAN_COUNT: &str = "nan_count";
    pub const POSINF_COUNT: &str = "posinf_count";
    pub const NEGINF_COUNT: &str = "neginf_count";
    pub const ZERO_COUNT: &str = "zero_count";
}

fn int_list() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Int64, true)))
}

/// The schema of every dump file of this version.
pub fn schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            use col::*;
            use DataType::*;
            let f = |name: &str, ty: DataType, nullable: bool| Field::new(name, ty, nullable);
            Arc::new(Schema::new(vec![
                f(SEQ, Int64, false),
                f(PARENT_SEQ, Int64, true),
                f(DEPTH, Int32, false),
                f(PID, Int32, false),
                f(THREAD, Int64, false),
                f(STEP, Int64, false),
                f(PHASE, Utf8, false),
                f(OP, Utf8, false),
                f(OVERLOAD, Utf8, false),
                f(ARGS, Utf8, false),
                f(START_NS, Int64, false),
                f(DURATION_NS, Int64, false),
                f(ERROR, Utf8, true),
                f(ROLE, Utf8, false),
                f(ARG, Utf8, true),
                f(LIST_INDEX, Int32, true),
                f(DTYPE, Utf8, true),
                f(SHAPE, int_list(), true),
                f(STRIDE, int_list(), true),
                f(TENSOR_DEVICE, Utf8, true),
                f(NUMEL, Int64, true),
                f(STATS_STATUS, Utf8, true),
                f(MIN, Float64, true),
                f(MAX, Float64, true),
                f(MEAN, Float64, true),
                f(STD, Float64, true),
                f(L2, Float64, true),
                f(ABSMAX, Float64, true),
                f(NAN_COUNT, Int64, true),
                f(POSINF_COUNT, Int64, true),
                f(NEGINF_COUNT, Int64, true),
                f(ZERO_COUNT, Int64, true),
            ]))
        })
        .clone()
}

/// Column builders for one batch. Reused across batches: `finish` empties
/// them and keeps their allocations.
pub struct BatchBuilder {
    seq: Int64Builder,
    parent_seq: Int64Builder,
    depth: Int32Builder,
    pid: Int32Builder,
    thread: Int64Builder,
    step: Int64Builder,
    phase: StringBuilder,
    op: StringBuilder,
    overload: StringBuilder,
    args: StringBuilder,
    start_ns: Int64Builder,
    duration_ns: Int64Builder,
    error: StringBuilder,
    role: StringBuilder,
    arg: StringBuilder,
    list_index: Int32Builder,
    dtype: StringBuilder,
    shape: ListBuilder<Int64Builder>,
    stride: ListBuilder<Int64Builder>,
    tensor_device: StringBuilder,
    numel: Int64Builder,
    stats_status: StringBuilder,
    min: Float64Builder,
    max: Float64Builder,
    mean: Float64Builder,
    std: Float64Builder,
    l2: Float64Builder,
    absmax: Float64Builder,
    nan_count: Int64Builder,
    posinf_count: Int64Builder,
    neginf_count: Int64Builder,
    zero_count: Int64Builder,
    rows: usize,
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
    pub fn new() -> Self {
        BatchBuilder {
            seq: Int64Builder::new(),
            parent_seq: Int64Builder::new(),
            depth: Int32Builder::new(),
            pid: Int32Builder::new(),
            thread: Int64Builder::new(),
            step: Int64Builder::new(),
            phase: StringBuilder::new(),
            op: StringBuilder::new(),
            overload: StringBuilder::new(),
            args: StringBuilder::new(),
            start_ns: Int64Builder::new(),
            duration_ns: Int64Builder::new(),
            error: StringBuilder::new(),
            role: StringBuilder::new(),
            arg: StringBuilder::new(),
            list_index: Int32Builder::new(),
            dtype: StringBuilder::new(),
            shape: ListBuilder::new(Int64Builder::new()),
            stride: ListBuilder::new(Int64Builder::new()),
            tensor_device: StringBuilder::new(),
            numel: Int64Builder::new(),
            stats_status: StringBuilder::new(),
            min: Float64Builder::new(),
            max: Float64Builder::new(),
            mean: Float64Builder::new(),
            std: Float64Builder::new(),
            l2: Float64Builder::new(),
            absmax: Float64Builder::new(),
            nan_count: Int64Builder::new(),
            posinf_count: Int64Builder::new(),
            neginf_count: Int64Builder::new(),
            zero_count: Int64Builder::new(),
            rows: 0,
        }
    }

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
            self.append_stats(t.status.has_values().then_some(&t.stats));
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
    }

    fn append_stats(&mut self, s: Option<&Stats>) {
        let f = |b: &mut Float64Builder, v: Option<f64>| b.append_option(v);
        match s {
            Some(s) => {
                f(&mut self.min, opt(s.min));
                f(&mut self.max, opt(s.max));
                f(&mut self.mean, opt(s.mean));
                f(&mut self.std, opt(s.std));
                f(&mut self.l2, opt(s.l2));
                f(&mut self.absmax, opt(s.absmax));
                self.nan_count.append_value(s.nan_count);
                self.posinf_count.append_value(s.posinf_count);
                self.neginf_count.append_value(s.neginf_count);
                self.zero_count.append_value(s.zero_count);
            }
            None => {
                for b in [
                    &mut self.min,
                    &mut self.max,
                    &mut self.mean,
                    &mut self.std,
                    &mut self.l2,
                    &mut self.absmax,
                ] {
                    b.append_null();
                }
                for b in [
                    &mut self.nan_count,
                    &mut self.posinf_count,
                    &mut self.neginf_count,
                    &mut self.zero_count,
                ] {
                    b.append_null();
                }
            }
        }
    }

    /// Builds a batch of the rows appended so far and empties the builders.
    pub fn finish(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.seq.finish()),
            Arc::new(self.parent_seq.finish()),
            Arc::new(self.depth.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.thread.finish()),
            Arc::new(self.step.finish()),
            Arc::new(self.phase.finish()),
            Arc::new(self.op.finish()),
            Arc::new(self.overload.finish()),
            Arc::new(self.args.finish()),
            Arc::new(self.start_ns.finish()),
            Arc::new(self.duration_ns.finish()),
            Arc::new(self.error.finish()),
            Arc::new(self.role.finish()),
            Arc::new(self.arg.finish()),
            Arc::new(self.list_index.finish()),
            Arc::new(self.dtype.finish()),
            Arc::new(self.shape.finish()),
            Arc::new(self.stride.finish()),
            Arc::new(self.tensor_device.finish()),
            Arc::new(self.numel.finish()),
            Arc::new(self.stats_status.finish()),
            Arc::new(self.min.finish()),
            Arc::new(self.max.finish()),
            Arc::new(self.mean.finish()),
            Arc::new(self.std.finish()),
            Arc::new(self.l2.finish()),
            Arc::new(self.absmax.finish()),
            Arc::new(self.nan_count.finish()),
            Arc::new(self.posinf_count.finish()),
            Arc::new(self.neginf_count.finish()),
            Arc::new(self.zero_count.finish()),
        ];
        self.rows = 0;
        RecordBatch::try_new(schema(), cols)
    }
}

/// A status value read back from a file, for readers.
pub fn parse_status(s: Option<&str>) -> Option<StatsStatus> {
    s.and_then(StatsStatus::parse)
}
