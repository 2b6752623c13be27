//! Comparing one aligned pair of op calls: its tensors paired up and
//! measured, its tolerance, and its verdict.
//!
//! This is a pure function of the two dumps, cheap enough to run on every
//! pair once (keeping only a few numbers per op) and again for the handful
//! of ops a report shows in full.

use std::sync::{Arc, Mutex};

use opdump_format::Role;

use crate::align::fused::FusedTensors;
use crate::align::Pair;
use crate::dtype::DType;
use crate::dump::Dump;
use crate::evidence::{Evidence, Measure, Row};
use crate::intern::FxMap;
use crate::list_call::{pair_by_position, Layout};
use crate::opclass::{
    args_make_discontinuous, args_may_make_discontinuous, base_name, classify, has_gradient_terms,
    is_factor, is_gradient_arg, is_lerp, is_product, OpClass,
};
use crate::provenance::{pair_key, side_hash_of_row};
use crate::refusal::Side;
use crate::tensor_row::TensorRow;
use crate::tolerance::Tolerances;
use crate::verdict::{amplification, op_verdict, OpErrors, OpVerdict, TensorVerdict};

/// An output this much smaller than its inputs (in RMS) is measured against
/// the inputs' scale instead: `a - b` of nearly equal tensors has a tiny
/// norm, and its rounding error is relative to `a` and `b`, not to the
/// result. Without this floor, catastrophic cancellation would read as a
/// huge relative error. Linear reductions have a larger floor, see
/// [`output_floor`].
pub const CANCELLATION_FLOOR: f64 = 0.1;

/// The scale, per element, that an output's rounding is relative to when
/// the output itself is smaller: `in_rms` is the largest RMS of a float
/// input, `reduced_rms` the RMS of the input being reduced, `k` how many of
/// its elements make one output element.
///
/// A sum of K terms is computed through partial sums, and each addition
/// rounds relative to the partial sum, not to the result. Terms of RMS r
/// and mean m give partial sums up to about K·|m| + √K·r (a random walk),
/// so two correct summation orders differ by about u·√K·(K·|m| + √K·r).
/// K·|m| is the result itself (`‖a‖`, already in the scale); √K·r is the
/// floor. When the result cancels to far below the partial sums (the
/// gradient of a key bias, zero in exact arithmetic), its error is rounding
/// of the partial sums, and measured against them it is again about u·√K:
/// what the tolerance `c·u·√K` allows. A mean divides both by K.
/// Derivation: `crates/cli/README.md`, "Tolerance model".
pub fn output_floor(class: OpClass, in_rms: f64, reduced_rms: f64, k: f64) -> f64 {
    let base = CANCELLATION_FLOOR * in_rms;
    if k <= 1.0 {
        return base;
    }
    match class {
        OpClass::Sum => base.max(k.sqrt() * reduced_rms),
        OpClass::Mean => base.max(reduced_rms / k.sqrt()),
        _ => base,
    }
}

/// The scale (RMS, largest absolute value) of the terms an op's output is
/// made of, per element, which [`output_floor`] takes a tenth of: where
/// the output cancels (`x − y` of close tensors), its rounding and the
/// drift of its inputs are relative to these terms, not to the result.
/// - Element-wise ops that do not add ([`OpClass::Elementwise`]: products,
///   activations, and backward kernels that multiply the gradient by a
///   local derivative) cannot cancel: each output element is one rounding
///   of a product of factors, relative to itself. No floor (0): the output
///   is judged by its own norm. Taking the inputs' scale instead judged a
///   `gelu_backward`, whose gradient is 10⁻⁴ of the activation it also
///   reads, against the activation: a 0.1% fault read as 3e-7.
/// - Sums of products of two inputs (matrix products, convolutions): 0,
///   their partial sums' scale is [`product_floor`]'s √K·r₁·r₂. A tenth of
///   the larger input's RMS judged the product of a gradient (10⁻⁴) and a
///   weight (0.05) against the weight: 50 times its own scale.
/// - The backward kernels of softmax, log-softmax and the norms add terms
///   of the gradient's size: the gradient arguments' scale (`grad`; their
///   weight and bias gradients, sums over rows, get the floor of a sum on
///   top, see [`output_floor`]).
/// - Any other op: the largest float input's (`inputs`).
pub fn term_scale(class: OpClass, op: &str, inputs: (f64, f64), grad: (f64, f64)) -> (f64, f64) {
    if class == OpClass::Elementwise || is_product(op) {
        (0.0, 0.0)
    } else if has_gradient_terms(op) && grad.0 > 0.0 {
        grad
    } else {
        inputs
    }
}

/// The (rms, max) floor of output `t` of an element-wise `self + T`
/// (`addcmul`, `addcdiv`, `lerp`, and their `_foreach_` list ops, element
/// by element): a tenth of the scale of the two terms it adds, which is
/// where its rounding and its cancellation are relative to. `T`'s scale is
/// bounded by the output's and `self`'s, `‖T‖ ≤ ‖out‖ + ‖self‖`, whatever
/// the scalar (`value`, `weight`) and the factors of `T`: the factors are
/// not the terms (Adam's `exp_avg_sq + 0.001·g·g` adds 5e-12 where `g` is
/// 7e-5; a tenth of `g`'s scale judged a 1e-3 fault as 3e-10). `lerp`'s
/// term `w·(end − self)` first rounds `end − self`, relative to `end` and
/// `self`: for |w| ≤ 1, `|w·end| ≤ |T| + |self|`, so `self` counts twice.
/// Derivation: `docs/reference/tolerance.md`, "Tolerance model".
fn elementwise_sum_floor(a: &Dump, op: &str, call: CallRows<'_>, t: u32) -> (f64, f64) {
    let out = call.row(t);
    let numel = a.tensors.shapes.numel(out.shape);
    // `self` of the same list element (a `_foreach_` op's element i is
    // made from element i of its lists).
    let this = call.rows.iter().find(|r| {
        r.role == Role::Input && a.names.get(r.arg) == "self" && r.list_index == out.list_index
    });
    let rms_of = |r: &TensorRow| {
        let n = a.tensors.shapes.numel(r.shape).max(1) as f64;
        let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
        (finite(r.l2) / n.sqrt(), finite(r.absmax))
    };
    if numel <= 0 || !out.has_values() {
        return (0.0, 0.0);
    }
    let (out_rms, out_abs) = rms_of(out);
    let (self_rms, self_abs) = this.filter(|r| r.has_values()).map_or((0.0, 0.0), rms_of);
    let times = if is_lerp(op) { 2.0 } else { 1.0 };
    let rms = CANCELLATION_FLOOR * (times * self_rms + out_rms);
    let abs = CANCELLATION_FLOOR * (times * self_abs + out_abs);
    (rms, abs.max(rms))
}

/// How much an op that only moves elements can raise the relative error of
/// its output `t` above that of its largest input (numel `n_in`, norms
/// `(l2, absmax)` of it): a selection of fewer elements keeps at most all
/// of the input's error, `‖δy‖ ≤ ‖δx‖`, so relative to `‖y‖` it may grow by
/// `‖x‖/‖y‖` (and by `absmax x / absmax y` in the largest element). An
/// output as large as the input (a copy, a cast, a permutation, a
/// broadcast) concentrates nothing: 1.
pub fn concentration(d: &Dump, t: u32, n_in: i64, (l2_in, abs_in): (f64, f64)) -> f64 {
    if d.tensors.numel(t) >= n_in {
        return 1.0;
    }
    let ratio = |x: f64, y: f64| {
        if x.is_finite() && y.is_finite() && y > 0.0 {
            x / y
        } else {
            1.0
        }
    };
    let r = d.tensors.row(t);
    ratio(l2_in, r.l2).max(ratio(abs_in, r.absmax)).max(1.0)
}

/// The partial-sum scale of a sum of K products of two inputs of RMS `r1`
/// and `r2` (a matrix product, a convolution): √K·r₁·r₂ per element, by the
/// random walk of [`output_floor`] over terms of RMS r₁·r₂. The weight
/// gradient of a projection whose outputs' gradients sum to zero over
/// tokens cancels the way a key bias's does.
pub fn product_floor(k: f64, r1: f64, r2: f64) -> f64 {
    k.max(1.0).sqrt() * r1 * r2
}

/// Denominators never go below this (an all-zero reference tensor).
const TINY: f64 = 1e-300;

/// How far beyond its allowance an output's largest element may err when
/// its norm does not (see `Ctx::compare_tensors`): the gap the rules leave
/// between rounding and a fault (`HEADLINE_DOMINANCE`).
pub const LINF_MARGIN: f64 = 10.0;

/// What two tensors of an aligned op pair compare to.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorCmp {
    /// A's tensor, when A has one.
    pub ta: Option<u32>,
    /// B's tensor, when B has one.
    pub tb: Option<u32>,
    /// Input or output.
    pub role: Role,
    /// What the pair compares to.
    pub verdict: TensorVerdict,
    /// The bounds and estimates the evidence gave.
    pub measure: Measure,
    /// `l2_bound / scale_l2`: a lower bound on ||a-b||_2 / ||a||_2 (with the
    /// floor for outputs, see [`CANCELLATION_FLOOR`]).
    pub rel_l2: f64,
    /// `linf_bound / scale_linf`: a lower bound on ||a-b||_inf / ||a||_inf.
    pub rel_linf: f64,
    /// The larger of the two (and of an estimate, when evidence gives one):
    /// what is compared with the tolerance.
    pub rel_err: f64,
    /// The scale `rel_l2` is relative to.
    pub scale_l2: f64,
    /// The scale `rel_linf` is relative to.
    pub scale_linf: f64,
    /// What rounding explains for this tensor (relative).
    pub tolerance: f64,
    /// What the output may differ by: `tolerance` plus the drift its inputs
    /// explain (set by [`Ctx::judge`], outputs only).
    pub allowed: f64,
    /// The verdict a differing output gets instead of diverged (random and
    /// discontinuous ops).
    pub legit: Option<TensorVerdict>,
    /// Identity of the pair (and of its A side) for [`crate::provenance`];
    /// (0, 0) when a side has no measured values.
    pub key: (u64, u64),
    /// The identity of B's side alone (0 with `key`).
    pub side_b: u64,
    /// Set by [`Ctx::judge`]: for an input, the error upstream of it (0 when
    /// none diverged); for an output, what its consumers inherit.
    pub taint: f64,
    /// An input's taint is its own error: no producer is known (see
    /// [`Taint`]).
    pub taint_own: bool,
    /// The two sides' dtypes differ.
    pub dtype_differs: bool,
    /// The strongest evidence used: `stats`, `sketch`, `fingerprint` or
    /// `exact`.
    pub evidence: &'static str,
    /// The sketches' estimate of ||a-b||_2 relative to `scale_l2` (never
    /// below `rel_l2`), when both tensors have a sketch.
    pub sketch_rel: Option<f64>,
    /// The low end of that estimate the verdict trusts (see
    /// [`sketch_low_end`]); 0 without a sketch. Part of `rel_err`.
    pub sketch_low: f64,
}

/// The comparison of one op pair.
#[derive(Clone, Debug, Default)]
pub struct OpCmp {
    /// Its tensor pairs.
    pub tensors: Vec<TensorCmp>,
    /// The op's class, once measured.
    pub class: Option<OpClass>,
    /// The least precise float dtype among the op's tensors, both sides.
    pub compute_dtype: Option<DType>,
    /// Estimated reduction length.
    pub k: f64,
    /// How much an op that only moves elements can concentrate its input's
    /// relative error (1 for other ops): see [`concentration`].
    pub concentration: f64,
    /// The largest output error over what was allowed for it (above 1 for
    /// a diverged output, infinite for a structural divergence): how far
    /// beyond rounding and its inputs an output went.
    pub excess: f64,
    /// The op's tolerance (relative).
    pub tolerance: f64,
    /// The largest relative error of an output.
    pub out_err: f64,
    /// Largest error among inputs that had not diverged (drift).
    pub explained_in_err: f64,
    /// Largest error among inputs that had diverged.
    pub diverged_in_err: f64,
    /// The larger of the two.
    pub in_err: f64,
    /// Output error over input error.
    pub amplification: f64,
    /// The verdict, once judged.
    pub verdict: Option<OpVerdict>,
    /// Buffers reused across calls: the tensor pairs, and the rows of the
    /// two calls' tensors (read once per call).
    scratch: Vec<(Option<u32>, Option<u32>)>,
    rows_a: Vec<TensorRow>,
    rows_b: Vec<TensorRow>,
    /// The first tensor of each call: `rows_a[t - start_a]` is tensor `t`.
    start_a: u32,
    start_b: u32,
    /// The tensors whose rows `rows_a` holds, when they are one element of
    /// a list call (then `rows_a[k]` is tensor `ids_a[k]`); empty for a
    /// whole call.
    ids_a: Vec<u32>,
    ids_b: Vec<u32>,
}

impl OpCmp {
    /// Back to [`OpCmp::default`], keeping the buffers' memory: a batch of
    /// calls is measured into the same `OpCmp`s again and again.
    pub fn reset(&mut self) {
        let mut tensors = std::mem::take(&mut self.tensors);
        tensors.clear();
        *self = OpCmp {
            tensors,
            scratch: std::mem::take(&mut self.scratch),
            rows_a: std::mem::take(&mut self.rows_a),
            rows_b: std::mem::take(&mut self.rows_b),
            ids_a: std::mem::take(&mut self.ids_a),
            ids_b: std::mem::take(&mut self.ids_b),
            ..OpCmp::default()
        };
    }

    /// The rows of A's tensor `ta` and B's tensor `tb` as measured (read
    /// once, by the measuring thread); `None` for a tensor not of this
    /// pair.
    pub fn rows(&self, ta: u32, tb: u32) -> Option<(&TensorRow, &TensorRow)> {
        let ra = CallRows::new(&self.rows_a, self.start_a, &self.ids_a).get(ta)?;
        let rb = CallRows::new(&self.rows_b, self.start_b, &self.ids_b).get(tb)?;
        Some((ra, rb))
    }
}

/// How much more drift an op may pass on when some input's elements drift
/// unevenly, more than its norms show (see [`drifts_unevenly`]). A correct
/// Adam update divides first moments that are 0 on one side and tiny on the
/// other by ε: 1.9 times what the norms explain in the demo's TinyLM with
/// sketches; where a gradient element cancelled to a few ε on both sides,
/// 1.3 times on a machine with AVX-512, 1.06 times in a Qwen2 trained in
/// bfloat16. A 1e-3 fault in float32 goes hundreds of times beyond the
/// allowance.
pub const UNEVEN_DRIFT_MARGIN: f64 = 4.0;

/// How far below its mean a positive input's minimum lies where its small
/// elements count as near a floor: Adam's divisor reaches ε (1e-8) under a
/// mean of 3e-4 in the demo's TinyLM, and 3.4e-8 under 3.1e-5 in a Qwen2
/// trained in bfloat16.
const NEAR_FLOOR: f64 = 1e-2;

/// Whether an input pair may drift element by element more than its norms
/// show:
/// - its zero counts differ (a gradient exactly 0 on one side and 1e-12 on
///   the other);
/// - or, for an element-wise sum, it is positive and reaches far below its
///   mean on both sides: a divisor at its floor (Adam's √v̂ + ε where a
///   gradient element cancelled to a few ε), by which a tiny element's
///   drift, large relative to itself, becomes a large term of the result.
fn drifts_unevenly(class: OpClass, ra: &TensorRow, rb: &TensorRow) -> bool {
    if !(ra.has_values() && rb.has_values()) {
        return false;
    }
    let near_floor = |r: &TensorRow| r.min > 0.0 && r.min < NEAR_FLOOR * r.mean;
    ra.zero != rb.zero || (class == OpClass::ElementwiseSum && near_floor(ra) && near_floor(rb))
}

/// How far an input is tainted, and from where.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Taint {
    /// 0 when no divergence lies upstream, else the size of the error.
    pub size: f64,
    /// No producer is known (a parameter, data, an output of calls one side
    /// only makes): the size is the input's own error, where a difference
    /// enters the comparison. Such a taint passes to the outputs only when
    /// they show a divergence: an input that differs yet leaves the outputs
    /// close did not matter to them (a bias that is rounding noise next to
    /// the product it is added to), and tainting every later op with it
    /// would make the next rounding excess a divergence.
    pub own: bool,
}

/// What comparing needs besides the two op calls.
pub struct Ctx<'a> {
    /// The first dump.
    pub a: &'a Dump,
    /// The second dump.
    pub b: &'a Dump,
    /// The tolerance model.
    pub tol: &'a Tolerances,
    /// The sources of evidence both dumps support.
    pub evidence: Vec<&'static dyn Evidence>,
    /// Some dump accumulated statistics in float32.
    pub stats_f32: bool,
    /// The class of each name id of A (names are few, calls are many).
    classes: Vec<OpClass>,
    /// The layouts of the list calls judged element by element, by side
    /// (B: true) and call.
    layouts: Mutex<FxMap<(bool, u32), Arc<Layout>>>,
    /// The tensors of the pairs of fused optimizer kernels (see
    /// [`crate::align::fused`]), sorted by (a, b, part).
    fused: &'a [FusedTensors],
}

impl<'a> Ctx<'a> {
    /// The context of comparing `a` with `b`.
    pub fn new(a: &'a Dump, b: &'a Dump, tol: &'a Tolerances) -> Self {
        Ctx {
            a,
            b,
            tol,
            evidence: crate::evidence::available(a, b),
            stats_f32: a.stats_accumulate == "float32" || b.stats_accumulate == "float32",
            classes: (0..a.names.len() as u32)
                .map(|i| classify(a.names.get(i)))
                .collect(),
            layouts: Mutex::default(),
            fused: &[],
        }
    }

    /// This context, judging the pairs of fused optimizer kernels by the
    /// tensors `fused` names (an alignment's [`crate::Alignment::fused`]).
    pub fn with_fused(mut self, fused: &'a [FusedTensors]) -> Self {
        self.fused = fused;
        self
    }

    /// Pairs the tensors of op `ia` (in a) and `ib` (in b) by role, argument
    /// name and list index, in a's order; tensors of b left over come last.
    fn pair_tensors(
        &self,
        (ia, rows_a): (u32, &[TensorRow]),
        (ib, rows_b): (u32, &[TensorRow]),
        out: &mut Vec<(Option<u32>, Option<u32>)>,
    ) {
        let (a, b) = (self.a, self.b);
        let rb = b.tensors_of(ib);
        let nb = (rb.end - rb.start) as usize;
        // Which of b's tensors are taken: a bit mask for the usual few, a
        // vector beyond 64.
        let mut used_small = 0u64;
        let mut used_big = if nb > 64 { vec![false; nb] } else { Vec::new() };
        let is_used =
            |m: usize, small: u64, big: &[bool]| if nb > 64 { big[m] } else { small >> m & 1 == 1 };
        for (k, ta) in a.tensors_of(ia).enumerate() {
            let x = &rows_a[k];
            let arg = a.names.get(x.arg);
            let matches = |t: u32| {
                let y = &rows_b[(t - rb.start) as usize];
                (x.role, x.list_index) == (y.role, y.list_index) && arg == b.names.get(y.arg)
            };
            // Usually the k-th tensor is the one; search only when not.
            let found =
                if k < nb && !is_used(k, used_small, &used_big) && matches(rb.start + k as u32) {
                    Some(k)
                } else {
                    (0..nb).find(|&m| {
                        !is_used(m, used_small, &used_big) && matches(rb.start + m as u32)
                    })
                };
            match found {
                Some(m) => {
                    if nb > 64 {
                        used_big[m] = true;
                    } else {
                        used_small |= 1 << m;
                    }
                    out.push((Some(ta), Some(rb.start + m as u32)));
                }
                None => out.push((Some(ta), None)),
            }
        }
        for m in 0..nb {
            if !is_used(m, used_small, &used_big) {
                out.push((None, Some(rb.start + m as u32)));
            }
        }
    }

    /// Stage 1: pairs the tensors of op `ia` of a and `ib` of b and measures
    /// each pair; verdicts are provisional (each tensor against this op's
    /// own tolerance) until [`Ctx::judge`].
    pub fn measure(&self, ia: u32, ib: u32, cmp: &mut OpCmp) {
        self.measure_pair(Pair::whole(ia, ib, false), cmp);
    }

    /// [`Ctx::measure`] of an aligned pair: its whole calls, or one
    /// element of a list call against the other side's call for it (see
    /// [`Part`]); then the tensors pair by position, and the op judged is
    /// the per-element one (`lerp_`, not `_foreach_lerp_`).
    pub fn measure_pair(&self, p: Pair, cmp: &mut OpCmp) {
        let (a, b) = (self.a, self.b);
        let (ia, ib) = (p.a, p.b);
        let mut pairs = std::mem::take(&mut cmp.scratch);
        pairs.clear();
        let (mut rows_a, mut rows_b) = (
            std::mem::take(&mut cmp.rows_a),
            std::mem::take(&mut cmp.rows_b),
        );
        let (mut ids_a, mut ids_b) = (
            std::mem::take(&mut cmp.ids_a),
            std::mem::take(&mut cmp.ids_b),
        );
        ids_a.clear();
        ids_b.clear();
        let element = p.part().element_of();
        let fused = p
            .part()
            .fused_kind()
            .and_then(|_| {
                self.fused
                    .binary_search_by_key(&(p.a, p.b, p.part()), |f| (f.a, f.b, f.part))
                    .ok()
            })
            .map(|k| &self.fused[k].tensors);
        if let Some(ts) = fused {
            // Tensors of several calls of the loop: named one by one.
            ids_a.extend(ts.iter().map(|t| t.0));
            ids_b.extend(ts.iter().map(|t| t.1));
            for ids in [&mut ids_a, &mut ids_b] {
                ids.sort_unstable();
                ids.dedup();
            }
            rows_a.clear();
            rows_a.extend(ids_a.iter().map(|&t| a.tensors.row(t)));
            rows_b.clear();
            rows_b.extend(ids_b.iter().map(|&t| b.tensors.row(t)));
        } else {
            match element {
                Some((Side::A, k)) => self.element_rows(Side::A, ia, k, &mut ids_a, &mut rows_a),
                _ => a.tensors.rows_of(a.tensors_of(ia), &mut rows_a),
            }
            match element {
                Some((Side::B, k)) => self.element_rows(Side::B, ib, k, &mut ids_b, &mut rows_b),
                _ => b.tensors.rows_of(b.tensors_of(ib), &mut rows_b),
            }
        }
        let (start_a, start_b) = (a.calls.t_start(ia), b.calls.t_start(ib));
        let call_a = CallRows::new(&rows_a, start_a, &ids_a);
        let call_b = CallRows::new(&rows_b, start_b, &ids_b);
        if let Some(ts) = fused {
            pairs.extend(ts.iter().map(|&(x, y)| (Some(x), Some(y))));
        } else if element.is_some() {
            pair_by_position(&call_a.indexed(), &call_b.indexed(), &mut pairs);
        } else {
            self.pair_tensors((ia, &rows_a), (ib, &rows_b), &mut pairs);
        }
        cmp.tensors.clear();

        // An element is judged as the per-element op its other side ran.
        let (op, class) = match element {
            Some((Side::A, _)) => (b.op_name(ib), class_of_call(b, ib)),
            _ => (a.op_name(ia), self.class_of(ia)),
        };
        let inputs = Inputs::scan(self, op, &pairs, call_a, call_b);
        let k = reduction_length_of(a, ia, &rows_a, class);
        let tolerance = self.tol.rtol(inputs.compute, k);
        // The scale of the terms an output is made of, which its rounding
        // is relative to when it cancels (see `term_scale`).
        let (term_rms, term_absmax) = term_scale(
            class,
            op,
            (inputs.rms, inputs.absmax),
            (inputs.grad_rms, inputs.grad_absmax),
        );
        let products = if is_product(op) {
            product_floor(k, inputs.factors[0].1, inputs.factors[1].1)
        } else {
            0.0
        };

        for &(ta, tb) in &pairs {
            let role = match (ta, tb) {
                (Some(t), _) => call_a.row(t).role,
                (None, Some(t)) => call_b.row(t).role,
                (None, None) => continue,
            };
            let floor = match (role, ta) {
                (Role::Output, Some(t)) if class == OpClass::ElementwiseSum => {
                    elementwise_sum_floor(a, op, call_a, t)
                }
                (Role::Output, Some(t)) => {
                    let numel = a.tensors.shapes.numel(call_a.row(t).shape);
                    inputs.output_floor(op, class, (term_rms, term_absmax), products, numel)
                }
                _ => (0.0, 0.0),
            };
            let mut tc = self.compare_tensors(
                ta.map(|t| (t, call_a.row(t))),
                tb.map(|t| (t, call_b.row(t))),
                role,
                tolerance,
                floor,
            );
            let discrete_output = ta.is_some_and(|t| a.dtype_of(call_a.row(t)).is_discrete());
            tc.legit = legit_verdict(role, class, discrete_output && inputs.any_float);
            cmp.tensors.push(tc);
        }
        cmp.concentration = if class == OpClass::Movement {
            self.concentration_of(&pairs, call_a, &inputs)
        } else {
            1.0
        };
        cmp.class = Some(class);
        cmp.compute_dtype = inputs.compute.cloned();
        cmp.k = k;
        cmp.tolerance = tolerance;
        cmp.verdict = None;
        cmp.scratch = pairs;
        (cmp.rows_a, cmp.rows_b) = (rows_a, rows_b);
        (cmp.start_a, cmp.start_b) = (start_a, start_b);
        (cmp.ids_a, cmp.ids_b) = (ids_a, ids_b);
    }

    /// The tensors of element `k` of list call `call` on `side`, and their
    /// rows. A call's layout is read once (a list call of N elements is N
    /// pairs).
    fn element_rows(
        &self,
        side: Side,
        call: u32,
        k: u32,
        ids: &mut Vec<u32>,
        rows: &mut Vec<TensorRow>,
    ) {
        let d = match side {
            Side::A => self.a,
            Side::B => self.b,
        };
        let layout = {
            let mut cache = self.layouts.lock().unwrap_or_else(|e| e.into_inner());
            cache
                .entry((side == Side::B, call))
                .or_insert_with(|| Arc::new(Layout::of(d, call)))
                .clone()
        };
        *ids = layout.element(k as usize);
        rows.clear();
        rows.extend(ids.iter().map(|&t| d.tensors.row(t)));
    }

    /// The class of call `ia` of A: by its op's name, or discontinuous where
    /// its arguments make it so.
    fn class_of(&self, ia: u32) -> OpClass {
        let a = self.a;
        let class = self
            .classes
            .get(a.op_id(ia) as usize)
            .copied()
            .unwrap_or(OpClass::Plain);
        discontinuous_by_args(a, ia, class)
    }

    /// How much a movement op may concentrate its input's relative error:
    /// the largest over its outputs (see [`concentration`]).
    fn concentration_of(
        &self,
        pairs: &[(Option<u32>, Option<u32>)],
        call_a: CallRows<'_>,
        inputs: &Inputs<'_>,
    ) -> f64 {
        let a = self.a;
        let mut c = 1.0f64;
        for t in pairs.iter().filter_map(|p| p.0) {
            let r = call_a.row(t);
            if r.role == Role::Output && r.has_values() {
                c = c.max(concentration(
                    a,
                    t,
                    inputs.reduced_numel,
                    inputs.reduced_norms,
                ));
            }
        }
        c
    }

    /// Stage 2: verdicts, given how far each input is *tainted*: 0 when no
    /// divergence lies upstream of it, else the size of the error upstream
    /// (see `provenance`).
    ///
    /// An input is not "diverged" merely because its error exceeds this
    /// op's tolerance: rounding differences accumulate along a network, and
    /// an error every op on the way explains is no divergence. Nor is it
    /// clean merely because its error is small: the statistics only bound
    /// the error from below, and an error upstream can hide in them and
    /// show again after a reduction. So:
    /// - untainted inputs set the *explained* error `e_in`: an output is
    ///   close while its error is within `tolerance + drift * e_in` (its
    ///   own rounding plus what its inputs' drift can become; `drift` is
    ///   `min_amplification`, a quarter of it for smooth element-wise ops
    ///   whose inputs' errors a sketch or the values measured, see
    ///   [`Tolerances::drift_amplification`]), else diverged;
    /// - tainted inputs set `d_in`, the larger of their measured error and
    ///   their taint: an op with a diverged output *introduced* the error
    ///   when its output error exceeds `min_amplification * d_in`, else it
    ///   *inherited* it.
    /// - inputs tainted by their own error only (no known producer) pass
    ///   their taint to outputs that diverge, not to close ones (see
    ///   [`Taint::own`]).
    pub fn judge(&self, cmp: &mut OpCmp, input_taint: impl Fn(&TensorCmp) -> Taint) {
        let kappa = self.tol.min_amplification;
        // d_known: the part of d_in from known producers; d_own: from
        // inputs tainted by their own error.
        let (mut e_in, mut d_in, mut d_known) = (0.0f64, 0.0f64, 0.0f64);
        let mut d_own = 0.0f64;
        // Every drifting input's error measured by more than its statistics
        // (which can miss most of a zero-mean error, bf16 rounding for one).
        let mut drift_measured_well = true;
        // An input no aligned op made may differ by what any op of its
        // dtype could round to (the longest reduction's tolerance, the
        // cap): its producer is unknown. Beyond that it is a divergence by
        // itself, even where this op's outputs stay close.
        let own_cap = self.tol.rtol(cmp.compute_dtype.as_ref(), f64::INFINITY);
        for tc in cmp.tensors.iter_mut().filter(|t| t.role != Role::Output) {
            tc.taint = 0.0;
            tc.taint_own = false;
            if tc.verdict == TensorVerdict::Unmeasured {
                continue;
            }
            if tc.verdict.is_structural() {
                tc.taint = f64::INFINITY;
                d_in = f64::INFINITY;
                d_known = f64::INFINITY;
                continue;
            }
            let taint = input_taint(tc);
            if taint.size > 0.0 {
                tc.taint = taint.size;
                tc.taint_own = taint.own;
                d_in = d_in.max(tc.rel_err.max(taint.size));
                if taint.own {
                    if tc.rel_err.max(taint.size) > own_cap {
                        d_own = d_own.max(tc.rel_err.max(taint.size));
                    } else {
                        // Within the cap it drifts like rounding would.
                        e_in = e_in.max(tc.rel_err);
                        drift_measured_well &= tc.rel_err == 0.0 || tc.evidence != "stats";
                    }
                } else {
                    d_known = d_known.max(tc.rel_err.max(taint.size));
                }
                // A tainted input that itself shows no more than rounding
                // here still drifts like one: its drift is allowed for
                // (else a rounding excess after an output that carries a
                // taint unseen reads as a divergence).
                if tc.verdict == TensorVerdict::Close {
                    e_in = e_in.max(tc.rel_err);
                    drift_measured_well &= tc.rel_err == 0.0 || tc.evidence != "stats";
                }
            } else {
                if tc.verdict == TensorVerdict::Diverged {
                    tc.verdict = TensorVerdict::Close;
                }
                e_in = e_in.max(tc.rel_err);
                drift_measured_well &= tc.rel_err == 0.0 || tc.evidence != "stats";
            }
        }
        let class = cmp.class.unwrap_or(OpClass::Plain);
        let drift = self.tol.drift_amplification(class, drift_measured_well);
        // What the inputs' drift explains: `drift` times it, or for a
        // reduction what it sums to over K terms (see
        // `Tolerances::summed_drift`), the larger.
        let drift_err = (drift * e_in).max(self.tol.summed_drift(class, cmp.k, e_in));
        cmp.excess = 0.0;
        let mut errors = OpErrors {
            out_err: 0.0,
            explained_in_err: e_in,
            diverged_in_err: d_in,
            out_diverged: false,
            legit_rng: false,
            legit_discontinuous: false,
            concentration: cmp.concentration,
        };
        // Inputs that differ element by element more than their norms show
        // (see [`UNEVEN_DRIFT_MARGIN`]): what their drift explains is
        // larger than the norms say, by a margin.
        let uneven = e_in > 0.0
            && cmp
                .tensors
                .iter()
                .filter(|t| t.role != Role::Output)
                .filter_map(|t| cmp.rows(t.ta?, t.tb?))
                .any(|(ra, rb)| drifts_unevenly(class, ra, rb));
        let margin = if uneven { UNEVEN_DRIFT_MARGIN } else { 1.0 };
        for tc in cmp.tensors.iter_mut().filter(|t| t.role == Role::Output) {
            // An op that only moves elements may concentrate the drift of
            // its inputs (a row of a matrix can hold more of it than the
            // whole), by at most `concentration`.
            tc.allowed = tc.tolerance + drift_err * cmp.concentration * margin;
            if matches!(tc.verdict, TensorVerdict::Close | TensorVerdict::Diverged) {
                tc.verdict = if tc.rel_err <= tc.allowed {
                    TensorVerdict::Close
                } else {
                    TensorVerdict::Diverged
                };
            }
            let err = match tc.verdict {
                TensorVerdict::Close | TensorVerdict::Diverged => tc.rel_err,
                v if v.is_structural() => f64::INFINITY,
                _ => 0.0,
            };
            // What consumers inherit: a divergence (or a random /
            // discontinuous op's difference) here, or the taint of the
            // inputs unless the output is plainly equal. An input that
            // differs on its own (a parameter an optimizer changed) and
            // leaves this output close passes on no more than what the
            // output may differ by unseen (`allowed`): what it changed
            // downstream hides below the statistics' bound and shows again
            // after a reduction, where it is inherited, not introduced;
            // a fault beyond `min_amplification` times that is still named.
            let plainly_equal = matches!(
                tc.verdict,
                TensorVerdict::StatsEqual | TensorVerdict::Identical
            );
            tc.taint = if tc.verdict.is_divergence() {
                err.max(d_in)
            } else if plainly_equal {
                0.0
            } else {
                d_known.max(d_own.min(tc.allowed))
            };
            if tc.verdict.is_divergence() {
                if let Some(legit) = tc.legit {
                    tc.verdict = legit;
                    errors.legit_rng |= legit == TensorVerdict::Rng;
                    errors.legit_discontinuous |= legit == TensorVerdict::Discontinuous;
                    continue;
                }
            }
            if tc.verdict.is_divergence() {
                cmp.excess = cmp.excess.max(if err.is_finite() {
                    err / tc.allowed.max(f64::MIN_POSITIVE)
                } else {
                    f64::INFINITY
                });
            }
            // Close outputs count too: the plot shows every op's error, and
            // a diverged output's error is the largest anyway.
            errors.out_err = errors.out_err.max(err);
            errors.out_diverged |= tc.verdict.is_divergence();
        }
        let floor = cmp
            .compute_dtype
            .as_ref()
            .map_or(f64::EPSILON, |d| d.unit_roundoff);
        if !errors.out_diverged {
            // Outputs close, and an input no aligned op made within what
            // rounding of an unknown producer explains: no divergence there
            // (a parameter that a few optimizer steps moved by 2e-6, read
            // by a cast whose own tolerance is 1e-6).
            for tc in cmp.tensors.iter_mut().filter(|t| t.role != Role::Output) {
                if tc.taint_own && tc.verdict == TensorVerdict::Diverged && tc.rel_err <= own_cap {
                    tc.verdict = TensorVerdict::Close;
                }
            }
        }
        cmp.out_err = errors.out_err;
        cmp.explained_in_err = e_in;
        cmp.diverged_in_err = d_in;
        cmp.in_err = e_in.max(d_in);
        cmp.amplification = if errors.out_err > 0.0 {
            amplification(errors.out_err, cmp.in_err, floor)
        } else {
            0.0
        };
        cmp.verdict = Some(op_verdict(&errors, kappa));
    }

    /// An output's error relative to its own norm, without the floor of
    /// [`output_floor`]: what a consumer sees of it as an input. Infinite
    /// for a structural difference, 0 when nothing was measured.
    pub fn own_relative_error(&self, tc: &TensorCmp) -> f64 {
        self.own_relative_error_of(tc, |ta| self.a.tensors.row(ta))
    }

    /// [`Ctx::own_relative_error`], A's row of the tensor given by `row`.
    pub fn own_relative_error_of(&self, tc: &TensorCmp, row: impl FnOnce(u32) -> TensorRow) -> f64 {
        if tc.verdict.is_structural() {
            return f64::INFINITY;
        }
        let Some(ta) = tc.ta else { return 0.0 };
        let r = row(ta);
        if !r.has_values() {
            return 0.0;
        }
        relative_to_own_norms(&r, &tc.measure)
    }

    /// How much two tensors of one dump differ, relative to the first: a
    /// lower bound on max(||x - y||_2 / ||x||_2, ||x - y||_inf / ||x||_inf),
    /// infinite when their NaN/Inf counts differ, 0 when either has no
    /// measured values or their sizes differ (nothing to tell).
    pub fn relative_change(&self, d: &Dump, x: u32, y: u32) -> f64 {
        let t = &d.tensors;
        if !t.has_values(x) || !t.has_values(y) || t.numel(x) != t.numel(y) {
            return 0.0;
        }
        if t.nonfinite_counts(x) != t.nonfinite_counts(y) {
            return f64::INFINITY;
        }
        let (rx, ry) = (t.row(x), t.row(y));
        let mut m = Measure::default();
        for e in &self.evidence {
            e.measure(d, (x, &rx), d, (y, &ry), &mut m);
        }
        relative_to_own_norms(&rx, &m)
    }

    fn compare_tensors(
        &self,
        x: Option<Row<'_>>,
        y: Option<Row<'_>>,
        role: Role,
        op_tolerance: f64,
        (floor_rms, floor_abs): (f64, f64),
    ) -> TensorCmp {
        let (a, b) = (self.a, self.b);
        let mut tc = TensorCmp {
            ta: x.map(|x| x.0),
            tb: y.map(|y| y.0),
            role,
            verdict: TensorVerdict::Unpaired,
            measure: Measure::default(),
            rel_l2: 0.0,
            rel_linf: 0.0,
            rel_err: 0.0,
            scale_l2: 0.0,
            scale_linf: 0.0,
            tolerance: op_tolerance,
            allowed: op_tolerance,
            legit: None,
            key: (0, 0),
            side_b: 0,
            taint: 0.0,
            taint_own: false,
            dtype_differs: false,
            evidence: "stats",
            sketch_rel: None,
            sketch_low: 0.0,
        };
        let (Some((ta, ra)), Some((tb, rb))) = (x, y) else {
            return tc;
        };
        let (x, y) = (&a.tensors, &b.tensors);
        // Equal names have equal canonical names: most pairs stop there.
        let (da, db) = (a.dtype_of(ra), b.dtype_of(rb));
        tc.dtype_differs = da.name != db.name && da.canonical() != db.canonical();
        let numel = x.shapes.numel(ra.shape);
        if x.shapes.get(ra.shape) != y.shapes.get(rb.shape) || numel != y.shapes.numel(rb.shape) {
            // An output holding no values on either side (a scratch buffer
            // from `empty` or `resize_`) differs in nothing that matters; an
            // input's shape, measured or not, shapes what the op computes.
            tc.verdict = if role == Role::Output && !ra.has_values() && !rb.has_values() {
                TensorVerdict::Unmeasured
            } else {
                TensorVerdict::ShapeMismatch
            };
            return tc;
        }
        if !ra.has_values() || !rb.has_values() {
            tc.verdict = TensorVerdict::Unmeasured;
            return tc;
        }
        let (ha, hb) = (side_hash_of_row(a, ta, ra), side_hash_of_row(b, tb, rb));
        tc.key = (pair_key(ha, hb), ha);
        tc.side_b = hb;
        let mut m = Measure::default();
        for e in &self.evidence {
            e.measure(a, (ta, ra), b, (tb, rb), &mut m);
        }
        tc.measure = m;
        if m.identical == Some(true) {
            // Equal bits (a fingerprint, or the captured values): whatever
            // the statistics say, nothing differs.
            tc.evidence = if m.exact { "exact" } else { "fingerprint" };
            tc.verdict = TensorVerdict::Identical;
            return tc;
        }
        if x.nonfinite_counts(ta) != y.nonfinite_counts(tb) {
            tc.verdict = TensorVerdict::NanMismatch;
            return tc;
        }
        let (l2a, absa) = finite_norms(ra);
        let n = numel.max(0) as f64;
        // ||a||_2 >= ||a||_inf: absmax guards an l2 that underflowed.
        tc.scale_l2 = l2a.max(absa).max(n.sqrt() * floor_rms).max(TINY);
        tc.scale_linf = absa.max(floor_abs).max(TINY);
        tc.rel_l2 = m.l2_bound / tc.scale_l2;
        tc.rel_linf = m.linf_bound / tc.scale_linf;
        // An output is judged by the L2 norm, whose bound already holds
        // each extreme's gap (one element's error is at most ||a - b||_2),
        // and by its largest element with a margin of LINF_MARGIN. The
        // tolerance is a norm-wise one: relative to the largest element,
        // one element may err more in a correct run (a dot product that
        // cancels keeps the absolute error of its terms, and an
        // element-wise product carries it, while the inputs' statistics
        // agree: up to 4.5 times the allowance in ten-step Hugging Face
        // runs), while noise of 1e-3 moves the extremes a hundred times
        // beyond it and the norm by less than rounding.
        //
        // An input's error is the drift its op may pass on, and its largest
        // element's gap is the better sign of how far its elements moved.
        // Where the sides' dtypes differ (bfloat16 against float32), that
        // gap holds the cast's rounding of the element, a difference of
        // dtype that the op's own tolerance (c·u, c >= 4) admits: less that
        // rounding. Counted whole, 32 times, it hid a 5% fault in a bfloat16
        // `silu`.
        tc.rel_err = if role == Role::Output {
            tc.rel_l2.max(tc.rel_linf / LINF_MARGIN)
        } else if tc.dtype_differs {
            let u = a
                .dtype_of(ra)
                .unit_roundoff
                .max(b.dtype_of(rb).unit_roundoff);
            tc.rel_l2.max(tc.rel_linf - u)
        } else {
            tc.rel_l2.max(tc.rel_linf)
        };
        if let Some(est) = m.l2_estimate {
            tc.rel_err = tc.rel_err.max(est / tc.scale_l2);
        }
        tc.tolerance = op_tolerance.max(Tolerances::stats_noise(self.stats_f32, numel));
        if let (Some(est), false) = (m.sketch_estimate, m.exact) {
            // Never below what the statistics guarantee.
            let est = est.max(m.l2_bound);
            let norm = l2a.max(finite_norms(rb).0);
            let low = sketch_low_end(est, m.sketch_k, numel, norm, self.stats_f32);
            tc.sketch_rel = Some(est / tc.scale_l2);
            tc.sketch_low = low / tc.scale_l2;
            tc.rel_err = tc.rel_err.max(tc.sketch_low);
            tc.evidence = "sketch";
        }
        if m.exact {
            tc.evidence = "exact";
        }
        // The sketch's low end above the tolerance outweighs equal
        // statistics: the values moved (a permutation keeps every one).
        let sketch_differs = tc.sketch_low > tc.tolerance;
        tc.verdict = if m.stats_equal && !m.exact && !sketch_differs {
            // (With the values at hand, equal statistics prove nothing: a
            // permutation keeps them.)
            TensorVerdict::StatsEqual
        } else if tc.rel_err <= tc.tolerance {
            TensorVerdict::Close
        } else {
            TensorVerdict::Diverged
        };
        tc
    }
}

/// The part of a sketch estimate `est` of ||a-b||_2 that the verdict
/// trusts: the estimate less its spread (exact for a tensor of at most `k`
/// elements, else 3 standard deviations, `3/sqrt(2k)` of it) and less what
/// the two devices' own accumulation of the same values can differ by
/// (relative to `norm`, the larger of the tensors' norms). Only above the
/// tolerance does it decide a verdict: an error the statistics do not see
/// (values moved, zero-mean noise). Derivation: `crates/cli/README.md`,
/// "Fingerprint and sketch".
pub fn sketch_low_end(est: f64, k: usize, numel: i64, norm: f64, f32_accumulate: bool) -> f64 {
    let spread = crate::sketch::spread(k, numel);
    let noise = crate::sketch::accumulation_noise(f32_accumulate, numel) * norm;
    (est * (1.0 - spread) - noise).max(0.0)
}

/// The bounds of `m` relative to tensor `x`'s own norms: a lower bound on
/// max(||x - y||_2 / ||x||_2, ||x - y||_inf / ||x||_inf). `||x||_2 >=
/// ||x||_inf`, so absmax guards an L2 norm that underflowed.
fn relative_to_own_norms(r: &TensorRow, m: &Measure) -> f64 {
    let (l2, absmax) = finite_norms(r);
    (m.l2_bound / l2.max(absmax).max(TINY)).max(m.linf_bound / absmax.max(TINY))
}

/// The L2 norm and the largest absolute value of a tensor, each 0 where it
/// overflowed to infinity (or is NaN).
fn finite_norms(r: &TensorRow) -> (f64, f64) {
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    (finite(r.l2), finite(r.absmax))
}

/// The number of elements each output element is reduced from, which sets
/// how far two correct summation orders may drift apart.
/// - in general, the largest float input's numel over the output's
///   (a `sum` over a dimension, a `mean`);
/// - matrix products: the contracted dimension ([`contracted_dim`]);
/// - other contractions: the largest last dimension of an input (or a
///   convolution weight's numel per output channel);
/// - normalizations (softmax, layer_norm, ...): the last dimension.
pub fn reduction_length(d: &Dump, i: u32, class: OpClass) -> f64 {
    let mut rows = Vec::new();
    d.tensors.rows_of(d.tensors_of(i), &mut rows);
    reduction_length_of(d, i, &rows, class)
}

/// [`reduction_length`], the rows of the call's tensors already read.
fn reduction_length_of(d: &Dump, i: u32, rows: &[TensorRow], class: OpClass) -> f64 {
    let mut out: i64 = 0;
    let mut float_inputs: Vec<&[i64]> = Vec::new();
    for r in rows {
        if r.role == Role::Output {
            if out == 0 {
                out = d.tensors.shapes.numel(r.shape);
            }
        } else if d.dtype_of(r).is_float() {
            float_inputs.push(d.tensors.shapes.get(r.shape));
        }
    }
    reduction_length_of_shapes(d.op_name(i), class, &float_inputs, out)
}

/// [`reduction_length`] from the shapes of a call's float inputs, in
/// argument order, and its first output's numel (0: none).
pub fn reduction_length_of_shapes(
    op: &str,
    class: OpClass,
    float_inputs: &[&[i64]],
    out: i64,
) -> f64 {
    let mut max_in: i64 = 0;
    let mut last_dim: i64 = 1;
    let mut first_last_dim: Option<i64> = None;
    let mut conv_k: i64 = 1;
    let conv = op.contains("conv");
    for shape in float_inputs {
        let numel: i64 = shape.iter().product();
        max_in = max_in.max(numel);
        if let Some(&l) = shape.last() {
            last_dim = last_dim.max(l);
            first_last_dim.get_or_insert(l);
        }
        if conv && shape.len() >= 3 && shape[0] > 0 {
            conv_k = conv_k.max(numel / shape[0]);
        }
    }
    let ratio = if out > 0 {
        max_in as f64 / out as f64
    } else {
        1.0
    };
    let by_class = match class {
        OpClass::Contraction => match contracted_dim(op, float_inputs) {
            Some(k) => k as f64,
            None => last_dim.max(conv_k) as f64,
        },
        OpClass::Normalization => first_last_dim.unwrap_or(1) as f64,
        _ => 1.0,
    };
    ratio.max(by_class).max(1.0)
}

/// How many products a matrix product or a convolution sums per output
/// element.
/// - Matrix products: the last dimension of the first factor, which is the
///   first float input (`mm`, `bmm`, `matmul`, `linear`, `dot`, `mv`) or the
///   second, after the term added (`addmm`, `baddbmm`, `addbmm`, `addmv`).
///   The largest last dimension would be the output's width for
///   `[n,k] @ [k,m]` with m > k.
/// - Convolutions (forward): the weight's elements per output channel,
///   `in/groups × kernel`, for a weight `[out, in/groups, k…]`. Transposed,
///   the weight is `[in, out/groups, k…]` (which `convolution`'s name does
///   not say, its input's channels do): then the weight's elements per
///   input channel, a bound on what each output element sums.
///
/// `None` for other ops (backward kernels among them), or when the operand
/// is not there.
fn contracted_dim(op: &str, float_inputs: &[&[i64]]) -> Option<i64> {
    let base = base_name(op);
    let factor = match base {
        "mm" | "bmm" | "matmul" | "linear" | "dot" | "vdot" | "mv" | "mkldnn_linear" => 0,
        "addmm" | "baddbmm" | "addbmm" | "addmv" | "_addmm_activation" => 1,
        "convolution"
        | "_convolution"
        | "conv1d"
        | "conv2d"
        | "conv3d"
        | "convolution_overrideable"
        | "cudnn_convolution"
        | "mkldnn_convolution" => {
            let x = float_inputs.first().filter(|x| x.len() >= 3)?;
            let w = float_inputs.get(1).filter(|w| w.len() >= 3)?;
            let transposed = x[1] == w[0] && x[1] != w[1];
            let per = if transposed { w[1] } else { w[0] };
            return (per > 0).then(|| w.iter().product::<i64>() / per);
        }
        _ => return None,
    };
    float_inputs.get(factor)?.last().copied().filter(|&k| k > 0)
}

/// The class of call `i` of `d` (of B, where a class is rarely asked).
fn class_of_call(d: &Dump, i: u32) -> OpClass {
    discontinuous_by_args(d, i, classify(d.op_name(i)))
}

/// `class`, or discontinuous where the arguments of call `i` make it so.
fn discontinuous_by_args(d: &Dump, i: u32, class: OpClass) -> OpClass {
    // Ops whose arguments cannot make them discontinuous skip reading the
    // call's row for its arguments' text.
    let op = d.op_name(i);
    if class == OpClass::Plain
        && args_may_make_discontinuous(op)
        && args_make_discontinuous(op, d.args_text(i))
    {
        OpClass::Discontinuous
    } else {
        class
    }
}

/// The rows of one call's tensors, read once, by tensor index: the whole
/// call's from tensor `start` on, or (`ids` not empty) those of tensors
/// `ids`, one element of a list call.
#[derive(Clone, Copy)]
struct CallRows<'r> {
    rows: &'r [TensorRow],
    start: u32,
    ids: &'r [u32],
}

impl<'r> CallRows<'r> {
    fn new(rows: &'r [TensorRow], start: u32, ids: &'r [u32]) -> Self {
        CallRows { rows, start, ids }
    }

    fn get(&self, t: u32) -> Option<&'r TensorRow> {
        if self.ids.is_empty() {
            self.rows.get(t.checked_sub(self.start)? as usize)
        } else {
            self.rows.get(self.ids.binary_search(&t).ok()?)
        }
    }

    fn row(&self, t: u32) -> &'r TensorRow {
        match self.get(t) {
            Some(r) => r,
            None => panic!("tensor {t} is not of this call"),
        }
    }

    /// Each row with its tensor's index.
    fn indexed(&self) -> Vec<(u32, TensorRow)> {
        self.rows
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let t = if self.ids.is_empty() {
                    self.start + k as u32
                } else {
                    self.ids[k]
                };
                (t, *r)
            })
            .collect()
    }
}

/// What an op pair's inputs tell about the rounding of its outputs.
#[derive(Default)]
struct Inputs<'d> {
    /// The compute dtype: the least precise float dtype, both sides.
    compute: Option<&'d DType>,
    /// Some input is a float (an integer output of float inputs is a
    /// discontinuity).
    any_float: bool,
    /// The largest rms and absolute value among A's float inputs.
    rms: f64,
    absmax: f64,
    /// The same over the gradient arguments of a backward kernel.
    grad_rms: f64,
    grad_absmax: f64,
    /// The input being reduced: the largest float input, its rms and its
    /// (L2, max) norms.
    reduced_numel: i64,
    reduced_rms: f64,
    reduced_norms: (f64, f64),
    /// The two largest factors of a product: (numel, rms).
    factors: [(i64, f64); 2],
}

impl<'d> Inputs<'d> {
    /// Scans the tensor pairs of op `op`.
    fn scan(
        ctx: &Ctx<'d>,
        op: &str,
        pairs: &[(Option<u32>, Option<u32>)],
        call_a: CallRows<'_>,
        call_b: CallRows<'_>,
    ) -> Self {
        let (a, b) = (ctx.a, ctx.b);
        let mut x = Inputs::default();
        for &(ta, tb) in pairs {
            if let Some(t) = ta {
                let r = call_a.row(t);
                x.consider(a.dtype_of(r));
                if r.role == Role::Input && a.dtype_of(r).is_float() {
                    x.any_float = true;
                    x.add_float_input(a, op, r);
                }
            }
            if let Some(t) = tb {
                let r = call_b.row(t);
                x.consider(b.dtype_of(r));
                if r.role == Role::Input && b.dtype_of(r).is_float() {
                    x.any_float = true;
                }
            }
        }
        x
    }

    /// Keeps the least precise float dtype.
    fn consider(&mut self, dt: &'d DType) {
        if dt.is_float()
            && self
                .compute
                .is_none_or(|c| dt.unit_roundoff > c.unit_roundoff)
        {
            self.compute = Some(dt);
        }
    }

    /// Takes in the scale of one float input of A.
    fn add_float_input(&mut self, a: &Dump, op: &str, r: &TensorRow) {
        let n = a.tensors.shapes.numel(r.shape);
        if !(r.has_values() && n > 0) {
            return;
        }
        let rms = r.l2 / (n as f64).sqrt();
        if rms.is_finite() {
            self.rms = self.rms.max(rms);
            if n > self.reduced_numel {
                (self.reduced_numel, self.reduced_rms) = (n, rms);
                self.reduced_norms = (r.l2, r.absmax);
            }
            if n > self.factors[1].0 && is_factor(op, a.names.get(r.arg)) {
                self.factors[1] = (n, rms);
                if n > self.factors[0].0 {
                    self.factors.swap(0, 1);
                }
            }
        }
        if r.absmax.is_finite() {
            self.absmax = self.absmax.max(r.absmax);
        }
        if is_gradient_arg(a.names.get(r.arg)) {
            if rms.is_finite() {
                self.grad_rms = self.grad_rms.max(rms);
            }
            if r.absmax.is_finite() {
                self.grad_absmax = self.grad_absmax.max(r.absmax);
            }
        }
    }

    /// The (rms, max) floor of an output of `numel` elements: what rounding
    /// of the terms it is made of explains when it cancels.
    fn output_floor(
        &self,
        op: &str,
        class: OpClass,
        (term_rms, term_absmax): (f64, f64),
        products: f64,
        numel: i64,
    ) -> (f64, f64) {
        // Each output element reduces this many of the input's.
        let k_out = self.reduced_numel as f64 / numel.max(1) as f64;
        // A norm's weight and bias gradients sum the gradient's terms over
        // the rows.
        let (sum_class, sum_rms) = if has_gradient_terms(op) && self.grad_rms > 0.0 {
            (OpClass::Sum, self.grad_rms)
        } else {
            (class, self.reduced_rms)
        };
        let rms = output_floor(sum_class, term_rms, sum_rms, k_out).max(products);
        (rms, (CANCELLATION_FLOOR * term_absmax).max(rms))
    }
}

/// The verdict a differing output gets instead of diverged: random ops,
/// and comparisons, rounding and integer outputs of float inputs (argmax,
/// topk indices, casts to int).
fn legit_verdict(role: Role, class: OpClass, discrete_of_float: bool) -> Option<TensorVerdict> {
    if role != Role::Output {
        None
    } else if class == OpClass::Rng {
        Some(TensorVerdict::Rng)
    } else if class == OpClass::Discontinuous || discrete_of_float {
        Some(TensorVerdict::Discontinuous)
    } else {
        None
    }
}
