//! `--out DIR`: `compare.parquet`, one row per aligned tensor pair with both
//! sides' statistics, the metrics and the verdicts, for DuckDB or pandas.
//!
//! Rows are produced pair by pair and written in batches, so the file never
//! exists in memory as a whole.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use super::model::{AlignedPairs, OpRow, TensorRow, TensorSide};
use crate::app::error::{CliError, Result};
use crate::app::output;
use crate::app::progress::Progress;

pub const FILE_NAME: &str = "compare.parquet";
const BATCH_ROWS: usize = 32 * 1024;

const STATS: [&str; 6] = ["min", "max", "mean", "std", "l2", "absmax"];
const COUNTS: [&str; 4] = ["nan_count", "posinf_count", "neginf_count", "zero_count"];

fn schema() -> SchemaRef {
    let mut f = vec![
        Field::new("rank", DataType::Int64, false),
        Field::new("seq_a", DataType::Int64, false),
        Field::new("seq_b", DataType::Int64, false),
        Field::new("step_a", DataType::Int64, false),
        Field::new("step_b", DataType::Int64, false),
        Field::new("phase", DataType::Utf8, false),
        Field::new("depth", DataType::Int32, false),
        Field::new("op", DataType::Utf8, false),
        Field::new("overload", DataType::Utf8, false),
        Field::new("op_verdict", DataType::Utf8, false),
        Field::new("op_rel_err", DataType::Float64, true),
        Field::new("op_amplification", DataType::Float64, true),
        Field::new("shapes_differ", DataType::Boolean, false),
        Field::new("module_a", DataType::Utf8, true),
        Field::new("module_b", DataType::Utf8, true),
        Field::new("fwd_seq_a", DataType::Int64, true),
        Field::new("fwd_seq_b", DataType::Int64, true),
        Field::new("role", DataType::Utf8, false),
        Field::new("arg", DataType::Utf8, true),
        Field::new("list_index", DataType::Int32, true),
        Field::new("verdict", DataType::Utf8, false),
        Field::new("evidence", DataType::Utf8, false),
    ];
    for side in ["a", "b"] {
        let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
        f.push(Field::new(format!("name_{side}"), DataType::Utf8, true));
        f.push(Field::new(format!("dtype_{side}"), DataType::Utf8, true));
        f.push(Field::new(format!("shape_{side}"), list, true));
        f.push(Field::new(format!("numel_{side}"), DataType::Int64, true));
        f.push(Field::new(
            format!("stats_status_{side}"),
            DataType::Utf8,
            true,
        ));
        for s in STATS {
            f.push(Field::new(format!("{s}_{side}"), DataType::Float64, true));
        }
        for c in COUNTS {
            f.push(Field::new(format!("{c}_{side}"), DataType::Int64, true));
        }
    }
    for m in [
        "abs_bound",
        "linf_bound",
        "rel_l2",
        "rel_linf",
        "rel_err",
        "tolerance",
    ] {
        f.push(Field::new(m, DataType::Float64, true));
    }
    // The error sketches' estimate, where both dumps have one.
    f.push(Field::new("sketch_k", DataType::Int32, true));
    for m in ["sketch_est", "sketch_rel", "sketch_rel_low"] {
        f.push(Field::new(m, DataType::Float64, true));
    }
    // Exact metrics, where both dumps captured the pair (null elsewhere).
    for m in EXACT_F64 {
        f.push(Field::new(format!("exact_{m}"), DataType::Float64, true));
    }
    f.push(Field::new("exact_beyond_tolerance", DataType::Int64, true));
    f.push(Field::new(
        "exact_worst_index",
        DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
        true,
    ));
    Arc::new(Schema::new(f))
}

/// The float exact metrics, in column order (crates/cli/src/exact.rs).
const EXACT_F64: [&str; 9] = [
    "max_abs",
    "max_rel",
    "rel_l2",
    "cosine",
    "ulp_median",
    "ulp_p99",
    "ulp_max",
    "worst_a",
    "worst_b",
];

/// The exact-metric columns of the rows.
struct Exact {
    f64s: [Float64Builder; 9],
    beyond: Int64Builder,
    worst: ListBuilder<Int64Builder>,
}

impl Exact {
    fn new() -> Self {
        Exact {
            f64s: std::array::from_fn(|_| Float64Builder::new()),
            beyond: Int64Builder::new(),
            worst: ListBuilder::new(Int64Builder::new()),
        }
    }

    fn push(&mut self, e: Option<&opdump_judge::exact::ExactMetrics>) {
        let Some(e) = e else {
            for b in &mut self.f64s {
                b.append_null();
            }
            self.beyond.append_null();
            self.worst.append_null();
            return;
        };
        let v = [
            Some(e.max_abs),
            Some(e.max_rel),
            Some(e.rel_l2),
            Some(e.cosine),
            e.ulp_median,
            e.ulp_p99,
            e.ulp_max,
            Some(e.worst_a),
            Some(e.worst_b),
        ];
        for (b, x) in self.f64s.iter_mut().zip(v) {
            b.append_option(x.and_then(opt));
        }
        self.beyond.append_value(e.beyond_tolerance as i64);
        for &i in &e.worst_index {
            self.worst.values().append_value(i as i64);
        }
        self.worst.append(true);
    }

    fn finish(&mut self, cols: &mut Vec<ArrayRef>) {
        for b in &mut self.f64s {
            cols.push(Arc::new(b.finish()));
        }
        cols.push(Arc::new(self.beyond.finish()));
        cols.push(Arc::new(self.worst.finish()));
    }
}

/// The columns of one side (a or b) of a tensor pair.
struct Side {
    name: StringBuilder,
    dtype: StringBuilder,
    shape: ListBuilder<Int64Builder>,
    numel: Int64Builder,
    status: StringBuilder,
    stats: [Float64Builder; 6],
    counts: [Int64Builder; 4],
}

impl Side {
    fn new() -> Self {
        Side {
            name: StringBuilder::new(),
            dtype: StringBuilder::new(),
            shape: ListBuilder::new(Int64Builder::new()),
            numel: Int64Builder::new(),
            status: StringBuilder::new(),
            stats: std::array::from_fn(|_| Float64Builder::new()),
            counts: std::array::from_fn(|_| Int64Builder::new()),
        }
    }

    /// A side without the tensor is null throughout; statistics that were
    /// not measured (or do not exist) are null, never NaN.
    fn push(&mut self, side: Option<&TensorSide<'_>>) {
        let Some(side) = side else {
            self.name.append_null();
            self.dtype.append_null();
            self.shape.append_null();
            self.numel.append_null();
            self.status.append_null();
            self.stats.iter_mut().for_each(|b| b.append_null());
            self.counts.iter_mut().for_each(|b| b.append_null());
            return;
        };
        let s = &side.stats;
        self.name.append_option(side.name);
        self.dtype.append_value(side.dtype);
        self.shape.values().append_slice(side.shape);
        self.shape.append(true);
        self.numel.append_value(s.numel);
        self.status.append_option(s.status);
        // Unmeasured statistics are NaN in the report model.
        let vals = [s.min, s.max, s.mean, s.std, s.l2, s.absmax];
        for (b, v) in self.stats.iter_mut().zip(vals) {
            b.append_option((!v.is_nan()).then_some(v));
        }
        let counts = [s.nan_count, s.posinf_count, s.neginf_count, s.zero_count];
        for (b, v) in self.counts.iter_mut().zip(counts) {
            b.append_option(s.has_values.then_some(v));
        }
    }

    fn finish(&mut self, cols: &mut Vec<ArrayRef>) {
        cols.push(Arc::new(self.name.finish()));
        cols.push(Arc::new(self.dtype.finish()));
        cols.push(Arc::new(self.shape.finish()));
        cols.push(Arc::new(self.numel.finish()));
        cols.push(Arc::new(self.status.finish()));
        for b in &mut self.stats {
            cols.push(Arc::new(b.finish()));
        }
        for b in &mut self.counts {
            cols.push(Arc::new(b.finish()));
        }
    }
}

fn opt(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The columns of [`schema`], filled row by row until a batch is full.
struct Columns {
    /// rank, seq_a, seq_b, step_a, step_b.
    i64s: [Int64Builder; 5],
    phase: StringBuilder,
    depth: Int32Builder,
    op: StringBuilder,
    overload: StringBuilder,
    op_verdict: StringBuilder,
    op_err: Float64Builder,
    op_amp: Float64Builder,
    loose: BooleanBuilder,
    module: [StringBuilder; 2],
    fwd_seq: [Int64Builder; 2],
    role: StringBuilder,
    arg: StringBuilder,
    list_index: Int32Builder,
    verdict: StringBuilder,
    evidence: StringBuilder,
    a: Side,
    b: Side,
    /// abs_bound, linf_bound, rel_l2, rel_linf, rel_err, tolerance.
    metrics: [Float64Builder; 6],
    sketch_k: Int32Builder,
    /// sketch_est, sketch_rel, sketch_rel_low.
    sketch: [Float64Builder; 3],
    exact: Exact,
    rows: usize,
}

impl Columns {
    fn new() -> Self {
        Columns {
            i64s: std::array::from_fn(|_| Int64Builder::new()),
            phase: StringBuilder::new(),
            depth: Int32Builder::new(),
            op: StringBuilder::new(),
            overload: StringBuilder::new(),
            op_verdict: StringBuilder::new(),
            op_err: Float64Builder::new(),
            op_amp: Float64Builder::new(),
            loose: BooleanBuilder::new(),
            module: std::array::from_fn(|_| StringBuilder::new()),
            fwd_seq: std::array::from_fn(|_| Int64Builder::new()),
            role: StringBuilder::new(),
            arg: StringBuilder::new(),
            list_index: Int32Builder::new(),
            verdict: StringBuilder::new(),
            evidence: StringBuilder::new(),
            a: Side::new(),
            b: Side::new(),
            metrics: std::array::from_fn(|_| Float64Builder::new()),
            sketch_k: Int32Builder::new(),
            sketch: std::array::from_fn(|_| Float64Builder::new()),
            exact: Exact::new(),
            rows: 0,
        }
    }

    /// One row: a tensor pair `t` of the op pair `op`.
    fn push(&mut self, rank: u32, op: &OpRow<'_>, t: &TensorRow<'_>) {
        let ids = [rank as i64, op.seq_a, op.seq_b, op.step_a, op.step_b];
        for (bld, v) in self.i64s.iter_mut().zip(ids) {
            bld.append_value(v);
        }
        self.phase.append_value(op.phase);
        self.depth.append_value(op.depth);
        self.op.append_value(op.op);
        self.overload.append_value(op.overload);
        self.op_verdict.append_value(op.verdict.as_str());
        self.op_err.append_option(opt(op.rel_err));
        self.op_amp.append_option(opt(op.amplification));
        self.loose.append_value(op.shapes_differ);
        self.module[0].append_option(op.module_a);
        self.module[1].append_option(op.module_b);
        self.fwd_seq[0].append_option(op.fwd_seq_a);
        self.fwd_seq[1].append_option(op.fwd_seq_b);
        self.role.append_value(t.role);
        self.arg.append_option(t.arg);
        self.list_index.append_option(t.list_index);
        self.verdict.append_value(t.verdict.as_str());
        self.evidence.append_value(t.evidence);
        self.a.push(t.a.as_ref());
        self.b.push(t.b.as_ref());
        let m = [
            t.abs_bound,
            t.linf_bound,
            t.rel_l2,
            t.rel_linf,
            t.rel_err,
            t.tolerance,
        ];
        for (bld, v) in self.metrics.iter_mut().zip(m) {
            bld.append_option(opt(v));
        }
        let sk = t.sketch.as_ref();
        self.sketch_k.append_option(sk.map(|s| s.k as i32));
        let v = [
            sk.and_then(|s| opt(s.est)),
            sk.and_then(|s| opt(s.rel)),
            sk.and_then(|s| opt(s.rel_low)),
        ];
        for (bld, v) in self.sketch.iter_mut().zip(v) {
            bld.append_option(v);
        }
        self.exact.push(t.exact.as_ref());
        self.rows += 1;
    }

    /// The rows pushed since the last batch, as a batch; the builders start
    /// empty again.
    fn finish(&mut self, schema: &SchemaRef) -> std::result::Result<RecordBatch, ArrowError> {
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for bld in &mut self.i64s {
            cols.push(Arc::new(bld.finish()));
        }
        // Order as in `schema()`: rank, seq_a, seq_b, step_a, step_b, ...
        cols.push(Arc::new(self.phase.finish()));
        cols.push(Arc::new(self.depth.finish()));
        cols.push(Arc::new(self.op.finish()));
        cols.push(Arc::new(self.overload.finish()));
        cols.push(Arc::new(self.op_verdict.finish()));
        cols.push(Arc::new(self.op_err.finish()));
        cols.push(Arc::new(self.op_amp.finish()));
        cols.push(Arc::new(self.loose.finish()));
        for bld in &mut self.module {
            cols.push(Arc::new(bld.finish()));
        }
        for bld in &mut self.fwd_seq {
            cols.push(Arc::new(bld.finish()));
        }
        cols.push(Arc::new(self.role.finish()));
        cols.push(Arc::new(self.arg.finish()));
        cols.push(Arc::new(self.list_index.finish()));
        cols.push(Arc::new(self.verdict.finish()));
        cols.push(Arc::new(self.evidence.finish()));
        self.a.finish(&mut cols);
        self.b.finish(&mut cols);
        for bld in &mut self.metrics {
            cols.push(Arc::new(bld.finish()));
        }
        cols.push(Arc::new(self.sketch_k.finish()));
        for bld in &mut self.sketch {
            cols.push(Arc::new(bld.finish()));
        }
        self.exact.finish(&mut cols);
        self.rows = 0;
        RecordBatch::try_new(schema.clone(), cols)
    }
}

/// Writes `DIR/compare.parquet` (see [`crate::app::output`]: mode 0600, a
/// symlink there is replaced, never followed).
pub fn write(
    pairs: &AlignedPairs<'_>,
    dir: &Path,
    progress: &Progress,
) -> Result<std::path::PathBuf> {
    output::create_dir(dir)?;
    let path = dir.join(FILE_NAME);
    output::write_file_in(dir, FILE_NAME, |file| {
        write_rows(pairs, &path, file, progress)
    })
}

fn write_rows(
    pairs: &AlignedPairs<'_>,
    path: &Path,
    file: &mut File,
    progress: &Progress,
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| CliError::new(format!("{}: {e}", path.display()));
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let schema = schema();
    let mut w = ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|e| err(&e))?;
    let mut cols = Columns::new();
    let mut details = pairs.details();
    let n = pairs.len();
    for k in 0..n {
        let op = details.load(k);
        for t in details.tensors() {
            cols.push(pairs.rank(), &op, &t);
        }
        if cols.rows >= BATCH_ROWS || k + 1 == n {
            let batch = cols.finish(&schema).map_err(|e| err(&e))?;
            w.write(&batch).map_err(|e| err(&e))?;
            progress.update(|| format!("writing {FILE_NAME}: {}/{n} op pairs", k + 1));
        }
    }
    w.close().map_err(|e| err(&e))?;
    Ok(())
}
