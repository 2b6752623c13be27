//! Finding the files of a dump and reading them back.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::{Error, Result};
use crate::record::{OpRecord, Phase, Role, Stats, StatsStatus, TensorRecord};
use crate::schema::{check_types, col, meta, MIN_READABLE_SCHEMA_VERSION, SCHEMA_VERSION};

/// One visible file of a dump, with the partition keys of its directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpFile {
    pub path: PathBuf,
    pub rank: Option<u32>,
    pub device: Option<String>,
}

fn partition_value<'a>(name: &'a str, key: &str) -> Option<&'a str> {
    name.strip_prefix(key)?.strip_prefix('=')
}

/// `rank=<R>`: R in plain decimal, as the writer names it. Anything else
/// (`rank=abc`, `rank=-1`, `rank=0x1`, `rank=`, `rank=01`) is an error naming
/// the directory: read as rank 0, it would merge silently with rank 0.
fn parse_rank(dir: &Path, v: &str) -> Result<u32> {
    let plain =
        !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && (v == "0" || !v.starts_with('0'));
    match v.parse() {
        Ok(r) if plain => Ok(r),
        _ => Err(Error::format(
            dir,
            format!("bad partition directory rank={v:?}: expected rank=<number>"),
        )),
    }
}

/// `device=<D>`: D must not be empty.
fn parse_device<'a>(dir: &Path, v: &'a str) -> Result<&'a str> {
    if v.is_empty() {
        return Err(Error::format(
            dir,
            "bad partition directory device=: expected device=<name>",
        ));
    }
    Ok(v)
}

fn not_regular(path: &Path) -> Error {
    Error::format(
        path,
        "not a regular file (a FIFO, socket or device?); only regular files are read",
    )
}

/// Opens a dump file for reading. Only a regular file is read: a FIFO named
/// `part-*.parquet` would block the reader forever, a device would never
/// end. The open cannot block (`O_NONBLOCK`, which changes nothing for a
/// regular file), and the check is made on the opened file (`fstat`), so
/// nothing can be swapped in between.
pub fn open_regular(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let m = file.metadata().map_err(|e| Error::io(path, e))?;
    if !m.is_file() {
        return Err(not_regular(path));
    }
    Ok(file)
}

/// Lists the visible Parquet files of a dump directory, in a stable order.
/// `dir` may be the dump root, a `rank=<R>` directory or a `device=<D>`
/// directory. Hidden files (in-progress `.part-*.tmp`) are skipped.
pub fn list_files(dir: &Path) -> Result<Vec<DumpFile>> {
    fn walk(
        dir: &Path,
        rank: Option<u32>,
        device: Option<&str>,
        out: &mut Vec<DumpFile>,
    ) -> Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let path = e.path();
            // Links are followed (a dump assembled from links reads fine);
            // what they lead to must be a directory or a regular file.
            let meta = std::fs::metadata(&path);
            if meta.as_ref().is_ok_and(|m| m.is_dir()) {
                if let Some(r) = partition_value(&name, "rank") {
                    walk(&path, Some(parse_rank(&path, r)?), device, out)?;
                } else if let Some(d) = partition_value(&name, "device") {
                    walk(&path, rank, Some(parse_device(&path, d)?), out)?;
                }
            } else if name.ends_with(".parquet") {
                if !meta.map_err(|e| Error::io(&path, e))?.is_file() {
                    return Err(not_regular(&path));
                }
                out.push(DumpFile {
                    path,
                    rank,
                    device: device.map(str::to_owned),
                });
            }
        }
        Ok(())
    }
    if !dir.is_dir() {
        return Err(Error::io(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        ));
    }
    let mut out = Vec::new();
    // Partition keys of the directory itself, when given a sub-directory.
    let own = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rank = partition_value(&own, "rank")
        .map(|r| parse_rank(dir, r))
        .transpose()?;
    let device = partition_value(&own, "device")
        .map(|d| parse_device(dir, d).map(str::to_owned))
        .transpose()?;
    walk(dir, rank, device.as_deref(), &mut out)?;
    if out.is_empty() {
        return Err(Error::NoDump {
            path: dir.to_path_buf(),
        });
    }
    Ok(out)
}

/// A file's key-value metadata, after checking that this build can read it.
pub fn file_metadata(path: &Path) -> Result<HashMap<String, String>> {
    Ok(key_values(&open_batches(path)?))
}

fn key_values(builder: &ParquetRecordBatchReaderBuilder<File>) -> HashMap<String, String> {
    builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kvs| {
            kvs.iter()
                .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn check_version(path: &Path, kv: &HashMap<String, String>) -> Result<u32> {
    let Some(v) = kv.get(meta::SCHEMA_VERSION) else {
        return Err(Error::format(
            path,
            "not an opdump file (no opdump.schema_version in its metadata)",
        ));
    };
    let v: u32 = v
        .parse()
        .map_err(|_| Error::format(path, format!("bad opdump.schema_version {v:?}")))?;
    if v < MIN_READABLE_SCHEMA_VERSION {
        return Err(Error::format(path, format!(
            "dump schema version {v} is too old: this opdump reads versions {MIN_READABLE_SCHEMA_VERSION} to {SCHEMA_VERSION}"
        )));
    }
    if v > SCHEMA_VERSION {
        return Err(Error::format(path, format!(
            "dump schema version {v} is newer than this opdump (reads up to {SCHEMA_VERSION}); upgrade opdump"
        )));
    }
    Ok(v)
}

/// The footer's row counts must agree: the file's `num_rows` with its row
/// groups', and with what the writer recorded (`opdump.rows`,
/// `opdump.op_calls`). A corrupt count would make readers size buffers
/// wrongly, or read a file of op calls as empty without a word.
fn check_row_counts(
    path: &Path,
    builder: &ParquetRecordBatchReaderBuilder<File>,
    kv: &HashMap<String, String>,
) -> Result<()> {
    let md = builder.metadata();
    let claimed = md.file_metadata().num_rows();
    let in_groups = md.row_groups().iter().try_fold(0i64, |n, g| {
        if g.num_rows() < 0 {
            None
        } else {
            n.checked_add(g.num_rows())
        }
    });
    if claimed < 0 || in_groups != Some(claimed) {
        return Err(Error::format(
            path,
            format!(
                "corrupt footer: it claims {claimed} rows, its row groups hold {}",
                in_groups.map_or("an invalid number of".to_string(), |n| n.to_string())
            ),
        ));
    }
    let count = |key: &str| -> Result<Option<i64>> {
        kv.get(key)
            .map(|v| {
                let n = v.parse::<i64>().ok().filter(|n| *n >= 0);
                n.ok_or_else(|| Error::format(path, format!("bad {key} {v:?}")))
            })
            .transpose()
    };
    if let Some(rows) = count(meta::ROWS)? {
        if rows != claimed {
            return Err(Error::format(
                path,
                format!(
                    "corrupt footer: it claims {claimed} rows, {} says {rows}",
                    meta::ROWS
                ),
            ));
        }
    }
    if let Some(calls) = count(meta::OP_CALLS)? {
        if calls > claimed {
            return Err(Error::format(
                path,
                format!(
                    "corrupt footer: it claims {claimed} rows, {} says {calls} op calls",
                    meta::OP_CALLS
                ),
            ));
        }
    }
    Ok(())
}

/// Opens one file for streaming, after the version and row count checks.
/// Callers choose columns with the builder's projection to keep memory
/// small.
pub fn open_batches(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>> {
    let file = open_regular(path)?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| Error::parquet(path, e))?;
    let kv = key_values(&builder);
    check_version(path, &kv)?;
    check_row_counts(path, &builder, &kv)?;
    Ok(builder)
}

fn column<'a>(path: &Path, batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| Error::format(path, format!("column {name:?} is missing")))
}

/// Reads a whole file back into records, rows of one op call joined again.
/// Meant for tests and small dumps; `opdump compare` streams columns instead.
pub fn read_records(path: &Path) -> Result<Vec<OpRecord>> {
    let builder = open_batches(path)?;
    // Columns are read by name; one of another type would panic a downcast.
    check_types(builder.schema()).map_err(|m| Error::format(path, m))?;
    let reader = builder.build().map_err(|e| Error::parquet(path, e))?;
    let mut out: Vec<OpRecord> = Vec::new();
    for batch in reader {
        let batch = batch?;
        let i64c = |n| -> Result<_> { Ok(column(path, &batch, n)?.as_primitive::<Int64Type>()) };
        let i32c = |n| -> Result<_> { Ok(column(path, &batch, n)?.as_primitive::<Int32Type>()) };
        let f64c = |n| -> Result<_> { Ok(column(path, &batch, n)?.as_primitive::<Float64Type>()) };
        let strc = |n| -> Result<_> { Ok(column(path, &batch, n)?.as_string::<i32>()) };
        let (seq, parent, depth, pid, thread, step) = (
            i64c(col::SEQ)?,
            i64c(col::PARENT_SEQ)?,
            i32c(col::DEPTH)?,
            i32c(col::PID)?,
            i64c(col::THREAD)?,
            i64c(col::STEP)?,
        );
        let (phase, op, overload, args, error, role, arg) = (
            strc(col::PHASE)?,
            strc(col::OP)?,
            strc(col::OVERLOAD)?,
            strc(col::ARGS)?,
            strc(col::ERROR)?,
            strc(col::ROLE)?,
            strc(col::ARG)?,
        );
        let (start, dur, list_index, dtype, device, numel, status) = (
            i64c(col::START_NS)?,
            i64c(col::DURATION_NS)?,
            i32c(col::LIST_INDEX)?,
            strc(col::DTYPE)?,
            strc(col::TENSOR_DEVICE)?,
            i64c(col::NUMEL)?,
            strc(col::STATS_STATUS)?,
        );
        // Columns of schema version 2: absent from older files, null there.
        let opt_str = |n| batch.column_by_name(n).map(|c| c.as_string::<i32>());
        let (module, source, name) = (
            opt_str(col::MODULE),
            opt_str(col::SOURCE),
            opt_str(col::NAME),
        );
        // Schema version 3.
        let (capture_file, capture_key) = (opt_str(col::CAPTURE_FILE), opt_str(col::CAPTURE_KEY));
        // Schema version 4.
        let fingerprint = batch
            .column_by_name(col::FINGERPRINT)
            .map(|c| c.as_primitive::<arrow_array::types::UInt64Type>());
        let sketch = batch
            .column_by_name(col::SKETCH)
            .map(|c| c.as_list::<i32>());
        let fwd_seq = batch
            .column_by_name(col::FWD_SEQ)
            .map(|c| c.as_primitive::<Int64Type>());
        let str_at = |c: Option<&arrow_array::StringArray>, i| {
            c.and_then(|c| (!c.is_null(i)).then(|| c.value(i).to_owned()))
        };
        let shape = column(path, &batch, col::SHAPE)?.as_list::<i32>();
        let stride = column(path, &batch, col::STRIDE)?.as_list::<i32>();
        let f = [
            col::MIN,
            col::MAX,
            col::MEAN,
            col::STD,
            col::L2,
            col::ABSMAX,
        ]
        .map(f64c);
        let [fmin, fmax, fmean, fstd, fl2, fabs] = f;
        let (fmin, fmax, fmean, fstd, fl2, fabs) = (fmin?, fmax?, fmean?, fstd?, fl2?, fabs?);
        let counts = [
            col::NAN_COUNT,
            col::POSINF_COUNT,
            col::NEGINF_COUNT,
            col::ZERO_COUNT,
        ]
        .map(i64c);
        let [cnan, cpos, cneg, czero] = counts;
        let (cnan, cpos, cneg, czero) = (cnan?, cpos?, cneg?, czero?);
        let fv =
            |a: &arrow_array::Float64Array, i| if a.is_null(i) { f64::NAN } else { a.value(i) };
        let iv = |a: &arrow_array::Int64Array, i| if a.is_null(i) { 0 } else { a.value(i) };
        let ints = |l: &arrow_array::ListArray, i| -> Vec<i64> {
            if l.is_null(i) {
                Vec::new()
            } else {
                l.value(i).as_primitive::<Int64Type>().values().to_vec()
            }
        };
        for i in 0..batch.num_rows() {
            let s = seq.value(i);
            if out.last().map(|r| r.seq) != Some(s) {
                out.push(OpRecord {
                    seq: s,
                    parent_seq: (!parent.is_null(i)).then(|| parent.value(i)),
                    depth: depth.value(i),
                    pid: pid.value(i),
                    thread: thread.value(i),
                    step: step.value(i),
                    phase: Phase::parse(phase.value(i)).ok_or_else(|| {
                        Error::format(path, format!("bad phase {:?}", phase.value(i)))
                    })?,
                    op: op.value(i).to_owned().into(),
                    overload: overload.value(i).to_owned().into(),
                    args: args.value(i).to_owned(),
                    start_ns: start.value(i),
                    duration_ns: dur.value(i),
                    error: (!error.is_null(i)).then(|| error.value(i).to_owned()),
                    module: str_at(module, i).map(Into::into),
                    fwd_seq: fwd_seq.and_then(|c| (!c.is_null(i)).then(|| c.value(i))),
                    source: str_at(source, i),
                    tensors: Vec::new(),
                    capture: None,
                });
            }
            let role_v = Role::parse(role.value(i))
                .ok_or_else(|| Error::format(path, format!("bad role {:?}", role.value(i))))?;
            if role_v == Role::None {
                continue;
            }
            let status_v = StatsStatus::parse(status.value(i)).ok_or_else(|| {
                Error::format(path, format!("bad stats_status {:?}", status.value(i)))
            })?;
            let Some(rec) = out.last_mut() else { continue };
            rec.tensors.push(TensorRecord {
                role: role_v,
                arg: arg.value(i).to_owned().into(),
                list_index: (!list_index.is_null(i)).then(|| list_index.value(i)),
                dtype: dtype.value(i).to_owned().into(),
                shape: ints(shape, i),
                stride: ints(stride, i),
                device: device.value(i).to_owned().into(),
                numel: numel.value(i),
                status: status_v,
                stats: if status_v.has_values() {
                    Stats {
                        min: fv(fmin, i),
                        max: fv(fmax, i),
                        mean: fv(fmean, i),
                        std: fv(fstd, i),
                        l2: fv(fl2, i),
                        absmax: fv(fabs, i),
                        nan_count: iv(cnan, i),
                        posinf_count: iv(cpos, i),
                        neginf_count: iv(cneg, i),
                        zero_count: iv(czero, i),
                    }
                } else {
                    Stats::NONE
                },
                name: str_at(name, i),
                capture_key: str_at(capture_key, i),
                fingerprint: fingerprint.and_then(|c| (!c.is_null(i)).then(|| c.value(i))),
                sketch: sketch.and_then(|l| {
                    (!l.is_null(i))
                        .then(|| l.value(i).as_primitive::<Float64Type>().values().to_vec())
                }),
            });
            // The file's name is all a reader learns of a capture here.
            if let Some(file) = str_at(capture_file, i) {
                rec.capture.get_or_insert_with(Default::default).file = Some(file);
            }
        }
    }
    Ok(out)
}
