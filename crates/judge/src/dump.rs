//! One rank of one dump, as flat columns.
//!
//! Op calls are indexed `0..n` in `seq` order; tensors are indexed in the
//! order they were read, and each op points at its contiguous run of tensors.
//! Strings, dtypes and shapes are interned. What the call tree and alignment
//! walk all the time stays in memory (about 11 bytes per op call); the rest
//! of each call ([`OpRow`]) and every tensor ([`TensorRow`]) live in
//! [`Rows`], which a loader may keep out of memory.

use std::path::PathBuf;

use opdump_format::{Phase, Role};

use crate::calls::CallColumns;
use crate::captured::CapturedValues;
use crate::dtype::DType;
use crate::intern::{mix, Interner, ShapeInterner, NO_ID};
use crate::op_row::{OpRow, NO_SEQ};
use crate::packed::{PackedU32, Parents};
use crate::rows::{MemRows, Rows};
use crate::tensor_row::TensorRow;

/// No call: the parent of a root, the partner of an unaligned call.
pub const NONE: u32 = u32::MAX;

/// Per-tensor columns. The fixed-size ones are one [`TensorRow`] per
/// tensor, in [`Rows`] that a loader may keep out of memory (a dump's
/// tensors are most of its size); the sparse and variable-sized ones are
/// here.
pub struct Tensors {
    /// The fixed-size columns of each tensor.
    pub rows: Box<dyn Rows<TensorRow>>,
    /// The tensors' shapes, interned.
    pub shapes: ShapeInterner,
    /// NaN, +Inf and -Inf counts, stored only for tensors that have some
    /// (almost none do): `nf_index` is sorted, `nf_counts` parallel to it.
    pub nf_index: Vec<u32>,
    /// (NaN, +Inf, -Inf) counts of the tensors `nf_index` names.
    pub nf_counts: Vec<[i64; 3]>,
    /// Whether the dump has the `fingerprint` column (schema 4).
    pub has_fingerprints: bool,
    /// The `sketch` column (schema 4), back to back: tensor `t`'s sketch is
    /// `sketch_values[sketch_start[t]..sketch_start[t + 1]]`, empty where
    /// null, so a tensor without one costs one index. Both empty when the
    /// dump has none.
    pub sketch_start: Vec<u32>,
    /// The sketches, back to back (see `sketch_start`).
    pub sketch_values: Vec<f64>,
    /// Ids in [`Dump::texts`] of the capture file (its path) and the key of
    /// the tensor in it (`OPDUMP_CAPTURE`); both empty when no call of the
    /// dump was captured, `NO_ID` for tensors without a capture.
    pub capture_file: Vec<u32>,
    /// See `capture_file`: the tensor's key in its capture file.
    pub capture_key: Vec<u32>,
}

impl Default for Tensors {
    fn default() -> Self {
        Tensors {
            rows: Box::new(MemRows::<TensorRow>::default()),
            shapes: ShapeInterner::default(),
            nf_index: Vec::new(),
            nf_counts: Vec::new(),
            has_fingerprints: false,
            sketch_start: Vec::new(),
            sketch_values: Vec::new(),
            capture_file: Vec::new(),
            capture_key: Vec::new(),
        }
    }
}

impl Tensors {
    /// How many tensors there are.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Everything fixed-size about tensor `t`, in one read.
    pub fn row(&self, t: u32) -> TensorRow {
        self.rows.get(t as usize)
    }

    /// The rows of tensors `range` (an op call's), replacing what `out`
    /// held.
    pub fn rows_of(&self, range: std::ops::Range<u32>, out: &mut Vec<TensorRow>) {
        out.clear();
        self.rows
            .get_range(range.start as usize..range.end as usize, out);
    }

    /// Input, output, or no tensor (the row of an op without tensors).
    pub fn role(&self, t: u32) -> Role {
        self.row(t).role
    }

    /// Whether the statistics columns hold measured values.
    pub fn has_values(&self, t: u32) -> bool {
        self.row(t).has_values()
    }

    /// How many elements tensor `t` has.
    pub fn numel(&self, t: u32) -> i64 {
        self.shapes.numel(self.row(t).shape)
    }

    /// The L2 norm and the largest absolute value, each 0 where it
    /// overflowed to infinity (or is NaN).
    pub fn finite_norms(&self, t: u32) -> (f64, f64) {
        let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
        let r = self.row(t);
        (finite(r.l2), finite(r.absmax))
    }

    /// The fingerprint of a tensor, when it has one.
    pub fn fingerprint(&self, t: u32) -> Option<u64> {
        if !self.has_fingerprints {
            return None;
        }
        Some(self.row(t).fingerprint).filter(|&f| f != 0)
    }

    /// The sketch of a tensor, when it has one.
    pub fn sketch(&self, t: u32) -> Option<&[f64]> {
        let t = t as usize;
        let (s, e) = (*self.sketch_start.get(t)?, *self.sketch_start.get(t + 1)?);
        let v = self.sketch_values.get(s as usize..e as usize)?;
        (!v.is_empty()).then_some(v)
    }

    /// (NaN, +Inf, -Inf) counts.
    pub fn nonfinite_counts(&self, t: u32) -> [i64; 3] {
        match self.nf_index.binary_search(&t) {
            Ok(k) => self.nf_counts[k],
            Err(_) => [0; 3],
        }
    }

    /// Elements that are neither NaN nor infinite.
    pub fn finite_count(&self, t: u32) -> i64 {
        let [n, p, m] = self.nonfinite_counts(t);
        self.numel(t) - n - p - m
    }
}

/// An op and its overload as every report names them: `aten::add.Tensor`;
/// the unnamed overload (`default`, or empty) prints without a suffix.
pub fn full_op_name(op: &str, overload: &str) -> String {
    if overload.is_empty() || overload == "default" {
        op.to_string()
    } else {
        format!("{op}.{overload}")
    }
}

/// The start of a call's signature ([`Dump::signature`]): its op and
/// overload (ids in `names`), which is also [`Dump::name_signature`].
pub fn signature_start(names: &Interner, op: u32, overload: u32) -> u64 {
    mix(names.hash(op), names.hash(overload))
}

/// A call's signature `h` with one more of its tensors, in order: its role
/// and shape (an id in `shapes`).
#[inline]
pub fn signature_step(shapes: &ShapeInterner, h: u64, role: Role, shape: u32) -> u64 {
    mix(mix(h, role as u64), shapes.hash(shape))
}

/// One rank of one dump.
pub struct Dump {
    /// The directory given on the command line.
    pub path: PathBuf,
    /// The rank read.
    pub rank: u32,
    /// The files read, and the process they came from.
    pub files: usize,
    /// The process whose calls were kept, when the files say.
    pub pid: Option<i64>,
    /// `float32` when some device accumulated statistics in float32 (their
    /// own rounding then needs a tolerance), else `float64`.
    pub stats_accumulate: String,
    /// Op calls of other processes of the same rank, left out.
    pub skipped_other_pids: u64,
    /// The oldest schema version among the files read: below 2, the
    /// `module`, `fwd_seq`, `source` and `name` columns are null.
    pub schema_version: u32,
    /// Some op call has a `module` (the job ran `nn.Module`s with
    /// `OPDUMP_MODULES` on).
    pub has_modules: bool,

    /// The captured values its tensors name (see [`Dump::capture_of`]).
    pub captures: Box<dyn CapturedValues>,

    /// Op names, overloads and argument names.
    pub names: Interner,
    /// `args`, `error`, `module`, `source` and tensor `name` texts.
    pub texts: Interner,
    /// The dtypes named by the tensor rows.
    pub dtypes: Vec<DType>,

    // Op calls, in seq order.
    /// Everything about a call but its place in the tree and its tensors,
    /// kept out of memory (see [`OpRow`]).
    pub ops: Box<dyn Rows<OpRow>>,
    /// Index of the parent op call, `NONE` for a root (depth 0, or a parent
    /// that is not in the dump); packed, see [`Parents`].
    pub parent: Parents,
    /// Per call: the ids of its op's and overload's names in `names`, its
    /// first tensor and how many tensors it has (packed: see
    /// [`CallColumns`]).
    pub calls: CallColumns,
    /// Children of op `i`: `children[child_start[i]..child_start[i + 1]]`, in
    /// seq order (packed: both grow call by call).
    pub child_start: PackedU32,
    /// See `child_start`.
    pub children: PackedU32,
    /// Op calls without a parent, in seq order.
    pub roots: Vec<u32>,

    /// The tensors of every call.
    pub tensors: Tensors,
}

impl Dump {
    /// How many op calls there are.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    /// Everything about op call `i` but its tree and tensors, in one read.
    pub fn op_row(&self, i: u32) -> OpRow {
        self.ops.get(i as usize)
    }

    /// The seq of call `i`: its order of entry in the run.
    pub fn seq(&self, i: u32) -> i64 {
        self.op_row(i).seq
    }

    /// The training step of call `i`.
    pub fn step(&self, i: u32) -> i64 {
        self.op_row(i).step
    }

    /// Forward, backward or optimizer.
    pub fn phase(&self, i: u32) -> Phase {
        self.op_row(i).phase
    }

    /// How deep call `i` ran below other recorded calls (0: a root).
    pub fn depth(&self, i: u32) -> i32 {
        self.op_row(i).depth
    }

    /// The op call of seq `s`, when the dump has it (calls are in seq
    /// order).
    pub fn find_seq(&self, s: i64) -> Option<u32> {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.seq(mid as u32) < s {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo < self.len() && self.seq(lo as u32) == s).then_some(lo as u32)
    }

    /// The id of call `i`'s op name in `names`.
    pub fn op_id(&self, i: u32) -> u32 {
        self.calls.kind(i).0
    }

    /// The id of call `i`'s overload name in `names`.
    pub fn overload_id(&self, i: u32) -> u32 {
        self.calls.kind(i).1
    }

    /// `aten::add`.
    pub fn op_name(&self, i: u32) -> &str {
        self.names.get(self.op_id(i))
    }

    /// `Tensor`; empty for the unnamed overload.
    pub fn overload_name(&self, i: u32) -> &str {
        self.names.get(self.overload_id(i))
    }

    /// `aten::add.Tensor` (see [`full_op_name`]).
    pub fn full_name(&self, i: u32) -> String {
        full_op_name(self.op_name(i), self.overload_name(i))
    }

    /// The call's non-tensor arguments, as text.
    pub fn args_text(&self, i: u32) -> &str {
        self.texts.get(self.op_row(i).args)
    }

    /// What the op raised, when it did.
    pub fn error_text(&self, i: u32) -> Option<&str> {
        let e = self.op_row(i).error;
        (e != NO_ID).then(|| self.texts.get(e))
    }

    /// The module path of the call, when the dump has one.
    pub fn module_of(&self, i: u32) -> Option<&str> {
        let m = self.op_row(i).module;
        (m != NO_ID).then(|| self.texts.get(m))
    }

    /// The user's source line of the call (`OPDUMP_SOURCE=1`).
    pub fn source_of(&self, i: u32) -> Option<&str> {
        let s = self.op_row(i).source;
        (s != NO_ID).then(|| self.texts.get(s))
    }

    /// The forward call's seq, for a backward call.
    pub fn fwd_seq_of(&self, i: u32) -> Option<i64> {
        let s = self.op_row(i).fwd_seq;
        (s != NO_SEQ).then_some(s)
    }

    /// The forward call itself, when it is in the dump.
    pub fn fwd_of(&self, i: u32) -> Option<u32> {
        let s = self.fwd_seq_of(i)?;
        self.find_seq(s)
    }

    /// Where a tensor's captured values are: the capture file and the key
    /// in it.
    pub fn capture_of(&self, t: u32) -> Option<(&str, &str)> {
        let f = *self.tensors.capture_file.get(t as usize)?;
        let k = *self.tensors.capture_key.get(t as usize)?;
        (f != NO_ID && k != NO_ID).then(|| (self.texts.get(f), self.texts.get(k)))
    }

    /// The capture file of op call `i`, when it was captured.
    pub fn capture_file_of(&self, i: u32) -> Option<&str> {
        self.tensors_of(i)
            .find_map(|t| self.capture_of(t).map(|(f, _)| f))
    }

    /// Whether any call of the dump was captured.
    pub fn has_captures(&self) -> bool {
        !self.tensors.capture_file.is_empty()
    }

    /// The parameter, buffer or `.grad` name of a tensor.
    pub fn tensor_name(&self, t: u32) -> Option<&str> {
        if t as usize >= self.tensors.len() {
            return None;
        }
        let n = self.tensors.row(t).name;
        (n != NO_ID).then(|| self.texts.get(n))
    }

    /// The tensors of call `i`.
    pub fn tensors_of(&self, i: u32) -> std::ops::Range<u32> {
        let s = self.calls.t_start(i);
        s..s + self.calls.t_len(i)
    }

    /// The calls made by call `i`, in seq order.
    pub fn children_of(
        &self,
        i: u32,
    ) -> impl DoubleEndedIterator<Item = u32> + ExactSizeIterator + '_ {
        let (s, e) = (
            self.child_start.get(i as usize),
            self.child_start.get(i as usize + 1),
        );
        self.children.range(s as usize..e as usize)
    }

    /// The call that made call `i`, when it is in the dump.
    pub fn parent_of(&self, i: u32) -> Option<u32> {
        let p = self.parent.get(i);
        (p != NONE).then_some(p)
    }

    /// Ancestors of an op call, outermost first.
    pub fn ancestors(&self, i: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut cur = self.parent_of(i);
        while let Some(p) = cur {
            out.push(p);
            cur = self.parent_of(p);
        }
        out.reverse();
        out
    }

    /// The dtype of tensor `t`.
    pub fn dtype(&self, t: u32) -> &DType {
        self.dtype_of(&self.tensors.row(t))
    }

    /// The dtype of a row already read.
    pub fn dtype_of(&self, r: &TensorRow) -> &DType {
        &self.dtypes[r.dtype as usize]
    }

    /// The shape of tensor `t`.
    pub fn shape(&self, t: u32) -> &[i64] {
        self.tensors.shapes.get(self.tensors.row(t).shape)
    }

    /// The name of the argument tensor `t` was passed as (`self`, `other`).
    pub fn arg_name(&self, t: u32) -> &str {
        self.names.get(self.tensors.row(t).arg)
    }

    /// The index of tensor `t` in its argument, when that is a list.
    pub fn list_index(&self, t: u32) -> Option<i32> {
        let v = self.tensors.row(t).list_index;
        (v >= 0).then_some(v)
    }

    /// The alignment signature of an op call: op, overload, and the role and
    /// shape of each tensor, but not dtypes (a bf16 run must align with an
    /// fp32 run). Equal across dumps for equal calls. Folded when the dump
    /// was built (see [`OpRow::sig`]); [`Dump::signature_of_rows`] folds it
    /// again from the tensors.
    pub fn signature(&self, i: u32) -> u64 {
        self.op_row(i).sig
    }

    /// [`Dump::signature`] folded from the call's tensor rows, read through
    /// `rows` (a buffer reused across calls): what a dump's builder must
    /// have stored.
    pub fn signature_of_rows(&self, i: u32, rows: &mut Vec<TensorRow>) -> u64 {
        let (op, overload) = self.calls.kind(i);
        let mut h = signature_start(&self.names, op, overload);
        self.tensors.rows_of(self.tensors_of(i), rows);
        for r in rows.iter() {
            h = signature_step(&self.tensors.shapes, h, r.role, r.shape);
        }
        h
    }

    /// Op and overload only: the looser key used to pair calls whose shapes
    /// differ.
    pub fn name_signature(&self, i: u32) -> u64 {
        let (op, overload) = self.calls.kind(i);
        signature_start(&self.names, op, overload)
    }

    /// What a reader should know about a dump of an older schema: said
    /// once per dump, in the report's notes.
    pub fn schema_note(&self) -> Option<String> {
        (self.schema_version < 2).then(|| {
            format!(
                "{}: schema version {}, written before opdump recorded where in the model a call ran: no module, fwd_seq, source or name",
                self.path.display(),
                self.schema_version
            )
        })
    }

    /// Steps present among the roots, sorted.
    pub fn steps(&self) -> Vec<i64> {
        let mut s: Vec<i64> = self.roots.iter().map(|&r| self.step(r)).collect();
        s.sort_unstable();
        s.dedup();
        s
    }
}
