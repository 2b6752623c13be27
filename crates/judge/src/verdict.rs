//! Verdicts: per tensor pair, and per op call.

use serde::Serialize;

/// How two aligned tensors compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum TensorVerdict {
    /// A fingerprint proves them bitwise identical.
    Identical,
    /// Every statistic is equal (not proof of bitwise equality).
    StatsEqual,
    /// They differ, within what rounding explains.
    Close,
    /// They differ by more than the tolerance.
    Diverged,
    /// NaN, +Inf or -Inf counts differ: a divergence whatever the tolerance.
    NanMismatch,
    /// Shapes differ.
    ShapeMismatch,
    /// Output of a random op: the two devices' generators differ.
    Rng,
    /// Output of a discontinuous op (comparison, indices, rounding, cast to
    /// an integer type) that differs: a tiny input change may flip it.
    Discontinuous,
    /// One side has no measured values (uninitialized, not measured, ...).
    Unmeasured,
    /// The tensor exists on one side only.
    Unpaired,
}

impl TensorVerdict {
    /// Every verdict, in report order.
    pub const ALL: [TensorVerdict; 10] = [
        TensorVerdict::Identical,
        TensorVerdict::StatsEqual,
        TensorVerdict::Close,
        TensorVerdict::Diverged,
        TensorVerdict::NanMismatch,
        TensorVerdict::ShapeMismatch,
        TensorVerdict::Rng,
        TensorVerdict::Discontinuous,
        TensorVerdict::Unmeasured,
        TensorVerdict::Unpaired,
    ];

    /// The verdict's name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            TensorVerdict::Identical => "identical",
            TensorVerdict::StatsEqual => "stats_equal",
            TensorVerdict::Close => "close",
            TensorVerdict::Diverged => "diverged",
            TensorVerdict::NanMismatch => "nan_mismatch",
            TensorVerdict::ShapeMismatch => "shape_mismatch",
            TensorVerdict::Rng => "rng",
            TensorVerdict::Discontinuous => "discontinuous",
            TensorVerdict::Unmeasured => "unmeasured",
            TensorVerdict::Unpaired => "unpaired",
        }
    }

    /// Whether this pair, as an output, makes its op diverge.
    pub fn is_divergence(self) -> bool {
        matches!(
            self,
            TensorVerdict::Diverged
                | TensorVerdict::NanMismatch
                | TensorVerdict::ShapeMismatch
                | TensorVerdict::Unpaired
        )
    }

    /// A divergence with no finite size (counts or shapes differ).
    pub fn is_structural(self) -> bool {
        matches!(
            self,
            TensorVerdict::NanMismatch | TensorVerdict::ShapeMismatch | TensorVerdict::Unpaired
        )
    }
}

/// How an aligned op call compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpVerdict {
    /// No output diverged.
    Ok,
    /// Outputs diverged while no input error explains it: this op's kernel
    /// made the error.
    Introduced,
    /// Outputs diverged, and so had some input: the error came from upstream.
    Inherited,
    /// A random op whose outputs differ, as expected across devices.
    Rng,
    /// A discontinuous op whose outputs differ, as a tiny input change may do.
    Discontinuous,
    /// Outputs differ, but an enclosing op's outputs were compared and
    /// agree, and no later divergence reads them: a difference inside a
    /// kernel (a scratch buffer sized by the thread count, another
    /// internal algorithm) that does not reach its result. Not a
    /// divergence.
    Absorbed,
}

impl OpVerdict {
    /// Every verdict, in report order.
    pub const ALL: [OpVerdict; 6] = [
        OpVerdict::Ok,
        OpVerdict::Introduced,
        OpVerdict::Inherited,
        OpVerdict::Rng,
        OpVerdict::Discontinuous,
        OpVerdict::Absorbed,
    ];

    /// The verdict's name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            OpVerdict::Ok => "ok",
            OpVerdict::Introduced => "introduced",
            OpVerdict::Inherited => "inherited",
            OpVerdict::Rng => "rng",
            OpVerdict::Discontinuous => "discontinuous",
            OpVerdict::Absorbed => "absorbed",
        }
    }

    /// Whether an output diverged (introduced, inherited or absorbed).
    pub fn diverged(self) -> bool {
        matches!(self, OpVerdict::Introduced | OpVerdict::Inherited)
    }
}

/// The errors of one op call, as the op verdict needs them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpErrors {
    /// Largest relative error of an output (close or diverged); infinite
    /// for a structural divergence (NaN/Inf counts, shape).
    pub out_err: f64,
    /// Largest relative error of an input that had not diverged.
    pub explained_in_err: f64,
    /// Largest relative error of an input that had diverged; infinite when
    /// an input's NaN/Inf counts or shape differ.
    pub diverged_in_err: f64,
    /// Some output is a divergence.
    pub out_diverged: bool,
    /// Some output of a random / discontinuous op differs.
    pub legit_rng: bool,
    /// Some output of a discontinuous op differs.
    pub legit_discontinuous: bool,
    /// How much the op may concentrate its inputs' relative error: above 1
    /// for a selection (`metrics::concentration`), else 1.
    pub concentration: f64,
}

/// The op verdict: an op *introduced* an error when an output diverged and
/// its output error is more than `min_amplification` times the largest
/// error of an input that had itself diverged (inputs identical or merely
/// close cannot explain it); else it *inherited* it. A selection may
/// concentrate its input's error by `concentration` before it counts as
/// introduced: a wrong index or offset still does, from inputs that agree.
pub fn op_verdict(e: &OpErrors, min_amplification: f64) -> OpVerdict {
    if !e.out_diverged {
        return if e.legit_rng {
            OpVerdict::Rng
        } else if e.legit_discontinuous {
            OpVerdict::Discontinuous
        } else {
            OpVerdict::Ok
        };
    }
    if e.diverged_in_err.is_infinite() {
        return OpVerdict::Inherited;
    }
    if e.out_err > min_amplification * e.diverged_in_err * e.concentration {
        OpVerdict::Introduced
    } else {
        OpVerdict::Inherited
    }
}

/// Output error / max(input error, floor). The floor (one rounding of the
/// compute dtype) keeps exact inputs from making every ratio infinite.
pub fn amplification(out_err: f64, in_err: f64, floor: f64) -> f64 {
    out_err / in_err.max(floor).max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(out: f64, inp: f64) -> OpErrors {
        OpErrors {
            out_err: out,
            explained_in_err: 0.0,
            diverged_in_err: inp,
            out_diverged: true,
            legit_rng: false,
            legit_discontinuous: false,
            concentration: 1.0,
        }
    }

    #[test]
    fn introduced_vs_inherited() {
        assert_eq!(op_verdict(&e(1e-2, 0.0), 32.0), OpVerdict::Introduced);
        assert_eq!(op_verdict(&e(1e-2, 1e-7), 32.0), OpVerdict::Introduced);
        assert_eq!(op_verdict(&e(1e-2, 1e-2), 32.0), OpVerdict::Inherited);
        assert_eq!(
            op_verdict(&e(f64::INFINITY, 0.0), 32.0),
            OpVerdict::Introduced
        );
        assert_eq!(
            op_verdict(&e(f64::INFINITY, f64::INFINITY), 32.0),
            OpVerdict::Inherited
        );
        // One row of 300 (concentration about 17) holds 0.5 of an error of
        // 0.011 in the whole: inherited; from an input that agrees: a wrong
        // index, introduced.
        let moving = OpErrors {
            concentration: 17.0,
            ..e(0.5, 0.011)
        };
        assert_eq!(op_verdict(&moving, 32.0), OpVerdict::Inherited);
        assert_eq!(
            op_verdict(
                &OpErrors {
                    concentration: 17.0,
                    ..e(0.5, 0.0)
                },
                32.0
            ),
            OpVerdict::Introduced
        );
        let ok = OpErrors {
            out_diverged: false,
            ..e(0.0, 0.0)
        };
        assert_eq!(op_verdict(&ok, 32.0), OpVerdict::Ok);
        assert_eq!(
            op_verdict(
                &OpErrors {
                    legit_rng: true,
                    ..ok
                },
                32.0
            ),
            OpVerdict::Rng
        );
    }
}
