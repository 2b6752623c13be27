//! The JSON-lines files a dump holds beside its Parquet files, one object
//! per line, in `<OPDUMP_DIR>/<table>/rank=<R>/part-<pid>.jsonl`: the
//! verdicts of a run judged online (`verdicts`) and the accuracy check's
//! results (`checks`); the lines' types are `opdump_format::tables`.
//!
//! JSON lines rather than Parquet: the file grows a line at a time while
//! the job runs, stays readable if the job dies, and sits outside the
//! Parquet files a `**/*.parquet` glob reads (DuckDB reads it with
//! `read_json`). Directories and the file are made as the dump's are
//! (`opdump_fsguard`): never through a link, never over an existing file.

use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};

use opdump_format::tables::{part_file_name, rank_dir_name, Table};
use opdump_fsguard::{enter_dir, open_dump_root, CheckedFile, GuardedFd};

pub struct JsonLines {
    pub path: PathBuf,
    file: CheckedFile,
    /// The file's directory, for the files its lines name.
    at: GuardedFd,
    file_mode: u32,
}

impl JsonLines {
    pub fn create(
        dir: &Path,
        table: Table,
        rank: u32,
        pid: i32,
        file_mode: u32,
        dir_mode: u32,
    ) -> std::io::Result<Self> {
        let refused = |r: opdump_fsguard::DirRefused| std::io::Error::other(r.to_string());
        let mut root = open_dump_root(dir, dir_mode).map_err(refused)?;
        let mut tables = enter_dir(&mut root, dir, table.dir(), dir_mode).map_err(refused)?;
        let rank_dir = rank_dir_name(rank);
        let mut at =
            enter_dir(&mut tables, &dir.join(table.dir()), &rank_dir, dir_mode).map_err(refused)?;
        let name = part_file_name(pid.into());
        let c_name = CString::new(name.clone()).map_err(std::io::Error::other)?;
        let file = CheckedFile::create_new(&mut at, &c_name, file_mode)?;
        Ok(JsonLines {
            path: table.part_path(dir, rank, pid.into()),
            file,
            at,
            file_mode,
        })
    }

    /// Appends one line, whole (one write call).
    pub fn append(&mut self, row: &impl serde::Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(row).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)
    }

    /// Writes a new file `name` beside this one, whole or not at all: under
    /// a hidden name first, renamed when complete. Refuses a name that is
    /// taken. A write that fails (a full disk, `ulimit -f`) removes the
    /// hidden file: a failed capture leaves nothing behind.
    pub fn write_beside(&mut self, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let dest = CString::new(name).map_err(std::io::Error::other)?;
        let tmp = CString::new(format!(".{name}.tmp")).map_err(std::io::Error::other)?;
        if opdump_fsguard::name_exists(&mut self.at, &dest)? {
            return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
        }
        let mut file = CheckedFile::create_new(&mut self.at, &tmp, self.file_mode)?;
        let id = file.identity();
        let written = file
            .write_all(bytes)
            .and_then(|()| opdump_fsguard::publish(&mut self.at, &mut file, &tmp, &dest));
        if let Err(e) = written {
            // Closed first (if still ours); removed only if the hidden name
            // is still the file created, never a file put in its place.
            drop(file);
            let _ = opdump_fsguard::remove_if(&mut self.at, &tmp, id);
            return Err(e);
        }
        Ok(self.path.with_file_name(name))
    }
}
