//! Small hand-made runs that the judge's tests judge in memory and the
//! CLI's tests write to disk to check the words of the report: each fills
//! a [`DumpWriter`] (in memory, or into files) with side A or side B.

use opdump_format::{Phase, TensorRecord};

use crate::synth::{input, output, DumpWriter};

/// Two independent ops on data identical on both sides: `aten::tanh` makes
/// an error of `weak_err` (amplification weak_err / u), then `aten::gelu`
/// one of `strong_err`.
pub fn two_faults(w: &mut DumpWriter, side_b: bool, weak_err: f64, strong_err: f64) {
    let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    for (op, e) in [("aten::tanh", weak_err), ("aten::gelu", strong_err)] {
        w.leaf(
            op,
            "default",
            "",
            vec![input("self", "float32", &[64, 64], 1.0)],
            vec![output(0, "float32", &[64, 64], 0.5 * f(e))],
        )
        .unwrap();
    }
}

/// A weight that differs from the start (`weight_err` relative, on B),
/// one row of it selected by `as_strided` (whose output differs by
/// `row_err`: the row holds more of the difference), then a `mul` of the
/// row by data.
pub fn selected_row(w: &mut DumpWriter, side_b: bool, weight_err: f64, row_err: f64) {
    let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    w.leaf(
        "aten::as_strided",
        "default",
        "size=[1, 64], stride=[64, 1], storage_offset=640",
        vec![input("self", "float32", &[300, 64], 0.02 * f(weight_err))],
        vec![output(0, "float32", &[1, 64], 0.02 * f(row_err))],
    )
    .unwrap();
    w.leaf(
        "aten::mul",
        "Tensor",
        "",
        vec![
            input("self", "float32", &[1, 64], 0.02 * f(row_err)),
            input("other", "float32", &[1, 64], 1.0),
        ],
        vec![output(0, "float32", &[1, 64], 0.02 * f(row_err))],
    )
    .unwrap();
}

/// Two layers of LayerNorm > Linear > GELU; on B, `extra` runs between the
/// first LayerNorm and its Linear, scaling the activations by `factor`
/// (1.0: a copy that changes nothing).
pub fn extra_op_in_b(w: &mut DumpWriter, side_b: bool, extra: &str, factor: f64) {
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
                extra,
                "Tensor",
                "",
                vec![input("self", "float32", &act, h)],
                vec![output(0, "float32", &act, h * factor)],
            )
            .unwrap();
            h *= factor;
        }
        w.leaf(
            "aten::linear",
            "default",
            "",
            vec![
                input("input", "float32", &act, h),
                input("weight", "float32", &[16, 16], 0.02 + layer as f64),
            ],
            vec![output(0, "float32", &act, 0.5 * h)],
        )
        .unwrap();
        w.leaf(
            "aten::gelu",
            "default",
            "approximate=none",
            vec![input("self", "float32", &act, 0.5 * h)],
            vec![output(0, "float32", &act, 0.4 * h)],
        )
        .unwrap();
        x = 0.4 * h;
    }
}

/// `t` as the parameter `name`.
pub fn named(mut t: TensorRecord, name: &str) -> TensorRecord {
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
pub fn ln_bias_run(w: &mut DumpWriter, side_b: bool, fault: f64, extra_b: bool) {
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
