//! One rank of one dump, in memory, as flat columns.
//!
//! Op calls are indexed `0..n` in `seq` order; tensors are indexed in the
//! order they were read, and each op points at its contiguous run of tensors.
//! Strings, dtypes and shapes are interned. There is no per-row heap object:
//! a million op calls with three tensors each cost about 100 bytes per tensor
//! and 60 per op call.

use std::path::PathBuf;

use opdump_format::{Phase, Role, StatsStatus};

use crate::dtype::DType;
use crate::intern::{mix, Interner, ShapeInterner, NO_ID};

pub const NONE: u32 = u32::MAX;
/// A null seq (`fwd_seq` of a call outside backward).
pub const NO_SEQ: i64 = i64::MIN;

/// Per-tensor columns. Role, phase and status are the format crate's enums,
/// one byte each.
pub struct Tensors {
    /// `Input` or `Output`: the row of an op without tensors is no tensor.
    pub role: Vec<Role>,
    /// Id in [`Dump::names`].
    pub arg: Vec<u32>,
    /// -1 when null.
    pub list_index: Vec<i32>,
    /// Index into [`Dump::dtypes`].
    pub dtype: Vec<u16>,
    /// Id in `shapes` (which also holds the numel).
    pub shape: Vec<u32>,
    pub shapes: ShapeInterner,
    /// `None` when the file has no status, or one this reader does not
    /// know (a newer writer's): either way, no values to trust.
    pub status: Vec<Option<StatsStatus>>,
    pub min: Vec<f64>,
    pub max: Vec<f64>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub l2: Vec<f64>,
    pub absmax: Vec<f64>,
    /// NaN, +Inf and -Inf counts, stored only for tensors that have some
    /// (almost none do): `nf_index` is sorted, `nf_counts` parallel to it.
    pub nf_index: Vec<u32>,
    pub nf_counts: Vec<[i64; 3]>,
    pub zero: Vec<i64>,
    /// The `fingerprint` column (schema 4); empty when the dump has none.
    /// 0 means null.
    pub fingerprint: Vec<u64>,
    /// The `sketch` column (schema 4), back to back: tensor `t`'s sketch is
    /// `sketch_values[sketch_start[t]..sketch_start[t + 1]]`, empty where
    /// null, so a tensor without one costs one index. Both empty when the
    /// dump has none.
    pub sketch_start: Vec<u32>,
    pub sketch_values: Vec<f64>,
    /// Id in [`Dump::texts`] of the parameter or buffer the tensor is
    /// (`fc1.weight`, `fc1.weight.grad`); `NO_ID` when none or unknown.
    pub name: Vec<u32>,
    /// Ids in [`Dump::texts`] of the capture file (its path) and the key of
    /// the tensor in it (`OPDUMP_CAPTURE`); both empty when no call of the
    /// dump was captured, `NO_ID` for tensors without a capture.
    pub capture_file: Vec<u32>,
    pub capture_key: Vec<u32>,
}

impl Tensors {
    pub fn len(&self) -> usize {
        self.role.len()
    }

    pub fn is_empty(&self) -> bool {
        self.role.is_empty()
    }

    /// Whether the statistics columns hold measured values.
    pub fn has_values(&self, t: u32) -> bool {
        self.status[t as usize].is_some_and(|s| s.has_values())
    }

    pub fn numel(&self, t: u32) -> i64 {
        self.shapes.numel(self.shape[t as usize])
    }

    /// The L2 norm and the largest absolute value, each 0 where it
    /// overflowed to infinity (or is NaN).
    pub fn finite_norms(&self, t: u32) -> (f64, f64) {
        let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
        let i = t as usize;
        (finite(self.l2[i]), finite(self.absmax[i]))
    }

    /// The fingerprint of a tensor, when it has one.
    pub fn fingerprint(&self, t: u32) -> Option<u64> {
        self.fingerprint
            .get(t as usize)
            .copied()
            .filter(|&f| f != 0)
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

/// One rank of one dump.
pub struct Dump {
    /// The directory given on the command line.
    pub path: PathBuf,
    pub rank: u32,
    /// The files read, and the process they came from.
    pub files: usize,
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

    /// The capture files its tensors name, opened on first use.
    pub captures: crate::captures::CaptureCache,

    /// Op names, overloads and argument names.
    pub names: Interner,
    /// `args`, `error`, `module`, `source` and tensor `name` texts.
    pub texts: Interner,
    pub dtypes: Vec<DType>,

    // Op calls, in seq order.
    pub seq: Vec<i64>,
    /// Index of the parent op call, `NONE` for a root (depth 0, or a parent
    /// that is not in the dump).
    pub parent: Vec<u32>,
    pub depth: Vec<i32>,
    pub step: Vec<i64>,
    pub phase: Vec<Phase>,
    pub op: Vec<u32>,
    pub overload: Vec<u32>,
    pub args: Vec<u32>,
    /// `NO_ID` when the op did not raise.
    pub error: Vec<u32>,
    /// Id in `texts` of the innermost module running the call (its
    /// forward's, for a backward call); `NO_ID` outside any.
    pub module: Vec<u32>,
    /// Backward calls: the seq of the forward call that made the autograd
    /// node being run; [`NO_SEQ`] when null.
    pub fwd_seq: Vec<i64>,
    /// Id in `texts` of the user's source line (`OPDUMP_SOURCE=1`).
    pub source: Vec<u32>,
    pub t_start: Vec<u32>,
    pub t_len: Vec<u32>,
    /// Children of op `i`: `children[child_start[i]..child_start[i + 1]]`, in
    /// seq order.
    pub child_start: Vec<u32>,
    pub children: Vec<u32>,
    /// Op calls without a parent, in seq order.
    pub roots: Vec<u32>,

    pub tensors: Tensors,
}

impl Dump {
    pub fn len(&self) -> usize {
        self.seq.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }

    pub fn op_name(&self, i: u32) -> &str {
        self.names.get(self.op[i as usize])
    }

    pub fn overload_name(&self, i: u32) -> &str {
        self.names.get(self.overload[i as usize])
    }

    /// `aten::add.Tensor`; the unnamed overload prints without a suffix.
    pub fn full_name(&self, i: u32) -> String {
        let (op, ov) = (self.op_name(i), self.overload_name(i));
        if ov.is_empty() || ov == "default" {
            op.to_string()
        } else {
            format!("{op}.{ov}")
        }
    }

    pub fn args_text(&self, i: u32) -> &str {
        self.texts.get(self.args[i as usize])
    }

    pub fn error_text(&self, i: u32) -> Option<&str> {
        let e = self.error[i as usize];
        (e != NO_ID).then(|| self.texts.get(e))
    }

    /// The module path of the call, when the dump has one.
    pub fn module_of(&self, i: u32) -> Option<&str> {
        let m = self.module[i as usize];
        (m != NO_ID).then(|| self.texts.get(m))
    }

    pub fn source_of(&self, i: u32) -> Option<&str> {
        let s = self.source[i as usize];
        (s != NO_ID).then(|| self.texts.get(s))
    }

    /// The forward call's seq, for a backward call.
    pub fn fwd_seq_of(&self, i: u32) -> Option<i64> {
        let s = self.fwd_seq[i as usize];
        (s != NO_SEQ).then_some(s)
    }

    /// The forward call itself, when it is in the dump.
    pub fn fwd_of(&self, i: u32) -> Option<u32> {
        let s = self.fwd_seq_of(i)?;
        self.seq.binary_search(&s).ok().map(|k| k as u32)
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
        let n = *self.tensors.name.get(t as usize)?;
        (n != NO_ID).then(|| self.texts.get(n))
    }

    pub fn tensors_of(&self, i: u32) -> std::ops::Range<u32> {
        let s = self.t_start[i as usize];
        s..s + self.t_len[i as usize]
    }

    pub fn children_of(&self, i: u32) -> &[u32] {
        let (s, e) = (
            self.child_start[i as usize],
            self.child_start[i as usize + 1],
        );
        &self.children[s as usize..e as usize]
    }

    pub fn parent_of(&self, i: u32) -> Option<u32> {
        let p = self.parent[i as usize];
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

    pub fn dtype(&self, t: u32) -> &DType {
        &self.dtypes[self.tensors.dtype[t as usize] as usize]
    }

    pub fn shape(&self, t: u32) -> &[i64] {
        self.tensors.shapes.get(self.tensors.shape[t as usize])
    }

    pub fn arg_name(&self, t: u32) -> &str {
        self.names.get(self.tensors.arg[t as usize])
    }

    pub fn list_index(&self, t: u32) -> Option<i32> {
        let v = self.tensors.list_index[t as usize];
        (v >= 0).then_some(v)
    }

    /// The alignment signature of an op call: op, overload, and the role and
    /// shape of each tensor, but not dtypes (a bf16 run must align with an
    /// fp32 run). Equal across dumps for equal calls.
    pub fn signature(&self, i: u32) -> u64 {
        let mut h = self.name_signature(i);
        for t in self.tensors_of(i) {
            h = mix(h, self.tensors.role[t as usize] as u64);
            h = mix(h, self.tensors.shapes.hash(self.tensors.shape[t as usize]));
        }
        h
    }

    /// Op and overload only: the looser key used to pair calls whose shapes
    /// differ.
    pub fn name_signature(&self, i: u32) -> u64 {
        mix(
            self.names.hash(self.op[i as usize]),
            self.names.hash(self.overload[i as usize]),
        )
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
        let mut s: Vec<i64> = self.roots.iter().map(|&r| self.step[r as usize]).collect();
        s.sort_unstable();
        s.dedup();
        s
    }
}
