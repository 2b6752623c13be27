//! The rules that keep two correct devices from raising false alarms, and
//! the headline from hiding a real fault (see the README's "Tolerance"):
//! a cancelled sum is judged against its partial sums, an op that only
//! moves elements never introduces an error its input brings, a fault far
//! stronger than the first introduced op takes the headline, and the exit
//! status separates "an op introduced it" (1) from "drift, no op to blame"
//! (3).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use opdump_cli::synth::{input, output, DumpWriter};
use opdump_format::{Stats, TensorRecord};
use serde_json::Value;

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
fn bias_grad_run(root: &Path, side_b: bool, late_fault: f64) -> PathBuf {
    let dir = root.join(if side_b { "b" } else { "a" });
    let mut w = DumpWriter::new(&dir, 0, "cpu");
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
    w.close().unwrap();
    dir
}

fn op_of(j: &Value, field: &str) -> Option<String> {
    j[field]["op"].as_str().map(str::to_string)
}

#[test]
fn a_cancelled_sum_is_rounding_not_a_divergence() {
    let t = tmp();
    let a = bias_grad_run(t.path(), false, 1.0);
    let b = bias_grad_run(t.path(), true, 1.0);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 0, "{j}");
    assert_eq!(j["first_divergence"], Value::Null, "{j}");
    assert_eq!(j["exit_status"], 0);
}

#[test]
fn a_fault_after_a_cancelled_sum_is_the_headline() {
    let t = tmp();
    let a = bias_grad_run(t.path(), false, 1.0);
    let b = bias_grad_run(t.path(), true, 1.01);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{j}");
    assert_eq!(
        op_of(&j, "headline").as_deref(),
        Some("aten::embedding_dense_backward"),
        "{j}"
    );
    assert_eq!(j["headline_rule"], "first", "{j}");
}

/// Two independent ops on data identical on both sides: `weak` makes an
/// error of `weak_err` (amplification weak_err / u), then `strong` one of
/// `strong_err`.
fn two_faults(root: &Path, side_b: bool, weak_err: f64, strong_err: f64) -> PathBuf {
    let dir = root.join(if side_b { "b" } else { "a" });
    let mut w = DumpWriter::new(&dir, 0, "cpu");
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
    w.close().unwrap();
    dir
}

#[test]
fn a_far_stronger_later_fault_takes_the_headline() {
    let t = tmp();
    // tanh: 3e-6 (amplification ~50); gelu: 1e-2 (~1.7e5), 3000 times more.
    let a = two_faults(t.path(), false, 3e-6, 1e-2);
    let b = two_faults(t.path(), true, 3e-6, 1e-2);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{j}");
    assert_eq!(op_of(&j, "first_introduced").as_deref(), Some("aten::tanh"));
    assert_eq!(op_of(&j, "headline").as_deref(), Some("aten::gelu"), "{j}");
    assert_eq!(j["headline_rule"], "dominant");
    let r = run(&["compare", path_str(&a), path_str(&b)]);
    assert!(
        r.stdout
            .contains("Verdict: DIVERGED. Introduced at aten::gelu"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("Strongest introduced"), "{}", r.stdout);
}

#[test]
fn a_later_fault_of_similar_strength_leaves_the_first_as_headline() {
    let t = tmp();
    // 2e-4 against 1e-3: five times, not a hundred.
    let a = two_faults(t.path(), false, 2e-4, 1e-3);
    let b = two_faults(t.path(), true, 2e-4, 1e-3);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{j}");
    assert_eq!(op_of(&j, "headline").as_deref(), Some("aten::tanh"), "{j}");
    assert_eq!(j["headline_rule"], "first");
    assert_eq!(j["top_introduced"].as_array().map(Vec::len), Some(2));
}

/// A weight that differs from the start (`weight_err` relative, on B),
/// one row of it selected by `as_strided` (whose output differs by
/// `row_err`: the row holds more of the difference), then a `mul` of the
/// row by data.
fn selected_row(root: &Path, side_b: bool, weight_err: f64, row_err: f64) -> PathBuf {
    let dir = root.join(if side_b { "b" } else { "a" });
    let mut w = DumpWriter::new(&dir, 0, "cpu");
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
    w.close().unwrap();
    dir
}

#[test]
fn an_op_that_only_moves_elements_never_introduces_what_its_input_brings() {
    let t = tmp();
    let a = selected_row(t.path(), false, 0.011, 0.5);
    let b = selected_row(t.path(), true, 0.011, 0.5);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(j["headline"], Value::Null, "{j}");
    assert_eq!(j["op_verdicts"]["introduced"], 0, "{j}");
    assert_eq!(
        op_of(&j, "first_divergence").as_deref(),
        Some("aten::as_strided")
    );
    assert_eq!(j["first_divergence"]["op_class"], "movement");
    // The weight differed before any op: a divergence with no op to blame.
    assert_eq!(code, 3, "{j}");
    assert_eq!(j["exit_status"], 3);
    let r = run(&["compare", path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 3);
    assert!(r.stdout.contains("Verdict: DRIFT."), "{}", r.stdout);
}

#[test]
fn an_op_that_moves_elements_wrongly_from_equal_inputs_introduces() {
    let t = tmp();
    // The weight agrees; the selected row does not: a wrong offset.
    let a = selected_row(t.path(), false, 0.0, 0.5);
    let b = selected_row(t.path(), true, 0.0, 0.5);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{j}");
    assert_eq!(op_of(&j, "headline").as_deref(), Some("aten::as_strided"));
}
