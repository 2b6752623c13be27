//! The verdicts of a run judged online, one JSON object per line, in
//! `<OPDUMP_DIR>/verdicts/rank=<R>/part-<pid>.jsonl`: a `group` line per
//! judged (step, phase) group, then a `final` line with the run's verdict.
//!
//! JSON lines rather than Parquet: the file grows a line per group while
//! the job runs, stays readable if the job dies, and sits outside the
//! Parquet files a `**/*.parquet` glob reads (DuckDB reads it with
//! `read_json`). Directories and the file are made as the dump's are
//! (`opdump_fsguard`): never through a link, never over an existing file.

use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};

use opdump_fsguard::{enter_dir, open_dump_root, CheckedFile};

pub struct VerdictFile {
    pub path: PathBuf,
    file: CheckedFile,
}

impl VerdictFile {
    pub fn create(
        dir: &Path,
        rank: u32,
        pid: i32,
        file_mode: u32,
        dir_mode: u32,
    ) -> std::io::Result<Self> {
        let refused = |r: opdump_fsguard::DirRefused| std::io::Error::other(r.to_string());
        let mut root = open_dump_root(dir, dir_mode).map_err(refused)?;
        let mut verdicts = enter_dir(&mut root, dir, "verdicts", dir_mode).map_err(refused)?;
        let rank_dir = format!("rank={rank}");
        let mut at = enter_dir(&mut verdicts, &dir.join("verdicts"), &rank_dir, dir_mode)
            .map_err(refused)?;
        let name = format!("part-{pid}.jsonl");
        let c_name = CString::new(name.clone()).map_err(std::io::Error::other)?;
        let file = CheckedFile::create_new(&mut at, &c_name, file_mode)?;
        Ok(VerdictFile {
            path: dir.join("verdicts").join(rank_dir).join(name),
            file,
        })
    }

    /// Appends one line, whole (one write call).
    pub fn append(&mut self, row: &impl serde::Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(row).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)
    }
}
