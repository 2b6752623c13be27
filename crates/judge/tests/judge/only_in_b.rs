//! A fault in an op that only B runs: an extra `h * 1.01` after a
//! LayerNorm. No aligned op introduced it, yet every later output differs;
//! it must not read as "no divergence".

use opdump_format::Phase;
use opdump_judge::{OpVerdict, Outcome};
use opdump_testkit::scenarios::extra_op_in_b;
use opdump_testkit::synth::{input, output, DumpWriter};

use crate::common::*;

#[test]
fn a_fault_in_an_op_only_in_b_is_introduced_there() {
    let c = compare_sides(|w, side_b| extra_op_in_b(w, side_b, "aten::mul", 1.01));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert!(c.divergence_found());
    let u = c.first_unmatched_change.expect("a change only in B");
    let mul = u.b_op.expect("the op that made it");
    assert_eq!(c.b.op_name(mul), "aten::mul");
    assert_eq!(c.b.seq(mul), 1, "the mul is B's second call");
    assert_eq!(op_of(&c, Some(u.pair)), Some("aten::linear"));
    assert_eq!(c.b.arg_name(u.after), "input");
    assert!((0.005..0.02).contains(&u.rel_change), "{}", u.rel_change);
    // Every aligned op downstream inherits; none introduced it.
    assert_eq!(c.first_introduced, None);
    assert_eq!(op_of(&c, c.first_divergence), Some("aten::linear"));
    assert_eq!(
        c.op_verdict(c.first_divergence.unwrap()),
        OpVerdict::Inherited
    );
}

#[test]
fn an_op_only_in_b_that_changes_nothing_is_no_divergence() {
    let c = compare_sides(|w, side_b| extra_op_in_b(w, side_b, "aten::_to_copy", 1.0));
    assert_eq!(c.outcome(), Outcome::Agree);
    assert_eq!(c.first_unmatched_change, None);
    assert_eq!(c.alignment.only_b_calls, 1);
}

#[test]
fn a_change_within_tolerance_only_in_b_is_no_divergence() {
    let c = compare_sides(|w, side_b| extra_op_in_b(w, side_b, "aten::mul", 1.0 + 1e-8));
    assert_eq!(c.outcome(), Outcome::Agree);
    assert_eq!(c.first_unmatched_change, None);
}

/// `extra_op_in_b`'s two layers, with B's extra call an in-place `add_` that changes
/// the activations by 1%, and with `a_accumulates`, an `add_` of A's own at
/// the end of the step, on another tensor: the two are not aligned (a
/// backward pass accumulates gradients in an order that differs by device).
fn accumulation_run(w: &mut DumpWriter, side_b: bool, a_accumulates: bool) {
    let act = [8, 16];
    let mut x = 1.0;
    for layer in 0..2 {
        w.leaf(
            "aten::layer_norm",
            "default",
            "normalized_shape=[16], eps=1e-05",
            vec![input("input", "float32", &act, x)],
            vec![output(0, "float32", &act, 1.0)],
        )
        .unwrap();
        let mut h = 1.0;
        if side_b && layer == 0 {
            w.leaf(
                "aten::add_",
                "Tensor",
                "",
                vec![
                    input("self", "float32", &act, h),
                    input("other", "float32", &act, 0.01),
                ],
                vec![output(0, "float32", &act, h * 1.01)],
            )
            .unwrap();
            h *= 1.01;
        }
        w.leaf(
            "aten::gelu",
            "default",
            "approximate=none",
            vec![input("self", "float32", &act, h)],
            vec![output(0, "float32", &act, 0.4 * h)],
        )
        .unwrap();
        x = 0.4 * h;
    }
    if !side_b && a_accumulates {
        w.leaf(
            "aten::add_",
            "Tensor",
            "",
            vec![
                input("self", "float32", &[16, 16], 0.02),
                input("other", "float32", &[16, 16], 0.001),
            ],
            vec![output(0, "float32", &[16, 16], 0.021)],
        )
        .unwrap();
    }
}

#[test]
fn an_in_place_call_only_in_b_with_a_counterpart_in_a_is_not_blamed() {
    let c = compare_sides(|w, side_b| accumulation_run(w, side_b, true));
    assert_eq!(c.first_unmatched_change, None);
    assert_eq!(c.headline, None);
    assert_ne!(c.outcome(), Outcome::Introduced);
    // Without A's own add_, B's is a call A lacks: introduced there.
    let c = compare_sides(|w, side_b| accumulation_run(w, side_b, false));
    assert_eq!(c.outcome(), Outcome::Introduced);
    let u = c.first_unmatched_change.expect("a change only in B");
    assert_eq!(u.b_op.map(|i| c.b.op_name(i)), Some("aten::add_"));
}

/// A bfloat16 model's layer on B: a LayerNorm computed in float32, cast
/// back to bfloat16 by a call only B makes (A runs in float32 throughout),
/// then read by the linear as bfloat16. `factor`: how far the cast's
/// output is from its input, as the statistics matched them.
fn cast_only_in_b(w: &mut DumpWriter, side_b: bool, factor: f64) {
    let act = [8, 16];
    let low = if side_b { "bfloat16" } else { "float32" };
    w.leaf(
        "aten::layer_norm",
        "default",
        "normalized_shape=[16], eps=1e-05",
        vec![input("input", low, &act, 1.0)],
        vec![output(0, "float32", &act, 1.0)],
    )
    .unwrap();
    let mut h = 1.0;
    if side_b {
        w.leaf(
            "aten::_to_copy",
            "default",
            "dtype=bfloat16",
            vec![input("self", "float32", &act, 1.0)],
            vec![output(0, "bfloat16", &act, factor)],
        )
        .unwrap();
        h = factor;
    }
    w.leaf(
        "aten::linear",
        "default",
        "",
        vec![
            input("input", low, &act, h),
            input("weight", low, &[16, 16], 0.02),
        ],
        vec![output(0, low, &act, 0.5 * h)],
    )
    .unwrap();
}

#[test]
fn a_cast_only_in_b_is_never_an_introducer_by_itself() {
    // 10% apart: far beyond bfloat16's rounding, as when the statistics
    // took another tensor for the cast's input (a bf16 Qwen2's RMSNorm).
    let c = compare_sides(|w, side_b| cast_only_in_b(w, side_b, 1.1));
    assert_eq!(c.first_unmatched_change, None);
    assert_eq!(c.first_introduced, None);
    assert_ne!(c.outcome(), Outcome::Introduced);
    // A cast by its dtype's rounding is no divergence at all.
    let c = compare_sides(|w, side_b| cast_only_in_b(w, side_b, 1.0 + 2e-3));
    assert_eq!(c.outcome(), Outcome::Agree);
}

/// Two steps' worth of a training run's gradients (synth's 10M pair,
/// steps 3 and 4), without a fault in between: step 3's last layer-norm
/// backward, then step 4's forward, then step 4's first `gelu_backward`,
/// whose gradient the loss's backward made (no op in the dump). A's two
/// gradients have the very same statistics, so A's side alone takes the
/// step-3 tensor for the producer; on B each carries its own step's
/// rounding drift, 4.7e-7 above and 6.2e-7 below A's, 1.1e-6 apart: more
/// than one tolerance between the two, within it from A. Then a 1% fault
/// in an `addmm`, which must be the headline.
fn drift_across_steps(w: &mut DumpWriter, side_b: bool) {
    let act = [64, 128];
    let drift = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    let (up, down) = (drift(4.7e-7), drift(-6.2e-7));
    w.step = 3;
    w.phase = Phase::Backward;
    w.leaf(
        "aten::native_layer_norm_backward",
        "default",
        "normalized_shape=[128]",
        vec![
            input("grad_out", "float32", &act, 2e-3 * up),
            input("input", "float32", &act, 0.5),
        ],
        vec![output(0, "float32", &act, 1e-3 * up)],
    )
    .unwrap();
    w.step = 4;
    w.phase = Phase::Forward;
    w.leaf(
        "aten::gelu",
        "default",
        "approximate='none'",
        vec![input("self", "float32", &act, 0.7 * down)],
        vec![output(0, "float32", &act, 0.5 * down)],
    )
    .unwrap();
    if side_b {
        // A call only in B between the two, as B's decomposed layer_norm.
        w.leaf(
            "aten::mean",
            "dim",
            "dim=[-1], keepdim=True",
            vec![input("self", "float32", &act, 0.5 * down)],
            vec![output(0, "float32", &[64, 1], 0.05 * down)],
        )
        .unwrap();
    }
    w.phase = Phase::Backward;
    w.leaf(
        "aten::gelu_backward",
        "default",
        "approximate='none'",
        vec![
            input("grad_output", "float32", &act, 1e-3 * down),
            input("self", "float32", &act, 0.5 * down),
        ],
        vec![output(0, "float32", &act, 1.01e-3 * down)],
    )
    .unwrap();
    let fault = if side_b { 1.01 } else { 1.0 };
    w.leaf(
        "aten::addmm",
        "default",
        "beta=1, alpha=1",
        vec![
            input("self", "float32", &[128], 0.02),
            input("mat1", "float32", &act, 1.01e-3 * down),
            input("mat2", "float32", &[128, 128], 0.02),
        ],
        vec![output(0, "float32", &act, 0.3e-3 * down * fault)],
    )
    .unwrap();
}

#[test]
fn drift_of_another_steps_tensor_is_no_change_only_in_b() {
    let c = compare_sides(drift_across_steps);
    assert_eq!(c.first_unmatched_change, None);
    assert_eq!(op_of(&c, c.headline), Some("aten::addmm"));
    assert_eq!(c.outcome(), Outcome::Introduced);
}
