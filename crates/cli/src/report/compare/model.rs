//! The compare report as data: built once from a [`Compared`], then printed
//! as text, written as JSON (field names are a stable interface), or laid
//! out as HTML.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

use opdump_judge::compare::{Compared, Outcome, UnmatchedChange};
use opdump_judge::dump::{Dump, NONE};
use opdump_judge::exact::ExactMetrics;
use opdump_judge::intern::FxMap;
use opdump_judge::metrics::{Ctx, OpCmp, TensorCmp, CANCELLATION_FLOOR};
use opdump_judge::verdict::{OpVerdict, TensorVerdict};
use opdump_judge::Side;

/// Version of the JSON layout; bumped when a field changes meaning or goes.
pub const REPORT_VERSION: u32 = 1;

/// Non-finite numbers have no JSON form: they are written as `null`.
pub fn finite<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() {
        s.serialize_f64(*v)
    } else {
        s.serialize_none()
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct DumpInfo {
    pub path: String,
    pub rank: u32,
    pub pid: Option<i64>,
    pub files: usize,
    pub op_calls: u64,
    pub top_level_calls: u64,
    pub tensors: u64,
    pub step_first: Option<i64>,
    pub step_last: Option<i64>,
    pub step_count: usize,
    pub stats_accumulate: String,
}

impl DumpInfo {
    pub fn of(d: &Dump) -> Self {
        let steps = d.steps();
        DumpInfo {
            path: d.path.display().to_string(),
            rank: d.rank,
            pid: d.pid,
            files: d.files,
            op_calls: d.len() as u64,
            top_level_calls: d.roots.len() as u64,
            tensors: d.tensors.len() as u64,
            step_first: steps.first().copied(),
            step_last: steps.last().copied(),
            step_count: steps.len(),
            stats_accumulate: d.stats_accumulate.clone(),
        }
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct OptionsInfo {
    pub steps: Option<String>,
    pub ignore: Option<String>,
    /// `--rtol` overrides, by dtype.
    pub rtol: BTreeMap<String, f64>,
    pub min_amplification: f64,
    pub cancellation_floor: f64,
}

#[derive(Serialize, Clone, Debug)]
pub struct AlignedInfo {
    pub op_calls: u64,
    pub top_level_calls: u64,
    /// Pairs matched by op name only, because some shapes differ.
    pub shape_differs: u64,
    pub tensor_pairs: u64,
    /// Tensor pairs whose dtypes differ (reported, not a divergence).
    pub dtype_differs: u64,
    pub ignored_a: u64,
    pub ignored_b: u64,
}

#[derive(Serialize, Clone, Debug)]
pub struct OpCount {
    pub op: String,
    pub overload: String,
    pub count: u64,
}

#[derive(Serialize, Clone, Debug)]
pub struct OpBrief {
    pub op: String,
    pub overload: String,
    pub seq: i64,
    pub step: i64,
    pub phase: &'static str,
    pub depth: i32,
    pub parent_op: Option<String>,
    pub parent_seq: Option<i64>,
    /// The innermost module running the call; null outside any, or in a
    /// dump without module paths.
    pub module: Option<String>,
    /// Backward calls: the seq of their forward call.
    pub fwd_seq: Option<i64>,
    /// `file.py:123 in forward`, with `OPDUMP_SOURCE=1`.
    pub source: Option<String>,
}

impl OpBrief {
    pub fn of(d: &Dump, i: u32) -> Self {
        let p = d.parent_of(i);
        OpBrief {
            op: d.op_name(i).to_string(),
            overload: d.overload_name(i).to_string(),
            seq: d.seq(i),
            step: d.step(i),
            phase: d.phase(i).as_str(),
            depth: d.depth(i),
            parent_op: p.map(|p| d.full_name(p)),
            parent_seq: p.map(|p| d.seq(p)),
            module: d.module_of(i).map(str::to_string),
            fwd_seq: d.fwd_seq_of(i),
            source: d.source_of(i).map(str::to_string),
        }
    }
}

/// What exists on one side only.
#[derive(Serialize, Clone, Debug)]
pub struct OnlyIn {
    /// Op calls, subtrees included.
    pub op_calls: u64,
    /// Unmatched subtrees (each counted once, by its root).
    pub subtrees: u64,
    /// Of those, how many are top-level calls.
    pub top_level: u64,
    /// Steps present on this side only.
    pub steps: Vec<i64>,
    /// Subtree roots per op, most frequent first (at most 20).
    pub by_op: Vec<OpCount>,
    /// The first subtree roots in seq order (at most 20).
    pub first: Vec<OpBrief>,
}

pub const LIST_LIMIT: usize = 20;

fn only_in(d: &Dump, roots: &[u32], calls: u64, steps: &[i64]) -> OnlyIn {
    let mut counts: FxMap<(u32, u32), u64> = FxMap::default();
    for &r in roots {
        *counts.entry((d.op_id(r), d.overload_id(r))).or_default() += 1;
    }
    let mut by_op: Vec<OpCount> = counts
        .into_iter()
        .map(|((o, v), count)| OpCount {
            op: d.names.get(o).into(),
            overload: d.names.get(v).into(),
            count,
        })
        .collect();
    by_op.sort_by(|x, y| {
        y.count
            .cmp(&x.count)
            .then_with(|| (&x.op, &x.overload).cmp(&(&y.op, &y.overload)))
    });
    by_op.truncate(LIST_LIMIT);
    OnlyIn {
        op_calls: calls,
        subtrees: roots.len() as u64,
        top_level: roots.iter().filter(|&&r| d.parent.get(r) == NONE).count() as u64,
        steps: steps.to_vec(),
        by_op,
        first: roots
            .iter()
            .take(LIST_LIMIT)
            .map(|&r| OpBrief::of(d, r))
            .collect(),
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct OpRef {
    pub op: String,
    pub overload: String,
    pub seq: i64,
}

#[derive(Serialize, Clone, Debug)]
pub struct AncestorRef {
    pub op: String,
    pub overload: String,
    pub seq_a: i64,
    pub seq_b: Option<i64>,
    pub depth: i32,
}

#[derive(Serialize, Clone, Debug)]
pub struct StatsReport {
    pub status: Option<&'static str>,
    pub numel: i64,
    #[serde(serialize_with = "finite")]
    pub min: f64,
    #[serde(serialize_with = "finite")]
    pub max: f64,
    #[serde(serialize_with = "finite")]
    pub mean: f64,
    #[serde(serialize_with = "finite")]
    pub std: f64,
    #[serde(serialize_with = "finite")]
    pub l2: f64,
    #[serde(serialize_with = "finite")]
    pub absmax: f64,
    pub nan_count: i64,
    pub posinf_count: i64,
    pub neginf_count: i64,
    pub zero_count: i64,
    /// Whether the statistics hold measured values (else they are NaN).
    #[serde(skip)]
    pub has_values: bool,
}

impl StatsReport {
    pub fn of(d: &Dump, t: u32) -> Self {
        let x = &d.tensors;
        let r = x.row(t);
        let has = r.has_values();
        let v = |c: f64| if has { c } else { f64::NAN };
        StatsReport {
            status: r.status.map(|s| s.as_str()),
            numel: x.shapes.numel(r.shape),
            min: v(r.min),
            max: v(r.max),
            mean: v(r.mean),
            std: v(r.std),
            l2: v(r.l2),
            absmax: v(r.absmax),
            nan_count: x.nonfinite_counts(t)[0],
            posinf_count: x.nonfinite_counts(t)[1],
            neginf_count: x.nonfinite_counts(t)[2],
            zero_count: r.zero,
            has_values: has,
        }
    }
}

/// What the error sketches of a tensor pair say (both tensors have one of
/// the same length): the estimate of ||a-b||_2 next to the statistics'
/// bound.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct SketchReport {
    /// The sketch length K.
    pub k: usize,
    /// ||sketch_a - sketch_b|| / sqrt(K), never below `abs_bound`.
    #[serde(serialize_with = "finite")]
    pub est: f64,
    /// `est` relative as `rel_l2` is (over the same scale).
    #[serde(serialize_with = "finite")]
    pub rel: f64,
    /// The low end of `rel` the verdict trusts (its spread and the
    /// devices' accumulation noise taken off); part of `rel_err`.
    #[serde(serialize_with = "finite")]
    pub rel_low: f64,
}

impl SketchReport {
    fn of(t: &TensorCmp) -> Option<Self> {
        let rel = t.sketch_rel?;
        Some(SketchReport {
            k: t.measure.sketch_k,
            est: rel * t.scale_l2,
            rel,
            rel_low: t.sketch_low,
        })
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct TensorReport {
    pub role: &'static str,
    pub arg: String,
    pub list_index: Option<i32>,
    /// The parameter or buffer the tensor is (`fc1.weight`), or its
    /// `.grad`: A's, else B's.
    pub name: Option<String>,
    pub verdict: TensorVerdict,
    pub evidence: &'static str,
    pub dtype_a: Option<String>,
    pub dtype_b: Option<String>,
    pub shape_a: Option<Vec<i64>>,
    pub shape_b: Option<Vec<i64>>,
    pub a: Option<StatsReport>,
    pub b: Option<StatsReport>,
    /// Lower bound on ||a-b||_2 from the statistics.
    #[serde(serialize_with = "finite")]
    pub abs_bound: f64,
    /// Lower bound on ||a-b||_inf.
    #[serde(serialize_with = "finite")]
    pub linf_bound: f64,
    /// abs_bound / max(||a||_2, floor).
    #[serde(serialize_with = "finite")]
    pub rel_l2: f64,
    /// linf_bound / max(||a||_inf, floor).
    #[serde(serialize_with = "finite")]
    pub rel_linf: f64,
    /// max(rel_l2, rel_linf, sketch.rel_low): compared with `allowed`.
    #[serde(serialize_with = "finite")]
    pub rel_err: f64,
    /// What rounding in this op explains (dtype, reduction length).
    pub tolerance: f64,
    /// Outputs: `tolerance` + min_amplification x the error of inputs that
    /// had not diverged (accumulated rounding); inputs: `tolerance`.
    #[serde(serialize_with = "finite")]
    pub allowed: f64,
    /// Both dumps captured the tensor's values (OPDUMP_CAPTURE): the exact
    /// metrics (crates/cli/src/exact.rs), which replace the bounds above in
    /// the verdict.
    pub exact: Option<ExactMetrics>,
    /// Both dumps have error sketches of the tensor (schema 4).
    pub sketch: Option<SketchReport>,
}

impl TensorReport {
    pub fn of(c: &Compared, t: &TensorCmp) -> Self {
        let row = TensorRow::of(c, t);
        TensorReport {
            role: row.role,
            arg: row.arg.unwrap_or_default().to_string(),
            list_index: row.list_index,
            name: row.name.map(str::to_string),
            verdict: row.verdict,
            evidence: row.evidence,
            dtype_a: row.a.as_ref().map(|s| s.dtype.to_string()),
            dtype_b: row.b.as_ref().map(|s| s.dtype.to_string()),
            shape_a: row.a.as_ref().map(|s| s.shape.to_vec()),
            shape_b: row.b.as_ref().map(|s| s.shape.to_vec()),
            a: row.a.map(|s| s.stats),
            b: row.b.map(|s| s.stats),
            abs_bound: row.abs_bound,
            linf_bound: row.linf_bound,
            rel_l2: row.rel_l2,
            rel_linf: row.rel_linf,
            rel_err: row.rel_err,
            tolerance: row.tolerance,
            allowed: t.allowed,
            exact: row.exact,
            sketch: row.sketch,
        }
    }
}

/// One aligned op pair in full.
#[derive(Serialize, Clone, Debug)]
pub struct OpReport {
    /// The op, or for one element of a list call, the list call's
    /// (`aten::_foreach_lerp_`): the kernel judged.
    pub op: String,
    pub overload: String,
    /// The list element judged, when the pair is one element of a list
    /// call (`_foreach_`) against the other side's per-parameter call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub element: Option<ElementReport>,
    pub seq_a: i64,
    pub seq_b: i64,
    pub step_a: i64,
    pub step_b: i64,
    pub phase_a: &'static str,
    pub phase_b: &'static str,
    pub depth: i32,
    pub parent_a: Option<OpRef>,
    pub parent_b: Option<OpRef>,
    pub args_a: String,
    pub args_b: String,
    /// Outermost first; the op itself is not included.
    pub ancestors: Vec<AncestorRef>,
    /// The innermost module running the call (for a backward call, its
    /// forward call's): A's, else B's.
    pub module: Option<String>,
    /// B's, where it differs from A's.
    pub module_b: Option<String>,
    /// Backward calls: the forward call whose autograd node ran them.
    pub fwd_seq: Option<i64>,
    pub fwd_seq_b: Option<i64>,
    /// That forward call's `op.overload` and module (A's dump).
    pub fwd_op: Option<String>,
    pub fwd_module: Option<String>,
    /// The parameter, buffer and `.grad` names among the call's tensors, in
    /// tensor order.
    pub names: Vec<String>,
    /// The user's source line (`OPDUMP_SOURCE=1`): A's, else B's.
    pub source: Option<String>,
    pub verdict: OpVerdict,
    pub op_class: &'static str,
    pub compute_dtype: Option<String>,
    /// Estimated number of elements each output element is reduced from.
    pub reduction_length: f64,
    /// Largest relative error of an output (null when infinite: NaN/Inf
    /// counts or shapes differ).
    #[serde(serialize_with = "finite")]
    pub rel_err: f64,
    pub tolerance: f64,
    /// Largest relative error of an input.
    #[serde(serialize_with = "finite")]
    pub input_rel_err: f64,
    /// Largest relative error of an input whose producer had not diverged
    /// (accumulated rounding), and of one whose producer had.
    #[serde(serialize_with = "finite")]
    pub explained_input_err: f64,
    #[serde(serialize_with = "finite")]
    pub diverged_input_err: f64,
    /// rel_err / max(input_rel_err, unit roundoff of the compute dtype).
    #[serde(serialize_with = "finite")]
    pub amplification: f64,
    /// Paired by op name while some shapes differ.
    pub shapes_differ: bool,
    pub tensors: Vec<TensorReport>,
}

/// One element of a list call: its position and the parameter it is.
#[derive(Serialize, Clone, Debug)]
pub struct ElementReport {
    /// Which side's call is the list call: `a` or `b`.
    pub side: &'static str,
    pub index: u32,
    /// The parameter, where some call of the step names it.
    pub param: Option<String>,
}

impl ElementReport {
    fn of(e: &opdump_judge::Element) -> Self {
        ElementReport {
            side: if e.side == Side::A { "a" } else { "b" },
            index: e.index,
            param: e.param.clone(),
        }
    }

    /// `element 3, blocks.0.ln1.bias`.
    pub fn describe(&self) -> String {
        match &self.param {
            Some(p) => format!("element {}, {p}", self.index),
            None => format!("element {}", self.index),
        }
    }
}

/// The kernel pair `pair` judges, as `(op, overload)`: A's call, or for one
/// element of a list call, the list call (whichever side made it).
pub fn kernel_of(c: &Compared, pair: usize) -> (&str, &str, Option<opdump_judge::Element>) {
    let p = c.alignment.pairs[pair];
    match c.alignment.element(pair) {
        Some(e) => {
            let d = if e.side == Side::A { &c.a } else { &c.b };
            (d.op_name(e.call), d.overload_name(e.call), Some(e))
        }
        None => (c.a.op_name(p.a), c.a.overload_name(p.a), None),
    }
}

impl OpReport {
    /// The op as reports name it: `aten::gelu`, or for a list element
    /// `aten::_foreach_lerp_ (element 3, blocks.0.ln1.bias)`.
    pub fn label(&self) -> String {
        let op = crate::app::text::op_label(&self.op, &self.overload);
        match &self.element {
            Some(e) => format!("{op} ({})", crate::app::text::clean(&e.describe())),
            None => op,
        }
    }

    pub fn of(c: &Compared, pair: usize) -> Self {
        let p = c.alignment.pairs[pair];
        let cmp: OpCmp = c.detail(pair);
        let (a, b) = (&c.a, &c.b);
        let (ia, ib) = (p.a, p.b);
        let ancestors = ancestor_refs(c, ia);
        let (ma, mb) = (a.module_of(ia), b.module_of(ib));
        let fwd = a.fwd_of(ia);
        let names = tensor_names(c, &cmp);
        OpReport {
            module: ma.or(mb).map(str::to_string),
            module_b: mb
                .filter(|&m| ma.is_some_and(|x| x != m))
                .map(str::to_string),
            fwd_seq: a.fwd_seq_of(ia),
            fwd_seq_b: b.fwd_seq_of(ib),
            fwd_op: fwd.map(|f| a.full_name(f)),
            fwd_module: fwd.and_then(|f| a.module_of(f)).map(str::to_string),
            names,
            source: a
                .source_of(ia)
                .or_else(|| b.source_of(ib))
                .map(str::to_string),
            op: kernel_of(c, pair).0.into(),
            overload: kernel_of(c, pair).1.into(),
            element: kernel_of(c, pair).2.as_ref().map(ElementReport::of),
            seq_a: a.seq(ia),
            seq_b: b.seq(ib),
            step_a: a.step(ia),
            step_b: b.step(ib),
            phase_a: a.phase(ia).as_str(),
            phase_b: b.phase(ib).as_str(),
            depth: a.depth(ia),
            parent_a: a.parent_of(ia).map(|i| OpRef::of(a, i)),
            parent_b: b.parent_of(ib).map(|i| OpRef::of(b, i)),
            args_a: a.args_text(ia).into(),
            args_b: b.args_text(ib).into(),
            ancestors,
            // The final verdict (a nested divergence may have been found
            // absorbed by its parent after the pass).
            verdict: c.op_verdict(pair),
            op_class: cmp.class.map_or("plain", |k| k.as_str()),
            compute_dtype: cmp.compute_dtype.as_ref().map(|d| d.name.to_string()),
            reduction_length: cmp.k,
            rel_err: cmp.out_err,
            tolerance: cmp.tolerance,
            input_rel_err: cmp.in_err,
            explained_input_err: cmp.explained_in_err,
            diverged_input_err: cmp.diverged_in_err,
            amplification: cmp.amplification,
            shapes_differ: p.loose(),
            tensors: cmp.tensors.iter().map(|t| TensorReport::of(c, t)).collect(),
        }
    }
}

impl OpRef {
    fn of(d: &Dump, i: u32) -> Self {
        OpRef {
            op: d.op_name(i).into(),
            overload: d.overload_name(i).into(),
            seq: d.seq(i),
        }
    }
}

/// A's call `ia`'s ancestors, outermost first, with their seq in B.
fn ancestor_refs(c: &Compared, ia: u32) -> Vec<AncestorRef> {
    let (a, b) = (&c.a, &c.b);
    a.ancestors(ia)
        .into_iter()
        .map(|x| {
            let m = c.alignment.a_match[x as usize];
            AncestorRef {
                op: a.op_name(x).into(),
                overload: a.overload_name(x).into(),
                seq_a: a.seq(x),
                seq_b: (m != NONE).then(|| b.seq(m)),
                depth: a.depth(x),
            }
        })
        .collect()
}

/// The names of a call's tensors (parameters, buffers), each once.
fn tensor_names(c: &Compared, cmp: &OpCmp) -> Vec<String> {
    let (a, b) = (&c.a, &c.b);
    let mut names: Vec<String> = Vec::new();
    for t in &cmp.tensors {
        let n =
            t.ta.and_then(|x| a.tensor_name(x))
                .or_else(|| t.tb.and_then(|x| b.tensor_name(x)));
        if let Some(n) = n {
            if !names.iter().any(|m| m == n) {
                names.push(n.to_string());
            }
        }
    }
    names
}

/// The aligned op that consumed a tensor changed by calls only in B.
#[derive(Serialize, Clone, Debug)]
pub struct ConsumerRef {
    pub op: String,
    pub overload: String,
    pub seq_a: i64,
    pub seq_b: i64,
    pub step_a: i64,
    /// The consumed tensor's argument.
    pub arg: String,
}

/// A divergence introduced by calls only in B (JSON
/// `first_introduced_unmatched`): B changed a tensor between its aligned
/// producer and an aligned consumer, where A passed it on unchanged.
#[derive(Serialize, Clone, Debug)]
pub struct UnmatchedReport {
    /// `"b"`: the side whose own calls changed the values.
    pub side: &'static str,
    /// The op only in B that made the changed tensor; `null` when no
    /// unmatched call has an output with its statistics.
    pub op: Option<OpBrief>,
    pub args: Option<String>,
    /// Lower bound on the change, relative to the tensor as produced.
    #[serde(serialize_with = "finite")]
    pub rel_change: f64,
    pub tolerance: f64,
    pub consumer: ConsumerRef,
    /// B's tensor as its aligned producer made it, and as consumed.
    pub before: StatsReport,
    pub after: StatsReport,
}

impl UnmatchedReport {
    pub fn of(c: &Compared, ch: &UnmatchedChange) -> Self {
        let (a, b) = (&c.a, &c.b);
        let p = c.alignment.pairs[ch.pair];
        UnmatchedReport {
            side: "b",
            op: ch.b_op.map(|i| OpBrief::of(b, i)),
            args: ch.b_op.map(|i| b.args_text(i).to_string()),
            rel_change: ch.rel_change,
            tolerance: ch.tolerance,
            consumer: ConsumerRef {
                op: a.op_name(p.a).to_string(),
                overload: a.overload_name(p.a).to_string(),
                seq_a: a.seq(p.a),
                seq_b: b.seq(p.b),
                step_a: a.step(p.a),
                arg: b.arg_name(ch.after).to_string(),
            },
            before: StatsReport::of(b, ch.before),
            after: StatsReport::of(b, ch.after),
        }
    }
}

/// Where a divergence with no op to blame came from (JSON
/// `drift_source`): a parameter the previous step's optimizer changed,
/// first read where the first divergence is.
#[derive(Serialize, Clone, Debug)]
pub struct DriftSourceReport {
    /// The parameter (`blocks.0.ln1.bias`).
    pub parameter: String,
    /// The step whose optimizer changed it.
    pub optimizer_step: i64,
    /// The aligned op that first read it in the next step, and the
    /// argument it read it as.
    pub read_by: ConsumerRef,
    /// That step's optimizer calls only in A, and only in B, by op.
    pub only_in_a: Vec<OpCount>,
    pub only_in_b: Vec<OpCount>,
    /// `"a"` or `"b"` when only that side's optimizer makes calls the
    /// other lacks; null when both (or neither) do.
    pub unmatched_side: Option<&'static str>,
}

impl DriftSourceReport {
    fn of(c: &Compared, d: &opdump_judge::drift::DriftSource) -> Self {
        let (a, b) = (&c.a, &c.b);
        let p = c.alignment.pairs[d.pair];
        let counts = |v: &[(String, String, u64)]| {
            v.iter()
                .map(|(op, overload, count)| OpCount {
                    op: op.clone(),
                    overload: overload.clone(),
                    count: *count,
                })
                .collect()
        };
        DriftSourceReport {
            parameter: d.name.clone(),
            optimizer_step: d.step,
            read_by: ConsumerRef {
                op: a.op_name(p.a).to_string(),
                overload: a.overload_name(p.a).to_string(),
                seq_a: a.seq(p.a),
                seq_b: b.seq(p.b),
                step_a: a.step(p.a),
                arg: a.arg_name(d.tensor).to_string(),
            },
            only_in_a: counts(&d.only_a),
            only_in_b: counts(&d.only_b),
            unmatched_side: d.unmatched_side().map(|s| if s == "A" { "a" } else { "b" }),
        }
    }

    /// The optimizer calls one side only makes, as a sentence's tail:
    /// `only in B: aten::_foreach_lerp_.Scalar x1, ...` (at most 12 ops a
    /// side, in call order), or `no optimizer calls only on one side`.
    pub fn unmatched_calls(&self) -> String {
        let side = |name: &str, v: &[OpCount]| {
            (!v.is_empty()).then(|| {
                let mut ops: Vec<String> = v
                    .iter()
                    .take(12)
                    .map(|c| {
                        format!(
                            "{} x{}",
                            crate::app::text::op_label(&c.op, &c.overload),
                            c.count
                        )
                    })
                    .collect();
                if v.len() > 12 {
                    ops.push("...".into());
                }
                format!("only in {name}: {}", ops.join(", "))
            })
        };
        let parts: Vec<String> = [side("A", &self.only_in_a), side("B", &self.only_in_b)]
            .into_iter()
            .flatten()
            .collect();
        if parts.is_empty() {
            "no optimizer calls only on one side".into()
        } else {
            parts.join("; ")
        }
    }
}

/// Unmatched subtrees before the first divergence, per side (JSON
/// `unmatched_upstream`).
#[derive(Serialize, Clone, Copy, Debug)]
pub struct UnmatchedUpstream {
    pub a: u64,
    pub b: u64,
}

impl UnmatchedUpstream {
    /// `calls only in A`, `... only in B`, `... only in A or B`, or `None`
    /// when both sides made the same calls up to the first divergence.
    pub fn phrase(&self) -> Option<&'static str> {
        match (self.a > 0, self.b > 0) {
            (true, true) => Some("calls only in A or B"),
            (true, false) => Some("calls only in A"),
            (false, true) => Some("calls only in B"),
            (false, false) => None,
        }
    }
}

/// The whole compare report.
#[derive(Serialize, Clone, Debug)]
pub struct CompareReport {
    pub format: &'static str,
    pub version: u32,
    pub dump_a: DumpInfo,
    pub dump_b: DumpInfo,
    pub options: OptionsInfo,
    pub aligned: AlignedInfo,
    pub only_in_a: OnlyIn,
    pub only_in_b: OnlyIn,
    /// Tensor pairs per verdict.
    pub tensor_verdicts: BTreeMap<&'static str, u64>,
    /// Aligned op calls per verdict.
    pub op_verdicts: BTreeMap<&'static str, u64>,
    /// Some aligned op's outputs diverged.
    pub divergence: bool,
    /// 0: the runs agree; 1: an op introduced a divergence; 3: outputs
    /// diverged but no op introduced it (see the README's exit statuses).
    pub exit_status: u8,
    /// What `exit_status` says (its name is the fleet report's verdict).
    #[serde(skip)]
    pub outcome: Outcome,
    /// The first op call, in A's call order, whose outputs diverge.
    pub first_divergence: Option<OpReport>,
    /// The deepest op that introduced an error, inside the first introduced
    /// subtree.
    pub first_introduced: Option<OpReport>,
    /// The op the verdict names: `first_introduced`, unless a later
    /// introduced op amplifies 100 times more (`headline_rule`).
    pub headline: Option<OpReport>,
    /// Why `headline` was chosen: `"first"` or `"dominant"`.
    pub headline_rule: Option<&'static str>,
    /// Set instead, when calls only in B introduced the divergence before
    /// any aligned op did.
    pub first_introduced_unmatched: Option<UnmatchedReport>,
    /// When the first divergence is a parameter's first read in a step:
    /// the previous step's optimizer changed it.
    pub drift_source: Option<DriftSourceReport>,
    /// Calls one side only makes before the first divergence.
    pub unmatched_upstream: UnmatchedUpstream,
    /// Introduced ops without an introduced descendant, by amplification.
    pub top_introduced: Vec<OpReport>,
    /// How to get the first introduced call's tensors and reproduce it.
    pub next: Option<NextStep>,
    pub notes: Vec<String>,
}

/// The next command after a divergence: capture the first introduced call
/// in each run (`OPDUMP_CAPTURE`), then `opdump repro`.
#[derive(Serialize, Clone, Debug)]
pub struct NextStep {
    pub op: String,
    pub seq_a: i64,
    pub seq_b: i64,
    /// The `OPDUMP_CAPTURE` value that names the call in A's run, and in B's.
    pub capture_a: String,
    pub capture_b: String,
    /// Both dumps hold the call's tensors already: `repro` runs on them.
    pub captured: bool,
    /// The command to run (on new dumps made with the captures, unless
    /// `captured`).
    pub repro: String,
}

impl NextStep {
    fn of(c: &Compared, pair: usize) -> Self {
        let p = c.alignment.pairs[pair];
        let sa = crate::app::call_selector::of_call(&c.a, p.a);
        let sb = crate::app::call_selector::of_call(&c.b, p.b);
        let both = c.a.capture_file_of(p.a).is_some() && c.b.capture_file_of(p.b).is_some();
        let quote = |path: &std::path::Path| {
            let s = path.display().to_string();
            if s.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "/._-=".contains(ch))
            {
                s
            } else {
                format!("'{}'", s.replace('\'', "'\\''"))
            }
        };
        let (op, overload, element) = kernel_of(c, pair);
        let op = opdump_judge::full_op_name(op, overload);
        NextStep {
            op: match element {
                Some(e) => format!("{op} ({})", e.describe()),
                None => op,
            },
            seq_a: c.a.seq(p.a),
            seq_b: c.b.seq(p.b),
            capture_a: sa.to_string(),
            capture_b: sb.to_string(),
            captured: both,
            repro: if both {
                format!(
                    "opdump repro {} {} --call '{sa}'",
                    quote(&c.a.path),
                    quote(&c.b.path)
                )
            } else {
                format!("opdump repro <dump A with the capture> <dump B with the capture> --call '{sa}'")
            },
        }
    }
}

impl CompareReport {
    pub fn build(c: &Compared, steps: Option<String>, ignore: Option<String>) -> Self {
        let al = &c.alignment;
        let aligned_roots = al
            .pairs
            .iter()
            .filter(|p| c.a.parent.get(p.a) == NONE)
            .count() as u64;
        CompareReport {
            format: "opdump-compare",
            version: REPORT_VERSION,
            dump_a: DumpInfo::of(&c.a),
            dump_b: DumpInfo::of(&c.b),
            options: OptionsInfo {
                steps,
                ignore,
                rtol: c.tol.overrides.iter().cloned().collect(),
                min_amplification: c.tol.min_amplification,
                cancellation_floor: CANCELLATION_FLOOR,
            },
            aligned: AlignedInfo {
                op_calls: al.pairs.len() as u64,
                top_level_calls: aligned_roots,
                shape_differs: al.pairs.iter().filter(|p| p.loose()).count() as u64,
                tensor_pairs: c.tensor_pairs,
                dtype_differs: c.dtype_differs,
                ignored_a: al.ignored_a,
                ignored_b: al.ignored_b,
            },
            only_in_a: only_in(&c.a, &al.only_a, al.only_a_calls, &al.steps_only_a),
            only_in_b: only_in(&c.b, &al.only_b, al.only_b_calls, &al.steps_only_b),
            tensor_verdicts: TensorVerdict::ALL
                .iter()
                .map(|v| (v.as_str(), c.tensor_counts[*v as usize]))
                .collect(),
            op_verdicts: OpVerdict::ALL
                .iter()
                .map(|v| (v.as_str(), c.op_counts[*v as usize]))
                .collect(),
            divergence: c.divergence_found(),
            outcome: c.outcome(),
            exit_status: c.outcome().exit_status(),
            first_divergence: c.first_divergence.map(|k| OpReport::of(c, k)),
            first_introduced: c.first_introduced.map(|k| OpReport::of(c, k)),
            headline: c.headline.map(|k| OpReport::of(c, k)),
            headline_rule: c.headline.map(|k| {
                if Some(k) == c.first_introduced {
                    "first"
                } else {
                    "dominant"
                }
            }),
            first_introduced_unmatched: c
                .first_unmatched_change
                .as_ref()
                .map(|ch| UnmatchedReport::of(c, ch)),
            drift_source: c.drift_source.as_ref().map(|d| DriftSourceReport::of(c, d)),
            unmatched_upstream: UnmatchedUpstream {
                a: c.unmatched_upstream[0],
                b: c.unmatched_upstream[1],
            },
            top_introduced: c
                .top_introduced
                .iter()
                .map(|&k| OpReport::of(c, k))
                .collect(),
            next: c.first_introduced.map(|k| NextStep::of(c, k)),
            notes: c.notes.clone(),
        }
    }
}

/// Every aligned pair in A's call order, for the reports that show them all
/// (the HTML plot, the Parquet table). Built once from a [`Compared`]; it
/// borrows, and measures a pair's tensors again only when asked
/// ([`PairDetails`]): a million pairs cost no copy.
pub struct AlignedPairs<'a> {
    c: &'a Compared,
}

/// What names a pair in a tooltip.
pub struct PairLabel<'a> {
    /// `aten::add.Tensor`.
    pub name: String,
    pub seq_a: i64,
    pub seq_b: i64,
    /// A's module path, when the dump has one.
    pub module: Option<&'a str>,
}

impl<'a> AlignedPairs<'a> {
    pub fn of(c: &'a Compared) -> Self {
        AlignedPairs { c }
    }

    pub fn len(&self) -> usize {
        self.c.alignment.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rank compared (A's; B's may differ).
    pub fn rank(&self) -> u32 {
        self.c.a.rank
    }

    /// The final verdict of pair `k`.
    pub fn verdict(&self, k: usize) -> OpVerdict {
        self.c.op_verdict(k)
    }

    /// The largest relative error of an output of pair `k`, as the main
    /// pass kept it (in f32).
    pub fn out_err(&self, k: usize) -> f64 {
        self.c.out_err[k] as f64
    }

    fn a_index(&self, k: usize) -> usize {
        self.c.alignment.pairs[k].a as usize
    }

    pub fn step_a(&self, k: usize) -> i64 {
        self.c.a.step(self.a_index(k) as u32)
    }

    /// Whether pair `k` is a top-level call (in A).
    pub fn is_top_level(&self, k: usize) -> bool {
        self.c.a.parent.get(self.a_index(k) as u32) == NONE
    }

    pub fn label(&self, k: usize) -> PairLabel<'a> {
        let p = self.c.alignment.pairs[k];
        let (op, overload, element) = kernel_of(self.c, k);
        let name = opdump_judge::full_op_name(op, overload);
        PairLabel {
            module: self.c.a.module_of(p.a),
            name: match element {
                Some(e) => format!("{name} ({})", e.describe()),
                None => name,
            },
            seq_a: self.c.a.seq(p.a),
            seq_b: self.c.b.seq(p.b),
        }
    }

    /// Pair of the first divergence (see [`CompareReport::first_divergence`]).
    pub fn first_divergence(&self) -> Option<usize> {
        self.c.first_divergence
    }

    /// Pair of the headline (see [`CompareReport::headline`]).
    pub fn headline(&self) -> Option<usize> {
        self.c.headline
    }

    /// Pair of the first introduced op in call order.
    pub fn first_introduced(&self) -> Option<usize> {
        self.c.first_introduced
    }

    /// A reader of the pairs in full, one at a time.
    pub fn details(&self) -> PairDetails<'a> {
        PairDetails {
            c: self.c,
            ctx: self.c.ctx(),
            cmp: OpCmp::default(),
        }
    }
}

/// The pairs in full, one at a time: [`PairDetails::load`] measures a pair
/// again (with the verdicts of the main pass), [`PairDetails::tensors`]
/// reads its tensor pairs. Buffers are reused from pair to pair.
pub struct PairDetails<'a> {
    c: &'a Compared,
    ctx: Ctx<'a>,
    cmp: OpCmp,
}

/// An aligned op pair, as each of its tensor rows repeats it.
pub struct OpRow<'a> {
    pub seq_a: i64,
    pub seq_b: i64,
    pub step_a: i64,
    pub step_b: i64,
    /// A's.
    pub phase: &'static str,
    pub depth: i32,
    pub op: &'a str,
    pub overload: &'a str,
    pub verdict: OpVerdict,
    /// As in [`OpReport`].
    pub rel_err: f64,
    pub amplification: f64,
    /// The largest output error over what was allowed for it (as
    /// [`opdump_judge::metrics::OpCmp::excess`]): above 1 for a diverged output.
    pub excess: f64,
    pub shapes_differ: bool,
    pub module_a: Option<&'a str>,
    pub module_b: Option<&'a str>,
    pub fwd_seq_a: Option<i64>,
    pub fwd_seq_b: Option<i64>,
}

/// One side of a tensor pair.
pub struct TensorSide<'a> {
    pub name: Option<&'a str>,
    pub dtype: &'a str,
    pub shape: &'a [i64],
    pub stats: StatsReport,
}

/// A tensor pair, as [`TensorReport`] has it, with borrowed names.
pub struct TensorRow<'a> {
    pub role: &'static str,
    /// The argument name, from A, else from B.
    pub arg: Option<&'a str>,
    pub list_index: Option<i32>,
    /// The parameter name, from A, else from B.
    pub name: Option<&'a str>,
    pub verdict: TensorVerdict,
    pub evidence: &'static str,
    pub a: Option<TensorSide<'a>>,
    pub b: Option<TensorSide<'a>>,
    pub abs_bound: f64,
    pub linf_bound: f64,
    pub rel_l2: f64,
    pub rel_linf: f64,
    pub rel_err: f64,
    pub tolerance: f64,
    /// Both sides captured: the exact metrics.
    pub exact: Option<ExactMetrics>,
    /// Both sides have a sketch: its estimate.
    pub sketch: Option<SketchReport>,
}

impl<'a> TensorRow<'a> {
    fn of(c: &'a Compared, t: &TensorCmp) -> Self {
        let (a, b) = (&c.a, &c.b);
        let side = |d: &'a Dump, x: u32| TensorSide {
            name: d.tensor_name(x),
            dtype: &d.dtype(x).name,
            shape: d.shape(x),
            stats: StatsReport::of(d, x),
        };
        TensorRow {
            role: t.role.as_str(),
            arg: t
                .ta
                .map(|x| a.arg_name(x))
                .or_else(|| t.tb.map(|x| b.arg_name(x))),
            list_index: t
                .ta
                .and_then(|x| a.list_index(x))
                .or_else(|| t.tb.and_then(|x| b.list_index(x))),
            name: t
                .ta
                .and_then(|x| a.tensor_name(x))
                .or_else(|| t.tb.and_then(|x| b.tensor_name(x))),
            verdict: t.verdict,
            evidence: t.evidence,
            a: t.ta.map(|x| side(a, x)),
            b: t.tb.map(|x| side(b, x)),
            abs_bound: t.measure.l2_bound,
            linf_bound: t.measure.linf_bound,
            rel_l2: t.rel_l2,
            rel_linf: t.rel_linf,
            rel_err: t.rel_err,
            tolerance: t.tolerance,
            exact: match (t.measure.exact, t.ta, t.tb) {
                (true, Some(x), Some(y)) => {
                    opdump_judge::exact::exact_metrics(a, x, b, y, t.tolerance)
                }
                _ => None,
            },
            sketch: SketchReport::of(t),
        }
    }
}

impl<'a> PairDetails<'a> {
    /// Measures pair `k` and returns it; its tensor pairs follow from
    /// [`PairDetails::tensors`].
    pub fn load(&mut self, k: usize) -> OpRow<'a> {
        let c = self.c;
        c.detail_into(k, &self.ctx, &mut self.cmp);
        let p = c.alignment.pairs[k];
        let (a, b) = (&c.a, &c.b);
        let (ia, ib) = (p.a as usize, p.b as usize);
        OpRow {
            seq_a: a.seq(ia as u32),
            seq_b: b.seq(ib as u32),
            step_a: a.step(ia as u32),
            step_b: b.step(ib as u32),
            phase: a.phase(ia as u32).as_str(),
            depth: a.depth(ia as u32),
            op: kernel_of(c, k).0,
            overload: kernel_of(c, k).1,
            verdict: c.op_verdict(k),
            rel_err: self.cmp.out_err,
            amplification: self.cmp.amplification,
            excess: self.cmp.excess,
            shapes_differ: p.loose(),
            module_a: a.module_of(p.a),
            module_b: b.module_of(p.b),
            fwd_seq_a: a.fwd_seq_of(p.a),
            fwd_seq_b: b.fwd_seq_of(p.b),
        }
    }

    /// The tensor pairs of the pair loaded last.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRow<'a>> + '_ {
        let c = self.c;
        self.cmp.tensors.iter().map(move |t| TensorRow::of(c, t))
    }
}
