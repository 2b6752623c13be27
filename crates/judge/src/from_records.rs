//! A [`Dump`] built in memory from the records the plugin writes, with no
//! file in between: for the judge's own tests, and for judging records a
//! process still holds.
//!
//! It holds what loading the same records from Parquet gives (the loader's
//! reading of each column, null by null), but for what only files carry:
//! the file count, and the statistics' accumulation type.

use std::fmt;
use std::path::PathBuf;

use opdump_format::{OpRecord, Role, TensorRecord};

use crate::calls::CallColumns;
use crate::captured::NoCaptures;
use crate::dtype::DType;
use crate::dump::{signature_start, signature_step, Dump, Tensors, NONE};
use crate::intern::{Interner, ShapeInterner, NO_ID};
use crate::op_row::{OpRow, NO_SEQ};
use crate::packed::{PackedU32, Parents};
use crate::rows::MemRows;
use crate::tensor_row::TensorRow;
use crate::tree::{call_tree, NO_PARENT};

/// Records that cannot make a dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordsError {
    /// Two records have one seq (two runs' records mixed).
    DuplicateSeq(i64),
    /// A call is its own ancestor: its `parent_seq` chain loops.
    AncestorLoop(i64),
    /// More op calls, tensors or distinct dtypes than the dump's indices
    /// hold.
    TooMany(&'static str),
}

impl fmt::Display for RecordsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordsError::DuplicateSeq(s) => write!(f, "seq {s} appears twice"),
            RecordsError::AncestorLoop(s) => write!(
                f,
                "the call at seq {s} is its own ancestor (its parent_seq chain loops)"
            ),
            RecordsError::TooMany(what) => write!(f, "too many {what}"),
        }
    }
}

impl std::error::Error for RecordsError {}

impl Dump {
    /// The dump of rank `rank` made of `records`, its calls put in seq
    /// order and its tensors left in the order of `records` (as the loader
    /// leaves them in file order), its rows in memory ([`MemRows`]) and no captured
    /// values ([`NoCaptures`]). `path` names the dump, and a captured call's
    /// capture file is taken to lie in it.
    ///
    /// Records in memory carry every field this build knows, so the dump is
    /// of no older schema (`schema_version` is `u32::MAX`), and has
    /// fingerprint and sketch columns whenever it has a call. Statistics are
    /// taken to be accumulated in float64.
    pub fn from_records(
        path: impl Into<PathBuf>,
        rank: u32,
        records: &[OpRecord],
    ) -> Result<Dump, RecordsError> {
        let path = path.into();
        if records.len() >= NONE as usize {
            return Err(RecordsError::TooMany("op calls"));
        }
        let mut b = Builder::new(path.clone(), !records.is_empty());
        for r in records {
            b.push(r)?;
        }
        b.sort_by_seq()?;
        b.finish(path, rank, records.first().map(|r| i64::from(r.pid)))
    }
}

/// The dump's columns, filled call by call.
struct Builder {
    /// Where capture files are taken to lie.
    dir: PathBuf,
    names: Interner,
    texts: Interner,
    dtypes: Vec<DType>,
    seq: Vec<i64>,
    parent_seq: Vec<i64>,
    ops: Vec<OpRow>,
    op: Vec<u32>,
    overload: Vec<u32>,
    t_start: Vec<u32>,
    t_len: Vec<u32>,
    has_modules: bool,
    t_rows: Vec<TensorRow>,
    t: Tensors,
    /// Some tensor pushed so far was captured: from then on every tensor
    /// has the two capture columns.
    has_captures: bool,
}

impl Builder {
    /// `columns`: whether the dump has the fingerprint and sketch columns
    /// (a file with a row has them).
    fn new(dir: PathBuf, columns: bool) -> Self {
        let t = Tensors {
            shapes: ShapeInterner::new(),
            has_fingerprints: columns,
            sketch_start: if columns { vec![0] } else { Vec::new() },
            ..Tensors::default()
        };
        Builder {
            dir,
            names: Interner::default(),
            texts: Interner::default(),
            dtypes: Vec::new(),
            seq: Vec::new(),
            parent_seq: Vec::new(),
            ops: Vec::new(),
            op: Vec::new(),
            overload: Vec::new(),
            t_start: Vec::new(),
            t_len: Vec::new(),
            has_modules: false,
            t_rows: Vec::new(),
            t,
            has_captures: false,
        }
    }

    /// Appends one op call and its tensors (a tensor of role `none` is no
    /// tensor, as the row of a call without tensors is none).
    fn push(&mut self, r: &OpRecord) -> Result<(), RecordsError> {
        self.push_call(r);
        let file = r.capture.as_ref().and_then(|c| c.file.as_deref());
        for t in r.tensors.iter().filter(|t| t.role != Role::None) {
            if self.t_rows.len() >= u32::MAX as usize - 1 {
                return Err(RecordsError::TooMany("tensors"));
            }
            self.push_tensor(t, file)?;
            if let Some(n) = self.t_len.last_mut() {
                *n += 1;
            }
            // The call's signature, one tensor more.
            if let (Some(call), Some(row)) = (self.ops.last_mut(), self.t_rows.last()) {
                call.sig = signature_step(&self.t.shapes, call.sig, row.role, row.shape);
            }
        }
        Ok(())
    }

    fn push_call(&mut self, r: &OpRecord) {
        let texts = &mut self.texts;
        let mut text = |s: Option<&str>| s.map_or(NO_ID, |s| texts.intern(s));
        let row = OpRow {
            seq: r.seq,
            step: r.step,
            fwd_seq: r.fwd_seq.unwrap_or(NO_SEQ),
            depth: r.depth,
            phase: r.phase,
            args: text(Some(&r.args)),
            error: text(r.error.as_deref()),
            module: text(r.module.as_deref()),
            source: text(r.source.as_deref()),
            sig: 0,
        };
        self.has_modules |= row.module != NO_ID;
        self.seq.push(r.seq);
        self.parent_seq.push(r.parent_seq.unwrap_or(NO_PARENT));
        let (op, overload) = (self.names.intern(&r.op), self.names.intern(&r.overload));
        self.op.push(op);
        self.overload.push(overload);
        self.ops.push(OpRow {
            sig: signature_start(&self.names, op, overload),
            ..row
        });
        self.t_start.push(self.t_rows.len() as u32);
        self.t_len.push(0);
    }

    /// One tensor: its row, and the sparse columns (non-finite counts,
    /// sketch, capture) beside it. What was not measured reads as a null
    /// statistic does: NaN, or 0 for a count.
    fn push_tensor(&mut self, t: &TensorRecord, file: Option<&str>) -> Result<(), RecordsError> {
        let index = self.t_rows.len() as u32;
        let measured = t.status.has_values();
        let s = &t.stats;
        let float = |v: f64| if measured { v } else { f64::NAN };
        let count = |v: i64| if measured { v } else { 0 };
        let row = TensorRow {
            role: t.role,
            status: Some(t.status),
            dtype: self.dtype_id(&t.dtype)?,
            shape: self.t.shapes.intern(&t.shape, t.numel),
            arg: self.names.intern(&t.arg),
            list_index: t.list_index.unwrap_or(-1),
            name: t.name.as_deref().map_or(NO_ID, |n| self.texts.intern(n)),
            min: float(s.min),
            max: float(s.max),
            mean: float(s.mean),
            std: float(s.std),
            l2: float(s.l2),
            absmax: float(s.absmax),
            zero: count(s.zero_count),
            fingerprint: t.fingerprint.filter(|_| measured).unwrap_or(0),
        };
        self.t_rows.push(row);
        let nonfinite = [s.nan_count, s.posinf_count, s.neginf_count].map(count);
        if nonfinite != [0; 3] {
            self.t.nf_index.push(index);
            self.t.nf_counts.push(nonfinite);
        }
        self.push_sketch(t.sketch.as_deref().filter(|_| measured))?;
        self.push_capture(index, file.zip(t.capture_key.as_deref()));
        Ok(())
    }

    fn push_sketch(&mut self, sketch: Option<&[f64]>) -> Result<(), RecordsError> {
        self.t
            .sketch_values
            .extend_from_slice(sketch.unwrap_or(&[]));
        let end = u32::try_from(self.t.sketch_values.len())
            .map_err(|_| RecordsError::TooMany("sketch values"))?;
        self.t.sketch_start.push(end);
        Ok(())
    }

    /// The capture file (a path in the dump's directory) and key of tensor
    /// `index`, when its call was captured.
    fn push_capture(&mut self, index: u32, capture: Option<(&str, &str)>) {
        if capture.is_some() && !self.has_captures {
            self.has_captures = true;
            self.t.capture_file.resize(index as usize, NO_ID);
            self.t.capture_key.resize(index as usize, NO_ID);
        }
        if !self.has_captures {
            return;
        }
        let (file, key) = match capture {
            Some((f, k)) => (
                self.texts.intern(&self.dir.join(f).to_string_lossy()),
                self.texts.intern(k),
            ),
            None => (NO_ID, NO_ID),
        };
        self.t.capture_file.push(file);
        self.t.capture_key.push(key);
    }

    fn dtype_id(&mut self, name: &str) -> Result<u16, RecordsError> {
        if let Some(i) = self.dtypes.iter().position(|d| &*d.name == name) {
            return Ok(i as u16);
        }
        if self.dtypes.len() >= u16::MAX as usize {
            return Err(RecordsError::TooMany("distinct dtypes"));
        }
        self.dtypes.push(DType::parse(name));
        Ok((self.dtypes.len() - 1) as u16)
    }

    /// Puts the op columns in seq order (records of several devices
    /// interleave); tensors stay where they are, calls point at them.
    fn sort_by_seq(&mut self) -> Result<(), RecordsError> {
        if self.seq.windows(2).all(|w| w[0] < w[1]) {
            return Ok(());
        }
        let mut perm: Vec<u32> = (0..self.seq.len() as u32).collect();
        perm.sort_unstable_by_key(|&i| self.seq[i as usize]);
        fn apply<T: Copy>(v: &mut Vec<T>, perm: &[u32]) {
            *v = perm.iter().map(|&i| v[i as usize]).collect();
        }
        apply(&mut self.seq, &perm);
        if let Some(w) = self.seq.windows(2).find(|w| w[0] == w[1]) {
            return Err(RecordsError::DuplicateSeq(w[0]));
        }
        apply(&mut self.parent_seq, &perm);
        apply(&mut self.ops, &perm);
        apply(&mut self.op, &perm);
        apply(&mut self.overload, &perm);
        apply(&mut self.t_start, &perm);
        apply(&mut self.t_len, &perm);
        Ok(())
    }

    fn finish(mut self, path: PathBuf, rank: u32, pid: Option<i64>) -> Result<Dump, RecordsError> {
        let tree = call_tree(&self.seq, &self.parent_seq)
            .map_err(|l| RecordsError::AncestorLoop(l.seq))?;
        if self.t.sketch_values.is_empty() {
            // No tensor has a sketch: the loader reads a sketch column null
            // in every row as no column, and so does this.
            self.t.sketch_start = Vec::new();
        }
        Ok(Dump {
            path,
            rank,
            files: 0,
            pid,
            stats_accumulate: "float64".to_string(),
            skipped_other_pids: 0,
            schema_version: u32::MAX,
            has_modules: self.has_modules,
            captures: Box::new(NoCaptures),
            names: self.names,
            texts: self.texts,
            dtypes: self.dtypes,
            ops: Box::new(MemRows(self.ops)),
            parent: Parents::new(&tree.parent),
            calls: CallColumns::new(&self.op, &self.overload, &self.t_start, &self.t_len),
            child_start: PackedU32::new(&tree.child_start),
            children: PackedU32::new(&tree.children),
            roots: tree.roots,
            tensors: Tensors {
                rows: Box::new(MemRows(self.t_rows)),
                ..self.t
            },
        })
    }
}
