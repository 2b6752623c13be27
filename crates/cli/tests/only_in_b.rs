//! A fault in an op that only B runs: an extra `h * 1.01` after a
//! LayerNorm. No aligned op introduced it, yet every later output differs;
//! it must not read as "no divergence".

mod common;

use std::path::{Path, PathBuf};

use common::*;
use opdump_testkit::synth::{input, output, DumpWriter};

/// Two layers of LayerNorm > Linear > GELU; on B, `extra` runs between the
/// first LayerNorm and its Linear, scaling the activations by `factor`
/// (1.0: a copy that changes nothing).
fn run(root: &Path, side_b: bool, extra: &str, factor: f64) -> PathBuf {
    let dir = root.join(if side_b { "b" } else { "a" });
    let mut w = DumpWriter::new(&dir, 0, "cpu");
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
    w.close().unwrap();
    dir
}

#[test]
fn a_fault_in_an_op_only_in_b_is_introduced_there() {
    let t = tmp();
    let a = run(t.path(), false, "", 1.0);
    let b = run(t.path(), true, "aten::mul", 1.01);
    let (code, v, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{stderr}\n{v:#}");
    assert_eq!(v["divergence"], true);
    let u = &v["first_introduced_unmatched"];
    assert_eq!(u["side"], "b", "{v:#}");
    assert_eq!(u["op"]["op"], "aten::mul");
    assert_eq!(u["op"]["seq"], 1, "the mul is B's second call");
    assert_eq!(u["consumer"]["op"], "aten::linear");
    assert_eq!(u["consumer"]["arg"], "input");
    let change = u["rel_change"].as_f64().unwrap();
    assert!((0.005..0.02).contains(&change), "{change}");
    // Every aligned op downstream inherits; none introduced it.
    assert_eq!(v["first_introduced"], serde_json::Value::Null);
    assert_eq!(v["first_divergence"]["op"], "aten::linear");
    assert_eq!(v["first_divergence"]["verdict"], "inherited");

    let r = run_args(&["compare", path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 1);
    assert!(
        r.stdout
            .contains("First introduced: aten::mul.Tensor  [introduced, only in B]"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(
            "Verdict: DIVERGED. First introduced at aten::mul.Tensor (only in B, seq B 1, step 0)."
        ),
        "{}",
        r.stdout
    );
}

#[test]
fn an_op_only_in_b_that_changes_nothing_is_no_divergence() {
    let t = tmp();
    let a = run(t.path(), false, "", 1.0);
    let b = run(t.path(), true, "aten::_to_copy", 1.0);
    let (code, v, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 0, "{stderr}\n{v:#}");
    assert_eq!(v["first_introduced_unmatched"], serde_json::Value::Null);
    assert_eq!(v["only_in_b"]["op_calls"], 1);
}

#[test]
fn a_change_within_tolerance_only_in_b_is_no_divergence() {
    let t = tmp();
    let a = run(t.path(), false, "", 1.0);
    let b = run(t.path(), true, "aten::mul", 1.0 + 1e-8);
    let (code, v, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 0, "{stderr}\n{v:#}");
    assert_eq!(v["first_introduced_unmatched"], serde_json::Value::Null);
}

fn run_args(args: &[&str]) -> Run {
    common::run(args)
}

/// `run`'s two layers, with B's extra call an in-place `add_` that changes
/// the activations by 1%, and with `a_accumulates`, an `add_` of A's own at
/// the end of the step, on another tensor: the two are not aligned (a
/// backward pass accumulates gradients in an order that differs by device).
fn accumulation_run(root: &Path, side_b: bool, a_accumulates: bool) -> PathBuf {
    let dir = root.join(if side_b { "b" } else { "a" });
    let mut w = DumpWriter::new(&dir, 0, "cpu");
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
    w.close().unwrap();
    dir
}

#[test]
fn an_in_place_call_only_in_b_with_a_counterpart_in_a_is_not_blamed() {
    let t = tmp();
    let a = accumulation_run(t.path(), false, true);
    let b = accumulation_run(t.path(), true, true);
    let (code, v, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(
        v["first_introduced_unmatched"],
        serde_json::Value::Null,
        "{v:#}"
    );
    assert_eq!(v["headline"], serde_json::Value::Null, "{v:#}");
    assert_ne!(code, 1, "{stderr}\n{v:#}");
    // Without A's own add_, B's is a call A lacks: introduced there.
    let t = tmp();
    let a = accumulation_run(t.path(), false, false);
    let b = accumulation_run(t.path(), true, false);
    let (code, v, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{stderr}\n{v:#}");
    assert_eq!(
        v["first_introduced_unmatched"]["op"]["op"], "aten::add_",
        "{v:#}"
    );
}
