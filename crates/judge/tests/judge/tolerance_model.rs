//! The rules that keep two correct devices from raising false alarms, and
//! the headline from hiding a real fault (see the README's "Tolerance model"):
//! a cancelled sum is judged against its partial sums, an op that only
//! moves elements never introduces an error its input brings, a fault far
//! stronger than the first introduced op takes the headline, and the
//! outcome separates "an op introduced it" from "drift, no op to blame".

use opdump_format::{OpRecord, Stats, TensorRecord};
use opdump_judge::{OpVerdict, Outcome};
use opdump_testkit::scenarios::{selected_row, two_faults};
use opdump_testkit::synth::{input, output, DumpWriter};

use crate::common::*;

/// The records `fill` makes, in memory.
fn records(fill: impl Fn(&mut DumpWriter)) -> Vec<OpRecord> {
    let mut w = DumpWriter::in_memory();
    fill(&mut w);
    w.records()
}

/// `t` with its statistics set from explicit values (min, max, mean, std).
fn with_stats(mut t: TensorRecord, min: f64, max: f64, mean: f64, std: f64) -> TensorRecord {
    let n = t.numel as f64;
    t.stats = Stats {
        min,
        max,
        mean,
        std,
        l2: (n * (mean * mean + std * std)).sqrt(),
        absmax: min.abs().max(max.abs()),
        nan_count: 0,
        posinf_count: 0,
        neginf_count: 0,
        zero_count: 0,
    };
    t
}

/// A backward pass in miniature: `mm` makes a key gradient of about 1e-7
/// per element, `sum.dim_IntList` reduces it over 512 tokens to a key-bias
/// gradient that is zero in exact arithmetic (about 1e-11 of rounding, and
/// different rounding on each side), then `embedding_dense_backward` runs
/// on independent inputs, with its output scaled by `late_fault` on B.
fn bias_grad_run(w: &mut DumpWriter, side_b: bool, late_fault: f64) {
    // One rounding of float32 on B's side of the same tensor.
    let r = if side_b { 1.0 + 6e-8 } else { 1.0 };
    w.leaf(
        "aten::mm",
        "default",
        "",
        vec![
            input("self", "float32", &[512, 64], 2e-5),
            input("mat2", "float32", &[64, 128], 0.02),
        ],
        vec![with_stats(
            output(0, "float32", &[512, 128], 1.0),
            -4.8e-7 * r,
            5.0e-7,
            -4.7e-16 * r,
            9.77e-8 * r,
        )],
    )
    .unwrap();
    // The sum's rounding: its values are tiny and differ entirely between
    // the sides (relative error ~1, as measured on a BERT), yet by ~1e-12
    // absolute, far below the partial sums' rounding.
    let out = if side_b {
        (-3.0e-12, 0.5e-12, 8.0e-14, 9.0e-13)
    } else {
        (-1.1e-12, 1.2e-12, -5.1e-14, 4.8e-13)
    };
    w.leaf(
        "aten::sum",
        "dim_IntList",
        "dim=[0], keepdim=True, dtype=None",
        vec![with_stats(
            input("self", "float32", &[512, 128], 1.0),
            -4.8e-7 * r,
            5.0e-7,
            -4.7e-16 * r,
            9.77e-8 * r,
        )],
        vec![with_stats(
            output(0, "float32", &[1, 128], 1.0),
            out.0,
            out.1,
            out.2,
            out.3,
        )],
    )
    .unwrap();
    w.phase = opdump_format::Phase::Backward;
    w.leaf(
        "aten::embedding_dense_backward",
        "default",
        "num_weights=300, padding_idx=-1, scale_grad_by_freq=False",
        vec![input("grad_output", "float32", &[4, 32, 64], 0.01)],
        vec![output(
            0,
            "float32",
            &[300, 64],
            0.003 * if side_b { late_fault } else { 1.0 },
        )],
    )
    .unwrap();
}

#[test]
fn a_cancelled_sum_is_rounding_not_a_divergence() {
    let c = compare_sides(|w, side_b| bias_grad_run(w, side_b, 1.0));
    assert_eq!(
        c.outcome(),
        Outcome::Agree,
        "{:?}",
        op_of(&c, c.first_divergence)
    );
    assert_eq!(c.first_divergence, None);
}

#[test]
fn a_fault_after_a_cancelled_sum_is_the_headline() {
    let c = compare(
        dump("a", &records(|w| bias_grad_run(w, false, 1.0))),
        dump("b", &records(|w| bias_grad_run(w, true, 1.01))),
    );
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(
        op_of(&c, c.headline),
        Some("aten::embedding_dense_backward")
    );
    assert!(!headline_dominates(&c));
}

#[test]
fn a_far_stronger_later_fault_takes_the_headline() {
    // tanh: 3e-6, 3 times its tolerance; gelu: 1e-2, 10^4 times: 3000
    // times further beyond it.
    let c = compare_sides(|w, side_b| two_faults(w, side_b, 3e-6, 1e-2));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.first_introduced), Some("aten::tanh"));
    assert_eq!(op_of(&c, c.headline), Some("aten::gelu"));
    assert!(headline_dominates(&c));
}

#[test]
fn a_later_fault_of_similar_strength_leaves_the_first_as_headline() {
    // 2e-4 against 1e-3: five times further, not ten.
    let c = compare_sides(|w, side_b| two_faults(w, side_b, 2e-4, 1e-3));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::tanh"));
    assert!(!headline_dominates(&c));
    assert_eq!(c.top_introduced.len(), 2);
}

#[test]
fn an_op_that_only_moves_elements_never_introduces_what_its_input_brings() {
    let c = compare_sides(|w, side_b| selected_row(w, side_b, 0.011, 0.5));
    assert_eq!(c.headline, None);
    assert_eq!(ops_judged(&c, OpVerdict::Introduced), 0);
    assert_eq!(op_of(&c, c.first_divergence), Some("aten::as_strided"));
    let class = c.detail(c.first_divergence.unwrap()).class;
    assert_eq!(class.map(|k| k.as_str()), Some("movement"));
    // The weight differed before any op: a divergence with no op to blame.
    assert_eq!(c.outcome(), Outcome::DriftOnly);
    assert_eq!(c.outcome().exit_status(), 3);
}

#[test]
fn a_selection_that_makes_more_error_than_it_can_concentrate_introduces() {
    // The weight drifted by one rounding (1e-7); the selected row is off by
    // 1e-3, far more than one row of 300 can hold of 1e-7 (about 17 times).
    let c = compare_sides(|w, side_b| selected_row(w, side_b, 1e-7, 1e-3));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::as_strided"));
}

#[test]
fn an_op_that_moves_elements_wrongly_from_equal_inputs_introduces() {
    // The weight agrees; the selected row does not: a wrong offset.
    let c = compare_sides(|w, side_b| selected_row(w, side_b, 0.0, 0.5));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::as_strided"));
}

/// A key bias that is rounding noise (it differs by 47% between the sides,
/// at 1e-7 next to a product of 0.5) added by `addmm`, whose output is
/// close; then a `gelu` whose output drifts by `gelu_err` from an input
/// that differs by one rounding.
fn noisy_bias(w: &mut DumpWriter, side_b: bool, gelu_err: f64) {
    let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    let act = [128, 64];
    w.leaf(
        "aten::addmm",
        "default",
        "",
        vec![
            input("self", "float32", &[64], 1e-7 * f(0.47)),
            input("mat1", "float32", &act, 1.0),
            input("mat2", "float32", &[64, 64], 0.07),
        ],
        vec![output(0, "float32", &act, 0.5 * f(6e-8))],
    )
    .unwrap();
    w.leaf(
        "aten::gelu",
        "default",
        "approximate=none",
        vec![input("self", "float32", &act, 0.5 * f(6e-8))],
        vec![output(0, "float32", &act, 0.3 * f(gelu_err))],
    )
    .unwrap();
}

#[test]
fn an_input_that_differs_without_reaching_the_output_blames_no_op_after() {
    // 1.5e-6: above gelu's own tolerance (9.5e-7), within what its input's
    // rounding explains (9.5e-7 + 32 x 6e-8).
    let c = compare_sides(|w, side_b| noisy_bias(w, side_b, 1.5e-6));
    // The bias differs by 47% with no aligned op to have made it: the runs
    // differ there, a divergence with no op to blame (never "agree" while
    // a tensor pair is over its tolerance), and nothing after it diverges.
    assert_eq!(c.outcome(), Outcome::DriftOnly);
    assert_eq!(op_of(&c, c.first_divergence), Some("aten::addmm"));
    assert_eq!(ops_judged(&c, OpVerdict::Ok), 2);
    assert_eq!(c.drift_source, None);
    // A real fault in gelu is still introduced.
    let c = compare_sides(|w, side_b| noisy_bias(w, side_b, 1e-2));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::gelu"));
}

/// One training step in miniature where the optimizer differs by device: a
/// bias gradient made by an aligned `sum` (`grad_noise`: the sides' sums
/// differ by that much, relative), a per-parameter `addcdiv_` on A against
/// a `_foreach_addcdiv_` on B (B's update off by `update_err` more than the
/// gradient explains), then the next step's `add` of the bias.
fn optimizer_by_device(w: &mut DumpWriter, side_b: bool, grad_noise: f64, update_err: f64) {
    use opdump_format::Phase;
    let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    let act = [512, 64];
    // Adam's first step turns a gradient that is rounding noise into an
    // update of relative size 1: the bias differs as much as its gradient.
    let bias = 1e-3 * f(grad_noise) * f(update_err);
    // A gradient that differs by more than rounding of its partial sums
    // would be a divergence of the `sum`: the noisy one cancels to 1e-9.
    let grad = if grad_noise > 1e-3 { 1e-9 } else { 1e-4 };
    for step in 0..2 {
        w.step = step;
        w.phase = Phase::Forward;
        w.leaf(
            "aten::add",
            "Tensor",
            "",
            vec![
                input("self", "float32", &act, 1.0),
                input(
                    "other",
                    "float32",
                    &[64],
                    if step == 0 { 1e-3 } else { bias },
                ),
            ],
            vec![output(
                0,
                "float32",
                &act,
                if step == 0 {
                    1.0
                } else {
                    f(1e-3 * (grad_noise + update_err))
                },
            )],
        )
        .unwrap();
        if step == 1 {
            break;
        }
        w.phase = Phase::Backward;
        w.leaf(
            "aten::sum",
            "dim_IntList",
            "dim=[0], keepdim=False, dtype=None",
            vec![input("self", "float32", &act, 1e-4)],
            vec![output(0, "float32", &[64], grad * f(grad_noise))],
        )
        .unwrap();
        w.phase = Phase::Optimizer;
        let grad = input("tensor1", "float32", &[64], grad * f(grad_noise));
        let param = input("self", "float32", &[64], 1e-3);
        if side_b {
            w.leaf(
                "aten::_foreach_addcdiv_",
                "ScalarList",
                "",
                vec![param, grad],
                vec![output(0, "float32", &[64], bias)],
            )
            .unwrap();
        } else {
            w.leaf(
                "aten::addcdiv_",
                "default",
                "value=-0.001",
                vec![param, grad],
                vec![output(0, "float32", &[64], bias)],
            )
            .unwrap();
        }
    }
}

#[test]
fn a_parameter_made_by_calls_one_side_only_is_judged_by_what_they_were_fed() {
    // The gradient is noise (0.6 apart), so is the bias it updated: the
    // next step's `add` differs by what that explains. No divergence.
    let c = compare_sides(|w, side_b| optimizer_by_device(w, side_b, 0.6, 0.0));
    assert_eq!(
        c.outcome(),
        Outcome::Agree,
        "{:?}",
        op_of(&c, c.first_divergence)
    );
    assert!(c.alignment.only_b_calls >= 1);
    // The gradient agrees, B's update is 1% off: a divergence that the
    // optimizer's inputs do not explain.
    let c = compare_sides(|w, side_b| optimizer_by_device(w, side_b, 1e-7, 1e-2));
    assert_ne!(c.outcome(), Outcome::Agree);
    assert_eq!(op_of(&c, c.first_divergence), Some("aten::add"));
    assert_eq!(step_of(&c, c.first_divergence), Some(1));
}

#[test]
fn a_cancelled_matrix_product_is_rounding_not_a_divergence() {
    // A product over 512 terms of two factors of RMS 0.05 whose terms
    // cancel to 4e-7 (partial sums near √512 · 0.05 · 0.05 = 0.057), by
    // 6e-7 different on each side: 8 times u·√K of the partial sums.
    let c = compare_sides(|w, side_b| {
        w.leaf(
            "aten::mm",
            "default",
            "",
            vec![
                input("self", "float32", &[64, 512], 0.05),
                input("mat2", "float32", &[512, 64], 0.05),
            ],
            vec![output(
                0,
                "float32",
                &[64, 64],
                if side_b { 1.6e-7 } else { 4e-7 },
            )],
        )
        .unwrap();
    });
    assert_eq!(c.outcome(), Outcome::Agree);
    assert_eq!(c.first_divergence, None);
}

/// Two parameters updated by one `_fused_adamw_` over both on A and one
/// `_foreach_addcdiv_` over both on B: the bias's gradient is rounding
/// noise (0.6 apart), the weight's agrees; B's weight update is off by
/// `weight_fault`. The next step reads both.
fn two_params(w: &mut DumpWriter, side_b: bool, weight_fault: f64) {
    use opdump_format::Phase;
    let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    let act = [512, 64];
    let listed = |mut t: TensorRecord, i: i32| {
        t.list_index = Some(i);
        t
    };
    let bias = 1e-3 * f(0.6);
    let weight = 0.02 * f(weight_fault);
    w.phase = Phase::Backward;
    w.leaf(
        "aten::sum",
        "dim_IntList",
        "dim=[0], keepdim=False, dtype=None",
        vec![input("self", "float32", &act, 1e-4)],
        vec![output(0, "float32", &[64], 1e-9 * f(0.6))],
    )
    .unwrap();
    w.leaf(
        "aten::mm",
        "default",
        "",
        vec![
            input("self", "float32", &[64, 512], 1.0),
            input("mat2", "float32", &act, 1e-4),
        ],
        vec![output(0, "float32", &[64, 64], 2e-3)],
    )
    .unwrap();
    w.phase = Phase::Optimizer;
    let grads = [
        input("tensor1", "float32", &[64], 1e-9 * f(0.6)),
        input("tensor1", "float32", &[64, 64], 2e-3),
    ];
    let params = [
        input("self", "float32", &[64], 1e-3),
        input("self", "float32", &[64, 64], 0.02),
    ];
    let new = [
        output(0, "float32", &[64], bias),
        output(0, "float32", &[64, 64], weight),
    ];
    // Both sides update both parameters in one list op: only the list
    // element tells which gradient made which parameter.
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for i in 0..2 {
        ins.push(listed(params[i].clone(), i as i32));
        ins.push(listed(grads[i].clone(), i as i32));
        let mut o = listed(new[i].clone(), i as i32);
        o.arg = "self".into();
        outs.push(o);
    }
    let (op, overload) = if side_b {
        ("aten::_foreach_addcdiv_", "ScalarList")
    } else {
        ("aten::_fused_adamw_", "default")
    };
    w.leaf(op, overload, "", ins, outs).unwrap();
    w.step = 1;
    w.phase = Phase::Forward;
    w.leaf(
        "aten::add",
        "Tensor",
        "",
        vec![
            input("self", "float32", &act, 1.0),
            input("other", "float32", &[64], bias),
        ],
        vec![output(0, "float32", &act, f(6e-4))],
    )
    .unwrap();
    w.leaf(
        "aten::mm",
        "default",
        "",
        vec![
            input("self", "float32", &act, 0.9),
            input("mat2", "float32", &[64, 64], weight),
        ],
        vec![output(0, "float32", &act, 0.16 * f(weight_fault))],
    )
    .unwrap();
}

#[test]
fn a_list_op_explains_each_element_by_its_own_inputs() {
    // The noisy bias gradient explains the bias, not the weight.
    let c = compare_sides(|w, side_b| two_params(w, side_b, 0.0));
    assert_eq!(
        c.outcome(),
        Outcome::Agree,
        "{:?}",
        op_of(&c, c.first_divergence)
    );
    let c = compare_sides(|w, side_b| two_params(w, side_b, 1e-2));
    assert_eq!(c.outcome(), Outcome::DriftOnly);
    assert_eq!(op_of(&c, c.first_divergence), Some("aten::mm"));
    assert_eq!(step_of(&c, c.first_divergence), Some(1));
}

/// A backward step in miniature: `gelu_backward` reads a gradient of scale
/// 3e-5 and the forward activation of scale 0.5, and makes a gradient of
/// the gradient's size, off by `fault` on B while both inputs agree.
fn gelu_backward_run(w: &mut DumpWriter, side_b: bool, fault: f64) {
    use opdump_format::Phase;
    w.phase = Phase::Backward;
    let act = [512, 512];
    w.leaf(
        "aten::gelu_backward",
        "default",
        "approximate=none",
        vec![
            input("grad_output", "float32", &act, 3e-5),
            input("self", "float32", &act, 0.5),
        ],
        vec![output(
            0,
            "float32",
            &act,
            2e-5 * if side_b { 1.0 + fault } else { 1.0 },
        )],
    )
    .unwrap();
}

#[test]
fn an_element_wise_backward_kernel_is_judged_by_its_own_output() {
    // 1e-3 of the gradient: judged against the activation (0.1 x its RMS,
    // 2,500 times the output's), it read as 4e-7, under the tolerance.
    let c = compare_sides(|w, side_b| gelu_backward_run(w, side_b, 1e-3));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::gelu_backward"));
    let detail = c.detail(c.headline.unwrap());
    assert_eq!(detail.class.map(|k| k.as_str()), Some("elementwise"));
    let err = detail.out_err;
    assert!((err - 1e-3).abs() < 1e-4, "{err}");
    // One rounding of float32 is still no divergence.
    let c = compare_sides(|w, side_b| gelu_backward_run(w, side_b, 1.2e-7));
    assert_eq!(c.outcome(), Outcome::Agree);
}

/// `cross_entropy` around `_log_softmax` (its output off by `fault` on B,
/// from logits that agree) and `nll_loss_forward` (the loss, which agrees:
/// the difference averages out); then, with `backward_reads_it`, the
/// backward's `_log_softmax_backward_data` reads that same `_log_softmax`
/// output and diverges with it.
fn absorbed_loss_run(w: &mut DumpWriter, side_b: bool, fault: f64, backward_reads_it: bool) {
    use opdump_format::Phase;
    let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    let logits = [512, 300];
    let ce = w.begin(
        "aten::cross_entropy_loss",
        "default",
        "",
        vec![input("self", "float32", &logits, 1.0)],
    );
    w.leaf(
        "aten::_log_softmax",
        "default",
        "dim=1, half_to_float=False",
        vec![input("self", "float32", &logits, 1.0)],
        vec![output(0, "float32", &logits, 5.7 * f(fault))],
    )
    .unwrap();
    w.leaf(
        "aten::nll_loss_forward",
        "default",
        "reduction=1, ignore_index=-100",
        vec![input("self", "float32", &logits, 5.7 * f(fault))],
        vec![output(0, "float32", &[], 5.7)],
    )
    .unwrap();
    w.end(ce, vec![output(0, "float32", &[], 5.7)]).unwrap();
    if backward_reads_it {
        w.phase = Phase::Backward;
        w.leaf(
            "aten::_log_softmax_backward_data",
            "default",
            "dim=1, input_dtype=torch.float32",
            vec![
                input("grad_output", "float32", &logits, 1e-3),
                input("output", "float32", &logits, 5.7 * f(fault)),
            ],
            vec![output(0, "float32", &logits, 1e-3 * f(fault))],
        )
        .unwrap();
    }
}

#[test]
fn absorbed_never_hides_the_op_that_made_a_later_divergence() {
    let c = compare_sides(|w, side_b| absorbed_loss_run(w, side_b, 8e-4, true));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::_log_softmax"));
    assert_eq!(ops_judged(&c, OpVerdict::Absorbed), 0);
    // Nothing downstream reads it and the loss agrees: the difference
    // vanished inside the loss, absorbed.
    let c = compare_sides(|w, side_b| absorbed_loss_run(w, side_b, 8e-4, false));
    assert_eq!(c.outcome(), Outcome::Agree);
    assert_eq!(ops_judged(&c, OpVerdict::Absorbed), 1);
}

/// `t` (of scale `x`, as `synth::tensor` makes it) with a fingerprint and a
/// sketch of 16 projections that puts it `rel` (relative) away from the
/// same tensor with `rel` 0.
fn with_sketch(mut t: TensorRecord, x: f64, rel: f64) -> TensorRecord {
    let l2 = t.stats.l2 / x;
    t.fingerprint = Some((rel * 1e9) as u64 + 1);
    t.sketch = Some(vec![l2 * x * (1.0 + rel); 16]);
    t
}

/// A bfloat16 `silu` (B) against a float32 one (A): its input carries
/// bf16's rounding (0.3%), its output that plus `fault`; with `sketched`,
/// both with a sketch that measures those errors.
fn mixed_precision_silu(w: &mut DumpWriter, side_b: bool, fault: f64, sketched: bool) {
    let (dt, e_in, e_out) = if side_b {
        ("bfloat16", 0.003, (1.0 + fault) * 1.004 - 1.0)
    } else {
        ("float32", 0.0, 0.0)
    };
    let sketch = |t: TensorRecord, x: f64, e: f64| {
        if sketched {
            with_sketch(t, x, e)
        } else {
            t
        }
    };
    let act = [128, 172];
    let x = input("self", dt, &act, 0.5 * (1.0 + e_in));
    let y = output(0, dt, &act, 0.3 * (1.0 + e_out));
    w.leaf(
        "aten::silu",
        "default",
        "",
        vec![sketch(x, 0.5, e_in)],
        vec![sketch(y, 0.3, e_out)],
    )
    .unwrap();
}

#[test]
fn a_smooth_element_wise_op_may_amplify_its_input_drift_by_its_condition_number() {
    // 32 x 0.3% on top of bf16's tolerance (1.6%) allowed 11%; 8 x allows
    // about 4%, where a sketch measured the input's error.
    let silu = |fault: f64, sketched: bool| {
        compare_sides(move |w, side_b| mixed_precision_silu(w, side_b, fault, sketched))
    };
    let c = silu(0.05, true);
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::silu"));
    assert_eq!(tensors_of(&c, c.headline.unwrap())[0].evidence, "sketch");
    // bf16's rounding of the input and the output alone: close.
    let c = silu(0.0, true);
    assert_eq!(c.outcome(), Outcome::Agree);
    // Statistics alone may see a tenth of a zero-mean input error: the
    // allowance stays 32 times what they show.
    let c = silu(0.05, false);
    assert_eq!(c.outcome(), Outcome::Agree);
}

/// Adam's second moment, `exp_avg_sq.addcmul_(g, g, value=1-β2)`: `self`
/// (β2 times the last step's, 5e-12) plus 0.001·g·g of gradients near 7e-5
/// makes values near 1e-11; B's output is off by `fault`. With `foreach`,
/// both sides update two parameters in one `_foreach_addcmul_`, the
/// second's element off.
fn second_moment(w: &mut DumpWriter, side_b: bool, fault: f64, foreach: bool) {
    use opdump_format::Phase;
    w.phase = Phase::Optimizer;
    let f = |e: f64| if side_b { 1.0 + e } else { 1.0 };
    let shape = [64, 64];
    let listed = |mut t: TensorRecord, i: i32| {
        if foreach {
            t.list_index = Some(i);
        }
        t
    };
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for i in 0..if foreach { 2 } else { 1 } {
        let fault = if foreach && i == 0 { 0.0 } else { fault };
        ins.push(listed(input("self", "float32", &shape, 5e-12), i));
        ins.push(listed(input("tensor1", "float32", &shape, 7e-5), i));
        ins.push(listed(input("tensor2", "float32", &shape, 7e-5), i));
        let mut o = listed(output(0, "float32", &shape, 1e-11 * f(fault)), i);
        o.arg = "self".into();
        outs.push(o);
    }
    let (op, overload) = if foreach {
        ("aten::_foreach_addcmul_", "Scalar")
    } else {
        ("aten::addcmul_", "default")
    };
    w.leaf(op, overload, "value=0.0010000000000000009", ins, outs)
        .unwrap();
}

#[test]
fn an_element_wise_sum_is_judged_by_its_terms_not_its_factors() {
    for foreach in [false, true] {
        // 1e-3 of the output: against a tenth of the gradients' scale (the
        // largest input) it read as 1.4e-10, under the tolerance.
        let c = compare_sides(|w, side_b| second_moment(w, side_b, 1e-3, foreach));
        assert_eq!(c.outcome(), Outcome::Introduced, "foreach {foreach}");
        let detail = c.detail(c.headline.unwrap());
        assert_eq!(detail.class.map(|k| k.as_str()), Some("elementwise_sum"));
        assert!((detail.out_err - 1e-3).abs() < 1e-4, "{}", detail.out_err);
        // One rounding of float32 is no divergence.
        let c = compare_sides(|w, side_b| second_moment(w, side_b, 6e-8, foreach));
        assert_eq!(c.outcome(), Outcome::Agree, "foreach {foreach}");
    }
}

#[test]
fn a_cancelled_element_wise_sum_is_rounding_not_a_divergence() {
    // `self` of 1 plus a term of about -1: the output cancels to 1e-7, and
    // the sides differ by 6e-8, rounding of the terms (60% of the output).
    let c = compare_sides(|w, side_b| {
        let shape = [64, 64];
        w.leaf(
            "aten::lerp_",
            "Scalar",
            "weight=0.1",
            vec![
                input("self", "float32", &shape, 1.0),
                input("end", "float32", &shape, 1.0),
            ],
            vec![output(
                0,
                "float32",
                &shape,
                if side_b { 1.6e-7 } else { 1e-7 },
            )],
        )
        .unwrap();
    });
    assert_eq!(c.outcome(), Outcome::Agree);
}

/// A job's last look at its weights: `p.double().cpu().sum()`, a float64
/// `sum` over a [512, 128] float32 weight cast to float64, whose mean
/// differs between the sides by `mean_drift` (the run's float32 drift);
/// B's sum is off by `fault` more than that drift makes of it.
fn float64_checksum(w: &mut DumpWriter, side_b: bool, mean_drift: f64, fault: f64) {
    let n = 512.0 * 128.0;
    let (mean, std) = (-3.727161e-3, 0.9987124);
    let dm = if side_b { mean_drift } else { 0.0 };
    let weight = |role_input: bool, dtype: &str| {
        let t = if role_input {
            input("self", dtype, &[512, 128], 1.0)
        } else {
            output(0, dtype, &[512, 128], 1.0)
        };
        with_stats(t, -4.343789, 4.559786, mean + dm, std)
    };
    // `p.double()`: float32 rounding is what judges the cast, and the
    // drift is far within it.
    w.leaf(
        "aten::_to_copy",
        "default",
        "dtype=torch.float64",
        vec![weight(true, "float32")],
        vec![weight(false, "float64")],
    )
    .unwrap();
    let x = weight(true, "float64");
    // The sum moves by n times the mean, 0.9 of the most the mean's move
    // can make of it (√K times, measured 38 to 229 times at this K).
    let sum = n * mean + 0.9 * n * dm;
    let sum = sum * if side_b { 1.0 + fault } else { 1.0 };
    w.leaf(
        "aten::sum",
        "dim_IntList",
        "dim=[], keepdim=False, dtype=None",
        vec![x],
        vec![with_stats(
            output(0, "float64", &[], 1.0),
            sum,
            sum,
            sum,
            0.0,
        )],
    )
    .unwrap();
}

#[test]
fn a_float64_sum_of_drifted_float32_values_is_allowed_their_drift() {
    // The inputs' mean moved by 7e-11 (rounding drift of float32 weights
    // over a few steps); the sum 230 times that relative: within √K = 256
    // times, which the float64 tolerance (5e-13) and 32 times did not allow.
    let c = compare_sides(|w, side_b| float64_checksum(w, side_b, 7.4e-11, 0.0));
    assert_eq!(
        c.outcome(),
        Outcome::Agree,
        "{:?}",
        c.first_divergence.map(|k| c.detail(k))
    );
    // Drift of 1e-7 (6e-6 in the sum) and a fault of 1e-3: still named.
    let c = compare_sides(|w, side_b| float64_checksum(w, side_b, 1e-7, 1e-3));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::sum"));
    // However large the drift, a sum is never allowed more than the cap
    // on top of 32 times it: a fault of 1e-2 on drift of 1e-5 is named.
    let c = compare_sides(|w, side_b| float64_checksum(w, side_b, 1e-5, 1e-2));
    assert_eq!(c.outcome(), Outcome::Introduced);
}

/// A fault-free Qwen2 MLP's `act(gate) * up` at step 3, as two devices
/// measured it: the inputs' statistics agree to 1e-7, the output's minimum
/// moved by 3e-6 (2e-5 of its largest element, 4.4 times the allowance):
/// one element of `up` cancelled in its dot product and kept the absolute
/// rounding of its terms. `fault` scales B's output.
fn gated_product(w: &mut DumpWriter, side_b: bool, fault: f64) {
    let shape = [4, 32, 128];
    let (self_, other, out) = if side_b {
        (
            (-2.220511e-1, 4.205142e-1, 4.612521e-3, 8.050019e-2),
            (-6.129910e-1, 6.307396e-1, 1.452012e-3, 1.580855e-1),
            (-1.005514e-1, 1.501125e-1, 7.791201e-5, 1.294718e-2),
        )
    } else {
        (
            (-2.220511e-1, 4.205142e-1, 4.612521e-3, 8.050019e-2),
            (-6.129909e-1, 6.307396e-1, 1.452030e-3, 1.580855e-1),
            (-1.005545e-1, 1.501125e-1, 7.791099e-5, 1.294719e-2),
        )
    };
    let f = if side_b { fault } else { 1.0 };
    let t = |t: TensorRecord, (a, b, c, d): (f64, f64, f64, f64), f: f64| {
        with_stats(t, a * f, b * f, c * f, d * f)
    };
    w.leaf(
        "aten::mul",
        "Tensor",
        "",
        vec![
            t(input("self", "float32", &shape, 1.0), self_, 1.0),
            t(input("other", "float32", &shape, 1.0), other, 1.0),
        ],
        vec![t(output(0, "float32", &shape, 1.0), out, f)],
    )
    .unwrap();
}

#[test]
fn one_element_beyond_the_allowance_within_the_norm_is_rounding() {
    let c = compare_sides(|w, side_b| gated_product(w, side_b, 1.0));
    assert_eq!(
        c.outcome(),
        Outcome::Agree,
        "{:?}",
        op_of(&c, c.first_divergence)
    );
}

#[test]
fn a_fault_of_a_thousandth_in_a_product_is_still_introduced() {
    let c = compare_sides(|w, side_b| gated_product(w, side_b, 1.001));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::mul"));
}
