//! Verdicts on synthetic training runs and hand-made calls: planted faults
//! are named, by op and seq, as the first introduced divergence, with
//! downstream ops inherited; fault-free runs (identical, cross-device noise,
//! bf16 against fp32) introduce nothing; random, discontinuous and scratch
//! ops are no faults.

use opdump_format::{OpRecord, Phase};
use opdump_judge::compare::Compared;
use opdump_judge::{OpVerdict, Outcome, TensorVerdict};
use opdump_testkit::synth::{input, model_records, output, DumpWriter, Model, Variant};

use crate::common::*;

fn small_model() -> Model {
    Model {
        steps: 3,
        layers: 6,
        tokens: 8,
        hidden: 16,
    }
}

/// Side A and side B of the synthetic run of `small_model` with `v`, in
/// seq order.
fn model_pair(v: &Variant) -> (Vec<OpRecord>, Vec<OpRecord>) {
    let side = |side_b| {
        let mut r = model_records(&small_model(), v, side_b);
        r.sort_by_key(|r| r.seq);
        r
    };
    (side(false), side(true))
}

fn compare_records(a: &[OpRecord], b: &[OpRecord]) -> Compared {
    compare(dump("a", a), dump("b", b))
}

/// The seq of the `n`-th (0-based) top-level call of `op` in the forward of
/// `step`.
fn nth_root(recs: &[OpRecord], step: i64, op: &str, n: usize) -> i64 {
    recs.iter()
        .filter(|r| r.step == step && r.phase == Phase::Forward && r.depth == 0 && r.op == op)
        .nth(n)
        .unwrap_or_else(|| panic!("no {op} #{n} in step {step}"))
        .seq
}

/// The seq of the first child named `op` of the call `parent`.
fn child(recs: &[OpRecord], parent: i64, op: &str) -> i64 {
    recs.iter()
        .find(|r| r.parent_seq == Some(parent) && r.op == op)
        .unwrap_or_else(|| panic!("no child {op} of seq {parent}"))
        .seq
}

/// The proj linear of (step, layer) and its addmm, in a dump.
fn planted_site(recs: &[OpRecord], step: i64, layer: usize) -> (i64, i64) {
    let lin = nth_root(recs, step, "aten::linear", 2 * layer + 1);
    (lin, child(recs, lin, "aten::addmm"))
}

fn check_fault(rel: f64, variant: Variant) {
    let (step, layer) = (1, 3);
    let v = Variant {
        fault: Some((step, layer, rel)),
        ..variant
    };
    let (a, b) = model_pair(&v);
    let c = compare_records(&a, &b);
    assert_eq!(c.outcome(), Outcome::Introduced);
    let (lin_a, addmm_a) = planted_site(&a, step, layer);
    let (lin_b, addmm_b) = planted_site(&b, step, layer);
    let fi = c.first_introduced.expect("an introduced op");
    let p = c.alignment.pairs[fi];
    assert_eq!(c.a.op_name(p.a), "aten::addmm");
    assert_eq!(c.a.overload_name(p.a), "default");
    assert_eq!(c.a.seq(p.a), addmm_a);
    assert_eq!(c.b.seq(p.b), addmm_b);
    assert_eq!(c.a.step(p.a), step);
    assert_eq!(c.b.step(p.b), step);
    assert_eq!(c.a.depth(p.a), 1);
    assert_eq!(c.op_verdict(fi), OpVerdict::Introduced);
    let ancestors = c.a.ancestors(p.a);
    assert_eq!(c.a.op_name(ancestors[0]), "aten::linear");
    assert_eq!(c.a.seq(ancestors[0]), lin_a);
    assert_eq!(c.b.seq(c.alignment.a_match[ancestors[0] as usize]), lin_b);
    let err = c.detail(fi).out_err;
    let expect = rel.abs() / (1.0 + rel.min(0.0));
    assert!(
        (err - expect).abs() < 0.05 * expect,
        "rel_err {err} for a fault of {rel}"
    );
    // The first divergence is the parent linear (entered first).
    assert_eq!(seq_of(&c, c.first_divergence), Some(lin_a));
    // Nothing else introduced an error; everything downstream inherited it.
    assert_eq!(
        with_verdict(&c, OpVerdict::Introduced),
        vec![lin_a, addmm_a]
    );
    let inherited = with_verdict(&c, OpVerdict::Inherited);
    assert!(!inherited.is_empty());
    assert!(
        inherited.iter().all(|&s| s > addmm_a),
        "inherited before the fault: {inherited:?}"
    );
    let next_add = a
        .iter()
        .find(|r| r.seq > addmm_a && r.op == "aten::add" && r.depth == 0)
        .expect("add after the fault")
        .seq;
    assert!(
        inherited.contains(&next_add),
        "the residual add after the fault is not inherited"
    );
    assert_eq!(c.top_introduced.len(), 1);
    assert_eq!(op_of(&c, Some(c.top_introduced[0])), Some("aten::addmm"));
}

fn noisy() -> Variant {
    Variant {
        noise: 1e-8,
        ..Default::default()
    }
}

#[test]
fn one_percent_fault_is_named_with_downstream_inherited() {
    check_fault(0.01, noisy());
}

#[test]
fn twofold_fault_is_named() {
    check_fault(1.0, noisy());
}

#[test]
fn small_float32_fault_is_caught() {
    check_fault(1e-3, noisy());
}

#[test]
fn fault_is_named_despite_copies_missing_ops_and_other_decompositions() {
    check_fault(
        0.01,
        Variant {
            extra_copy_every: Some(3),
            drop_gelu_every: Some(4),
            decompose_layer_norm: true,
            ..noisy()
        },
    );
}

#[test]
fn identical_runs_agree() {
    let (a, b) = model_pair(&Variant::default());
    let c = compare_records(&a, &b);
    assert_eq!(c.outcome(), Outcome::Agree);
    assert_eq!(c.first_divergence, None);
    assert_eq!(c.first_introduced, None);
    assert!(!c.divergence_found());
    assert_eq!(tensors_judged(&c, TensorVerdict::Close), 0);
    assert_eq!(tensors_judged(&c, TensorVerdict::Diverged), 0);
    assert!(tensors_judged(&c, TensorVerdict::StatsEqual) > 0);
    // A dump against itself.
    let c = compare_records(&a, &a);
    assert_eq!(c.outcome(), Outcome::Agree);
}

#[test]
fn fault_free_cross_device_noise_introduces_nothing() {
    // Rounding differences in every op, accumulating along the network.
    let v = Variant {
        noise: 3e-7,
        extra_copy_every: Some(5),
        decompose_layer_norm: true,
        ..Default::default()
    };
    let (a, b) = model_pair(&v);
    let c = compare_records(&a, &b);
    assert_eq!(
        c.first_introduced,
        None,
        "{:?}",
        op_of(&c, c.first_introduced)
    );
    assert_eq!(ops_judged(&c, OpVerdict::Introduced), 0);
    assert_eq!(
        c.outcome(),
        Outcome::Agree,
        "first divergence: {:?}",
        op_of(&c, c.first_divergence)
    );
}

#[test]
fn bf16_against_fp32_introduces_nothing() {
    let v = Variant {
        dtype: Some("bfloat16"),
        noise: 2e-3,
        ..Default::default()
    };
    let (a, b) = model_pair(&v);
    let c = compare_records(&a, &b);
    assert_eq!(
        ops_judged(&c, OpVerdict::Introduced),
        0,
        "{:?}",
        op_of(&c, c.first_introduced)
    );
    assert!(c.dtype_differs > 0);
    // A dtype difference alone is no divergence.
    assert_eq!(tensors_judged(&c, TensorVerdict::Diverged), 0);
    assert_eq!(c.outcome(), Outcome::Agree);
}

#[test]
fn bf16_against_fp32_still_catches_a_twofold_fault() {
    let v = Variant {
        dtype: Some("bfloat16"),
        noise: 2e-3,
        fault: Some((2, 1, 1.0)),
        ..Default::default()
    };
    let (a, b) = model_pair(&v);
    let c = compare_records(&a, &b);
    assert_eq!(c.outcome(), Outcome::Introduced);
    let (_, addmm_a) = planted_site(&a, 2, 1);
    assert_eq!(seq_of(&c, c.first_introduced), Some(addmm_a));
}

#[test]
fn nan_appearing_is_introduced_at_its_op() {
    let (step, layer) = (2, 4);
    let v = Variant {
        nan: Some((step, layer, 7)),
        ..noisy()
    };
    let (a, b) = model_pair(&v);
    let c = compare_records(&a, &b);
    assert_eq!(c.outcome(), Outcome::Introduced);
    let gelu = nth_root(&a, step, "aten::gelu", layer);
    let fi = c.first_introduced.expect("an introduced op");
    assert_eq!(op_of(&c, Some(fi)), Some("aten::gelu"));
    assert_eq!(seq_of(&c, Some(fi)), Some(gelu));
    // An infinite error (the report writes it as null).
    assert!(!c.detail(fi).out_err.is_finite());
    let out = output_of(&c, fi);
    assert_eq!(out.verdict, TensorVerdict::NanMismatch);
    assert_eq!(c.b.tensors.nonfinite_counts(out.tb.unwrap())[0], 7);
    assert_eq!(with_verdict(&c, OpVerdict::Introduced), vec![gelu]);
}

#[test]
fn steps_numbered_differently_still_align() {
    let (a, _) = model_pair(&Variant::default());
    // B dumped from step 10 on.
    let b: Vec<OpRecord> = a
        .iter()
        .cloned()
        .map(|mut r| {
            r.step += 10;
            r
        })
        .collect();
    let c = compare_records(&a, &b);
    assert_eq!(c.outcome(), Outcome::Agree, "{:?}", c.notes);
    assert!(
        c.notes.iter().any(|n| n.contains("share no step")),
        "{:?}",
        c.notes
    );
    assert_eq!(c.alignment.pairs.len(), c.a.len());
}

#[test]
fn random_and_discontinuous_ops_are_not_faults() {
    let c = compare_sides(|w: &mut DumpWriter, side_b: bool| {
        let x = |s: f64| input("self", "float32", &[16], s);
        w.leaf(
            "aten::mul",
            "Tensor",
            "",
            vec![x(1.0)],
            vec![output(0, "float32", &[16], 1.0)],
        )
        .unwrap();
        // Two devices, two generators.
        let r = if side_b { 0.7 } else { 0.5 };
        w.leaf(
            "aten::normal_",
            "default",
            "mean=0, std=1",
            vec![x(1.0)],
            vec![output(0, "float32", &[16], r)],
        )
        .unwrap();
        // argmax of close inputs may pick another index.
        let idx = if side_b { 3.0 } else { 2.0 };
        w.leaf(
            "aten::argmax",
            "default",
            "dim=-1",
            vec![x(1.0)],
            vec![output(0, "int64", &[1], idx)],
        )
        .unwrap();
        let e = if side_b { 1.0 } else { 2.0 };
        w.leaf(
            "aten::eq",
            "Tensor",
            "",
            vec![x(1.0), input("other", "float32", &[16], 1.0)],
            vec![output(0, "bool", &[16], e)],
        )
        .unwrap();
        w.leaf(
            "aten::relu",
            "default",
            "",
            vec![x(1.0)],
            vec![output(0, "float32", &[16], 1.0)],
        )
        .unwrap();
    });
    assert_eq!(c.first_introduced, None);
    assert_eq!(c.first_divergence, None);
    assert_eq!(ops_judged(&c, OpVerdict::Rng), 1);
    assert_eq!(ops_judged(&c, OpVerdict::Discontinuous), 2);
    assert_eq!(tensors_judged(&c, TensorVerdict::Rng), 1);
    assert_eq!(tensors_judged(&c, TensorVerdict::Discontinuous), 2);
    assert_eq!(c.outcome(), Outcome::Agree);
}

#[test]
fn consumers_of_random_outputs_inherit() {
    let c = compare_sides(|w: &mut DumpWriter, side_b: bool| {
        let r = if side_b { 0.7 } else { 0.5 };
        w.leaf(
            "aten::bernoulli_",
            "float",
            "p=0.5",
            vec![input("self", "float32", &[16], 1.0)],
            vec![output(0, "float32", &[16], r)],
        )
        .unwrap();
        w.leaf(
            "aten::mul",
            "Tensor",
            "",
            vec![
                input("self", "float32", &[16], 1.0),
                input("other", "float32", &[16], r),
            ],
            vec![output(0, "float32", &[16], r * 2.0)],
        )
        .unwrap();
    });
    assert_eq!(
        c.first_introduced,
        None,
        "{:?}",
        op_of(&c, c.first_introduced)
    );
    assert_eq!(op_of(&c, c.first_divergence), Some("aten::mul"));
    assert_eq!(
        c.op_verdict(c.first_divergence.unwrap()),
        OpVerdict::Inherited
    );
    // A divergence no op introduced: drift (exit status 3), not 1.
    assert_eq!(c.outcome(), Outcome::DriftOnly);
}

#[test]
fn scratch_differences_inside_an_agreeing_op_are_absorbed() {
    // layer_norm_backward sizes a scratch buffer by the thread count: the
    // calls inside differ in shape, its result does not.
    let c = compare_sides(|w: &mut DumpWriter, side_b: bool| {
        let chunks: i64 = if side_b { 2 } else { 4 };
        let g = || input("grad_out", "float32", &[4, 8], 1.0);
        let p = w.begin("aten::native_layer_norm_backward", "default", "", vec![g()]);
        let mut empty = input("self", "float32", &[0], 1.0);
        empty.status = opdump_format::StatsStatus::Uninitialized;
        let mut scratch = output(0, "float32", &[chunks, 8], 1.0);
        scratch.status = opdump_format::StatsStatus::Uninitialized;
        w.leaf(
            "aten::resize_",
            "default",
            &format!("size=[{chunks}, 8]"),
            vec![empty],
            vec![scratch.clone()],
        )
        .unwrap();
        let mut zeroed = output(0, "float32", &[chunks, 8], 0.0);
        zeroed.stats = opdump_format::Stats {
            zero_count: chunks * 8,
            ..opdump_testkit::synth::stats_for(chunks * 8, 0.0)
        };
        let mut s_in = scratch.clone();
        s_in.role = opdump_format::Role::Input;
        s_in.arg = "self".into();
        w.leaf("aten::zero_", "default", "", vec![s_in], vec![zeroed])
            .unwrap();
        w.end(p, vec![output(0, "float32", &[4, 8], 0.5)]).unwrap();
    });
    assert_eq!(ops_judged(&c, OpVerdict::Absorbed), 1);
    assert_eq!(
        c.first_divergence,
        None,
        "{:?}",
        op_of(&c, c.first_divergence)
    );
    assert_eq!(c.outcome(), Outcome::Agree);
}

#[test]
fn an_error_hidden_from_the_statistics_is_still_inherited() {
    // mul is 1e-3 off; the next op's output hides it from its statistics
    // (a lower bound), and a sum reveals it again: the sum inherited it.
    let c = compare_sides(|w: &mut DumpWriter, side_b: bool| {
        let e = |rel: f64| if side_b { 1.0 + rel } else { 1.0 };
        let v = |x: f64| input("self", "float32", &[64, 64], x);
        w.leaf(
            "aten::mul",
            "Tensor",
            "",
            vec![v(1.0)],
            vec![output(0, "float32", &[64, 64], 2.0 * e(1e-3))],
        )
        .unwrap();
        w.leaf(
            "aten::tanh",
            "default",
            "",
            vec![v(2.0 * e(1e-3))],
            vec![output(0, "float32", &[64, 64], 3.0 * e(1e-8))],
        )
        .unwrap();
        w.leaf(
            "aten::sum",
            "dim_IntList",
            "dim=[0]",
            vec![v(3.0 * e(1e-8))],
            vec![output(0, "float32", &[64], 4.0 * e(5e-4))],
        )
        .unwrap();
    });
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.first_introduced), Some("aten::mul"));
    assert_eq!(ops_judged(&c, OpVerdict::Introduced), 1);
    assert_eq!(ops_judged(&c, OpVerdict::Inherited), 1);
}
