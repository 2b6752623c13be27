//! Reading the rows the ranks vote needs ([`opdump_judge::vote`]), in
//! windows of whole steps.
//!
//! A row is kept only when it votes, as one small [`Entry`] (interned key,
//! step, seq, fingerprint), and a dump is read in windows of whole steps,
//! chosen from the row groups' `step` statistics so that the rows of one
//! window stay under a budget. Only the key columns and fingerprints are
//! decoded (Parquet projection), with the loader's own column decoders.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, PrimitiveArray, RecordBatch};
use opdump_format::reader::open_batches;
use opdump_format::schema::col;
use opdump_format::{Phase, Role};
use opdump_judge::vote::{votes_on, Entry, Keys, TensorKey};
use opdump_judge::NO_ID;
use parquet::arrow::ProjectionMask;
use parquet::file::statistics::Statistics;

use crate::error::{Error, Result};
use crate::panic_guard;
use crate::read::{open_dictionaries, primitive, required_roots, Fingerprints, StrCol};
use crate::read::{DumpIndex, FileInfo};

const BATCH_ROWS: usize = 64 * 1024;

/// Columns read; `name`, `module` and `fingerprint` when present.
const REQUIRED: [&str; 8] = [
    col::SEQ,
    col::STEP,
    col::PHASE,
    col::OP,
    col::OVERLOAD,
    col::ROLE,
    col::ARG,
    col::LIST_INDEX,
];
const OPTIONAL: [&str; 3] = [col::NAME, col::MODULE, col::FINGERPRINT];

/// A row group's step range and row count. Without statistics the range
/// is everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// The row group's index in its file.
    pub index: usize,
    /// The lowest step in it.
    pub lo: i64,
    /// The highest step in it.
    pub hi: i64,
    /// Its rows (of every kind).
    pub rows: u64,
}

/// One file of a rank, with its row groups.
pub struct RankFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its row groups.
    pub groups: Vec<Group>,
}

/// The files read of one rank.
pub struct RankFiles {
    /// The rank.
    pub rank: u32,
    /// Its files, of one process.
    pub files: Vec<RankFile>,
}

/// A rank into which several processes wrote: only one is read.
pub struct OtherProcesses {
    /// The rank.
    pub rank: u32,
    /// How many processes wrote into it.
    pub processes: usize,
    /// The one read (the most op calls).
    pub pid_read: i64,
}

/// The ranks of a dump as the vote reads them.
pub struct RankIndex {
    /// Every rank with files, lowest first.
    pub ranks: Vec<RankFiles>,
    /// Some file has the `name` column.
    pub any_name: bool,
    /// Some file has the `fingerprint` column.
    pub any_fingerprint: bool,
    /// Ranks of which other processes' files were left out.
    pub other_processes: Vec<OtherProcesses>,
}

impl RankIndex {
    /// Every row group of every rank.
    pub fn groups(&self) -> Vec<Group> {
        self.ranks
            .iter()
            .flat_map(|r| r.files.iter().flat_map(|f| f.groups.iter().copied()))
            .collect()
    }
}

/// Rows seen while reading, for the messages when nothing can be compared.
#[derive(Default)]
pub struct Seen {
    /// Rows that vote.
    pub named: u64,
    /// Those with a fingerprint.
    pub with_fp: u64,
    /// Ranks with at least one fingerprint.
    pub ranks_with_fp: BTreeSet<u32>,
}

/// The files kept per rank (one process each, as `compare` reads a rank),
/// with their row groups.
pub fn index_ranks(index: &DumpIndex) -> Result<RankIndex> {
    let mut by_rank: BTreeMap<u32, BTreeMap<i64, Vec<&FileInfo>>> = BTreeMap::new();
    for f in &index.files {
        by_rank
            .entry(f.rank)
            .or_default()
            .entry(f.pid)
            .or_default()
            .push(f);
    }
    let mut out = RankIndex {
        ranks: Vec::new(),
        any_name: false,
        any_fingerprint: false,
        other_processes: Vec::new(),
    };
    for (rank, pids) in by_rank {
        let calls = |fs: &Vec<&FileInfo>| fs.iter().map(|f| f.op_calls).sum::<u64>();
        let Some((&pid, files)) = pids
            .iter()
            .max_by_key(|(pid, fs)| (calls(fs), std::cmp::Reverse(**pid)))
        else {
            continue;
        };
        if pids.len() > 1 {
            out.other_processes.push(OtherProcesses {
                rank,
                processes: pids.len(),
                pid_read: pid,
            });
        }
        let mut kept = Vec::new();
        for f in files {
            let (groups, has_name, has_fp) = panic_guard::run(&f.path, || row_groups(&f.path))?;
            out.any_name |= has_name;
            out.any_fingerprint |= has_fp;
            kept.push(RankFile {
                path: f.path.clone(),
                groups,
            });
        }
        out.ranks.push(RankFiles { rank, files: kept });
    }
    Ok(out)
}

/// A file's row groups with their `step` ranges, and whether it has the
/// `name` and `fingerprint` columns.
fn row_groups(path: &Path) -> Result<(Vec<Group>, bool, bool)> {
    let b = open_batches(path)?;
    let schema = b.schema();
    let has = |n: &str| schema.index_of(n).is_ok();
    let (has_name, has_fp) = (has(col::NAME), has(col::FINGERPRINT));
    let step_col = b
        .parquet_schema()
        .columns()
        .iter()
        .position(|c| c.path().string() == col::STEP);
    let groups = b
        .metadata()
        .row_groups()
        .iter()
        .enumerate()
        .map(|(index, rg)| {
            let range = step_col
                .and_then(|c| rg.column(c).statistics())
                .and_then(|s| match s {
                    Statistics::Int64(s) => Some((*s.min_opt()?, *s.max_opt()?)),
                    _ => None,
                });
            let (lo, hi) = range.unwrap_or((i64::MIN, i64::MAX));
            Group {
                index,
                lo,
                hi,
                rows: rg.num_rows().max(0) as u64,
            }
        })
        .collect();
    Ok((groups, has_name, has_fp))
}

/// Windows of whole steps, lowest first, each reading at most `budget`
/// rows of row groups (unless one step alone holds more).
pub fn windows(groups: &[Group], budget: u64) -> Vec<(i64, i64)> {
    if groups.is_empty() {
        return Vec::new();
    }
    let last = groups.iter().map(|g| g.hi).max().unwrap_or(i64::MAX);
    // Without step statistics a group overlaps every window: read once.
    if groups.iter().any(|g| g.lo == i64::MIN || g.hi == i64::MAX) {
        return vec![(i64::MIN, i64::MAX)];
    }
    let rows = |lo: i64, hi: i64| -> u64 {
        groups
            .iter()
            .filter(|g| g.lo <= hi && g.hi >= lo)
            .map(|g| g.rows)
            .sum()
    };
    // A window may end where a group ends or just before one begins; the
    // rows it reads change nowhere else.
    let mut ends: Vec<i64> = groups
        .iter()
        .flat_map(|g| [g.hi, g.lo.saturating_sub(1)])
        .collect();
    ends.sort_unstable();
    ends.dedup();
    let mut out = Vec::new();
    let mut lo = groups.iter().map(|g| g.lo).min().unwrap_or(0);
    while lo <= last {
        // The first group starting at or after `lo`: steps in between hold
        // no rows.
        if rows(lo, lo) == 0 {
            match groups.iter().map(|g| g.lo).filter(|&s| s > lo).min() {
                Some(s) => lo = s,
                None => break,
            }
        }
        let mut hi = lo;
        for &e in ends.iter().filter(|&&e| e >= lo) {
            if rows(lo, e) > budget {
                break;
            }
            hi = e;
        }
        out.push((lo, hi));
        if hi == i64::MAX {
            break;
        }
        lo = hi + 1;
    }
    out
}

/// Where the rows read go: the keys interned, the rows seen counted, the
/// voting rows appended.
pub struct Sink<'a> {
    /// The keys and strings of every window so far.
    pub keys: &'a mut Keys,
    /// Rows seen.
    pub seen: &'a mut Seen,
    /// The window's entries.
    pub out: &'a mut Vec<Entry>,
}

/// Appends the voting rows of one rank with steps in `win` (inclusive),
/// file by file.
pub fn read_rank_window(rank: &RankFiles, win: (i64, i64), sink: &mut Sink<'_>) -> Result<()> {
    for f in &rank.files {
        panic_guard::run(&f.path, || read_file(f, rank.rank, win, sink))?;
    }
    Ok(())
}

/// Appends the kept rows of one file with steps in `win`.
fn read_file(f: &RankFile, rank: u32, win: (i64, i64), sink: &mut Sink<'_>) -> Result<()> {
    let groups: Vec<usize> = f
        .groups
        .iter()
        .filter(|g| g.lo <= win.1 && g.hi >= win.0)
        .map(|g| g.index)
        .collect();
    if groups.is_empty() {
        return Ok(());
    }
    let path = &f.path;
    let (builder, schema) = open_dictionaries(path)?;
    let mut roots = required_roots(path, &schema, &REQUIRED)?;
    roots.extend(OPTIONAL.iter().filter_map(|n| schema.index_of(n).ok()));
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    crate::chunks::check(path, builder.metadata(), &mask, Some(&groups))?;
    let err = |e: &dyn std::fmt::Display| Error::new(format!("{}: {e}", path.display()));
    let reader = builder
        .with_projection(mask)
        .with_row_groups(groups)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| err(&e))?;
    for batch in reader {
        let b = batch.map_err(|e| err(&e))?;
        read_batch(path, &b, rank, win, sink)?;
    }
    Ok(())
}

/// The key columns of one batch.
struct KeyCols<'a> {
    name: StrCol<'a>,
    phase: StrCol<'a>,
    op: StrCol<'a>,
    overload: StrCol<'a>,
    role: StrCol<'a>,
    arg: StrCol<'a>,
    module: Option<StrCol<'a>>,
    seq: &'a PrimitiveArray<Int64Type>,
    step: &'a PrimitiveArray<Int64Type>,
    list_index: &'a PrimitiveArray<Int32Type>,
    fp: Option<Fingerprints<'a>>,
}

impl<'a> KeyCols<'a> {
    /// `None` when the batch has no `name` column (no row can vote).
    fn of(path: &Path, b: &'a RecordBatch) -> Result<Option<Self>> {
        let Some(name) = StrCol::optional(path, b, col::NAME)? else {
            return Ok(None);
        };
        let s = |n: &str| StrCol::new(path, b, n);
        Ok(Some(KeyCols {
            name,
            phase: s(col::PHASE)?,
            op: s(col::OP)?,
            overload: s(col::OVERLOAD)?,
            role: s(col::ROLE)?,
            arg: s(col::ARG)?,
            module: StrCol::optional(path, b, col::MODULE)?,
            seq: primitive::<Int64Type>(path, b, col::SEQ)?,
            step: primitive::<Int64Type>(path, b, col::STEP)?,
            list_index: primitive::<Int32Type>(path, b, col::LIST_INDEX)?,
            fp: Fingerprints::of(path, b)?,
        }))
    }
}

fn read_batch(
    path: &Path,
    b: &RecordBatch,
    rank: u32,
    win: (i64, i64),
    sink: &mut Sink<'_>,
) -> Result<()> {
    let Some(c) = KeyCols::of(path, b)? else {
        return Ok(());
    };
    for i in 0..b.num_rows() {
        let Some(n) = c.name.get(i) else { continue };
        if c.step.is_null(i) || c.seq.is_null(i) {
            continue;
        }
        let s = c.step.value(i);
        if s < win.0 || s > win.1 {
            continue;
        }
        let Some(phase) = c.phase.get(i).and_then(Phase::parse) else {
            continue;
        };
        let Some(role) = c.role.get(i).and_then(Role::parse) else {
            continue;
        };
        if !votes_on(phase, n, role) {
            continue;
        }
        let seen = &mut *sink.seen;
        seen.named += 1;
        let fp = c.fp.as_ref().and_then(|f| f.get(i));
        if fp.is_some() {
            seen.with_fp += 1;
            seen.ranks_with_fp.insert(rank);
        }
        let strings = &mut sink.keys.strings;
        let k = TensorKey {
            phase,
            op: strings.intern(c.op.get(i).unwrap_or("")),
            overload: strings.intern(c.overload.get(i).unwrap_or("")),
            name: strings.intern(n),
            role,
            arg: strings.intern(c.arg.get(i).unwrap_or("")),
            list_index: if c.list_index.is_null(i) {
                -1
            } else {
                c.list_index.value(i)
            },
        };
        let module = match c.module.as_ref().and_then(|m| m.get(i)) {
            Some(m) => strings.intern(m),
            None => NO_ID,
        };
        sink.out.push(Entry {
            step: s,
            seq: c.seq.value(i),
            fp,
            key: sink.keys.id(k),
            occ: 0,
            rank,
            module,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(lo: i64, hi: i64, rows: u64) -> Group {
        Group {
            index: 0,
            lo,
            hi,
            rows,
        }
    }

    #[test]
    fn windows_cover_every_step_once() {
        let groups = [g(0, 1, 10), g(1, 3, 10), g(5, 5, 10), g(0, 2, 10)];
        let w = windows(&groups, 20);
        // Contiguous, increasing, no step in two windows, every group's
        // steps covered.
        for pair in w.windows(2) {
            assert!(pair[0].1 < pair[1].0, "{w:?}");
        }
        for gr in &groups {
            for s in gr.lo..=gr.hi {
                assert!(w.iter().any(|&(a, b)| a <= s && s <= b), "{s} {w:?}");
            }
        }
        assert!(w.len() > 1, "{w:?}");
        assert_eq!(windows(&groups, u64::MAX), vec![(0, 5)]);
        assert_eq!(windows(&[g(i64::MIN, i64::MAX, 5)], 1).len(), 1);
        assert!(windows(&[], 1).is_empty());
    }
}
