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
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::compare::Compared;
use crate::dump::Dump;
use crate::error::{CliError, Result};
use crate::metrics::OpCmp;
use crate::output;
use crate::progress::Progress;

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
        Field::new("role", DataType::Utf8, false),
        Field::new("arg", DataType::Utf8, true),
        Field::new("list_index", DataType::Int32, true),
        Field::new("verdict", DataType::Utf8, false),
        Field::new("evidence", DataType::Utf8, false),
    ];
    for side in ["a", "b"] {
        let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
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
    Arc::new(Schema::new(f))
}

struct Side {
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
            dtype: StringBuilder::new(),
            shape: ListBuilder::new(Int64Builder::new()),
            numel: Int64Builder::new(),
            status: StringBuilder::new(),
            stats: std::array::from_fn(|_| Float64Builder::new()),
            counts: std::array::from_fn(|_| Int64Builder::new()),
        }
    }

    fn push(&mut self, d: &Dump, t: Option<u32>) {
        let Some(t) = t else {
            self.dtype.append_null();
            self.shape.append_null();
            self.numel.append_null();
            self.status.append_null();
            self.stats.iter_mut().for_each(|b| b.append_null());
            self.counts.iter_mut().for_each(|b| b.append_null());
            return;
        };
        let x = &d.tensors;
        let i = t as usize;
        self.dtype.append_value(&d.dtype(t).name);
        self.shape.values().append_slice(d.shape(t));
        self.shape.append(true);
        self.numel.append_value(x.numel(t));
        self.status.append_option(x.status[i].map(|s| s.as_str()));
        let has = x.has_values(t);
        let vals = [
            x.min[i],
            x.max[i],
            x.mean[i],
            x.std[i],
            x.l2[i],
            x.absmax[i],
        ];
        for (b, v) in self.stats.iter_mut().zip(vals) {
            b.append_option((has && !v.is_nan()).then_some(v));
        }
        let [nan, pos, neg] = x.nonfinite_counts(t);
        let counts = [nan, pos, neg, x.zero[i]];
        for (b, v) in self.counts.iter_mut().zip(counts) {
            b.append_option(has.then_some(v));
        }
    }

    fn finish(&mut self, cols: &mut Vec<ArrayRef>) {
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

/// Writes `DIR/compare.parquet` (see [`crate::output`]: mode 0600, a
/// symlink there is replaced, never followed).
pub fn write(c: &Compared, dir: &Path, progress: &Progress) -> Result<std::path::PathBuf> {
    output::create_dir(dir)?;
    let path = dir.join(FILE_NAME);
    output::write_file(&path, |file| write_rows(c, &path, file, progress))?;
    Ok(path)
}

fn write_rows(c: &Compared, path: &Path, file: &mut File, progress: &Progress) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| CliError::new(format!("{}: {e}", path.display()));
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let schema = schema();
    let mut w = ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|e| err(&e))?;

    let mut i64s: [Int64Builder; 5] = std::array::from_fn(|_| Int64Builder::new());
    let mut phase = StringBuilder::new();
    let mut depth = Int32Builder::new();
    let mut op = StringBuilder::new();
    let mut overload = StringBuilder::new();
    let mut op_verdict = StringBuilder::new();
    let mut op_err = Float64Builder::new();
    let mut op_amp = Float64Builder::new();
    let mut loose = BooleanBuilder::new();
    let mut role = StringBuilder::new();
    let mut arg = StringBuilder::new();
    let mut list_index = Int32Builder::new();
    let mut verdict = StringBuilder::new();
    let mut evidence = StringBuilder::new();
    let (mut sa, mut sb) = (Side::new(), Side::new());
    let mut metrics: [Float64Builder; 6] = std::array::from_fn(|_| Float64Builder::new());
    let mut rows = 0usize;

    let (a, b) = (&c.a, &c.b);
    let ctx = c.ctx();
    let mut cmp = OpCmp::default();
    let n = c.alignment.pairs.len();
    for (k, p) in c.alignment.pairs.iter().enumerate() {
        c.detail_into(k, &ctx, &mut cmp);
        let (ia, ib) = (p.a as usize, p.b as usize);
        for t in &cmp.tensors {
            for (bld, v) in
                i64s.iter_mut()
                    .zip([a.rank as i64, a.seq[ia], b.seq[ib], a.step[ia], b.step[ib]])
            {
                bld.append_value(v);
            }
            phase.append_value(a.phase[ia].as_str());
            depth.append_value(a.depth[ia]);
            op.append_value(a.op_name(p.a));
            overload.append_value(a.overload_name(p.a));
            op_verdict.append_value(c.op_verdict(k).as_str());
            op_err.append_option(opt(cmp.out_err));
            op_amp.append_option(opt(cmp.amplification));
            loose.append_value(p.loose);
            role.append_value(t.role.as_str());
            let name =
                t.ta.map(|x| a.arg_name(x))
                    .or_else(|| t.tb.map(|x| b.arg_name(x)));
            arg.append_option(name);
            list_index.append_option(
                t.ta.and_then(|x| a.list_index(x))
                    .or_else(|| t.tb.and_then(|x| b.list_index(x))),
            );
            verdict.append_value(t.verdict.as_str());
            evidence.append_value(t.evidence);
            sa.push(a, t.ta);
            sb.push(b, t.tb);
            let m = [
                t.measure.l2_bound,
                t.measure.linf_bound,
                t.rel_l2,
                t.rel_linf,
                t.rel_err,
                t.tolerance,
            ];
            for (bld, v) in metrics.iter_mut().zip(m) {
                bld.append_option(opt(v));
            }
            rows += 1;
        }
        if rows >= BATCH_ROWS || k + 1 == n {
            let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
            for bld in &mut i64s {
                cols.push(Arc::new(bld.finish()));
            }
            // Order as in `schema()`: rank, seq_a, seq_b, step_a, step_b, ...
            cols.push(Arc::new(phase.finish()));
            cols.push(Arc::new(depth.finish()));
            cols.push(Arc::new(op.finish()));
            cols.push(Arc::new(overload.finish()));
            cols.push(Arc::new(op_verdict.finish()));
            cols.push(Arc::new(op_err.finish()));
            cols.push(Arc::new(op_amp.finish()));
            cols.push(Arc::new(loose.finish()));
            cols.push(Arc::new(role.finish()));
            cols.push(Arc::new(arg.finish()));
            cols.push(Arc::new(list_index.finish()));
            cols.push(Arc::new(verdict.finish()));
            cols.push(Arc::new(evidence.finish()));
            sa.finish(&mut cols);
            sb.finish(&mut cols);
            for bld in &mut metrics {
                cols.push(Arc::new(bld.finish()));
            }
            let batch = RecordBatch::try_new(schema.clone(), cols).map_err(|e| err(&e))?;
            w.write(&batch).map_err(|e| err(&e))?;
            rows = 0;
            progress.update(|| format!("writing {FILE_NAME}: {}/{n} op pairs", k + 1));
        }
    }
    w.close().map_err(|e| err(&e))?;
    Ok(())
}
