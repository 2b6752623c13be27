//! Small hand-made runs that the judge's tests judge in memory and the
//! CLI's tests write to disk to check the words of the report: each fills
//! a [`DumpWriter`] (in memory, or into files) with side A or side B.

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
