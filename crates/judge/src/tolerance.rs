//! How large a relative difference rounding explains, per dtype and per
//! reduction length.
//!
//! Two correct kernels differ by rounding: about one unit roundoff `u` per
//! element for elementwise ops, growing like `sqrt(K) * u` for a reduction
//! over K elements summed in a different order (a random walk of rounding
//! errors). The default tolerance is `c * u * sqrt(K)`, capped so that a
//! 1e-3 relative fault in float32 is caught wherever the output does not
//! cancel (see `metrics::output_floor` for outputs that do):
//!
//! | dtype     | u        | c  | tol at K=1 | cap   |
//! |-----------|----------|----|------------|-------|
//! | float64   | 1.1e-16  | 16 | 1.8e-15    | 1e-9  |
//! | float32   | 6.0e-8   | 16 | 9.5e-7     | 2e-4  |
//! | float16   | 4.9e-4   | 4  | 2.0e-3     | 2e-2  |
//! | bfloat16  | 3.9e-3   | 4  | 1.6e-2     | 6e-2  |
//! | float8    | 6e-2+    | 2  | 1.3e-1     | 5e-1  |
//! | int/bool  | 0        |    | 0 (exact)  |       |
//!
//! The dtype is the least precise float dtype among all tensors of the op on
//! both sides (a bf16 run against an fp32 run is judged at bf16).
//! `--rtol DTYPE=VALUE` replaces the formula for that dtype by a constant.
//!
//! Two more questions use `min_amplification` (see `Ctx::judge`): rounding
//! drift of an op's inputs may grow that many times through the op before
//! an output counts as diverged, and an op *introduced* an error only when
//! its output error exceeds that many times the error that reached it from
//! upstream divergences.

use crate::dtype::DType;
use crate::opclass::OpClass;

/// How much one op may amplify an error. Well-conditioned ops amplify
/// relative errors by a small factor (softmax by about the logits'
/// magnitude); a fault of 1e-3 on inputs that differ by rounding (1e-7)
/// amplifies 10^4 times.
pub const DEFAULT_MIN_AMPLIFICATION: f64 = 32.0;

/// What part of `min_amplification` a smooth element-wise op may amplify
/// its inputs' drift by (see [`Tolerances::drift_amplification`]).
const ELEMENTWISE_SHARE: f64 = 4.0;

/// The most the inputs' drift summed over a reduction may add to what an
/// output is allowed (see [`Tolerances::summed_drift`]): float32's cap, so
/// that a 1e-3 fault in a sum stays visible whatever its inputs' drift.
pub const SUMMED_DRIFT_CAP: f64 = 2e-4;

/// Unit roundoff of float32, for statistics accumulated in float32.
const U32: f64 = (f32::EPSILON / 2.0) as f64;

/// The tolerance model: what rounding explains, per dtype and reduction length, and how much an op may amplify an error.
#[derive(Clone, Debug)]
pub struct Tolerances {
    /// `--rtol` overrides, by canonical dtype name.
    pub overrides: Vec<(String, f64)>,
    /// How many times an op may amplify its inputs' error (see the module).
    pub min_amplification: f64,
}

impl Default for Tolerances {
    fn default() -> Self {
        Tolerances {
            overrides: Vec::new(),
            min_amplification: DEFAULT_MIN_AMPLIFICATION,
        }
    }
}

/// The default (factor, cap) for a unit roundoff.
fn defaults(u: f64) -> (f64, f64) {
    if u <= 2e-16 {
        (16.0, 1e-9)
    } else if u <= 1e-7 {
        (16.0, 2e-4)
    } else if u <= 1e-3 {
        (4.0, 2e-2)
    } else if u <= 4e-3 {
        (4.0, 6e-2)
    } else {
        (2.0, 0.5)
    }
}

impl Tolerances {
    /// Relative tolerance for an op computing in `dtype` (None: only exact
    /// types) and reducing over `k` elements.
    pub fn rtol(&self, dtype: Option<&DType>, k: f64) -> f64 {
        let Some(dt) = dtype else {
            return self.override_for("int64").unwrap_or(0.0);
        };
        if let Some(v) = self.override_for(dt.canonical()) {
            return v;
        }
        let u = dt.unit_roundoff;
        if u == 0.0 {
            return 0.0;
        }
        let (c, cap) = defaults(u);
        (c * u * k.max(1.0).sqrt()).min(cap).max(c * u)
    }

    /// How many times an op of `class` may amplify the relative drift of
    /// its inputs before its output counts as diverged. A smooth
    /// element-wise op amplifies a relative input error by its condition
    /// number |x·f'(x)/f(x)| (1 for a product, about 1 to 4 for the
    /// activations over the inputs they see). The inputs' error is measured
    /// from below: by a sketch (`measured_well`), to within about half; by
    /// the statistics alone, zero-mean rounding may show a tenth of itself.
    /// So a quarter of `min_amplification` (8 by default) where the inputs'
    /// error was measured well, all of it otherwise, and all of it for ops
    /// that can cancel or that reduce. Derivation: `crates/cli/README.md`,
    /// "Tolerance model".
    pub fn drift_amplification(&self, class: OpClass, measured_well: bool) -> f64 {
        if class == OpClass::Elementwise && measured_well {
            self.min_amplification / ELEMENTWISE_SHARE
        } else {
            self.min_amplification
        }
    }

    /// What the inputs' drift `e_in` (relative) can make of a sum or mean
    /// over `k` elements: `δy = Σ δx_i`, so relative to the sum's floor
    /// (the partial sums' scale, `√K·rms(x)` per element, `‖x‖` for a full
    /// sum) its error is up to `√K·e_in` when the inputs' errors line up,
    /// and about `e_in` when they are independent. Drift from earlier
    /// steps lines up (a parameter moved by its update: the statistics show
    /// its mean moved, and the sum of it moves `√K` times that, measured:
    /// 38 to 229 times at K = 65,536). `min_amplification` (32) covers
    /// `√K` up to K = 1024, and a float32 op's own tolerance `c·u·√K`
    /// covers drift up to `c·u`; a float64 sum of float32 values has
    /// neither: its tolerance is 1e-13 and its inputs drift by float32's
    /// rounding. Capped at [`SUMMED_DRIFT_CAP`]. 0 for other classes.
    pub fn summed_drift(&self, class: OpClass, k: f64, e_in: f64) -> f64 {
        if matches!(class, OpClass::Sum | OpClass::Mean) && e_in > 0.0 {
            (k.max(1.0).sqrt() * e_in).min(SUMMED_DRIFT_CAP)
        } else {
            0.0
        }
    }

    fn override_for(&self, dtype: &str) -> Option<f64> {
        self.overrides
            .iter()
            .find(|(d, _)| d == dtype)
            .map(|&(_, v)| v)
    }

    /// The own rounding of the statistics themselves, relative to the
    /// tensor's norm: two devices sum in different orders, and pairwise sums
    /// err by about `u * log2(n)` in the accumulation type (float64, or
    /// float32 where a device has no float64).
    pub fn stats_noise(f32_accumulate: bool, numel: i64) -> f64 {
        let u = if f32_accumulate {
            U32
        } else {
            f64::EPSILON / 2.0
        };
        8.0 * u * (numel.max(2) as f64).log2()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ordered_and_catch_1e3_in_f32() {
        let t = Tolerances::default();
        let r = |n: &str, k: f64| t.rtol(Some(&DType::parse(n)), k);
        for k in [1.0, 64.0, 4096.0, 1e9] {
            assert!(r("bfloat16", k) > r("float16", k));
            assert!(r("float16", k) > r("float32", k));
            assert!(r("float32", k) > r("float64", k));
            assert!(r("float32", k) < 1e-3);
        }
        assert!(r("float32", 4096.0) > r("float32", 1.0));
        assert_eq!(t.rtol(None, 10.0), 0.0);
    }
}
