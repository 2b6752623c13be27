//! `opdump ranks DUMP`: the ranks of one data-parallel job against each
//! other, by fingerprint.
//!
//! Every rank of a data-parallel job applies the same all-reduced gradients
//! to the same parameters, so a parameter and its gradient as the optimizer
//! reads and writes them, and a parameter as a forward reads it, hold the
//! same bits on every rank. The fingerprint (README: "Fingerprint and
//! sketch") says whether they do, so a rank whose values went astray (a
//! flipped bit, a broken reduction, a race) is named by the first tensor
//! where it leaves the majority.
//!
//! Memory: a row is kept only when it is such a tensor, as one small entry
//! (interned key, step, seq, fingerprint), and the dump is read in windows
//! of whole steps, chosen from the row groups' `step` statistics so that
//! the rows of one window stay under a budget. Nothing outside the window
//! is held but the counts and the first findings.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt64Type};
use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, PrimitiveArray, RecordBatch};
use arrow_array::{StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use opdump_format::reader::{open_batches, open_regular};
use opdump_format::schema::col;
use opdump_format::{Phase, Role};
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use parquet::file::statistics::Statistics;
use serde::Serialize;

use crate::app::error::{CliError, Result};
use crate::app::print::print_report;
use crate::app::progress::Progress;
use crate::app::text::Clean;
use crate::cli::RanksArgs;
use crate::report::terminal::thousands;
use opdump_judge::intern::{FxMap, Interner, NO_ID};
use opdump_load::panic_guard;
use opdump_load::read::{scan, FileInfo};

/// Rows (of every kind) of the row groups one window reads, summed over
/// ranks. Only named rows become entries (48 bytes), so a window holds far
/// less than this many; a single step larger than the budget is still read
/// whole, since a step is never split.
const WINDOW_ROWS: u64 = 8 << 20;

/// How many findings the report lists.
const LISTED: usize = 10;

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
/// String columns asked for as dictionaries: each distinct value is looked
/// at once per batch.
const DICT: [&str; 7] = [
    col::PHASE,
    col::OP,
    col::OVERLOAD,
    col::ROLE,
    col::ARG,
    col::NAME,
    col::MODULE,
];

// ---------------------------------------------------------------- report

/// What `opdump ranks` found (the JSON of `--json`).
#[derive(Serialize, Debug)]
pub struct RanksReport {
    pub format: &'static str,
    pub version: u32,
    pub path: String,
    pub ranks: Vec<u32>,
    pub step_first: Option<i64>,
    pub step_last: Option<i64>,
    pub tensors: TensorCounts,
    /// Ranks that left the majority on some tensor, lowest rank first.
    pub by_rank: Vec<RankCount>,
    /// The first finding (by step, then call order): the verdict.
    pub first: Option<Finding>,
    /// The first findings, in order, `first` among them.
    pub findings: Vec<Finding>,
    /// 0 every tensor agrees (or has no majority and may differ), 1 a
    /// finding.
    pub exit_status: u8,
    pub notes: Vec<String>,
}

/// Tensors compared, each one key (see [`Key`]) measured on several ranks.
#[derive(Serialize, Debug, Default, Clone, Copy)]
pub struct TensorCounts {
    /// Measured on at least two ranks.
    pub compared: u64,
    /// The same fingerprint on every rank that measured it.
    pub agree: u64,
    /// A strict majority agrees; the other ranks are odd ones out.
    pub odd: u64,
    /// Optimizer tensors with no strict majority (two ranks that differ,
    /// an even split): they must agree, and no rank can be named.
    pub split: u64,
    /// Forward tensors with no strict majority: not judged, since buffers
    /// (running statistics) may differ per rank.
    pub not_judged: u64,
    /// Measured on one rank only.
    pub one_rank: u64,
}

#[derive(Serialize, Debug, Clone)]
pub struct RankCount {
    pub rank: u32,
    /// Tensors on which this rank left the majority.
    pub odd: u64,
    pub first_step: i64,
}

/// One rank's value of a tensor.
#[derive(Serialize, Debug, Clone)]
pub struct RankValue {
    pub rank: u32,
    /// 16 hex digits, `0x` first (JSON numbers lose bits past 2^53).
    pub fingerprint: String,
    pub seq: i64,
    pub module: Option<String>,
}

/// A tensor whose ranks disagree.
#[derive(Serialize, Debug, Clone)]
pub struct Finding {
    /// `odd` (a strict majority agrees) or `split` (none does).
    pub kind: &'static str,
    pub step: i64,
    pub phase: &'static str,
    pub op: String,
    pub overload: String,
    pub name: String,
    pub role: &'static str,
    pub arg: String,
    pub list_index: Option<i32>,
    /// Which call of this op on this tensor in the step (0: the first).
    pub occurrence: u32,
    /// Ranks outside the majority (`odd`), empty for `split`.
    pub odd_ranks: Vec<u32>,
    pub majority_fingerprint: Option<String>,
    pub majority_ranks: Vec<u32>,
    /// The lowest rank of the majority (of all ranks, for `split`).
    pub reference: RankValue,
    /// The ranks outside the majority (every rank, for `split`).
    pub others: Vec<RankValue>,
}

fn hex(fp: u64) -> String {
    format!("0x{fp:016x}")
}

// ---------------------------------------------------------------- keys

/// What a tensor is, the same on every rank: extra calls on one rank shift
/// seqs, not keys.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    phase: Phase,
    op: u32,
    overload: u32,
    name: u32,
    role: Role,
    arg: u32,
    list_index: i32,
}

#[derive(Default)]
struct Keys {
    strings: Interner,
    ids: FxMap<Key, u32>,
    keys: Vec<Key>,
}

impl Keys {
    fn id(&mut self, k: Key) -> u32 {
        if let Some(&id) = self.ids.get(&k) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.keys.push(k);
        self.ids.insert(k, id);
        id
    }
}

/// One kept tensor row. `occ` is the key's occurrence in its step on its
/// rank, in seq order, set once a rank's window is read.
#[derive(Clone, Copy, Debug)]
struct Entry {
    step: i64,
    seq: i64,
    fp: Option<u64>,
    key: u32,
    occ: u32,
    rank: u32,
    module: u32,
}

// ---------------------------------------------------------------- files

/// A row group's step range and row count. Without statistics the range
/// is everything.
#[derive(Clone, Copy, Debug)]
struct Group {
    index: usize,
    lo: i64,
    hi: i64,
    rows: u64,
}

struct RankFile {
    path: PathBuf,
    groups: Vec<Group>,
}

struct Rank {
    rank: u32,
    files: Vec<RankFile>,
}

/// The files kept per rank (one process each, as `compare` reads a rank),
/// with their row groups; notes on what was left out.
fn index_ranks(dir: &Path, notes: &mut Vec<String>) -> Result<(Vec<Rank>, bool, bool)> {
    let index = scan(dir)?;
    let mut by_rank: BTreeMap<u32, BTreeMap<i64, Vec<&FileInfo>>> = BTreeMap::new();
    for f in &index.files {
        by_rank
            .entry(f.rank)
            .or_default()
            .entry(f.pid)
            .or_default()
            .push(f);
    }
    let (mut any_name, mut any_fp) = (false, false);
    let mut ranks = Vec::new();
    for (rank, pids) in by_rank {
        let calls = |fs: &Vec<&FileInfo>| fs.iter().map(|f| f.op_calls).sum::<u64>();
        let Some((&pid, files)) = pids
            .iter()
            .max_by_key(|(pid, fs)| (calls(fs), std::cmp::Reverse(**pid)))
        else {
            continue;
        };
        if pids.len() > 1 {
            notes.push(format!(
                "rank {rank}: {} processes wrote into it; only pid {pid} (the most op calls) was read",
                pids.len()
            ));
        }
        let mut out = Vec::new();
        for f in files {
            let (groups, has_name, has_fp) = panic_guard::run(&f.path, || row_groups(&f.path))?;
            any_name |= has_name;
            any_fp |= has_fp;
            out.push(RankFile {
                path: f.path.clone(),
                groups,
            });
        }
        ranks.push(Rank { rank, files: out });
    }
    Ok((ranks, any_name, any_fp))
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
fn windows(groups: &[Group], budget: u64) -> Vec<(i64, i64)> {
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

// ---------------------------------------------------------------- reading

/// A string column of one batch, dictionary-encoded or plain.
enum Strs<'a> {
    Dict(&'a PrimitiveArray<Int32Type>, &'a StringArray),
    Plain(&'a StringArray),
}

impl<'a> Strs<'a> {
    fn of(path: &Path, b: &'a RecordBatch, name: &str) -> Result<Option<Self>> {
        let Some(a) = b.column_by_name(name) else {
            return Ok(None);
        };
        if let Some(d) = a.as_dictionary_opt::<Int32Type>() {
            if let Some(v) = d.values().as_string_opt::<i32>() {
                return Ok(Some(Strs::Dict(d.keys(), v)));
            }
        }
        match a.as_string_opt::<i32>() {
            Some(s) => Ok(Some(Strs::Plain(s))),
            None => Err(bad_type(path, name, a)),
        }
    }

    fn get(&self, i: usize) -> Option<&'a str> {
        match self {
            Strs::Dict(k, v) => {
                let j = k.is_valid(i).then(|| k.value(i) as usize)?;
                (j < v.len() && v.is_valid(j)).then(|| v.value(j))
            }
            Strs::Plain(s) => s.is_valid(i).then(|| s.value(i)),
        }
    }
}

fn bad_type(path: &Path, name: &str, a: &ArrayRef) -> CliError {
    CliError::new(format!(
        "{}: column {name:?} has unexpected type {}",
        path.display(),
        a.data_type()
    ))
}

fn missing(path: &Path, name: &str) -> CliError {
    CliError::new(format!("{}: column {name:?} is missing", path.display()))
}

fn ints<'a, T: arrow_array::ArrowPrimitiveType>(
    path: &Path,
    b: &'a RecordBatch,
    name: &str,
) -> Result<&'a PrimitiveArray<T>> {
    let a = b.column_by_name(name).ok_or_else(|| missing(path, name))?;
    a.as_primitive_opt::<T>()
        .ok_or_else(|| bad_type(path, name, a))
}

/// The file opened for the columns `ranks` reads, string columns as
/// dictionaries, only the row groups of `groups`.
fn open(
    path: &Path,
    groups: Vec<usize>,
) -> Result<parquet::arrow::arrow_reader::ParquetRecordBatchReader> {
    let schema = open_batches(path)?.schema().clone();
    let hint = Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| {
                if DICT.contains(&f.name().as_str()) && f.data_type() == &DataType::Utf8 {
                    Arc::new(Field::new(
                        f.name(),
                        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                        f.is_nullable(),
                    ))
                } else {
                    f.clone()
                }
            })
            .collect::<Vec<_>>(),
    ));
    let file: File = open_regular(path)?;
    let err = |e: parquet::errors::ParquetError| CliError::new(format!("{}: {e}", path.display()));
    let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(
        file,
        ArrowReaderOptions::new().with_schema(hint),
    )
    .map_err(err)?;
    let mut roots = Vec::new();
    for n in REQUIRED {
        roots.push(schema.index_of(n).map_err(|_| missing(path, n))?);
    }
    roots.extend(OPTIONAL.iter().filter_map(|n| schema.index_of(n).ok()));
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    builder
        .with_projection(mask)
        .with_row_groups(groups)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(err)
}

/// Rows seen while reading, for the messages when nothing can be compared.
#[derive(Default)]
struct Seen {
    named: u64,
    with_fp: u64,
    /// Ranks with at least one fingerprint.
    ranks_with_fp: std::collections::BTreeSet<u32>,
}

/// Appends the kept rows of one file with steps in `win`.
fn read_file(
    f: &RankFile,
    rank: u32,
    win: (i64, i64),
    keys: &mut Keys,
    seen: &mut Seen,
    out: &mut Vec<Entry>,
) -> Result<()> {
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
    for batch in open(path, groups)? {
        let b = batch.map_err(|e| CliError::new(format!("{}: {e}", path.display())))?;
        read_batch(path, &b, rank, win, keys, seen, out)?;
    }
    Ok(())
}

fn read_batch(
    path: &Path,
    b: &RecordBatch,
    rank: u32,
    win: (i64, i64),
    keys: &mut Keys,
    seen: &mut Seen,
    out: &mut Vec<Entry>,
) -> Result<()> {
    let Some(name) = Strs::of(path, b, col::NAME)? else {
        return Ok(());
    };
    let need = |n: &str| Strs::of(path, b, n)?.ok_or_else(|| missing(path, n));
    let (phase, op, overload, role, arg) = (
        need(col::PHASE)?,
        need(col::OP)?,
        need(col::OVERLOAD)?,
        need(col::ROLE)?,
        need(col::ARG)?,
    );
    let module = Strs::of(path, b, col::MODULE)?;
    let seq: &Int64Array = ints::<Int64Type>(path, b, col::SEQ)?;
    let step: &Int64Array = ints::<Int64Type>(path, b, col::STEP)?;
    let list_index: &Int32Array = ints::<Int32Type>(path, b, col::LIST_INDEX)?;
    let fp = match b.column_by_name(col::FINGERPRINT) {
        None => None,
        Some(a) => Some(Fingerprints::of(path, a)?),
    };
    for i in 0..b.num_rows() {
        let Some(n) = name.get(i) else { continue };
        if step.is_null(i) || seq.is_null(i) {
            continue;
        }
        let s = step.value(i);
        if s < win.0 || s > win.1 {
            continue;
        }
        let Some(ph) = phase.get(i).and_then(Phase::parse) else {
            continue;
        };
        // The optimizer reads and writes parameters and their gradients;
        // a forward reads parameters (and buffers). Gradients before the
        // optimizer are each rank's own, not yet reduced.
        match ph {
            Phase::Optimizer => {}
            Phase::Forward if !n.ends_with(".grad") => {}
            _ => continue,
        }
        let Some(r) = role.get(i).and_then(Role::parse) else {
            continue;
        };
        if r == Role::None {
            continue;
        }
        seen.named += 1;
        let v = fp.as_ref().and_then(|f| f.get(i));
        seen.with_fp += u64::from(v.is_some());
        if v.is_some() {
            seen.ranks_with_fp.insert(rank);
        }
        let k = Key {
            phase: ph,
            op: keys.strings.intern(op.get(i).unwrap_or("")),
            overload: keys.strings.intern(overload.get(i).unwrap_or("")),
            name: keys.strings.intern(n),
            role: r,
            arg: keys.strings.intern(arg.get(i).unwrap_or("")),
            list_index: if list_index.is_null(i) {
                -1
            } else {
                list_index.value(i)
            },
        };
        let module = match module.as_ref().and_then(|m| m.get(i)) {
            Some(m) => keys.strings.intern(m),
            None => NO_ID,
        };
        out.push(Entry {
            step: s,
            seq: seq.value(i),
            fp: v,
            key: keys.id(k),
            occ: 0,
            rank,
            module,
        });
    }
    Ok(())
}

/// The fingerprint column: UInt64 as written; Int64 (the same bits) read
/// too.
enum Fingerprints<'a> {
    U(&'a UInt64Array),
    I(&'a Int64Array),
}

impl<'a> Fingerprints<'a> {
    fn of(path: &Path, a: &'a ArrayRef) -> Result<Self> {
        if let Some(u) = a.as_primitive_opt::<UInt64Type>() {
            return Ok(Fingerprints::U(u));
        }
        if let Some(s) = a.as_primitive_opt::<Int64Type>() {
            return Ok(Fingerprints::I(s));
        }
        Err(bad_type(path, col::FINGERPRINT, a))
    }

    fn get(&self, i: usize) -> Option<u64> {
        match self {
            Fingerprints::U(u) => u.is_valid(i).then(|| u.value(i)),
            Fingerprints::I(s) => s.is_valid(i).then(|| s.value(i) as u64),
        }
    }
}

/// Numbers each key's calls within its step, in seq order (rows of one
/// call are consecutive and keep their order). Entries of one rank only.
fn number_occurrences(entries: &mut [Entry]) {
    entries.sort_by_key(|e| (e.step, e.seq));
    let mut count: FxMap<(i64, u32), u32> = FxMap::default();
    for e in entries.iter_mut() {
        let c = count.entry((e.step, e.key)).or_insert(0);
        e.occ = *c;
        *c += 1;
    }
}

// ---------------------------------------------------------------- judging

/// The findings and counts of everything read so far.
struct Tally {
    counts: TensorCounts,
    by_rank: BTreeMap<u32, RankCount>,
    findings: Vec<Finding>,
    total_findings: u64,
}

/// One tensor's vote: the ranks with a fingerprint, lowest rank first.
fn judge(group: &[Entry], keys: &Keys, tally: &mut Tally, found: &mut Vec<(i64, i64, Finding)>) {
    let measured: Vec<&Entry> = group.iter().filter(|e| e.fp.is_some()).collect();
    let k = measured.len();
    if k == 0 {
        return;
    }
    if k == 1 {
        tally.counts.one_rank += 1;
        return;
    }
    tally.counts.compared += 1;
    let mut votes: Vec<(u64, usize)> = Vec::new();
    for e in &measured {
        let fp = e.fp.unwrap_or(0);
        match votes.iter_mut().find(|(v, _)| *v == fp) {
            Some((_, c)) => *c += 1,
            None => votes.push((fp, 1)),
        }
    }
    if votes.len() == 1 {
        tally.counts.agree += 1;
        return;
    }
    // At least two ranks voted (k >= 2), so there is a top vote.
    let Some(&(top, m)) = votes.iter().max_by_key(|(_, c)| *c) else {
        return;
    };
    let key = keys.keys[group[0].key as usize];
    let majority = 2 * m > k;
    if !majority {
        if key.phase == Phase::Forward {
            tally.counts.not_judged += 1;
            return;
        }
        tally.counts.split += 1;
    } else {
        tally.counts.odd += 1;
    }
    let step = group[0].step;
    let value = |e: &Entry| RankValue {
        rank: e.rank,
        fingerprint: hex(e.fp.unwrap_or(0)),
        seq: e.seq,
        module: (e.module != NO_ID).then(|| keys.strings.get(e.module).to_string()),
    };
    let in_majority = |e: &&&Entry| majority && e.fp == Some(top);
    let reference = measured
        .iter()
        .find(in_majority)
        .copied()
        .unwrap_or(measured[0]);
    let others: Vec<&Entry> = measured
        .iter()
        .filter(|e| !in_majority(e))
        .copied()
        .collect();
    let odd_ranks: Vec<u32> = if majority {
        others.iter().map(|e| e.rank).collect()
    } else {
        Vec::new()
    };
    for &r in &odd_ranks {
        let c = tally.by_rank.entry(r).or_insert(RankCount {
            rank: r,
            odd: 0,
            first_step: step,
        });
        c.odd += 1;
        c.first_step = c.first_step.min(step);
    }
    tally.total_findings += 1;
    let s = |id: u32| keys.strings.get(id).to_string();
    let f = Finding {
        kind: if majority { "odd" } else { "split" },
        step,
        phase: key.phase.as_str(),
        op: s(key.op),
        overload: s(key.overload),
        name: s(key.name),
        role: key.role.as_str(),
        arg: s(key.arg),
        list_index: (key.list_index >= 0).then_some(key.list_index),
        occurrence: group[0].occ,
        odd_ranks,
        majority_fingerprint: majority.then(|| hex(top)),
        majority_ranks: if majority {
            measured
                .iter()
                .filter(|e| e.fp == Some(top))
                .map(|e| e.rank)
                .collect()
        } else {
            Vec::new()
        },
        reference: value(reference),
        others: others.iter().map(|e| value(e)).collect(),
    };
    found.push((step, reference.seq, f));
}

/// Judges one window's entries (every rank's, occurrences numbered) and
/// keeps the first findings in order: by step, then by call order on the
/// reference rank.
fn judge_window(entries: &mut [Entry], keys: &Keys, tally: &mut Tally) {
    entries.sort_unstable_by_key(|e| (e.step, e.key, e.occ, e.rank));
    let mut found = Vec::new();
    for group in entries.chunk_by(|a, b| (a.step, a.key, a.occ) == (b.step, b.key, b.occ)) {
        judge(group, keys, tally, &mut found);
    }
    found.sort_by_key(|(step, seq, _)| (*step, *seq));
    let room = LISTED.saturating_sub(tally.findings.len());
    tally
        .findings
        .extend(found.into_iter().take(room).map(|(_, _, f)| f));
}

// ---------------------------------------------------------------- driver

/// Compares the ranks of the dump at `dir`.
pub fn run(dir: &Path, progress: &Progress) -> Result<RanksReport> {
    run_with_budget(dir, progress, WINDOW_ROWS)
}

/// [`run`] with another window budget (tests read many small windows).
pub fn run_with_budget(dir: &Path, progress: &Progress, budget: u64) -> Result<RanksReport> {
    let mut notes = Vec::new();
    let (ranks, any_name, any_fp) = index_ranks(dir, &mut notes)?;
    let shown = dir.display();
    if ranks.len() < 2 {
        let r = ranks.first().map_or(0, |r| r.rank);
        return Err(CliError::new(format!(
            "{shown}: only rank {r} has files; opdump ranks compares the ranks of one data-parallel job (at least 2)"
        )));
    }
    if !any_name {
        return Err(CliError::new(format!(
            "{shown}: no name column: this dump's schema names no parameters (a newer opdump writes it)"
        )));
    }
    if !any_fp {
        return Err(CliError::new(format!(
            "{shown}: no fingerprints: the dump has no fingerprint column (written by an opdump before schema 4); run the job again with this version"
        )));
    }
    let all: Vec<Group> = ranks
        .iter()
        .flat_map(|r| r.files.iter().flat_map(|f| f.groups.iter().copied()))
        .collect();
    let wins = windows(&all, budget);
    let mut keys = Keys::default();
    let mut seen = Seen::default();
    let mut tally = Tally {
        counts: TensorCounts::default(),
        by_rank: BTreeMap::new(),
        findings: Vec::new(),
        total_findings: 0,
    };
    let (mut step_first, mut step_last) = (None::<i64>, None::<i64>);
    for (w, &win) in wins.iter().enumerate() {
        let mut entries: Vec<Entry> = Vec::new();
        for r in &ranks {
            progress.update(|| format!("ranks: window {}/{}, rank {}", w + 1, wins.len(), r.rank));
            let start = entries.len();
            for f in &r.files {
                panic_guard::run(&f.path, || {
                    read_file(f, r.rank, win, &mut keys, &mut seen, &mut entries)
                })?;
            }
            number_occurrences(&mut entries[start..]);
        }
        if let (Some(a), Some(b)) = (
            entries.iter().map(|e| e.step).min(),
            entries.iter().map(|e| e.step).max(),
        ) {
            step_first = Some(step_first.map_or(a, |s| s.min(a)));
            step_last = Some(step_last.map_or(b, |s| s.max(b)));
        }
        judge_window(&mut entries, &keys, &mut tally);
    }
    if seen.named == 0 {
        return Err(CliError::new(format!(
            "{shown}: no parameter or gradient rows (the name column is empty: the job ran without OPDUMP_MODULES, outside Python, or recorded no optimizer step or forward)"
        )));
    }
    if seen.with_fp == 0 {
        return Err(CliError::new(format!(
            "{shown}: no fingerprints: {} parameter and gradient rows, none with a fingerprint (written with OPDUMP_SKETCH=0, or by an opdump that does not compute them yet)",
            seen.named
        )));
    }
    let unmeasured: Vec<u32> = ranks
        .iter()
        .map(|r| r.rank)
        .filter(|r| !seen.ranks_with_fp.contains(r))
        .collect();
    check_compared(dir, &unmeasured, &tally)?;
    if !unmeasured.is_empty() {
        notes.push(format!(
            "rank{} {} not compared: no fingerprints",
            plural(unmeasured.len()),
            list(&unmeasured)
        ));
    }
    if seen.with_fp < seen.named {
        notes.push(format!(
            "{} of {} parameter and gradient rows have no fingerprint (not measured): left out",
            seen.named - seen.with_fp,
            seen.named
        ));
    }
    if tally.counts.not_judged > 0 {
        notes.push(format!(
            "{} tensor{} read in forward differ with no majority: not judged (buffers such as running statistics may differ per rank)",
            tally.counts.not_judged,
            if tally.counts.not_judged == 1 { "" } else { "s" }
        ));
    }
    if tally.counts.one_rank > 0 {
        notes.push(format!(
            "{} tensor{} measured on one rank only: nothing to compare with",
            tally.counts.one_rank,
            if tally.counts.one_rank == 1 { "" } else { "s" }
        ));
    }
    if tally.total_findings > tally.findings.len() as u64 {
        notes.push(format!(
            "{} tensors differ in all; the first {} are listed",
            tally.total_findings,
            tally.findings.len()
        ));
    }
    let exit_status = u8::from(tally.total_findings > 0);
    Ok(RanksReport {
        format: "opdump-ranks",
        version: 1,
        path: dir.display().to_string(),
        ranks: ranks.iter().map(|r| r.rank).collect(),
        step_first,
        step_last,
        tensors: tally.counts,
        by_rank: tally.by_rank.into_values().collect(),
        first: tally.findings.first().cloned(),
        findings: tally.findings,
        exit_status,
        notes,
    })
}

/// The verdict "ranks agree" needs every rank compared: a rank without
/// fingerprints, or no tensor measured on two ranks, is an error unless a
/// finding among the others already stands (`unmeasured` is then a note).
fn check_compared(dir: &Path, unmeasured: &[u32], tally: &Tally) -> Result<()> {
    let shown = dir.display();
    if tally.counts.compared == 0 && unmeasured.is_empty() {
        return Err(CliError::new(format!(
            "{shown}: nothing compared: no parameter or gradient was measured on two ranks at the same step and call"
        )));
    }
    if tally.total_findings == 0 && !unmeasured.is_empty() {
        let n = unmeasured.len();
        return Err(CliError::new(format!(
            "{shown}: rank{} {} cannot be compared: {} no fingerprints (written with OPDUMP_SKETCH=0, or recorded no optimizer step or forward); no verdict on the ranks",
            plural(n),
            list(unmeasured),
            if n == 1 { "it has" } else { "they have" }
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------- text

fn list(ranks: &[u32]) -> String {
    let s: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match s.len() {
        0 => String::new(),
        1 => s[0].clone(),
        n => format!("{} and {}", s[..n - 1].join(", "), s[n - 1]),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Where the tensor sits in its call: `input self[3]`.
fn place(f: &Finding) -> String {
    let idx = f.list_index.map(|i| format!("[{i}]")).unwrap_or_default();
    format!("{} {}{idx}", f.role, Clean(&f.arg))
}

fn op_name(f: &Finding) -> String {
    format!("{}.{}", Clean(&f.op), Clean(&f.overload))
}

fn module(v: &RankValue) -> String {
    v.module
        .as_deref()
        .map_or("-".into(), |m| Clean(m).to_string())
}

fn render_first(o: &mut String, f: &Finding) {
    let r = &f.reference;
    if f.kind == "odd" {
        let odd = &f.odd_ranks;
        let _ = writeln!(
            o,
            "Odd rank{} out: rank{} {}, step {}, {}",
            plural(odd.len()),
            plural(odd.len()),
            list(odd),
            f.step,
            f.phase
        );
    } else {
        let all: Vec<u32> = f.others.iter().map(|v| v.rank).collect();
        let _ = writeln!(
            o,
            "Ranks {} differ, with no majority to name one: step {}, {}",
            list(&all),
            f.step,
            f.phase
        );
    }
    let _ = writeln!(o, "  op           {}", op_name(f));
    let _ = writeln!(
        o,
        "  tensor       {}  ({}, the op's call #{} on it in the step)",
        Clean(&f.name),
        place(f),
        f.occurrence
    );
    for v in &f.others {
        let _ = writeln!(
            o,
            "  rank {:<7} seq {}  module {}  fingerprint {}",
            v.rank,
            v.seq,
            module(v),
            v.fingerprint
        );
    }
    if let Some(fp) = &f.majority_fingerprint {
        let _ = writeln!(
            o,
            "  majority     ranks {}: fingerprint {fp} (rank {}: seq {}, module {})",
            list(&f.majority_ranks),
            r.rank,
            r.seq,
            module(r)
        );
    }
}

/// The text report.
pub fn render(r: &RanksReport) -> String {
    let mut o = String::new();
    let steps = match (r.step_first, r.step_last) {
        (Some(a), Some(b)) => format!(", steps {a}..{b}"),
        _ => String::new(),
    };
    let _ = writeln!(o, "opdump ranks");
    let _ = writeln!(
        o,
        "  dump     {}  ({} ranks: {}{steps})",
        Clean(&r.path),
        r.ranks.len(),
        list(&r.ranks)
    );
    let c = &r.tensors;
    let _ = writeln!(
        o,
        "  tensors  {} compared (parameters and gradients in the optimizer, parameters read in forward): {} agree, {} with odd ranks out, {} split with no majority",
        thousands(c.compared),
        thousands(c.agree),
        thousands(c.odd),
        thousands(c.split)
    );
    for n in &r.notes {
        let _ = writeln!(o, "  note: {}", Clean(n));
    }
    let _ = writeln!(o);
    let Some(first) = &r.first else {
        let _ = writeln!(
            o,
            "Verdict: ranks agree: every tensor compared has the same fingerprint on all ranks that measured it (or no majority, where it may differ)."
        );
        return o;
    };
    render_first(&mut o, first);
    if !r.by_rank.is_empty() {
        let _ = writeln!(o, "\nTensors that leave the majority, by rank:");
        for b in &r.by_rank {
            let _ = writeln!(
                o,
                "  rank {:<6} {} tensor{}, first at step {}",
                b.rank,
                thousands(b.odd),
                plural(b.odd as usize),
                b.first_step
            );
        }
    }
    if r.findings.len() > 1 {
        let _ = writeln!(o, "\nFirst tensors that differ:");
        let _ = writeln!(
            o,
            "  {:>6}  {:<9}  {:<10}  {:<32}  tensor",
            "step", "phase", "ranks", "op"
        );
        for f in &r.findings {
            let who = if f.kind == "odd" {
                list(&f.odd_ranks)
            } else {
                "split".into()
            };
            let _ = writeln!(
                o,
                "  {:>6}  {:<9}  {:<10}  {:<32}  {} ({})",
                f.step,
                f.phase,
                who,
                op_name(f),
                Clean(&f.name),
                place(f)
            );
        }
    }
    let _ = writeln!(o);
    if first.kind == "odd" {
        let _ = writeln!(
            o,
            "Verdict: RANK{} {} DIFFER{}. First at step {} ({}): {}, {} of {}.",
            if first.odd_ranks.len() == 1 { "" } else { "S" },
            list(&first.odd_ranks),
            if first.odd_ranks.len() == 1 { "S" } else { "" },
            first.step,
            first.phase,
            Clean(&first.name),
            place(first),
            op_name(first)
        );
    } else {
        let all: Vec<u32> = first.others.iter().map(|v| v.rank).collect();
        let _ = writeln!(
            o,
            "Verdict: RANKS {} DIFFER (no majority names one). First at step {} ({}): {}, {} of {}.",
            list(&all),
            first.step,
            first.phase,
            Clean(&first.name),
            place(first),
            op_name(first)
        );
    }
    o
}

/// `opdump ranks`: compares the ranks of one dump and prints the report.
pub(crate) fn execute(a: RanksArgs) -> Result<u8> {
    let progress = Progress::auto();
    let r = run(&a.dump, &progress)?;
    progress.finish();
    print_report(a.json, &r, render)?;
    Ok(r.exit_status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opdump_testkit::ranks_job::{write_job, Flip, Job};

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

    #[test]
    fn occurrences_follow_seq_within_a_step() {
        let e = |step, seq, key| Entry {
            step,
            seq,
            fp: Some(1),
            key,
            occ: 9,
            rank: 0,
            module: NO_ID,
        };
        let mut v = vec![e(0, 5, 1), e(0, 2, 1), e(1, 1, 1), e(0, 3, 2)];
        number_occurrences(&mut v);
        let got: Vec<(i64, i64, u32)> = v.iter().map(|e| (e.step, e.seq, e.occ)).collect();
        assert_eq!(got, vec![(0, 2, 0), (0, 3, 0), (0, 5, 1), (1, 1, 0)]);
    }

    #[test]
    fn small_windows_find_the_same() {
        let t = tempfile::tempdir().unwrap();
        write_job(
            t.path(),
            &Job {
                ranks: 4,
                flip: Some(Flip {
                    rank: 3,
                    step: 1,
                    layer: 0,
                }),
                ..Job::default()
            },
        );
        let whole = run_with_budget(
            t.path(),
            &crate::app::progress::Progress::new(false),
            u64::MAX,
        )
        .unwrap();
        let small =
            run_with_budget(t.path(), &crate::app::progress::Progress::new(false), 1).unwrap();
        let a = serde_json::to_value(&whole).unwrap();
        let b = serde_json::to_value(&small).unwrap();
        assert_eq!(a, b);
        assert_eq!(a["first"]["odd_ranks"], serde_json::json!([3]));
    }
}
