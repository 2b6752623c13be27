//! The JSON-lines tables a dump holds beside its Parquet files, one object
//! per line, in `<dump>/<table>/rank=<R>/part-<pid>.jsonl`:
//!
//! - [`check`]: the accuracy check's results (`OPDUMP_CHECK`), in `checks`;
//! - [`verdict`]: the verdicts of a run judged against a reference while
//!   it ran (`OPDUMP_REFERENCE`), in `verdicts`.
//!
//! The plugin writes these types and `opdump-load` reads them back: this is
//! the one declaration of each line. Every line names its kind first
//! ([`Kind`]), so a reader can tell the lines of one file apart and leave
//! out kinds a newer plugin adds.

pub mod check;
pub mod verdict;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The `kind` field of a line.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// [`check::CheckLine`]
    #[default]
    Check,
    /// [`check::CheckSummary`]
    Summary,
    /// [`verdict::GroupLine`]
    Group,
    /// [`verdict::CpuCheckLine`]
    CpuCheck,
    /// [`verdict::FinalLine`]
    Final,
}

impl Kind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Check => "check",
            Kind::Summary => "summary",
            Kind::Group => "group",
            Kind::CpuCheck => "cpu_check",
            Kind::Final => "final",
        }
    }
}

/// A JSON-lines table: the directory under the dump's root that holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// The accuracy check's lines and the capture files of failed calls.
    Checks,
    /// A run's verdicts against OPDUMP_REFERENCE.
    Verdicts,
}

impl Table {
    pub const fn dir(self) -> &'static str {
        match self {
            Table::Checks => "checks",
            Table::Verdicts => "verdicts",
        }
    }

    /// `<table>/rank=<R>`, under the dump's root.
    pub fn rank_dir(self, dump: &Path, rank: u32) -> PathBuf {
        dump.join(self.dir()).join(rank_dir_name(rank))
    }

    /// `<table>/rank=<R>/part-<pid>.jsonl`, under the dump's root.
    pub fn part_path(self, dump: &Path, rank: u32, pid: i64) -> PathBuf {
        self.rank_dir(dump, rank).join(part_file_name(pid))
    }
}

/// `rank=<R>`.
pub fn rank_dir_name(rank: u32) -> String {
    format!("rank={rank}")
}

/// `part-<pid>.jsonl`: one file per process.
pub fn part_file_name(pid: i64) -> String {
    format!("part-{pid}.jsonl")
}

/// Whether `name` is a file name [`part_file_name`] makes.
pub fn is_part_file_name(name: &str) -> bool {
    name.starts_with("part-") && name.ends_with(".jsonl")
}

/// The rank of a `rank=<R>` directory: a plain decimal number.
pub fn rank_of_dir_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("rank=")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_table_rank_part() {
        assert_eq!(
            Table::Checks.part_path(Path::new("d"), 3, 42),
            Path::new("d/checks/rank=3/part-42.jsonl")
        );
        assert_eq!(
            Table::Verdicts.rank_dir(Path::new("d"), 0),
            Path::new("d/verdicts/rank=0")
        );
        assert!(is_part_file_name(&part_file_name(7)));
        assert_eq!(rank_of_dir_name(&rank_dir_name(12)), Some(12));
        for bad in ["rank=", "rank=x", "rank=-1", "rank=+1", "ranks=1"] {
            assert_eq!(rank_of_dir_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn kinds_are_written_as_their_names() {
        for k in [
            Kind::Check,
            Kind::Summary,
            Kind::Group,
            Kind::CpuCheck,
            Kind::Final,
        ] {
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.as_str())
            );
        }
    }
}
