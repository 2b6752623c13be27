//! A Parquet writer for one partition directory that only ever shows complete
//! files.
//!
//! Rows go to a hidden temporary file (`.part-<pid>-<NNNNN>.parquet.tmp`, which
//! no Parquet reader picks up). The file is closed and renamed to
//! `part-<pid>-<NNNNN>.parquet` after `max_rows` rows, after `max_age`, or on
//! [`RotatingWriter::close_file`]. A crash therefore loses at most the file
//! being written, and every visible `.parquet` file reads back.

use std::fs::{self, File, OpenOptions};
use std::io::BufWriter;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

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
    writer: ArrowWriter<BufWriter<File>>,
    tmp: PathBuf,
    dest: PathBuf,
    opened: Instant,
    rows: u64,
    op_calls: u64,
    seq_min: i64,
    seq_max: i64,
}

/// Writes the records of one partition (`rank=<R>/device=<D>/`) into a
/// sequence of complete Parquet files.
pub struct RotatingWriter {
    dir: PathBuf,
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
}

/// Creates `dir` and its missing parents with the given mode.
pub fn create_dir(dir: &Path, mode: u32) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| Error::io(dir, e))
}

impl RotatingWriter {
    /// `prefix` names the files (`part-<pid>`); `metadata` goes into every
    /// file's key-value metadata beside the schema version and the counts.
    /// Nothing touches the disk until the first record.
    pub fn new(
        dir: impl Into<PathBuf>,
        prefix: impl Into<String>,
        opts: RotateOptions,
        metadata: Vec<(String, String)>,
    ) -> Self {
        RotatingWriter {
            dir: dir.into(),
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

    fn open(&mut self) -> Result<&mut OpenFile> {
        create_dir(&self.dir, self.opts.dir_mode)?;
        let (tmp, dest, file) = loop {
            let name = format!("{}-{:05}.parquet", self.prefix, self.next_index);
            self.next_index += 1;
            let dest = self.dir.join(&name);
            let tmp = self.dir.join(format!(".{name}.tmp"));
            if dest.exists() {
                continue; // left by an earlier process with the same pid
            }
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(self.opts.file_mode)
                .open(&tmp)
            {
                Ok(f) => break (tmp, dest, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&tmp, e)),
            }
        };
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(64 * 1024));
        // Columns whose values hardly repeat: a dictionary saves no space and
        // hashing every value into it was the writer's largest cost.
        for name in UNIQUE_COLUMNS {
            props = props.set_column_dictionary_enabled(ColumnPath::from(*name), false);
        }
        let props = props.build();
        let writer = ArrowWriter::try_new(BufWriter::with_capacity(1 << 20, file), schema(), Some(props))
            .map_err(|e| Error::parquet(&tmp, e))?;
        Ok(self.file.insert(OpenFile {
            writer,
            tmp,
            dest,
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
            None => self.open()?,
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
        let Some(file) = self.file.as_mut() else { return Ok(()) };
        if self.builder.rows() == 0 {
            return Ok(());
        }
        let batch = self.builder.finish()?;
        file.writer.write(&batch).map_err(|e| Error::parquet(&file.tmp, e))
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
        let Some(f) = self.file.take() else { return Ok(()) };
        let (tmp, rows, op_calls) = (f.tmp.clone(), f.rows, f.op_calls);
        match Self::complete(&self.metadata, f) {
            Ok(()) => {
                self.rows_written += rows;
                self.ops_written += op_calls;
                self.files_written += 1;
                Ok(())
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                self.lost_unreported += op_calls;
                Err(e)
            }
        }
    }

    /// Adds the metadata, writes the footer, and renames the file into view.
    fn complete(metadata: &[(String, String)], mut f: OpenFile) -> Result<()> {
        let counts = [
            (meta::SCHEMA_VERSION, SCHEMA_VERSION.to_string()),
            (meta::ROWS, f.rows.to_string()),
            (meta::OP_CALLS, f.op_calls.to_string()),
            (meta::SEQ_MIN, f.seq_min.to_string()),
            (meta::SEQ_MAX, f.seq_max.to_string()),
        ];
        for (k, v) in metadata.iter().map(|(k, v)| (k.as_str(), v.clone())).chain(counts) {
            f.writer.append_key_value_metadata(KeyValue::new(k.to_string(), v));
        }
        let buf = f.writer.into_inner().map_err(|e| Error::parquet(&f.tmp, e))?;
        let file = buf.into_inner().map_err(|e| Error::io(&f.tmp, e.into_error()))?;
        drop(file);
        fs::rename(&f.tmp, &f.dest).map_err(|e| Error::io(&f.dest, e))
    }

    /// Drops the open file and its buffered rows without making anything
    /// visible: no partial file is left behind. Returns the op calls lost.
    pub fn abandon(&mut self) -> u64 {
        let _ = self.builder.finish();
        let earlier = std::mem::take(&mut self.lost_unreported);
        earlier + match self.file.take() {
            Some(f) => {
                let (lost, tmp) = (f.op_calls, f.tmp.clone());
                drop(f);
                let _ = fs::remove_file(tmp);
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
