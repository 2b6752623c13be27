//! Checks the column chunks a reader is about to decode against the CRC
//! the writer kept of each (`opdump.chunk_crc32`, see
//! `opdump_format::checksum`): a bit flipped inside a data page is one error
//! naming the file, never values read as if they were recorded. A file of
//! an older opdump has no sums, and one rewritten by another tool (which
//! copied the metadata, sums included, but put its chunks elsewhere) has
//! none of its own: both are read unchecked.

use std::os::unix::fs::FileExt;
use std::path::Path;

use opdump_format::checksum::{crc32, layout_sum, ChunkSums};
use opdump_format::regular::open_regular;
use opdump_format::schema::meta;
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::ParquetMetaData;

use crate::error::{Error, Result};

fn damaged(path: &Path, what: String) -> Error {
    Error::new(format!(
        "{}: {what}; the file was damaged after opdump wrote it (disk, copy or edit): move it out of the dump directory, or dump again",
        path.display()
    ))
}

/// Checks the chunks of the leaf columns in `mask`, in the row groups
/// `groups` (all when `None`), of the file `path` whose footer is `md`.
pub(crate) fn check(
    path: &Path,
    md: &ParquetMetaData,
    mask: &ProjectionMask,
    groups: Option<&[usize]>,
) -> Result<()> {
    let Some(text) = md
        .file_metadata()
        .key_value_metadata()
        .and_then(|kvs| kvs.iter().find(|kv| kv.key == meta::CHUNK_CRC32))
        .map(|kv| kv.value.as_deref().unwrap_or(""))
    else {
        return Ok(());
    };
    let sums = ChunkSums::parse(text).ok_or_else(|| {
        damaged(
            path,
            format!("{} is not a list of checksums", meta::CHUNK_CRC32),
        )
    })?;
    let columns = md.file_metadata().schema_descr().num_columns();
    let places = md.row_groups().iter().flat_map(|rg| {
        rg.columns().iter().map(|c| {
            let start = c
                .dictionary_page_offset()
                .unwrap_or_else(|| c.data_page_offset());
            (start as u64, c.compressed_size() as u64)
        })
    });
    if sums.chunks.len() != md.num_row_groups() * columns || sums.layout != layout_sum(places) {
        return Ok(()); // the sums were taken of another file's chunks
    }
    let file = open_regular(path)?;
    let size = file
        .metadata()
        .map_err(|e| Error::new(format!("{}: {e}", path.display())))?
        .len();
    let all: Vec<usize> = (0..md.num_row_groups()).collect();
    let mut buf = Vec::new();
    for &g in groups.unwrap_or(&all) {
        let Some(rg) = md.row_groups().get(g) else {
            continue;
        };
        for (c, chunk) in rg.columns().iter().enumerate() {
            if !mask.leaf_included(c) {
                continue;
            }
            let name = chunk.column_path().string();
            let start = chunk
                .dictionary_page_offset()
                .unwrap_or_else(|| chunk.data_page_offset());
            let len = chunk.compressed_size();
            let range = u64::try_from(start)
                .ok()
                .zip(u64::try_from(len).ok())
                .filter(|(s, l)| s.checked_add(*l).is_some_and(|end| end <= size));
            let Some((start, len)) = range else {
                return Err(damaged(
                    path,
                    format!("column chunk {name:?} of row group {g} lies outside the file ({start}+{len} of {size} bytes)"),
                ));
            };
            buf.resize(len as usize, 0);
            file.read_exact_at(&mut buf, start)
                .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
            let (got, want) = (crc32(&buf), sums.chunks[g * columns + c]);
            if got != want {
                return Err(damaged(
                    path,
                    format!(
                        "column chunk {name:?} of row group {g} fails its checksum (CRC-32 {got:08x}, written as {want:08x})"
                    ),
                ));
            }
        }
    }
    Ok(())
}
