//! The rule of the accuracy check against a float64 CPU reference
//! (`OPDUMP_CHECK`, and online compare's check of the call it names).
//!
//! A call runs again on the CPU from its own inputs twice: in float64 (the
//! reference `R`) and in the inputs' own dtype (`C`, a known-good kernel at
//! the device's precision). With `D` the device's output and errors taken
//! as relative L2 norms, `e_D = ||D - R|| / ||R||` and
//! `e_C = ||C - R|| / ||R||`:
//!
//! ```text
//! ratio = e_D / max(e_C, u * sqrt(K))        fail when ratio > OFF_FACTOR
//! ```
//!
//! - `u` is the dtype's unit roundoff and `K` the call's reduction length
//!   ([`crate::metrics::reduction_length_of_shapes`]). A correct kernel of
//!   the same dtype rounds each output once (`e ~ u`) or sums `K` terms in
//!   its own order (`e ~ u * sqrt(K)` for orders whose errors do not line
//!   up), so the CPU's own error is the scale of a correct answer, and the
//!   floor keeps a CPU result that happens to be exact (a copy, a short
//!   sum) from making any rounding look like a fault.
//! - `OFF_FACTOR` (10) leaves room for kernels that are correct but a few
//!   ulp worse than the CPU's (fast transcendental functions, fused
//!   multiply-add in another order) and is the margin the tolerance model
//!   leaves between rounding and a fault (`HEADLINE_DOMINANCE`).
//!
//! Since the inputs are the call's own, the judgement carries nothing the
//! inputs accumulated earlier: it is the op's own error.

use crate::dtype::DType;
use crate::opclass::OpClass;

/// A device this many times further from float64 than a correct kernel of
/// the same precision is off.
pub const OFF_FACTOR: f64 = 10.0;

/// The unit roundoff of a floating dtype by torch's name (float32's for a
/// name that is no floating dtype: the check's outputs are floating).
pub fn unit_roundoff(dtype: &str) -> f64 {
    match DType::parse(dtype).unit_roundoff {
        0.0 => f64::from(f32::EPSILON) / 2.0,
        u => u,
    }
}

/// The error a correct kernel of `dtype` may show on a call that reduces
/// `reduction_len` elements into each output, at the least.
pub fn error_floor(dtype: &str, reduction_len: f64) -> f64 {
    unit_roundoff(dtype) * reduction_len.max(1.0).sqrt()
}

/// How many times further from float64 the device is than a correct
/// kernel: `device_err / max(cpu_err, error_floor)`.
pub fn ratio(device_err: f64, cpu_err: f64, dtype: &str, reduction_len: f64) -> f64 {
    if device_err.is_nan() {
        return f64::INFINITY;
    }
    let scale = if cpu_err.is_nan() { 0.0 } else { cpu_err };
    device_err / scale.max(error_floor(dtype, reduction_len))
}

/// The verdict of one checked call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckVerdict {
    /// As near float64 as a correct kernel of its dtype.
    Pass,
    /// Further than [`OFF_FACTOR`] times that.
    Fail,
    /// Not judged: no reference could be made (the reason says why).
    NoReference,
}

impl CheckVerdict {
    /// The name in the check's files and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckVerdict::Pass => "pass",
            CheckVerdict::Fail => "fail",
            CheckVerdict::NoReference => "no_reference",
        }
    }

    /// The verdict of a ratio.
    pub fn of_ratio(ratio: f64) -> Self {
        if ratio > OFF_FACTOR {
            CheckVerdict::Fail
        } else {
            CheckVerdict::Pass
        }
    }
}

/// Why a call has no reference before it is run, from its op's name:
/// random ops (two generators give two right answers) and ops whose
/// values are not defined by their inputs.
pub fn no_reference_for(op: &str, class: OpClass) -> Option<&'static str> {
    if class == OpClass::Rng {
        return Some("random op: another generator gives another right answer");
    }
    let base = crate::opclass::base_name(op);
    const UNDEFINED: &[&str] = &[
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "resize",
        "set",
    ];
    const NON_DETERMINISTIC: &[&str] = &[
        "_fused_dropout",
        "native_dropout",
        "dropout",
        "feature_dropout",
        "alpha_dropout",
    ];
    // Every `empty*` factory (`empty_permuted`, `new_empty`, the quantized
    // ones), and `resize_as_`, which leaves uninitialised memory where its
    // tensor grows (from an empty tensor, all of it).
    let empty =
        base.starts_with("empty") || base.starts_with("new_empty") || base.starts_with("_empty");
    if UNDEFINED.contains(&base) || empty || base == "resize_as" {
        return Some("its outputs hold no defined values");
    }
    if NON_DETERMINISTIC.contains(&base) {
        return Some("random op: another generator gives another right answer");
    }
    None
}

/// Whether a class's ULP figure is meaningful: element-wise functions,
/// whose outputs are each rounded once.
pub fn reports_ulp(class: OpClass) -> bool {
    matches!(
        class,
        OpClass::Elementwise | OpClass::ElementwiseSum | OpClass::Movement | OpClass::Plain
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_as_near_as_the_cpu_passes_and_a_fault_fails() {
        let u = unit_roundoff("float32");
        // Rounding like the CPU's.
        assert_eq!(
            CheckVerdict::of_ratio(ratio(3e-8, 2e-8, "float32", 1.0)),
            CheckVerdict::Pass
        );
        // A 0.1% fault in float32.
        assert_eq!(
            CheckVerdict::of_ratio(ratio(1e-3, 2e-8, "float32", 1.0)),
            CheckVerdict::Fail
        );
        // An exact CPU result does not make rounding a fault.
        assert_eq!(
            CheckVerdict::of_ratio(ratio(u, 0.0, "float32", 1.0)),
            CheckVerdict::Pass
        );
        // Another summation order over 4096 terms.
        assert_eq!(
            CheckVerdict::of_ratio(ratio(u * 64.0, u, "float32", 4096.0)),
            CheckVerdict::Pass
        );
        // A NaN the CPU does not make.
        assert_eq!(
            CheckVerdict::of_ratio(ratio(f64::NAN, 1e-8, "float32", 1.0)),
            CheckVerdict::Fail
        );
    }

    #[test]
    fn the_sensitivity_is_ten_times_a_correct_kernel() {
        // The smallest relative fault seen in bfloat16 element-wise ops is
        // ten times its rounding: about 4%.
        let cpu = unit_roundoff("bfloat16") / 3f64.sqrt();
        assert_eq!(
            CheckVerdict::of_ratio(ratio(0.01, cpu, "bfloat16", 1.0)),
            CheckVerdict::Pass
        );
        assert_eq!(
            CheckVerdict::of_ratio(ratio(0.05, cpu, "bfloat16", 1.0)),
            CheckVerdict::Fail
        );
    }

    #[test]
    fn random_and_undefined_ops_have_no_reference() {
        use crate::opclass::classify;
        for op in [
            "aten::bernoulli_",
            "aten::normal_",
            "aten::native_dropout",
            "aten::empty_like",
            "aten::empty_permuted",
            "aten::new_empty",
            "aten::resize_as_",
            "aten::_empty_affine_quantized",
        ] {
            assert!(no_reference_for(op, classify(op)).is_some(), "{op}");
        }
        for op in [
            "aten::mm",
            "aten::gelu",
            "aten::add_",
            "aten::_foreach_add_",
        ] {
            assert!(no_reference_for(op, classify(op)).is_none(), "{op}");
        }
    }
}
