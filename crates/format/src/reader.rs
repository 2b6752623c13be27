//! Finding the files of a dump and reading them back.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::{Error, Result};
use crate::regular::not_regular;
use crate::schema::{meta, MIN_READABLE_SCHEMA_VERSION, SCHEMA_VERSION};

pub use crate::regular::open_regular;

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
            format!("bad partition directory rank={v:?}: expected rank=<number>; move it out of the dump directory, which opdump reads as rank=<R>/device=<D>/part-*.parquet"),
        )),
    }
}

/// `device=<D>`: D must not be empty.
fn parse_device<'a>(dir: &Path, v: &'a str) -> Result<&'a str> {
    if v.is_empty() {
        return Err(Error::format(
            dir,
            "bad partition directory device=: expected device=<name>; move it out of the dump directory, which opdump reads as rank=<R>/device=<D>/part-*.parquet",
        ));
    }
    Ok(v)
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
            "not an opdump file (no opdump.schema_version in its metadata); point opdump at a directory opdump wrote (OPDUMP_DIR), or move this file out of it",
        ));
    };
    let v: u32 = v
        .parse()
        .map_err(|_| Error::format(path, format!("bad opdump.schema_version {v:?}: the file is damaged or not opdump's; move it out of the dump directory, or dump again")))?;
    if v < MIN_READABLE_SCHEMA_VERSION {
        return Err(Error::format(path, format!(
            "dump schema version {v} is too old: this opdump reads versions {MIN_READABLE_SCHEMA_VERSION} to {SCHEMA_VERSION}; dump the job again with this opdump"
        )));
    }
    if v > SCHEMA_VERSION {
        return Err(Error::format(path, format!(
            "dump schema version {v} is newer than this opdump (reads up to {SCHEMA_VERSION}): compare it with the opdump that wrote it, or upgrade this one"
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
                "corrupt footer: it claims {claimed} rows, its row groups hold {}; the file is damaged: move it out of the dump directory, or dump again",
                in_groups.map_or("an invalid number of".to_string(), |n| n.to_string())
            ),
        ));
    }
    let count = |key: &str| -> Result<Option<i64>> {
        kv.get(key)
            .map(|v| {
                let n = v.parse::<i64>().ok().filter(|n| *n >= 0);
                n.ok_or_else(|| Error::format(path, format!("bad {key} {v:?}; the file is damaged: move it out of the dump directory, or dump again")))
            })
            .transpose()
    };
    if let Some(rows) = count(meta::ROWS)? {
        if rows != claimed {
            return Err(Error::format(
                path,
                format!(
                    "corrupt footer: it claims {claimed} rows, {} says {rows}; the file is damaged: move it out of the dump directory, or dump again",
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
                    "corrupt footer: it claims {claimed} rows, {} says {calls} op calls; the file is damaged: move it out of the dump directory, or dump again",
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
