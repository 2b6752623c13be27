//! Reading one rank of a dump into a [`Dump`].
//!
//! Only the columns comparison needs are decoded (Parquet projection), batch
//! by batch, straight into the flat columns of [`Dump`] and its spilled rows
//! (one chunk of which is resident); a batch is dropped as soon as it is
//! copied. Vectors are reserved from the file footers' row counts, so they
//! do not overshoot by the doubling of `Vec` growth.
//!
//! Every file goes through `opdump_format::reader::open_batches`, which checks
//! the schema version and says clearly when a dump is too old or too new.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, UInt64Type};
use std::fs::File;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, BooleanArray, Float64Array, Int64Array, PrimitiveArray,
    RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use opdump_format::columns::{ColType, COLUMNS, COUNT_STATS, FLOAT_STATS};
use opdump_format::reader::{list_files, open_batches, open_regular, DumpFile};
use opdump_format::schema::{col, meta};
use opdump_format::SCHEMA_VERSION;
use opdump_format::{Phase, Role, StatsStatus};
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowFilter,
};
use parquet::arrow::ProjectionMask;

use opdump_judge::calls::CallColumns;
use opdump_judge::dump::{signature_start, signature_step};
use opdump_judge::packed::{PackedU32, Parents};
use opdump_judge::tree::{call_tree, NO_PARENT};
use opdump_judge::{DType, Dump, Interner, Observer, OpRow, ShapeInterner, TensorRow, Tensors};
use opdump_judge::{NONE, NO_ID, NO_SEQ};

use crate::captures::CaptureCache;
use crate::error::{Error, Result};
use crate::panic_guard;
use crate::spill::Spill;

/// Columns of the op call and tensor read from every file, besides the
/// statistics ([`FLOAT_STATS`], [`COUNT_STATS`]). Others (pid, thread,
/// times, stride, tensor_device) are never decoded.
const REQUIRED: [&str; 15] = [
    col::SEQ,
    col::PARENT_SEQ,
    col::DEPTH,
    col::STEP,
    col::PHASE,
    col::OP,
    col::OVERLOAD,
    col::ARGS,
    col::ROLE,
    col::ARG,
    col::LIST_INDEX,
    col::DTYPE,
    col::SHAPE,
    col::NUMEL,
    col::STATS_STATUS,
];

/// The float statistics, as many as the format's table lists: a new one
/// fails to compile where the reader takes them apart.
const FLOATS: usize = FLOAT_STATS.len();
/// The element counts, likewise.
const COUNTS: usize = COUNT_STATS.len();

/// Read when present: `error` (schema 1 has it), where in the model a call
/// ran (schema 2), and evidence columns that later schema versions add.
const OPTIONAL: [&str; 9] = [
    col::ERROR,
    col::MODULE,
    col::FWD_SEQ,
    col::SOURCE,
    col::NAME,
    col::CAPTURE_FILE,
    col::CAPTURE_KEY,
    col::FINGERPRINT,
    col::SKETCH,
];

/// Optional columns that read as absent when every value is null. Most
/// dumps leave these null throughout (no errors, no source lines, no
/// captures, no sketch), and a dictionary column with no dictionary values
/// takes the reader's slow path: each batch is rebuilt into a dictionary by
/// hashing and comparing its rows one by one. A `sketch` column read, even
/// all null, costs an index per tensor (4 bytes: 236 MB for the synthetic
/// 10M pair) and its list decoding; absent, no tensor has a sketch, as
/// when all are null.
const NULL_AS_ABSENT: [&str; 7] = [
    col::ERROR,
    col::MODULE,
    col::SOURCE,
    col::NAME,
    col::CAPTURE_FILE,
    col::CAPTURE_KEY,
    col::SKETCH,
];

const BATCH_ROWS: usize = 64 * 1024;

/// One file of a dump with what its footer says.
#[derive(Clone, Debug)]
pub struct FileInfo {
    pub path: PathBuf,
    pub rank: u32,
    pub pid: i64,
    pub rows: u64,
    pub op_calls: u64,
    /// Bytes on disk: bounds the buffers reserved for the file's rows.
    pub bytes: u64,
    pub stats_accumulate: Option<String>,
    /// `opdump.schema_version` (checked readable by the format crate).
    pub schema_version: u32,
}

/// A row takes more than this many bytes on disk in a real dump (a tensor
/// row holds six float statistics; the synthetic benchmark's very regular
/// rows take 8). The footer's row count, which a corrupt or hostile file
/// can set to anything, reserves memory only up to the file's size over
/// this (and only as much as can be had, see [`reserved`]); past it,
/// vectors grow as they fill.
const MIN_BYTES_PER_ROW: u64 = 4;

/// The files of a dump directory, their footers read and versions checked.
pub struct DumpIndex {
    pub dir: PathBuf,
    pub files: Vec<FileInfo>,
}

impl DumpIndex {
    pub fn ranks(&self) -> BTreeSet<u32> {
        self.files.iter().map(|f| f.rank).collect()
    }
}

/// Lists a dump's files and reads their footers (cheap: no data pages).
pub fn scan(dir: &Path) -> Result<DumpIndex> {
    let listed = list_files(dir)?;
    let mut files = Vec::with_capacity(listed.len());
    for DumpFile { path, rank, .. } in listed {
        let info = panic_guard::run(&path, || -> Result<FileInfo> {
            let b = open_batches(&path)?;
            let md = b.metadata().file_metadata();
            let kv = |k: &str| -> Option<String> {
                md.key_value_metadata()?
                    .iter()
                    .find(|kv| kv.key == k)?
                    .value
                    .clone()
            };
            let rows = md.num_rows().max(0) as u64;
            let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
            Ok(FileInfo {
                bytes,
                rank: rank.unwrap_or(0),
                pid: kv(meta::PID)
                    .and_then(|p| p.parse().ok())
                    .or_else(|| pid_from_name(&path))
                    .unwrap_or(0),
                rows,
                op_calls: kv(meta::OP_CALLS)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(rows),
                stats_accumulate: kv(meta::STATS_ACCUMULATE),
                schema_version: kv(meta::SCHEMA_VERSION)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(SCHEMA_VERSION),
                path: path.clone(),
            })
        })?;
        files.push(info);
    }
    Ok(DumpIndex {
        dir: dir.to_path_buf(),
        files,
    })
}

/// `part-<pid>-<NNNNN>.parquet` -> pid.
fn pid_from_name(path: &Path) -> Option<i64> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("part-")?.split('-').next()?.parse().ok()
}

/// Loads one rank. When several processes wrote into the rank (DataLoader
/// workers under `LD_PRELOAD`, or two runs into one directory), their `seq`s
/// are unrelated, so only the process with the most op calls is kept and the
/// others are counted in `skipped_other_pids`.
pub fn load(index: &DumpIndex, rank: u32, progress: &dyn Observer, label: &str) -> Result<Dump> {
    load_with(index, rank, None, progress, label)
}

/// Loads the calls of one rank in the steps `steps` only, as [`load`]
/// would hold them: the same process is chosen, and rows of other steps
/// are skipped as they are decoded, so memory follows the steps read, not
/// the dump (a dump compared a step at a time while a job runs).
pub fn load_steps(
    index: &DumpIndex,
    rank: u32,
    steps: RangeInclusive<i64>,
    progress: &dyn Observer,
    label: &str,
) -> Result<Dump> {
    load_with(index, rank, Some(steps), progress, label)
}

fn load_with(
    index: &DumpIndex,
    rank: u32,
    steps: Option<RangeInclusive<i64>>,
    progress: &dyn Observer,
    label: &str,
) -> Result<Dump> {
    let mut by_pid: BTreeMap<i64, Vec<&FileInfo>> = BTreeMap::new();
    for f in index.files.iter().filter(|f| f.rank == rank) {
        by_pid.entry(f.pid).or_default().push(f);
    }
    let calls = |fs: &Vec<&FileInfo>| fs.iter().map(|f| f.op_calls).sum::<u64>();
    let Some((&pid, files)) = by_pid
        .iter()
        .max_by_key(|(pid, fs)| (calls(fs), std::cmp::Reverse(**pid)))
    else {
        return Err(Error::new(format!(
            "{}: no files of rank {rank}",
            index.dir.display()
        )));
    };
    let skipped: u64 = by_pid
        .iter()
        .filter(|(p, _)| **p != pid)
        .map(|(_, fs)| calls(fs))
        .sum();
    // Capacity hints from the footers, bounded by the files' sizes.
    let rows: u64 = files
        .iter()
        .map(|f| f.rows.min(f.bytes / MIN_BYTES_PER_ROW))
        .sum();
    let ops: u64 = calls(files).min(rows);

    // The footers count every step: a few steps reserve nothing ahead.
    let mut b = Builder::new(if steps.is_some() { 0 } else { ops as usize });
    b.steps = steps;
    // One thread decodes the Parquet pages, this one builds the rows from
    // the decoded batches, file by file in order: the two halves of a
    // dump's reading run on two cores (B, the larger dump, takes about
    // three times A's time, so the cores would otherwise idle while it
    // is read).
    let steps = b.steps.clone();
    let steps = steps.as_ref();
    std::thread::scope(|s| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Piece>>(DECODED_AHEAD);
        s.spawn(move || decode_files(files, steps, &tx));
        for (n, f) in files.iter().enumerate() {
            progress.update(&|| {
                format!(
                    "reading {label}: file {}/{} ({} op calls)",
                    n + 1,
                    files.len(),
                    b.seq.len()
                )
            });
            panic_guard::run(&f.path, || b.read_decoded(&f.path, &rx))?;
        }
        Ok(())
    })?;
    let accumulate = if files
        .iter()
        .any(|f| f.stats_accumulate.as_deref() == Some("float32"))
    {
        "float32"
    } else {
        "float64"
    };
    let schema_version = files
        .iter()
        .map(|f| f.schema_version)
        .min()
        .unwrap_or(SCHEMA_VERSION);
    let mut d = b.finish(
        index.dir.clone(),
        rank,
        Some(pid),
        files.len(),
        accumulate.to_string(),
        skipped,
    )?;
    d.schema_version = schema_version;
    Ok(d)
}

/// Keeps the rows whose step lies in `steps`; `mask` selects the step
/// column alone.
fn step_filter(mask: ProjectionMask, steps: RangeInclusive<i64>) -> RowFilter {
    let keep = move |batch: RecordBatch| {
        let step = batch
            .column(0)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| {
                arrow_schema::ArrowError::SchemaError("the step column is not int64".into())
            })?;
        Ok(step
            .iter()
            .map(|s| Some(s.is_some_and(|s| steps.contains(&s))))
            .collect::<BooleanArray>())
    };
    RowFilter::new(vec![Box::new(ArrowPredicateFn::new(mask, keep))])
}

/// Accumulates rows of several files.
struct Builder {
    names: Interner,
    texts: Interner,
    dtypes: Vec<DType>,
    /// The seqs and parents' seqs, until the call tree is built.
    seq: Vec<i64>,
    parent_seq: Vec<i64>,
    /// The rest of each call, out of memory, in seq order when
    /// `ops_in_order`.
    ops: Spill<OpRow>,
    /// Complete calls on their way to `ops`, in seq order.
    ready: VecDeque<OpRow>,
    /// The seq of the last call in `ops`.
    last_spilled: Option<i64>,
    /// Every call went to `ops` after those of smaller seqs.
    ops_in_order: bool,
    /// The calls whose tensors may not all be read yet (the last of a batch
    /// goes on into the next), their signatures still being folded: spilled
    /// once complete.
    open: Vec<OpRow>,
    has_modules: bool,
    op: Vec<u32>,
    overload: Vec<u32>,
    t_start: Vec<u32>,
    t_len: Vec<u32>,
    /// The fixed-size part of each tensor, out of memory; the rest of the
    /// tensor columns are in `t`.
    t_rows: Spill<TensorRow>,
    t: Tensors,
    has_sketch: bool,
    /// Some tensor read so far was captured: every tensor has the two
    /// capture columns from then on.
    has_captures: bool,
    /// Only rows of these steps are read ([`load_steps`]).
    steps: Option<RangeInclusive<i64>>,
}

/// A file opened for reading (the format crate checks its schema version
/// first), every string column of the table asked for as a dictionary: the
/// writer dictionary-encodes them, so each distinct value is then looked at
/// once per batch. Also the file's schema, to choose columns by name.
pub(crate) fn open_dictionaries(
    path: &Path,
) -> Result<(ParquetRecordBatchReaderBuilder<File>, SchemaRef)> {
    let file_schema = open_batches(path)?.schema().clone();
    let is_string = |name: &str| {
        COLUMNS
            .iter()
            .any(|c| c.name == name && c.ty == ColType::Utf8)
    };
    let hint = Arc::new(Schema::new(
        file_schema
            .fields()
            .iter()
            .map(|f| {
                if is_string(f.name()) && f.data_type() == &DataType::Utf8 {
                    Arc::new(Field::new(
                        f.name(),
                        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                        f.is_nullable(),
                    ))
                } else {
                    f.clone()
                }
            })
            .collect::<Vec<_>>(),
    ));
    let file: File = open_regular(path)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(
        file,
        ArrowReaderOptions::new().with_schema(hint),
    )
    .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
    Ok((builder, file_schema))
}

/// The indices of the columns `names` in `schema`; an error names the
/// first one missing.
pub(crate) fn required_roots<'a>(
    path: &Path,
    schema: &Schema,
    names: impl IntoIterator<Item = &'a &'a str>,
) -> Result<Vec<usize>> {
    names
        .into_iter()
        .map(|name| {
            schema
                .index_of(name)
                .map_err(|_| Error::new(format!("{}: column {name:?} is missing", path.display())))
        })
        .collect()
}

fn dtype_id(dtypes: &mut Vec<DType>, name: &str) -> Result<u16> {
    if let Some(i) = dtypes.iter().position(|d| &*d.name == name) {
        return Ok(i as u16);
    }
    if dtypes.len() >= u16::MAX as usize {
        return Err(Error::new("too many distinct dtypes"));
    }
    dtypes.push(DType::parse(name));
    Ok((dtypes.len() - 1) as u16)
}

/// A string column of one batch. The reader asks for dictionary arrays
/// (the writer dictionary-encodes these columns), so each distinct value is
/// looked at once per batch, not once per row.
pub(crate) enum StrCol<'a> {
    Dict(&'a PrimitiveArray<Int32Type>, &'a StringArray),
    Plain(&'a StringArray),
}

impl<'a> StrCol<'a> {
    pub(crate) fn new(path: &Path, b: &'a RecordBatch, name: &str) -> Result<Self> {
        let a = get(path, b, name)?;
        if let Some(d) = a.as_dictionary_opt::<Int32Type>() {
            if let Some(v) = d.values().as_string_opt::<i32>() {
                return Ok(StrCol::Dict(d.keys(), v));
            }
        }
        a.as_string_opt::<i32>()
            .map(StrCol::Plain)
            .ok_or_else(|| bad_type(path, name, a))
    }

    /// The column of `name` when the batch has it.
    pub(crate) fn optional(path: &Path, b: &'a RecordBatch, name: &str) -> Result<Option<Self>> {
        match b.column_by_name(name) {
            Some(_) => Self::new(path, b, name).map(Some),
            None => Ok(None),
        }
    }

    /// The value of row `i`; `None` for a null.
    pub(crate) fn get(&self, i: usize) -> Option<&'a str> {
        match self {
            StrCol::Dict(k, v) => {
                let j = k.is_valid(i).then(|| k.value(i) as usize)?;
                (j < v.len() && v.is_valid(j)).then(|| v.value(j))
            }
            StrCol::Plain(s) => s.is_valid(i).then(|| s.value(i)),
        }
    }

    /// One value per row, `null` for a null: `f` maps each distinct string.
    fn codes<T: Copy>(&self, null: T, mut f: impl FnMut(&str) -> Result<T>) -> Result<Vec<T>> {
        match self {
            StrCol::Dict(keys, values) => {
                let mut map = Vec::with_capacity(values.len());
                for i in 0..values.len() {
                    map.push(if values.is_null(i) {
                        null
                    } else {
                        f(values.value(i))?
                    });
                }
                let code = |k: i32| map.get(k as usize).copied().unwrap_or(null);
                if keys.null_count() == 0 {
                    // Most columns have no null: one look-up per row, no
                    // test of the validity bits (14 columns of every row).
                    return Ok(keys.values().iter().map(|&k| code(k)).collect());
                }
                Ok((0..keys.len())
                    .map(|i| {
                        if keys.is_null(i) {
                            null
                        } else {
                            code(keys.value(i))
                        }
                    })
                    .collect())
            }
            StrCol::Plain(a) => (0..a.len())
                .map(|i| {
                    if a.is_null(i) {
                        Ok(null)
                    } else {
                        f(a.value(i))
                    }
                })
                .collect(),
        }
    }
}

/// Typed columns of one batch.
struct Cols<'a> {
    seq: &'a Int64Array,
    parent: &'a Int64Array,
    depth: &'a arrow_array::Int32Array,
    step: &'a Int64Array,
    phase: StrCol<'a>,
    op: StrCol<'a>,
    overload: StrCol<'a>,
    args: StrCol<'a>,
    error: Option<StrCol<'a>>,
    module: Option<StrCol<'a>>,
    fwd_seq: Option<&'a Int64Array>,
    source: Option<StrCol<'a>>,
    name: Option<StrCol<'a>>,
    capture_file: Option<StrCol<'a>>,
    capture_key: Option<StrCol<'a>>,
    role: StrCol<'a>,
    arg: StrCol<'a>,
    list_index: &'a arrow_array::Int32Array,
    dtype: StrCol<'a>,
    shape: &'a arrow_array::ListArray,
    numel: &'a Int64Array,
    status: StrCol<'a>,
    /// The columns of [`FLOAT_STATS`], in its order.
    f: [&'a Float64Array; FLOATS],
    /// The columns of [`COUNT_STATS`], in its order.
    c: [&'a Int64Array; COUNTS],
    fingerprint: Option<Fingerprints<'a>>,
    /// A list of float64 per row.
    sketch: Option<&'a arrow_array::ListArray>,
}

fn get<'a>(path: &Path, batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| Error::new(format!("{}: column {name:?} is missing", path.display())))
}

fn bad_type(path: &Path, name: &str, a: &ArrayRef) -> Error {
    Error::new(format!(
        "{}: column {name:?} has unexpected type {}",
        path.display(),
        a.data_type()
    ))
}

impl<'a> Cols<'a> {
    fn new(path: &Path, b: &'a RecordBatch) -> Result<Self> {
        let i64c = |n: &str| primitive::<Int64Type>(path, b, n);
        let i32c = |n: &str| primitive::<Int32Type>(path, b, n);
        let f64c = |n: &str| primitive::<Float64Type>(path, b, n);
        let strc = |n: &str| StrCol::new(path, b, n);
        let opt_strc = |n: &str| StrCol::optional(path, b, n);
        let shape = {
            let a = get(path, b, col::SHAPE)?;
            let l = a
                .as_list_opt::<i32>()
                .ok_or_else(|| bad_type(path, col::SHAPE, a))?;
            if l.values().data_type() != &DataType::Int64 {
                return Err(bad_type(path, col::SHAPE, a));
            }
            l
        };
        Ok(Cols {
            seq: i64c(col::SEQ)?,
            parent: i64c(col::PARENT_SEQ)?,
            depth: i32c(col::DEPTH)?,
            step: i64c(col::STEP)?,
            phase: strc(col::PHASE)?,
            op: strc(col::OP)?,
            overload: strc(col::OVERLOAD)?,
            args: strc(col::ARGS)?,
            error: opt_strc(col::ERROR)?,
            module: opt_strc(col::MODULE)?,
            fwd_seq: match b.column_by_name(col::FWD_SEQ) {
                Some(_) => Some(i64c(col::FWD_SEQ)?),
                None => None,
            },
            source: opt_strc(col::SOURCE)?,
            name: opt_strc(col::NAME)?,
            capture_file: opt_strc(col::CAPTURE_FILE)?,
            capture_key: opt_strc(col::CAPTURE_KEY)?,
            role: strc(col::ROLE)?,
            arg: strc(col::ARG)?,
            list_index: i32c(col::LIST_INDEX)?,
            dtype: strc(col::DTYPE)?,
            shape,
            numel: i64c(col::NUMEL)?,
            status: strc(col::STATS_STATUS)?,
            f: columns(FLOAT_STATS, f64c)?,
            c: columns(COUNT_STATS, i64c)?,
            fingerprint: Fingerprints::of(path, b)?,
            sketch: match b.column_by_name(col::SKETCH) {
                Some(a) => match a.as_list_opt::<i32>() {
                    Some(l) if l.values().data_type() == &DataType::Float64 => Some(l),
                    _ => return Err(bad_type(path, col::SKETCH, a)),
                },
                None => None,
            },
        })
    }
}

/// The column `name` of a batch, of Arrow type `T`.
pub(crate) fn primitive<'a, T: ArrowPrimitiveType>(
    path: &Path,
    b: &'a RecordBatch,
    name: &str,
) -> Result<&'a PrimitiveArray<T>> {
    let a = get(path, b, name)?;
    a.as_primitive_opt::<T>()
        .ok_or_else(|| bad_type(path, name, a))
}

/// The columns `names` of a batch, each decoded by `decode`.
fn columns<'a, T, const N: usize>(
    names: &[&str],
    decode: impl Fn(&str) -> Result<&'a T>,
) -> Result<[&'a T; N]> {
    let decoded: Vec<&'a T> = names.iter().map(|n| decode(n)).collect::<Result<_>>()?;
    decoded
        .try_into()
        .map_err(|_| Error::new("statistics columns miscounted"))
}

/// The fingerprint column: UInt64 as written; Int64 (the same bits) read
/// too.
pub(crate) enum Fingerprints<'a> {
    U(&'a PrimitiveArray<UInt64Type>),
    I(&'a Int64Array),
}

impl<'a> Fingerprints<'a> {
    /// The batch's fingerprints, when it has the column.
    pub(crate) fn of(path: &Path, b: &'a RecordBatch) -> Result<Option<Self>> {
        let Some(a) = b.column_by_name(col::FINGERPRINT) else {
            return Ok(None);
        };
        if let Some(u) = a.as_primitive_opt::<UInt64Type>() {
            return Ok(Some(Fingerprints::U(u)));
        }
        match a.as_primitive_opt::<Int64Type>() {
            Some(s) => Ok(Some(Fingerprints::I(s))),
            None => Err(bad_type(path, col::FINGERPRINT, a)),
        }
    }

    /// Row `i`'s fingerprint; `None` for a null (not measured).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<u64> {
        match self {
            Fingerprints::U(u) => u.is_valid(i).then(|| u.value(i)),
            Fingerprints::I(s) => s.is_valid(i).then(|| s.value(i) as u64),
        }
    }
}

#[inline]
fn fval(a: &Float64Array, i: usize) -> f64 {
    if a.is_null(i) {
        f64::NAN
    } else {
        a.value(i)
    }
}

#[inline]
fn ival(a: &Int64Array, i: usize) -> i64 {
    if a.is_null(i) {
        0
    } else {
        a.value(i)
    }
}

/// Whether the footer says column `name` is null in every row of the file
/// (each row group's statistics count as many nulls as rows; for a list
/// column, `sketch`, its leaf `sketch.list.item`, where an empty list
/// counts too, which reads as no sketch all the same). Without
/// statistics, it is read.
fn all_null(metadata: &parquet::file::metadata::ParquetMetaData, name: &str) -> bool {
    let leaves: Vec<usize> = metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.path().parts().first().is_some_and(|p| p == name))
        .map(|(k, _)| k)
        .collect();
    !leaves.is_empty()
        && metadata.row_groups().iter().all(|rg| {
            leaves.iter().all(|&k| {
                rg.column(k)
                    .statistics()
                    .and_then(|s| s.null_count_opt())
                    .is_some_and(|n| n == rg.num_rows().max(0) as u64)
            })
        })
}

/// An empty vector with room for `n` items, or less when that much memory
/// is not to be had: a capacity hint, never a reason to abort.
fn reserved<T>(n: usize) -> Vec<T> {
    let mut v = Vec::new();
    let _ = v.try_reserve_exact(n);
    v
}

/// The string columns of one batch, one value per row (`None` or `NO_ID`
/// for a null).
struct RowCodes {
    phase: Vec<Option<Phase>>,
    role: Vec<Option<Role>>,
    /// Also `None` for a status this reader does not know.
    status: Vec<Option<StatsStatus>>,
    /// Ids in `names`.
    op: Vec<u32>,
    overload: Vec<u32>,
    arg: Vec<u32>,
    /// Ids in `texts`.
    args: Vec<u32>,
    error: Vec<u32>,
    module: Vec<u32>,
    source: Vec<u32>,
    /// Tensor rows: the parameter name.
    name: Vec<u32>,
    /// Tensor rows of captured calls: the capture file (its path, beside
    /// the Parquet file) and the key in it; empty when the batch has none.
    capture_file: Vec<u32>,
    capture_key: Vec<u32>,
    /// Index into the dtypes.
    dtype: Vec<u32>,
}

/// The rows of a batch that hold a tensor, and their roles (input or
/// output).
struct TensorRows {
    rows: Vec<u32>,
    roles: Vec<Role>,
    /// The call of each, an index into [`Builder::open`].
    call: Vec<u32>,
}

/// A file that breaks the format's rules.
fn corrupt(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::new(format!("{}: {msg}", path.display()))
}

/// Interns the shape of each tensor row (a null shape is a scalar's).
fn shape_ids(
    path: &Path,
    c: &Cols<'_>,
    rows: &[u32],
    shapes: &mut ShapeInterner,
) -> Result<Vec<u32>> {
    let shape_offsets = c.shape.value_offsets();
    let shape_values = c.shape.values().as_primitive::<Int64Type>().values();
    let mut out = Vec::with_capacity(rows.len());
    for &i in rows {
        let i = i as usize;
        let numel = ival(c.numel, i);
        let dims: &[i64] = if c.shape.is_null(i) {
            &[]
        } else {
            let (s, e) = (shape_offsets[i] as usize, shape_offsets[i + 1] as usize);
            shape_values
                .get(s..e)
                .ok_or_else(|| corrupt(path, "shape offsets out of range"))?
        };
        out.push(shapes.intern(dims, numel));
    }
    Ok(out)
}

/// Appends the sketches of `rows` (none when the file has no such column)
/// to the flat sketch columns.
fn push_sketches(
    path: &Path,
    sketch: Option<&arrow_array::ListArray>,
    rows: &[u32],
    t: &mut Tensors,
) -> Result<()> {
    let Some(l) = sketch else {
        let end = t.sketch_values.len() as u32;
        t.sketch_start
            .resize(t.sketch_start.len() + rows.len(), end);
        return Ok(());
    };
    let offsets = l.value_offsets();
    let values = l.values().as_primitive::<Float64Type>();
    for &i in rows {
        let i = i as usize;
        if !l.is_null(i) {
            let (s, e) = (offsets[i] as usize, offsets[i + 1] as usize);
            if s > e || e > values.len() {
                return Err(corrupt(path, "sketch offsets out of range"));
            }
            t.sketch_values.extend((s..e).map(|k| fval(values, k)));
        }
        let end = u32::try_from(t.sketch_values.len())
            .map_err(|_| corrupt(path, "more than 4 billion sketch values"))?;
        t.sketch_start.push(end);
    }
    Ok(())
}

/// NaN, +Inf and -Inf counts, kept only for the tensors that have some;
/// `first` is the index of the first of `rows` among all tensors.
fn push_nonfinite(counts: [&Int64Array; 3], rows: &[u32], first: usize, t: &mut Tensors) {
    let [cnan, cpos, cneg] = counts;
    if cnan.null_count() == cnan.len()
        && cpos.null_count() == cpos.len()
        && cneg.null_count() == cneg.len()
    {
        return;
    }
    // Almost every batch counts no NaN or Inf at all: a pass over the raw
    // values (a null's slot too, which reads as 0 below) finds that without
    // a test per row.
    if counts.iter().all(|c| c.values().iter().all(|&v| v == 0)) {
        return;
    }
    for (k, &i) in rows.iter().enumerate() {
        let i = i as usize;
        let nf = [ival(cnan, i), ival(cpos, i), ival(cneg, i)];
        if nf != [0; 3] {
            t.nf_index.push((first + k) as u32);
            t.nf_counts.push(nf);
        }
    }
}

/// The indices of `seq` in the order of their values. A dump's calls come
/// a few places from seq order, which an insertion sort puts right in a
/// few moves a call; past a bound on the moves, a full sort.
fn seq_order(seq: &[i64]) -> Vec<u32> {
    let mut perm: Vec<u32> = (0..seq.len() as u32).collect();
    let mut moves = 8 * seq.len() + 64;
    for i in 1..perm.len() {
        let mut j = i;
        while j > 0 && seq[perm[j - 1] as usize] > seq[perm[j] as usize] {
            if moves == 0 {
                perm.sort_unstable_by_key(|&k| seq[k as usize]);
                return perm;
            }
            moves -= 1;
            perm.swap(j - 1, j);
            j -= 1;
        }
    }
    perm
}

/// Calls the reorder buffer puts in seq order before they are spilled
/// ([`Builder::push_ready`]): a dump's calls come a few places from seq
/// order (at most 4 in the synthetic benchmark's). Each call is moved
/// at most this many places.
const REORDER: usize = 128;

/// Decoded batches a dump's decoding thread may hold ready, ahead of the
/// thread building the rows (each of [`BATCH_ROWS`] rows, about 10 MB).
const DECODED_AHEAD: usize = 1;

/// What the decoding thread sends: a file's batches, then its end.
enum Piece {
    Batch(RecordBatch),
    End,
}

/// Decodes `files` in order into `tx`, each file's batches followed by
/// [`Piece::End`]; stops at the first error (sent) or when the receiver
/// is gone.
fn decode_files(
    files: &[&FileInfo],
    steps: Option<&RangeInclusive<i64>>,
    tx: &SyncSender<Result<Piece>>,
) {
    for f in files {
        let sent = panic_guard::run(&f.path, || -> Result<bool> {
            for batch in open_reader(&f.path, steps)? {
                let batch = batch.map_err(|e| Error::new(format!("{}: {e}", f.path.display())))?;
                if tx.send(Ok(Piece::Batch(batch))).is_err() {
                    return Ok(false);
                }
            }
            Ok(tx.send(Ok(Piece::End)).is_ok())
        });
        match sent {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

/// The reader of the columns comparison needs in the file `path` (its
/// chunks checked against their sums), of the rows in `steps` when given.
fn open_reader(
    path: &Path,
    steps: Option<&RangeInclusive<i64>>,
) -> Result<ParquetRecordBatchReader> {
    let (builder, arrow_schema) = open_dictionaries(path)?;
    let required = REQUIRED.iter().chain(FLOAT_STATS).chain(COUNT_STATS);
    let mut roots = required_roots(path, &arrow_schema, required)?;
    let metadata = builder.metadata().clone();
    let absent = |n: &str| {
        NULL_AS_ABSENT.contains(&n)
            && all_null(&metadata, n)
            // A file with capture files but no keys reads as it did.
            && (n != col::CAPTURE_KEY || all_null(&metadata, col::CAPTURE_FILE))
    };
    roots.extend(
        OPTIONAL
            .iter()
            .filter(|n| !absent(n))
            .filter_map(|n| arrow_schema.index_of(n).ok()),
    );
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    // A step filter reads only `step`, which the mask holds.
    crate::chunks::check(path, &metadata, &mask, None)?;
    let builder = match steps {
        Some(steps) => {
            let step = arrow_schema.index_of(col::STEP).map_err(|_| {
                Error::new(format!("{}: column \"step\" is missing", path.display()))
            })?;
            let filter = step_filter(
                ProjectionMask::roots(builder.parquet_schema(), [step]),
                steps.clone(),
            );
            builder.with_row_filter(filter)
        }
        None => builder,
    };
    builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| Error::new(format!("{}: {e}", path.display())))
}

impl Builder {
    fn new(ops: usize) -> Self {
        let t = Tensors {
            shapes: ShapeInterner::new(),
            ..Tensors::default()
        };
        Builder {
            names: Interner::default(),
            texts: Interner::default(),
            dtypes: Vec::new(),
            seq: reserved(ops),
            parent_seq: reserved(ops),
            ops: Spill::default(),
            ready: VecDeque::with_capacity(REORDER + 1),
            last_spilled: None,
            ops_in_order: true,
            open: Vec::new(),
            t_rows: Spill::default(),
            has_modules: false,
            op: reserved(ops),
            overload: reserved(ops),
            t_start: reserved(ops),
            t_len: reserved(ops),
            t,
            has_sketch: false,
            has_captures: false,
            steps: None,
        }
    }

    /// Appends the batches of the file `path` as the decoding thread sends
    /// them, up to the file's end.
    fn read_decoded(&mut self, path: &Path, rx: &Receiver<Result<Piece>>) -> Result<()> {
        // An op's rows never span two files (the writer rotates between
        // records), so the op boundary restarts with each file.
        let mut last_seq: Option<i64> = None;
        loop {
            match rx.recv() {
                Ok(Ok(Piece::Batch(batch))) => self.read_batch(path, &batch, &mut last_seq)?,
                Ok(Ok(Piece::End)) => break,
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(Error::new(format!(
                        "{}: the thread decoding the dump's files stopped",
                        path.display()
                    )))
                }
            }
        }
        self.spill_complete_calls(0)
    }

    /// Spills the open calls but the last `keep` (whose rows may go on),
    /// through the reorder buffer.
    fn spill_complete_calls(&mut self, keep: usize) -> Result<()> {
        let done = self.open.len().saturating_sub(keep);
        for k in 0..done {
            let row = self.open[k];
            self.push_ready(row)?;
        }
        self.open.drain(..done);
        Ok(())
    }

    /// Puts a complete call into the reorder buffer, in seq order, and
    /// spills the one of smallest seq when the buffer is full. A dump's
    /// calls come in the order they ended (a call after the calls it
    /// made), a few places from seq order; when one comes later than
    /// [`REORDER`] calls of larger seq, `ops` is out of order and
    /// [`Builder::finish`] sorts it (from then on no call is moved here).
    fn push_ready(&mut self, row: OpRow) -> Result<()> {
        self.ready.push_back(row);
        if self.ops_in_order {
            let mut k = self.ready.len() - 1;
            while k > 0 && self.ready[k - 1].seq > row.seq {
                self.ready.swap(k - 1, k);
                k -= 1;
            }
        }
        if self.ready.len() > REORDER {
            self.spill_first_ready()?;
        }
        Ok(())
    }

    /// Spills the first call of the reorder buffer.
    fn spill_first_ready(&mut self) -> Result<()> {
        let Some(row) = self.ready.pop_front() else {
            return Ok(());
        };
        if self.last_spilled.is_some_and(|l| row.seq <= l) {
            self.ops_in_order = false;
        }
        self.last_spilled = Some(row.seq);
        self.ops.push(row)
    }

    /// Appends one batch: its op calls (a call's rows are consecutive, and
    /// `last_seq` carries the call open at the end of the previous batch),
    /// then its tensors.
    fn read_batch(
        &mut self,
        path: &Path,
        batch: &RecordBatch,
        last_seq: &mut Option<i64>,
    ) -> Result<()> {
        let c = Cols::new(path, batch)?;
        if c.fingerprint.is_some() {
            self.start_fingerprints();
        }
        if c.sketch.is_some() {
            self.start_sketches();
        }
        let codes = self.row_codes(path, &c, batch.num_rows())?;
        let tensors = self.push_op_calls(path, &c, &codes, last_seq)?;
        self.push_tensors(path, &c, &codes, &tensors)
    }

    /// From the first file with fingerprints on, every tensor has one (0,
    /// null, for those read before).
    fn start_fingerprints(&mut self) {
        // Tensors read before have 0 (null) in their rows.
        self.t.has_fingerprints = true;
    }

    /// Likewise for sketches: the tensors read before have none.
    fn start_sketches(&mut self) {
        if !self.has_sketch {
            self.has_sketch = true;
            self.t.sketch_start.resize(self.t_rows.len() + 1, 0);
        }
    }

    /// The string columns of a batch as one value per row, each distinct
    /// string mapped once per batch (parsed, interned).
    fn row_codes(&mut self, path: &Path, c: &Cols<'_>, rows: usize) -> Result<RowCodes> {
        let phase = c.phase.codes(None, |s| match Phase::parse(s) {
            Some(p) => Ok(Some(p)),
            None => Err(corrupt(path, format!("bad phase {s:?}"))),
        })?;
        let role = c.role.codes(None, |s| match Role::parse(s) {
            Some(r) => Ok(Some(r)),
            None => Err(corrupt(path, format!("bad role {s:?}"))),
        })?;
        // An unknown status (a newer writer) reads as "no values".
        let status = c.status.codes(None, |s| Ok(StatsStatus::parse(s)))?;
        let names = &mut self.names;
        let op = c.op.codes(NO_ID, |s| Ok(names.intern(s)))?;
        let overload = c.overload.codes(NO_ID, |s| Ok(names.intern(s)))?;
        let arg = c.arg.codes(NO_ID, |s| Ok(names.intern(s)))?;
        let texts = &mut self.texts;
        let args = c.args.codes(NO_ID, |s| Ok(texts.intern(s)))?;
        let error = match &c.error {
            Some(e) => e.codes(NO_ID, |s| Ok(texts.intern(s)))?,
            None => vec![NO_ID; rows],
        };
        let mut optional = |c: &Option<StrCol<'_>>| -> Result<Vec<u32>> {
            match c {
                Some(c) => c.codes(NO_ID, |s| Ok(texts.intern(s))),
                None => Ok(vec![NO_ID; rows]),
            }
        };
        let module = optional(&c.module)?;
        let source = optional(&c.source)?;
        let name = optional(&c.name)?;
        // A file name, made a path beside the Parquet file it is named in.
        let dir = path.parent().unwrap_or(Path::new("."));
        let capture_file = match &c.capture_file {
            Some(f) => f.codes(NO_ID, |s| {
                if s.contains('/') || s.starts_with('.') {
                    return Err(corrupt(path, format!("bad capture_file {s:?}")));
                }
                Ok(texts.intern(&dir.join(s).to_string_lossy()))
            })?,
            None => Vec::new(),
        };
        let capture_key = match (&c.capture_key, capture_file.iter().any(|&f| f != NO_ID)) {
            (Some(k), true) => k.codes(NO_ID, |s| Ok(texts.intern(s)))?,
            _ => Vec::new(),
        };
        let capture_file = if capture_key.is_empty() {
            Vec::new()
        } else {
            capture_file
        };
        let dtypes = &mut self.dtypes;
        let dtype = c
            .dtype
            .codes(NO_ID, |s| dtype_id(dtypes, s).map(u32::from))?;
        Ok(RowCodes {
            phase,
            role,
            status,
            op,
            overload,
            arg,
            args,
            error,
            module,
            source,
            name,
            capture_file,
            capture_key,
            dtype,
        })
    }

    /// Row by row: a new seq starts an op call, whose columns are appended;
    /// rows with a tensor are counted into it and returned, for the
    /// column-wise copy of [`Builder::push_tensors`].
    fn push_op_calls(
        &mut self,
        path: &Path,
        c: &Cols<'_>,
        codes: &RowCodes,
        last_seq: &mut Option<i64>,
    ) -> Result<TensorRows> {
        let n = codes.op.len();
        let mut tensors = TensorRows {
            rows: Vec::with_capacity(n),
            roles: Vec::with_capacity(n),
            call: Vec::with_capacity(n),
        };
        for i in 0..n {
            if c.seq.is_null(i) {
                return Err(corrupt(path, "null seq"));
            }
            let s = c.seq.value(i);
            if *last_seq != Some(s) {
                *last_seq = Some(s);
                self.push_op_call(path, c, codes, i, tensors.rows.len())?;
            }
            let role = match codes.role[i] {
                Some(Role::None) => continue,
                Some(r) => r,
                None => return Err(corrupt(path, format!("null role at seq {s}"))),
            };
            if codes.dtype[i] == NO_ID {
                return Err(corrupt(path, format!("null dtype at seq {s}")));
            }
            if self.t_rows.len() + tensors.rows.len() >= u32::MAX as usize - 1 {
                return Err(corrupt(path, "more than 4 billion tensors"));
            }
            if let Some(n) = self.t_len.last_mut() {
                *n += 1;
            }
            tensors.rows.push(i as u32);
            tensors.roles.push(role);
            tensors.call.push(self.open.len().saturating_sub(1) as u32);
        }
        Ok(tensors)
    }

    /// Appends the op call that starts at row `i`; `tensors_before` tensor
    /// rows of this batch precede it.
    fn push_op_call(
        &mut self,
        path: &Path,
        c: &Cols<'_>,
        codes: &RowCodes,
        i: usize,
        tensors_before: usize,
    ) -> Result<()> {
        let s = c.seq.value(i);
        if self.seq.len() >= NONE as usize {
            return Err(corrupt(path, "more than 4 billion op calls"));
        }
        let phase = match codes.phase[i] {
            Some(p) if codes.op[i] != NO_ID && codes.overload[i] != NO_ID => p,
            _ => {
                return Err(corrupt(
                    path,
                    format!("null phase, op or overload at seq {s}"),
                ))
            }
        };
        self.seq.push(s);
        self.parent_seq.push(if c.parent.is_null(i) {
            NO_PARENT
        } else {
            c.parent.value(i)
        });
        self.op.push(codes.op[i]);
        self.overload.push(codes.overload[i]);
        self.has_modules |= codes.module[i] != NO_ID;
        self.open.push(OpRow {
            seq: s,
            step: c.step.value(i),
            fwd_seq: match c.fwd_seq {
                Some(f) if !f.is_null(i) => f.value(i),
                _ => NO_SEQ,
            },
            depth: c.depth.value(i),
            phase,
            args: codes.args[i],
            error: codes.error[i],
            module: codes.module[i],
            source: codes.source[i],
            sig: signature_start(&self.names, codes.op[i], codes.overload[i]),
        });
        self.t_start
            .push((self.t_rows.len() + tensors_before) as u32);
        self.t_len.push(0);
        Ok(())
    }

    /// Row by row over the tensor rows of a batch, into the spilled
    /// [`TensorRow`]s; the sparse columns beside them.
    fn push_tensors(
        &mut self,
        path: &Path,
        c: &Cols<'_>,
        codes: &RowCodes,
        tensors: &TensorRows,
    ) -> Result<()> {
        let first = self.t_rows.len();
        let rows = &tensors.rows;
        let shapes = shape_ids(path, c, rows, &mut self.t.shapes)?;
        // Each call's signature, folded over its tensors as they pass; the
        // calls before the batch's last are complete.
        for ((&call, &role), &shape) in tensors.call.iter().zip(&tensors.roles).zip(&shapes) {
            if let Some(o) = self.open.get_mut(call as usize) {
                o.sig = signature_step(&self.t.shapes, o.sig, role, shape);
            }
        }
        self.spill_complete_calls(1)?;
        let t = &mut self.t;
        let [fmin, fmax, fmean, fstd, fl2, fabs] = c.f;
        let [cnan, cpos, cneg, czero] = c.c;
        for (k, &i) in rows.iter().enumerate() {
            let i = i as usize;
            self.t_rows.push(TensorRow {
                role: tensors.roles[k],
                status: codes.status[i],
                dtype: codes.dtype[i] as u16,
                shape: shapes[k],
                arg: codes.arg[i],
                list_index: if c.list_index.is_null(i) {
                    -1
                } else {
                    c.list_index.value(i)
                },
                name: codes.name[i],
                min: fval(fmin, i),
                max: fval(fmax, i),
                mean: fval(fmean, i),
                std: fval(fstd, i),
                l2: fval(fl2, i),
                absmax: fval(fabs, i),
                zero: ival(czero, i),
                fingerprint: c.fingerprint.as_ref().and_then(|f| f.get(i)).unwrap_or(0),
            })?;
        }
        if !codes.capture_file.is_empty() && !self.has_captures {
            // The first captured call: every tensor read before has none.
            self.has_captures = true;
            t.capture_file.resize(first, NO_ID);
            t.capture_key.resize(first, NO_ID);
        }
        if self.has_captures {
            for &i in rows {
                let (f, k) = match codes.capture_file.get(i as usize) {
                    Some(&f) => (f, codes.capture_key[i as usize]),
                    None => (NO_ID, NO_ID),
                };
                t.capture_file.push(f);
                t.capture_key.push(k);
            }
        }
        push_nonfinite([cnan, cpos, cneg], rows, first, t);
        if self.has_sketch {
            push_sketches(path, c.sketch, rows, &mut self.t)?;
        }
        Ok(())
    }

    fn finish(
        mut self,
        path: PathBuf,
        rank: u32,
        pid: Option<i64>,
        files: usize,
        stats_accumulate: String,
        skipped_other_pids: u64,
    ) -> Result<Dump> {
        self.spill_complete_calls(0)?;
        while !self.ready.is_empty() {
            self.spill_first_ready()?;
        }
        let n = self.seq.len();
        // Files of different partitions (devices) interleave in seq: sort the
        // op columns; tensors stay where they are, ops point at them.
        if self.seq.windows(2).any(|w| w[0] >= w[1]) {
            let perm = seq_order(&self.seq);
            fn apply<T: Copy>(v: &mut Vec<T>, perm: &[u32]) {
                let sorted: Vec<T> = perm.iter().map(|&i| v[i as usize]).collect();
                *v = sorted;
            }
            apply(&mut self.seq, &perm);
            apply(&mut self.parent_seq, &perm);
            apply(&mut self.op, &perm);
            apply(&mut self.overload, &perm);
            apply(&mut self.t_start, &perm);
            apply(&mut self.t_len, &perm);
            if let Some(w) = self.seq.windows(2).find(|w| w[0] == w[1]) {
                return Err(Error::new(format!(
                    "{}: seq {} appears twice in rank {rank} (two runs written into one directory?); give each run its own OPDUMP_DIR, or move one run's files out",
                    path.display(),
                    w[0]
                )));
            }
        }
        if !self.ops_in_order {
            // Calls far from seq order (files of different partitions that
            // interleave): rebuild the spilled calls in seq order, which
            // the sorted columns above follow.
            let seqs: Vec<i64> = (0..n).map(|i| self.ops.get(i).seq).collect();
            let mut perm: Vec<u32> = (0..n as u32).collect();
            perm.sort_unstable_by_key(|&i| seqs[i as usize]);
            drop(seqs);
            let mut sorted = Spill::default();
            for &i in &perm {
                sorted.push(self.ops.get(i as usize))?;
            }
            self.ops = sorted;
        }
        // The one builder of the call tree, shared with Dump::from_records.
        let tree = call_tree(&self.seq, &self.parent_seq).map_err(|l| {
            Error::new(format!(
                "{}: corrupt dump: the call at seq {} is its own ancestor (its parent_seq chain loops)",
                path.display(),
                l.seq
            ))
        })?;
        drop(std::mem::take(&mut self.parent_seq));
        Ok(Dump {
            path,
            rank,
            files,
            pid,
            stats_accumulate,
            skipped_other_pids,
            schema_version: SCHEMA_VERSION,
            has_modules: self.has_modules,
            captures: Box::new(CaptureCache::default()),
            names: self.names,
            texts: self.texts,
            dtypes: self.dtypes,
            ops: Box::new(self.ops),
            parent: Parents::new(&tree.parent),
            calls: CallColumns::new(&self.op, &self.overload, &self.t_start, &self.t_len),
            child_start: PackedU32::new(&tree.child_start),
            children: PackedU32::new(&tree.children),
            roots: tree.roots,
            tensors: Tensors {
                rows: Box::new(self.t_rows),
                ..self.t
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Near seq order or far from it, the same order.
    #[test]
    fn seq_order_sorts_near_and_far() {
        let near: Vec<i64> = (0..1000)
            .map(|i| i + if i % 3 == 0 { 2 } else { -1 })
            .collect();
        let far: Vec<i64> = (0..1000).rev().collect();
        for seq in [near, far, vec![], vec![5]] {
            let perm = seq_order(&seq);
            let sorted: Vec<i64> = perm.iter().map(|&i| seq[i as usize]).collect();
            let mut want = seq.clone();
            want.sort_unstable();
            assert_eq!(sorted, want);
        }
    }

    /// `push_tensors` takes the statistics apart by position, so the
    /// table's order must be the one it names.
    #[test]
    fn statistics_are_taken_apart_in_the_tables_order() {
        let floats = [
            col::MIN,
            col::MAX,
            col::MEAN,
            col::STD,
            col::L2,
            col::ABSMAX,
        ];
        assert_eq!(FLOAT_STATS, floats);
        let counts = [
            col::NAN_COUNT,
            col::POSINF_COUNT,
            col::NEGINF_COUNT,
            col::ZERO_COUNT,
        ];
        assert_eq!(COUNT_STATS, counts);
    }
}
