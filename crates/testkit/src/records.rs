//! Reading a whole file back into records, rows of one op call joined
//! again: an independent reader for tests (the loader, opdump-load, streams
//! columns into the judge's model instead).

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, UInt64Type};
use arrow_array::{
    Array, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch, StringArray, UInt64Array,
};

use opdump_format::error::{Error, Result};
use opdump_format::reader::open_batches;
use opdump_format::record::{OpRecord, Phase, Role, Stats, StatsStatus, TensorRecord};
use opdump_format::schema::{check_types, col};

/// Reads the file at `path` into records, in file order.
pub fn read_records(path: &Path) -> Result<Vec<OpRecord>> {
    let builder = open_batches(path)?;
    // Columns are read by name; one of another type would panic a downcast.
    check_types(builder.schema()).map_err(|m| Error::format(path, m))?;
    let reader = builder.build().map_err(|e| Error::parquet(path, e))?;
    let mut out: Vec<OpRecord> = Vec::new();
    for batch in reader {
        let batch = batch?;
        Columns::of(path, &batch)?.append_rows(&mut out)?;
    }
    Ok(out)
}

/// The columns of one batch. Those of later schema versions are `None` in
/// older files (2: module, source, name; 3: capture; 4: fwd_seq, fingerprint,
/// sketch), and read as null.
struct Columns<'a> {
    path: &'a Path,
    rows: usize,
    seq: &'a Int64Array,
    parent_seq: &'a Int64Array,
    depth: &'a Int32Array,
    pid: &'a Int32Array,
    thread: &'a Int64Array,
    step: &'a Int64Array,
    phase: &'a StringArray,
    op: &'a StringArray,
    overload: &'a StringArray,
    args: &'a StringArray,
    start_ns: &'a Int64Array,
    duration_ns: &'a Int64Array,
    error: &'a StringArray,
    module: Option<&'a StringArray>,
    fwd_seq: Option<&'a Int64Array>,
    source: Option<&'a StringArray>,
    role: &'a StringArray,
    arg: &'a StringArray,
    list_index: &'a Int32Array,
    dtype: &'a StringArray,
    shape: &'a ListArray,
    stride: &'a ListArray,
    device: &'a StringArray,
    numel: &'a Int64Array,
    status: &'a StringArray,
    name: Option<&'a StringArray>,
    capture_file: Option<&'a StringArray>,
    capture_key: Option<&'a StringArray>,
    fingerprint: Option<&'a UInt64Array>,
    sketch: Option<&'a ListArray>,
    /// min, max, mean, std, l2, absmax.
    floats: [&'a Float64Array; 6],
    /// nan, posinf, neginf and zero counts.
    counts: [&'a Int64Array; 4],
}

/// A column that every readable version has.
fn required<'a>(path: &Path, batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| Error::format(path, format!("column {name:?} is missing")))
}

fn string_at(c: &StringArray, i: usize) -> Option<String> {
    (!c.is_null(i)).then(|| c.value(i).to_owned())
}

fn optional_string_at(c: Option<&StringArray>, i: usize) -> Option<String> {
    c.and_then(|c| string_at(c, i))
}

fn value_at<T: arrow_array::ArrowPrimitiveType>(
    c: &arrow_array::PrimitiveArray<T>,
    i: usize,
) -> Option<T::Native> {
    (!c.is_null(i)).then(|| c.value(i))
}

/// The values of a list cell; empty when the cell is null.
fn list_at<T: arrow_array::ArrowPrimitiveType>(l: &ListArray, i: usize) -> Vec<T::Native> {
    if l.is_null(i) {
        Vec::new()
    } else {
        l.value(i).as_primitive::<T>().values().to_vec()
    }
}

impl<'a> Columns<'a> {
    fn of(path: &'a Path, batch: &'a RecordBatch) -> Result<Self> {
        let i64c = |n| -> Result<_> { Ok(required(path, batch, n)?.as_primitive::<Int64Type>()) };
        let i32c = |n| -> Result<_> { Ok(required(path, batch, n)?.as_primitive::<Int32Type>()) };
        let f64c = |n| -> Result<_> { Ok(required(path, batch, n)?.as_primitive::<Float64Type>()) };
        let strc = |n| -> Result<_> { Ok(required(path, batch, n)?.as_string::<i32>()) };
        let listc = |n| -> Result<_> { Ok(required(path, batch, n)?.as_list::<i32>()) };
        let opt_str = |n| batch.column_by_name(n).map(|c| c.as_string::<i32>());
        Ok(Columns {
            path,
            rows: batch.num_rows(),
            seq: i64c(col::SEQ)?,
            parent_seq: i64c(col::PARENT_SEQ)?,
            depth: i32c(col::DEPTH)?,
            pid: i32c(col::PID)?,
            thread: i64c(col::THREAD)?,
            step: i64c(col::STEP)?,
            phase: strc(col::PHASE)?,
            op: strc(col::OP)?,
            overload: strc(col::OVERLOAD)?,
            args: strc(col::ARGS)?,
            start_ns: i64c(col::START_NS)?,
            duration_ns: i64c(col::DURATION_NS)?,
            error: strc(col::ERROR)?,
            module: opt_str(col::MODULE),
            fwd_seq: batch
                .column_by_name(col::FWD_SEQ)
                .map(|c| c.as_primitive::<Int64Type>()),
            source: opt_str(col::SOURCE),
            role: strc(col::ROLE)?,
            arg: strc(col::ARG)?,
            list_index: i32c(col::LIST_INDEX)?,
            dtype: strc(col::DTYPE)?,
            shape: listc(col::SHAPE)?,
            stride: listc(col::STRIDE)?,
            device: strc(col::TENSOR_DEVICE)?,
            numel: i64c(col::NUMEL)?,
            status: strc(col::STATS_STATUS)?,
            name: opt_str(col::NAME),
            capture_file: opt_str(col::CAPTURE_FILE),
            capture_key: opt_str(col::CAPTURE_KEY),
            fingerprint: batch
                .column_by_name(col::FINGERPRINT)
                .map(|c| c.as_primitive::<UInt64Type>()),
            sketch: batch
                .column_by_name(col::SKETCH)
                .map(|c| c.as_list::<i32>()),
            floats: [
                f64c(col::MIN)?,
                f64c(col::MAX)?,
                f64c(col::MEAN)?,
                f64c(col::STD)?,
                f64c(col::L2)?,
                f64c(col::ABSMAX)?,
            ],
            counts: [
                i64c(col::NAN_COUNT)?,
                i64c(col::POSINF_COUNT)?,
                i64c(col::NEGINF_COUNT)?,
                i64c(col::ZERO_COUNT)?,
            ],
        })
    }

    /// Appends the batch's rows to `out`: a row of a new seq starts a
    /// record, the others add their tensor to the last one.
    fn append_rows(&self, out: &mut Vec<OpRecord>) -> Result<()> {
        for i in 0..self.rows {
            if out.last().map(|r| r.seq) != Some(self.seq.value(i)) {
                out.push(self.op_record(i)?);
            }
            let Some(tensor) = self.tensor_record(i)? else {
                continue;
            };
            let Some(rec) = out.last_mut() else { continue };
            rec.tensors.push(tensor);
            // The file's name is all a reader learns of a capture here.
            if let Some(file) = optional_string_at(self.capture_file, i) {
                rec.capture.get_or_insert_with(Default::default).file = Some(file);
            }
        }
        Ok(())
    }

    fn bad(&self, what: &str, value: &str) -> Error {
        Error::format(self.path, format!("bad {what} {value:?}"))
    }

    /// The op-level columns of row `i`, with no tensor yet.
    fn op_record(&self, i: usize) -> Result<OpRecord> {
        let phase = self.phase.value(i);
        Ok(OpRecord {
            seq: self.seq.value(i),
            parent_seq: value_at(self.parent_seq, i),
            depth: self.depth.value(i),
            pid: self.pid.value(i),
            thread: self.thread.value(i),
            step: self.step.value(i),
            phase: Phase::parse(phase).ok_or_else(|| self.bad("phase", phase))?,
            op: self.op.value(i).to_owned().into(),
            overload: self.overload.value(i).to_owned().into(),
            args: self.args.value(i).to_owned(),
            start_ns: self.start_ns.value(i),
            duration_ns: self.duration_ns.value(i),
            error: string_at(self.error, i),
            module: optional_string_at(self.module, i).map(Into::into),
            fwd_seq: self.fwd_seq.and_then(|c| value_at(c, i)),
            source: optional_string_at(self.source, i),
            tensors: Vec::new(),
            capture: None,
        })
    }

    /// The tensor of row `i`; `None` for the one row of a call without
    /// tensors (role `none`).
    fn tensor_record(&self, i: usize) -> Result<Option<TensorRecord>> {
        let role = self.role.value(i);
        let role = Role::parse(role).ok_or_else(|| self.bad("role", role))?;
        if role == Role::None {
            return Ok(None);
        }
        let status = self.status.value(i);
        let status = StatsStatus::parse(status).ok_or_else(|| self.bad("stats_status", status))?;
        Ok(Some(TensorRecord {
            role,
            arg: self.arg.value(i).to_owned().into(),
            list_index: value_at(self.list_index, i),
            dtype: self.dtype.value(i).to_owned().into(),
            shape: list_at::<Int64Type>(self.shape, i),
            stride: list_at::<Int64Type>(self.stride, i),
            device: self.device.value(i).to_owned().into(),
            numel: self.numel.value(i),
            status,
            stats: if status.has_values() {
                self.stats(i)
            } else {
                Stats::NONE
            },
            name: optional_string_at(self.name, i),
            capture_key: optional_string_at(self.capture_key, i),
            fingerprint: self.fingerprint.and_then(|c| value_at(c, i)),
            sketch: self
                .sketch
                .and_then(|l| (!l.is_null(i)).then(|| list_at::<Float64Type>(l, i))),
        }))
    }

    /// The statistics of row `i`: a null float is NaN, a null count 0.
    fn stats(&self, i: usize) -> Stats {
        let [min, max, mean, std, l2, absmax] =
            self.floats.map(|c| value_at(c, i).unwrap_or(f64::NAN));
        let [nan_count, posinf_count, neginf_count, zero_count] =
            self.counts.map(|c| value_at(c, i).unwrap_or(0));
        Stats {
            min,
            max,
            mean,
            std,
            l2,
            absmax,
            nan_count,
            posinf_count,
            neginf_count,
            zero_count,
        }
    }
}
