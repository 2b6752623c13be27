//! Sources of evidence about how much two tensors differ.
//!
//! Every dump carries statistics, which give a guaranteed *lower bound* on
//! the difference. Schema 4 adds a bitwise fingerprint (then "identical"
//! can be proven) and an error sketch (then the difference can be
//! estimated, not just bounded); captured values give it exactly. Each
//! source implements [`Evidence`] and adds what it knows to a [`Measure`];
//! the verdict code reads the measure and never asks which columns a dump
//! has.

use crate::dump::Dump;
use crate::tensor_row::TensorRow;

/// What is known about the difference of one tensor pair.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measure {
    /// Lower bound on ||a - b||_2.
    pub l2_bound: f64,
    /// Lower bound on ||a - b||_inf.
    pub linf_bound: f64,
    /// Every statistic is equal (not bitwise equality: a permutation keeps
    /// every statistic).
    pub stats_equal: bool,
    /// Some(true) when proven bitwise identical, Some(false) when proven
    /// different, None when unknown.
    pub identical: Option<bool>,
    /// An estimate of ||a - b||_2, when a source can give one.
    pub l2_estimate: Option<f64>,
    /// The sketches' estimate of ||a - b||_2 (unbiased in square, random:
    /// see `metrics` for how far it is trusted), when both tensors have a
    /// sketch of the same length; and that length.
    pub sketch_estimate: Option<f64>,
    /// The sketches' length, when they gave an estimate.
    pub sketch_k: usize,
    /// Both tensors' values were captured: the bounds are the exact norms.
    pub exact: bool,
}

/// A tensor of a dump and its row.
pub type Row<'a> = (u32, &'a TensorRow);

/// A source of evidence about how far two tensors differ: statistics, fingerprints, sketches, captured values.
pub trait Evidence: Sync {
    /// Whether both dumps carry what this source needs.
    fn available(&self, a: &Dump, b: &Dump) -> bool;
    /// Adds what this source says about tensor `ta` of `a` and `tb` of `b`,
    /// given with their rows (already read by the caller). Both have
    /// measured values and the same shape.
    fn measure(&self, a: &Dump, ta: Row<'_>, b: &Dump, tb: Row<'_>, m: &mut Measure);
}

/// The statistics columns: every dump has them.
pub struct StatsEvidence;

/// |x - y|, with two missing values (NaN: no finite element) as equal.
/// An infinite statistic of finite elements (a mean, std or norm that
/// overflowed while it was accumulated) says nothing: 0.
fn gap(x: f64, y: f64) -> f64 {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => 0.0,
        (false, false) if x.is_finite() && y.is_finite() => (x - y).abs(),
        (false, false) => 0.0,
        // One side has no finite element and the other has: the counts
        // differ, which is judged as a NaN/Inf mismatch before this matters.
        _ => 0.0,
    }
}

/// The smallest positive subnormal of the type a dump's statistics were
/// accumulated in. A square, or a mean, below the smallest normal number
/// is rounded to a multiple of it: an absolute error that no relative
/// tolerance covers.
fn underflow_unit(d: &Dump) -> f64 {
    if d.stats_accumulate == "float32" {
        f64::from(f32::from_bits(1))
    } else {
        F64_UNIT
    }
}

/// The smallest positive float64 subnormal, 2^-1074.
const F64_UNIT: f64 = f64::from_bits(1);

/// Whether what underflow can have taken off float64 statistics is below
/// the rounding of every quantity it would be taken from, so that taking it off
/// changes no result: then it is not computed. That is the common case, and
/// a fast one: with float64 statistics the unit is subnormal, and each
/// product, square root and quotient of a subnormal takes the processor's
/// slow path (a fifth of `opdump compare`'s time on 10M calls).
///
/// The slacks are at most sqrt(n·u) ≤ 2^-505 (norms) and n·u ≤ 2^-1010
/// (sums), for n < 2^63 and u ≤ 2^-1074. Against quantities above 2^-400,
/// whose nonzero differences are at least 2^-452, subtracting them rounds
/// back to the difference; a zero difference becomes a tiny negative that
/// the maximum with the exact extremes' gap (≥ 0) discards.
fn underflow_below_rounding(ra: &TensorRow, rb: &TensorRow, n: f64) -> bool {
    const SMALLEST: f64 = 2.5822498780869086e-121; // 2^-400
    let big = |v: f64| v.abs() > SMALLEST || v.is_nan();
    let sn = n.sqrt();
    big(ra.l2)
        && big(rb.l2)
        && big(ra.mean * n)
        && big(rb.mean * n)
        && big(ra.std * sn)
        && big(rb.std * sn)
}

/// How far a norm computed as sqrt(s + e) can be from sqrt(s) when the sum
/// of squares `s` lost `|e| <= lost` to underflow:
/// |e| / (sqrt(s + e) + sqrt(s)), at most sqrt(lost) and lost / norm.
fn norm_slack(norm: f64, lost: f64) -> f64 {
    if norm > 0.0 {
        lost.sqrt().min(lost / norm)
    } else {
        lost.sqrt()
    }
}

fn same(x: f64, y: f64) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

impl Evidence for StatsEvidence {
    fn available(&self, _: &Dump, _: &Dump) -> bool {
        true
    }

    fn measure(&self, a: &Dump, (ta, ra): Row<'_>, b: &Dump, (tb, rb): Row<'_>, m: &mut Measure) {
        let (x, y) = (&a.tensors, &b.tensors);
        // Each term is <= ||a - b||_2 (over the finite elements):
        // - | ||a|| - ||b|| |                 (triangle inequality)
        // - |sum a - sum b| / sqrt(n)         (Cauchy-Schwarz with the ones vector)
        // - |std a - std b| * sqrt(n)         (centring is a projection)
        // - |max a - max b|, |min a - min b|, |absmax a - absmax b|
        //                                     (each <= ||a - b||_inf <= ||a - b||_2)
        // The extremes are exact. The first three come from sums, whose
        // underflow is taken off them: each of the n squares, and the mean,
        // may have lost up to one subnormal unit (tests/evidence_prop.rs
        // found a 1e-5 overshoot for float64 values near 1e-160).
        let finite = |d: &Dump, t: u32, r: &TensorRow| {
            let [n, p, m] = d.tensors.nonfinite_counts(t);
            d.tensors.shapes.numel(r.shape) - n - p - m
        };
        let n = finite(a, ta, ra).min(finite(b, tb, rb)).max(0) as f64;
        let (mut ua, mut ub) = (underflow_unit(a), underflow_unit(b));
        if ua.max(ub) <= F64_UNIT && underflow_below_rounding(ra, rb, n) {
            (ua, ub) = (0.0, 0.0);
        }
        let linf = gap(ra.max, rb.max)
            .max(gap(ra.min, rb.min))
            .max(gap(ra.absmax, rb.absmax));
        let norm_gap = gap(ra.l2, rb.l2) - norm_slack(ra.l2, n * ua) - norm_slack(rb.l2, n * ub);
        let mut l2 = linf.max(norm_gap);
        if n > 0.0 {
            let sum_gap = gap(ra.mean * n, rb.mean * n) - n * (ua + ub);
            // sqrt(n) * std is the norm of the centred tensor.
            let (ca, cb) = (ra.std * n.sqrt(), rb.std * n.sqrt());
            let centred_gap = gap(ca, cb) - norm_slack(ca, n * ua) - norm_slack(cb, n * ub);
            l2 = l2.max(sum_gap / n.sqrt()).max(centred_gap);
        }
        m.l2_bound = m.l2_bound.max(l2);
        m.linf_bound = m.linf_bound.max(linf);
        m.stats_equal = same(ra.min, rb.min)
            && same(ra.max, rb.max)
            && same(ra.mean, rb.mean)
            && same(ra.std, rb.std)
            && same(ra.l2, rb.l2)
            && same(ra.absmax, rb.absmax)
            && x.nonfinite_counts(ta) == y.nonfinite_counts(tb)
            && ra.zero == rb.zero
            && x.shapes.numel(ra.shape) == y.shapes.numel(rb.shape);
    }
}

/// A bitwise fingerprint column (`fingerprint`), when both dumps have one:
/// equal fingerprints prove the tensors identical.
pub struct FingerprintEvidence;

impl Evidence for FingerprintEvidence {
    fn available(&self, a: &Dump, b: &Dump) -> bool {
        a.tensors.has_fingerprints && b.tensors.has_fingerprints
    }

    fn measure(&self, a: &Dump, (_, ra): Row<'_>, b: &Dump, (_, rb): Row<'_>, m: &mut Measure) {
        let fingerprint = |d: &Dump, r: &TensorRow| {
            Some(r.fingerprint).filter(|&f| d.tensors.has_fingerprints && f != 0)
        };
        if let (Some(fa), Some(fb)) = (fingerprint(a, ra), fingerprint(b, rb)) {
            m.identical = Some(fa == fb);
        }
    }
}

/// The error sketch column (`sketch`), when both dumps have one: an
/// estimate of ||a - b||_2 from the two tensors' projections.
pub struct SketchEvidence;

impl Evidence for SketchEvidence {
    fn available(&self, a: &Dump, b: &Dump) -> bool {
        !a.tensors.sketch_start.is_empty() && !b.tensors.sketch_start.is_empty()
    }

    fn measure(&self, a: &Dump, (ta, _): Row<'_>, b: &Dump, (tb, _): Row<'_>, m: &mut Measure) {
        let (Some(sa), Some(sb)) = (a.tensors.sketch(ta), b.tensors.sketch(tb)) else {
            return;
        };
        // A non-finite projection (a sketch that overflowed) says nothing.
        if let Some(est) = crate::sketch::estimate(sa, sb).filter(|e| e.is_finite()) {
            m.sketch_estimate = Some(est);
            m.sketch_k = sa.len();
        }
    }
}

/// The captured values themselves (`OPDUMP_CAPTURE`), where both dumps
/// captured the call: ||a - b||_2 and ||a - b||_inf exactly, and bitwise
/// identity. Last, so that it replaces what the other sources bounded.
pub struct CaptureEvidence;

impl Evidence for CaptureEvidence {
    fn available(&self, a: &Dump, b: &Dump) -> bool {
        a.has_captures() && b.has_captures()
    }

    fn measure(&self, a: &Dump, (ta, _): Row<'_>, b: &Dump, (tb, _): Row<'_>, m: &mut Measure) {
        if let Some(e) = crate::exact::exact_metrics(a, ta, b, tb, 0.0) {
            m.l2_bound = e.diff_l2;
            m.linf_bound = e.max_abs;
            m.l2_estimate = Some(e.diff_l2);
            m.identical = Some(e.identical);
            m.exact = true;
        }
    }
}

static STATS: StatsEvidence = StatsEvidence;
static FINGERPRINT: FingerprintEvidence = FingerprintEvidence;
static SKETCH: SketchEvidence = SketchEvidence;
static CAPTURE: CaptureEvidence = CaptureEvidence;

/// The sources both dumps support, weakest first: a later one overrides
/// what an earlier one said (captured values last).
pub fn available(a: &Dump, b: &Dump) -> Vec<&'static dyn Evidence> {
    let all: [&'static dyn Evidence; 4] = [&STATS, &FINGERPRINT, &SKETCH, &CAPTURE];
    all.into_iter().filter(|e| e.available(a, b)).collect()
}
