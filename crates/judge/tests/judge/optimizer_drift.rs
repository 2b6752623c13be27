//! A parameter that the previous step's optimizer changed differently on
//! the two sides: the first divergence is its first read, the run never
//! exits 0 while that pair is over its tolerance, and the verdict names
//! the optimizers' calls one side only makes.

use opdump_format::Phase;
use opdump_judge::{OpVerdict, Outcome, TensorVerdict};
use opdump_testkit::scenarios::{ln_bias_run, named};
use opdump_testkit::synth::{input, output};

use crate::common::*;

#[test]
fn a_parameter_the_optimizer_changed_is_a_divergence_with_its_source() {
    let c = compare_sides(|w, side_b| ln_bias_run(w, side_b, 1e-3, false));
    // Never "agree" while the bias is 1e-3 off: exit 3, no op to blame.
    assert!(tensors_judged(&c, TensorVerdict::Diverged) > 0);
    assert_eq!(
        c.outcome(),
        Outcome::DriftOnly,
        "{:?}",
        op_of(&c, c.headline)
    );
    assert_eq!(
        op_of(&c, c.first_divergence),
        Some("aten::native_layer_norm")
    );
    assert_eq!(step_of(&c, c.first_divergence), Some(1));
    // The sum that shows the drift inherits it from the LayerNorm that
    // read the changed bias; without that, it was "introduced".
    assert_eq!(ops_judged(&c, OpVerdict::Introduced), 0);
    let src = c.drift_source.as_ref().expect("a drift source");
    assert_eq!(src.name, "ln.bias");
    assert_eq!(src.step, 0);
    assert_eq!(Some(src.pair), c.first_divergence);
    assert_eq!(
        src.only_b,
        vec![("aten::_foreach_lerp_".into(), "Scalar".into(), 1)]
    );
    assert_eq!(src.only_a, vec![("aten::lerp_".into(), "Scalar".into(), 1)]);
    assert_eq!(src.unmatched_side(), None);
}

#[test]
fn a_change_by_calls_only_in_b_is_named_there() {
    // B's aligned `lerp_` agrees; a `mul_` only B makes changes the bias:
    // introduced, only in B, at that call.
    let c = compare_sides(|w, side_b| ln_bias_run(w, side_b, 1e-3, true));
    assert_eq!(c.outcome(), Outcome::Introduced);
    let ch = c.first_unmatched_change.expect("a change only in B");
    assert_eq!(ch.b_op.map(|i| c.b.op_name(i)), Some("aten::mul_"));
}

#[test]
fn the_same_optimizer_change_without_a_fault_agrees() {
    let c = compare_sides(|w, side_b| ln_bias_run(w, side_b, 0.0, false));
    assert_eq!(
        c.outcome(),
        Outcome::Agree,
        "{:?}",
        op_of(&c, c.first_divergence)
    );
    assert_eq!(c.drift_source, None);
}

#[test]
fn a_fault_after_the_changed_parameter_is_still_named() {
    // The sum off by 1e-2: far beyond what the LayerNorm's output may
    // carry unseen from the bias.
    let c = compare_sides(|w, side_b| ln_bias_run(w, side_b, 0.25, false));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::sum"));
}

#[test]
fn a_parameter_drifted_within_rounding_of_any_op_agrees() {
    // A few optimizer steps moved a bias by 2.3e-6 of itself (float32
    // drift the optimizers' inputs do not explain), and a cast reads it,
    // whose own tolerance is 9.5e-7: within what an unknown producer's
    // rounding may make (float32's cap, 2e-4), so no divergence; 1e-3 is.
    for (drift, outcome) in [(2.3e-6, Outcome::Agree), (1e-3, Outcome::DriftOnly)] {
        let c = compare_sides(|w, side_b| {
            let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
            w.phase = Phase::Optimizer;
            let op = if side_b {
                "aten::_foreach_lerp_"
            } else {
                "aten::lerp_"
            };
            w.leaf(
                op,
                "Scalar",
                "weight=0.1",
                vec![named(input("self", "float32", &[384], 0.05), "qkv.bias")],
                vec![output(0, "float32", &[384], 0.05 * f(drift))],
            )
            .unwrap();
            w.step = 1;
            w.phase = Phase::Forward;
            w.leaf(
                "aten::_to_copy",
                "default",
                "dtype=torch.float64",
                vec![named(
                    input("self", "float32", &[384], 0.05 * f(drift)),
                    "qkv.bias",
                )],
                vec![output(0, "float64", &[384], 0.05 * f(drift))],
            )
            .unwrap();
        });
        assert_eq!(c.outcome(), outcome, "drift {drift}");
    }
}
