//! An optimizer step two ways: AdamW's per-parameter loop (as on the CPU)
//! or its `_foreach_` list kernels (as on an accelerator), for the tests
//! that pair list elements with their parameters' calls.

use opdump_format::{Phase, TensorRecord};

use crate::synth::{input, output, DumpWriter};

/// Parameter shapes: all different, so a wrong pairing shows.
pub const SHAPES: [&[i64]; 5] = [&[4, 3], &[3], &[5, 2], &[7], &[2, 2, 2]];

/// The per-parameter kernels of a small AdamW step, in loop order, each
/// as (loop op, overload, list op, list overload): `mul_` twice (weight
/// decay on the parameter, then the second moment), so that one base op
/// has two list calls.
pub const KERNELS: [(&str, &str, &str); 4] = [
    ("aten::mul_", "Tensor", "aten::_foreach_mul_"),
    ("aten::lerp_", "Scalar", "aten::_foreach_lerp_"),
    ("aten::mul_", "Tensor", "aten::_foreach_mul_"),
    ("aten::addcdiv_", "default", "aten::_foreach_addcdiv_"),
];

/// The statistics' scale of parameter `i`'s tensors: (inputs, output) of
/// kernel `k`, chained so that an output feeds the next kernel that reads
/// it (the parameter after weight decay feeds `addcdiv_`, the first moment
/// after `lerp_` too).
pub fn values(i: usize, k: usize) -> (Vec<f64>, f64) {
    let i = i as f64;
    let p0 = 1.0 + i;
    let p1 = p0 * 0.999;
    let (ea0, g, ea1) = (0.5 + 0.1 * i, 0.2 + i, 0.3 + 0.1 * i);
    let (s0, s1) = (0.05 + 0.01 * i, 0.04 + 0.01 * i);
    match k {
        0 => (vec![p0], p1),
        1 => (vec![ea0, g], ea1),
        2 => (vec![s0], s1),
        _ => (vec![p1, ea1, 0.7 + i], p1 + 0.01),
    }
}

/// Argument names of kernel `k`'s tensor inputs, per-parameter and list.
pub fn args(k: usize, list: bool) -> &'static [&'static str] {
    match (k, list) {
        (0 | 2, _) => &["self"],
        (1, false) => &["self", "end"],
        (1, true) => &["self", "tensors1"],
        _ => &["self", "tensor1", "tensor2"],
    }
}

/// The parameter's name on kernel `k`'s tensor `j`, where the plugin
/// names it (parameters and gradients; optimizer states are unnamed).
fn name(i: usize, k: usize, j: usize) -> Option<String> {
    match (k, j) {
        (0, 0) | (3, 0) => Some(format!("w{i}")),
        (1, 1) => Some(format!("w{i}.grad")),
        _ => None,
    }
}

fn named(mut t: TensorRecord, n: Option<String>) -> TensorRecord {
    t.name = n;
    t
}

fn listed(mut t: TensorRecord, i: usize) -> TensorRecord {
    t.list_index = Some(i as i32);
    t
}

/// How a side differs from the plain one.
#[derive(Clone, Copy, Default)]
pub struct Twist {
    /// Kernel `k`'s output of parameter `i` is off by this factor.
    pub fault: Option<(usize, usize, f64)>,
    /// Parameter `i`'s call of kernel `k` is left out (loop side only).
    pub drop: Option<(usize, usize)>,
    /// A backward call makes parameter 3's gradient, off by this factor
    /// (1.0: exact); the optimizer reads it as made.
    pub grad3: Option<f64>,
}

/// The backward call that makes parameter 3's gradient (see
/// [`Twist::grad3`]), then the optimizer phase.
fn grad3_producer(w: &mut DumpWriter, twist: Twist) {
    if let Some(f) = twist.grad3 {
        w.phase = Phase::Backward;
        w.leaf(
            "aten::mul",
            "Tensor",
            "",
            vec![input("self", "float32", SHAPES[3], 0.3)],
            vec![output(0, "float32", SHAPES[3], values(3, 1).0[1] * f)],
        )
        .unwrap();
    }
    w.phase = Phase::Optimizer;
}

/// Parameter 3's gradient as the optimizer reads it: off by
/// [`Twist::grad3`]'s factor.
fn grad_factor(i: usize, twist: Twist) -> f64 {
    match twist.grad3 {
        Some(f) if i == 3 => f,
        _ => 1.0,
    }
}

/// One side's step 0 optimizer as one fused kernel (`_fused_adamw_`, as
/// with `fused=True` on an accelerator), after the forward call both
/// sides make: per element `i`, inputs `self` (named `w{i}`), `grads`
/// (`w{i}.grad`), `exp_avgs`, `exp_avg_sqs`, and the written outputs
/// `self`, `exp_avgs`, `exp_avg_sqs`, with the values [`adamw_step`]'s
/// loop reads and writes. `twist.fault` (kernel `k`, element `i`,
/// factor): `k` 3 puts the fault on the written parameter, 1 on the
/// first moment (and, through it, the parameter).
pub fn fused_adamw_step(w: &mut DumpWriter, twist: Twist) {
    w.leaf(
        "aten::mm",
        "default",
        "",
        vec![input("self", "float32", &[4, 4], 1.0)],
        vec![output(0, "float32", &[4, 4], 2.0)],
    )
    .unwrap();
    grad3_producer(w, twist);
    let fault = |i: usize, k: usize| match twist.fault {
        Some((fk, fi, f)) if fi == i && (fk == k || (fk == 1 && k == 3)) => f,
        _ => 1.0,
    };
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for (i, shape) in SHAPES.iter().enumerate() {
        let g = values(i, 1).0[1] * grad_factor(i, twist);
        let gf = grad_factor(i, twist);
        let with_arg = |mut t: TensorRecord, arg: &str| {
            t.arg = arg.to_string().into();
            t
        };
        ins.push(listed(
            named(
                input("self", "float32", shape, values(i, 0).0[0]),
                Some(format!("w{i}")),
            ),
            i,
        ));
        ins.push(listed(
            named(
                input("grads", "float32", shape, g),
                Some(format!("w{i}.grad")),
            ),
            i,
        ));
        ins.push(listed(
            input("exp_avgs", "float32", shape, values(i, 1).0[0]),
            i,
        ));
        ins.push(listed(
            input("exp_avg_sqs", "float32", shape, values(i, 2).0[0]),
            i,
        ));
        let o = |x: f64, arg: &str| with_arg(output(0, "float32", shape, x), arg);
        outs.push(listed(
            named(
                o(values(i, 3).1 * gf * fault(i, 3), "self"),
                Some(format!("w{i}")),
            ),
            i,
        ));
        outs.push(listed(o(values(i, 1).1 * gf * fault(i, 1), "exp_avgs"), i));
        outs.push(listed(o(values(i, 2).1, "exp_avg_sqs"), i));
    }
    w.leaf("aten::_fused_adamw_", "default", "", ins, outs)
        .unwrap();
}

/// One side: a forward call both sides make, then step 0's optimizer as a
/// per-parameter loop or as list calls (`_foreach_`), into `w`.
pub fn adamw_step(w: &mut DumpWriter, list: bool, twist: Twist) {
    w.leaf(
        "aten::mm",
        "default",
        "",
        vec![input("self", "float32", &[4, 4], 1.0)],
        vec![output(0, "float32", &[4, 4], 2.0)],
    )
    .unwrap();
    grad3_producer(w, twist);
    // A fault in the first moment's update carries on into the
    // `addcdiv_` that reads it: its input and, in proportion, its output.
    let carried = |i: usize, k: usize| match twist.fault {
        Some((1, fi, f)) if fi == i && (k == 1 || k == 3) => f,
        _ => 1.0,
    };
    let out_scale = |i: usize, k: usize| values(i, k).1 * carried(i, k);
    let in_scale = |i: usize, k: usize, j: usize| {
        let x = values(i, k).0[j];
        if (k, j) == (3, 1) {
            x * carried(i, k)
        } else {
            x
        }
    };
    if list {
        for (k, &(_, _, op)) in KERNELS.iter().enumerate() {
            let mut ins = Vec::new();
            for (j, arg) in args(k, true).iter().enumerate() {
                for (i, shape) in SHAPES.iter().enumerate() {
                    let t = input(arg, "float32", shape, in_scale(i, k, j));
                    ins.push(listed(named(t, name(i, k, j)), i));
                }
            }
            let outs = SHAPES
                .iter()
                .enumerate()
                .map(|(i, shape)| {
                    let mut t = output(0, "float32", shape, out_scale(i, k));
                    t.arg = "self".to_string().into();
                    listed(named(t, name(i, k, 0)), i)
                })
                .collect();
            w.leaf(op, "Scalar", "", ins, outs).unwrap();
        }
    } else {
        for (i, shape) in SHAPES.iter().enumerate() {
            for (k, &(op, overload, _)) in KERNELS.iter().enumerate() {
                if twist.drop == Some((k, i)) {
                    continue;
                }
                let mut ins: Vec<TensorRecord> = args(k, false)
                    .iter()
                    .enumerate()
                    .map(|(j, arg)| {
                        named(
                            input(arg, "float32", shape, in_scale(i, k, j)),
                            name(i, k, j),
                        )
                    })
                    .collect();
                if op == "aten::mul_" {
                    // The loop's `mul_` takes its factor as a tensor.
                    ins.push(input("other", "float32", &[], 0.999));
                }
                let out = named(output(0, "float32", shape, out_scale(i, k)), name(i, k, 0));
                w.leaf(op, overload, "", ins, vec![out]).unwrap();
            }
        }
    }
}
