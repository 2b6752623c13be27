//! A parameter that the previous step's optimizer changed differently on
//! the two sides: the first divergence is its first read, the run never
//! exits 0 while that pair is over its tolerance, and the verdict names
//! the optimizers' calls one side only makes.

use opdump_format::{Phase, TensorRecord};
use opdump_judge::{OpVerdict, Outcome, TensorVerdict};
use opdump_testkit::synth::{input, output, DumpWriter};

use crate::common::*;

fn named(mut t: TensorRecord, name: &str) -> TensorRecord {
    t.name = Some(name.to_string());
    t
}

/// Step 0 and the forward and backward of step 1 of a model with one
/// LayerNorm, whose bias starts at 1e-3 (a first Adam step moved it by
/// the learning rate). Step 0's optimizer is a per-parameter `lerp_` on A
/// and a `_foreach_lerp_` on B (with `extra_b`, B's is A's call plus a
/// `mul_` A does not make); B's update leaves the bias `fault` off (1e-3:
/// a planted `_foreach_lerp_=scale:1.001`). Step 1's LayerNorm output
/// hardly moves (the bias is 1e-3 of it), and a `sum` over its rows in
/// backward shows the difference that the statistics did not: 4e-5,
/// beyond its tolerance (2.2e-5), from an input that shows 6e-8.
fn ln_bias_run(w: &mut DumpWriter, side_b: bool, fault: f64, extra_b: bool) {
    let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    let act = [512, 64];
    for step in 0..2 {
        w.step = step;
        w.phase = Phase::Forward;
        let bias = if step == 0 { 1e-3 } else { 1.1e-3 * f(fault) };
        let drift = if step == 0 { 0.0 } else { 6e-8 };
        w.leaf(
            "aten::native_layer_norm",
            "default",
            "normalized_shape=[64], eps=1e-05",
            vec![
                input("input", "float32", &act, 1.0),
                named(input("weight", "float32", &[64], 1.0), "ln.weight"),
                named(input("bias", "float32", &[64], bias), "ln.bias"),
            ],
            vec![output(0, "float32", &act, 1.0 * f(drift))],
        )
        .unwrap();
        w.phase = Phase::Backward;
        let diff = if step == 0 { 0.0 } else { 4e-5 * fault / 1e-3 };
        w.leaf(
            "aten::sum",
            "dim_IntList",
            "dim=[0], keepdim=False, dtype=None",
            vec![input("self", "float32", &act, 1.0 * f(drift))],
            vec![output(0, "float32", &[64], 30.0 * f(diff))],
        )
        .unwrap();
        if step == 1 {
            break;
        }
        w.phase = Phase::Optimizer;
        // With `extra_b`, B's `mul_` makes the fault, not its update.
        let b_fault = if extra_b { 0.0 } else { fault };
        let update = |op: &str, overload: &str, args: &str, w: &mut DumpWriter| {
            w.leaf(
                op,
                overload,
                args,
                vec![
                    named(input("self", "float32", &[64], 1e-3), "ln.bias"),
                    input("end", "float32", &[64], 30.0),
                ],
                vec![output(0, "float32", &[64], 1.1e-3 * f(b_fault))],
            )
            .unwrap();
        };
        if !side_b || extra_b {
            update("aten::lerp_", "Scalar", "weight=0.1", w);
        } else {
            update("aten::_foreach_lerp_", "Scalar", "weight=0.1", w);
        }
        if side_b && extra_b {
            w.leaf(
                "aten::mul_",
                "Scalar",
                "other=1.001",
                vec![input("self", "float32", &[64], 1.1e-3)],
                vec![output(0, "float32", &[64], 1.1e-3 * f(fault))],
            )
            .unwrap();
        }
    }
}

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
