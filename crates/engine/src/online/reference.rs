//! The reference dump (`OPDUMP_REFERENCE`): checked once when dumping
//! starts, then read one step at a time.
//!
//! A reference is data from elsewhere. It is read only from a directory
//! that no other user can change (the rule `OPDUMP_DIR` follows), through
//! the loader that `opdump compare` uses, which turns a malformed file
//! into an error rather than a crash.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use opdump_judge::{Dump, Silent};
use opdump_load::{load_steps, scan, DumpIndex};

/// A reference dump whose files were listed and whose versions are
/// readable.
pub struct Reference {
    pub dir: PathBuf,
    index: DumpIndex,
}

impl Reference {
    /// Opens `dir`; the error is one sentence naming the variable, the
    /// problem and what to do.
    pub fn open(dir: &Path) -> Result<Reference, String> {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        let shown = dir.display();
        if let Err(refused) = opdump_fsguard::open_trusted_dir(&dir) {
            return Err(format!(
                "OPDUMP_REFERENCE={shown}: {}; give the directory of a dump you made (OPDUMP_DIR of the \
                 reference run), owned by you and writable by no one else",
                refusal(&refused.problem)
            ));
        }
        let index = scan(&dir).map_err(|e| {
            format!("OPDUMP_REFERENCE={shown} cannot be read ({e}); give a dump that this opdump reads, or dump the reference again")
        })?;
        Ok(Reference { dir, index })
    }

    pub fn ranks(&self) -> BTreeSet<u32> {
        self.index.ranks()
    }

    /// The calls of `rank` in steps `first..=last`; empty when it has none.
    pub fn steps(&self, rank: u32, first: i64, last: i64) -> Result<Dump, String> {
        load_steps(&self.index, rank, first..=last, &Silent, "the reference")
            .map_err(|e| e.to_string())
    }
}

/// Why a directory is refused, in words for `OPDUMP_REFERENCE`.
fn refusal(p: &opdump_fsguard::DirProblem) -> String {
    use opdump_fsguard::DirProblem as P;
    match p {
        P::NotDirectory => "it is not a directory".into(),
        P::Link => "it is a symbolic link".into(),
        P::OwnedByOther { uid, euid } => {
            format!("it is owned by another user (uid {uid}, this process runs as uid {euid}), who could change it")
        }
        P::WritableByOthers { mode } => {
            format!("it is writable by other users (mode {mode:04o}), who could change it")
        }
        P::NotWritable => "it is not writable".into(),
        P::CannotCreate(e) | P::CannotOpen(e) => format!("it cannot be opened ({e})"),
    }
}
