//! A Parquet writer for one partition directory that only ever shows complete
//! files.
//!
//! Rows go to a hidden temporary file (`.part-<pid>-<NNNNN>.parquet.tmp`, which
//! no Parquet reader picks up). The file is closed and renamed to
//! `part-<pid>-<NNNNN>.parquet` after `max_rows` rows, after `max_age`, or on
//! [`RotatingWriter::close_file`]. A crash therefore loses at most the file
//! being written, and every visible `.parquet` file reads back.
//!
//! The job around opdump may close opdump's descriptors and reuse their
//! numbers, or plant links and foreign directories under `OPDUMP_DIR`: every
//! descriptor is checked before use and every directory judged before it is
//! trusted (see [`opdump_fsguard`]). A file whose descriptor stopped being
//! opdump's is abandoned: never written again, never closed, never published.

use std::ffi::{CStr, CString};
use std::fs;
use std::io::{BufWriter, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use opdump_fsguard::{self as fsguard, c_name, CheckedFile, DirRefused, GuardedFd, Identity};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::capture;
use crate::checksum;
use crate::error::{Error, Result};
use crate::record::OpRecord;
use crate::schema::{col, meta, schema, BatchBuilder, SCHEMA_VERSION};

/// Columns written without a dictionary (see `open`).
const UNIQUE_COLUMNS: &[&str] = &[
    col::SEQ,
    col::PARENT_SEQ,
    col::START_NS,
    col::DURATION_NS,
    col::MIN,
    col::MAX,
    col::MEAN,
    col::STD,
    col::L2,
    col::ABSMAX,
];

/// When files rotate, and how they are created.
#[derive(Clone, Debug)]
pub struct RotateOptions {
    /// Start a new file after this many rows.
    pub max_rows: u64,
    /// Start a new file when the open one is this old.
    pub max_age: Duration,
    /// Rows collected in memory before they are handed to the Parquet encoder.
    pub batch_rows: usize,
    /// Permission bits of new files and directories (owner-only by default:
    /// tensor statistics can leak private data).
    pub file_mode: u32,
    pub dir_mode: u32,
}

impl Default for RotateOptions {
    fn default() -> Self {
        RotateOptions {
            max_rows: 500_000,
            max_age: Duration::from_secs(10),
            batch_rows: 8192,
            file_mode: 0o600,
            dir_mode: 0o700,
        }
    }
}

struct OpenFile {
    writer: ArrowWriter<Summed<BufWriter<CheckedFile>>>,
    /// The CRC of each column chunk of the row groups written so far, the
    /// chunks' places, and how many row groups that is.
    sums: Vec<u32>,
    ranges: Vec<(u64, u64)>,
    summed_groups: usize,
    /// The hidden and the final name, in the partition directory.
    tmp_name: CString,
    dest_name: CString,
    /// The hidden name as a path, for messages.
    tmp: PathBuf,
    /// What was created as `tmp_name`: only that file is published or removed.
    id: Identity,
    opened: Instant,
    rows: u64,
    op_calls: u64,
    seq_min: i64,
    seq_max: i64,
}

impl OpenFile {
    /// The CRCs of the column chunks of the row groups completed since the
    /// last call, from the bytes [`Summed`] kept of them.
    fn sum_row_groups(&mut self) -> Result<()> {
        let groups = self.writer.flushed_row_groups();
        if groups.len() == self.summed_groups {
            return Ok(());
        }
        let ranges: Vec<(u64, u64)> = groups[self.summed_groups..]
            .iter()
            .flat_map(|g| g.columns().iter().map(|c| c.byte_range()))
            .collect();
        self.summed_groups = groups.len();
        // The last bytes of the row group may still be in the writer's own
        // buffer.
        self.writer.sync().map_err(|e| Error::io(&self.tmp, e))?;
        let summed = self.writer.inner_mut();
        for &(start, len) in &ranges {
            let sum = summed.sum(start, len).ok_or_else(|| {
                Error::format(
                    &self.tmp,
                    format!(
                        "column chunk at {start}+{len} was not seen written; cannot checksum it"
                    ),
                )
            })?;
            self.sums.push(sum);
        }
        if let Some(end) = ranges.iter().map(|(s, l)| s + l).max() {
            summed.forget_before(end);
        }
        self.ranges.extend(ranges);
        Ok(())
    }

    /// What goes into the footer: the sums and the CRC of the places.
    fn chunk_sums(&self) -> checksum::ChunkSums {
        checksum::ChunkSums {
            layout: checksum::layout_sum(self.ranges.iter().copied()),
            chunks: self.sums.clone(),
        }
    }
}

/// A writer that keeps the bytes written through it from the first one
/// not yet checksummed: a column chunk's place in the file is known only
/// once its row group is complete, and then its bytes are here to sum.
/// It holds about one row group's encoded bytes, as the Parquet writer
/// itself does while it encodes one.
struct Summed<W> {
    inner: W,
    /// The file offset of `kept[0]`.
    kept_from: u64,
    kept: Vec<u8>,
}

impl<W> Summed<W> {
    fn new(inner: W) -> Self {
        Summed {
            inner,
            kept_from: 0,
            kept: Vec::new(),
        }
    }

    /// The CRC of the `len` bytes at file offset `start`, if they are kept.
    fn sum(&self, start: u64, len: u64) -> Option<u32> {
        let from = usize::try_from(start.checked_sub(self.kept_from)?).ok()?;
        let to = from.checked_add(usize::try_from(len).ok()?)?;
        self.kept.get(from..to).map(checksum::crc32)
    }

    /// Drops the bytes before file offset `end`.
    fn forget_before(&mut self, end: u64) {
        let n = usize::try_from(end.saturating_sub(self.kept_from))
            .unwrap_or(usize::MAX)
            .min(self.kept.len());
        self.kept.drain(..n);
        self.kept_from += n as u64;
    }
}

impl<W: Write> Write for Summed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.kept.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes the records of one partition (`rank=<R>/device=<D>/`) into a
/// sequence of complete Parquet files.
pub struct RotatingWriter {
    /// `OPDUMP_DIR`, and the levels below it that make the partition.
    root: PathBuf,
    levels: Vec<String>,
    /// `root` joined with `levels`, for messages.
    dir: PathBuf,
    /// The partition directory, opened at the first file.
    part: Option<GuardedFd>,
    prefix: String,
    opts: RotateOptions,
    metadata: Vec<(String, String)>,
    next_index: u32,
    builder: BatchBuilder,
    file: Option<OpenFile>,
    rows_written: u64,
    ops_written: u64,
    files_written: u64,
    /// Op calls of files that failed to complete, not yet reported by abandon.
    lost_unreported: u64,
    /// The number of the next capture file, and how many were written.
    next_capture: u64,
    captures_written: u64,
}

/// Creates `dir` and its missing parents with the given mode. It judges
/// nothing: the plugin uses [`opdump_fsguard::check_dump_dir`].
pub fn create_dir(dir: &Path, mode: u32) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| Error::io(dir, e))
}

fn refused(r: DirRefused) -> Error {
    let kind = std::io::ErrorKind::PermissionDenied;
    Error::io(r.path, std::io::Error::new(kind, r.problem.to_string()))
}

/// Opens `root` and then each of `levels` inside it (creating what is
/// missing), judging each (see [`opdump_fsguard`]); returns the last.
fn open_partition(root: &Path, levels: &[String], dir_mode: u32) -> Result<GuardedFd> {
    let mut dir = fsguard::open_dump_root(root, dir_mode).map_err(refused)?;
    let mut path = root.to_path_buf();
    for name in levels {
        // The parent is closed here, while it is still known to be ours.
        dir = fsguard::enter_dir(&mut dir, &path, name, dir_mode).map_err(refused)?;
        path.push(name);
    }
    Ok(dir)
}

/// The partition directory in `part`, opened (again) when it is not open or
/// its descriptor stopped being ours. Dropping a lost descriptor closes
/// nothing, and nothing was written through it, so nothing is lost.
fn partition_dir<'a>(
    part: &'a mut Option<GuardedFd>,
    root: &Path,
    levels: &[String],
    dir_mode: u32,
) -> Result<&'a mut GuardedFd> {
    let mut dir = part.take();
    if dir.as_mut().is_some_and(|d| d.check().is_err()) {
        dir = None;
    }
    let dir = match dir {
        Some(d) => d,
        None => open_partition(root, levels, dir_mode)?,
    };
    Ok(part.insert(dir))
}

impl RotatingWriter {
    /// A writer into `dir` itself, created with its missing parents; see
    /// [`RotatingWriter::in_partition`].
    pub fn new(
        dir: impl Into<PathBuf>,
        prefix: impl Into<String>,
        opts: RotateOptions,
        metadata: Vec<(String, String)>,
    ) -> Self {
        Self::in_partition(dir, Vec::new(), prefix, opts, metadata)
    }

    /// A writer into `root/<levels...>` (`OPDUMP_DIR/rank=<R>/device=<D>`).
    /// `root` is created with its missing parents; the levels are created
    /// and entered relative to it, never through a symbolic link.
    /// `prefix` names the files (`part-<pid>`); `metadata` goes into every
    /// file's key-value metadata beside the schema version and the counts.
    /// Nothing touches the disk until the first record.
    pub fn in_partition(
        root: impl Into<PathBuf>,
        levels: Vec<String>,
        prefix: impl Into<String>,
        opts: RotateOptions,
        metadata: Vec<(String, String)>,
    ) -> Self {
        let root = root.into();
        let dir = levels.iter().fold(root.clone(), |p, l| p.join(l));
        RotatingWriter {
            root,
            levels,
            dir,
            part: None,
            prefix: prefix.into(),
            opts,
            metadata,
            next_index: 0,
            builder: BatchBuilder::new(),
            file: None,
            rows_written: 0,
            ops_written: 0,
            files_written: 0,
            lost_unreported: 0,
            next_capture: 0,
            captures_written: 0,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Rows in files that are complete and visible.
    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// Op calls in files that are complete and visible.
    pub fn ops_written(&self) -> u64 {
        self.ops_written
    }

    pub fn files_written(&self) -> u64 {
        self.files_written
    }

    /// Rows accepted but not yet in a visible file.
    pub fn rows_pending(&self) -> u64 {
        self.file.as_ref().map_or(0, |f| f.rows)
    }

    /// The partition directory; see [`partition_dir`].
    fn partition(&mut self) -> Result<&mut GuardedFd> {
        partition_dir(&mut self.part, &self.root, &self.levels, self.opts.dir_mode)
    }

    fn open(&mut self) -> Result<&mut OpenFile> {
        let (file_mode, dir_path) = (self.opts.file_mode, self.dir.clone());
        let name_error = |e| Error::io(&dir_path, e);
        let (tmp_name, dest_name, tmp, file) = loop {
            let name = format!("{}-{:05}.parquet", self.prefix, self.next_index);
            self.next_index += 1;
            let tmp = format!(".{name}.tmp");
            let (dest_name, tmp_name) = (
                c_name(&name).map_err(name_error)?,
                c_name(&tmp).map_err(name_error)?,
            );
            let dir = self.partition()?;
            if fsguard::name_exists(dir, &dest_name).map_err(name_error)? {
                continue; // left by an earlier process with the same pid
            }
            match CheckedFile::create_new(dir, &tmp_name, file_mode) {
                Ok(f) => break (tmp_name, dest_name, dir_path.join(tmp), f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(dir_path.join(tmp), e)),
            }
        };
        let id = file.identity();
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(64 * 1024));
        // Columns whose values hardly repeat: a dictionary saves no space and
        // hashing every value into it was the writer's largest cost.
        for name in UNIQUE_COLUMNS {
            props = props.set_column_dictionary_enabled(ColumnPath::from(*name), false);
        }
        let props = props.build();
        let writer = ArrowWriter::try_new(
            Summed::new(BufWriter::with_capacity(1 << 20, file)),
            schema(),
            Some(props),
        )
        .map_err(|e| Error::parquet(&tmp, e))?;
        Ok(self.file.insert(OpenFile {
            writer,
            sums: Vec::new(),
            ranges: Vec::new(),
            summed_groups: 0,
            tmp_name,
            dest_name,
            tmp,
            id,
            opened: Instant::now(),
            rows: 0,
            op_calls: 0,
            seq_min: i64::MAX,
            seq_max: i64::MIN,
        }))
    }

    /// Appends one op call. May encode a batch, and may complete a file.
    pub fn append(&mut self, rec: &OpRecord) -> Result<()> {
        let file = match self.file {
            Some(ref mut f) => f,
            None => match self.open() {
                Ok(f) => f,
                Err(e) => {
                    // No file took this op call: count it, or it is lost silently.
                    self.lost_unreported += 1;
                    return Err(e);
                }
            },
        };
        file.rows += rec.row_count() as u64;
        file.op_calls += 1;
        file.seq_min = file.seq_min.min(rec.seq);
        file.seq_max = file.seq_max.max(rec.seq);
        let full = file.rows >= self.opts.max_rows;
        self.builder.append(rec);
        if self.builder.rows() >= self.opts.batch_rows {
            self.encode_batch()?;
        }
        if full {
            self.close_file()?;
        }
        Ok(())
    }

    fn encode_batch(&mut self) -> Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        if self.builder.rows() == 0 {
            return Ok(());
        }
        let batch = self.builder.finish()?;
        file.writer
            .write(&batch)
            .map_err(|e| Error::parquet(&file.tmp, e))?;
        // The writer completes a row group when it holds enough rows.
        file.sum_row_groups()
    }

    /// Completes the open file if it is older than `max_age`.
    pub fn tick(&mut self, now: Instant) -> Result<()> {
        match &self.file {
            Some(f) if now.duration_since(f.opened) >= self.opts.max_age => self.close_file(),
            _ => Ok(()),
        }
    }

    /// Writes what is buffered, completes the open file and makes it visible.
    /// After an error, call [`RotatingWriter::abandon`] to count and remove
    /// what could not be written.
    pub fn close_file(&mut self) -> Result<()> {
        if self.file.is_none() {
            return Ok(());
        }
        self.encode_batch()?;
        self.finish_open_file()
    }

    fn finish_open_file(&mut self) -> Result<()> {
        let Some(f) = self.file.take() else {
            return Ok(());
        };
        let (tmp_name, id, rows, op_calls) = (f.tmp_name.clone(), f.id, f.rows, f.op_calls);
        let completed =
            match partition_dir(&mut self.part, &self.root, &self.levels, self.opts.dir_mode) {
                Ok(dir) => Self::complete(&self.metadata, dir, f),
                Err(e) => Err(e),
            };
        match completed {
            Ok(()) => {
                self.rows_written += rows;
                self.ops_written += op_calls;
                self.files_written += 1;
                Ok(())
            }
            Err(e) => {
                self.remove_hidden(&tmp_name, id);
                self.lost_unreported += op_calls;
                Err(e)
            }
        }
    }

    /// Adds the metadata, writes the footer, and renames the file into view,
    /// only if its descriptor and its hidden name are still the file created.
    fn complete(metadata: &[(String, String)], dir: &mut GuardedFd, mut f: OpenFile) -> Result<()> {
        f.writer.flush().map_err(|e| Error::parquet(&f.tmp, e))?;
        f.sum_row_groups()?;
        let counts = [
            (meta::SCHEMA_VERSION, SCHEMA_VERSION.to_string()),
            (meta::ROWS, f.rows.to_string()),
            (meta::OP_CALLS, f.op_calls.to_string()),
            (meta::SEQ_MIN, f.seq_min.to_string()),
            (meta::SEQ_MAX, f.seq_max.to_string()),
            (meta::CHUNK_CRC32, f.chunk_sums().to_text()),
        ];
        for (k, v) in metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .chain(counts)
        {
            f.writer
                .append_key_value_metadata(KeyValue::new(k.to_string(), v));
        }
        let buf = f
            .writer
            .into_inner()
            .map_err(|e| Error::parquet(&f.tmp, e))?;
        let mut file = buf
            .inner
            .into_inner()
            .map_err(|e| Error::io(&f.tmp, e.into_error()))?;
        fsguard::publish(dir, &mut file, &f.tmp_name, &f.dest_name)
            .map_err(|e| Error::io(&f.tmp, e))
        // `file` is closed here if it is still ours.
    }

    /// Writes the capture file of `rec` (`OPDUMP_CAPTURE`) into this
    /// partition, as `capture-<pid>-<N>.safetensors`, under a hidden name
    /// first and renamed when complete, and names the file in `rec`, so that
    /// its rows reference it. Does nothing for a call without a capture. On
    /// an error nothing is visible and `rec` names no file.
    pub fn write_capture(&mut self, rec: &mut OpRecord) -> Result<()> {
        if rec.capture.is_none() {
            return Ok(());
        }
        let bytes = capture::serialize(rec).map_err(|e| Error::format(&self.dir, e))?;
        let (file_mode, dir_path) = (self.opts.file_mode, self.dir.clone());
        let pid = self
            .prefix
            .strip_prefix("part-")
            .unwrap_or(&self.prefix)
            .to_string();
        let name_error = |e| Error::io(&dir_path, e);
        let (name, tmp_name, dest_name, mut file) = loop {
            let name = capture::file_name(&pid, self.next_capture);
            self.next_capture += 1;
            let (dest_name, tmp_name) = (
                c_name(&name).map_err(name_error)?,
                c_name(&format!(".{name}.tmp")).map_err(name_error)?,
            );
            let dir = self.partition()?;
            if fsguard::name_exists(dir, &dest_name).map_err(name_error)? {
                continue; // left by an earlier process with the same pid
            }
            match CheckedFile::create_new(dir, &tmp_name, file_mode) {
                Ok(f) => break (name, tmp_name, dest_name, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(dir_path.join(&name), e)),
            }
        };
        let id = file.identity();
        let written = file.write_all(&bytes).and_then(|()| {
            let dir = partition_dir(&mut self.part, &self.root, &self.levels, self.opts.dir_mode)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            fsguard::publish(dir, &mut file, &tmp_name, &dest_name)
        });
        if let Err(e) = written {
            drop(file);
            self.remove_hidden(&tmp_name, id);
            return Err(Error::io(dir_path.join(&name), e));
        }
        if let Some(c) = rec.capture.as_mut() {
            c.file = Some(name);
        }
        self.captures_written += 1;
        Ok(())
    }

    /// Capture files written and visible.
    pub fn captures_written(&self) -> u64 {
        self.captures_written
    }

    /// Removes the hidden file `name` if it is still the file `id`. Best
    /// effort: a hidden file left behind is invisible to readers.
    fn remove_hidden(&mut self, name: &CStr, id: Identity) {
        if let Ok(dir) = self.partition() {
            let _ = fsguard::remove_if(dir, name, id);
        }
    }

    /// Drops the open file and its buffered rows without making anything
    /// visible: no partial file is left behind. Returns the op calls lost.
    pub fn abandon(&mut self) -> u64 {
        let _ = self.builder.finish();
        let earlier = std::mem::take(&mut self.lost_unreported);
        earlier
            + match self.file.take() {
                Some(f) => {
                    let (lost, name, id) = (f.op_calls, f.tmp_name.clone(), f.id);
                    // Dropping the writer flushes its buffers through the
                    // checked file: a descriptor that is not ours is not written.
                    drop(f);
                    self.remove_hidden(&name, id);
                    lost
                }
                None => 0,
            }
    }
}

impl Drop for RotatingWriter {
    fn drop(&mut self) {
        if self.close_file().is_err() {
            self.abandon();
        }
    }
}
